// Shared between module.cpp and rows_cuda.cu: the argument bundle of a row op.
#pragma once

#include <cstdint>
#include <vector>

#include "distkit/dtype.hpp"
#include "distkit/rows_vec.hpp"

struct RowOpArgs {
  std::vector<uintptr_t> chunks;
  int64_t rows_per_chunk, nrows, ncols, row_stride, col_stride;
  distkit::DType dtype;
  uintptr_t idx;
  bool idx64;
  int64_t n;
  uintptr_t data;  // out (gather) or values (scatter / scatter-add)
  float alpha;
  bool validate;   // device: check the indices first (IndexError, one stream sync); else skip bad rows
};

using RowOp = distkit::RowMove;

#ifdef DISTKIT_WITH_CUDA
void cuda_row_op(RowOp op, const RowOpArgs& a, uintptr_t stream);
#endif
