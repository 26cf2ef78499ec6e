// _cohort_torch: the Python face of the "cohort" process group (cohort_torch imports it and
// registers the backend).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

#include "process_group.hpp"

PYBIND11_MODULE(_cohort_torch, m) {
  m.doc() = "cohort's collectives as a torch.distributed process group";
  // torch's classes (Store, ProcessGroup, Work) are registered by torch.distributed.
  pybind11::module_::import("torch.distributed");
  m.def("create_process_group", &cohort_torch::create_process_group, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "The cohort process group of `size` ranks that meet at `store`.");
  m.def("compressed_allreduce", &cohort_torch::compressed_allreduce, pybind11::arg("group"),
        pybind11::arg("bucket"), pybind11::arg("codec"), pybind11::arg("ratio") = 0.01,
        pybind11::arg("error_feedback") = false, pybind11::arg("index") = 0,
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "Averages the float32 `bucket` in place through a codec; returns the work.");
  m.def("transport", &cohort_torch::transport_name, pybind11::arg("group"),
        "The transport of a cohort group: \"shm\" or \"tcp\".");
}
