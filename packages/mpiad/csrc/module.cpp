// _mpiad: native core of mpiad.
#include <pybind11/pybind11.h>

#include <string>

#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_mpiad, m) {
  m.doc() = "native core of mpiad";
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
  m.def("mpi_library_version", [] {
    char buf[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    distkit::mpi::check(MPI_Get_library_version(buf, &len), "MPI_Get_library_version");
    return std::string(buf, static_cast<size_t>(len));
  });
}
