// graph_cuda.cu - the CUDA layer of the graph ops: two kernels, one thread per center,
// running the same per-center code as the CPU (graph_sample.hpp). The prefix sum of
// the counts between them runs as a torch op on the device (see _graph_sample.py).
#include <cuda_runtime.h>

#include <cstdint>

#include "distkit/cuda.hpp"
#include "graph_native.hpp"
#include "graph_sample.hpp"

namespace wholemem {
namespace graph {
namespace cuda {

namespace dc = distkit::cuda;

namespace {

/// Makes `device` current for its scope and restores the caller's device afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    dc::check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device >= 0 && device != prev_) {
      dc::check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

template <class C>
__global__ void counts_kernel(Bounds<C> b, int64_t n, int64_t k, int32_t* offsets) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t s = 0, e = 0;
    b.get(i, s, e);
    offsets[i + 1] = static_cast<int32_t>(sample_count(e - s, k));
    if (i == 0) offsets[0] = 0;
  }
}

template <class C, class Id, class W>
__global__ void fill_kernel(SampleJob<C, Id, W> job, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    job.run(i);
  }
}

template <class C>
Bounds<C> bounds_of(const SampleArgs& a) {
  return Bounds<C>{reinterpret_cast<const int64_t*>(a.row_ptr), reinterpret_cast<const C*>(a.centers),
                   reinterpret_cast<const int64_t*>(a.starts), reinterpret_cast<const int64_t*>(a.ends)};
}

template <class C, class Id, class W>
void launch_fill(const SampleArgs& a, cudaStream_t s) {
  SampleJob<C, Id, W> job{bounds_of<C>(a),
                          reinterpret_cast<const Id*>(a.col),
                          reinterpret_cast<const W*>(a.weights),
                          reinterpret_cast<const int64_t*>(a.weight_offsets),
                          a.k,
                          a.seed,
                          reinterpret_cast<const int32_t*>(a.offsets),
                          reinterpret_cast<Id*>(a.dest),
                          reinterpret_cast<int32_t*>(a.center_local),
                          reinterpret_cast<int64_t*>(a.edge_id),
                          reinterpret_cast<double*>(a.keys)};
  // few threads per block: each thread walks a whole neighbour list, and divergence
  // between centers of very different degrees costs less in small blocks
  const auto cfg = dc::launch_config(a.n, 64);
  fill_kernel<C, Id, W><<<cfg.blocks, cfg.threads, 0, s>>>(job, a.n);
  dc::check(cudaGetLastError(), "sample_fill kernel launch");
}

template <class C, class Id>
void fill_weights(const SampleArgs& a, cudaStream_t s) {
  if (a.weights64) {
    launch_fill<C, Id, double>(a, s);
  } else {
    launch_fill<C, Id, float>(a, s);
  }
}

template <class C>
void fill_ids(const SampleArgs& a, cudaStream_t s) {
  if (a.col64) {
    fill_weights<C, int64_t>(a, s);
  } else {
    fill_weights<C, int32_t>(a, s);
  }
}

}  // namespace

void sample_counts(const SampleArgs& a, int device, uintptr_t stream) {
  if (a.n == 0) return;
  DeviceScope scope(device);
  const cudaStream_t s = dc::stream_from_int(stream);
  const auto cfg = dc::launch_config(a.n);
  int32_t* off = reinterpret_cast<int32_t*>(a.offsets);
  if (a.centers64 || a.row_ptr == 0) {
    counts_kernel<int64_t><<<cfg.blocks, cfg.threads, 0, s>>>(bounds_of<int64_t>(a), a.n, a.k, off);
  } else {
    counts_kernel<int32_t><<<cfg.blocks, cfg.threads, 0, s>>>(bounds_of<int32_t>(a), a.n, a.k, off);
  }
  dc::check(cudaGetLastError(), "sample_counts kernel launch");
}

void sample_fill(const SampleArgs& a, int device, uintptr_t stream) {
  if (a.n == 0) return;
  DeviceScope scope(device);
  const cudaStream_t s = dc::stream_from_int(stream);
  if (a.centers64 || a.row_ptr == 0) {
    fill_ids<int64_t>(a, s);
  } else {
    fill_ids<int32_t>(a, s);
  }
}

}  // namespace cuda
}  // namespace graph
}  // namespace wholemem
