// _kvps: native core of kvps (the engine: engine.hpp, which lists its headers).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "distkit/dtype.hpp"
#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "distkit/pybind.hpp"
#include "engine.hpp"
#include "intent.hpp"
#include "pooling.hpp"
#include "progress.hpp"
#include "protocol.hpp"
#include "relocation.hpp"
#include "worker_ops.hpp"

namespace py = pybind11;
using distkit::nogil;
using distkit::ptr;
using kvps::Engine;

namespace {

py::array_t<int64_t> to_array(const std::vector<int64_t>& v) {
  py::array_t<int64_t> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(int64_t));
  return a;
}

}  // namespace

PYBIND11_MODULE(_kvps, m) {
  m.doc() = "native core of kvps";
  distkit::init_module(m);
  m.def("mpi_library_version", &distkit::mpi::library_version);

  // the codes Python passes to the engine, defined once (here and in the headers)
  m.attr("PULL") = static_cast<int>(kvps::M_PULL);
  m.attr("PUSH") = static_cast<int>(kvps::M_PUSH);
  m.attr("SET") = static_cast<int>(kvps::M_SET);
  py::dict techniques;
  techniques["all"] = static_cast<int>(kvps::T_ALL);
  techniques["replication_only"] = static_cast<int>(kvps::T_REPL_ONLY);
  techniques["relocation_only"] = static_cast<int>(kvps::T_RELOC_ONLY);
  techniques["none"] = static_cast<int>(kvps::T_NONE);
  m.attr("TECHNIQUES") = techniques;
  py::dict states;
  states["not_here"] = static_cast<int>(kvps::NOT_HERE);
  states["owned"] = static_cast<int>(kvps::OWNED);
  states["replica"] = static_cast<int>(kvps::REPLICA);
  states["incoming"] = static_cast<int>(kvps::INCOMING);
  m.attr("KEY_STATES") = states;
  m.def(
      "probe_keys",
      [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys) {
        py::array_t<bool> out(keys.size());
        const int64_t* k = keys.data();
        bool* o = out.mutable_data();
        for (py::ssize_t i = 0; i < keys.size(); ++i) o[i] = kvps::IntentLedger::probe(k[i]);
        return out;
      },
      py::arg("keys"), "Which keys are the intent ledger's probe keys (ledger.hpp), as a bool array.");
  m.def(
      "ledger_first_judgement",
      [](int64_t lookahead) {
        return kvps::IntentLedger::first_judgement(lookahead, kvps::intent_round_of(lookahead, false));
      },
      py::arg("lookahead"),
      "The clock at which the intent ledger first judges whether intent pays, between hosts (ledger.hpp).");
  py::dict rules;
  rules["add"] = static_cast<int>(kvps::R_ADD);
  rules["sgd"] = static_cast<int>(kvps::R_SGD);
  rules["adagrad"] = static_cast<int>(kvps::R_ADAGRAD);
  rules["rowwise_adagrad"] = static_cast<int>(kvps::R_ROWWISE_ADAGRAD);
  rules["adam"] = static_cast<int>(kvps::R_ADAM);
  m.attr("RULES") = rules;
  py::dict dtypes;  // the value dtypes an engine accepts, by name
  for (auto d : {distkit::DType::Float32, distkit::DType::Float64, distkit::DType::Float16, distkit::DType::BFloat16})
    dtypes[distkit::dtype_name(d)] = static_cast<int>(d);
  m.attr("VALUE_DTYPES") = dtypes;

  m.def(
      "bag_grad",
      [](int dtype, uintptr_t grad, int64_t dim, uintptr_t local, uintptr_t order, uintptr_t offsets, int64_t nbags,
         bool include_last, int64_t n, uintptr_t psw, bool mean, int64_t rows, int64_t skip, uintptr_t out) {
        nogil g;
        const kvps::Bags bags{ptr<const int64_t>(offsets), nbags, include_last, n};
        const auto dt = distkit::dtype_from_code(dtype);
        if (dt == distkit::DType::Float32) {
          kvps::bag_grad(ptr<const float>(grad), dim, ptr<const int64_t>(local), ptr<const int64_t>(order), bags,
                         ptr<const float>(psw), mean, rows, skip, ptr<float>(out));
        } else if (dt == distkit::DType::Float64) {
          kvps::bag_grad(ptr<const double>(grad), dim, ptr<const int64_t>(local), ptr<const int64_t>(order), bags,
                         ptr<const double>(psw), mean, rows, skip, ptr<double>(out));
        } else {
          throw distkit::TypeError("bag_grad: float32 or float64 only");
        }
      },
      "Gradient of sum/mean bags w.r.t. their rows (pooling.hpp); pointers to contiguous CPU buffers, psw 0: none.");

  py::class_<Engine>(m, "Engine")
      .def(py::init([](uintptr_t comm, uintptr_t coll, int64_t num_keys, uintptr_t lengths, int64_t uniform_len,
                       int dtype, int workers, int technique, int64_t lookahead, int64_t sync_every, bool prefault,
                       bool shared_memory, int rule, double lr, double eps, double beta1, double beta2,
                       double link_rate) {
             nogil g;  // (collective: the link probe may take a fraction of a second)
             return new Engine(comm, coll, num_keys, ptr<const int64_t>(lengths), uniform_len, dtype, workers,
                               technique, lookahead, sync_every, prefault, shared_memory,
                               kvps::Rule{rule, lr, eps, beta1, beta2}, link_rate);
           }),
           py::arg("comm"), py::arg("coll"), py::arg("num_keys"), py::arg("lengths"), py::arg("uniform_len"),
           py::arg("dtype"),
           py::arg("num_workers"), py::arg("technique"), py::arg("lookahead"), py::arg("sync_every") = 1,
           py::arg("prefault") = false, py::arg("shared_memory") = true, py::arg("rule") = 0, py::arg("lr") = 0.0,
           py::arg("eps") = 0.0, py::arg("beta1") = 0.0, py::arg("beta2") = 0.0, py::arg("link_rate") = -1.0)
      .def("stats",
           [](Engine& e) {
             auto s = e.stats();
             return py::make_tuple(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13]);
           })
      .def_property_readonly("shares_memory", &Engine::shares_memory)
      .def_property_readonly("rank", &Engine::rank)
      .def_property_readonly("size", &Engine::size)
      .def_property_readonly("num_keys", &Engine::num_keys)
      .def("key_state", &Engine::key_state)
      .def("num_replicas", &Engine::num_replicas)
      .def("value_count",
           [](Engine& e, uintptr_t keys, int64_t n) {
             nogil g;
             return e.value_count(ptr<const int64_t>(keys), n);
           })
      .def("op",
           [](Engine& e, int op, int worker, uintptr_t keys, int64_t n, uintptr_t vals) {
             nogil g;
             return e.op(op, worker, ptr<const int64_t>(keys), n, ptr<char>(vals));
           })
      .def("localize",
           [](Engine& e, int worker, uintptr_t keys, int64_t n) {
             nogil g;
             return e.localize(worker, ptr<const int64_t>(keys), n);
           })
      .def("intent",
           [](Engine& e, int worker, uintptr_t keys, int64_t n, int64_t start, int64_t end) {
             nogil g;
             e.intent(worker, ptr<const int64_t>(keys), n, start, end);
           })
      .def("advance_clock", &Engine::advance_clock, py::call_guard<nogil>())
      .def("current_clock", &Engine::current_clock)
      .def("wait_sync", &Engine::wait_sync, py::call_guard<nogil>())
      .def("wait", &Engine::wait, py::call_guard<nogil>())
      .def("waitall", &Engine::waitall, py::call_guard<nogil>())
      .def("barrier", &Engine::barrier, py::call_guard<nogil>())
      .def("worker_barrier", &Engine::worker_barrier, py::call_guard<nogil>())
      .def("owned_keys",
           [](Engine& e) {
             std::vector<int64_t> k;
             {
               nogil g;
               k = e.owned_keys();
             }
             return to_array(k);
           })
      .def("slot_lengths", [](Engine& e) { return to_array(e.slot_lengths()); })
      .def_property_readonly("uniform_slot_len", &Engine::uniform_slot_len)
      .def("read_slots",
           [](Engine& e, uintptr_t keys, int64_t n, uintptr_t out) {
             nogil g;
             e.read_slots(ptr<const int64_t>(keys), n, ptr<char>(out));
           })
      .def("write_slots",
           [](Engine& e, uintptr_t keys, int64_t n, uintptr_t in) {
             nogil g;
             e.write_slots(ptr<const int64_t>(keys), n, ptr<const char>(in));
           })
      .def("reset_ownership", &Engine::reset_ownership, py::call_guard<nogil>())
      .def("begin_shutdown", &Engine::begin_shutdown)
      .def("abandon", &Engine::abandon, py::call_guard<nogil>())
      .def("stop", &Engine::stop, py::call_guard<nogil>());
}
