// distkit/rows.hpp - row gather / scatter / scatter-add, written once for host and device.
//
// A RowTable describes a 2-D table whose rows live in one buffer or in a table
// of equally sized chunks (the last chunk may be shorter). Strides are in
// elements, so any strided view of a table can be described. The per-element
// functions below are __host__ __device__: the CPU drivers in rows_cpu.hpp and
// the CUDA kernels in rows_cuda.cuh call the same code.
#pragma once

#include <cstdint>

#include "half.hpp"
#include "macros.hpp"

namespace distkit {

template <class T>
struct RowTable {
  T* const* chunks;        ///< chunk base pointers; a single buffer is one chunk
  int64_t rows_per_chunk;  ///< rows held by every chunk but the last
  int64_t nrows;           ///< total rows
  int64_t ncols;           ///< elements per row
  int64_t row_stride;      ///< elements between consecutive rows
  int64_t col_stride;      ///< elements between consecutive columns

  DK_HD T* row(int64_t r) const {
    const int64_t c = r / rows_per_chunk;
    return chunks[c] + (r - c * rows_per_chunk) * row_stride;
  }
  DK_HD T& at(int64_t r, int64_t j) const { return row(r)[j * col_stride]; }
  DK_HD bool contiguous_rows() const { return col_stride == 1; }
};

/// Which part of a flat [n, ncols] element range an index refers to.
DK_INLINE void split_flat(int64_t flat, int64_t ncols, int64_t& i, int64_t& j) {
  i = flat / ncols;
  j = flat - i * ncols;
}

/// out[i, j] = table[idx[i], j]
template <class T, class I>
DK_INLINE void gather_element(const RowTable<T>& table, const I* idx, T* out, int64_t flat) {
  int64_t i, j;
  split_flat(flat, table.ncols, i, j);
  out[flat] = table.at(static_cast<int64_t>(idx[i]), j);
}

/// table[idx[i], j] = vals[i, j]
template <class T, class I>
DK_INLINE void scatter_element(const RowTable<T>& table, const I* idx, const T* vals, int64_t flat) {
  int64_t i, j;
  split_flat(flat, table.ncols, i, j);
  table.at(static_cast<int64_t>(idx[i]), j) = vals[flat];
}

/// a += b in the accumulation type of T (float for the 16-bit floats), scaled by alpha.
template <class T>
DK_INLINE void add_scaled(T& a, const T& b, float alpha) {
  using A = acc_t<T>;
  a = T(static_cast<A>(a) + static_cast<A>(alpha) * static_cast<A>(b));
}
template <>
DK_INLINE void add_scaled<bool>(bool& a, const bool& b, float) {
  a = a || b;
}

/// table[idx[i], j] += alpha * vals[i, j]  (not atomic: callers make rows disjoint per thread)
template <class T, class I>
DK_INLINE void scatter_add_element(const RowTable<T>& table, const I* idx, const T* vals, float alpha,
                                   int64_t flat) {
  int64_t i, j;
  split_flat(flat, table.ncols, i, j);
  add_scaled(table.at(static_cast<int64_t>(idx[i]), j), vals[flat], alpha);
}

/// Position of the first index outside [0, nrows), or -1 when all are valid.
template <class I>
DK_INLINE int64_t first_bad_index(const I* idx, int64_t n, int64_t nrows) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= nrows) return i;
  }
  return -1;
}

}  // namespace distkit
