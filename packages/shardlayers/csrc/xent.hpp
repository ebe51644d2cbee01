// xent.hpp - per-row logic of the vocab-parallel cross-entropy, written once for host and device.
//
// A rank holds logits x[N, C] (its slice [vstart, vstart + C) of the classes). The forward runs two
// passes over x:
//   1. xent_stats_row: local running max m, sum of exp(x - m), the target logit (0 when the target
//      is another rank's class) and sum_j w_j x_j (only with label smoothing). The ranks then combine
//      the (m, s, x_t, swx) rows (one all-gather of N x 4 numbers, done in Python).
//   2. xent_grad_row: the gradient of the (weighted, smoothed, reduced) loss w.r.t. x, written into
//      a buffer the size of the local logits:
//        g_j = cp * exp(x_j - lse) - cw * w_j - [j == target] * ct
//      where lse = global log-sum-exp of the row and cp, ct, cw are per-row coefficients (0 for an
//      ignored row) prepared by the caller.
// Arithmetic is in acc_t<T> (float for float16/bfloat16/float32, double for float64).
#pragma once

#include <cmath>
#include <cstdint>

#include "distkit/half.hpp"
#include "distkit/macros.hpp"

namespace shardlayers {

/// exp(x) for float on the host: Cephes-style range reduction + degree-5 polynomial (about 1 ulp),
/// branch-free so that the row loops vectorise; NaN propagates, inputs below -87 (where float
/// exp is subnormal) give 0, so -inf logits (masked classes) contribute exactly nothing.
DK_INLINE float fast_expf(float x) {
  const bool under = x < -87.0f;
  x = under ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = x * 1.44269504088896341f + magic;
  float n = t - magic;
  int32_t e = static_cast<int32_t>(distkit::f32_bits(t) - distkit::f32_bits(magic));
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  y = y * distkit::bits_f32(static_cast<uint32_t>(e + 127) << 23);
  return under ? 0.0f : y;
}

template <class A>
DK_INLINE A dk_exp(A v) {
  return exp(v);
}
template <>
DK_INLINE float dk_exp<float>(float v) {
#if defined(__CUDA_ARCH__)
  return expf(v);
#else
  return fast_expf(v);
#endif
}

template <class A>
DK_INLINE A neg_inf() {
  return -static_cast<A>(INFINITY);
}

/// Merge the running log-sum-exp pair (m, s) with another pair (m2, s2).
template <class A>
DK_INLINE void lse_merge(A& m, A& s, A m2, A s2) {
  if (s2 == A(0)) return;
  if (s == A(0)) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * dk_exp<A>(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * dk_exp<A>(m2 - m);
  }
}

/// Local statistics of one row: out = {max, sum exp(x - max), target logit, sum_j w_j x_j}.
/// `cols` is [lo, hi) of the row handled by this caller (a whole row on the CPU, a thread's
/// strided share on the GPU is handled by the CUDA kernel itself).
template <class T, class A>
DK_HD void xent_stats_row(const T* x, int64_t C, int64_t target, int64_t vstart, const A* w, bool want_sum,
                          A* out) {
  // Loops in blocks of 8 independent accumulators so the compiler vectorises them without
  // reassociating a single floating-point sum.
  constexpr int B = 8;
  const int64_t cb = C - C % B;
  A mb[B];
  for (int k = 0; k < B; ++k) mb[k] = neg_inf<A>();
  for (int64_t j = 0; j < cb; j += B)
    for (int k = 0; k < B; ++k) {
      A v = static_cast<A>(x[j + k]);
      mb[k] = v > mb[k] ? v : mb[k];
    }
  A m = neg_inf<A>();
  for (int k = 0; k < B; ++k) m = mb[k] > m ? mb[k] : m;
  for (int64_t j = cb; j < C; ++j) {
    A v = static_cast<A>(x[j]);
    m = v > m ? v : m;
  }
  A s = 0;
  if (m != neg_inf<A>()) {
    A sb[B] = {};
    for (int64_t j = 0; j < cb; j += B)
      for (int k = 0; k < B; ++k) sb[k] += dk_exp<A>(static_cast<A>(x[j + k]) - m);
    for (int64_t j = cb; j < C; ++j) s += dk_exp<A>(static_cast<A>(x[j]) - m);
    for (int k = 0; k < B; ++k) s += sb[k];
  }
  A sw = 0;
  if (want_sum) {
    A wb[B] = {};
    for (int64_t j = 0; j < cb; j += B)
      for (int k = 0; k < B; ++k) wb[k] += (w ? w[j + k] : A(1)) * static_cast<A>(x[j + k]);
    for (int64_t j = cb; j < C; ++j) sw += (w ? w[j] : A(1)) * static_cast<A>(x[j]);
    for (int k = 0; k < B; ++k) sw += wb[k];
  }
  const int64_t lt = target - vstart;
  out[0] = m;
  out[1] = s;
  out[2] = (lt >= 0 && lt < C) ? static_cast<A>(x[lt]) : A(0);
  out[3] = sw;
}

/// Gradient of one element: cp * exp(x - lse) - cw * w - (is_target ? ct : 0).
template <class A>
DK_INLINE A xent_grad_elem(A x, A lse, A cp, A ct, A cw, A w, bool is_target) {
  A g = cp * dk_exp<A>(x - lse) - cw * w;
  return is_target ? g - ct : g;
}

/// Gradient of one row. coef = {lse, cp, ct, cw}.
template <class T, class A>
DK_HD void xent_grad_row(const T* x, T* g, int64_t C, int64_t target, int64_t vstart, const A* w, const A* coef) {
  const A lse = coef[0], cp = coef[1], ct = coef[2], cw = coef[3];
  const int64_t lt = target - vstart;
  if (cp == A(0) && ct == A(0) && cw == A(0)) {
    for (int64_t j = 0; j < C; ++j) g[j] = T(A(0));
    return;
  }
  if (w) {
    for (int64_t j = 0; j < C; ++j) g[j] = T(cp * dk_exp<A>(static_cast<A>(x[j]) - lse) - cw * w[j]);
  } else {
    for (int64_t j = 0; j < C; ++j) g[j] = T(cp * dk_exp<A>(static_cast<A>(x[j]) - lse) - cw);
  }
  if (lt >= 0 && lt < C) {
    g[lt] = T(xent_grad_elem<A>(static_cast<A>(x[lt]), lse, cp, ct, cw, w ? w[lt] : A(1), true));
  }
}

}  // namespace shardlayers
