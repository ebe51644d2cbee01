// distkit/cuda.hpp - CUDA helpers: error checks, streams, launch configuration.
// Include only from .cu files (compiled when the CUDA toolkit is present).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "error.hpp"

namespace distkit {
namespace cuda {

inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw CudaError(str(what, ": ", cudaGetErrorName(rc), ": ", cudaGetErrorString(rc)));
}

/// Number of visible CUDA devices (0 when there is no driver or no device).
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

inline void require_device(const char* what) {
  if (device_count() == 0) throw CudaError(str(what, " needs a CUDA device, and none is visible"));
}

/// A stream handle passed from Python as an integer (0 = legacy default stream).
inline cudaStream_t stream_from_int(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

struct LaunchConfig {
  unsigned blocks;
  unsigned threads;
};

/// One thread per element, capped grid (kernels loop grid-stride).
inline LaunchConfig launch_config(int64_t n, unsigned threads = 256) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535LL * 8) blocks = 65535LL * 8;
  return LaunchConfig{static_cast<unsigned>(blocks), threads};
}

}  // namespace cuda
}  // namespace distkit
