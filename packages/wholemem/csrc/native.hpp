// native.hpp - declarations shared by module.cpp (host) and cuda_ops.cu (device).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distkit/dtype.hpp"
#include "optim.hpp"

namespace wholemem {

/// A row table described by raw addresses (see distkit::RowTable): the whole tensor.
struct TableDesc {
  std::vector<uintptr_t> chunks;
  int64_t rows_per_chunk = 1;
  int64_t nrows = 0;
  int64_t ncols = 1;
  int64_t row_stride = 1;
  int64_t col_stride = 1;
  distkit::DType dtype = distkit::DType::Float32;
};

/// The rows [row0, row0 + nrows) and columns [col0, col0 + ncols) an operation works on
/// (a sub-tensor; see window.hpp). Indices are relative to row0.
struct Window {
  int64_t row0 = 0;
  int64_t col0 = 0;
  int64_t nrows = 0;
  int64_t ncols = 0;
};

enum class RowOp { Gather, Scatter, ScatterAdd };

#ifdef DISTKIT_WITH_CUDA
namespace cuda {
int device_count();
/// Device memory a device table needs, made once per table on `device`: the chunk base
/// addresses (device pointers, or host pointers mapped for the device) followed by one
/// error word the kernels set when an index outside the window reaches them (possible
/// only inside CUDA graph capture, where indices cannot be checked beforehand).
uintptr_t upload_chunks(const std::vector<uintptr_t>& chunks, int device);
/// Free an array made by upload_chunks (never throws: called from destructors).
void free_chunks(uintptr_t dev_chunks, size_t nchunks, int device) noexcept;
/// Row op on a device table (`dev_chunks` from upload_chunks), launched on `stream` of
/// `device`; idx and data are device pointers (or mapped host memory). Outside CUDA graph
/// capture the indices are validated first (IndexError naming the first bad one).
void row_op(RowOp op, const TableDesc& t, uintptr_t dev_chunks, int device, const Window& w, uintptr_t idx,
            bool idx64, int64_t n, uintptr_t data, float alpha, uintptr_t stream);
/// IndexError naming the first of n device-resident indices outside [0, nrows) (one small
/// kernel and one synchronisation of `stream`; nothing while the stream is captured).
void check_indices(uintptr_t idx, bool idx64, int64_t n, int64_t nrows, int device, uintptr_t stream);
/// Sparse optimizer step on device memory (same per-element code as the CPU).
void optim_update(const OptParams& p, const TableDesc& w, int device, uintptr_t idx, int64_t n, uintptr_t grad,
                  uintptr_t s0, uintptr_t s1, uintptr_t row_state, uintptr_t stream);
/// cudaMalloc on `device`, zero-filled and synchronised (IPC peers may read it at once).
uintptr_t device_alloc(size_t nbytes, int device);
void device_free(uintptr_t ptr, int device);
/// cudaDeviceSynchronize of `device` (independent of whether torch initialised CUDA).
void device_synchronize(int device);
/// CUDA IPC: export a device allocation / map a peer's allocation / unmap it.
std::string ipc_get_handle(uintptr_t dev_ptr);
uintptr_t ipc_open_handle(const std::string& handle, int device);
void ipc_close_handle(uintptr_t dev_ptr, int device);
/// Page-lock host memory (e.g. a shared-memory segment) and map it for every device;
/// returns the device address of `addr` as seen from `device`.
uintptr_t host_register(uintptr_t addr, size_t nbytes, int device);
void host_unregister(uintptr_t addr);
}  // namespace cuda
#endif

}  // namespace wholemem
