// _mpiad: native core of mpiad.
//
// Every entry point takes the communicator as mpi4py's integer `Comm.handle`,
// buffers as raw addresses (`tensor.data_ptr()`), element counts and a distkit
// dtype code; it releases the GIL for the MPI call. Non-blocking requests keep
// a Python reference to their buffers until they complete.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "ops.hpp"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

namespace py = pybind11;
using distkit::DType;
using distkit::check;
namespace dmpi = distkit::mpi;

namespace {

MPI_Comm C(uintptr_t h) {
  check<distkit::Error>(dmpi::initialized(), "MPI is not initialised (import mpi4py.MPI first) or already finalised");
  MPI_Comm c = dmpi::comm_from_handle(h);
  check<distkit::ValueError>(c != MPI_COMM_NULL, "communicator is MPI_COMM_NULL");
  return c;
}

int as_int(int64_t v, const char* what) {
  check<distkit::ValueError>(v >= 0 && v <= INT_MAX, what, " = ", v, " does not fit an MPI count (0..", INT_MAX, ")");
  return static_cast<int>(v);
}

std::vector<int> as_ints(const std::vector<int64_t>& v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = as_int(v[i], what);
  return out;
}

void* P(uintptr_t p) { return distkit::ptr<void>(p); }

DType D(int64_t code) { return distkit::dtype_from_code(code); }

int comm_size(MPI_Comm c) {
  int n = 0;
  dmpi::check(MPI_Comm_size(c, &n), "MPI_Comm_size");
  return n;
}

void check_len(const std::vector<int64_t>& v, int n, const char* what) {
  check<distkit::ValueError>(static_cast<int>(v.size()) == n, what, " has ", v.size(), " entries, expected ", n);
}

/// One int entry per rank of c (counts or displacements of a v-collective).
std::vector<int> per_rank(const std::vector<int64_t>& v, MPI_Comm c, const char* what) {
  check_len(v, comm_size(c), what);
  return as_ints(v, what);
}

/// A pending non-blocking operation; holds its buffers until it completes.
struct Request {
  MPI_Request req = MPI_REQUEST_NULL;
  py::object keep;
  bool done = false;

  void wait() {
    if (done) return;
    {
      distkit::nogil g;
      dmpi::check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
    }
    done = true;
    keep = py::none();
  }
  bool test() {
    if (done) return true;
    int flag = 0;
    dmpi::check(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) {
      done = true;
      keep = py::none();
    }
    return flag != 0;
  }
  ~Request() {
    if (!done && req != MPI_REQUEST_NULL && dmpi::initialized()) {
      // Never waited for: let MPI finish it in the background and leak the
      // buffers on purpose (freeing them could corrupt memory).
      MPI_Request_free(&req);
      if (keep) keep.inc_ref();
    }
  }
};

/// Set the Python exception matching a C++ one (as distkit::register_exceptions does).
PyObject* raise_from(const std::exception& e) {
  if (dynamic_cast<const distkit::TypeError*>(&e)) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } else if (dynamic_cast<const distkit::ValueError*>(&e) || dynamic_cast<const distkit::IndexError*>(&e)) {
    PyErr_SetString(dynamic_cast<const distkit::ValueError*>(&e) ? PyExc_ValueError : PyExc_IndexError, e.what());
  } else {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

/// allreduce_fast(comm, send, recv, nbytes, dtype, op): MPI_Allreduce of `nbytes`
/// bytes, as a METH_FASTCALL function: the latency path skips pybind11's argument
/// conversion (~150 ns of an 8-byte call here). Same checks and errors as
/// `allreduce` (raised before any communication); MINLOC/MAXLOC reduce pairs.
PyObject* allreduce_fast(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "allreduce_fast(comm, send, recv, nbytes, dtype, op) takes 6 integers");
    return nullptr;
  }
  const uintptr_t h = PyLong_AsUnsignedLongLong(args[0]);
  const uintptr_t send = PyLong_AsUnsignedLongLong(args[1]);
  const uintptr_t recv = PyLong_AsUnsignedLongLong(args[2]);
  const long long nbytes = PyLong_AsLongLong(args[3]);
  const long long code = PyLong_AsLongLong(args[4]);
  const long long op = PyLong_AsLongLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MPI_Op o = MPI_OP_NULL;
  MPI_Comm c = MPI_COMM_NULL;
  int n = 0;
  try {
    c = C(h);
    const DType d = D(code);
    const long long item = static_cast<long long>(distkit::itemsize(d)) * (op == mpiad::kMinloc || op == mpiad::kMaxloc ? 2 : 1);
    check<distkit::ValueError>(nbytes >= 0 && nbytes % item == 0, "nbytes = ", nbytes, " is not a multiple of ", item);
    mpiad::resolve(op, d, &t, &o);
    n = as_int(nbytes / item, "count");
  } catch (const std::exception& e) {
    return raise_from(e);
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = MPI_Allreduce(send == recv ? MPI_IN_PLACE : P(send), P(recv), n, t, o, c);
  Py_END_ALLOW_THREADS
  try {
    dmpi::check(rc, "MPI_Allreduce");
  } catch (const std::exception& e) {
    return raise_from(e);
  }
  Py_RETURN_NONE;
}

PyMethodDef g_allreduce_fast_def = {
    "allreduce_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&allreduce_fast)),
    METH_FASTCALL,
    "allreduce_fast(comm, send, recv, nbytes, dtype, op): MPI_Allreduce of nbytes bytes (the latency path)."};

}  // namespace

PYBIND11_MODULE(_mpiad, m) {
  m.doc() = "native core of mpiad";
  distkit::init_module(m);
  m.def("mpi_library_version", &distkit::mpi::library_version);
  m.def("cuda_aware", [] {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() != 0;
#else
    return false;
#endif
  }, "Whether the MPI library accepts CUDA device pointers (MPIX_Query_cuda_support).");
  m.def("thread_level", [] {
    int level = 0;
    dmpi::check(MPI_Query_thread(&level), "MPI_Query_thread");
    return level == MPI_THREAD_MULTIPLE ? 3 : level == MPI_THREAD_SERIALIZED ? 2 : level == MPI_THREAD_FUNNELED ? 1 : 0;
  });
  m.def("check_op", [](int64_t op, int64_t dtype) { mpiad::check_op_dtype(op, D(dtype)); },
        "Raise TypeError/ValueError when reduction `op` is not defined for `dtype`.");

  m.def("comm_rank", [](uintptr_t h) {
    int r = 0;
    dmpi::check(MPI_Comm_rank(C(h), &r), "MPI_Comm_rank");
    return r;
  });
  m.def("comm_size", [](uintptr_t h) { return comm_size(C(h)); });
  m.def("barrier", [](uintptr_t h) {
    MPI_Comm c = C(h);
    distkit::nogil g;
    dmpi::check(MPI_Barrier(c), "MPI_Barrier");
  });

  m.def("allreduce", [](uintptr_t h, uintptr_t send, uintptr_t recv, int64_t count, int64_t dtype, int64_t op,
                        int algo) {
    MPI_Comm c = C(h);
    MPI_Datatype t;
    MPI_Op o;
    mpiad::resolve(op, D(dtype), &t, &o);
    if (op == mpiad::kMinloc || op == mpiad::kMaxloc) count /= 2;
    int n = as_int(count, "count");
    if (algo == 1) {
      // reduce to rank 0, then broadcast: on one shared-memory node with
      // single-copy transfers this beats Open MPI's default for large messages
      int rank = 0;
      dmpi::check(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
      distkit::nogil g;
      if (rank == 0) {
        dmpi::check(MPI_Reduce(send == recv ? MPI_IN_PLACE : P(send), P(recv), n, t, o, 0, c), "MPI_Reduce");
      } else {
        dmpi::check(MPI_Reduce(P(send), nullptr, n, t, o, 0, c), "MPI_Reduce");
      }
      dmpi::check(MPI_Bcast(P(recv), n, t, 0, c), "MPI_Bcast");
      return;
    }
    distkit::nogil g;
    dmpi::check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : P(send), P(recv), n, t, o, c), "MPI_Allreduce");
  }, py::arg("comm"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
     py::arg("algo") = 0, "algo 0: MPI_Allreduce; 1: MPI_Reduce to rank 0 + MPI_Bcast.");

  m.attr("allreduce_fast") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_allreduce_fast_def, nullptr, m.attr("__name__").ptr()));

  m.def("comm_is_shared", [](uintptr_t h) {
    MPI_Comm c = C(h);
    MPI_Comm node;
    int same = 0;
    {
      distkit::nogil g;
      dmpi::check(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
      int n = 0;
      MPI_Comm_size(node, &n);
      int mine = n == comm_size(c) ? 1 : 0;
      dmpi::check(MPI_Allreduce(&mine, &same, 1, MPI_INT, MPI_LAND, c), "MPI_Allreduce");
      MPI_Comm_free(&node);
    }
    return same != 0;
  }, "Collective: whether every rank of the communicator shares one node's memory.");

  m.def("reduce", [](uintptr_t h, uintptr_t send, uintptr_t recv, int64_t count, int64_t dtype, int64_t op,
                     int root) {
    MPI_Comm c = C(h);
    MPI_Datatype t;
    MPI_Op o;
    mpiad::resolve(op, D(dtype), &t, &o);
    if (op == mpiad::kMinloc || op == mpiad::kMaxloc) count /= 2;
    int n = as_int(count, "count");
    int rank = 0;
    dmpi::check(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
    const void* sb = (send == recv && rank == root) ? MPI_IN_PLACE : P(send);
    distkit::nogil g;
    dmpi::check(MPI_Reduce(sb, P(recv), n, t, o, root, c), "MPI_Reduce");
  });

  m.def("reduce_scatter", [](uintptr_t h, uintptr_t send, uintptr_t recv, std::vector<int64_t> counts,
                             int64_t dtype, int64_t op) {
    MPI_Comm c = C(h);
    check_len(counts, comm_size(c), "counts");
    MPI_Datatype t;
    MPI_Op o;
    mpiad::resolve(op, D(dtype), &t, &o);
    check<distkit::TypeError>(op != mpiad::kMinloc && op != mpiad::kMaxloc, "Reduce_scatter does not support ",
                              mpiad::op_name(op));
    auto n = as_ints(counts, "counts");
    distkit::nogil g;
    dmpi::check(MPI_Reduce_scatter(P(send), P(recv), n.data(), t, o, c), "MPI_Reduce_scatter");
  });

  m.def("bcast", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int root) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Bcast(P(buf), n, t, root, c), "MPI_Bcast");
  });

  m.def("allgather_i64", [](uintptr_t h, std::vector<int64_t> values) {
    MPI_Comm c = C(h);
    const int size = comm_size(c);
    const int n = static_cast<int>(values.size());
    std::vector<int64_t> out(static_cast<size_t>(n) * size);
    {
      distkit::nogil g;
      dmpi::check(MPI_Allgather(values.data(), n, MPI_INT64_T, out.data(), n, MPI_INT64_T, c), "MPI_Allgather");
    }
    return out;
  }, "Every rank's `values` (same length everywhere), concatenated in rank order.");

  m.def("allgather", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, int64_t dtype) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Allgather(P(send), n, t, P(recv), n, t, c), "MPI_Allgather");
  });

  m.def("gatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, std::vector<int64_t> counts,
                      std::vector<int64_t> displs, int64_t dtype, int root) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int rank = 0;
    dmpi::check(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
    std::vector<int> rc, rd;
    if (rank == root) {
      rc = per_rank(counts, c, "counts");
      rd = per_rank(displs, c, "displs");
    }
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Gatherv(P(send), n, t, P(recv), rc.data(), rd.data(), t, root, c), "MPI_Gatherv");
  });

  m.def("allgatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, std::vector<int64_t> counts,
                         std::vector<int64_t> displs, int64_t dtype) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    auto rc = per_rank(counts, c, "counts");
    auto rd = per_rank(displs, c, "displs");
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Allgatherv(P(send), n, t, P(recv), rc.data(), rd.data(), t, c), "MPI_Allgatherv");
  });

  m.def("scatterv", [](uintptr_t h, uintptr_t send, std::vector<int64_t> counts, std::vector<int64_t> displs,
                       uintptr_t recv, int64_t count, int64_t dtype, int root) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int rank = 0;
    dmpi::check(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
    std::vector<int> sc, sd;
    if (rank == root) {
      sc = per_rank(counts, c, "counts");
      sd = per_rank(displs, c, "displs");
    }
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Scatterv(P(send), sc.data(), sd.data(), t, P(recv), n, t, root, c), "MPI_Scatterv");
  });

  m.def("alltoallv", [](uintptr_t h, uintptr_t send, std::vector<int64_t> scounts, std::vector<int64_t> sdispls,
                        uintptr_t recv, std::vector<int64_t> rcounts, std::vector<int64_t> rdispls, int64_t dtype) {
    MPI_Comm c = C(h);
    const int size = comm_size(c);
    for (auto* v : {&scounts, &sdispls, &rcounts, &rdispls}) check_len(*v, size, "alltoallv counts/displs");
    MPI_Datatype t = dmpi::datatype(D(dtype));
    auto sc = as_ints(scounts, "send counts"), sd = as_ints(sdispls, "send displs");
    auto rc = as_ints(rcounts, "recv counts"), rd = as_ints(rdispls, "recv displs");
    distkit::nogil g;
    dmpi::check(MPI_Alltoallv(P(send), sc.data(), sd.data(), t, P(recv), rc.data(), rd.data(), t, c),
                "MPI_Alltoallv");
  });

  m.def("send", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int dest, int tag) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Send(P(buf), n, t, dest, tag, c), "MPI_Send");
  });
  m.def("recv", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int source, int tag) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    distkit::nogil g;
    dmpi::check(MPI_Recv(P(buf), n, t, source, tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
  });
  m.def("sendrecv", [](uintptr_t h, uintptr_t sbuf, int64_t scount, int dest, int stag, uintptr_t rbuf,
                       int64_t rcount, int source, int rtag, int64_t dtype) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int sn = as_int(scount, "send count"), rn = as_int(rcount, "recv count");
    distkit::nogil g;
    dmpi::check(MPI_Sendrecv(P(sbuf), sn, t, dest, stag, P(rbuf), rn, t, source, rtag, c, MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
  });

  py::class_<Request>(m, "Request", "A pending MPI_Isend / MPI_Irecv; keeps its buffers alive until done.")
      .def("wait", &Request::wait, "Block until the operation completes (GIL released).")
      .def("test", &Request::test, "Whether the operation has completed.")
      .def_property_readonly("done", [](const Request& r) { return r.done; });

  m.def("isend", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int dest, int tag, py::object keep) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    auto r = std::make_unique<Request>();
    r->keep = std::move(keep);
    dmpi::check(MPI_Isend(P(buf), n, t, dest, tag, c, &r->req), "MPI_Isend");
    return r;
  }, "Start a send; `keep` (the buffer's owner) stays referenced until the request completes.");
  m.def("irecv", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int source, int tag, py::object keep) {
    MPI_Comm c = C(h);
    MPI_Datatype t = dmpi::datatype(D(dtype));
    int n = as_int(count, "count");
    auto r = std::make_unique<Request>();
    r->keep = std::move(keep);
    dmpi::check(MPI_Irecv(P(buf), n, t, source, tag, c, &r->req), "MPI_Irecv");
    return r;
  }, "Start a receive into `buf`; `keep` stays referenced until the request completes.");
}
