// Products of a few rows by a weight matrix on CPU, as an XLA FFI custom call (cpu_matmul.py
// registers it; the einsum it replaces is the reference it is tested against).
//
// y [m, n] = x [m, k] @ w [n, k]^T: w as the model stores its weights ([out, in]) and as the
// output head is ([vocab, hidden]); x and y float32, w float32 or bfloat16 (read as the high
// half of a float32, exact).
//
// Why: a decode step multiplies a handful of rows (one token per live row) by every weight of the
// model, so it should cost one read of the weights. XLA:CPU's dot ran SmolLM2's decode products
// at 13 GB/s for 4 rows and 10 for 8 (42 and 55 ms a token, against ~25 ms to stream the weights
// once). Here each group of 4 weight rows is read once from memory for all x rows (tiles of 4 x
// rows reuse it from L1; from 8 x rows, groups of 2 and tiles of 8), the 16 dot products of a
// tile stay in vector registers, and the next
// group's rows are prefetched while this one is summed: streaming the rows of a group side by
// side, the hardware prefetcher alone left the core waiting on memory, then computing. The
// prefetches go to L2 (prefetcht1), not L1: into L1 they held the core's L1 miss buffers that
// its own loads wait for, and SmolLM2's decode products at 4 rows ran at 70 % of the machine's
// read bandwidth (25.3 ms a token); into L2, at the read floor (18.6-19.2 ms; 8 rows 32 -> 23.5
// ms; `benchmarks.decode_matmul_cpu`, AMD EPYC). Into L1 2 or 4 groups ahead was no faster;
// without prefetches, slower still (28.2 ms).
// Items: blocks of 64 output columns (w rows), spread over XLA's intra-op threads.
//
// Summation order: each output element sums its k products in one fixed order whatever the x
// rows around it, the tiles or the threads (16 lanes over k, a fixed tree over the lanes, then
// the tail), so a row's result does not depend on which rows share its call.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_parallel.h"
#include "cpu_vector.h"
#include "xla/ffi/api/ffi.h"

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace {

using morse::load1;
using morse::load16;
using morse::v16;

constexpr int64_t kBlock = 64;  // w rows (output columns) per work item

// A tile's end: its MR x NR lane vectors summed in the fixed tree, then the k past `body` in
// order, into y.
template <int NR, int MR, typename X, typename T>
inline void finish(v16 (&acc)[MR * NR], const X* x, const T* w, float* y, int64_t body,
                   int64_t K, int64_t N, int64_t m0, int64_t n) {
  float sums[MR * NR];
  if constexpr (MR * NR == 16) {
    morse::sums16(acc, sums);
  } else {
    for (int i = 0; i < MR * NR; ++i) sums[i] = morse::lanes_sum(acc[i]);
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = sums[i * NR + j];
      for (int64_t k = body; k < K; ++k) s += load1(x[(m0 + i) * K + k]) * load1(w[(n + j) * K + k]);
      y[(m0 + i) * N + n + j] = s;
    }
  }
}

// y[m, n .. n + NR] for rows m0 .. m0 + MR: dot products of x rows with w rows.
template <typename T, int NR, int MR>
void tile(const float* x, const T* w, float* y, int64_t K, int64_t N, int64_t m0, int64_t n) {
  v16 acc[MR * NR] = {};
  const int64_t body = K - K % 16;
  const T* next[NR];  // the next group's rows, prefetched while this one is summed
  for (int j = 0; j < NR; ++j) next[j] = w + std::min(n + NR + j, N - 1) * K;
  for (int64_t k = 0; k < body; k += 16) {
    v16 wv[NR];
    for (int j = 0; j < NR; ++j) {
      __builtin_prefetch(next[j] + k, 0, 2);  // into L2: see the top
      wv[j] = load16(w + (n + j) * K + k);
    }
    for (int i = 0; i < MR; ++i) {
      const v16 xv = load16(x + (m0 + i) * K + k);
      for (int j = 0; j < NR; ++j) acc[i * NR + j] += xv * wv[j];
    }
  }
  finish<NR, MR>(acc, x, w, y, body, K, N, m0, n);
}

template <typename T, int NR>
void rows(const float* x, const T* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    switch (std::min<int64_t>(4, M - m0)) {
      case 1: tile<T, NR, 1>(x, w, y, K, N, m0, n); break;
      case 2: tile<T, NR, 2>(x, w, y, K, N, m0, n); break;
      case 3: tile<T, NR, 3>(x, w, y, K, N, m0, n); break;
      default: tile<T, NR, 4>(x, w, y, K, N, m0, n); break;
    }
  }
}

// From 8 x rows: tiles of 8 x rows by 2 weight rows (the 4 x 4 tile's 16 sums, as many loads
// of x as before but half the weight loads per product, the group reused from L1 by every
// tile): 1.3x the 4 x 4 tiles' speed at 8 rows, 1.5x at 16 and 32 (C++ harness, SmolLM2's
// decode products). Below 8 rows, where the step is a read of the weights, 4 weight rows in
// flight read faster (5-13 %).
template <typename T, int NR>
void rows8(const float* x, const T* w, float* y, int64_t M, int64_t K, int64_t N, int64_t n) {
  int64_t m0 = 0;
  for (; m0 + 8 <= M; m0 += 8) tile<T, NR, 8>(x, w, y, K, N, m0, n);
  switch (M - m0) {
    case 1: tile<T, NR, 1>(x, w, y, K, N, m0, n); break;
    case 2: tile<T, NR, 2>(x, w, y, K, N, m0, n); break;
    case 3: tile<T, NR, 3>(x, w, y, K, N, m0, n); break;
    case 4: tile<T, NR, 4>(x, w, y, K, N, m0, n); break;
    case 5: tile<T, NR, 5>(x, w, y, K, N, m0, n); break;
    case 6: tile<T, NR, 6>(x, w, y, K, N, m0, n); break;
    case 7: tile<T, NR, 7>(x, w, y, K, N, m0, n); break;
    default: break;
  }
}

// Any tile shape sums each output element in the same order (see the top), so the shape may
// follow the row count without a row's numbers depending on its company.
template <typename T>
void block(const float* x, const T* w, float* y, int64_t M, int64_t K, int64_t N,
              int64_t n0) {
  const int64_t end = std::min(N, n0 + kBlock);
  int64_t n = n0;
  if (M >= 8) {
    for (; n + 2 <= end; n += 2) rows8<T, 2>(x, w, y, M, K, N, n);
  } else {
    for (; n + 4 <= end; n += 4) rows<T, 4>(x, w, y, M, K, N, n);
  }
  for (; n < end; ++n) rows<T, 1>(x, w, y, M, K, N, n);
}

template <typename T>
ffi::Error Run(ffi::ThreadPool& pool, const float* x, const T* w, float* y, int64_t M, int64_t K,
               int64_t N) {
  auto fn = [=](int64_t item) { block<T>(x, w, y, M, K, N, item * kBlock); };
  morse::parallel_for(pool, (N + kBlock - 1) / kBlock, fn);
  return ffi::Error::Success();
}

// bfloat16 x by bfloat16 w (a bf16 model's decode: its activations are bf16). Where the CPU has
// AVX512-BF16, each instruction multiplies 32 pairs exactly and adds them pairwise into 16
// float32 lanes (lane l sums k = 32c + 2l, then 32c + 2l + 1, in order of c), then the fixed
// lane tree and the k % 32 tail: twice the products of an f32 FMA per instruction and no
// conversion of w, where at 16+ rows the f32 path is bound by the cores' FMA rate (PyTorch's
// oneDNN uses the same instruction). The order is fixed per output element, as above, so a
// row's result still does not depend on its company. Elsewhere x is widened to float32 and the
// f32 path runs (exact: bf16 values are float32 values). `Run` for a bf16 x is this overload.
#ifdef __AVX512BF16__
template <int NR, int MR>
void tile_dp(const uint16_t* x, const uint16_t* w, float* y, int64_t K, int64_t N, int64_t m0,
             int64_t n) {
  v16 acc[MR * NR] = {};
  const int64_t body = K - K % 32;
  const uint16_t* next[NR];
  for (int j = 0; j < NR; ++j) next[j] = w + std::min(n + NR + j, N - 1) * K;
  for (int64_t k = 0; k < body; k += 32) {
    __m512bh wv[NR];
    for (int j = 0; j < NR; ++j) {
      __builtin_prefetch(next[j] + k, 0, 2);
      wv[j] = (__m512bh)_mm512_loadu_si512(w + (n + j) * K + k);
    }
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * K + k);
      for (int j = 0; j < NR; ++j) {
        acc[i * NR + j] = (v16)_mm512_dpbf16_ps((__m512)acc[i * NR + j], xv, wv[j]);
      }
    }
  }
  finish<NR, MR>(acc, x, w, y, body, K, N, m0, n);
}

template <int NR>
void rows_dp(const uint16_t* x, const uint16_t* w, float* y, int64_t M, int64_t K, int64_t N,
             int64_t n) {
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    switch (std::min<int64_t>(4, M - m0)) {
      case 1: tile_dp<NR, 1>(x, w, y, K, N, m0, n); break;
      case 2: tile_dp<NR, 2>(x, w, y, K, N, m0, n); break;
      case 3: tile_dp<NR, 3>(x, w, y, K, N, m0, n); break;
      default: tile_dp<NR, 4>(x, w, y, K, N, m0, n); break;
    }
  }
}

ffi::Error Run(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* w, float* y, int64_t M,
               int64_t K, int64_t N) {
  auto fn = [=](int64_t item) {
    const int64_t end = std::min(N, item * kBlock + kBlock);
    int64_t n = item * kBlock;
    for (; n + 4 <= end; n += 4) rows_dp<4>(x, w, y, M, K, N, n);
    for (; n < end; ++n) rows_dp<1>(x, w, y, M, K, N, n);
  };
  morse::parallel_for(pool, (N + kBlock - 1) / kBlock, fn);
  return ffi::Error::Success();
}
#else
ffi::Error Run(ffi::ThreadPool& pool, const uint16_t* x, const uint16_t* w, float* y, int64_t M,
               int64_t K, int64_t N) {
  std::vector<float> wide(M * K);
  for (int64_t i = 0; i < M * K; ++i) wide[i] = load1(x[i]);
  return Run<uint16_t>(pool, wide.data(), w, y, M, K, N);
}
#endif

std::string Shape(ffi::Span<const int64_t> d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? "x" : "") + std::to_string(d[i]);
  return s;
}

// y = x @ w^T, w [n, k]; x float32, or bfloat16 with a bfloat16 w (the overloads of `Run`).
template <ffi::DataType XT, ffi::DataType DT>
ffi::Error Impl(ffi::ThreadPool pool, ffi::Buffer<XT> x, ffi::Buffer<DT> w,
                ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || wd[1] != xd[1] ||
      y->element_count() != xd[0] * wd[0]) {
    return ffi::Error::InvalidArgument("skinny_matmul_cpu: shapes do not agree (x " +
                                       Shape(xd) + ", w [out, in] " + Shape(wd) + ")");
  }
  return Run(pool, x.typed_data(), w.typed_data(), y->typed_data(), xd[0], xd[1], wd[0]);
}

// y = x @ w[layer]^T, w [layers, n, k] (stacked layers read in place: a slice of them passed
// to a custom call would be copied first, a whole layer's weights per token).
template <ffi::DataType XT, ffi::DataType DT>
ffi::Error LayerImpl(ffi::ThreadPool pool, ffi::Buffer<XT> x, ffi::Buffer<DT> w,
                     ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != xd[1] || layer.element_count() != 1 ||
      y->element_count() != xd[0] * wd[1]) {
    return ffi::Error::InvalidArgument("skinny_matmul_cpu: shapes do not agree (x " +
                                       Shape(xd) + ", w [layers, out, in] " + Shape(wd) + ")");
  }
  const int64_t i = layer.typed_data()[0];
  if (i < 0 || i >= wd[0]) {
    return ffi::Error::InvalidArgument("skinny_matmul_cpu: layer " + std::to_string(i) +
                                       " out of range for " + std::to_string(wd[0]) + " layers");
  }
  return Run(pool, x.typed_data(), w.typed_data() + i * wd[1] * wd[2], y->typed_data(), xd[0],
             xd[1], wd[1]);
}

}  // namespace

#define BIND(XT, DT)                \
  ffi::Ffi::Bind()                  \
      .Ctx<ffi::ThreadPool>()       \
      .Arg<ffi::Buffer<XT>>()       \
      .Arg<ffi::Buffer<DT>>()       \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulF32, (Impl<ffi::F32, ffi::F32>), BIND(ffi::F32, ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulBF16, (Impl<ffi::F32, ffi::BF16>),
                              BIND(ffi::F32, ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulBF16X, (Impl<ffi::BF16, ffi::BF16>),
                              BIND(ffi::BF16, ffi::BF16));

#define BIND_LAYER(XT, DT)          \
  ffi::Ffi::Bind()                  \
      .Ctx<ffi::ThreadPool>()       \
      .Arg<ffi::Buffer<XT>>()       \
      .Arg<ffi::Buffer<DT>>()       \
      .Arg<ffi::Buffer<ffi::S32>>() \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulLayerF32, (LayerImpl<ffi::F32, ffi::F32>),
                              BIND_LAYER(ffi::F32, ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulLayerBF16, (LayerImpl<ffi::F32, ffi::BF16>),
                              BIND_LAYER(ffi::F32, ffi::BF16));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SkinnyMatmulLayerBF16X, (LayerImpl<ffi::BF16, ffi::BF16>),
                              BIND_LAYER(ffi::BF16, ffi::BF16));
