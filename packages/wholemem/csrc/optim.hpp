// optim.hpp - sparse row optimizers, per-element code written once for host and device.
//
// Every update reads one weight element w (stored as T), its gradient g and up to
// two state elements (stored in the accumulation type A = distkit::acc_t<T>), and writes w
// and the states back (LazyAdam also keeps two per-row values). The formulas are the ones of WholeGraph's embedding optimizer kernels (optimizer.cuh):
// L2 weight decay folded into the gradient, Adagrad / RMSProp with eps added to the
// square root, LazyAdam with a per-row bias correction (beta1^t, beta2^t kept per row,
// t = number of updates of that row) and eps added to sqrt(v_hat).
#pragma once

#include <cmath>
#include <cstdint>

#include "distkit/adagrad.hpp"
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
};

/// One element of a sparse optimizer step: w, s0, s1 updated in place. `rs` is the
/// row's LazyAdam state {beta1^t, beta2^t} before this update (read only here; it is
/// advanced once per row by optim_row_state after every element of the row is done).
template <class A>
DK_INLINE void optim_element(const OptParams& p, A& w, A g, A* s0, A* s1, const A* rs) {
  g = g + A(p.weight_decay) * w;
  switch (p.kind) {
    case OptKind::SGD:
      w = w - A(p.lr) * g;
      break;
    case OptKind::Adagrad:  // product and sum rounded apart, as WholeGraph's kernel is written
      distkit::adagrad_update<false>(w, *s0, g, -A(p.lr), A(p.eps));
      break;
    case OptKind::LazyAdam: {
      const A b1 = A(p.beta1), b2 = A(p.beta2);
      const A m = b1 * *s0 + (A(1) - b1) * g;
      const A v = b2 * *s1 + (A(1) - b2) * g * g;
      *s0 = m;
      *s1 = v;
      const A mhat = m / (A(1) - rs[0] * b1);
      const A vhat = v / (A(1) - rs[1] * b2);
      w = w - A(p.lr) * mhat / (distkit::hd_sqrt(vhat) + A(p.eps));
      break;
    }
    case OptKind::RMSProp: {
      const A v = A(p.alpha) * *s0 + (A(1) - A(p.alpha)) * g * g;
      *s0 = v;
      w = w - A(p.lr) * g / (distkit::hd_sqrt(v) + A(p.eps));
      break;
    }
  }
}

/// Per-row state after the row's update: LazyAdam {beta1^t, beta2^t} *= {beta1, beta2}.
template <class A>
DK_INLINE void optim_row_state(const OptParams& p, A* rs) {
  if (p.kind == OptKind::LazyAdam) {
    rs[0] = rs[0] * A(p.beta1);
    rs[1] = rs[1] * A(p.beta2);
  }
}

/// Flat element `flat` of an [n, ncols] update: weight row idx[i] of a strided
/// table (T), gradient row i (A, contiguous), state rows idx[i] (A, contiguous),
/// LazyAdam row state idx[i] (A[2]).
template <class T>
DK_INLINE void optim_update_element(const OptParams& p, T* w_base, int64_t row_stride, int64_t col_stride,
                                    int64_t ncols, const int64_t* idx, const distkit::acc_t<T>* grad, distkit::acc_t<T>* s0,
                                    distkit::acc_t<T>* s1, const distkit::acc_t<T>* rs, int64_t flat) {
  using A = distkit::acc_t<T>;
  const int64_t i = flat / ncols;
  const int64_t j = flat - i * ncols;
  const int64_t r = idx[i];
  T& wref = w_base[r * row_stride + j * col_stride];
  A w = static_cast<A>(wref);
  const int64_t sidx = r * ncols + j;
  optim_element<A>(p, w, grad[flat], s0 ? s0 + sidx : nullptr, s1 ? s1 + sidx : nullptr, rs ? rs + 2 * r : nullptr);
  wref = T(w);
}

}  // namespace wholemem
