// CUDA path of the common row ops: the per-element code of distkit/rows.hpp on the device.
#include <cstdint>
#include <type_traits>

#include "distkit/rows_cuda.cuh"
#include "rows_dispatch.hpp"

namespace {

template <class T, class I>
void run(RowOp op, const RowOpArgs& a, cudaStream_t s) {
  using namespace distkit;
  // The chunk table itself must live on the device.
  T** dev_chunks = nullptr;
  const size_t bytes = a.chunks.size() * sizeof(T*);
  cuda::check(cudaMallocAsync(reinterpret_cast<void**>(&dev_chunks), bytes, s), "cudaMallocAsync");
  cuda::check(cudaMemcpyAsync(dev_chunks, a.chunks.data(), bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  RowTable<T> t{dev_chunks, a.rows_per_chunk, a.nrows, a.ncols, a.row_stride, a.col_stride};
  const I* idx = reinterpret_cast<const I*>(a.idx);
  T* data = reinterpret_cast<T*>(a.data);
  switch (op) {
    case RowOp::Gather: cuda::gather_rows(t, idx, a.n, data, s); break;
    case RowOp::Scatter: cuda::scatter_rows(t, idx, a.n, static_cast<const T*>(data), s); break;
    case RowOp::ScatterAdd:
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        cuda::scatter_add_rows(t, idx, a.n, static_cast<const T*>(data), a.alpha, s);
      } else {
        throw TypeError("CUDA scatter-add supports float32 and float64 only");
      }
      break;
  }
  cuda::check(cudaFreeAsync(dev_chunks, s), "cudaFreeAsync");
}

}  // namespace

void cuda_row_op(RowOp op, const RowOpArgs& a, uintptr_t stream) {
  using namespace distkit;
  cuda::require_device("CUDA row operation");
  cudaStream_t s = cuda::stream_from_int(stream);
  switch (a.dtype) {
    case DType::Float32: a.idx64 ? run<float, int64_t>(op, a, s) : run<float, int32_t>(op, a, s); break;
    case DType::Float64: a.idx64 ? run<double, int64_t>(op, a, s) : run<double, int32_t>(op, a, s); break;
    case DType::Float16: a.idx64 ? run<uint16_t, int64_t>(op, a, s) : run<uint16_t, int32_t>(op, a, s); break;
    case DType::BFloat16: a.idx64 ? run<uint16_t, int64_t>(op, a, s) : run<uint16_t, int32_t>(op, a, s); break;
    case DType::Int32: a.idx64 ? run<int32_t, int64_t>(op, a, s) : run<int32_t, int32_t>(op, a, s); break;
    case DType::Int64: a.idx64 ? run<int64_t, int64_t>(op, a, s) : run<int64_t, int32_t>(op, a, s); break;
    case DType::Int8: a.idx64 ? run<int8_t, int64_t>(op, a, s) : run<int8_t, int32_t>(op, a, s); break;
    default: throw TypeError(str("CUDA row ops do not support ", dtype_name(a.dtype)));
  }
}
