// _wholemem: native core of wholemem.
#include <pybind11/pybind11.h>

#include <string>

#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_wholemem, m) {
  m.doc() = "native core of wholemem";
  distkit::register_exceptions(m);
  m.def("version", [] { return std::string(DISTKIT_VERSION); });
  m.def("cuda_compiled", [] {
#ifdef DISTKIT_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("get_num_threads", &distkit::get_num_threads);
}
