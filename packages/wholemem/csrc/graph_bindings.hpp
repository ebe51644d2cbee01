// graph_bindings.hpp - the graph ops of the _wholemem extension (graph_bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace wholemem {
namespace graph {

/// Add the graph ops (sampling, append_unique, Philox) to the extension module.
void register_graph(pybind11::module_& m);

}  // namespace graph
}  // namespace wholemem
