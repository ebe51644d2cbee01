// tensor_fast.hpp - the no-grad latency path of Communicator.Allreduce, in C.
//
// An 8-byte Allreduce is about a microsecond of MPI; the Python checks in front
// of it (a dozen tensor attribute reads, each a bytecode dispatch plus torch's
// getter) cost as much again. This path reads the same attributes through the
// descriptors torch itself defines on TensorBase (looked up once, at
// `init_tensor_fast`), so each read is one C call into torch's getter, without
// linking libtorch.
//
// It only ever says "yes, done" or "not mine": for anything but an exact
// torch.Tensor/Parameter on the CPU, contiguous, without requires_grad, with a
// valid (op, dtype) pair other than MINLOC/MAXLOC and a matching `out`, it
// returns None before touching anything, and the Python path (with its full
// checks and error messages) takes over. So the two paths cannot disagree on
// what is accepted.
#pragma once

#include <Python.h>

#include <cstdint>

#include "collectives.hpp"

namespace mpiad {

/// What the fast path needs from torch, borrowed from the module state (kept
/// alive by references taken in `init`).
struct TensorApi {
  PyTypeObject* tensor = nullptr;     // torch.Tensor
  PyTypeObject* parameter = nullptr;  // torch.nn.Parameter
  PyObject* dtype = nullptr;          // getset descriptors of TensorBase
  PyObject* is_cpu = nullptr;
  PyObject* requires_grad = nullptr;
  PyObject* nbytes = nullptr;
  PyObject* shape = nullptr;
  PyObject* is_contiguous = nullptr;  // method descriptors of TensorBase
  PyObject* data_ptr = nullptr;
  PyObject* grad_enabled = nullptr;   // torch.is_grad_enabled
  PyObject* empty_like = nullptr;     // torch.empty_like
  PyObject* new_output = nullptr;     // mpiad._pool.new_output (large outputs)
  PyObject* codes = nullptr;          // {torch.dtype: distkit dtype code}
  int64_t pool_min_bytes = 0;
  bool ready = false;

  static TensorApi& get() {
    static TensorApi api;
    return api;
  }

  /// Look the descriptors up on torch.Tensor; any of them not a plain C
  /// descriptor (a torch release that moved it to Python) leaves the fast path
  /// off, and every call goes the Python way.
  bool init(PyObject* tensor_type, PyObject* parameter_type, PyObject* grad_enabled_fn, PyObject* empty_like_fn,
            PyObject* new_output_fn, PyObject* dtype_codes, int64_t pool_min) {
    if (ready) return true;  // once per process: the first call's objects stay
    if (!PyType_Check(tensor_type) || !PyType_Check(parameter_type) || !PyCallable_Check(grad_enabled_fn) ||
        !PyCallable_Check(empty_like_fn) || !PyCallable_Check(new_output_fn) || !PyDict_Check(dtype_codes)) {
      PyErr_SetString(PyExc_TypeError,
                      "init_tensor_fast(Tensor, Parameter, is_grad_enabled, empty_like, new_output, codes, pool_min)");
      return false;
    }
    PyObject* getsets[5] = {};
    PyObject* methods[2] = {};
    const char* getset_names[5] = {"dtype", "is_cpu", "requires_grad", "nbytes", "shape"};
    const char* method_names[2] = {"is_contiguous", "data_ptr"};
    bool ok = true;
    for (int i = 0; i < 5; ++i) {
      getsets[i] = PyObject_GetAttrString(tensor_type, getset_names[i]);
      ok = ok && getsets[i] != nullptr && Py_TYPE(getsets[i]) == &PyGetSetDescr_Type;
    }
    for (int i = 0; i < 2; ++i) {
      methods[i] = PyObject_GetAttrString(tensor_type, method_names[i]);
      ok = ok && methods[i] != nullptr && Py_TYPE(methods[i]) == &PyMethodDescr_Type;
    }
    PyErr_Clear();
    if (!ok) {
      for (PyObject* o : getsets) Py_XDECREF(o);
      for (PyObject* o : methods) Py_XDECREF(o);
      return true;  // not an error: the Python path serves every call
    }
    Py_INCREF(tensor_type);
    Py_INCREF(parameter_type);
    Py_INCREF(grad_enabled_fn);
    Py_INCREF(empty_like_fn);
    Py_INCREF(new_output_fn);
    Py_INCREF(dtype_codes);
    tensor = reinterpret_cast<PyTypeObject*>(tensor_type);
    parameter = reinterpret_cast<PyTypeObject*>(parameter_type);
    dtype = getsets[0];
    is_cpu = getsets[1];
    requires_grad = getsets[2];
    nbytes = getsets[3];
    shape = getsets[4];
    is_contiguous = methods[0];
    data_ptr = methods[1];
    grad_enabled = grad_enabled_fn;
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
};

/// Owns one new reference for the scope.
struct Ref {
  PyObject* p;
  explicit Ref(PyObject* o) : p(o) {}
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* release() {
    PyObject* o = p;
    p = nullptr;
    return o;
  }
};

/// An Allreduce ready to run: the addresses, the result tensor (a new reference).
struct TensorCall {
  PyObject* result = nullptr;
  uintptr_t send = 0;
  uintptr_t recv = 0;
  int64_t nbytes = 0;
  distkit::DType dtype = distkit::DType::Float32;
  int64_t op = 0;
  Reduction reduction;
};

/// Checks `tensor`, `op` and `out` (None: a new output) for the fast path and
/// fills `call`. Returns 1 when ready (`call->result` is then a new reference), 0
/// when this path does not apply (nothing allocated, no exception), -1 with a
/// Python exception set (a torch getter raised).
inline int prepare_allreduce(PyObject* t, PyObject* op_obj, PyObject* out, TensorCall* call) {
  TensorApi& api = TensorApi::get();
  if (!api.ready || !api.exact(t) || !PyLong_CheckExact(op_obj)) return 0;
  // no autograd (requires_grad False, or grad mode off), on the CPU, contiguous
  int f = TensorApi::flag(TensorApi::get(api.requires_grad, t));
  if (f == 1) f = TensorApi::flag(PyObject_CallNoArgs(api.grad_enabled));
  if (f != 0) return f < 0 ? -1 : 0;
  f = TensorApi::flag(TensorApi::get(api.is_cpu, t));
  if (f != 1) return f;
  f = TensorApi::flag(TensorApi::call(api.is_contiguous, t));
  if (f != 1) return f;

  Ref dtype(TensorApi::get(api.dtype, t));
  if (dtype.p == nullptr) return -1;
  PyObject* code_obj = PyDict_GetItemWithError(api.codes, dtype.p);  // borrowed
  if (code_obj == nullptr) return PyErr_Occurred() ? -1 : 0;
  Ref nbytes_obj(TensorApi::get(api.nbytes, t));
  if (nbytes_obj.p == nullptr) return -1;
  call->nbytes = PyLong_AsLongLong(nbytes_obj.p);
  const long long code = PyLong_AsLongLong(code_obj);
  call->op = PyLong_AsLongLong(op_obj);
  if (PyErr_Occurred()) {  // an op beyond int64: the Python path names the problem
    PyErr_Clear();
    return 0;
  }
  if (is_loc(call->op)) return 0;  // MINLOC/MAXLOC also need the Python shape check (pairs)
  try {
    call->dtype = distkit::dtype_from_code(code);
    call->reduction = reduction(call->op, call->dtype, call->nbytes);
  } catch (...) {  // (op, dtype) not a valid pair: the Python path raises the error
    return 0;
  }

  if (out != Py_None && out != t) {  // the checks of `out=`, as in Python's _check_out
    if (!api.exact(out)) return 0;
    f = TensorApi::flag(TensorApi::get(api.requires_grad, out));
    if (f != 0) return f < 0 ? -1 : 0;
    f = TensorApi::flag(TensorApi::get(api.is_cpu, out));
    if (f != 1) return f;
    f = TensorApi::flag(TensorApi::call(api.is_contiguous, out));
    if (f != 1) return f;
    Ref out_dtype(TensorApi::get(api.dtype, out));
    if (out_dtype.p == nullptr) return -1;
    if (out_dtype.p != dtype.p) return 0;  // torch.dtype objects are singletons
    Ref s1(TensorApi::get(api.shape, t));
    Ref s2(TensorApi::get(api.shape, out));
    if (s1.p == nullptr || s2.p == nullptr) return -1;
    const int same = PyObject_RichCompareBool(s1.p, s2.p, Py_EQ);
    if (same != 1) return same;
  }
  Ref result(nullptr);
  if (out == Py_None) {
    result.p = PyObject_Vectorcall(call->nbytes < api.pool_min_bytes ? api.empty_like : api.new_output, &t, 1,
                                   nullptr);
    if (result.p == nullptr) return -1;
  } else {
    Py_INCREF(out);
    result.p = out;
  }
  Ref send(TensorApi::call(api.data_ptr, t));
  if (send.p == nullptr) return -1;
  Ref recv(TensorApi::call(api.data_ptr, result.p));
  if (recv.p == nullptr) return -1;
  call->send = PyLong_AsUnsignedLongLong(send.p);
  call->recv = PyLong_AsUnsignedLongLong(recv.p);
  if (PyErr_Occurred()) return -1;
  call->result = result.release();
  return 1;
}

}  // namespace mpiad
