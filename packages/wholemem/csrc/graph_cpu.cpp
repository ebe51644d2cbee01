// graph_cpu.cpp - CPU drivers of the graph ops: sampling (a parallel loop over the
// per-center code of graph_sample.hpp) and append_unique (one hash table).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "distkit/error.hpp"
#include "distkit/parallel.hpp"
#include "graph_native.hpp"
#include "graph_sample.hpp"

namespace wholemem {
namespace graph {
namespace {

/// Lowest failing position seen by any thread (n = none).
class FirstBad {
 public:
  explicit FirstBad(int64_t n) : pos_(n) {}
  void report(int64_t pos) {
    int64_t cur = pos_.load();
    while (pos < cur && !pos_.compare_exchange_weak(cur, pos)) {
    }
  }
  int64_t get() const { return pos_.load(); }

 private:
  std::atomic<int64_t> pos_;
};

template <class C>
Bounds<C> bounds_of(const SampleArgs& a) {
  return Bounds<C>{reinterpret_cast<const int64_t*>(a.row_ptr), reinterpret_cast<const C*>(a.centers),
                   reinterpret_cast<const int64_t*>(a.starts), reinterpret_cast<const int64_t*>(a.ends)};
}

template <class C>
int64_t offsets_impl(const SampleArgs& a) {
  const Bounds<C> b = bounds_of<C>(a);
  const C* centers = reinterpret_cast<const C*>(a.centers);
  int32_t* off = reinterpret_cast<int32_t*>(a.offsets);
  FirstBad bad_center(a.n), bad_range(a.n);
  // one pass: range checks and counts (the row pointer reads are cache misses, so
  // they are spread over the threads); the prefix sum below is serial and cheap
  distkit::parallel_for(0, a.n, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (b.row_ptr != nullptr) {
        if (i + 16 < hi) {
          const int64_t ahead = static_cast<int64_t>(centers[i + 16]);
          if (ahead >= 0 && ahead < a.num_nodes) __builtin_prefetch(b.row_ptr + ahead, 0, 0);
        }
        const int64_t c = static_cast<int64_t>(centers[i]);
        if (c < 0 || c >= a.num_nodes) {
          bad_center.report(i);
          off[i + 1] = 0;
          continue;
        }
      }
      int64_t s = 0, e = 0;
      b.get(i, s, e);
      if (s < 0 || e < s || e > a.num_edges) {
        bad_range.report(i);
        off[i + 1] = 0;
        continue;
      }
      off[i + 1] = static_cast<int32_t>(sample_count(e - s, a.k));
    }
  });
  const int64_t pc = bad_center.get(), pr = bad_range.get();
  if (pc < a.n && pc <= pr) {
    const int64_t v = static_cast<int64_t>(centers[pc]);
    if (v < 0) throw distkit::IndexError(distkit::str("center_nodes[", pc, "] = ", v, " is negative"));
    throw distkit::IndexError(distkit::str("center_nodes[", pc, "] = ", v, " is out of range [0, ", a.num_nodes, ")"));
  }
  if (pr < a.n) {
    int64_t s = 0, e = 0;
    b.get(pr, s, e);
    throw distkit::ValueError(distkit::str("corrupt CSR row pointer: the neighbours of center_nodes[", pr, "] span [",
                                           s, ", ", e, "), which is not within the ", a.num_edges, " edges"));
  }
  off[0] = 0;
  int64_t total = 0;
  for (int64_t i = 0; i < a.n; ++i) {
    total += off[i + 1];
    distkit::check(total <= std::numeric_limits<int32_t>::max(), "a sampling call may return at most 2^31 - 1 ",
                   "neighbours (int32 offsets, as WholeGraph); split the centers into smaller batches");
    off[i + 1] = static_cast<int32_t>(total);
  }
  return total;
}

template <class C, class Id, class W>
void fill_typed(const SampleArgs& a) {
  SampleJob<C, Id, W> job{bounds_of<C>(a),
                          reinterpret_cast<const Id*>(a.col),
                          reinterpret_cast<const W*>(a.weights),
                          reinterpret_cast<const int64_t*>(a.weight_offsets),
                          a.k,
                          a.seed,
                          reinterpret_cast<const int32_t*>(a.offsets),
                          reinterpret_cast<Id*>(a.dest),
                          reinterpret_cast<int32_t*>(a.center_local),
                          reinterpret_cast<int64_t*>(a.edge_id),
                          reinterpret_cast<double*>(a.keys)};
  // Random reads of a large graph wait on memory (and TLB) latency, so both loops below
  // prefetch a few iterations ahead: drawing only touches the row pointers (already
  // cached by the offsets pass) and, weighted, the weights; the neighbour ids are read
  // afterwards in a loop of independent loads. A grain of 256 centers keeps the split
  // fine enough for skewed degrees.
  constexpr int64_t kAhead = 8;
  const C* centers = reinterpret_cast<const C*>(a.centers);
  distkit::parallel_for(0, a.n, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (job.weights != nullptr && job.weight_offsets == nullptr && i + kAhead < hi) {
        int64_t s = 0, e = 0;
        job.bounds.get(i + kAhead, s, e);
        __builtin_prefetch(job.weights + s, 0, 0);
      } else if (job.bounds.row_ptr != nullptr && i + 2 * kAhead < hi) {
        __builtin_prefetch(job.bounds.row_ptr + static_cast<int64_t>(centers[i + 2 * kAhead]), 0, 0);
      }
      job.draw(i);
    }
  });
  if (job.dest == nullptr) return;
  const int64_t total = job.offsets[a.n];
  distkit::parallel_for(0, total, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q) {
      if (q + 4 * kAhead < hi) __builtin_prefetch(job.col + job.edge_id[q + 4 * kAhead], 0, 0);
      job.dest[q] = job.col[job.edge_id[q]];
    }
  });
}

template <class C, class Id>
void fill_weights(const SampleArgs& a) {
  if (a.weights64) {
    fill_typed<C, Id, double>(a);
  } else {
    fill_typed<C, Id, float>(a);
  }
}

template <class C>
void fill_ids(const SampleArgs& a) {
  if (a.col64) {
    fill_weights<C, int64_t>(a);
  } else {
    fill_weights<C, int32_t>(a);
  }
}

/// Open-addressing map from id to its position in the output. Each slot holds the id
/// next to its position (one cache line per probe); position -1 marks an empty slot,
/// so any id value, even negative, is a key.
template <class I>
class PositionTable {
 public:
  explicit PositionTable(int64_t capacity_hint) {
    size_t cap = 16;
    int bits = 4;
    while (cap < static_cast<size_t>(2 * capacity_hint)) {
      cap <<= 1;
      ++bits;
    }
    shift_ = 64 - bits;
    mask_ = cap - 1;
    slots_.assign(cap, Slot{0, -1});
  }

  /// Position of `v`, or -1 after recording `pos` as its position.
  int64_t find_or_insert(I v, int64_t pos) {
    size_t h = static_cast<size_t>((static_cast<uint64_t>(static_cast<int64_t>(v)) * 0x9E3779B97F4A7C15ull) >> shift_);
    for (;; h = (h + 1) & mask_) {
      Slot& slot = slots_[h];
      if (slot.pos < 0) {
        slot = Slot{static_cast<int64_t>(v), pos};
        return -1;
      }
      if (slot.key == static_cast<int64_t>(v)) return slot.pos;
    }
  }

 private:
  struct Slot {
    int64_t key;
    int64_t pos;
  };
  int shift_ = 60;
  size_t mask_ = 15;
  std::vector<Slot> slots_;
};

template <class I>
int64_t append_unique_impl(const I* targets, int64_t nt, const I* nbrs, int64_t nn, I* out, int32_t* map) {
  if (nt > 0) std::memcpy(out, targets, static_cast<size_t>(nt) * sizeof(I));
  PositionTable<I> table(nt + nn);
  for (int64_t i = 0; i < nt; ++i) table.find_or_insert(targets[i], i);  // a repeated target keeps its first position
  int64_t m = nt;
  for (int64_t j = 0; j < nn; ++j) {
    const I v = nbrs[j];
    int64_t p = table.find_or_insert(v, m);
    if (p < 0) {
      out[m] = v;
      p = m++;
    }
    if (map != nullptr) map[j] = static_cast<int32_t>(p);
  }
  return m;
}

}  // namespace

int64_t sample_offsets_cpu(const SampleArgs& a) {
  distkit::check(a.k > 0, "max_sample_count must be > 0, got ", a.k);
  distkit::check(a.n >= 0, "negative number of centers ", a.n);
  distkit::check(a.offsets != 0, "null offsets pointer");
  distkit::check(a.row_ptr != 0 ? a.centers != 0 || a.n == 0 : (a.starts != 0 && a.ends != 0) || a.n == 0,
                 "sampling needs row_ptr and centers, or starts and ends");
  return a.centers64 || a.row_ptr == 0 ? offsets_impl<int64_t>(a) : offsets_impl<int32_t>(a);
}

void sample_fill_cpu(const SampleArgs& a) {
  distkit::check(a.k > 0, "max_sample_count must be > 0, got ", a.k);
  if (a.n == 0) return;
  distkit::check(a.offsets != 0 && a.edge_id != 0, "null offsets or edge_id pointer");
  distkit::check(a.dest == 0 || a.col != 0, "dest needs col");
  distkit::check(a.weights == 0 || a.keys != 0, "weighted sampling needs the keys scratch array");
  if (a.centers64 || a.row_ptr == 0) {
    fill_ids<int64_t>(a);
  } else {
    fill_ids<int32_t>(a);
  }
}

int64_t append_unique_cpu(uintptr_t targets, int64_t nt, uintptr_t neighbors, int64_t nn, bool ids64, uintptr_t out,
                          uintptr_t map) {
  distkit::check(nt >= 0 && nn >= 0, "negative lengths ", nt, ", ", nn);
  distkit::check(nt + nn <= std::numeric_limits<int32_t>::max(), "append_unique handles at most 2^31 - 1 ids ",
                 "(int32 positions, as WholeGraph), got ", nt + nn);
  if (ids64) {
    return append_unique_impl(reinterpret_cast<const int64_t*>(targets), nt, reinterpret_cast<const int64_t*>(neighbors),
                              nn, reinterpret_cast<int64_t*>(out), reinterpret_cast<int32_t*>(map));
  }
  return append_unique_impl(reinterpret_cast<const int32_t*>(targets), nt, reinterpret_cast<const int32_t*>(neighbors), nn,
                            reinterpret_cast<int32_t*>(out), reinterpret_cast<int32_t*>(map));
}

}  // namespace graph
}  // namespace wholemem
