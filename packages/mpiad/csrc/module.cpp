// _mpiad: native core of mpiad (the bindings; the MPI calls are in collectives.hpp,
// the non-blocking engine in engine.hpp, large counts in bigcount.hpp).
//
// Every entry point takes the communicator as mpi4py's integer `Comm.handle`,
// buffers as raw addresses (`tensor.data_ptr()`), element counts (int64) and a
// distkit dtype code; it validates before any communication and releases the GIL
// for the MPI call. Non-blocking requests keep a Python reference to their
// buffers until they complete.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "collectives.hpp"
#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "engine.hpp"
#include "ops.hpp"
#include "tensor_fast.hpp"

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>
#endif

namespace py = pybind11;
using distkit::check;
using distkit::DType;
namespace dmpi = distkit::mpi;
using I64s = std::vector<int64_t>;

namespace {

MPI_Comm C(uintptr_t h) {
  check<distkit::Error>(dmpi::initialized(), "MPI is not initialised (import mpi4py.MPI first) or already finalised");
  MPI_Comm c = dmpi::comm_from_handle(h);
  check<distkit::ValueError>(c != MPI_COMM_NULL, "communicator is MPI_COMM_NULL");
  return c;
}

void* P(uintptr_t p) { return distkit::ptr<void>(p); }

DType D(int64_t code) { return distkit::dtype_from_code(code); }

void check_count(int64_t n, const char* what) { check<distkit::ValueError>(n >= 0, what, " must be >= 0, got ", n); }

void check_rank(int r, MPI_Comm c, const char* what) {
  const int size = mpiad::comm_size(c);
  check<distkit::ValueError>(r >= 0 && r < size, what, " = ", r, " is out of range for a communicator of size ", size);
}

/// A pending non-blocking operation: MPI requests (point to point) or a queued
/// collective of the engine. Holds `keep` (the buffers' owners) until it completes.
struct Request {
  std::vector<MPI_Request> reqs;
  std::shared_ptr<mpiad::Pending> pending;
  py::object keep;
  bool done = false;

  void wait() {
    if (done) return;
    std::exception_ptr err;
    {
      distkit::nogil g;
      try {
        if (pending) {
          pending->wait();
        } else {
          dmpi::check(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Wait");
        }
      } catch (...) {
        err = std::current_exception();
      }
    }
    done = true;  // finished, with or without an error: the buffers are free again
    keep = py::none();
    if (err) std::rethrow_exception(err);
  }
  bool test() {
    if (done) return true;
    bool flag = false;
    try {
      if (pending) {
        flag = pending->test();
      } else {
        int f = 0;
        dmpi::check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &f, MPI_STATUSES_IGNORE), "MPI_Test");
        flag = f != 0;
      }
    } catch (...) {
      done = true;
      keep = py::none();
      throw;
    }
    if (flag) {
      done = true;
      keep = py::none();
    }
    return flag;
  }
  ~Request() {
    if (done || !dmpi::initialized()) return;
    // Never waited for: let it finish in the background and leak the buffers on
    // purpose (freeing them while MPI or the worker may still use them could
    // corrupt memory).
    for (auto& r : reqs) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    if (keep && !(pending && pending->finished())) keep.inc_ref();
  }
};

std::unique_ptr<Request> queued(MPI_Comm w, std::function<void()> fn, py::object keep) {
  static const bool multiple = [] {
    int level = 0;
    MPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
  }();
  // the worker thread calls MPI while the caller's thread may too
  check<distkit::Error>(multiple,
                        "non-blocking collectives need MPI initialised with MPI_THREAD_MULTIPLE (mpi4py's default; "
                        "do not lower mpi4py.rc.thread_level)");
  auto r = std::make_unique<Request>();
  r->keep = std::move(keep);
  r->pending = mpiad::Engine::get().submit(w, std::move(fn));
  return r;
}

/// Set the Python exception matching a C++ one (as distkit::register_exceptions does).
PyObject* raise_from(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const distkit::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const distkit::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const distkit::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

/// The MPI part shared by both Allreduce entry points below, with the GIL
/// released; false with a Python exception set when it failed.
bool run_allreduce(MPI_Comm c, uintptr_t send, uintptr_t recv, int64_t nbytes, DType d, int64_t op,
                        const mpiad::Reduction& r) {
  std::exception_ptr err;
  Py_BEGIN_ALLOW_THREADS
  try {
    mpiad::allreduce(c, P(send), P(recv), nbytes, d, op, r);
  } catch (...) {
    err = std::current_exception();
  }
  Py_END_ALLOW_THREADS
  if (err) raise_from(err);
  return !err;
}

/// allreduce_fast(comm, send, recv, nbytes, dtype, op): THE Allreduce entry point of
/// mpiad (every Python path calls it, or allreduce_tensor below): `nbytes` per rank
/// (MINLOC/MAXLOC reduce pairs, MPI_AVG divides the sum by the size), algorithm
/// choice and counts above INT_MAX in collectives.hpp. A METH_FASTCALL function: the
/// latency path skips pybind11's argument conversion (~150 ns of an 8-byte call).
/// Errors are raised before any communication.
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
  MPI_Comm c = MPI_COMM_NULL;
  DType d = DType::Float32;
  mpiad::Reduction r;
  try {
    c = C(h);
    d = D(code);
    r = mpiad::reduction(op, d, nbytes);  // validates (op, dtype, nbytes) before any communication
  } catch (...) {
    return raise_from(std::current_exception());
  }
  if (!run_allreduce(c, send, recv, nbytes, d, op, r)) return nullptr;
  Py_RETURN_NONE;
}

/// allreduce_tensor(comm, tensor, op, out): the latency paths of
/// Communicator.Allreduce (tensor_fast.hpp): the result tensor without autograd,
/// the dtype code for a call of the autograd latency path, or None when the
/// Python path must take the call.
PyObject* allreduce_tensor(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "allreduce_tensor(comm, tensor, op, out) takes 4 arguments");
    return nullptr;
  }
  const uintptr_t h = PyLong_AsUnsignedLongLong(args[0]);
  if (PyErr_Occurred()) return nullptr;
  mpiad::TensorCall call;
  switch (mpiad::prepare_allreduce(args[1], args[2], args[3], &call)) {
    case mpiad::kRaised: return nullptr;
    case mpiad::kNotMine: Py_RETURN_NONE;
    case mpiad::kAutograd: return PyLong_FromLongLong(call.code);
    default: break;  // kReady
  }
  py::object result = py::reinterpret_steal<py::object>(call.result);
  MPI_Comm c = MPI_COMM_NULL;
  try {
    c = C(h);
  } catch (...) {
    return raise_from(std::current_exception());
  }
  if (!run_allreduce(c, call.send, call.recv, call.nbytes, call.dtype, call.op, call.reduction)) return nullptr;
  if (args[3] != Py_None && !mpiad::TensorApi::get().bump_version(args[3])) return nullptr;
  return result.release().ptr();
}

PyMethodDef g_allreduce_tensor_def = {
    "allreduce_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&allreduce_tensor)),
    METH_FASTCALL,
    "allreduce_tensor(comm, tensor, op, out): Allreduce of a contiguous CPU tensor without autograd into `out` "
    "(None: a new tensor) and returns the result; for a call needing autograd that suits the autograd latency "
    "path, returns its dtype code instead; None when the call is for neither."};

PyMethodDef g_allreduce_fast_def = {
    "allreduce_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&allreduce_fast)),
    METH_FASTCALL,
    "allreduce_fast(comm, send, recv, nbytes, dtype, op): the Allreduce of nbytes bytes per rank."};

}  // namespace

PYBIND11_MODULE(_mpiad, m) {
  m.doc() = "native core of mpiad";
  distkit::init_module(m);

  // --- constants crossing into Python (defined once, here)
  py::dict op_names;
  for (int64_t op : mpiad::kOps) {
    m.attr(mpiad::op_name(op)) = op;
    op_names[py::int_(op)] = mpiad::op_name(op);
  }
  m.attr("OP_NAMES") = op_names;
  m.attr("ALGO_AUTO") = int(mpiad::kAlgoAuto);
  m.attr("ALGO_MPI") = int(mpiad::kAlgoMpi);
  m.attr("ALGO_REDUCE_BCAST") = int(mpiad::kAlgoReduceBcast);
  m.attr("ALGO_RING") = int(mpiad::kAlgoRing);
  m.attr("RING_BYTES") = mpiad::kRingBytes;
  m.attr("MPI_VERSION") = MPI_VERSION;

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
  m.def("valid_op_dtypes", [] {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t op : mpiad::kOps) {
      for (int32_t code = 0; code < distkit::kNumDTypes; ++code) {
        try {
          mpiad::check_op_dtype(op, static_cast<DType>(code));
          out.emplace_back(op, code);
        } catch (const distkit::Error&) {
        }
      }
    }
    return out;
  }, "Every (op, dtype code) pair a reduction accepts.");

  m.def("configure_allreduce", [](int mode, int64_t large_bytes, int64_t ring_bytes) {
    check<distkit::ValueError>(mode >= mpiad::kAlgoAuto && mode <= mpiad::kAlgoRing, "unknown algorithm ", mode);
    check<distkit::ValueError>(large_bytes >= 0, "large_bytes must be >= 0, got ", large_bytes);
    check<distkit::ValueError>(ring_bytes >= 0, "ring_bytes must be >= 0, got ", ring_bytes);
    mpiad::allreduce_config().mode = mode;
    mpiad::allreduce_config().large_bytes = large_bytes;
    mpiad::allreduce_config().ring_bytes = ring_bytes;
  }, py::arg("mode"), py::arg("large_bytes"), py::arg("ring_bytes") = mpiad::kRingBytes,
     "Allreduce algorithms: ALGO_AUTO (from `large_bytes` Reduce+Bcast when every rank shares one node; "
     "from `ring_bytes` the pipelined ring when the ranks span nodes), ALGO_MPI (MPI_Allreduce), and, "
     "from `large_bytes`, ALGO_REDUCE_BCAST or ALGO_RING. Every rank must use the same setting.");
  m.def("allreduce_settings", [] {
    auto& cfg = mpiad::allreduce_config();
    return py::make_tuple(cfg.mode.load(), cfg.large_bytes.load(), cfg.ring_bytes.load());
  }, "(mode, large_bytes, ring_bytes) of configure_allreduce.");

  m.def("set_count_limit", [](int64_t limit) {
    check<distkit::ValueError>(limit >= 1 && limit <= INT_MAX, "limit must be in 1..", INT_MAX, ", got ", limit);
    mpiad::count_limit() = limit;
  }, "For tests: the largest count passed to MPI as an int (default INT_MAX); above it the large-count paths "
     "(derived datatypes, chunked reductions, MPI_Alltoallw) run. Every rank must use the same value.");
  m.def("count_limit", [] { return mpiad::count_limit().load(); });
  m.def("comm_rank", [](uintptr_t h) { return mpiad::comm_rank(C(h)); });
  m.def("comm_size", [](uintptr_t h) { return mpiad::comm_size(C(h)); });
  m.def("barrier", [](uintptr_t h) {
    MPI_Comm c = C(h);
    distkit::nogil g;
    dmpi::check(MPI_Barrier(c), "MPI_Barrier");
  });
  m.def("comm_is_shared", [](uintptr_t h) {
    MPI_Comm c = C(h);
    distkit::nogil g;
    return mpiad::comm_is_shared(c);
  }, "Collective: whether every rank of the communicator shares one node's memory.");

  m.attr("allreduce_fast") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_allreduce_fast_def, nullptr, m.attr("__name__").ptr()));
  m.attr("allreduce_tensor") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_allreduce_tensor_def, nullptr, m.attr("__name__").ptr()));
  m.def("init_tensor_fast", [](py::object tensor, py::object parameter, py::object grad_enabled,
                               py::object increment_version, py::object empty_like, py::object new_output,
                               py::object codes, int64_t pool_min_bytes) {
    if (!mpiad::TensorApi::get().init(tensor.ptr(), parameter.ptr(), grad_enabled.ptr(), increment_version.ptr(),
                                      empty_like.ptr(), new_output.ptr(), codes.ptr(), pool_min_bytes))
      throw py::error_already_set();
    return mpiad::TensorApi::get().ready;
  }, "Give allreduce_tensor torch's Tensor and Parameter types, torch.is_grad_enabled, "
     "torch._C._increment_version, torch.empty_like, the pool's new_output (outputs from pool_min_bytes on) and "
     "{dtype: code}; returns whether the fast path is on (whether torch's tensor attributes are C descriptors). "
     "Called once, by mpiad._comm.");

  // --- blocking calls
  m.def("reduce", [](uintptr_t h, uintptr_t send, uintptr_t recv, int64_t count, int64_t dtype, int64_t op,
                     int root) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_rank(root, c, "root");
    mpiad::reduction(op, d, count * distkit::itemsize(d));
    distkit::nogil g;
    mpiad::reduce(c, P(send), P(recv), count, d, op, root);
  });
  m.def("reduce_scatter", [](uintptr_t h, uintptr_t send, uintptr_t recv, I64s counts, int64_t dtype, int64_t op) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    mpiad::check_op_dtype(op, d);
    distkit::nogil g;
    mpiad::reduce_scatter(c, P(send), P(recv), counts, d, op);
  });
  m.def("bcast", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int root) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    distkit::nogil g;
    mpiad::bcast(c, P(buf), count, d, root);
  });
  m.def("allgather_i64", [](uintptr_t h, I64s values) {
    MPI_Comm c = C(h);
    const int size = mpiad::comm_size(c);
    const int n = static_cast<int>(values.size());
    I64s out(static_cast<size_t>(n) * size);
    {
      distkit::nogil g;
      dmpi::check(MPI_Allgather(values.data(), n, MPI_INT64_T, out.data(), n, MPI_INT64_T, c), "MPI_Allgather");
    }
    return out;
  }, "Every rank's `values` (same length everywhere), concatenated in rank order.");
  m.def("gatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, I64s counts, I64s displs,
                      int64_t dtype, int root) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    distkit::nogil g;
    mpiad::gatherv(c, P(send), count, P(recv), counts, displs, d, root);
  }, "counts/displs (elements) of every rank, on every rank.");
  m.def("allgatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, I64s counts, I64s displs,
                         int64_t dtype) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    distkit::nogil g;
    mpiad::allgatherv(c, P(send), count, P(recv), counts, displs, d);
  });
  m.def("scatterv", [](uintptr_t h, uintptr_t send, I64s counts, I64s displs, uintptr_t recv, int64_t count,
                       int64_t dtype, int root) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    distkit::nogil g;
    mpiad::scatterv(c, P(send), counts, displs, P(recv), count, d, root);
  }, "counts/displs (elements) of every rank, on every rank.");
  m.def("alltoallv", [](uintptr_t h, uintptr_t send, I64s scounts, I64s sdispls, uintptr_t recv, I64s rcounts,
                        I64s rdispls, int64_t dtype) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    distkit::nogil g;
    mpiad::alltoallv(c, P(send), scounts, sdispls, P(recv), rcounts, rdispls, d);
  });
  m.def("send", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int dest, int tag) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    distkit::nogil g;
    mpiad::send(c, P(buf), count, d, dest, tag);
  });
  m.def("recv", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int source, int tag) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    distkit::nogil g;
    mpiad::recv(c, P(buf), count, d, source, tag);
  });
  m.def("sendrecv", [](uintptr_t h, uintptr_t sbuf, int64_t scount, int dest, int stag, uintptr_t rbuf,
                       int64_t rcount, int source, int rtag, int64_t dtype) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(scount, "send count");
    check_count(rcount, "recv count");
    distkit::nogil g;
    mpiad::sendrecv(c, P(sbuf), scount, dest, stag, P(rbuf), rcount, source, rtag, d);
  });

  // --- non-blocking calls
  py::class_<Request>(m, "Request", "A pending non-blocking operation; keeps its buffers alive until done.")
      .def("wait", &Request::wait, "Block until the operation completes (GIL released); raises its error.")
      .def("test", &Request::test, "Whether the operation has completed.")
      .def_property_readonly("done", [](const Request& r) { return r.done; });

  m.def("isend", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int dest, int tag, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    auto r = std::make_unique<Request>();
    r->keep = std::move(keep);
    r->reqs.resize(1, MPI_REQUEST_NULL);
    mpiad::Span s(dmpi::datatype(d), count);
    dmpi::check(MPI_Isend(P(buf), s.count(), s.type(), dest, tag, c, r->reqs.data()), "MPI_Isend");
    return r;
  }, "Start a send; `keep` (the buffer's owner) stays referenced until the request completes.");
  m.def("irecv", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int source, int tag, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    auto r = std::make_unique<Request>();
    r->keep = std::move(keep);
    r->reqs.resize(1, MPI_REQUEST_NULL);
    mpiad::Span s(dmpi::datatype(d), count);
    dmpi::check(MPI_Irecv(P(buf), s.count(), s.type(), source, tag, c, r->reqs.data()), "MPI_Irecv");
    return r;
  }, "Start a receive into `buf`; `keep` stays referenced until the request completes.");

  // The collectives below validate here, on the caller's thread, then queue the
  // blocking call for the engine's worker (engine.hpp) on its duplicate communicator.
  m.def("iallreduce", [](uintptr_t h, uintptr_t send, uintptr_t recv, int64_t nbytes, int64_t dtype, int64_t op,
                         py::object keep) {
    const DType d = D(dtype);
    mpiad::reduction(op, d, nbytes);
    MPI_Comm w = mpiad::Engine::worker_comm(C(h));
    return queued(w, [=] { mpiad::allreduce(w, P(send), P(recv), nbytes, d, op); }, std::move(keep));
  });
  m.def("ireduce", [](uintptr_t h, uintptr_t send, uintptr_t recv, int64_t count, int64_t dtype, int64_t op, int root,
                      py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_rank(root, c, "root");
    mpiad::reduction(op, d, count * distkit::itemsize(d));
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::reduce(w, P(send), P(recv), count, d, op, root); }, std::move(keep));
  });
  m.def("ireduce_scatter", [](uintptr_t h, uintptr_t send, uintptr_t recv, I64s counts, int64_t dtype, int64_t op,
                              py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    mpiad::check_op_dtype(op, d);
    check<distkit::TypeError>(!mpiad::is_loc(op), "Reduce_scatter does not support ", mpiad::op_name(op));
    mpiad::check_per_rank(counts, mpiad::comm_size(c), "counts");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::reduce_scatter(w, P(send), P(recv), counts, d, op); }, std::move(keep));
  });
  m.def("ibcast", [](uintptr_t h, uintptr_t buf, int64_t count, int64_t dtype, int root, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::bcast(w, P(buf), count, d, root); }, std::move(keep));
  });
  m.def("igatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, I64s counts, I64s displs,
                       int64_t dtype, int root, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    mpiad::check_per_rank(counts, mpiad::comm_size(c), "counts");
    mpiad::check_per_rank(displs, mpiad::comm_size(c), "displs");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::gatherv(w, P(send), count, P(recv), counts, displs, d, root); }, std::move(keep));
  });
  m.def("iallgatherv", [](uintptr_t h, uintptr_t send, int64_t count, uintptr_t recv, I64s counts, I64s displs,
                          int64_t dtype, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    mpiad::check_per_rank(counts, mpiad::comm_size(c), "counts");
    mpiad::check_per_rank(displs, mpiad::comm_size(c), "displs");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::allgatherv(w, P(send), count, P(recv), counts, displs, d); }, std::move(keep));
  });
  m.def("iscatterv", [](uintptr_t h, uintptr_t send, I64s counts, I64s displs, uintptr_t recv, int64_t count,
                        int64_t dtype, int root, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    check_count(count, "count");
    check_rank(root, c, "root");
    mpiad::check_per_rank(counts, mpiad::comm_size(c), "counts");
    mpiad::check_per_rank(displs, mpiad::comm_size(c), "displs");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::scatterv(w, P(send), counts, displs, P(recv), count, d, root); }, std::move(keep));
  });
  m.def("ialltoallv", [](uintptr_t h, uintptr_t send, I64s scounts, I64s sdispls, uintptr_t recv, I64s rcounts,
                         I64s rdispls, int64_t dtype, py::object keep) {
    MPI_Comm c = C(h);
    const DType d = D(dtype);
    const int size = mpiad::comm_size(c);
    mpiad::check_per_rank(scounts, size, "send counts");
    mpiad::check_per_rank(sdispls, size, "send displs");
    mpiad::check_per_rank(rcounts, size, "recv counts");
    mpiad::check_per_rank(rdispls, size, "recv displs");
    MPI_Comm w = mpiad::Engine::worker_comm(c);
    return queued(w, [=] { mpiad::alltoallv(w, P(send), scounts, sdispls, P(recv), rcounts, rdispls, d); },
                  std::move(keep));
  });
  m.def("shutdown", [] {
    distkit::nogil g;
    mpiad::Engine::get().shutdown();
  }, "Finish the queued non-blocking collectives and stop the worker thread (at interpreter exit).");
}
