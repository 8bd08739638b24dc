// 16-lane float vectors for the CPU kernels (cpu_kernels.py builds them): loads of float32 and
// bfloat16, sums of lanes in one fixed tree, and exp.
//
// Why fixed trees: a reduction whose order the compiler picks may depend on a buffer's address,
// and a row's log-probs would then depend on the slot and the rows around it.

#pragma once

#include <cstdint>
#include <cstring>

namespace morse {

typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t h16 __attribute__((vector_size(32)));
typedef uint32_t u16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline v16 load16(const uint16_t* p) {  // 16 bfloat16 -> float32 (the high half, exact)
  h16 h;
  std::memcpy(&h, p, sizeof h);
  return (v16)(__builtin_convertvector(h, u16) << 16);
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline float load1(float v) { return v; }
inline float load1(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// 16 lanes summed in a fixed tree: lane j + lane j + 8, then j + 4, j + 2, j + 1.
inline float lanes_sum(v16 v) {
  float a[16];
  std::memcpy(a, &v, sizeof a);
  for (int w = 8; w >= 1; w /= 2) {
    for (int j = 0; j < w; ++j) a[j] += a[j + w];
  }
  return a[0];
}

inline float lanes_max(v16 v) {  // exact whatever the order
  float a[16];
  std::memcpy(a, &v, sizeof a);
  float m = a[0];
  for (int j = 1; j < 16; ++j) m = a[j] > m ? a[j] : m;
  return m;
}

// Lane l of the result: lanes_sum(a[bitrev(l)]), the same tree, for 16 vectors at once
// (halves of each vector's segments folded pairwise: 15 adds instead of 16 x 15).
inline v16 fold(v16 a, v16 b, int level) {
  switch (level) {
    case 0: return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21,
                                           22, 23) +
                   __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27,
                                           28, 29, 30, 31);
    case 1: return __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24,
                                           25, 26, 27) +
                   __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28,
                                           29, 30, 31);
    case 2: return __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12,
                                           13, 28, 29) +
                   __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14,
                                           15, 30, 31);
    default: return __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12,
                                            28, 14, 30) +
                    __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13,
                                            29, 15, 31);
  }
}
constexpr int kBitrev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

// out[i] = lanes_sum(a[i]) for the 16 vectors (a is overwritten).
inline void sums16(v16 (&a)[16], float* out) {
  for (int level = 0, n = 16; n > 1; ++level, n /= 2) {
    for (int i = 0; i < n / 2; ++i) a[i] = fold(a[2 * i], a[2 * i + 1], level);
  }
  float lanes[16];
  std::memcpy(lanes, &a[0], sizeof lanes);
  for (int l = 0; l < 16; ++l) out[kBitrev[l]] = lanes[l];
}

// exp of each lane for x <= 0 (softmax weights): 2^n e^r with n = round(x / ln 2) and r = x -
// n ln 2 in two parts (Cody-Waite), e^r by Cephes' expf polynomial (within 2 ulp of expf);
// below -87.3 (where expf is denormal or 0) it returns 2^-126 e^r, about 1e-38: beside the
// block's largest weight, 1, that is nothing.
inline v16 exp16(v16 x) {
  const v16 lo = v16{} - 87.33654f;
  x = x < lo ? lo : x;
  const v16 magic = v16{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const v16 n = (x * 1.44269504088896341f + magic) - magic;
  const v16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  v16 p = v16{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const i16 bits = (__builtin_convertvector(n, i16) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace morse
