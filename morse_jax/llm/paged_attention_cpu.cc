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
#include <vector>

#include "cpu_parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline float load(float v) { return v; }
inline float load(uint16_t v) {  // bfloat16: the high half of a float32
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// q . k in a fixed order (lane j sums elements j, j + 8, ...; then the lanes, then the tail):
// a vectorised reduction whose order the compiler picks could depend on a buffer's address,
// and a row's log-probs would then depend on the slot and rows around it.
template <typename T>
inline float dot_product(const float* q, const T* k, int64_t x) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t body = x - x % 8;
  for (int64_t c = 0; c < body; c += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += q[c + j] * load(k[c + j]);
  }
  float dot = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
              ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (int64_t c = body; c < x; ++c) dot += q[c] * load(k[c]);
  return dot;
}

struct Dims {
  int64_t b, t, h, x, pages, kvh, psize, table, g;
};

// Every query of row `row` for the g heads of kv head `k`.
template <typename T>
void attend(const Dims& d, const float* q, const T* pool_k, const T* pool_v,
            const int32_t* table, const int32_t* q_pos, const int32_t* kv_len, float* out,
            int64_t row, int64_t k) {
  const int64_t x = d.x, g = d.g, P = d.psize;
  const float scale = 1.0f / std::sqrt(static_cast<float>(x));
  std::vector<float> qs(g * x), acc(g * x), m(g), l(g), s(P);
  for (int64_t i = 0; i < d.t; ++i) {
    const int64_t at = (row * d.t + i) * d.h + k * g;  // first of this kv head's query heads
    float* o = out + at * x;
    const int64_t limit = std::min<int64_t>(kv_len[row], int64_t{q_pos[row * d.t + i]} + 1);
    if (limit <= 0) {
      std::fill(o, o + g * x, 0.0f);
      continue;
    }
    for (int64_t j = 0; j < g * x; ++j) qs[j] = q[at * x + j] * scale;
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(m.begin(), m.end(), -1e30f);
    std::fill(l.begin(), l.end(), 0.0f);
    const int64_t n_pages = std::min<int64_t>((limit + P - 1) / P, d.table);
    for (int64_t pj = 0; pj < n_pages; ++pj) {
      const int64_t page = std::clamp<int64_t>(table[row * d.table + pj], 0, d.pages - 1);
      const int64_t n = std::min<int64_t>(P, limit - pj * P);
      const T* kp = pool_k + (page * d.kvh + k) * P * x;
      const T* vp = pool_v + (page * d.kvh + k) * P * x;
      for (int64_t j = 0; j < g; ++j) {
        const float* qj = qs.data() + j * x;
        float mx = m[j];
        for (int64_t r = 0; r < n; ++r) {
          const float dot = dot_product(qj, kp + r * x, x);
          s[r] = dot;
          mx = std::max(mx, dot);
        }
        float* aj = acc.data() + j * x;
        const float corr = std::exp(m[j] - mx);
        float sum = l[j] * corr;
        for (int64_t c = 0; c < x; ++c) aj[c] *= corr;
        for (int64_t r = 0; r < n; ++r) {
          const float p = std::exp(s[r] - mx);
          sum += p;
          const T* vr = vp + r * x;
          for (int64_t c = 0; c < x; ++c) aj[c] += p * load(vr[c]);
        }
        m[j] = mx;
        l[j] = sum;
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
