// distkit/rows_cuda.cuh - CUDA kernels for rows.hpp (the same per-element code as the CPU),
// plus the launch helpers every row-op caller needs: a device guard, stream-ordered
// scratch memory, and index validation on the device.
#pragma once

#include <climits>
#include <cstdint>

#include "cuda.hpp"
#include "rows.hpp"

namespace distkit {
namespace cuda {

/// Makes `device` current for the scope and restores the caller's device. A kernel
/// launched on a stream of another device fails (or, for the legacy default stream,
/// silently runs on the wrong device), and torch keeps its own notion of the current
/// device, which must never change behind its back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device >= 0 && device != prev_) {
      check(cudaSetDevice(device), "cudaSetDevice");
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

/// Whether work enqueued on `s` is being captured into a CUDA graph (then nothing may
/// synchronise the stream).
inline bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

/// Stream-ordered device scratch memory (cudaMallocAsync), freed on `s` when the scope
/// ends, also when an exception leaves it.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t s) : s_(s) {
    check(cudaMallocAsync(&p_, bytes > 0 ? bytes : 1, s), "cudaMallocAsync");
  }
  ~StreamBuffer() {
    if (p_ != nullptr && cudaFreeAsync(p_, s_) != cudaSuccess) cudaGetLastError();
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t s_;
};

/// No index error recorded (the initial value of an error word; positions are smaller).
constexpr unsigned long long kNoBadIndex = ULLONG_MAX;

/// *pos = min(*pos, i) over every i with idx[i] outside [0, nrows).
template <class I>
__global__ void first_bad_index_kernel(const I* idx, int64_t n, int64_t nrows, unsigned long long* pos) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= nrows) atomicMin(pos, static_cast<unsigned long long>(i));
  }
}

/// The first index of `idx` (device memory, n entries) outside [0, nrows) and its position.
struct BadIndex {
  int64_t pos = -1;  ///< -1: every index is valid
  int64_t value = 0;
};

/// Validate device-resident indices before a row op touches memory: one small kernel and
/// one synchronisation of `s` (so not inside CUDA graph capture; see stream_capturing).
template <class I>
BadIndex find_bad_index(const I* idx, int64_t n, int64_t nrows, cudaStream_t s) {
  BadIndex bad;
  if (n <= 0) return bad;
  StreamBuffer word(sizeof(unsigned long long), s);
  check(cudaMemsetAsync(word.as<void>(), 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
  const auto cfg = launch_config(n);
  first_bad_index_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(idx, n, nrows, word.as<unsigned long long>());
  check(cudaGetLastError(), "first_bad_index_kernel launch");
  unsigned long long pos = kNoBadIndex;
  check(cudaMemcpyAsync(&pos, word.as<void>(), sizeof(pos), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  if (pos == kNoBadIndex) return bad;
  I v{};
  check(cudaMemcpyAsync(&v, idx + pos, sizeof(I), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  bad.pos = static_cast<int64_t>(pos);
  bad.value = static_cast<int64_t>(v);
  return bad;
}

template <class T, class I>
__global__ void gather_rows_kernel(RowTable<T> t, const I* idx, int64_t n, T* out) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x)
    gather_element(t, idx, out, f);
}

template <class T, class I>
__global__ void scatter_rows_kernel(RowTable<T> t, const I* idx, int64_t n, const T* vals) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x)
    scatter_element(t, idx, vals, f);
}

/// Device-side accumulation: atomics where the hardware has them.
template <class T>
__device__ inline void atomic_add_scaled(T* p, T v, float alpha) {
  atomicAdd(p, static_cast<T>(alpha * v));
}

template <class T, class I>
__global__ void scatter_add_rows_kernel(RowTable<T> t, const I* idx, int64_t n, const T* vals, float alpha) {
  const int64_t total = n * t.ncols;
  for (int64_t f = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; f < total; f += int64_t(gridDim.x) * blockDim.x) {
    int64_t i, j;
    split_flat(f, t.ncols, i, j);
    atomic_add_scaled(&t.at(static_cast<int64_t>(idx[i]), j), vals[f], alpha);
  }
}

template <class T, class I>
void gather_rows(const RowTable<T>& t, const I* idx, int64_t n, T* out, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  gather_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, out);
  check(cudaGetLastError(), "gather_rows_kernel launch");
}

template <class T, class I>
void scatter_rows(const RowTable<T>& t, const I* idx, int64_t n, const T* vals, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  scatter_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, vals);
  check(cudaGetLastError(), "scatter_rows_kernel launch");
}

template <class T, class I>
void scatter_add_rows(const RowTable<T>& t, const I* idx, int64_t n, const T* vals, float alpha, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  auto cfg = launch_config(n * t.ncols);
  scatter_add_rows_kernel<<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, vals, alpha);
  check(cudaGetLastError(), "scatter_add_rows_kernel launch");
}

}  // namespace cuda
}  // namespace distkit
