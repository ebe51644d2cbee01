// distkit/rows_cpu.hpp - threaded CPU drivers for the row operations of rows.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "error.hpp"
#include "parallel.hpp"
#include "rows.hpp"

namespace distkit {

/// Raise IndexError naming the first index outside [0, nrows).
template <class I>
void check_indices(const I* idx, int64_t n, int64_t nrows, const char* what = "index") {
  // Parallel scan for large inputs; report the lowest failing position.
  std::atomic<int64_t> bad{n};
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    int64_t b = first_bad_index(idx + lo, hi - lo, nrows);
    if (b >= 0) {
      int64_t pos = lo + b, cur = bad.load();
      while (pos < cur && !bad.compare_exchange_weak(cur, pos)) {
      }
    }
  });
  const int64_t pos = bad.load();
  if (pos < n) {
    throw IndexError(str(what, " ", static_cast<int64_t>(idx[pos]), " at position ", pos,
                         " is out of range for ", nrows, " rows"));
  }
}

constexpr int64_t kRowGrainBytes = 1 << 15;

inline int64_t row_grain(int64_t row_bytes) { return std::max<int64_t>(1, kRowGrainBytes / std::max<int64_t>(row_bytes, 1)); }

/// Rows this far ahead are prefetched by the scatter-add: a random row of a large
/// table is a cache miss, and its read-modify-write would otherwise wait for each
/// one in turn. (The gather's memcpy measured no gain from it.)
constexpr int64_t kPrefetchRows = 8;

/// Prefetch elements [c0, c1) of row `r` for writing.
template <class T>
inline void prefetch_for_write(const RowTable<T>& t, int64_t r, int64_t c0, int64_t c1) {
#if defined(__GNUC__)
  const char* p = reinterpret_cast<const char*>(t.row(r) + c0);
  const char* end = reinterpret_cast<const char*>(t.row(r) + c1);
  for (; p < end; p += 64) __builtin_prefetch(p, 1);
#else
  (void)t, (void)r, (void)c0, (void)c1;
#endif
}

/// out[i, :] = table[idx[i], :] for i < n. Indices must be valid (check_indices).
template <class T, class I>
void gather_rows_cpu(const RowTable<T>& t, const I* idx, int64_t n, T* out) {
  const int64_t nc = t.ncols;
  parallel_for(0, n, row_grain(nc * int64_t(sizeof(T))), [&](int64_t lo, int64_t hi) {
    if (t.contiguous_rows()) {
      for (int64_t i = lo; i < hi; ++i) std::memcpy(out + i * nc, t.row(static_cast<int64_t>(idx[i])), nc * sizeof(T));
    } else {
      for (int64_t f = lo * nc; f < hi * nc; ++f) gather_element(t, idx, out, f);
    }
  });
}

/// table[idx[i], :] = vals[i, :]. With duplicate indices the last write wins.
template <class T, class I>
void scatter_rows_cpu(const RowTable<T>& t, const I* idx, int64_t n, const T* vals) {
  const int64_t nc = t.ncols;
  // Split by columns when indices may repeat, so "last one wins" is deterministic.
  parallel_for(0, nc, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      T* row = t.row(static_cast<int64_t>(idx[i]));
      if (t.contiguous_rows()) {
        std::memcpy(row + c0, vals + i * nc + c0, (c1 - c0) * sizeof(T));
      } else {
        for (int64_t j = c0; j < c1; ++j) row[j * t.col_stride] = vals[i * nc + j];
      }
    }
  });
}

/// table[idx[i], :] += alpha * vals[i, :]; duplicates accumulate, in index order.
template <class T, class I>
void scatter_add_rows_cpu(const RowTable<T>& t, const I* idx, int64_t n, const T* vals, float alpha = 1.0f) {
  const int64_t nc = t.ncols;
  // Threads split the columns, so every thread adds the rows in index order
  // (duplicates accumulate deterministically) and no two threads write one element.
  parallel_for(0, nc, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t c0, int64_t c1) {
    if (!t.contiguous_rows()) {
      for (int64_t i = 0; i < n; ++i) {
        T* row = t.row(static_cast<int64_t>(idx[i]));
        const T* v = vals + i * nc;
        for (int64_t j = c0; j < c1; ++j) add_scaled(row[j * t.col_stride], v[j], alpha);
      }
      return;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (i + kPrefetchRows < n) prefetch_for_write(t, static_cast<int64_t>(idx[i + kPrefetchRows]), c0, c1);
      T* row = t.row(static_cast<int64_t>(idx[i]));
      const T* v = vals + i * nc;
      for (int64_t j = c0; j < c1; ++j) add_scaled(row[j], v[j], alpha);
    }
  });
}

/// A RowTable over one buffer.
template <class T>
struct SingleBufferTable {
  T* base;
  RowTable<T> table;
  SingleBufferTable(T* b, int64_t nrows, int64_t ncols, int64_t row_stride, int64_t col_stride) : base(b) {
    table = RowTable<T>{&base, std::max<int64_t>(nrows, 1), nrows, ncols, row_stride, col_stride};
  }
  SingleBufferTable(const SingleBufferTable&) = delete;
};

}  // namespace distkit
