// Python facade of the graph layer: the parameter store, capture scope, per-step
// update and (CPU) replay, and the provider hooks filled from Python.
#include <ATen/ATen.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/cp/gqa_dcp_graph.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/gqa/graph.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"
#include "ascend_attn_rt/mla/graph.h"
#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/sfa/graph.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "common.h"
#include "tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {

namespace {

using graph::GraphHooks;
using graph::GraphParams;
using graph::Handle;

nb::object as_object(Handle h) { return h ? nb::borrow<nb::object>(nb::handle(static_cast<PyObject*>(h))) : nb::none(); }

// Hooks that call Python callables (torch_npu's graph-task-update API, or test
// doubles). Objects returned by create_event / task_group_end are kept alive by
// the store until the bucket is released.
GraphHooks python_hooks(nb::object create_event, nb::object event_wait_and_reset, nb::object task_group_begin,
                        nb::object task_group_end, nb::object task_update_begin, nb::object task_update_end,
                        nb::object event_record, nb::object launch_host_func) {
  GraphHooks h;
  if (!create_event.is_none())
    h.create_event = [f = create_event]() -> Handle { return f().release().ptr(); };
  if (!event_wait_and_reset.is_none())
    h.event_wait_and_reset = [f = event_wait_and_reset](Handle e) { f(as_object(e)); };
  if (!task_group_begin.is_none()) h.task_group_begin = [f = task_group_begin]() { f(); };
  if (!task_group_end.is_none())
    h.task_group_end = [f = task_group_end]() -> Handle { return f().release().ptr(); };
  if (!task_update_begin.is_none())
    h.task_update_begin = [f = task_update_begin](Handle t) { f(as_object(t)); };
  if (!task_update_end.is_none()) h.task_update_end = [f = task_update_end]() { f(); };
  if (!event_record.is_none()) h.event_record = [f = event_record](Handle e) { f(as_object(e)); };
  if (!launch_host_func.is_none()) {
    // f(run): launch `run` (a callable of no argument) as a host function on the captured stream. `run`
    // calls back into C++ without the GIL (the callback's work is the runtime's).
    h.launch_host_func = [f = launch_host_func](void (*fn)(void*), void* arg) {
      nb::gil_scoped_acquire gil;
      f(nb::cpp_function([fn, arg]() {
        nb::gil_scoped_release nogil;
        fn(arg);
      }));
    };
  }
  h.release = [](Handle e, Handle t) {
    nb::gil_scoped_acquire gil;
    Py_XDECREF(static_cast<PyObject*>(e));
    Py_XDECREF(static_cast<PyObject*>(t));
  };
  return h;
}

// One metadata (GQA, or MLA's decode part) or a sequence of them.
graph::StepParams step_params_of(nb::handle item) {
  if (nb::isinstance<gqa::Metadata>(item)) return gqa::graph_step_params(*nb::cast<const gqa::Metadata*>(item));
  if (nb::isinstance<mla::Metadata>(item)) return mla::graph_step_params(*nb::cast<const mla::Metadata*>(item));
  if (nb::isinstance<gqa::DcpMetadata>(item)) {
    return gqa::dcp_graph_step_params(*nb::cast<const gqa::DcpMetadata*>(item));
  }
  if (nb::isinstance<sfa::Metadata>(item)) return sfa::graph_step_params(*nb::cast<const sfa::Metadata*>(item));
  if (nb::isinstance<cp::PcpMetadata>(item)) return cp::graph_step_params(*nb::cast<const cp::PcpMetadata*>(item));
  throw_invalid("metadata must be a Metadata (GQA/C8/FA3), an mla Metadata, a DcpMetadata, an sfa Metadata, a "
                "PcpMetadata, or a sequence of them");
}

std::vector<graph::StepParams> metadata_list(nb::handle md) {
  std::vector<graph::StepParams> out;
  if (nb::isinstance<gqa::Metadata>(md) || nb::isinstance<mla::Metadata>(md) || nb::isinstance<gqa::DcpMetadata>(md) ||
      nb::isinstance<sfa::Metadata>(md) || nb::isinstance<cp::PcpMetadata>(md)) {
    out.push_back(step_params_of(md));
    return out;
  }
  if (!nb::isinstance<nb::list>(md) && !nb::isinstance<nb::tuple>(md)) {
    throw_invalid("metadata must be a Metadata (GQA/C8/FA3), an mla Metadata, a DcpMetadata, an sfa Metadata, a "
                  "PcpMetadata, or a list/tuple of them, got ",
                  nb::str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(md.ptr())))).c_str());
  }
  for (nb::handle item : md) out.push_back(step_params_of(item));
  return out;
}

// Context manager returned by GraphParams.capture(n).
struct CaptureCtx {
  GraphParams* g;
  int64_t n;
};

void bind_graph(nb::module_& m) {
  nb::enum_<graph::WorkspacePolicy>(m, "WorkspacePolicy")
      .value("FirstWins", graph::WorkspacePolicy::FirstWins)
      .value("MaxOverLayers", graph::WorkspacePolicy::MaxOverLayers);

  nb::class_<CaptureCtx>(m, "GraphCapture")
      .def("__enter__", [](CaptureCtx& c) { c.g->begin_capture(c.n); return c.n; })
      .def("__exit__", [](CaptureCtx& c, nb::handle exc_type, nb::handle, nb::handle) {
        if (!c.g->capturing()) return false;
        if (exc_type.is_none()) {
          c.g->end_capture();
        } else {
          c.g->abort_capture();
        }
        return false;
      }, "exc_type"_a.none(), "exc"_a.none(), "tb"_a.none());

  nb::class_<GraphParams>(m, "GraphParams")
      .def(
          "__init__",
          [](GraphParams* self, const std::string& provider, bool use_max_workspace, nb::object create_event,
             nb::object event_wait_and_reset, nb::object task_group_begin, nb::object task_group_end,
             nb::object task_update_begin, nb::object task_update_end, nb::object event_record,
             nb::object launch_host_func) {
            std::shared_ptr<graph::GraphProvider> p;
            if (provider == "recording") {
              p = std::make_shared<graph::RecordingGraphProvider>();
            } else if (provider == "noop") {
              p = std::make_shared<graph::HookGraphProvider>(GraphHooks{});
            } else if (provider == "hooks") {
              p = std::make_shared<graph::HookGraphProvider>(
                  python_hooks(create_event, event_wait_and_reset, task_group_begin, task_group_end,
                               task_update_begin, task_update_end, event_record, launch_host_func));
            } else {
              throw_invalid("provider must be 'recording' (CPU), 'hooks' (NPU: torch_npu graph-task API) or "
                            "'noop', got '", provider, "'");
            }
            new (self) GraphParams(p, use_max_workspace ? graph::WorkspacePolicy::MaxOverLayers
                                                        : graph::WorkspacePolicy::FirstWins);
          },
          "provider"_a = "recording", nb::kw_only(), "use_max_workspace"_a = false, "create_event"_a = nb::none(),
          "event_wait_and_reset"_a = nb::none(), "task_group_begin"_a = nb::none(), "task_group_end"_a = nb::none(),
          "task_update_begin"_a = nb::none(), "task_update_end"_a = nb::none(), "event_record"_a = nb::none(),
          "launch_host_func"_a = nb::none())
      .def("capture", [](GraphParams& g, int64_t n) { return CaptureCtx{&g, n}; }, "num_tokens"_a,
           nb::keep_alive<0, 1>())
      .def("begin_capture", &GraphParams::begin_capture, "num_tokens"_a)
      .def("end_capture", &GraphParams::end_capture)
      .def("abort_capture", &GraphParams::abort_capture)
      .def_prop_ro("capturing", &GraphParams::capturing)
      .def(
          "update", [](GraphParams& g, int64_t n, nb::handle md) { g.update(n, metadata_list(md)); },
          "num_tokens"_a, "metadata"_a,
          "Refresh every captured call of the bucket from the step's metadata (one Metadata, or one per "
          "KV-cache group).")
      .def(
          "update_draft", [](GraphParams& g, int64_t n, nb::handle md) { g.update_draft(n, metadata_list(md)); },
          "num_tokens"_a, "metadata"_a)
      .def(
          "replay",
          [](GraphParams& g, int64_t n) {
            // A replay may run collectives (DCP decode): never with the GIL
            // held (cp_bindings.cpp).
            nb::gil_scoped_release nogil;
            g.replay(n);
          },
          "num_tokens"_a)
      .def("has", &GraphParams::has, "num_tokens"_a)
      .def("buckets", &GraphParams::buckets)
      .def("release", &GraphParams::release, "num_tokens"_a)
      .def("release_all", &GraphParams::release_all)
      .def(
          "calls",
          [](const GraphParams& g, int64_t n) {
            std::vector<std::tuple<std::string, int64_t, int32_t>> out;
            for (const auto& r : g.bucket(n).calls) {
              out.emplace_back(r.call->kind(), r.call->layer_index(), r.call->group());
            }
            return out;
          },
          "num_tokens"_a, "(kind, layer_index, group) of every recorded call, in update order")
      .def(
          "captured_lists",
          [](const GraphParams& g, int64_t n) {
            // Test introspection: what each parameterised call would replay with right now.
            using Lists = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>, int64_t>;
            std::vector<Lists> out;
            for (const auto& r : g.bucket(n).calls) {
              if (!r.call->has_params()) continue;
              graph::CallInfo i = r.call->info();
              out.emplace_back(r.call->kind(), std::move(i.q_ends), std::move(i.kv_lens),
                               reinterpret_cast<int64_t>(i.table));
            }
            return out;
          },
          "num_tokens"_a,
          "(kind, query ends, KV lengths, block-table address) of every parameterised call, in update order "
          "(tests: which step's parameters a replay would use)")
      .def(
          "call_addresses",
          [](const GraphParams& g, int64_t n) {
            // The device addresses a replay reads and writes: they must not
            // move between steps (the device graph baked them in).
            auto ptr = [](const void* p) { return reinterpret_cast<int64_t>(p); };
            std::vector<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t>> out;
            for (const auto& r : g.bucket(n).calls) {
              const graph::CallInfo i = r.call->info();
              out.emplace_back(r.call->kind(), ptr(i.input), ptr(i.output), ptr(i.lse), ptr(i.table));
            }
            return out;
          },
          "num_tokens"_a,
          "(kind, query, output, lse, block table / slot mapping) data pointers of every recorded call "
          "(KV writes: key, key cache, -, slot mapping; 0 where absent), in update order")
      .def(
          "workspaces",
          [](const GraphParams& g, int64_t n) {
            const graph::Bucket& b = g.bucket(n);
            return std::make_pair(b.workspace(graph_calls::kFiaWorkspace), b.workspace(gqa::kPagedAttentionWorkspace));
          },
          "num_tokens"_a, "(fused-attention workspace, paged-attention workspace) of a bucket (None if absent)")
      .def_prop_ro("provider", [](GraphParams& g) { return std::string(g.provider().name()); })
      .def_prop_ro("update_log",
                   [](GraphParams& g) {
                     auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
                     AAR_CHECK_ARG(r != nullptr, "update_log exists for the recording provider only");
                     return r->update_log();
                   })
      .def("clear_update_log",
           [](GraphParams& g) {
             if (auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider())) r->clear_update_log();
           })
      .def_prop_rw(
          "defer_host_callbacks",
          [](GraphParams& g) {
            auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
            return r != nullptr && r->defers_host_callbacks();
          },
          [](GraphParams& g, bool on) {
            auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
            AAR_CHECK_ARG(r != nullptr, "defer_host_callbacks exists for the recording provider only (a device "
                          "stream defers them by itself)");
            r->set_defer_host_callbacks(on);
          },
          "Recording provider, a test mode (docs/design/graph.md §1.6): a replay queues its calls from the first "
          "host callback on, as a device stream runs them after the host moved on; run_deferred() runs them.")
      .def(
          "run_deferred",
          [](GraphParams& g) {
            auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
            AAR_CHECK_ARG(r != nullptr, "run_deferred exists for the recording provider only");
            nb::gil_scoped_release nogil;
            return r->run_deferred();
          },
          "Runs the queued replay work in order; returns how many calls ran.")
      .def_prop_ro("deferred",
                   [](GraphParams& g) {
                     auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
                     return r != nullptr ? static_cast<int64_t>(r->deferred()) : int64_t{0};
                   })
      .def_prop_ro("live_events", [](GraphParams& g) {
        auto* r = dynamic_cast<graph::RecordingGraphProvider*>(&g.provider());
        AAR_CHECK_ARG(r != nullptr, "live_events exists for the recording provider only");
        return r->live_events();
      });
}

const BindingRegistrar kRegisterGraph(/*order=*/50, &bind_graph);

}  // namespace

}  // namespace aar::bindings
