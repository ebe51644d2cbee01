// native.hpp - declarations shared by module.cpp (host) and cuda_ops.cu (device).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distkit/dtype.hpp"
#include "optim.hpp"

namespace wholemem {

/// A row table described by raw addresses (see distkit::RowTable).
struct TableDesc {
  std::vector<uintptr_t> chunks;
  int64_t rows_per_chunk = 1;
  int64_t nrows = 0;
  int64_t ncols = 1;
  int64_t row_stride = 1;
  int64_t col_stride = 1;
  distkit::DType dtype = distkit::DType::Float32;
};

enum class RowOp { Gather, Scatter, ScatterAdd };

#ifdef DISTKIT_WITH_CUDA
namespace cuda {
int device_count();
/// Row op on a device-resident chunk table (chunk addresses are device pointers).
void row_op(RowOp op, const TableDesc& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t data, float alpha,
            uintptr_t stream);
/// Sparse optimizer step on device memory (same per-element code as the CPU).
void optim_update(const OptParams& p, const TableDesc& w, uintptr_t idx, int64_t n, uintptr_t grad,
                  uintptr_t s0, uintptr_t s1, uintptr_t row_state, uintptr_t stream);
/// CUDA IPC: export a device allocation / map a peer's allocation.
std::string ipc_get_handle(uintptr_t dev_ptr);
uintptr_t ipc_open_handle(const std::string& handle, int device);
void ipc_close_handle(uintptr_t dev_ptr);
}  // namespace cuda
#endif

}  // namespace wholemem
