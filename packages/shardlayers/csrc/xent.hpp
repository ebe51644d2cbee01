// xent.hpp - per-row logic of the vocab-parallel cross-entropy, written once for host and device.
//
// A rank holds logits x[N, C] (its slice [vstart, vstart + C) of the classes). The forward runs two
// passes over x:
//   1. xent_stats_row: local running max m, sum of exp(x - m), the target logit (0 when the target
//      is another rank's class) and sum_j w_j x_j (only with label smoothing). The ranks then combine
//      the (m, s, x_t, swx) rows (one all-gather of N x 4 numbers, done in Python).
//   2. xent_grad_row: the gradient of the (weighted, smoothed, reduced) loss w.r.t. x, written into
//      a buffer the size of the local logits:
//        g_j = a * exp(x_j - m) - cw * w_j - [j == target] * ct
//      where m = the row's global max, a = cp / sum_j exp(x_j - m) (so a * exp(x_j - m) is cp times
//      the softmax exp((x_j - m) - log sum), as F.cross_entropy forms it: never exp(x_j - lse) with
//      lse = m + log sum rounded to one float, whose rounding (~1e-4 at |m| ~ 2000) would land in
//      the exponent) and a, ct, cw are per-row coefficients (0 for an ignored row) prepared by the caller.
// The CPU kernel runs xent_stats_row / xent_grad_row over whole rows (blocked for vectorisation);
// the CUDA kernel folds strided shares of a row with xent_partial_strided, merges them with
// xent_partial_merge and writes with xent_partial_finish, and computes each gradient element with
// xent_grad_elem. Those shared pieces also run on the host (module.cpp's *_blockwise_cpu entry
// points), so the CPU tests exercise the CUDA kernel's arithmetic and reduction order.
// Arithmetic is in acc_t<T> (float for float16/bfloat16/float32, double for float64).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "distkit/error.hpp"
#include "distkit/half.hpp"
#include "distkit/macros.hpp"

namespace shardlayers {

/// Threads of the CUDA stats kernel's block (one block per row).
constexpr int kStatsThreads = 256;

/// Argument checks shared by the CPU and CUDA entry points (run before any pointer is touched).
inline void xent_check_args(int64_t n, int64_t c, int64_t row_stride, uintptr_t x, uintptr_t target) {
  distkit::check<distkit::ValueError>(n >= 0, "number of rows must be >= 0, got ", n);
  distkit::check<distkit::ValueError>(c >= 1, "number of local classes must be >= 1, got ", c);
  distkit::check<distkit::ValueError>(row_stride >= c, "row_stride (", row_stride, ") must be >= columns (", c, ")");
  distkit::check<distkit::ValueError>(n == 0 || (x != 0 && target != 0), "null data pointer");
}

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
///
/// A pair whose max is -inf (masked classes only, e.g. a padded vocabulary slice) or whose sum
/// is 0 contributes nothing: merging it would compute exp(-inf - -inf) = NaN.
template <class A>
DK_INLINE void lse_merge(A& m, A& s, A m2, A s2) {
  if (s2 == A(0) || m2 == neg_inf<A>()) return;
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

/// Running statistics of a part of a row: log-sum-exp pair (m, s) and sum_j w_j x_j.
template <class A>
struct XentPartial {
  A m, s, sw;
};

template <class A>
DK_INLINE XentPartial<A> xent_partial_empty() {
  return XentPartial<A>{neg_inf<A>(), A(0), A(0)};
}

/// Fold the columns first, first + step, ... < C of a row into one partial (one CUDA thread's
/// share of a row; the whole row for step 1).
template <class T, class A>
DK_INLINE XentPartial<A> xent_partial_strided(const T* x, int64_t C, int64_t first, int64_t step, const A* w,
                                               bool want_sum) {
  XentPartial<A> p = xent_partial_empty<A>();
  for (int64_t j = first; j < C; j += step) {
    const A v = static_cast<A>(x[j]);
    lse_merge<A>(p.m, p.s, v, A(1));
    if (want_sum) p.sw += (w ? w[j] : A(1)) * v;
  }
  return p;
}

/// Combine two partials of the same row (the CUDA block's tree reduction).
template <class A>
DK_INLINE void xent_partial_merge(XentPartial<A>& a, const XentPartial<A>& b) {
  lse_merge<A>(a.m, a.s, b.m, b.s);
  a.sw += b.sw;
}

/// Write the row's statistics {max, sum exp(x - max), target logit, sum w x} from its partial.
template <class T, class A>
DK_INLINE void xent_partial_finish(const XentPartial<A>& p, const T* x, int64_t C, int64_t target, int64_t vstart,
                                   A* out) {
  const int64_t lt = target - vstart;
  out[0] = p.s == A(0) ? neg_inf<A>() : p.m;
  out[1] = p.s;
  out[2] = (lt >= 0 && lt < C) ? static_cast<A>(x[lt]) : A(0);
  out[3] = p.sw;
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

/// True for a row that contributes nothing (ignored target, or zero weight and no smoothing):
/// its gradient is exactly 0. Its max is a placeholder, so a * exp(x - m) must not be
/// evaluated (0 * exp(x) is NaN once exp(x) overflows, x > ~88 in float).
template <class A>
DK_INLINE bool xent_row_is_zero(A a, A ct, A cw) {
  return a == A(0) && ct == A(0) && cw == A(0);
}

/// Gradient of one element: a * exp(x - m) - cw * w - (is_target ? ct : 0); exactly 0 for a
/// row whose coefficients are all 0.
template <class A>
DK_INLINE A xent_grad_elem(A x, A m, A a, A ct, A cw, A w, bool is_target) {
  if (xent_row_is_zero<A>(a, ct, cw)) return A(0);
  A g = a * dk_exp<A>(x - m) - cw * w;
  return is_target ? g - ct : g;
}

/// Gradient of one row. coef = {m, a, ct, cw}.
template <class T, class A>
DK_HD void xent_grad_row(const T* x, T* g, int64_t C, int64_t target, int64_t vstart, const A* w, const A* coef) {
  const A m = coef[0], a = coef[1], ct = coef[2], cw = coef[3];
  const int64_t lt = target - vstart;
  if (xent_row_is_zero<A>(a, ct, cw)) {
    for (int64_t j = 0; j < C; ++j) g[j] = T(A(0));
    return;
  }
  if (w) {
    for (int64_t j = 0; j < C; ++j) g[j] = T(a * dk_exp<A>(static_cast<A>(x[j]) - m) - cw * w[j]);
  } else {
    for (int64_t j = 0; j < C; ++j) g[j] = T(a * dk_exp<A>(static_cast<A>(x[j]) - m) - cw);
  }
  if (lt >= 0 && lt < C) {
    g[lt] = T(xent_grad_elem<A>(static_cast<A>(x[lt]), m, a, ct, cw, w ? w[lt] : A(1), true));
  }
}

/// The CUDA stats kernel's algorithm for one row, run on the host: `threads` strided partials
/// merged by the same tree reduction as the block (tests compare it with xent_stats_row).
template <class T, class A>
void xent_stats_row_blockwise(const T* x, int64_t C, int64_t target, int64_t vstart, const A* w, bool want_sum,
                              A* out, int threads) {
  std::vector<XentPartial<A>> parts(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) parts[t] = xent_partial_strided<T, A>(x, C, t, threads, w, want_sum);
  for (int k = threads / 2; k > 0; k >>= 1)
    for (int t = 0; t < k; ++t) xent_partial_merge<A>(parts[t], parts[t + k]);
  xent_partial_finish<T, A>(parts[0], x, C, target, vstart, out);
}

/// The CUDA gradient kernel's per-element computation for one row, run on the host.
template <class T, class A>
void xent_grad_row_elementwise(const T* x, T* g, int64_t C, int64_t target, int64_t vstart, const A* w,
                               const A* coef) {
  const int64_t lt = target - vstart;
  for (int64_t j = 0; j < C; ++j)
    g[j] = T(xent_grad_elem<A>(static_cast<A>(x[j]), coef[0], coef[1], coef[2], coef[3], w ? w[j] : A(1), j == lt));
}

}  // namespace shardlayers
