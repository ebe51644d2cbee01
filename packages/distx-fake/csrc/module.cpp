// _distx_fake: native core of distx-fake.
#include <pybind11/pybind11.h>

#include <string>

#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_distx_fake, m) {
  m.doc() = "native core of distx-fake";
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
