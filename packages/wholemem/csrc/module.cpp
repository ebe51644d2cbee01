// _wholemem: native core of wholemem.
//
// - Segment: an owner-only POSIX shared-memory segment (distkit::ShmSegment)
//   exposed through the buffer protocol.
// - Table: a row table over one or more chunks (raw addresses; one chunk for a
//   HOST tensor or a private part, one per rank for a CHUNKED tensor) with
//   threaded gather / scatter / scatter-add that release the GIL.
// - optim_update: sparse SGD / Adagrad / LazyAdam / RMSProp row updates.
// No libtorch: Python passes addresses (tensor.data_ptr()), sizes and dtype codes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "distkit/dtype.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "distkit/rows_cpu.hpp"
#include "distkit/shm.hpp"
#include "graph_bindings.hpp"
#include "native.hpp"
#include "optim.hpp"

namespace py = pybind11;
using distkit::check;
using distkit::DType;

namespace wholemem {
namespace {

class PySegment {
 public:
  explicit PySegment(distkit::ShmSegment s) : seg(std::move(s)) {}
  distkit::ShmSegment seg;
};

/// Contiguous-row gather with software prefetch of the rows a few iterations ahead:
/// a random-row gather is bound by memory latency, which the hardware prefetcher
/// cannot hide because the next row address is data dependent.
template <class T, class I>
void gather_rows_prefetch(const distkit::RowTable<T>& t, const I* idx, int64_t n, T* out) {
  constexpr int64_t kAhead = 8;
  const int64_t nc = t.ncols;
  const size_t bytes = static_cast<size_t>(nc) * sizeof(T);
  distkit::parallel_for(0, n, distkit::row_grain(static_cast<int64_t>(bytes)), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kAhead < hi) {
        const char* r = reinterpret_cast<const char*>(t.row(static_cast<int64_t>(idx[i + kAhead])));
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, 0);
      }
      std::memcpy(out + i * nc, t.row(static_cast<int64_t>(idx[i])), bytes);
    }
  });
}

/// IndexError naming the first index outside [0, nrows). A serial scan below a few
/// million indices: it costs microseconds and never waits for a pool wake-up.
template <class I>
void check_index_range(const I* idx, int64_t n, int64_t nrows) {
  if (n > (int64_t(1) << 22)) {
    distkit::check_indices(idx, n, nrows);
    return;
  }
  const int64_t pos = distkit::first_bad_index(idx, n, nrows);
  if (pos >= 0) {
    throw distkit::IndexError(distkit::str("index ", static_cast<int64_t>(idx[pos]), " at position ", pos,
                                           " is out of range for ", nrows, " rows"));
  }
}

class Table {
 public:
  Table(std::vector<uintptr_t> chunks, int64_t rows_per_chunk, int64_t nrows, int64_t ncols, int64_t row_stride,
        int64_t col_stride, int dtype, bool on_device, int device) {
    check(!chunks.empty(), "a table needs at least one chunk");
    check(rows_per_chunk > 0, "rows_per_chunk must be positive, got ", rows_per_chunk);
    check(nrows >= 0 && ncols >= 0, "negative table size ", nrows, " x ", ncols);
    check(static_cast<int64_t>(chunks.size()) * rows_per_chunk >= nrows, "chunk table of ", chunks.size(),
          " chunks x ", rows_per_chunk, " rows cannot hold ", nrows, " rows");
    d_.chunks = std::move(chunks);
    d_.rows_per_chunk = rows_per_chunk;
    d_.nrows = nrows;
    d_.ncols = ncols;
    d_.row_stride = row_stride;
    d_.col_stride = col_stride;
    d_.dtype = distkit::dtype_from_code(dtype);
    on_device_ = on_device;
    device_ = device;
#ifdef DISTKIT_WITH_CUDA
    if (on_device_) {
      check(device >= 0, "a device table needs a CUDA device index, got ", device);
      dev_chunks_ = cuda::upload_chunks(d_.chunks, device);  // the device chunk table, freed in ~Table
    }
#else
    check<distkit::Error>(!on_device, "this build of wholemem has no CUDA support (built without nvcc)");
#endif
  }
  ~Table() {
#ifdef DISTKIT_WITH_CUDA
    cuda::free_chunks(dev_chunks_, device_);
#endif
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  void op(RowOp op, uintptr_t idx, bool idx64, int64_t n, uintptr_t data, float alpha, uintptr_t stream) const {
    check(n >= 0, "negative number of indices ", n);
    if (n == 0) return;
    check(data != 0 && idx != 0, "null data or index pointer");
    if (on_device_) {
#ifdef DISTKIT_WITH_CUDA
      py::gil_scoped_release release;
      cuda::row_op(op, d_, dev_chunks_, device_, idx, idx64, n, data, alpha, stream);
      return;
#endif
    }
    py::gil_scoped_release release;
    distkit::dispatch(d_.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (idx64) {
        run<T, int64_t>(op, reinterpret_cast<const int64_t*>(idx), n, data, alpha);
      } else {
        run<T, int32_t>(op, reinterpret_cast<const int32_t*>(idx), n, data, alpha);
      }
    });
  }

  const TableDesc& desc() const { return d_; }
  bool on_device() const { return on_device_; }
  int device() const { return device_; }

 private:
  template <class T, class I>
  void run(RowOp op, const I* idx, int64_t n, uintptr_t data, float alpha) const {
    check_index_range(idx, n, d_.nrows);
    std::vector<T*> chunks(d_.chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = reinterpret_cast<T*>(d_.chunks[i]);
    distkit::RowTable<T> t{chunks.data(), d_.rows_per_chunk, d_.nrows, d_.ncols, d_.row_stride, d_.col_stride};
    T* p = reinterpret_cast<T*>(data);
    switch (op) {
      case RowOp::Gather:
        if (t.contiguous_rows()) {
          gather_rows_prefetch(t, idx, n, p);
        } else {
          distkit::gather_rows_cpu(t, idx, n, p);
        }
        break;
      case RowOp::Scatter: distkit::scatter_rows_cpu(t, idx, n, static_cast<const T*>(p)); break;
      case RowOp::ScatterAdd: distkit::scatter_add_rows_cpu(t, idx, n, static_cast<const T*>(p), alpha); break;
    }
  }

  TableDesc d_;
  bool on_device_ = false;
  int device_ = -1;
  uintptr_t dev_chunks_ = 0;  // device copy of d_.chunks (device tables only)
};

void optim_update(int kind, const Table& table, uintptr_t idx, int64_t n, uintptr_t grad, uintptr_t s0, uintptr_t s1,
                  uintptr_t row_state, float lr, float weight_decay, float eps, float beta1, float beta2, float alpha,
                  uintptr_t stream) {
  check(kind >= 0 && kind <= 3, "unknown optimizer kind ", kind);
  const TableDesc& d = table.desc();
  check(d.chunks.size() == 1, "optimizer updates need a single-chunk table, got ", d.chunks.size(), " chunks");
  const OptParams p{static_cast<OptKind>(kind), lr, weight_decay, eps, beta1, beta2, alpha};
  const int ns = num_states(p.kind);
  check(ns < 1 || s0 != 0, "optimizer state 0 is missing");
  check(ns < 2 || s1 != 0, "optimizer state 1 is missing");
  check(p.kind != OptKind::LazyAdam || row_state != 0, "the LazyAdam per-row state (beta1^t, beta2^t) is missing");
  if (n == 0 || d.ncols == 0) return;
  if (table.on_device()) {
#ifdef DISTKIT_WITH_CUDA
    py::gil_scoped_release release;
    cuda::optim_update(p, d, table.device(), idx, n, grad, s0, s1, row_state, stream);
    return;
#endif
  }
  py::gil_scoped_release release;
  const auto* ix = reinterpret_cast<const int64_t*>(idx);
  distkit::check_indices(ix, n, d.nrows, "row");
  distkit::dispatch_floating(d.dtype, [&](auto tag) {
    using T = decltype(tag);
    using A = distkit::acc_t<T>;
    T* w = reinterpret_cast<T*>(d.chunks[0]);
    const A* g = reinterpret_cast<const A*>(grad);
    A* a0 = reinterpret_cast<A*>(s0);
    A* a1 = reinterpret_cast<A*>(s1);
    A* rs = reinterpret_cast<A*>(row_state);
    const int64_t nc = d.ncols;
    // rows are unique, so each row (its elements, then its row state) belongs to one thread
    distkit::parallel_for(0, n, distkit::row_grain(nc * int64_t(sizeof(A)) * 4), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        for (int64_t f = i * nc; f < (i + 1) * nc; ++f)
          optim_update_element<T>(p, w, d.row_stride, d.col_stride, nc, ix, g, a0, a1, rs, f);
        if (rs) optim_row_state<A>(p, rs + 2 * ix[i]);
      }
    });
  });
}

int cuda_device_count() {
#ifdef DISTKIT_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

#ifndef DISTKIT_WITH_CUDA
[[noreturn]] void no_cuda(const char* what) {
  throw distkit::Error(distkit::str(what, " needs CUDA, and this build of wholemem has no CUDA support"));
}
#endif

}  // namespace
}  // namespace wholemem

PYBIND11_MODULE(_wholemem, m) {
  using namespace wholemem;
  m.doc() = "native core of wholemem (shared-memory segments, row tables, sparse optimizers)";
  distkit::init_module(m);
  m.def("cuda_device_count", &cuda_device_count, "Visible CUDA devices (0 without CUDA support or devices).");
  m.def(
      "check_indices",
      [](uintptr_t idx, bool idx64, int64_t n, int64_t nrows) {
        py::gil_scoped_release release;
        if (idx64) {
          check_index_range(reinterpret_cast<const int64_t*>(idx), n, nrows);
        } else {
          check_index_range(reinterpret_cast<const int32_t*>(idx), n, nrows);
        }
      },
      py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("nrows"),
      "IndexError naming the first of n indices outside [0, nrows).");
  m.def("random_token", &distkit::random_token, py::arg("nbytes") = 16, "Hex token of nbytes random bytes.");

  py::class_<PySegment>(m, "Segment", py::buffer_protocol())
      .def_static(
          "create",
          [](size_t size, const std::string& prefix) {
            check(size > 0, "segment size must be positive, got ", size);
            return new PySegment(distkit::ShmSegment::create(size, "/" + prefix + distkit::random_token()));
          },
          py::arg("size"), py::arg("prefix") = "wholemem-", "Create an owner-only (0600) segment and map it.")
      .def_static(
          "open", [](const std::string& name, size_t size) { return new PySegment(distkit::ShmSegment::open(name, size)); },
          py::arg("name"), py::arg("size"), "Map an existing segment of at least size bytes.")
      .def("unlink", [](PySegment& s) { s.seg.unlink(); }, "Remove the name; the mapping stays valid.")
      .def_property_readonly("name", [](const PySegment& s) { return s.seg.name(); })
      .def_property_readonly("size", [](const PySegment& s) { return s.seg.size(); })
      .def_property_readonly("address", [](const PySegment& s) { return reinterpret_cast<uintptr_t>(s.seg.data()); })
      .def_property_readonly("linked", [](const PySegment& s) { return s.seg.linked(); })
      .def_buffer([](PySegment& s) {
        return py::buffer_info(s.seg.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.seg.size())}, {1});
      });

  py::class_<Table>(m, "Table")
      .def(py::init<std::vector<uintptr_t>, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int>(),
           py::arg("chunks"), py::arg("rows_per_chunk"), py::arg("nrows"), py::arg("ncols"), py::arg("row_stride"),
           py::arg("col_stride"), py::arg("dtype"), py::arg("on_device") = false, py::arg("device") = -1,
           "A row table; on_device=True: chunk addresses are device pointers (or host memory mapped for the "
           "device) and ops run CUDA kernels on `device`.")
      .def(
          "gather",
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t out, uintptr_t stream) {
            t.op(RowOp::Gather, idx, idx64, n, out, 1.0f, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("out"), py::arg("stream") = 0,
          "out[i, :] = table[idx[i], :] (out contiguous [n, ncols]).")
      .def(
          "scatter",
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t vals, uintptr_t stream) {
            t.op(RowOp::Scatter, idx, idx64, n, vals, 1.0f, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("values"), py::arg("stream") = 0,
          "table[idx[i], :] = values[i, :] (last duplicate wins).")
      .def(
          "scatter_add",
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t vals, float alpha, uintptr_t stream) {
            t.op(RowOp::ScatterAdd, idx, idx64, n, vals, alpha, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("values"), py::arg("alpha") = 1.0f,
          py::arg("stream") = 0, "table[idx[i], :] += alpha * values[i, :].")
      .def_property_readonly("address", [](const Table& t) { return reinterpret_cast<uintptr_t>(&t); })
      .def_property_readonly("chunks", [](const Table& t) { return t.desc().chunks; })
      .def_property_readonly("rows_per_chunk", [](const Table& t) { return t.desc().rows_per_chunk; })
      .def_property_readonly("nrows", [](const Table& t) { return t.desc().nrows; })
      .def_property_readonly("ncols", [](const Table& t) { return t.desc().ncols; })
      .def_property_readonly("row_stride", [](const Table& t) { return t.desc().row_stride; })
      .def_property_readonly("col_stride", [](const Table& t) { return t.desc().col_stride; })
      .def_property_readonly("dtype", [](const Table& t) { return static_cast<int>(t.desc().dtype); })
      .def_property_readonly("on_device", &Table::on_device)
      .def_property_readonly("device", &Table::device);

  m.def("optim_update", &optim_update, py::arg("kind"), py::arg("table"), py::arg("idx"), py::arg("n"),
        py::arg("grad"), py::arg("state0"), py::arg("state1"), py::arg("row_state"), py::arg("lr"),
        py::arg("weight_decay"), py::arg("eps"), py::arg("beta1"), py::arg("beta2"), py::arg("alpha"),
        py::arg("stream") = 0,
        "Sparse optimizer step on the unique local rows idx (int64) of a single-chunk table "
        "(row_state: LazyAdam's per-row {beta1^t, beta2^t}, [rows, 2]).");

  wholemem::graph::register_graph(m);

#ifdef DISTKIT_WITH_CUDA
  m.def("ipc_get_handle", [](uintptr_t p) { return py::bytes(cuda::ipc_get_handle(p)); });
  m.def("ipc_open_handle", [](const py::bytes& h, int device) { return cuda::ipc_open_handle(std::string(h), device); });
  m.def("ipc_close_handle", &cuda::ipc_close_handle);
  m.def("device_alloc", &cuda::device_alloc, py::arg("nbytes"), py::arg("device"),
        "cudaMalloc of nbytes on device, zero-filled and synchronised.");
  m.def("device_free", &cuda::device_free, py::arg("ptr"), py::arg("device"));
  m.def("host_register", &cuda::host_register, py::arg("addr"), py::arg("nbytes"), py::arg("device"),
        "cudaHostRegister(portable | mapped) of host memory; returns its device address.");
  m.def("host_unregister", &cuda::host_unregister, py::arg("addr"));
#else
  m.def("ipc_get_handle", [](uintptr_t) -> py::bytes { no_cuda("ipc_get_handle"); });
  m.def("ipc_open_handle", [](const py::bytes&, int) -> uintptr_t { no_cuda("ipc_open_handle"); });
  m.def("ipc_close_handle", [](uintptr_t) { no_cuda("ipc_close_handle"); });
  m.def(
      "device_alloc", [](size_t, int) -> uintptr_t { no_cuda("device_alloc"); }, py::arg("nbytes"),
      py::arg("device"));
  m.def("device_free", [](uintptr_t, int) { no_cuda("device_free"); }, py::arg("ptr"), py::arg("device"));
  m.def(
      "host_register", [](uintptr_t, size_t, int) -> uintptr_t { no_cuda("host_register"); }, py::arg("addr"),
      py::arg("nbytes"), py::arg("device"));
  m.def("host_unregister", [](uintptr_t) { no_cuda("host_unregister"); }, py::arg("addr"));
#endif
}
