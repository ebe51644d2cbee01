// tensor_fast.hpp - the latency paths of Communicator.Allreduce, checked in C.
//
// An 8-byte Allreduce is about a microsecond of MPI; the Python checks in front
// of it (a dozen tensor attribute reads, each a bytecode dispatch plus torch's
// getter) cost as much again. This path reads the same attributes through the
// descriptors torch itself defines on TensorBase (looked up once, at
// `init_tensor_fast`), so each read is one C call into torch's getter, without
// linking libtorch.
//
// Its answer is one of three. "Done" (the result) for a call without autograd.
// "One for the autograd latency path" (the dtype code) for a call that needs
// autograd and passes the same checks; Python then records one AllreduceSmall
// node. "Not mine" (None) for anything but an exact torch.Tensor/Parameter
// whose memory holds its values as MPI sees them (CPU, contiguous, dense, not
// nested, no lazy conjugate/negative bit), with a valid (op, dtype) pair other
// than MINLOC/MAXLOC, and a matching `out` that does not partly overlap it.
// "Not mine" comes before any memory is touched, and the Python path (with its
// full checks and error messages) takes over, so the paths cannot disagree on
// what is accepted. Writing into `out=` bumps its version counter.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "collectives.hpp"

namespace mpiad {

/// What the fast path needs from torch (references taken in `init`, kept for
/// the life of the process).
struct TensorApi {
  PyTypeObject* tensor = nullptr;     // torch.Tensor
  PyTypeObject* parameter = nullptr;  // torch.nn.Parameter
  // getset descriptors of TensorBase
  PyObject* dtype = nullptr;
  PyObject* is_cpu = nullptr;
  PyObject* requires_grad = nullptr;
  PyObject* nbytes = nullptr;
  PyObject* shape = nullptr;
  PyObject* is_nested = nullptr;
  // method descriptors of TensorBase
  PyObject* is_contiguous = nullptr;
  PyObject* is_conj = nullptr;
  PyObject* is_neg = nullptr;
  PyObject* data_ptr = nullptr;
  // functions and constants
  PyObject* grad_enabled = nullptr;       // torch.is_grad_enabled
  PyObject* increment_version = nullptr;  // torch._C._increment_version (takes a sequence)
  PyObject* empty_like = nullptr;         // torch.empty_like
  PyObject* new_output = nullptr;         // mpiad._pool.new_output (large outputs)
  PyObject* codes = nullptr;              // {torch.dtype: distkit dtype code}
  int64_t pool_min_bytes = 0;
  bool ready = false;

  static TensorApi& get() {
    static TensorApi api;
    return api;
  }

  /// Look the descriptors up on torch.Tensor; any of them not a plain C
  /// descriptor (a torch release that moved it to Python) leaves the fast path
  /// off, and every call goes the Python way.
  bool init(PyObject* tensor_type, PyObject* parameter_type, PyObject* grad_enabled_fn,
            PyObject* increment_version_fn, PyObject* empty_like_fn, PyObject* new_output_fn, PyObject* dtype_codes,
            int64_t pool_min) {
    if (ready) return true;  // once per process: the first call's objects stay
    if (!PyType_Check(tensor_type) || !PyType_Check(parameter_type) || !PyCallable_Check(grad_enabled_fn) ||
        !PyCallable_Check(increment_version_fn) || !PyCallable_Check(empty_like_fn) ||
        !PyCallable_Check(new_output_fn) || !PyDict_Check(dtype_codes)) {
      PyErr_SetString(PyExc_TypeError,
                      "init_tensor_fast(Tensor, Parameter, is_grad_enabled, _increment_version, empty_like, "
                      "new_output, codes, pool_min)");
      return false;
    }
    constexpr int kGetsets = 6, kMethods = 4;
    const char* getset_names[kGetsets] = {"dtype", "is_cpu", "requires_grad", "nbytes", "shape", "is_nested"};
    const char* method_names[kMethods] = {"is_contiguous", "is_conj", "is_neg", "data_ptr"};
    PyObject* getsets[kGetsets] = {};
    PyObject* methods[kMethods] = {};
    bool ok = true;
    for (int i = 0; ok && i < kGetsets; ++i) {
      getsets[i] = PyObject_GetAttrString(tensor_type, getset_names[i]);
      ok = getsets[i] != nullptr && Py_TYPE(getsets[i]) == &PyGetSetDescr_Type;
    }
    for (int i = 0; ok && i < kMethods; ++i) {
      methods[i] = PyObject_GetAttrString(tensor_type, method_names[i]);
      ok = methods[i] != nullptr && Py_TYPE(methods[i]) == &PyMethodDescr_Type;
    }
    if (!ok) {
      PyErr_Clear();
      for (PyObject* o : getsets) Py_XDECREF(o);
      for (PyObject* o : methods) Py_XDECREF(o);
      return true;  // not an error: the Python path serves every call
    }
    for (PyObject* o : {tensor_type, parameter_type, grad_enabled_fn, increment_version_fn, empty_like_fn,
                        new_output_fn, dtype_codes})
      Py_INCREF(o);
    tensor = reinterpret_cast<PyTypeObject*>(tensor_type);
    parameter = reinterpret_cast<PyTypeObject*>(parameter_type);
    dtype = getsets[0];
    is_cpu = getsets[1];
    requires_grad = getsets[2];
    nbytes = getsets[3];
    shape = getsets[4];
    is_nested = getsets[5];
    is_contiguous = methods[0];
    is_conj = methods[1];
    is_neg = methods[2];
    data_ptr = methods[3];
    grad_enabled = grad_enabled_fn;
    increment_version = increment_version_fn;
    empty_like = empty_like_fn;
    new_output = new_output_fn;
    codes = dtype_codes;
    pool_min_bytes = pool_min;
    ready = true;
    return true;
  }

  bool exact(PyObject* t) const { return Py_TYPE(t) == tensor || Py_TYPE(t) == parameter; }

  /// `t.<getset>` (a new reference, nullptr with an exception set).
  static PyObject* get(PyObject* descr, PyObject* t) {
    return Py_TYPE(descr)->tp_descr_get(descr, t, reinterpret_cast<PyObject*>(Py_TYPE(t)));
  }
  /// `t.<method>()`.
  static PyObject* call(PyObject* descr, PyObject* t) { return PyObject_Vectorcall(descr, &t, 1, nullptr); }

  /// 1 when `t.<attr>` is True, 0 when False, -1 with an exception set.
  static int flag(PyObject* o) {
    if (o == nullptr) return -1;
    const int v = o == Py_True ? 1 : 0;
    Py_DECREF(o);
    return v;
  }

  /// `t.<method>()` as a flag, where torch raising means "not a tensor for this
  /// path" (is_contiguous() of a sparse compressed tensor, data_ptr() of an
  /// mkldnn one): 0, and the Python path names the problem.
  static int flag_or_not_mine(PyObject* descr, PyObject* t) {
    PyObject* o = call(descr, t);
    if (o == nullptr) {
      PyErr_Clear();
      return 0;
    }
    return flag(o);
  }

  /// 1 when `t`'s memory holds its values as MPI reads and writes them: on the
  /// CPU, contiguous, not nested, no lazy negative bit and, for complex dtypes,
  /// no lazy conjugate bit; 0 when not; -1 with an exception set. (Layouts other
  /// than strided are not contiguous, or torch raises for them here or in
  /// data_ptr(): no layout read needed on this path.)
  int plain_cpu(PyObject* t, bool complex) const {
    int f = flag(get(is_cpu, t));
    if (f != 1) return f;
    f = flag_or_not_mine(is_contiguous, t);
    if (f != 1) return f;
    f = flag(get(is_nested, t));
    if (f != 0) return f < 0 ? -1 : 0;
    f = flag(call(is_neg, t));
    if (f != 0) return f < 0 ? -1 : 0;
    if (!complex) return 1;
    f = flag(call(is_conj, t));
    return f < 0 ? -1 : 1 - f;
  }

  /// Bump `t`'s autograd version counter, as torch's own in-place and out= ops
  /// do: a tensor autograd saved and MPI then overwrote is reported by backward
  /// instead of used silently. False with an exception set.
  bool bump_version(PyObject* t) const {
    PyObject* one = PyTuple_Pack(1, t);
    if (one == nullptr) return false;
    PyObject* r = PyObject_Vectorcall(increment_version, &one, 1, nullptr);
    Py_DECREF(one);
    if (r == nullptr) return false;
    Py_DECREF(r);
    return true;
  }
};

/// One new reference, released at the end of the scope (pybind11's object).
inline pybind11::object own(PyObject* o) { return pybind11::reinterpret_steal<pybind11::object>(o); }

/// An Allreduce ready to run: the addresses, the result tensor (a new reference).
struct TensorCall {
  PyObject* result = nullptr;
  uintptr_t send = 0;
  uintptr_t recv = 0;
  int64_t nbytes = 0;
  distkit::DType dtype = distkit::DType::Float32;
  int64_t op = 0;
  int64_t code = 0;  // the dtype code
  Reduction reduction;
};

/// What prepare_allreduce found.
enum Prepared : int {
  kRaised = -1,    // a torch getter raised: a Python exception is set
  kNotMine = 0,    // neither path applies: nothing allocated, no exception
  kReady = 1,      // no autograd: `call` is complete, `call->result` a new reference
  kAutograd = 2,   // autograd, and the call suits its latency path: `call->code` is set
};

/// Checks `tensor`, `op` and `out` (None: a new output) for the fast paths and
/// fills `call`. The autograd latency path (Python's AllreduceSmall node) takes
/// calls that need autograd, with no `out=`, below the output pool's size.
inline int prepare_allreduce(PyObject* t, PyObject* op_obj, PyObject* out, TensorCall* call) {
  TensorApi& api = TensorApi::get();
  if (!api.ready || !api.exact(t) || !PyLong_CheckExact(op_obj)) return kNotMine;
  // autograd: requires_grad with grad mode on
  int f = TensorApi::flag(TensorApi::get(api.requires_grad, t));
  const bool requires_grad = f == 1;
  if (f == 1) f = TensorApi::flag(PyObject_CallNoArgs(api.grad_enabled));
  if (f < 0) return kRaised;
  const bool autograd = f == 1;
  // (Python's errors: out= has no autograd, and an `out` may not require grad)
  if ((autograd && out != Py_None) || (out == t && requires_grad)) return kNotMine;

  const pybind11::object dtype = own(TensorApi::get(api.dtype, t));
  if (!dtype) return kRaised;
  PyObject* code_obj = PyDict_GetItemWithError(api.codes, dtype.ptr());  // borrowed
  if (code_obj == nullptr) return PyErr_Occurred() ? kRaised : kNotMine;
  const long long code = PyLong_AsLongLong(code_obj);
  call->op = PyLong_AsLongLong(op_obj);
  if (PyErr_Occurred()) {  // an op beyond int64: the Python path names the problem
    PyErr_Clear();
    return kNotMine;
  }
  if (is_loc(call->op)) return kNotMine;  // MINLOC/MAXLOC also need the Python shape check (pairs)
  bool complex = false;
  try {
    call->dtype = distkit::dtype_from_code(code);
    complex = distkit::is_complex(call->dtype);
  } catch (...) {
    return kNotMine;
  }
  f = api.plain_cpu(t, complex);
  if (f != 1) return f;
  const pybind11::object nbytes_obj = own(TensorApi::get(api.nbytes, t));
  if (!nbytes_obj) return kRaised;
  call->nbytes = PyLong_AsLongLong(nbytes_obj.ptr());
  if (PyErr_Occurred()) return kRaised;
  try {
    call->reduction = reduction(call->op, call->dtype, call->nbytes);
  } catch (...) {  // (op, dtype) not a valid pair: the Python path raises the error
    return kNotMine;
  }
  if (autograd) {
    if (call->nbytes >= api.pool_min_bytes) return kNotMine;
    call->code = code;
    return kAutograd;
  }

  if (out != Py_None && out != t) {  // the checks of `out=`, as in Python's _check_out
    if (!api.exact(out)) return kNotMine;
    f = TensorApi::flag(TensorApi::get(api.requires_grad, out));
    if (f != 0) return f < 0 ? kRaised : kNotMine;
    f = api.plain_cpu(out, complex);
    if (f != 1) return f;
    const pybind11::object out_dtype = own(TensorApi::get(api.dtype, out));
    if (!out_dtype) return kRaised;
    if (!out_dtype.is(dtype)) return kNotMine;  // torch.dtype objects are singletons
    const pybind11::object s1 = own(TensorApi::get(api.shape, t));
    const pybind11::object s2 = own(TensorApi::get(api.shape, out));
    if (!s1 || !s2) return kRaised;
    const int same = PyObject_RichCompareBool(s1.ptr(), s2.ptr(), Py_EQ);
    if (same != 1) return same;
  }
  pybind11::object result;
  if (out == Py_None) {
    result = own(PyObject_Vectorcall(call->nbytes < api.pool_min_bytes ? api.empty_like : api.new_output, &t, 1,
                                     nullptr));
    if (!result) return kRaised;
  } else {
    result = pybind11::reinterpret_borrow<pybind11::object>(out);
  }
  const pybind11::object send = own(TensorApi::call(api.data_ptr, t));
  const pybind11::object recv = send ? own(TensorApi::call(api.data_ptr, result.ptr())) : pybind11::object();
  if (!send || !recv) {  // (no data pointer to give: an mkldnn tensor, a wrapper)
    PyErr_Clear();
    return kNotMine;
  }
  call->send = PyLong_AsUnsignedLongLong(send.ptr());
  call->recv = PyLong_AsUnsignedLongLong(recv.ptr());
  if (PyErr_Occurred()) return kRaised;
  const uintptr_t n = static_cast<uintptr_t>(call->nbytes);
  if (n > 0) {
    // no memory behind elements (a storage resized to 0, as FSDP frees
    // parameters), or an `out` overlapping the input without being it (MPI
    // forbids aliased buffers): Python's errors
    if (call->send == 0 || call->recv == 0) return kNotMine;
    if (call->send != call->recv && call->send < call->recv + n && call->recv < call->send + n) return kNotMine;
  }
  call->result = result.release().ptr();
  return kReady;
}

}  // namespace mpiad
