// rules.hpp - what a push does to a key's slot: add the values (AdaPM's push),
// or apply an optimizer step with them as the gradient.
//
// The optimizer steps follow torch.optim's CPU kernels operation by
// operation, including where those kernels fuse a multiply and an add (lerp,
// addcmul and add with alpha are one rounding there), so a key updated only
// here gets torch's numbers. Optimizer state lives in the slot behind the row;
// the step count of Adam is kept per row (as TorchRec/FBGEMM do), so a row not
// in a batch is not touched.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "distkit/adagrad.hpp"
#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "fma.hpp"

namespace kvps {

/// The server's update rule (exported to Python as RULES).
enum RuleKind : int { R_ADD = 0, R_SGD = 1, R_ADAGRAD = 2, R_ROWWISE_ADAGRAD = 3, R_ADAM = 4 };

struct Rule {
  int kind = R_ADD;
  double lr = 0, eps = 0, beta1 = 0, beta2 = 0;
};

/// Optimizer state elements stored behind a row of `row` elements:
/// Adagrad: the sum of squared gradients per element; row-wise Adagrad: one
/// sum of mean squared gradients per row; Adam: first and second moments per
/// element and the row's step count.
inline int64_t state_len(const Rule& r, int64_t row) {
  switch (r.kind) {
    case R_ADAGRAD:
      return row;
    case R_ROWWISE_ADAGRAD:
      return 1;
    case R_ADAM:
      return 2 * row + 1;
    default:
      return 0;
  }
}

template <class T>
void add_values(char* dst, const char* src, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = T(static_cast<float>(d[i]) + static_cast<float>(s[i]));
  }
}

// The steps below take the slot and the gradient of one row of n elements.

/// torch.optim.SGD (no momentum): p.add_(g, alpha=-lr).
template <class T>
KVPS_INLINE void sgd_step(const Rule& r, T* p, const T* g, int64_t n) {
  const T a = static_cast<T>(-r.lr);
  for (int64_t i = 0; i < n; ++i) p[i] = std::fma(g[i], a, p[i]);
}

/// torch.optim.Adagrad (lr_decay = weight_decay = 0, initial accumulator 0):
/// acc.addcmul_(g, g); p.addcdiv_(g, acc.sqrt().add_(eps), value=-lr), with
/// addcmul_'s one rounding (distkit/adagrad.hpp, Fused = true).
template <class T>
KVPS_INLINE void adagrad_step(const Rule& r, T* p, const T* g, int64_t n) {
  distkit::adagrad_row<true>(p, p + n, g, n, static_cast<T>(-r.lr), static_cast<T>(r.eps));
}

/// Row-wise Adagrad as in FBGEMM/TorchRec: acc += mean(g^2) (one accumulator
/// per row); p -= lr / (sqrt(acc) + eps) * g. The sum of squares runs in 8
/// lanes (as FBGEMM's AVX2 kernel does), so the compiler vectorises it.
template <class T>
KVPS_INLINE void rowwise_adagrad_step(const Rule& r, T* p, const T* g, int64_t n) {
  T lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] += g[i + l] * g[i + l];
  T sq = 0;
  for (; i < n; ++i) sq += g[i] * g[i];
  for (int l = 0; l < 8; ++l) sq += lane[l];
  T& acc = p[n];
  acc += sq / static_cast<T>(n);
  const T mult = static_cast<T>(r.lr) / (std::sqrt(acc) + static_cast<T>(r.eps));
  for (i = 0; i < n; ++i) p[i] -= mult * g[i];
}

/// torch.optim.Adam (amsgrad off, no weight decay) with the step count of
/// the row: m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, value=1 - b2);
/// p.addcdiv_(m, v.sqrt() / sqrt(1 - b2^t) + eps, value=-lr / (1 - b1^t)).
/// Scalars are computed in double, as Python computes them for torch.
template <class T>
KVPS_INLINE void adam_step(const Rule& r, T* p, const T* g, int64_t n) {
  T* m = p + n;
  T* v = m + n;
  T& steps = v[n];
  steps += 1;
  const double t = static_cast<double>(steps);
  const double bc1 = 1 - std::pow(r.beta1, t);
  const double bc2 = 1 - std::pow(r.beta2, t);
  const T neg_step = static_cast<T>(-(r.lr / bc1));
  const T bc2_sqrt = static_cast<T>(std::pow(bc2, 0.5));
  const T w1 = static_cast<T>(1 - r.beta1), b2 = static_cast<T>(r.beta2), w2 = static_cast<T>(1 - r.beta2);
  const T eps = static_cast<T>(r.eps);
  // torch's lerp: start + w * (end - start) for |w| < 0.5, else end - (1 - w) * (end - start), fused
  const bool small = std::abs(w1) < T(0.5);
  const T coeff = small ? w1 : w1 - T(1);
  for (int64_t i = 0; i < n; ++i) {
    m[i] = std::fma(coeff, g[i] - m[i], small ? m[i] : g[i]);
    v[i] = std::fma(w2 * g[i], g[i], v[i] * b2);
    const T den = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] = p[i] + (neg_step * m[i]) / den;
  }
}

using AddFn = void (*)(char*, const char*, int64_t);
/// apply(rule, slot, update, row_len): one push of `update` into a key's slot.
using ApplyFn = void (*)(const Rule&, char*, const char*, int64_t);

template <class T, void (*Step)(const Rule&, T*, const T*, int64_t)>
void apply_step(const Rule& r, char* slot, const char* src, int64_t n) {
  Step(r, reinterpret_cast<T*>(slot), reinterpret_cast<const T*>(src), n);
}

/// The same, compiled for CPUs with an FMA instruction (fma.hpp).
template <class T, void (*Step)(const Rule&, T*, const T*, int64_t)>
KVPS_FMA_TARGET void apply_step_fma(const Rule& r, char* slot, const char* src, int64_t n) {
  Step(r, reinterpret_cast<T*>(slot), reinterpret_cast<const T*>(src), n);
}

template <class T, void (*Step)(const Rule&, T*, const T*, int64_t)>
ApplyFn step_fn() {
  return cpu_has_fma() ? &apply_step_fma<T, Step> : &apply_step<T, Step>;
}

template <class T>
void apply_add(const Rule&, char* slot, const char* src, int64_t n) {
  add_values<T>(slot, src, n);
}

inline AddFn add_fn(distkit::DType dt) {
  AddFn f = nullptr;
  distkit::dispatch_floating(dt, [&](auto tag) { f = &add_values<decltype(tag)>; });
  return f;
}

inline ApplyFn apply_fn(const Rule& r, distkit::DType dt) {
  if (r.kind == R_ADD) {
    ApplyFn f = nullptr;
    distkit::dispatch_floating(dt, [&](auto tag) { f = &apply_add<decltype(tag)>; });
    return f;
  }
  distkit::check<distkit::TypeError>(dt == distkit::DType::Float32 || dt == distkit::DType::Float64,
                                     "server-side optimizers need a float32 or float64 server, got ",
                                     distkit::dtype_name(dt));
  const bool f32 = dt == distkit::DType::Float32;
  switch (r.kind) {
    case R_SGD:
      return f32 ? step_fn<float, sgd_step<float>>() : step_fn<double, sgd_step<double>>();
    case R_ADAGRAD:
      return f32 ? step_fn<float, adagrad_step<float>>() : step_fn<double, adagrad_step<double>>();
    case R_ROWWISE_ADAGRAD:
      return f32 ? step_fn<float, rowwise_adagrad_step<float>>() : step_fn<double, rowwise_adagrad_step<double>>();
    case R_ADAM:
      return f32 ? step_fn<float, adam_step<float>>() : step_fn<double, adam_step<double>>();
    default:
      throw distkit::ValueError(distkit::str("unknown update rule ", r.kind));
  }
}

}  // namespace kvps
