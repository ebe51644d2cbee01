// distkit/adagrad.hpp - the Adagrad update of one element, written once for host and device.
//
//   acc += g * g;   w -= lr * g / (sqrt(acc) + eps)
//
// as torch.optim.Adagrad without lr decay or weight decay (acc.addcmul_(g, g);
// w.addcdiv_(g, acc.sqrt().add_(eps), value=-lr)) and WholeGraph's sparse Adagrad.
// kvps's server-side rule (rules.hpp) runs it over a row, wholemem's optimizer kernel
// (optim.hpp) per element on the CPU and the GPU.
//
// The two differ in how `acc += g * g` rounds, and each keeps its numbers:
// - Fused = true: one rounding (a fused multiply-add), as torch's CPU addcmul_ does;
//   kvps, whose keys get torch's numbers. (kvps compiles its steps a second time for
//   CPUs with an FMA instruction; elsewhere std::fma is a library call: kvps fma.hpp.)
// - Fused = false: the product, then the sum, as WholeGraph's kernel is written; wholemem.
//   (nvcc contracts that into one fma on the GPU by default, as it did WholeGraph's;
//   the host build has no FMA instruction to contract it into.)
// The step `w + (-lr * g) / den` rounds as `w - lr * g / den` (negation is exact).
#pragma once

#include <cmath>
#include <cstdint>

#include "macros.hpp"

namespace distkit {

/// Square root for host and device (sqrtf for float: no detour through double).
DK_FORCE_INLINE float hd_sqrt(float x) { return sqrtf(x); }
DK_FORCE_INLINE double hd_sqrt(double x) { return sqrt(x); }

/// x * y + z rounded once, for host and device.
DK_FORCE_INLINE float hd_fma(float x, float y, float z) { return fmaf(x, y, z); }
DK_FORCE_INLINE double hd_fma(double x, double y, double z) { return fma(x, y, z); }

/// One Adagrad step of element `w` with gradient `g` and accumulator `acc` (both updated
/// in place); `neg_lr` is -lr. A is float or double (wholemem passes float for 16-bit
/// weights, converted by the caller).
template <bool Fused, class A>
DK_FORCE_INLINE void adagrad_update(A& w, A& acc, A g, A neg_lr, A eps) {
  if constexpr (Fused) {
    acc = hd_fma(g, g, acc);
  } else {
    acc = acc + g * g;
  }
  w = w + (neg_lr * g) / (hd_sqrt(acc) + eps);
}

/// adagrad_update over a row of n elements: w[i] with acc[i] and g[i].
template <bool Fused, class A>
DK_FORCE_INLINE void adagrad_row(A* w, A* acc, const A* g, int64_t n, A neg_lr, A eps) {
  for (int64_t i = 0; i < n; ++i) adagrad_update<Fused>(w[i], acc[i], g[i], neg_lr, eps);
}

}  // namespace distkit
