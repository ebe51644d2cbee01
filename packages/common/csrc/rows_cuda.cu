// CUDA path of the common row ops: the row functions of distkit/rows_vec.hpp on the device
// (rows as the widest aligned words, several rows in flight per lane group).
//
// Before anything is launched: the device of the stream is made current (a kernel on a
// stream of another device fails, and the legacy default stream would silently run on
// the wrong device), the indices are validated on the device (an IndexError naming the
// first bad index, as on the CPU, instead of an illegal address that poisons the CUDA
// context), and every argument error is raised before any device memory is taken. The
// chunk array the kernels read is stream-ordered scratch memory, freed on every path.
#include <cstdint>
#include <memory>
#include <type_traits>

#include "distkit/rows_cuda.cuh"
#include "rows_dispatch.hpp"

namespace {

using namespace distkit;

template <class T, class I>
void run(RowOp op, const RowOpArgs& a, cudaStream_t s) {
  const I* idx = reinterpret_cast<const I*>(a.idx);
  if (a.validate) {
    const cuda::BadIndex bad = cuda::find_bad_index(idx, a.n, a.nrows, s);
    if (bad.pos >= 0) {
      throw IndexError(str("index ", bad.value, " at position ", bad.pos, " is out of range for ", a.nrows, " rows"));
    }
  }
  const ByteRows host_view = make_byte_rows(nullptr, a.chunks[0], a.chunks.size(), a.rows_per_chunk, a.nrows, 0, 0,
                                            a.ncols, itemsize(a.dtype), a.row_stride, a.col_stride);
  const int w = choose_word_bytes(host_view, a.chunks.data(), a.chunks.size(), a.data);
  if (op == RowOp::ScatterAdd && w < static_cast<int>(sizeof(T))) {
    throw ValueError(str("scatter-add needs elements aligned to their size (", sizeof(T), " bytes), got ", w));
  }
  // The kernels read the chunk table from device memory (a single buffer is passed by value).
  ByteRows t = host_view;
  std::unique_ptr<cuda::StreamBuffer> dev_chunks;  // none for one buffer (its base travels by value)
  if (!t.single) {
    const size_t bytes = a.chunks.size() * sizeof(char*);
    dev_chunks = std::make_unique<cuda::StreamBuffer>(bytes, s);
    cuda::check(cudaMemcpyAsync(dev_chunks->as<void>(), a.chunks.data(), bytes, cudaMemcpyHostToDevice, s),
                "cudaMemcpyAsync");
    t.chunks = dev_chunks->as<char*>();
  }
  // indices were validated above, or the caller chose to skip bad rows silently: no error word
  cuda::launch_row_words<T, I>(op, t, w, idx, a.n, reinterpret_cast<char*>(a.data), a.alpha, nullptr, s);
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
  distkit::check(!a.validate || !cuda::stream_capturing(s),
                 "a CUDA row op with validate=True cannot run inside CUDA graph capture: its index check "
                 "synchronises the stream");
  // Gather and scatter move raw words whatever the dtype; only the add needs the element type.
  if (op != RowOp::ScatterAdd) {
    run_typed<uint8_t>(op, a, s);
  } else if (a.dtype == DType::Float32) {
    run_typed<float>(op, a, s);
  } else {
    run_typed<double>(op, a, s);
  }
}
