// distkit/pybind.hpp - pybind11 glue shared by every distkit extension.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "error.hpp"
#include "parallel.hpp"

namespace distkit {

/// Translate distkit exceptions to specific Python exceptions for this module.
inline void register_exceptions(pybind11::module_&) {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const OSError& e) {
      pybind11::object exc = pybind11::reinterpret_steal<pybind11::object>(
          PyObject_CallFunction(PyExc_OSError, "is", e.error_number(), e.what()));
      if (exc) {
        PyErr_SetObject(PyExc_OSError, exc.ptr());
      }
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}

/// The exception translators plus the bindings every distkit extension exposes:
/// version() (the distkit version it was built against), cuda_compiled(),
/// get_num_threads() / set_num_threads(n) (the parallel_for pool of this extension).
/// Call it first in PYBIND11_MODULE.
inline void init_module(pybind11::module_& m) {
  register_exceptions(m);
  m.def("version", [] { return std::string(DISTKIT_VERSION); }, "The distkit version this extension was built with.");
  m.def(
      "cuda_compiled",
      [] {
#ifdef DISTKIT_WITH_CUDA
        return true;
#else
        return false;
#endif
      },
      "True when the CUDA sources were compiled into this extension.");
  m.def("get_num_threads", &get_num_threads, "Threads of this extension's parallel_for pool.");
  m.def(
      "set_num_threads",
      [](int n) {
        check(n >= 1, "number of threads must be >= 1, got ", n);
        set_num_threads(n);
      },
      pybind11::arg("n"), "Set the threads of this extension's parallel_for pool (>= 1).");
}

/// A raw pointer handed over from Python as an integer (tensor.data_ptr()).
template <class T = void>
inline T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

/// Release the GIL for the scope (use around any real work).
using nogil = pybind11::gil_scoped_release;

}  // namespace distkit
