// _shardlayers: native core of shardlayers (the fused vocab-parallel cross-entropy passes).
//
// Python passes raw data pointers (tensor.data_ptr()), sizes and distkit dtype codes; the
// extension never links libtorch. All real work runs with the GIL released.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "xent.hpp"

namespace py = pybind11;
using distkit::DType;

#ifdef DISTKIT_WITH_CUDA
namespace shardlayers {
void xent_stats_cuda(uintptr_t x, int64_t n, int64_t c, int64_t row_stride, int dtype, uintptr_t target,
                     int64_t vstart, uintptr_t weight, bool want_sum, uintptr_t out, uintptr_t stream);
void xent_grad_cuda(uintptr_t x, uintptr_t grad, int64_t n, int64_t c, int64_t row_stride, int dtype,
                    uintptr_t target, int64_t vstart, uintptr_t weight, uintptr_t coef, uintptr_t stream);
}  // namespace shardlayers
#endif

namespace {

int64_t grain_rows(int64_t c) { return std::max<int64_t>(1, (int64_t{1} << 15) / c); }

void xent_stats_cpu(uintptr_t x, int64_t n, int64_t c, int64_t row_stride, int dtype, uintptr_t target,
                    int64_t vstart, uintptr_t weight, bool want_sum, uintptr_t out) {
  shardlayers::xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || out != 0, "null out pointer");
  const DType dt = distkit::dtype_from_code(dtype);
  shardlayers::xent_check_aligned(x, dt, "logits");
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    const T* xp = distkit::ptr<const T>(x);
    const int64_t* tp = distkit::ptr<const int64_t>(target);
    const A* wp = distkit::ptr<const A>(weight);
    A* op = distkit::ptr<A>(out);
    distkit::parallel_for(0, n, grain_rows(c), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        shardlayers::xent_stats_row<T, A>(xp + r * row_stride, c, tp[r], vstart, wp, want_sum, op + 4 * r);
    });
  });
}

void xent_grad_cpu(uintptr_t x, uintptr_t grad, int64_t n, int64_t c, int64_t row_stride, int dtype,
                   uintptr_t target, int64_t vstart, uintptr_t weight, uintptr_t coef) {
  shardlayers::xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || (grad != 0 && coef != 0), "null grad/coef pointer");
  const DType dt = distkit::dtype_from_code(dtype);
  shardlayers::xent_check_aligned(x, dt, "logits");
  shardlayers::xent_check_aligned(grad, dt, "grad");
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    const T* xp = distkit::ptr<const T>(x);
    T* gp = distkit::ptr<T>(grad);
    const int64_t* tp = distkit::ptr<const int64_t>(target);
    const A* wp = distkit::ptr<const A>(weight);
    const A* cp = distkit::ptr<const A>(coef);
    distkit::parallel_for(0, n, grain_rows(c), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r)
        shardlayers::xent_grad_row<T, A>(xp + r * row_stride, gp + r * c, c, tp[r], vstart, wp, cp + 4 * r);
    });
  });
}

// The CUDA kernels' algorithms (16-byte vector cuts from the row's address, block-strided
// partials merged warp by warp; the per-vector gradient) run on the host, single-threaded: the
// tests compare them with the CPU kernel and torch on misaligned, masked and ignored rows, which is
// how the shared device code is checked on machines without a GPU.
void xent_stats_blockwise_cpu(uintptr_t x, int64_t n, int64_t c, int64_t row_stride, int dtype, uintptr_t target,
                              int64_t vstart, uintptr_t weight, bool want_sum, uintptr_t out) {
  shardlayers::xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || out != 0, "null out pointer");
  const DType dt = distkit::dtype_from_code(dtype);
  shardlayers::xent_check_aligned(x, dt, "logits");
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    const T* xp = distkit::ptr<const T>(x);
    const int64_t* tp = distkit::ptr<const int64_t>(target);
    for (int64_t r = 0; r < n; ++r)
      shardlayers::xent_stats_row_blockwise<T, A>(xp + r * row_stride, c, tp[r], vstart,
                                                  distkit::ptr<const A>(weight), want_sum,
                                                  distkit::ptr<A>(out) + 4 * r, shardlayers::kStatsThreads);
  });
}

void xent_grad_elementwise_cpu(uintptr_t x, uintptr_t grad, int64_t n, int64_t c, int64_t row_stride, int dtype,
                               uintptr_t target, int64_t vstart, uintptr_t weight, uintptr_t coef) {
  shardlayers::xent_check_args(n, c, row_stride, x, target);
  distkit::check<distkit::ValueError>(n == 0 || (grad != 0 && coef != 0), "null grad/coef pointer");
  const DType dt = distkit::dtype_from_code(dtype);
  shardlayers::xent_check_aligned(x, dt, "logits");
  shardlayers::xent_check_aligned(grad, dt, "grad");
  distkit::nogil release;
  distkit::dispatch_floating(dt, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    const T* xp = distkit::ptr<const T>(x);
    const int64_t* tp = distkit::ptr<const int64_t>(target);
    for (int64_t r = 0; r < n; ++r)
      shardlayers::xent_grad_row_vectorwise<T, A>(xp + r * row_stride, distkit::ptr<T>(grad) + r * c, c, tp[r],
                                                  vstart, distkit::ptr<const A>(weight),
                                                  distkit::ptr<const A>(coef) + 4 * r, shardlayers::kStatsThreads);
  });
}

}  // namespace

PYBIND11_MODULE(_shardlayers, m) {
  m.doc() = "native core of shardlayers";
  distkit::init_module(m);
  m.def("xent_stats_cpu", &xent_stats_cpu, py::arg("x"), py::arg("n"), py::arg("c"), py::arg("row_stride"),
        py::arg("dtype"), py::arg("target"), py::arg("vstart"), py::arg("weight"), py::arg("want_sum"),
        py::arg("out"),
        "Per-row local (max, sum exp(x - max), target logit, sum w*x) of logits x[n, c] into out[n, 4].");
  m.def("xent_grad_cpu", &xent_grad_cpu, py::arg("x"), py::arg("grad"), py::arg("n"), py::arg("c"),
        py::arg("row_stride"), py::arg("dtype"), py::arg("target"), py::arg("vstart"), py::arg("weight"),
        py::arg("coef"), "Gradient grad[n, c] (contiguous) of the cross-entropy from coef[n, 4] = (max, a, ct, cw).");
  m.def("xent_stats_blockwise_cpu", &xent_stats_blockwise_cpu, py::arg("x"), py::arg("n"), py::arg("c"),
        py::arg("row_stride"), py::arg("dtype"), py::arg("target"), py::arg("vstart"), py::arg("weight"),
        py::arg("want_sum"), py::arg("out"), "The CUDA stats kernel's algorithm run on the host (for tests).");
  m.def("xent_grad_elementwise_cpu", &xent_grad_elementwise_cpu, py::arg("x"), py::arg("grad"), py::arg("n"),
        py::arg("c"), py::arg("row_stride"), py::arg("dtype"), py::arg("target"), py::arg("vstart"),
        py::arg("weight"), py::arg("coef"), "The CUDA gradient kernel's per-vector computation run on the host (for tests).");
  m.attr("XENT_CUDA_THREADS") = shardlayers::kStatsThreads;
#ifdef DISTKIT_WITH_CUDA
  m.def("xent_stats_cuda", &shardlayers::xent_stats_cuda, py::arg("x"), py::arg("n"), py::arg("c"),
        py::arg("row_stride"), py::arg("dtype"), py::arg("target"), py::arg("vstart"), py::arg("weight"),
        py::arg("want_sum"), py::arg("out"), py::arg("stream"));
  m.def("xent_grad_cuda", &shardlayers::xent_grad_cuda, py::arg("x"), py::arg("grad"), py::arg("n"), py::arg("c"),
        py::arg("row_stride"), py::arg("dtype"), py::arg("target"), py::arg("vstart"), py::arg("weight"),
        py::arg("coef"), py::arg("stream"));
#else
  auto no_cuda = [](py::args, py::kwargs) -> void {
    throw distkit::CudaError("shardlayers was built without CUDA support (no nvcc at build time)");
  };
  m.def("xent_stats_cuda", no_cuda);
  m.def("xent_grad_cuda", no_cuda);
#endif
}
