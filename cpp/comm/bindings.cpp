// _C.cp: the context-parallel collective interface (cp::Comm) for Python.
//
// From a torch.distributed ProcessGroup to the C++ c10d::ProcessGroup: torch
// binds ProcessGroup with pybind11, this module uses nanobind, and casting
// across the two binding libraries would tie us to pybind11's internals ABI
// (its internals id must match the one torch was built with). Instead we use
// torch's own group registry, the path torch's functional collectives take
// (torch.ops._c10d_functional resolves groups by name): every group that
// torch.distributed creates (init_process_group, new_group, split_group) is
// registered in C++ under its ProcessGroup.group_name
// (c10d::register_process_group). The binding reads group_name, checks with
// torch._C._distributed_c10d._resolve_process_group that the registry entry
// under that name is this very Python object (pybind11 returns the one Python
// wrapper of a C++ object, so `is` proves it is the same c10d::ProcessGroup),
// and then takes the intrusive_ptr from c10d::resolve_process_group. Checked
// with torch 2.13.0 for the default group and new_group subgroups
// (tests/python/test_cp_comm.py). Anything else (a non-member's
// GroupMember.NON_GROUP_MEMBER, a name that is not registered) is a ValueError.
#include <ATen/core/Tensor.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace aar::bindings {
namespace {

namespace nb = nanobind;
using namespace nb::literals;

c10::intrusive_ptr<c10d::ProcessGroup> process_group_from_python(nb::handle group) {
  nb::module_ c10d_py = nb::module_::import_("torch._C._distributed_c10d");
  nb::object pg_type = c10d_py.attr("ProcessGroup");
  if (!nb::isinstance(group, pg_type)) {
    throw_invalid("group must be a torch.distributed ProcessGroup, got ",
                  nb::cast<std::string>(nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(group.ptr()))))),
                  " (a rank outside a new_group() gets a non-member placeholder, not a group)");
  }
  const std::string name = nb::cast<std::string>(group.attr("group_name"));
  nb::object registered;
  try {
    registered = c10d_py.attr("_resolve_process_group")(name);
  } catch (const nb::python_error& e) {
    throw_invalid("group: its group_name '", name, "' is not in torch's process-group registry: ", e.what());
  }
  AAR_CHECK_ARG(registered.is(group), "group: the process group registered under group_name '", name,
                "' is a different object than the one passed");
  c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(name);
  const int py_rank = nb::cast<int>(group.attr("rank")());
  const int py_size = nb::cast<int>(group.attr("size")());
  AAR_CHECK_ARG(pg->getRank() == py_rank && pg->getSize() == py_size, "group '", name, "': C++ sees rank ",
                pg->getRank(), " of ", pg->getSize(), ", Python rank ", py_rank, " of ", py_size);
  return pg;
}

cp::CommOptions options_of(double timeout_s, bool log) {
  AAR_CHECK_ARG(std::isfinite(timeout_s) && timeout_s > 0, "timeout_s must be a positive number of seconds, got ",
                timeout_s);
  cp::CommOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout_s * 1000.0)));
  o.log = log;
  return o;
}

std::optional<at::Tensor> opt_out(nb::handle out) {
  if (out.is_none()) return std::nullopt;
  return borrow_tensor(out, "out", false);
}

// The GIL is never held while c10d runs: gloo's worker thread destroys a
// finished work (and so the last reference to a tensor whose Python object is
// gone, which takes the GIL) while holding the queue mutex that the next
// enqueue needs. Holding the GIL across a launch or a wait deadlocks against
// it; torch's own bindings release the GIL around every collective for this
// reason. So: launches, waits and the destructor's wait all run without it.
struct PyCommWork {
  cp::CommWork w;
  explicit PyCommWork(cp::CommWork&& x) : w(std::move(x)) {}
  ~PyCommWork() {
    if (!w.waited()) {
      nb::gil_scoped_release nogil;
      try {
        w.wait();
      } catch (...) {
        // Dropped without wait(): nobody asked for the error.
      }
    }
  }
};

// A sync call returns the tensor, an async one the handle (torch.distributed's convention).
template <typename Sync, typename Async>
nb::object run(bool async_op, Sync&& sync, Async&& async) {
  if (async_op) {
    cp::CommWork w;
    {
      nb::gil_scoped_release nogil;
      w = async();
    }
    return nb::cast(new PyCommWork(std::move(w)), nb::rv_policy::take_ownership);
  }
  at::Tensor r;
  {
    nb::gil_scoped_release nogil;
    r = sync();
  }
  return nb::cast(r);
}

void bind_cp(nb::module_& m) {
  nb::module_ c = m.def_submodule("cp", "Context parallelism: the collective interface (cp::Comm)");

  nb::class_<PyCommWork>(c, "CommWork", "Handle of an asynchronous collective (cp::CommWork)")
      .def(
          "wait",
          [](PyCommWork& h) {
            {
              nb::gil_scoped_release nogil;
              h.w.wait();
            }
            return h.w.output();
          },
          "Block until done (bounded by the Comm's timeout); returns the output. Raises RuntimeError on failure.")
      .def("is_completed", [](const PyCommWork& h) { return h.w.is_completed(); })
      .def_prop_ro("waited", [](const PyCommWork& h) { return h.w.waited(); })
      .def_prop_ro("output", [](const PyCommWork& h) { return h.w.output(); });

  nb::class_<cp::Comm>(c, "Comm",
                       "The collective interface of the CP paths over a torch.distributed ProcessGroup "
                       "(cp::Comm, include/ascend_attn_rt/comm/comm.h)")
      .def(
          "__init__",
          [](cp::Comm* self, nb::handle group, double timeout_s, bool log) {
            auto pg = process_group_from_python(group);
            new (self) cp::Comm(std::move(pg), options_of(timeout_s, log));
          },
          "group"_a, "timeout_s"_a = 60.0, "log"_a = false)
      .def_static(
          "from_group_name",
          [](const std::string& name, double timeout_s, bool log) {
            return cp::Comm::from_group_name(name, options_of(timeout_s, log));
          },
          "group_name"_a, "timeout_s"_a = 60.0, "log"_a = false)
      .def_prop_ro("rank", &cp::Comm::rank)
      .def_prop_ro("size", &cp::Comm::size)
      .def_prop_ro("group_name", &cp::Comm::group_name)
      .def_prop_ro("timeout_s", [](const cp::Comm& c) { return c.timeout().count() / 1000.0; })
      .def(
          "all_gather",
          [](cp::Comm& c, const at::Tensor& t, int64_t dim, nb::handle out, bool async_op) {
            const auto o = opt_out(out);
            return run(
                async_op, [&] { return c.all_gather(t, dim, o); }, [&] { return c.all_gather_async(t, dim, o); });
          },
          "t"_a, "dim"_a = 0, "out"_a = nb::none(), "async_op"_a = false,
          "Concatenate every rank's t along dim (rank order); into out when given.")
      .def(
          "all_to_all_single",
          [](cp::Comm& c, const at::Tensor& t, nb::handle out, bool async_op) {
            const auto o = opt_out(out);
            return run(
                async_op, [&] { return c.all_to_all_single(t, o); },
                [&] { return c.all_to_all_single_async(t, o); });
          },
          "t"_a, "out"_a = nb::none(), "async_op"_a = false,
          "Equal splits over dim 0: block i of the result is block `rank` of rank i's t.")
      .def(
          "reduce_scatter",
          [](cp::Comm& c, const at::Tensor& t, int64_t dim, nb::handle out, bool async_op) {
            const auto o = opt_out(out);
            return run(
                async_op, [&] { return c.reduce_scatter(t, dim, o); },
                [&] { return c.reduce_scatter_async(t, dim, o); });
          },
          "t"_a, "dim"_a = 0, "out"_a = nb::none(), "async_op"_a = false,
          "Block `rank` (along dim) of the sum over ranks of t.")
      .def(
          "all_reduce",
          [](cp::Comm& c, const at::Tensor& t) {
            // Without the GIL, as every collective here (the PyCommWork note above).
            nb::gil_scoped_release nogil;
            return c.all_reduce(t);
          },
          "t"_a, "In place: t (contiguous) becomes the sum over ranks; returns t.")
      .def_prop_ro("calls", [](const cp::Comm& c) { return c.calls(); })
      .def_prop_ro("collective_ns", &cp::Comm::collective_ns,
                   "Wall time inside the synchronous collectives so far (reset by reset_counters)")
      .def(
          "calls_of",
          [](const cp::Comm& c, const std::string& op) {
            for (int32_t i = 0; i < cp::kNumCommOps; ++i) {
              if (op == cp::to_string(static_cast<cp::CommOp>(i))) return c.calls(static_cast<cp::CommOp>(i));
            }
            throw_invalid("op must be 'all_gather', 'all_to_all_single', 'reduce_scatter' or 'all_reduce', got '", op,
                          "'");
          },
          "op"_a)
      .def_prop_ro(
          "log",
          [](const cp::Comm& c) {
            std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::string, int64_t, bool>> r;
            r.reserve(c.log().size());
            for (const auto& e : c.log()) {
              r.emplace_back(e.group, cp::to_string(e.op), e.shape, c10::toString(e.dtype), e.dim, e.async);
            }
            return r;
          },
          "(group, op, input shape, dtype, dim, async) per call, when constructed with log=True")
      .def("reset_counters", &cp::Comm::reset_counters);

  // The shared DCP exchange (comm/dcp_exchange.h), for tests and for backends written in Python.
  c.def(
      "gather_query_heads",
      [](cp::Comm& comm, const at::Tensor& q, nb::handle out) {
        const auto o = opt_out(out);
        nb::gil_scoped_release nogil;
        return cp::gather_query_heads(comm, q, o);
      },
      "comm"_a, "q"_a, "out"_a = nb::none(), "q (T, H, D) gathered along the head axis over the DCP group: (T, W*H, D).");
  c.def(
      "combine_partials",
      [](cp::Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, const at::Tensor& out,
         nb::handle lse_out) {
        const auto l = opt_out(lse_out);
        at::Tensor o = out;
        nb::gil_scoped_release nogil;
        cp::combine_partials(comm, partial_out, partial_lse, o, l);
      },
      "comm"_a, "partial_out"_a, "partial_lse"_a, "out"_a, "lse_out"_a = nb::none(),
      "All-to-all of this rank's partial (T, W*H, D) + LSE (T, W*H, 1) over the DCP group and the LSE merge "
      "of this rank's own H heads into out (T, H, D) (and lse_out (T, H, 1)).");
}

const BindingRegistrar kRegisterCp(/*order=*/900, &bind_cp);

}  // namespace
}  // namespace aar::bindings
