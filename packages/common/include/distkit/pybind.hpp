// distkit/pybind.hpp - pybind11 glue shared by every distkit extension.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "error.hpp"

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

/// A raw pointer handed over from Python as an integer (tensor.data_ptr()).
template <class T = void>
inline T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

/// Release the GIL for the scope (use around any real work).
using nogil = pybind11::gil_scoped_release;

}  // namespace distkit
