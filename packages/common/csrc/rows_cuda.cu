// CUDA path of the common row ops: the per-element code of distkit/rows.hpp on the device.
//
// Before anything is launched: the device of the stream is made current (a kernel on a
// stream of another device fails, and the legacy default stream would silently run on
// the wrong device), the indices are validated on the device (an IndexError naming the
// first bad index, as on the CPU, instead of an illegal address that poisons the CUDA
// context), and every argument error is raised before any device memory is taken. The
// chunk array the kernels read is stream-ordered scratch memory, freed on every path.
#include <cstdint>
#include <type_traits>

#include "distkit/rows_cuda.cuh"
#include "rows_dispatch.hpp"

namespace {

using namespace distkit;

/// Elements moved as raw words of their size: gather and scatter need no arithmetic, so
/// one instantiation per element size covers every dtype (16-bit floats, bool, complex).
struct Words16 {
  uint64_t lo, hi;
};

template <class T, class I>
void run(RowOp op, const RowOpArgs& a, cudaStream_t s) {
  const I* idx = reinterpret_cast<const I*>(a.idx);
  const cuda::BadIndex bad = cuda::find_bad_index(idx, a.n, a.nrows, s);
  if (bad.pos >= 0) {
    throw IndexError(str("index ", bad.value, " at position ", bad.pos, " is out of range for ", a.nrows, " rows"));
  }
  // The kernels read the chunk table from device memory.
  const size_t bytes = a.chunks.size() * sizeof(T*);
  cuda::StreamBuffer dev_chunks(bytes, s);
  cuda::check(cudaMemcpyAsync(dev_chunks.as<void>(), a.chunks.data(), bytes, cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync");
  RowTable<T> t{dev_chunks.as<T*>(), a.rows_per_chunk, a.nrows, a.ncols, a.row_stride, a.col_stride};
  T* data = reinterpret_cast<T*>(a.data);
  switch (op) {
    case RowOp::Gather: cuda::gather_rows(t, idx, a.n, data, s); break;
    case RowOp::Scatter: cuda::scatter_rows(t, idx, a.n, static_cast<const T*>(data), s); break;
    case RowOp::ScatterAdd:
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        cuda::scatter_add_rows(t, idx, a.n, static_cast<const T*>(data), a.alpha, s);
      }
      break;
  }
  // No synchronisation: a copy from pageable memory has read its source when it returns,
  // and the scratch table is freed in stream order after the kernel.
}

template <class T>
void run_typed(RowOp op, const RowOpArgs& a, cudaStream_t s) {
  if (a.idx64) {
    run<T, int64_t>(op, a, s);
  } else {
    run<T, int32_t>(op, a, s);
  }
}

/// The device a row op runs on: the stream's device, or for the legacy default stream
/// (handle 0, which every device has) the device holding the output / values.
int device_of(cudaStream_t s, uintptr_t data) {
#if CUDART_VERSION >= 12080
  if (s != nullptr && s != cudaStreamLegacy && s != cudaStreamPerThread) {
    int d = -1;
    cuda::check(cudaStreamGetDevice(s, &d), "cudaStreamGetDevice");
    return d;
  }
#endif
  cudaPointerAttributes attr{};
  if (data != 0 && cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(data)) == cudaSuccess &&
      attr.type == cudaMemoryTypeDevice) {
    return attr.device;
  }
  cudaGetLastError();  // an unregistered host pointer is not an error here
  return -1;           // keep the current device
}

}  // namespace

void cuda_row_op(RowOp op, const RowOpArgs& a, uintptr_t stream) {
  using namespace distkit;
  cuda::require_device("CUDA row operation");
  if (op == RowOp::ScatterAdd && a.dtype != DType::Float32 && a.dtype != DType::Float64) {
    throw TypeError(str("CUDA scatter-add supports float32 and float64 only, got ", dtype_name(a.dtype)));
  }
  if (a.n == 0 || a.ncols == 0) return;
  distkit::check(a.idx != 0 && a.data != 0, "null index or data pointer");
  cudaStream_t s = cuda::stream_from_int(stream);
  cuda::DeviceGuard guard(device_of(s, a.data));
  distkit::check(!cuda::stream_capturing(s),
        "a CUDA row op cannot run inside CUDA graph capture: its index check synchronises the stream");
  switch (a.dtype) {
    case DType::Float32: run_typed<float>(op, a, s); break;
    case DType::Float64: run_typed<double>(op, a, s); break;
    default:
      switch (itemsize(a.dtype)) {
        case 1: run_typed<uint8_t>(op, a, s); break;
        case 2: run_typed<uint16_t>(op, a, s); break;
        case 4: run_typed<uint32_t>(op, a, s); break;
        case 8: run_typed<uint64_t>(op, a, s); break;
        case 16: run_typed<Words16>(op, a, s); break;
        default: throw TypeError(str("CUDA row ops do not support ", dtype_name(a.dtype)));
      }
  }
}
