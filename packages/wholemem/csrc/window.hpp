// window.hpp - the rows and columns of a wholemem (sub-)tensor inside its base row table,
// written once for host and device.
//
// Every view of a wholemem tensor (get_sub_tensor, the sub-tensors of the original API)
// shares the row table of its base tensor and differs only in a window: rows
// [row0, row0 + nrows) and columns [col0, col0 + ncols). Passing the window with each
// operation means that making a view allocates nothing (on a GPU: no new device chunk
// array, hence no cudaMalloc / blocking copy / cudaFree), and the same table can be
// used inside CUDA graph capture. The element functions below are called by the CPU
// loops (module.cpp) and the CUDA kernels (cuda_ops.cu).
#pragma once

#include <cstdint>

#include "distkit/macros.hpp"
#include "distkit/rows.hpp"

namespace wholemem {

template <class T>
struct RowWindow {
  distkit::RowTable<T> base;  ///< chunks, rows per chunk, strides of the whole tensor
  int64_t row0;               ///< first row of the window in the base tensor
  int64_t col0;               ///< first column of the window
  int64_t nrows;              ///< rows of the window (indices are relative to row0)
  int64_t ncols;              ///< columns of the window

  DK_HD T* row(int64_t r) const { return base.row(row0 + r) + col0 * base.col_stride; }
  DK_HD T& at(int64_t r, int64_t j) const { return row(r)[j * base.col_stride]; }
  DK_HD bool contiguous_rows() const { return base.col_stride == 1; }
  DK_HD bool valid(int64_t r) const { return r >= 0 && r < nrows; }
};

/// out[i, j] = window[idx[i], j] for the flat element `flat` of an [n, ncols] block.
/// An index outside the window is never dereferenced: the element is zero-filled and
/// false is returned (the caller records the error; see cuda_ops.cu).
template <class T, class I>
DK_INLINE bool window_gather(const RowWindow<T>& w, const I* idx, T* out, int64_t flat) {
  int64_t i, j;
  distkit::split_flat(flat, w.ncols, i, j);
  const int64_t r = static_cast<int64_t>(idx[i]);
  if (!w.valid(r)) {
    out[flat] = T();
    return false;
  }
  out[flat] = w.at(r, j);
  return true;
}

/// window[idx[i], j] = vals[i, j]; an index outside the window writes nothing.
template <class T, class I>
DK_INLINE bool window_scatter(const RowWindow<T>& w, const I* idx, const T* vals, int64_t flat) {
  int64_t i, j;
  distkit::split_flat(flat, w.ncols, i, j);
  const int64_t r = static_cast<int64_t>(idx[i]);
  if (!w.valid(r)) return false;
  w.at(r, j) = vals[flat];
  return true;
}

}  // namespace wholemem
