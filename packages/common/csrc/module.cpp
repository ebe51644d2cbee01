// _distkit_common: exposes the shared native code (distkit/*.hpp) for tests and tools.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distkit/dtype.hpp"
#include "distkit/fsio.hpp"
#include "distkit/half.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "distkit/rows_cpu.hpp"
#include "distkit/shm.hpp"
#include "rows_dispatch.hpp"

namespace py = pybind11;
using namespace distkit;

namespace {

template <class T, class I>
void cpu_row_op(RowOp op, const RowOpArgs& a) {
  std::vector<T*> chunks(a.chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = reinterpret_cast<T*>(a.chunks[i]);
  RowTable<T> t{chunks.data(), a.rows_per_chunk, a.nrows, a.ncols, a.row_stride, a.col_stride};
  const I* idx = reinterpret_cast<const I*>(a.idx);
  check_indices(idx, a.n, a.nrows);
  T* data = reinterpret_cast<T*>(a.data);
  switch (op) {
    case RowOp::Gather: gather_rows_cpu(t, idx, a.n, data); break;
    case RowOp::Scatter: scatter_rows_cpu(t, idx, a.n, static_cast<const T*>(data)); break;
    case RowOp::ScatterAdd: scatter_add_rows_cpu(t, idx, a.n, static_cast<const T*>(data), a.alpha); break;
  }
}

void row_op(RowOp op, std::vector<uintptr_t> chunks, int64_t rows_per_chunk, int64_t nrows, int64_t ncols,
            int64_t row_stride, int64_t col_stride, int dtype, uintptr_t idx, bool idx64, int64_t n, uintptr_t data,
            float alpha, bool on_device, uintptr_t stream) {
  check(!chunks.empty(), "at least one chunk is required");
  check(rows_per_chunk > 0, "rows_per_chunk must be positive, got ", rows_per_chunk);
  check(static_cast<int64_t>(chunks.size()) * rows_per_chunk >= nrows, "chunk table of ", chunks.size(),
        " chunks x ", rows_per_chunk, " rows cannot hold ", nrows, " rows");
  check(ncols >= 0 && n >= 0 && nrows >= 0, "negative size");
  RowOpArgs a{std::move(chunks), rows_per_chunk, nrows, ncols, row_stride, col_stride,
              dtype_from_code(dtype), idx, idx64, n, data, alpha};
  if (on_device) {
#ifdef DISTKIT_WITH_CUDA
    nogil release;
    cuda_row_op(op, a, stream);
    return;
#else
    throw Error("this build of distkit-common has no CUDA support (built without nvcc)");
#endif
  }
  nogil release;
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (a.idx64) {
      cpu_row_op<T, int64_t>(op, a);
    } else {
      cpu_row_op<T, int32_t>(op, a);
    }
  });
}

class PyShm {
 public:
  explicit PyShm(ShmSegment s) : seg(std::move(s)) {}
  ShmSegment seg;
};

}  // namespace

PYBIND11_MODULE(_distkit_common, m) {
  m.doc() = "distkit-common native helpers (thread pool, fp16 conversion, row ops, shared memory)";
  init_module(m);

  m.def(
      "parallel_sum", [](int64_t n, int64_t grain, int64_t throw_at) {
        std::vector<int64_t> partial(static_cast<size_t>(get_num_threads()) * 64, 0);
        std::atomic<int64_t> total{0};
        {
          nogil release;
          parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
            int64_t s = 0;
            for (int64_t i = lo; i < hi; ++i) {
              if (i == throw_at) throw ValueError(str("body failed at ", i));
              s += i;
            }
            total += s;
          });
        }
        return total.load();
      },
      py::arg("n"), py::arg("grain") = 1, py::arg("throw_at") = -1,
      "Sum 0..n-1 with parallel_for (tests the pool, including exception propagation).");

  m.def(
      "convert_f32", [](uintptr_t src, uintptr_t dst, int64_t n, int dtype) {
        const DType t = dtype_from_code(dtype);
        check<TypeError>(t == DType::Float16 || t == DType::BFloat16, "convert_f32 supports float16/bfloat16");
        nogil release;
        auto* s = ptr<const float>(src);
        auto* d = ptr<uint16_t>(dst);
        parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) d[i] = t == DType::Float16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
        });
      },
      "Convert n float32 values at src to float16/bfloat16 bits at dst.");
  m.def(
      "convert_to_f32", [](uintptr_t src, uintptr_t dst, int64_t n, int dtype) {
        const DType t = dtype_from_code(dtype);
        check<TypeError>(t == DType::Float16 || t == DType::BFloat16, "convert_to_f32 supports float16/bfloat16");
        nogil release;
        auto* s = ptr<const uint16_t>(src);
        auto* d = ptr<float>(dst);
        parallel_for(0, n, 1 << 14, [&](int64_t lo, int64_t hi) {
          for (int64_t i = lo; i < hi; ++i) d[i] = t == DType::Float16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
        });
      },
      "Convert n float16/bfloat16 values at src to float32 at dst.");

  m.def(
      "row_op",
      [](const std::string& op, std::vector<uintptr_t> chunks, int64_t rows_per_chunk, int64_t nrows,
         int64_t ncols, int64_t row_stride, int64_t col_stride, int dtype, uintptr_t idx, bool idx64, int64_t n,
         uintptr_t data, float alpha, bool on_device, uintptr_t stream) {
        RowOp o;
        if (op == "gather") o = RowOp::Gather;
        else if (op == "scatter") o = RowOp::Scatter;
        else if (op == "scatter_add") o = RowOp::ScatterAdd;
        else throw ValueError(str("unknown row op '", op, "'"));
        row_op(o, std::move(chunks), rows_per_chunk, nrows, ncols, row_stride, col_stride, dtype, idx, idx64, n, data,
               alpha, on_device, stream);
      },
      py::arg("op"), py::arg("chunks"), py::arg("rows_per_chunk"), py::arg("nrows"), py::arg("ncols"),
      py::arg("row_stride"), py::arg("col_stride"), py::arg("dtype"), py::arg("idx"), py::arg("idx64"), py::arg("n"),
      py::arg("data"), py::arg("alpha") = 1.0f, py::arg("on_device") = false, py::arg("stream") = 0,
      "Row gather / scatter / scatter-add over a table of chunks (raw pointers).");

  m.def(
      "fsync_path",
      [](const std::string& path) {
        nogil release;
        fsync_path(path);
      },
      py::arg("path"), "fsync a file or a directory by path (OSError with errno on failure).");
  m.def(
      "exchange_paths",
      [](const std::string& a, const std::string& b) {
        nogil release;
        return exchange_paths(a, b);
      },
      py::arg("a"), py::arg("b"),
      "Atomically swap two existing paths (renameat2 RENAME_EXCHANGE); False where unsupported.");

  m.def("random_token", &random_token, py::arg("nbytes") = 16, "Hex token of nbytes random bytes (getrandom).");

  py::class_<PyShm>(m, "ShmSegment", py::buffer_protocol())
      .def_static(
          "create", [](size_t size, const std::string& name) { return new PyShm(ShmSegment::create(size, name)); },
          py::arg("size"), py::arg("name") = "", "Create an owner-only (0600) segment and map it.")
      .def_static(
          "open", [](const std::string& name, size_t size) { return new PyShm(ShmSegment::open(name, size)); },
          py::arg("name"), py::arg("size"), "Map an existing segment.")
      .def("unlink", [](PyShm& s) { s.seg.unlink(); })
      .def_property_readonly("name", [](const PyShm& s) { return s.seg.name(); })
      .def_property_readonly("size", [](const PyShm& s) { return s.seg.size(); })
      .def_property_readonly("address", [](const PyShm& s) { return reinterpret_cast<uintptr_t>(s.seg.data()); })
      .def_property_readonly("linked", [](const PyShm& s) { return s.seg.linked(); })
      .def_buffer([](PyShm& s) {
        return py::buffer_info(s.seg.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.seg.size())}, {1});
      });
}
