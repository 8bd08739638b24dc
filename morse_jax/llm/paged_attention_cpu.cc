// Paged attention of a few queries per row on CPU, as an XLA FFI custom call
// (morse_jax/llm/cpu_attention.py builds and registers it; paged.py's `paged_attention` is the
// reference it is tested against).
//
// Why: XLA:CPU runs the decode step's attention (a [b, kv] batch of g x x by x x s products, g = 3)
// at ~5 GB/s, and through the page table it gathers every block of pages once per generated
// token; a decode step of SmolLM2 spent ~3/4 of its time there. This kernel reads each key and
// value once per query straight from its page, for all g query heads of its kv head, with an
// online softmax per page, spread over XLA's intra-op threads by (row, kv head).
//
// Layout (paged.py's): q [b, t, h, x] f32 (query head kv * g + j reads kv head kv); pool_k /
// pool_v [pages, kv, P, x] (f32 or bf16); pages [b, n] int32; q_pos [b, t] int32; kv_len [b]
// int32. Query (b, i) sees key positions p < kv_len[b] with p <= q_pos[b, i]; position p is slot
// p % P of page pages[b, p / P]. A query that sees no key gets zeros. Output [b, t, h, x] f32.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_parallel.h"
#include "cpu_vector.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using morse::v16;

constexpr int kKeys = 16;  // key positions per block of the online softmax (a vector's lanes)

struct Dims {
  int64_t b, t, h, x, pages, kvh, psize, table, g;
};

// One block of 16 keys for G query heads of one kv head (G <= 3: their accumulators fit the
// vector registers), each key and value loaded once for all G. Lanes past the block's n keys
// read a row of zeros and are masked out. The next block's first next_n keys and values are
// prefetched into L2, a line beside each line of this block's loads (see `attend`).
//
// q . k: each dot product sums x in 16-lane chunks in order, then its lanes in the fixed tree
// (`sums16`), then the x % 16 tail; p . v: each output sums the block's keys in order; so a
// row's numbers never depend on the slot, the rows around it or the threads.
template <int G, typename T>
inline void block(const float* q, const T* const* keys, const T* const* values, int64_t n,
                  int64_t x, float* m, float* l, float* acc, const T* const* next_keys,
                  const T* const* next_values, int64_t next_n) {
  constexpr int kHalf = kKeys / 2;  // keys per pass: G x 8 sums in registers
  const int64_t body = x - x % 16;
  v16 dots[G][kKeys];
  for (int half = 0; half < kKeys; half += kHalf) {
    v16 a[G][kHalf] = {};
    for (int64_t c = 0; c < body; c += 16) {
      v16 qv[G];
      for (int j = 0; j < G; ++j) qv[j] = morse::load16(q + j * x + c);
#pragma GCC unroll 8
      for (int r = 0; r < kHalf; ++r) {
        if (half + r < next_n) __builtin_prefetch(next_keys[half + r] + c, 0, 2);
        const v16 kv = morse::load16(keys[half + r] + c);
        for (int j = 0; j < G; ++j) a[j][r] += qv[j] * kv;
      }
    }
    for (int j = 0; j < G; ++j) {
      for (int r = 0; r < kHalf; ++r) dots[j][half + r] = a[j][r];
    }
  }
  float w[G][kKeys], corr[G];
  for (int j = 0; j < G; ++j) {
    float s[kKeys];
    morse::sums16(dots[j], s);
    for (int r = 0; r < kKeys; ++r) {
      for (int64_t c = body; c < x; ++c) s[r] += q[j * x + c] * morse::load1(keys[r][c]);
      if (r >= n) s[r] = -1e30f;
    }
    const v16 sv = morse::load16(s);
    const float mx = std::max(m[j], morse::lanes_max(sv));
    morse::store16(w[j], morse::exp16(sv - mx));
    for (int64_t r = n; r < kKeys; ++r) w[j][r] = 0.0f;
    corr[j] = std::exp(m[j] - mx);
    l[j] = l[j] * corr[j] + morse::lanes_sum(morse::load16(w[j]));
    m[j] = mx;
  }
  for (int64_t c = 0; c < body; c += 16) {
    v16 a[G];
    for (int j = 0; j < G; ++j) a[j] = morse::load16(acc + j * x + c) * corr[j];
#pragma GCC unroll 16
    for (int r = 0; r < kKeys; ++r) {
      if (r < next_n) __builtin_prefetch(next_values[r] + c, 0, 2);
      const v16 vv = morse::load16(values[r] + c);
      for (int j = 0; j < G; ++j) a[j] += w[j][r] * vv;
    }
    for (int j = 0; j < G; ++j) morse::store16(acc + j * x + c, a[j]);
  }
  for (int64_t c = body; c < x; ++c) {
    for (int j = 0; j < G; ++j) {
      float a = acc[j * x + c] * corr[j];
      for (int r = 0; r < kKeys; ++r) a += w[j][r] * morse::load1(values[r][c]);
      acc[j * x + c] = a;
    }
  }
}

// Every query of row `row` for the g heads of kv head `k`: an online softmax over blocks of 16
// key positions, each key and value read from its page once per query and group of up to 3
// heads, vectorised over the block's keys for q . k and exp and over the head dim for p . v.
template <typename T>
void attend(const Dims& d, const float* q, const T* pool_k, const T* pool_v,
            const int32_t* table, const int32_t* q_pos, const int32_t* kv_len, float* out,
            int64_t row, int64_t k) {
  const int64_t x = d.x, g = d.g, P = d.psize;
  const float scale = 1.0f / std::sqrt(static_cast<float>(x));
  std::vector<float> qs(g * x), acc(g * x), m(g), l(g);
  const std::vector<T> zeros(x, T{});  // the keys and values of a partial block's empty lanes
  const T* keys[kKeys];
  const T* values[kKeys];
  const T* next_keys[kKeys];
  const T* next_values[kKeys];
  for (int64_t i = 0; i < d.t; ++i) {
    const int64_t at = (row * d.t + i) * d.h + k * g;  // first of this kv head's query heads
    float* o = out + at * x;
    const int64_t limit = std::min<int64_t>({kv_len[row], int64_t{q_pos[row * d.t + i]} + 1,
                                             d.table * P});
    if (limit <= 0) {
      std::fill(o, o + g * x, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < g * x; ++j) qs[j] = q[at * x + j] * scale;
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(m.begin(), m.end(), -1e30f);
    std::fill(l.begin(), l.end(), 0.0f);
    // Key positions walk the page table in order (no division per key): `at_page` / `at_slot`
    // is where the next block starts, `ahead_*` where the block after it does.
    auto base = [&](int64_t pj) {  // offset of page-table entry pj's kv head k, slot 0
      const int64_t page = std::clamp<int64_t>(table[row * d.table + pj], 0, d.pages - 1);
      return (page * d.kvh + k) * P * x;
    };
    int64_t at_page = 0, at_slot = 0, ahead_page = 0, ahead_slot = 0;
    auto advance = [&](int64_t& pj, int64_t& slot, int64_t by) {
      slot += by;
      pj += slot / P;
      slot %= P;
    };
    advance(ahead_page, ahead_slot, kKeys);
    for (int64_t p0 = 0; p0 < limit; p0 += kKeys) {
      const int64_t n = std::min<int64_t>(kKeys, limit - p0);
      for (int64_t r = 0, pj = at_page, slot = at_slot, off = base(pj); r < kKeys; ++r) {
        keys[r] = r < n ? pool_k + off + slot * x : zeros.data();
        values[r] = r < n ? pool_v + off + slot * x : zeros.data();
        if (++slot == P && r + 1 < n) slot = 0, off = base(++pj);
      }
      // The next block's keys and values are fetched (into L2) while this one is summed: its
      // pages lie anywhere in the pool, so the hardware prefetcher cannot guess them (into L1,
      // 128 lines a block, the fetches were 20 % slower in a C++ harness). `block` issues them
      // one line beside each load of this block: all 128 at the block's start left the core
      // waiting in the model (a call's KV is cold there), 1.5x the time of spreading them
      // (`benchmarks.engine_step_cpu`, SmolLM2 4 x 460 and 32 x 280); 2 or 4 blocks ahead
      // instead of 1 changed nothing.
      const int64_t ahead = std::max<int64_t>(0, std::min<int64_t>(kKeys, limit - p0 - kKeys));
      for (int64_t r = 0, pj = ahead_page, slot = ahead_slot, off = ahead > 0 ? base(pj) : 0;
           r < ahead; ++r) {
        next_keys[r] = pool_k + off + slot * x;
        next_values[r] = pool_v + off + slot * x;
        if (++slot == P && r + 1 < ahead) slot = 0, off = base(++pj);
      }
      advance(at_page, at_slot, kKeys);
      advance(ahead_page, ahead_slot, kKeys);
      for (int64_t j = 0; j < g; j += 3) {  // heads in groups of 3, then the 1 or 2 left
        float *qj = qs.data() + j * x, *aj = acc.data() + j * x;
        const int64_t nn = j == 0 ? ahead : 0;  // the first group fetches the next block
        auto run = [&](auto G) {
          block<decltype(G)::value>(qj, keys, values, n, x, &m[j], &l[j], aj, next_keys,
                                    next_values, nn);
        };
        switch (std::min<int64_t>(3, g - j)) {
          case 1: run(std::integral_constant<int, 1>{}); break;
          case 2: run(std::integral_constant<int, 2>{}); break;
          default: run(std::integral_constant<int, 3>{}); break;
        }
      }
    }
    for (int64_t j = 0; j < g; ++j) {
      const float inv = 1.0f / l[j];
      for (int64_t c = 0; c < x; ++c) o[j * x + c] = acc[j * x + c] * inv;
    }
  }
}

template <ffi::DataType DT>
ffi::Error Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<DT> pool_k,
                ffi::Buffer<DT> pool_v, ffi::Buffer<ffi::S32> table, ffi::Buffer<ffi::S32> q_pos,
                ffi::Buffer<ffi::S32> kv_len, ffi::ResultBuffer<ffi::F32> out) {
  using T = ffi::NativeType<DT>;
  const auto qd = q.dimensions(), kd = pool_k.dimensions(), td = table.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged_attention_cpu: q and the pools must be 4-D, the "
                                       "page table 2-D");
  }
  Dims d{qd[0], qd[1], qd[2], qd[3], kd[0], kd[1], kd[2], td[1], 0};
  if (kd[3] != d.x || d.kvh < 1 || d.h % d.kvh || td[0] != d.b ||
      q_pos.element_count() != d.b * d.t || kv_len.element_count() != d.b ||
      pool_v.element_count() != pool_k.element_count()) {
    return ffi::Error::InvalidArgument(
        "paged_attention_cpu: shapes do not agree (q " + std::to_string(d.b) + "x" +
        std::to_string(d.t) + "x" + std::to_string(d.h) + "x" + std::to_string(d.x) +
        ", pool head dim " + std::to_string(kd[3]) + ", kv heads " + std::to_string(d.kvh) +
        ", table rows " + std::to_string(td[0]) + ")");
  }
  d.g = d.h / d.kvh;
  const float* qp = q.typed_data();
  const T* kp = pool_k.typed_data();
  const T* vp = pool_v.typed_data();
  const int32_t *tp = table.typed_data(), *pp = q_pos.typed_data(), *lp = kv_len.typed_data();
  float* op = out->typed_data();
  auto fn = [=](int64_t item) {
    attend<T>(d, qp, kp, vp, tp, pp, lp, op, item / d.kvh, item % d.kvh);
  };
  morse::parallel_for(pool, d.b * d.kvh, fn);  // items: (row, kv head)
  return ffi::Error::Success();
}

}  // namespace

#define BIND                                \
  ffi::Ffi::Bind()                          \
      .Ctx<ffi::ThreadPool>()               \
      .Arg<ffi::Buffer<ffi::F32>>()         \
      .Arg<ffi::Buffer<DT_>>()              \
      .Arg<ffi::Buffer<DT_>>()              \
      .Arg<ffi::Buffer<ffi::S32>>()         \
      .Arg<ffi::Buffer<ffi::S32>>()         \
      .Arg<ffi::Buffer<ffi::S32>>()         \
      .Ret<ffi::Buffer<ffi::F32>>()

#define DT_ ffi::F32
XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedAttentionF32, Impl<ffi::F32>, BIND);
#undef DT_
#define DT_ ffi::BF16
XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedAttentionBF16, Impl<ffi::BF16>, BIND);
#undef DT_
// A bfloat16 pool stored as its uint16 bits (paged.py: XLA:CPU scatters bfloat16 through a
// float32 copy of the whole pool): the same 16 bits, read as bfloat16.
#define DT_ ffi::U16
XLA_FFI_DEFINE_HANDLER_SYMBOL(PagedAttentionBF16Bits, Impl<ffi::U16>, BIND);
#undef DT_
