// CUDA layer of the vocab-parallel cross-entropy: the per-row logic lives in xent.hpp.
#include <cstdint>

#include "distkit/cuda.hpp"
#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/pybind.hpp"
#include "xent.hpp"

namespace shardlayers {
namespace {

constexpr int kThreads = kStatsThreads;

// One block per row: every thread folds a strided share of the row into a partial, then the
// block merges the partials in shared memory (xent.hpp; xent_stats_row_blockwise replays the same
// order on the host for the tests).
template <class T, class A>
__global__ void stats_kernel(const T* x, int64_t n, int64_t c, int64_t row_stride, const int64_t* target,
                             int64_t vstart, const A* w, bool want_sum, A* out) {
  __shared__ A sm[kThreads], ss[kThreads], sw[kThreads];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* row = x + r * row_stride;
    XentPartial<A> p = xent_partial_strided<T, A>(row, c, threadIdx.x, blockDim.x, w, want_sum);
    sm[threadIdx.x] = p.m;
    ss[threadIdx.x] = p.s;
    sw[threadIdx.x] = p.sw;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
      if (threadIdx.x < k) {
        XentPartial<A> a{sm[threadIdx.x], ss[threadIdx.x], sw[threadIdx.x]};
        xent_partial_merge<A>(a, XentPartial<A>{sm[threadIdx.x + k], ss[threadIdx.x + k], sw[threadIdx.x + k]});
        sm[threadIdx.x] = a.m;
        ss[threadIdx.x] = a.s;
        sw[threadIdx.x] = a.sw;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      xent_partial_finish<T, A>(XentPartial<A>{sm[0], ss[0], sw[0]}, row, c, target[r], vstart, out + 4 * r);
    }
    __syncthreads();
  }
}

template <class T, class A>
__global__ void grad_kernel(const T* x, T* g, int64_t n, int64_t c, int64_t row_stride, const int64_t* target,
                            int64_t vstart, const A* w, const A* coef) {
  const int64_t total = n * c;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, j = i - r * c;
    const A* k = coef + 4 * r;
    const bool is_t = (target[r] - vstart) == j;
    g[i] = T(xent_grad_elem<A>(static_cast<A>(x[r * row_stride + j]), k[0], k[1], k[2], k[3], w ? w[j] : A(1), is_t));
  }
}

}  // namespace

void xent_stats_cuda(uintptr_t x, int64_t n, int64_t c, int64_t row_stride, int dtype, uintptr_t target,
                     int64_t vstart, uintptr_t weight, bool want_sum, uintptr_t out, uintptr_t stream) {
  xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || out != 0, "null out pointer");
  distkit::cuda::require_device("shardlayers cross-entropy (CUDA)");
  if (n == 0) return;
  const distkit::DType dt = distkit::dtype_from_code(dtype);
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    unsigned blocks = static_cast<unsigned>(n < 65535 * 8 ? n : 65535 * 8);
    stats_kernel<T, A><<<blocks, kThreads, 0, distkit::cuda::stream_from_int(stream)>>>(
        distkit::ptr<const T>(x), n, c, row_stride, distkit::ptr<const int64_t>(target), vstart,
        distkit::ptr<const A>(weight), want_sum, distkit::ptr<A>(out));
  });
  distkit::cuda::check(cudaGetLastError(), "xent stats kernel launch");
}

void xent_grad_cuda(uintptr_t x, uintptr_t grad, int64_t n, int64_t c, int64_t row_stride, int dtype,
                    uintptr_t target, int64_t vstart, uintptr_t weight, uintptr_t coef, uintptr_t stream) {
  xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || (grad != 0 && coef != 0), "null grad/coef pointer");
  distkit::cuda::require_device("shardlayers cross-entropy (CUDA)");
  if (n == 0) return;
  const distkit::DType dt = distkit::dtype_from_code(dtype);
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    auto cfg = distkit::cuda::launch_config(n * c);
    grad_kernel<T, A><<<cfg.blocks, cfg.threads, 0, distkit::cuda::stream_from_int(stream)>>>(
        distkit::ptr<const T>(x), distkit::ptr<T>(grad), n, c, row_stride, distkit::ptr<const int64_t>(target),
        vstart, distkit::ptr<const A>(weight), distkit::ptr<const A>(coef));
  });
  distkit::cuda::check(cudaGetLastError(), "xent grad kernel launch");
}

}  // namespace shardlayers
