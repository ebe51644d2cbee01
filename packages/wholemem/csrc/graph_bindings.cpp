// graph_bindings.cpp - Python bindings of the graph ops: CSR neighbour sampling (CPU
// and CUDA drivers over the per-center code of graph_sample.hpp), append_unique and
// the Philox block function (exposed for its known-answer test).
//
// As everywhere in _wholemem: raw addresses in, no libtorch, the GIL released for the
// work. The Python layer (_graph_sample.py) validates dtypes and devices and sizes the
// outputs; the native layer re-checks what would make it read out of bounds.
#include "graph_bindings.hpp"

#include <pybind11/stl.h>

#include <array>
#include <cstdint>

#include "distkit/error.hpp"
#include "graph_native.hpp"
#include "graph_philox.hpp"

namespace py = pybind11;

namespace wholemem {
namespace graph {

void register_graph(py::module_& m) {
  py::class_<SampleArgs>(m, "SampleArgs",
                         "One CSR sampling call as raw addresses (0 = absent); see csr_sample_offsets / csr_sample_fill.")
      .def(py::init<>())
      .def_readwrite("row_ptr", &SampleArgs::row_ptr)
      .def_readwrite("num_nodes", &SampleArgs::num_nodes)
      .def_readwrite("num_edges", &SampleArgs::num_edges)
      .def_readwrite("centers", &SampleArgs::centers)
      .def_readwrite("centers64", &SampleArgs::centers64)
      .def_readwrite("n", &SampleArgs::n)
      .def_readwrite("starts", &SampleArgs::starts)
      .def_readwrite("ends", &SampleArgs::ends)
      .def_readwrite("col", &SampleArgs::col)
      .def_readwrite("col64", &SampleArgs::col64)
      .def_readwrite("weights", &SampleArgs::weights)
      .def_readwrite("weights64", &SampleArgs::weights64)
      .def_readwrite("weight_offsets", &SampleArgs::weight_offsets)
      .def_readwrite("k", &SampleArgs::k)
      .def_readwrite("seed", &SampleArgs::seed)
      .def_readwrite("offsets", &SampleArgs::offsets)
      .def_readwrite("dest", &SampleArgs::dest)
      .def_readwrite("center_local", &SampleArgs::center_local)
      .def_readwrite("edge_id", &SampleArgs::edge_id)
      .def_readwrite("keys", &SampleArgs::keys);

  m.def(
      "csr_sample_offsets",
      [](const SampleArgs& a) {
        py::gil_scoped_release release;
        return sample_offsets_cpu(a);
      },
      py::arg("args"),
      "CPU: check the centers (IndexError) and their neighbour ranges (ValueError), write the int32 "
      "offsets [n + 1] and return the number of samples.");
  m.def(
      "csr_sample_fill",
      [](const SampleArgs& a) {
        py::gil_scoped_release release;
        sample_fill_cpu(a);
      },
      py::arg("args"), "CPU: sample every center into the outputs sized by csr_sample_offsets.");
  m.def(
      "append_unique",
      [](uintptr_t targets, int64_t nt, uintptr_t neighbors, int64_t nn, bool ids64, uintptr_t out, uintptr_t map) {
        py::gil_scoped_release release;
        return append_unique_cpu(targets, nt, neighbors, nn, ids64, out, map);
      },
      py::arg("targets"), py::arg("nt"), py::arg("neighbors"), py::arg("nn"), py::arg("ids64"), py::arg("out"),
      py::arg("map") = 0,
      "CPU: out = targets + the new neighbour ids in order of first appearance (out holds nt + nn); "
      "map[j] = position of neighbors[j] in out (int32, 0 = not wanted). Returns the length of out.");
  m.def(
      "philox4x32_10",
      [](std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
        std::array<uint32_t, 4> out{};
        philox4x32_10(ctr.data(), key.data(), out.data());
        return out;
      },
      py::arg("counter"), py::arg("key"), "One Philox4x32-10 block (the samplers' random numbers).");

#ifdef DISTKIT_WITH_CUDA
  m.def(
      "csr_sample_counts_cuda",
      [](const SampleArgs& a, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        cuda::sample_counts(a, device, stream);
      },
      py::arg("args"), py::arg("device"), py::arg("stream"),
      "CUDA: offsets[0] = 0, offsets[i + 1] = count of center i (no prefix sum), on the stream.");
  m.def(
      "csr_sample_fill_cuda",
      [](const SampleArgs& a, int device, uintptr_t stream) {
        py::gil_scoped_release release;
        cuda::sample_fill(a, device, stream);
      },
      py::arg("args"), py::arg("device"), py::arg("stream"), "CUDA: csr_sample_fill as a kernel on the stream.");
#else
  const auto no_cuda = [](const SampleArgs&, int, uintptr_t) {
    throw distkit::Error("GPU sampling needs CUDA, and this build of wholemem has no CUDA support");
  };
  m.def("csr_sample_counts_cuda", no_cuda, py::arg("args"), py::arg("device"), py::arg("stream"));
  m.def("csr_sample_fill_cuda", no_cuda, py::arg("args"), py::arg("device"), py::arg("stream"));
#endif
}

}  // namespace graph
}  // namespace wholemem
