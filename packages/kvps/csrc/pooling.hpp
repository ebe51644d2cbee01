// pooling.hpp - the gradient of pooled bags ("sum"/"mean") with respect to their distinct rows.
//
// torch's dense embedding_bag backward sorts the ids (torch.sort, not
// stable) and accumulates, row by row in that sorted order, `scale *
// grad_of_bag` into the row with one fused multiply-add per element (BLAS
// axpy). This does the same over the batch's distinct rows, given torch's
// sort of the ids mapped to those rows: the mapping keeps the ids' order, so
// the sort visits each row's occurrences as it does over the whole table, and
// the sums round as torch's do, without a dense gradient of the table.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "distkit/parallel.hpp"
#include "fma.hpp"

namespace kvps {

/// y += scale[i] * grad[bag[i]] for the ids i = order[lo .. hi), fused.
template <class T>
KVPS_INLINE void accumulate(T* y, int64_t dim, const int64_t* order, int64_t lo, int64_t hi, const int64_t* bag,
                            const T* scale, const T* grad) {
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t i = order[j];
    const T a = scale[i];
    const T* x = grad + bag[i] * dim;
    for (int64_t d = 0; d < dim; ++d) y[d] = std::fma(a, x[d], y[d]);
  }
}
template <class T>
void accumulate_plain(T* y, int64_t dim, const int64_t* order, int64_t lo, int64_t hi, const int64_t* bag,
                      const T* scale, const T* grad) {
  accumulate(y, dim, order, lo, hi, bag, scale, grad);
}
template <class T>
KVPS_FMA_TARGET void accumulate_fma(T* y, int64_t dim, const int64_t* order, int64_t lo, int64_t hi,
                                    const int64_t* bag, const T* scale, const T* grad) {
  accumulate(y, dim, order, lo, hi, bag, scale, grad);
}

/// The bags of a batch as embedding_bag takes them: `offsets` (`nbags` starts,
/// or `nbags + 1` entries with the end when `include_last`) over `n` ids.
struct Bags {
  const int64_t* offsets;
  int64_t nbags;
  bool include_last;
  int64_t n;
  int64_t end(int64_t b) const { return b + 1 < nbags || include_last ? offsets[b + 1] : n; }
};

/// out (rows x dim, zeroed here): for each row r except `skip`, the sum over
/// the ids i with local[i] == r, in the order `order` (torch.sort(local)'s
/// permutation) lists them, of scale_i * grad[bag of i]. scale_i is
/// psw[i] ("sum" with per-sample weights), 1 / (the bag's ids other than
/// `skip`) for `mean` (in double, as torch computes it), else 1.
template <class T>
void bag_grad(const T* grad, int64_t dim, const int64_t* local, const int64_t* order, const Bags& bags, const T* psw,
              bool mean, int64_t rows, int64_t skip, T* out) {
  const int64_t n = bags.n;
  std::memset(out, 0, static_cast<size_t>(rows * dim) * sizeof(T));
  std::vector<int64_t> bag(n);
  std::vector<T> scale(n, T(1));
  for (int64_t b = 0; b < bags.nbags; ++b) {
    const int64_t lo = bags.offsets[b], hi = bags.end(b);
    int64_t count = 0;
    for (int64_t i = lo; i < hi; ++i) {
      bag[i] = b;
      count += local[i] != skip;
    }
    if (mean && count > 0) {
      const T s = static_cast<T>(1.0 / static_cast<double>(count));
      for (int64_t i = lo; i < hi; ++i) scale[i] = s;
    }
  }
  if (psw)
    for (int64_t i = 0; i < n; ++i) scale[i] = psw[i];
  std::vector<int64_t> seg;  // start of each row's run in `order`
  seg.reserve(static_cast<size_t>(rows) + 1);
  for (int64_t j = 0; j < n; ++j)
    if (j == 0 || local[order[j]] != local[order[j - 1]]) seg.push_back(j);
  seg.push_back(n);
  const int64_t nseg = static_cast<int64_t>(seg.size()) - 1;
  const auto acc = cpu_has_fma() ? &accumulate_fma<T> : &accumulate_plain<T>;
  distkit::parallel_for(0, nseg, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      const int64_t r = local[order[seg[s]]];
      if (r != skip) acc(out + r * dim, dim, order, seg[s], seg[s + 1], bag.data(), scale.data(), grad);
    }
  });
}

}  // namespace kvps
