// cuda_ops.cu - GPU paths of wholemem: row ops over device chunk tables (the window
// element functions of window.hpp, i.e. the same per-element code as the CPU), the
// sparse optimizer kernel (optim.hpp) and the CUDA runtime helpers for sharing device
// allocations between the processes of one node.
//
// Every entry point makes its device current for the call (DeviceGuard) and restores
// the caller's device: torch keeps its own notion of the current device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "distkit/cuda.hpp"
#include "distkit/rows_cuda.cuh"
#include "native.hpp"
#include "window.hpp"

namespace wholemem {
namespace cuda {

namespace dc = distkit::cuda;
using distkit::DType;
using dc::DeviceGuard;

int device_count() { return dc::device_count(); }

namespace {

/// Where a table's error word lives: right after its chunk array.
unsigned long long* error_word(uintptr_t dev_chunks, size_t nchunks) {
  return reinterpret_cast<unsigned long long*>(dev_chunks + std::max<size_t>(nchunks, 1) * sizeof(uintptr_t));
}

/// The rows of distkit/rows_vec.hpp (whole rows as the widest aligned words, one index
/// load and chunk lookup per row, several rows in flight per lane group) over the window;
/// bad indices (possible only inside graph capture) are skipped and recorded in the
/// table's error word. `T` is the element type the scatter-add accumulates.
template <class T, class I>
void launch_rows(RowOp op, const TableDesc& d, uintptr_t dev_chunks, const Window& win, uintptr_t idx, int64_t n,
                 uintptr_t data, float alpha, cudaStream_t s) {
  const distkit::ByteRows t = distkit::make_byte_rows(
      reinterpret_cast<char* const*>(dev_chunks), d.chunks.at(0), d.chunks.size(), d.rows_per_chunk, win.nrows,
      win.row0, win.col0, win.ncols, distkit::itemsize(d.dtype), d.row_stride, d.col_stride);
  const int w = distkit::choose_word_bytes(t, d.chunks.data(), d.chunks.size(), data);
  const distkit::RowMove m = op == RowOp::Gather    ? distkit::RowMove::Gather
                             : op == RowOp::Scatter ? distkit::RowMove::Scatter
                                                    : distkit::RowMove::ScatterAdd;
  dc::launch_row_words<T, I>(m, t, w, reinterpret_cast<const I*>(idx), n, reinterpret_cast<char*>(data), alpha,
                             error_word(dev_chunks, d.chunks.size()), s);
}

template <class T>
void launch_typed(RowOp op, const TableDesc& d, uintptr_t dev_chunks, const Window& w, uintptr_t idx, bool idx64,
                  int64_t n, uintptr_t data, float alpha, cudaStream_t s) {
  if (idx64) {
    launch_rows<T, int64_t>(op, d, dev_chunks, w, idx, n, data, alpha, s);
  } else {
    launch_rows<T, int32_t>(op, d, dev_chunks, w, idx, n, data, alpha, s);
  }
}

/// The first bad index, and whether kernels saw one since the last check (`sticky`, the
/// table's error word, or null): one small kernel and one synchronisation of `s`.
template <class I>
void validate(const I* idx, int64_t n, int64_t nrows, unsigned long long* sticky, cudaStream_t s) {
  dc::StreamBuffer words(2 * sizeof(unsigned long long), s);
  auto* w = words.as<unsigned long long>();
  dc::check(cudaMemsetAsync(w, 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
  if (n > 0) {
    const auto cfg = dc::launch_config(n);
    dc::first_bad_index_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(idx, n, nrows, w);
    dc::check(cudaGetLastError(), "first_bad_index_kernel launch");
  }
  if (sticky != nullptr) {
    dc::check(cudaMemcpyAsync(w + 1, sticky, sizeof(unsigned long long), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
  } else {
    dc::check(cudaMemsetAsync(w + 1, 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
  }
  unsigned long long host[2] = {dc::kNoBadIndex, dc::kNoBadIndex};
  dc::check(cudaMemcpyAsync(host, w, sizeof(host), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  dc::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (host[1] != dc::kNoBadIndex) {
    dc::check(cudaMemsetAsync(sticky, 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
    throw distkit::IndexError(distkit::str(
        "an index outside the tensor's ", nrows, " rows reached a wholemem kernel inside CUDA graph capture or "
        "replay (position ", host[1], " of that call); it was skipped (gather wrote zeros, scatter wrote nothing)"));
  }
  if (host[0] != dc::kNoBadIndex) {
    I v{};
    dc::check(cudaMemcpyAsync(&v, idx + host[0], sizeof(I), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    dc::check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    throw distkit::IndexError(distkit::str("index ", static_cast<int64_t>(v), " at position ", host[0],
                                           " is out of range for ", nrows, " rows"));
  }
}

void validate_any(uintptr_t idx, bool idx64, int64_t n, int64_t nrows, unsigned long long* sticky, cudaStream_t s) {
  if (idx64) {
    validate(reinterpret_cast<const int64_t*>(idx), n, nrows, sticky, s);
  } else {
    validate(reinterpret_cast<const int32_t*>(idx), n, nrows, sticky, s);
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
  const size_t table_bytes = std::max<size_t>(chunks.size(), 1) * sizeof(uintptr_t);
  void* p = nullptr;
  dc::check(cudaMalloc(&p, table_bytes + sizeof(unsigned long long)), "cudaMalloc(chunk table)");
  // synchronous copies: the table is complete before any kernel on any stream reads it
  cudaError_t rc = cudaMemcpy(p, chunks.data(), chunks.size() * sizeof(uintptr_t), cudaMemcpyHostToDevice);
  if (rc == cudaSuccess) rc = cudaMemset(static_cast<char*>(p) + table_bytes, 0xFF, sizeof(unsigned long long));
  if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    cudaFree(p);
    dc::check(rc, "cudaMemcpy(chunk table)");
  }
  return reinterpret_cast<uintptr_t>(p);
}

void free_chunks(uintptr_t dev_chunks, size_t, int device) noexcept {
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

void row_op(RowOp op, const TableDesc& d, uintptr_t dev_chunks, int device, const Window& w, uintptr_t idx, bool idx64,
            int64_t n, uintptr_t data, float alpha, uintptr_t stream) {
  dc::require_device("wholemem CUDA row operation");
  distkit::check(dev_chunks != 0, "the device chunk table is missing");
  if (op == RowOp::ScatterAdd && d.dtype != DType::Float32 && d.dtype != DType::Float64) {
    throw distkit::TypeError(
        distkit::str("CUDA scatter-add supports float32 and float64 only, got ", distkit::dtype_name(d.dtype)));
  }
  if (n == 0) return;
  DeviceGuard g(device);  // the stream belongs to `device`
  cudaStream_t s = dc::stream_from_int(stream);
  // Inside graph capture nothing may synchronise: the kernels skip bad indices and record
  // them in the table's error word, reported by the next validated call on this table.
  if (!dc::stream_capturing(s)) validate_any(idx, idx64, n, w.nrows, error_word(dev_chunks, d.chunks.size()), s);
  if (w.ncols == 0) return;
  // Gather and scatter move raw words whatever the dtype; only the add needs the element type.
  if (op != RowOp::ScatterAdd) {
    launch_typed<uint8_t>(op, d, dev_chunks, w, idx, idx64, n, data, alpha, s);
  } else if (d.dtype == DType::Float32) {
    launch_typed<float>(op, d, dev_chunks, w, idx, idx64, n, data, alpha, s);
  } else {
    launch_typed<double>(op, d, dev_chunks, w, idx, idx64, n, data, alpha, s);
  }
}

void check_indices(uintptr_t idx, bool idx64, int64_t n, int64_t nrows, int device, uintptr_t stream) {
  dc::require_device("wholemem CUDA index check");
  if (n == 0) return;
  DeviceGuard g(device);
  cudaStream_t s = dc::stream_from_int(stream);
  if (dc::stream_capturing(s)) return;  // documented: torch's own kernels check during capture
  validate_any(idx, idx64, n, nrows, nullptr, s);
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

void device_synchronize(int device) {
  dc::require_device("device_synchronize");
  DeviceGuard g(device);
  dc::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
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
  DeviceGuard g(device);  // the mapping belongs to `device`'s context: its kernels read it
  void* p = nullptr;
  dc::check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  return reinterpret_cast<uintptr_t>(p);
}

void ipc_close_handle(uintptr_t dev_ptr, int device) {
  dc::require_device("CUDA IPC");
  DeviceGuard g(device);  // close in the context that opened it
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
