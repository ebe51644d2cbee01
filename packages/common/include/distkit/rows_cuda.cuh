// distkit/rows_cuda.cuh - CUDA kernels for rows.hpp (the same per-element code as the CPU),
// plus the launch helpers every row-op caller needs: a device guard, stream-ordered
// scratch memory, and index validation on the device.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "cuda.hpp"
#include "rows.hpp"
#include "rows_vec.hpp"

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

/// The element types the device scatter-add accumulates (with atomicAdd).
template <class T>
struct has_atomic_add : std::integral_constant<bool, std::is_same_v<T, float> || std::is_same_v<T, double>> {};

/// Device-side accumulation: atomics where the hardware has them.
template <class T>
__device__ inline void atomic_add_scaled(T* p, T v, float alpha) {
  atomicAdd(p, static_cast<T>(alpha * v));
}

/// Where a group of `G` lanes (a power of two up to 32) starts, and how many groups the grid has.
struct LaneGroups {
  int lane, G;
  int64_t group, ngroups;
  __device__ explicit LaneGroups(int g)
      : lane(static_cast<int>(threadIdx.x) & (g - 1)),
        G(g),
        group((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / g),
        ngroups(int64_t(gridDim.x) * blockDim.x / g) {}
};

/// Record the lowest bad position of a row call in the error word (if any).
__device__ inline void note_bad(unsigned long long* err, int64_t bad) {
  if (bad >= 0 && err != nullptr) atomicMin(err, static_cast<unsigned long long>(bad));
}

/// The row functions of rows_vec.hpp over every row group of the grid.
template <int W, class I>
__global__ void gather_words_kernel(ByteRows t, const I* idx, int64_t n, char* out, int G, unsigned long long* err) {
  const LaneGroups g(G);
  for (int64_t i0 = g.group * kRowsInFlight; i0 < n; i0 += g.ngroups * kRowsInFlight)
    note_bad(err, gather_rows_group<W, kRowsInFlight>(t, idx, i0, n, out, g.lane, G));
}

template <int W, class I>
__global__ void scatter_words_kernel(ByteRows t, const I* idx, int64_t n, const char* vals, int G,
                                     unsigned long long* err) {
  const LaneGroups g(G);
  for (int64_t i0 = g.group * kRowsInFlight; i0 < n; i0 += g.ngroups * kRowsInFlight)
    note_bad(err, scatter_rows_group<W, kRowsInFlight>(t, idx, i0, n, vals, g.lane, G));
}

template <class T, int W, class I>
__global__ void scatter_add_words_kernel(ByteRows t, const I* idx, int64_t n, const char* vals, float alpha, int G,
                                         unsigned long long* err) {
  const LaneGroups g(G);
  auto add = [](T* e, T v, float a) { atomic_add_scaled(e, v, a); };
  for (int64_t i0 = g.group * kRowsInFlight; i0 < n; i0 += g.ngroups * kRowsInFlight)
    note_bad(err, scatter_add_rows_group<T, W>(t, idx, i0, n, kRowsInFlight, vals, alpha, g.lane, G, add));
}

/// Grid for `n` rows moved by groups of G lanes, kRowsInFlight rows per group and pass.
inline LaunchConfig row_launch_config(int64_t n, int G) {
  const int64_t groups = (n + kRowsInFlight - 1) / kRowsInFlight;
  return launch_config(groups * G);
}

/// Launch the gather / scatter / scatter-add of `n` rows of `t` (chunk array in device
/// memory) with `w`-byte words (choose_word_bytes); `T` is the element type of the add.
/// Bad indices are skipped and their lowest position recorded in `err` (may be null).
template <class T, class I>
void launch_row_words(RowMove op, const ByteRows& t, int w, const I* idx, int64_t n, char* data, float alpha,
                      unsigned long long* err, cudaStream_t s) {
  if (n == 0 || t.ncols == 0) return;
  dispatch_word(w, [&](auto wc) {
    constexpr int W = decltype(wc)::value;
    const int G = lanes_per_row(row_words(t, W));
    const auto cfg = row_launch_config(n, G);
    if (op == RowMove::Gather) {
      gather_words_kernel<W, I><<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, data, G, err);
    } else if (op == RowMove::Scatter) {
      scatter_words_kernel<W, I><<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, data, G, err);
    } else if constexpr (!has_atomic_add<T>::value) {
      throw TypeError("CUDA scatter-add supports float32 and float64 only");
    } else if constexpr (W >= static_cast<int>(sizeof(T))) {
      scatter_add_words_kernel<T, W, I><<<cfg.blocks, cfg.threads, 0, s>>>(t, idx, n, data, alpha, G, err);
    } else {
      throw ValueError(str("scatter-add needs elements aligned to their size (", sizeof(T), " bytes), got ", W));
    }
  });
  check(cudaGetLastError(), "row kernel launch");
}

}  // namespace cuda
}  // namespace distkit
