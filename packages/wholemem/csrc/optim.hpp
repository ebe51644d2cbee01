// optim.hpp - sparse row optimizers, per-element code written once for host and device.
//
// Every update reads one weight element w (stored as T), its gradient g and up to
// two state elements (stored in the accumulation type A = distkit::acc_t<T>), and writes w
// and the states back. The formulas follow torch.optim (SGD, sparse Adagrad,
// SparseAdam = "lazy" Adam, RMSprop) so results match a dense single-process
// reference element for element.
#pragma once

#include <cmath>
#include <cstdint>

#include "distkit/half.hpp"
#include "distkit/macros.hpp"

namespace wholemem {

enum class OptKind : int32_t { SGD = 0, Adagrad = 1, LazyAdam = 2, RMSProp = 3 };

/// Number of state arrays (each [rows, cols] in the accumulation type) per optimizer.
inline int num_states(OptKind k) {
  switch (k) {
    case OptKind::SGD: return 0;
    case OptKind::Adagrad: return 1;
    case OptKind::LazyAdam: return 2;
    case OptKind::RMSProp: return 1;
  }
  return 0;
}

struct OptParams {
  OptKind kind;
  float lr;
  float weight_decay;
  float eps;
  float beta1;      // Adam
  float beta2;      // Adam
  float alpha;      // RMSProp smoothing constant
  float step_size;  // Adam: lr * sqrt(1 - beta2^t) / (1 - beta1^t), computed on the host in double
};

DK_INLINE float dk_sqrt(float x) { return sqrtf(x); }
DK_INLINE double dk_sqrt(double x) { return sqrt(x); }

/// One element of a sparse optimizer step: w, s0, s1 updated in place.
template <class A>
DK_INLINE void optim_element(const OptParams& p, A& w, A g, A* s0, A* s1) {
  if (p.weight_decay != 0.0f) g = g + A(p.weight_decay) * w;
  switch (p.kind) {
    case OptKind::SGD:
      w = w - A(p.lr) * g;
      break;
    case OptKind::Adagrad: {
      const A s = *s0 + g * g;
      *s0 = s;
      w = w - A(p.lr) * (g / (dk_sqrt(s) + A(p.eps)));
      break;
    }
    case OptKind::LazyAdam: {
      const A m = *s0 + (g - *s0) * (A(1) - A(p.beta1));
      const A v = *s1 + (g * g - *s1) * (A(1) - A(p.beta2));
      *s0 = m;
      *s1 = v;
      w = w - A(p.step_size) * (m / (dk_sqrt(v) + A(p.eps)));
      break;
    }
    case OptKind::RMSProp: {
      const A v = A(p.alpha) * *s0 + (A(1) - A(p.alpha)) * g * g;
      *s0 = v;
      w = w - A(p.lr) * (g / (dk_sqrt(v) + A(p.eps)));
      break;
    }
  }
}

/// Flat element `flat` of an [n, ncols] update: weight row idx[i] of a strided
/// table (T), gradient row i (A, contiguous), state rows idx[i] (A, contiguous).
template <class T>
DK_INLINE void optim_update_element(const OptParams& p, T* w_base, int64_t row_stride, int64_t col_stride,
                                    int64_t ncols, const int64_t* idx, const distkit::acc_t<T>* grad, distkit::acc_t<T>* s0,
                                    distkit::acc_t<T>* s1, int64_t flat) {
  using A = distkit::acc_t<T>;
  const int64_t i = flat / ncols;
  const int64_t j = flat - i * ncols;
  const int64_t r = idx[i];
  T& wref = w_base[r * row_stride + j * col_stride];
  A w = static_cast<A>(wref);
  const int64_t sidx = r * ncols + j;
  optim_element<A>(p, w, grad[flat], s0 ? s0 + sidx : nullptr, s1 ? s1 + sidx : nullptr);
  wref = T(w);
}

}  // namespace wholemem
