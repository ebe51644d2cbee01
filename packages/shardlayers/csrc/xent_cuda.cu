// CUDA layer of the vocab-parallel cross-entropy: the per-vector and per-row logic lives in
// xent.hpp (tested on the host); this file only maps rows to blocks, threads to vectors, and merges
// the threads' partials with warp shuffles.
#include <cstdint>

#include "distkit/cuda.hpp"
#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/pybind.hpp"
#include "xent.hpp"

namespace shardlayers {
namespace {

constexpr int kThreads = kStatsThreads;
constexpr int kWarps = kThreads / kWarp;
static_assert(kThreads % kWarp == 0 && kWarps <= kWarp, "the cross-warp merge runs in one warp");

// Lane t takes lane t + 16, t + 8, ..., t + 1: a tree whose result is in lane 0 (xent_block_merge
// replays the same order on the host).
template <class A>
__device__ XentPartial<A> warp_merge(XentPartial<A> p) {
  for (int off = kWarp / 2; off > 0; off >>= 1) {
    const XentPartial<A> o{__shfl_down_sync(0xffffffffu, p.m, off), __shfl_down_sync(0xffffffffu, p.s, off),
                           __shfl_down_sync(0xffffffffu, p.sw, off)};
    xent_partial_merge<A>(p, o);
  }
  return p;
}

// One block per row: thread t folds the row's 16-byte vectors t, t + kThreads, ... (one load of
// the row in all), then the block merges the threads' partials: warp by warp, then the warps'
// results in warp 0.
template <class T, class A>
__global__ void __launch_bounds__(kThreads) stats_kernel(const T* x, int64_t n, int64_t c, int64_t row_stride,
                                                         const int64_t* target, int64_t vstart, const A* w,
                                                         bool want_sum, A* out) {
  constexpr int V = vec16_elems<T>();
  __shared__ XentPartial<A> leaders[kWarps];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* row = x + r * row_stride;
    const XentRowSplit sp = xent_row_split(reinterpret_cast<uintptr_t>(row), c, sizeof(T), V, 16);
    XentPartial<A> p = warp_merge<A>(xent_thread_partial<T, A, V>(row, c, sp, threadIdx.x, kThreads, w, want_sum));
    if (lane == 0) leaders[warp] = p;
    __syncthreads();
    if (warp == 0) {
      p = warp_merge<A>(lane < kWarps ? leaders[lane] : xent_partial_empty<A>());
      if (lane == 0) xent_partial_finish<T, A>(p, row, c, target[r], vstart, out + 4 * r);
    }
    __syncthreads();  // leaders is reused by the next row
  }
}

// One block per row: the row's coefficients are read once, thread t writes the gradient of the
// row's vectors t, t + kThreads, ... (16-byte loads, and 16-byte stores where the gradient row has
// the logits row's alignment); no division anywhere.
template <class T, class A>
__global__ void __launch_bounds__(kThreads) grad_kernel(const T* x, T* g, int64_t n, int64_t c, int64_t row_stride,
                                                        const int64_t* target, int64_t vstart, const A* w,
                                                        const A* coef) {
  constexpr int V = vec16_elems<T>();
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* row = x + r * row_stride;
    T* grow = g + r * c;
    const XentRowSplit sp = xent_row_split(reinterpret_cast<uintptr_t>(row), c, sizeof(T), V, 16);
    const bool g_aligned = ((reinterpret_cast<uintptr_t>(row) ^ reinterpret_cast<uintptr_t>(grow)) & 15u) == 0;
    xent_grad_vectors<T, A, V>(row, grow, c, sp, threadIdx.x, kThreads, target[r], vstart, w, coef + 4 * r,
                               g_aligned);
  }
}

unsigned row_blocks(int64_t n) { return static_cast<unsigned>(n < 65535 * 8 ? n : 65535 * 8); }

}  // namespace

void xent_stats_cuda(uintptr_t x, int64_t n, int64_t c, int64_t row_stride, int dtype, uintptr_t target,
                     int64_t vstart, uintptr_t weight, bool want_sum, uintptr_t out, uintptr_t stream) {
  xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || out != 0, "null out pointer");
  const distkit::DType dt = distkit::dtype_from_code(dtype);
  xent_check_aligned(x, dt, "logits");
  distkit::cuda::require_device("shardlayers cross-entropy (CUDA)");
  if (n == 0) return;
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    stats_kernel<T, A><<<row_blocks(n), kThreads, 0, distkit::cuda::stream_from_int(stream)>>>(
        distkit::ptr<const T>(x), n, c, row_stride, distkit::ptr<const int64_t>(target), vstart,
        distkit::ptr<const A>(weight), want_sum, distkit::ptr<A>(out));
  });
  distkit::cuda::check(cudaGetLastError(), "xent stats kernel launch");
}

void xent_grad_cuda(uintptr_t x, uintptr_t grad, int64_t n, int64_t c, int64_t row_stride, int dtype,
                    uintptr_t target, int64_t vstart, uintptr_t weight, uintptr_t coef, uintptr_t stream) {
  xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || (grad != 0 && coef != 0), "null grad/coef pointer");
  const distkit::DType dt = distkit::dtype_from_code(dtype);
  xent_check_aligned(x, dt, "logits");
  xent_check_aligned(grad, dt, "grad");
  distkit::cuda::require_device("shardlayers cross-entropy (CUDA)");
  if (n == 0) return;
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    grad_kernel<T, A><<<row_blocks(n), kThreads, 0, distkit::cuda::stream_from_int(stream)>>>(
        distkit::ptr<const T>(x), distkit::ptr<T>(grad), n, c, row_stride, distkit::ptr<const int64_t>(target),
        vstart, distkit::ptr<const A>(weight), distkit::ptr<const A>(coef));
  });
  distkit::cuda::check(cudaGetLastError(), "xent grad kernel launch");
}

}  // namespace shardlayers
