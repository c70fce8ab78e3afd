// module.cc — the Python module shoal._C: the backend class PyTorch's
// process groups hold, and its constructor. Registration with
// torch.distributed is done in Python (python/shoal/torch.py); and the table
// of SHOAL_* knobs with the values in effect, for `python -m shoal.info`.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend.h"
#include "common/env.h"

namespace py = pybind11;
using shoal::torch_adapter::BackendConfig;
using shoal::torch_adapter::ShoalBackend;

PYBIND11_MODULE(_C, m) {
  m.doc() = "shoal's torch.distributed backend (C++ adapter over shoal::Communicator)";
  // The base class is registered by torch's own module.
  py::module_::import("torch.distributed");

  py::class_<ShoalBackend, c10d::Backend, c10::intrusive_ptr<ShoalBackend>>(m, "ShoalBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
                       const std::string& name, const std::string& group_name, const std::string& advertise_host,
                       std::vector<int64_t> global_ranks, int store_host_rank, bool own_connections) {
             BackendConfig cfg;
             cfg.name = name;
             cfg.group_name = group_name;
             cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
             cfg.advertise_host = advertise_host;
             cfg.global_ranks = std::move(global_ranks);
             cfg.store_host_rank = store_host_rank;
             cfg.own_connections = own_connections;
             return c10::make_intrusive<ShoalBackend>(store, rank, size, std::move(cfg));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s") = 1800.0,
           py::arg("name") = "shoal", py::arg("group_name") = "", py::arg("advertise_host") = "",
           py::arg("global_ranks") = std::vector<int64_t>{}, py::arg("store_host_rank") = -1,
           py::arg("own_connections") = false,
           py::call_guard<py::gil_scoped_release>())
      .def("comm_error", &ShoalBackend::comm_error, py::call_guard<py::gil_scoped_release>(),
           "The first error that broke this group's communicator ('' if none).")
      .def(
          "abort_because", [](ShoalBackend& be, const std::string& reason) { be.abort(reason); },
          py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
          "Aborts the group (as abort()); its operations fail with 'aborted: <reason>'.")
      .def("suspects", &ShoalBackend::suspects, py::call_guard<py::gil_scoped_release>(),
           "The group ranks the communicator's error blames (the lost peer, the ranks silent at a roll call).")
      .def(
          "agree",
          [](ShoalBackend& be, double window_s, std::vector<int> suspects) {
            return be.agree(std::chrono::milliseconds(static_cast<int64_t>(window_s * 1000.0)), std::move(suspects));
          },
          py::arg("window_s") = 10.0, py::arg("suspects") = std::vector<int>{},
          py::call_guard<py::gil_scoped_release>(),
          "Agrees with the other live ranks of the group on who goes on (shoal::Communicator::agree); returns "
          "their group ranks, the same on every rank that returns.")
      .def("comm_id", &ShoalBackend::comm_id, "The id of the group's communicator (the same on every rank).")
      .def(
          "grow",
          [](ShoalBackend& be, const c10::intrusive_ptr<c10d::Store>& lobby, int joiners, double timeout_s) {
            return be.grow(lobby, joiners, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
          },
          py::arg("lobby"), py::arg("joiners") = -1, py::arg("timeout_s") = 120.0,
          py::call_guard<py::gil_scoped_release>(),
          "Admits the newcomers waiting in `lobby` (joiners=-1) or exactly `joiners`; returns a backend over the "
          "grown communicator (this group's ranks first), or None when nobody was admitted.")
      .def_static(
          "join",
          [](const c10::intrusive_ptr<c10d::Store>& lobby, double timeout_s, const std::string& name,
             const std::string& advertise_host, double op_timeout_s) {
            BackendConfig cfg;
            cfg.name = name;
            cfg.advertise_host = advertise_host;
            cfg.timeout = std::chrono::milliseconds(static_cast<int64_t>(op_timeout_s * 1000.0));
            return ShoalBackend::join_grown(lobby, std::move(cfg),
                                      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
          },
          py::arg("lobby"), py::arg("timeout_s") = 120.0, py::arg("name") = "shoal", py::arg("advertise_host") = "",
          py::arg("op_timeout_s") = 1800.0, py::call_guard<py::gil_scoped_release>(),
          "A newcomer's side of grow(): waits in `lobby` until a group's grow() admits it; returns its backend.")
      .def(
          "device_staging",
          [](ShoalBackend& be) -> py::object {
            auto s = be.staging_stats();
            if (!s) return py::none();
            py::dict d;
            d["device"] = s->device;
            d["cap"] = s->cap;
            d["in_use"] = s->in_use;
            d["high_water"] = s->high_water;
            return d;
          },
          "The pinned staging pool of the group's device (None before any device operation): its cap "
          "(SHOAL_DEVICE_STAGING_BYTES), the bytes handed out now and the most ever.");

  m.def(
      "_quiesce",
      [](double timeout_s) {
        return shoal::torch_adapter::Activity::wait_quiet(
            std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)));
      },
      py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "Waits up to timeout_s until shoal's threads have nothing left to do for torch (at interpreter exit).");

  m.def(
      "knobs",
      [] {
        int n = 0;
        const shoal::env::Knob* k = shoal::env::knobs(&n);
        py::list out;
        for (int i = 0; i < n; ++i) {
          const auto value = shoal::env::get(k[i].name);
          out.append(py::make_tuple(k[i].name, value ? py::object(py::str(*value)) : py::object(py::none()),
                                    shoal::env::is_set(k[i].name),
                                    k[i].shown_default ? k[i].shown_default : k[i].default_value));
        }
        return out;
      },
      "The SHOAL_* knobs (src/common/env.cc), each as (name, value in effect or None, whether it is set "
      "in the environment, the default as docs/knobs.md shows it, '' for none).");
}
