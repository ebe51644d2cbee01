// _wholemem: native core of wholemem.
//
// - Segment: an owner-only POSIX shared-memory segment (distkit::ShmSegment)
//   exposed through the buffer protocol.
// - Table: the row table of a whole tensor over one or more chunks (raw addresses;
//   one chunk for a HOST tensor or a private part, one per rank for a CHUNKED tensor),
//   built once; gather / scatter / scatter-add on any window of it (a sub-tensor),
//   threaded on the CPU, CUDA kernels for a device table; the GIL is released.
// - optim_update: sparse SGD / Adagrad / LazyAdam / RMSProp row updates.
// - bytes_as_dlpack: raw memory as a torch tensor on a chosen device (dlpack_bytes.hpp).
// - atomic_add_i64: reference counts in node-shared memory (device chunk lifetimes).
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
#include "dlpack_bytes.hpp"
#include "graph_bindings.hpp"
#include "native.hpp"
#include "optim.hpp"
#include "window.hpp"

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

// The CPU drivers below are distkit/rows_cpu.hpp's, over a RowWindow instead of a
// RowTable: a sub-tensor's first row is not a chunk boundary, so a view cannot be
// described as a RowTable without copying the chunk array (see window.hpp).

/// Row gather with software prefetch of the rows a few iterations ahead: a random-row
/// gather is bound by memory latency, which the hardware prefetcher cannot hide because
/// the next row address is data dependent.
template <class T, class I>
void gather_rows(const RowWindow<T>& w, const I* idx, int64_t n, T* out) {
  constexpr int64_t kAhead = 8;
  const int64_t nc = w.ncols;
  const size_t bytes = static_cast<size_t>(nc) * sizeof(T);
  distkit::parallel_for(0, n, distkit::row_grain(static_cast<int64_t>(bytes)), [&](int64_t lo, int64_t hi) {
    if (!w.contiguous_rows()) {
      for (int64_t f = lo * nc; f < hi * nc; ++f) window_gather(w, idx, out, f);
      return;
    }
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kAhead < hi) {
        const char* r = reinterpret_cast<const char*>(w.row(static_cast<int64_t>(idx[i + kAhead])));
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, 0);
      }
      std::memcpy(out + i * nc, w.row(static_cast<int64_t>(idx[i])), bytes);
    }
  });
}

/// Column ranges per thread when indices may repeat, so "the last one wins" (scatter) and
/// "in index order" (scatter-add) hold whatever the thread count.
inline int64_t column_grain(int64_t n) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)); }

/// window[idx[i], :] = vals[i, :]; with duplicate indices the last write wins.
template <class T, class I>
void scatter_rows(const RowWindow<T>& w, const I* idx, int64_t n, const T* vals) {
  const int64_t nc = w.ncols;
  distkit::parallel_for(0, nc, column_grain(n), [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(idx[i]);
      if (w.contiguous_rows()) {
        std::memcpy(w.row(r) + c0, vals + i * nc + c0, (c1 - c0) * sizeof(T));
      } else {
        for (int64_t j = c0; j < c1; ++j) w.at(r, j) = vals[i * nc + j];
      }
    }
  });
}

/// window[idx[i], :] += alpha * vals[i, :]; duplicates accumulate in index order.
template <class T, class I>
void scatter_add_rows(const RowWindow<T>& w, const I* idx, int64_t n, const T* vals, float alpha) {
  const int64_t nc = w.ncols;
  distkit::parallel_for(0, nc, column_grain(n), [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = static_cast<int64_t>(idx[i]);
      for (int64_t j = c0; j < c1; ++j) distkit::add_scaled(w.at(r, j), vals[i * nc + j], alpha);
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

/// The row table of a whole wholemem tensor, built once when the tensor is made; every
/// view of the tensor runs its ops on it through a Window (see window.hpp). A device
/// table uploads its chunk addresses once (the only synchronising CUDA call), so ops
/// allocate nothing and can be captured into CUDA graphs.
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
      dev_chunks_ = cuda::upload_chunks(d_.chunks, device);  // freed in ~Table
    }
#else
    check<distkit::Error>(!on_device, "this build of wholemem has no CUDA support (built without nvcc)");
#endif
  }
  ~Table() {
#ifdef DISTKIT_WITH_CUDA
    cuda::free_chunks(dev_chunks_, d_.chunks.size(), device_);
#endif
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  /// The window rows [row0, row0 + nrows) x columns [col0, col0 + ncols); a negative
  /// count means "to the end of the table".
  Window window(int64_t row0, int64_t nrows, int64_t col0, int64_t ncols) const {
    if (nrows < 0) nrows = d_.nrows - row0;
    if (ncols < 0) ncols = d_.ncols - col0;
    check(row0 >= 0 && nrows >= 0 && row0 + nrows <= d_.nrows, "row window [", row0, ", ", row0 + nrows,
          ") is outside the table's ", d_.nrows, " rows");
    check(col0 >= 0 && ncols >= 0 && col0 + ncols <= d_.ncols, "column window [", col0, ", ", col0 + ncols,
          ") is outside the table's ", d_.ncols, " columns");
    return Window{row0, col0, nrows, ncols};
  }

  void op(RowOp op, const Window& w, uintptr_t idx, bool idx64, int64_t n, uintptr_t data, float alpha,
          uintptr_t stream) const {
    check(n >= 0, "negative number of indices ", n);
    if (n == 0) return;
    check(data != 0 && idx != 0, "null data or index pointer");
    if (on_device_) {
#ifdef DISTKIT_WITH_CUDA
      py::gil_scoped_release release;
      cuda::row_op(op, d_, dev_chunks_, device_, w, idx, idx64, n, data, alpha, stream);
      return;
#endif
    }
    py::gil_scoped_release release;
    distkit::dispatch(d_.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (idx64) {
        run<T, int64_t>(op, w, reinterpret_cast<const int64_t*>(idx), n, data, alpha);
      } else {
        run<T, int32_t>(op, w, reinterpret_cast<const int32_t*>(idx), n, data, alpha);
      }
    });
  }

  const TableDesc& desc() const { return d_; }
  bool on_device() const { return on_device_; }
  int device() const { return device_; }

 private:
  template <class T, class I>
  void run(RowOp op, const Window& win, const I* idx, int64_t n, uintptr_t data, float alpha) const {
    check_index_range(idx, n, win.nrows);
    if (win.ncols == 0) return;
    std::vector<T*> chunks(d_.chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = reinterpret_cast<T*>(d_.chunks[i]);
    const distkit::RowTable<T> base{chunks.data(), d_.rows_per_chunk, d_.nrows, d_.ncols, d_.row_stride,
                                    d_.col_stride};
    const RowWindow<T> w{base, win.row0, win.col0, win.nrows, win.ncols};
    T* p = reinterpret_cast<T*>(data);
    switch (op) {
      case RowOp::Gather: gather_rows(w, idx, n, p); break;
      case RowOp::Scatter: scatter_rows(w, idx, n, static_cast<const T*>(p)); break;
      case RowOp::ScatterAdd: scatter_add_rows(w, idx, n, static_cast<const T*>(p), alpha); break;
    }
  }

  TableDesc d_;
  bool on_device_ = false;
  int device_ = -1;
  uintptr_t dev_chunks_ = 0;  // device copy of d_.chunks and the error word (device tables only)
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
  m.def(
      "atomic_add_i64",
      [](uintptr_t addr, int64_t delta) {
        check(addr != 0 && addr % alignof(int64_t) == 0, "atomic_add_i64 needs an aligned, non-null address");
        return __atomic_add_fetch(reinterpret_cast<int64_t*>(addr), delta, __ATOMIC_ACQ_REL);
      },
      py::arg("addr"), py::arg("delta"),
      "Atomically add delta to the int64 at addr (e.g. in shared memory) and return the new value.");
  m.def("bytes_as_dlpack", &dlpack::bytes_capsule, py::arg("ptr"), py::arg("nbytes"), py::arg("device_type"),
        py::arg("device_id"), py::arg("owner"),
        "A DLPack capsule of nbytes uint8 at ptr on (device_type: 1 CPU, 2 CUDA; device_id), keeping owner "
        "alive until the consumer frees it (torch.from_dlpack).");
  m.attr("DLPACK_CPU") = dlpack::kDLCPU;
  m.attr("DLPACK_CUDA") = dlpack::kDLCUDA;

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
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t out, uintptr_t stream, int64_t row0,
             int64_t nrows, int64_t col0, int64_t ncols) {
            t.op(RowOp::Gather, t.window(row0, nrows, col0, ncols), idx, idx64, n, out, 1.0f, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("out"), py::arg("stream") = 0, py::kw_only(),
          py::arg("row0") = 0, py::arg("nrows") = -1, py::arg("col0") = 0, py::arg("ncols") = -1,
          "out[i, :] = window[idx[i], :] (out contiguous [n, ncols]); the window is rows [row0, row0 + nrows) "
          "and columns [col0, col0 + ncols) of the table (-1: to the end), indices relative to row0.")
      .def(
          "scatter",
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t vals, uintptr_t stream, int64_t row0,
             int64_t nrows, int64_t col0, int64_t ncols) {
            t.op(RowOp::Scatter, t.window(row0, nrows, col0, ncols), idx, idx64, n, vals, 1.0f, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("values"), py::arg("stream") = 0, py::kw_only(),
          py::arg("row0") = 0, py::arg("nrows") = -1, py::arg("col0") = 0, py::arg("ncols") = -1,
          "window[idx[i], :] = values[i, :] (last duplicate wins).")
      .def(
          "scatter_add",
          [](const Table& t, uintptr_t idx, bool idx64, int64_t n, uintptr_t vals, float alpha, uintptr_t stream,
             int64_t row0, int64_t nrows, int64_t col0, int64_t ncols) {
            t.op(RowOp::ScatterAdd, t.window(row0, nrows, col0, ncols), idx, idx64, n, vals, alpha, stream);
          },
          py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("values"), py::arg("alpha") = 1.0f,
          py::arg("stream") = 0, py::kw_only(), py::arg("row0") = 0, py::arg("nrows") = -1, py::arg("col0") = 0,
          py::arg("ncols") = -1, "window[idx[i], :] += alpha * values[i, :].")
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

  // the optimizer kinds and their number of state arrays: Python takes both from here
  for (auto [name, kind] : {std::pair{"OPTIM_SGD", OptKind::SGD}, std::pair{"OPTIM_ADAGRAD", OptKind::Adagrad},
                            std::pair{"OPTIM_LAZY_ADAM", OptKind::LazyAdam}, std::pair{"OPTIM_RMSPROP", OptKind::RMSProp}})
    m.attr(name) = static_cast<int>(kind);
  m.def(
      "optim_num_states",
      [](int kind) {
        check(kind >= 0 && kind <= 3, "unknown optimizer kind ", kind);
        return num_states(static_cast<OptKind>(kind));
      },
      py::arg("kind"), "Number of [rows, cols] state arrays the optimizer kind keeps.");
  m.def("optim_update", &optim_update, py::arg("kind"), py::arg("table"), py::arg("idx"), py::arg("n"),
        py::arg("grad"), py::arg("state0"), py::arg("state1"), py::arg("row_state"), py::arg("lr"),
        py::arg("weight_decay"), py::arg("eps"), py::arg("beta1"), py::arg("beta2"), py::arg("alpha"),
        py::arg("stream") = 0,
        "Sparse optimizer step on the unique local rows idx (int64) of a single-chunk table "
        "(row_state: LazyAdam's per-row {beta1^t, beta2^t}, [rows, 2]).");

  wholemem::graph::register_graph(m);

#ifdef DISTKIT_WITH_CUDA
  m.def("ipc_get_handle", [](uintptr_t p) { return py::bytes(cuda::ipc_get_handle(p)); }, py::arg("ptr"));
  m.def(
      "ipc_open_handle", [](const py::bytes& h, int device) { return cuda::ipc_open_handle(std::string(h), device); },
      py::arg("handle"), py::arg("device"), "Map a peer's allocation for `device` (lazy peer access).");
  m.def("ipc_close_handle", &cuda::ipc_close_handle, py::arg("ptr"), py::arg("device"));
  m.def("device_alloc", &cuda::device_alloc, py::arg("nbytes"), py::arg("device"),
        "cudaMalloc of nbytes on device, zero-filled and synchronised.");
  m.def("device_free", &cuda::device_free, py::arg("ptr"), py::arg("device"));
  m.def("device_synchronize", &cuda::device_synchronize, py::arg("device"), "cudaDeviceSynchronize of device.");
  m.def(
      "check_indices_device",
      [](uintptr_t idx, bool idx64, int64_t n, int64_t nrows, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        cuda::check_indices(idx, idx64, n, nrows, device, stream);
      },
      py::arg("idx"), py::arg("idx64"), py::arg("n"), py::arg("nrows"), py::arg("device"), py::arg("stream"),
      "IndexError naming the first of n device-resident indices outside [0, nrows) (synchronises the stream; "
      "nothing while it is captured into a CUDA graph).");
  m.def("host_register", &cuda::host_register, py::arg("addr"), py::arg("nbytes"), py::arg("device"),
        "cudaHostRegister(portable | mapped) of host memory; returns its device address.");
  m.def("host_unregister", &cuda::host_unregister, py::arg("addr"));
#else
  m.def("ipc_get_handle", [](uintptr_t) -> py::bytes { no_cuda("ipc_get_handle"); }, py::arg("ptr"));
  m.def(
      "ipc_open_handle", [](const py::bytes&, int) -> uintptr_t { no_cuda("ipc_open_handle"); }, py::arg("handle"),
      py::arg("device"));
  m.def("ipc_close_handle", [](uintptr_t, int) { no_cuda("ipc_close_handle"); }, py::arg("ptr"), py::arg("device"));
  m.def(
      "device_alloc", [](size_t, int) -> uintptr_t { no_cuda("device_alloc"); }, py::arg("nbytes"),
      py::arg("device"));
  m.def("device_free", [](uintptr_t, int) { no_cuda("device_free"); }, py::arg("ptr"), py::arg("device"));
  m.def("device_synchronize", [](int) { no_cuda("device_synchronize"); }, py::arg("device"));
  m.def(
      "check_indices_device",
      [](uintptr_t, bool, int64_t, int64_t, int, uintptr_t) { no_cuda("check_indices_device"); }, py::arg("idx"),
      py::arg("idx64"), py::arg("n"), py::arg("nrows"), py::arg("device"), py::arg("stream"));
  m.def(
      "host_register", [](uintptr_t, size_t, int) -> uintptr_t { no_cuda("host_register"); }, py::arg("addr"),
      py::arg("nbytes"), py::arg("device"));
  m.def("host_unregister", [](uintptr_t) { no_cuda("host_unregister"); }, py::arg("addr"));
#endif
}
