// cuda_ops.cu - GPU paths of wholemem: row ops over device chunk tables (the
// kernels of distkit/rows_cuda.cuh, i.e. the same per-element code as the CPU),
// the sparse optimizer kernel (optim.hpp) and CUDA IPC helpers for sharing
// device allocations between the processes of one node.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "distkit/cuda.hpp"
#include "distkit/rows_cuda.cuh"
#include "native.hpp"

namespace wholemem {
namespace cuda {

namespace dc = distkit::cuda;
using distkit::DType;

int device_count() { return dc::device_count(); }

namespace {

/// Makes `device` current for its scope and restores the caller's device (torch keeps
/// its own notion of the current device; never change it behind its back).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    dc::check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device >= 0 && device != prev_) {
      dc::check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

template <class T, class I>
void run_rows(RowOp op, const TableDesc& d, uintptr_t dev_chunks, uintptr_t idx, int64_t n, uintptr_t data,
              float alpha, cudaStream_t s) {
  // the kernel gets the table by value; its chunk array lives on the device
  distkit::RowTable<T> t{reinterpret_cast<T* const*>(dev_chunks), d.rows_per_chunk, d.nrows, d.ncols, d.row_stride, d.col_stride};
  const I* ix = reinterpret_cast<const I*>(idx);
  T* p = reinterpret_cast<T*>(data);
  switch (op) {
    case RowOp::Gather: dc::gather_rows(t, ix, n, p, s); break;
    case RowOp::Scatter: dc::scatter_rows(t, ix, n, static_cast<const T*>(p), s); break;
    case RowOp::ScatterAdd:
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        dc::scatter_add_rows(t, ix, n, static_cast<const T*>(p), alpha, s);
      } else {
        throw distkit::TypeError("CUDA scatter-add supports float32 and float64 only");
      }
      break;
  }
}

template <class T>
void rows_typed(RowOp op, const TableDesc& d, uintptr_t dev_chunks, uintptr_t idx, bool idx64, int64_t n,
                uintptr_t data, float alpha, cudaStream_t s) {
  if (idx64) {
    run_rows<T, int64_t>(op, d, dev_chunks, idx, n, data, alpha, s);
  } else {
    run_rows<T, int32_t>(op, d, dev_chunks, idx, n, data, alpha, s);
  }
}

template <class T>
__global__ void optim_kernel(OptParams p, T* w, int64_t row_stride, int64_t col_stride, int64_t ncols,
                             const int64_t* idx, int64_t n, const distkit::acc_t<T>* grad, distkit::acc_t<T>* s0,
                             distkit::acc_t<T>* s1, const distkit::acc_t<T>* rs) {
  const int64_t total = n * ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x)
    optim_update_element<T>(p, w, row_stride, col_stride, ncols, idx, grad, s0, s1, rs, f);
}

/// Second pass (same stream, so after every element of every row): advance the row states.
template <class A>
__global__ void optim_rows_kernel(OptParams p, const int64_t* idx, int64_t n, A* rs) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    optim_row_state<A>(p, rs + 2 * idx[i]);
}

}  // namespace

uintptr_t upload_chunks(const std::vector<uintptr_t>& chunks, int device) {
  dc::require_device("a wholemem device chunk table");
  DeviceGuard g(device);
  const size_t bytes = std::max<size_t>(chunks.size(), 1) * sizeof(uintptr_t);
  void* p = nullptr;
  dc::check(cudaMalloc(&p, bytes), "cudaMalloc(chunk table)");
  // synchronous copy from pageable memory: the table is complete before any kernel reads it
  const cudaError_t rc = cudaMemcpy(p, chunks.data(), chunks.size() * sizeof(uintptr_t), cudaMemcpyHostToDevice);
  if (rc != cudaSuccess) {
    cudaFree(p);
    dc::check(rc, "cudaMemcpy(chunk table)");
  }
  return reinterpret_cast<uintptr_t>(p);
}

void free_chunks(uintptr_t dev_chunks, int device) noexcept {
  if (dev_chunks == 0) return;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (device >= 0 && device != prev) cudaSetDevice(device);
  // cudaFree waits for kernels still using the table; errors (e.g. at process exit,
  // after the context is gone) are cleared, never thrown from a destructor
  if (cudaFree(reinterpret_cast<void*>(dev_chunks)) != cudaSuccess) cudaGetLastError();
  if (device >= 0 && device != prev) cudaSetDevice(prev);
}

void row_op(RowOp op, const TableDesc& d, uintptr_t dev_chunks, int device, uintptr_t idx, bool idx64, int64_t n,
            uintptr_t data, float alpha, uintptr_t stream) {
  dc::require_device("wholemem CUDA row operation");
  distkit::check(dev_chunks != 0, "the device chunk table is missing");
  if (n == 0 || d.ncols == 0) return;
  DeviceGuard g(device);  // the stream belongs to `device`
  cudaStream_t s = dc::stream_from_int(stream);
  // 16-bit floats are moved as raw 16-bit words (gather / scatter need no arithmetic).
  switch (d.dtype) {
    case DType::Float32: rows_typed<float>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    case DType::Float64: rows_typed<double>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16: rows_typed<uint16_t>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    case DType::Int32: rows_typed<int32_t>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    case DType::Int64: rows_typed<int64_t>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool: rows_typed<uint8_t>(op, d, dev_chunks, idx, idx64, n, data, alpha, s); break;
    default: throw distkit::TypeError(distkit::str("CUDA row ops do not support ", distkit::dtype_name(d.dtype)));
  }
}

void optim_update(const OptParams& p, const TableDesc& w, int device, uintptr_t idx, int64_t n, uintptr_t grad,
                  uintptr_t s0, uintptr_t s1, uintptr_t row_state, uintptr_t stream) {
  dc::require_device("wholemem CUDA optimizer step");
  if (n == 0 || w.ncols == 0) return;
  DeviceGuard g(device);
  cudaStream_t s = dc::stream_from_int(stream);
  auto cfg = dc::launch_config(n * w.ncols);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    optim_kernel<T><<<cfg.blocks, cfg.threads, 0, s>>>(p, reinterpret_cast<T*>(w.chunks.at(0)), w.row_stride,
                                                      w.col_stride, w.ncols, reinterpret_cast<const int64_t*>(idx), n,
                                                      reinterpret_cast<const A*>(grad), reinterpret_cast<A*>(s0),
                                                      reinterpret_cast<A*>(s1),
                                                      reinterpret_cast<const A*>(row_state));
    dc::check(cudaGetLastError(), "optim_kernel launch");
    if (row_state != 0) {
      auto rcfg = dc::launch_config(n);
      optim_rows_kernel<A><<<rcfg.blocks, rcfg.threads, 0, s>>>(p, reinterpret_cast<const int64_t*>(idx), n,
                                                                 reinterpret_cast<A*>(row_state));
    }
  };
  switch (w.dtype) {
    case DType::Float32: launch(float{}); break;
    case DType::Float64: launch(double{}); break;
    case DType::Float16: launch(distkit::half_t{}); break;
    case DType::BFloat16: launch(distkit::bfloat16_t{}); break;
    default: throw distkit::TypeError("optimizer updates need a floating dtype");
  }
  dc::check(cudaGetLastError(), "optim_rows_kernel launch");
}

uintptr_t device_alloc(size_t nbytes, int device) {
  dc::require_device("a wholemem device allocation");
  distkit::check(nbytes > 0, "device_alloc needs a positive size");
  DeviceGuard g(device);
  void* p = nullptr;
  dc::check(cudaMalloc(&p, nbytes), "cudaMalloc");
  // zero-fill on the legacy default stream and wait: the memory is exported to other
  // processes, which order nothing after this process's streams
  cudaError_t rc = cudaMemset(p, 0, nbytes);
  if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    cudaFree(p);
    dc::check(rc, "cudaMemset");
  }
  return reinterpret_cast<uintptr_t>(p);
}

void device_free(uintptr_t ptr, int device) {
  dc::require_device("device_free");
  DeviceGuard g(device);
  dc::check(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree");
}

std::string ipc_get_handle(uintptr_t dev_ptr) {
  dc::require_device("CUDA IPC");
  cudaIpcMemHandle_t h;
  dc::check(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(dev_ptr)), "cudaIpcGetMemHandle");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

uintptr_t ipc_open_handle(const std::string& handle, int device) {
  dc::require_device("CUDA IPC");
  distkit::check(handle.size() == sizeof(cudaIpcMemHandle_t), "CUDA IPC handle must be ", sizeof(cudaIpcMemHandle_t),
                 " bytes, got ", handle.size());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  DeviceGuard g(device);  // the mapping belongs to `device`'s context
  void* p = nullptr;
  dc::check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return reinterpret_cast<uintptr_t>(p);
}

void ipc_close_handle(uintptr_t dev_ptr) {
  dc::require_device("CUDA IPC");
  dc::check(cudaIpcCloseMemHandle(reinterpret_cast<void*>(dev_ptr)), "cudaIpcCloseMemHandle");
}

uintptr_t host_register(uintptr_t addr, size_t nbytes, int device) {
  dc::require_device("cudaHostRegister");
  distkit::check(addr != 0 && nbytes > 0, "host_register needs a non-empty host range");
  DeviceGuard g(device);
  void* p = reinterpret_cast<void*>(addr);
  // portable: pinned for every context; mapped: addressable from kernels (zero copy)
  dc::check(cudaHostRegister(p, nbytes, cudaHostRegisterPortable | cudaHostRegisterMapped), "cudaHostRegister");
  void* d = nullptr;
  const cudaError_t rc = cudaHostGetDevicePointer(&d, p, 0);
  if (rc != cudaSuccess) {
    cudaHostUnregister(p);
    dc::check(rc, "cudaHostGetDevicePointer");
  }
  return reinterpret_cast<uintptr_t>(d);
}

void host_unregister(uintptr_t addr) {
  dc::require_device("cudaHostUnregister");
  dc::check(cudaHostUnregister(reinterpret_cast<void*>(addr)), "cudaHostUnregister");
}

}  // namespace cuda
}  // namespace wholemem
