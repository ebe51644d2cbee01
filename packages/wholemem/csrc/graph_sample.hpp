// graph_sample.hpp - neighbour sampling of one center, written once for the CPU
// driver (graph_cpu.cpp, a parallel loop over centers) and the CUDA kernels
// (graph_cuda.cu, one thread per center).
//
// Semantics are WholeGraph's: a center with degree <= k returns all its neighbours
// in CSR order; otherwise k distinct neighbours, uniformly (unweighted) or by
// weighted sampling without replacement (weighted). The random bits of center i of
// a call come from CenterRng(seed, i), so results depend on the seed and the batch,
// never on how the centers are split over threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "distkit/macros.hpp"
#include "graph_philox.hpp"

namespace wholemem {
namespace graph {

/// Where the neighbour list of center i is: CSR row pointers and center ids
/// (row_ptr != nullptr), or per-center [starts[i], ends[i]) edge ranges (e.g. gathered
/// from a partitioned row pointer).
template <class C>
struct Bounds {
  const int64_t* row_ptr;
  const C* centers;
  const int64_t* starts;
  const int64_t* ends;

  DK_HD void get(int64_t i, int64_t& s, int64_t& e) const {
    if (row_ptr != nullptr) {
      const int64_t c = static_cast<int64_t>(centers[i]);
      s = row_ptr[c];
      e = row_ptr[c + 1];
    } else {
      s = starts[i];
      e = ends[i];
    }
  }
};

/// Samples of a center of `degree` neighbours: all of them up to k.
DK_INLINE int64_t sample_count(int64_t degree, int64_t k) { return degree < k ? degree : k; }

/// Uniform sample without replacement of min(degree, k) of the edges [base, base + degree),
/// written as edge ids into out[0, count). degree <= k: every edge in order. Otherwise
/// Floyd's algorithm: k draws, one per j in [degree-k, degree), each set of k edges equally
/// likely; the membership test scans the k ids already taken (k is a fan-out, small).
DK_INLINE void sample_unweighted_center(uint64_t seed, uint64_t stream, int64_t degree, int64_t k, int64_t base,
                                        int64_t* out) {
  if (degree <= k) {
    for (int64_t q = 0; q < degree; ++q) out[q] = base + q;
    return;
  }
  CenterRng rng(seed, stream);
  int64_t m = 0;
  for (int64_t j = degree - k; j < degree; ++j) {
    const int64_t t = base + rng.below(j + 1);
    bool taken = false;
    for (int64_t q = 0; q < m; ++q) {
      if (out[q] == t) {
        taken = true;
        break;
      }
    }
    out[m++] = taken ? base + j : t;
  }
}

/// Min-heap on keys (ids move with their keys): restore the heap above position i.
DK_INLINE void heap_sift_up(double* keys, int64_t* ids, int64_t i) {
  while (i > 0) {
    const int64_t p = (i - 1) / 2;
    if (!(keys[i] < keys[p])) break;
    const double tk = keys[i];
    keys[i] = keys[p];
    keys[p] = tk;
    const int64_t ti = ids[i];
    ids[i] = ids[p];
    ids[p] = ti;
    i = p;
  }
}

/// Min-heap of n keys: restore the heap below position i.
DK_INLINE void heap_sift_down(double* keys, int64_t* ids, int64_t n, int64_t i) {
  for (;;) {
    const int64_t l = 2 * i + 1, r = l + 1;
    int64_t m = i;
    if (l < n && keys[l] < keys[m]) m = l;
    if (r < n && keys[r] < keys[m]) m = r;
    if (m == i) return;
    const double tk = keys[i];
    keys[i] = keys[m];
    keys[m] = tk;
    const int64_t ti = ids[i];
    ids[i] = ids[m];
    ids[m] = ti;
    i = m;
  }
}

/// Weighted sample without replacement of min(degree, k) of the edges [base, base + degree)
/// with weights w[0, degree), written as edge ids into out[0, count); keys[0, k) is scratch.
/// degree <= k: every edge in order. Otherwise Efraimidis & Spirakis' A-Res: edge e gets
/// the key log(u_e) / w_e (u uniform in (0, 1]) and the k largest keys win, which draws
/// edges one after another with probability proportional to weight among those left.
/// Edges of weight 0 get key -inf: taken only when fewer than k edges weigh more.
template <class W>
DK_INLINE void sample_weighted_center(uint64_t seed, uint64_t stream, const W* w, int64_t degree, int64_t k,
                                      int64_t base, int64_t* out, double* keys) {
  if (degree <= k) {
    for (int64_t q = 0; q < degree; ++q) out[q] = base + q;
    return;
  }
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  CenterRng rng(seed, stream);
  for (int64_t e = 0; e < degree; ++e) {
    const double u = rng.open0_unit();  // drawn for every edge: the stream never depends on the weights
    const double we = static_cast<double>(w[e]);
    const double key = we > 0.0 ? log(u) / we : kNegInf;
    if (e < k) {
      keys[e] = key;
      out[e] = base + e;
      heap_sift_up(keys, out, e);
    } else if (key > keys[0]) {
      keys[0] = key;
      out[0] = base + e;
      heap_sift_down(keys, out, k, 0);
    }
  }
}

/// Everything one sampling call needs, as raw pointers valid on the executing device.
/// dest / center_local may be null (not wanted, or dest filled later by a gather of
/// the edge ids); weights null = unweighted. Weights are indexed by edge id, or, with
/// weight_offsets, compact: center i's weights start at weights + weight_offsets[i].
template <class C, class Id, class W>
struct SampleJob {
  Bounds<C> bounds;
  const Id* col;
  const W* weights;
  const int64_t* weight_offsets;
  int64_t k;
  uint64_t seed;
  const int32_t* offsets;
  Id* dest;
  int32_t* center_local;
  int64_t* edge_id;
  double* keys;

  /// Draw the samples of center i: its edge ids (and center-local ids).
  DK_HD void draw(int64_t i) const {
    int64_t s = 0, e = 0;
    bounds.get(i, s, e);
    const int64_t off = offsets[i];
    int64_t* out = edge_id + off;
    if (weights != nullptr) {
      const W* wp = weight_offsets != nullptr ? weights + weight_offsets[i] : weights + s;
      sample_weighted_center(seed, static_cast<uint64_t>(i), wp, e - s, k, s, out, keys + off);
    } else {
      sample_unweighted_center(seed, static_cast<uint64_t>(i), e - s, k, s, out);
    }
    if (center_local != nullptr) {
      for (int64_t q = off; q < offsets[i + 1]; ++q) center_local[q] = static_cast<int32_t>(i);
    }
  }

  /// Draw center i and read its sampled neighbour ids (the GPU's whole job per thread;
  /// the CPU reads all neighbour ids afterwards in one prefetching loop instead).
  DK_HD void run(int64_t i) const {
    draw(i);
    if (dest != nullptr) {
      for (int64_t q = offsets[i]; q < offsets[i + 1]; ++q) dest[q] = col[edge_id[q]];
    }
  }
};

}  // namespace graph
}  // namespace wholemem
