// Python facade of the SFA backend (submodule `sfa`): backend facts, the cache
// tuple composition, the shared top-k buffer, the metadata builders, and the
// plan layer's build_valid_topk_mask (in `plan`). No logic beyond argument
// conversion.
#include <optional>
#include <ATen/ATen.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <nanobind/trampoline.h>

#include <string>
#include <utility>

#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "ascend_attn_rt/sfa/backend.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/host_pool.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "ascend_attn_rt/sfa/offload.h"
#include "ascend_attn_rt/sfa/pieces.h"
#include "ascend_attn_rt/sfa/preprocess.h"
#include "ascend_attn_rt/latent/quant.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"
#include "ascend_attn_rt/sparse/topk_remap.h"
#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/comm/comm.h"
#include "../bindings/common.h"
#include "../latent/bindings_build_inputs.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {


// Host lists live in the builder and hold its lane's latest build (see gqa_bindings.cpp).
const sfa::Metadata& live(const sfa::Metadata& m) {
  check_current(m.stamp, "metadata");
  return m;
}

// torch dtypes by name, both ways (the dtypes the SFA facts use).
constexpr std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"float16", at::kHalf},    {"bfloat16", at::kBFloat16}, {"float32", at::kFloat},
    {"int8", at::kChar},       {"float8_e4m3fn", at::kFloat8_e4m3fn}};

at::ScalarType dtype_from(nb::handle h, const char* name) {
  std::string s = nb::str(h).c_str();
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  for (const auto& [n, t] : kDtypes) {
    if (s == n) return t;
  }
  throw_invalid(name, " must be torch.float16, torch.bfloat16 or torch.float32, got ", s);
}

nb::object dtype_to(at::ScalarType t) {
  for (const auto& [n, st] : kDtypes) {
    if (st == t) return nb::module_::import_("torch").attr(n);
  }
  throw_invalid("no torch dtype for ", t);
}

nb::list dtypes_to(const std::vector<at::ScalarType>& v) {
  nb::list l;
  for (at::ScalarType t : v) l.append(dtype_to(t));
  return l;
}

// OffloadCopyHooks subclassed in Python (tests count bytes; engines batch).
struct PyOffloadCopyHooks : sfa::OffloadCopyHooks {
  NB_TRAMPOLINE(sfa::OffloadCopyHooks, 3);
  void commit(const at::Tensor& pool_rows, const at::Tensor& slots, const at::Tensor& rows) override {
    NB_OVERRIDE(commit, pool_rows, slots, rows);
  }
  void before_onload() override { NB_OVERRIDE(before_onload); }
  void onload(const at::Tensor& dst_rows, const at::Tensor& dst_index, const at::Tensor& src_rows,
              const at::Tensor& src_index) override {
    NB_OVERRIDE(onload, dst_rows, dst_index, src_rows, src_index);
  }
};

// The pool's pin / unpin callbacks from Python callables taking the address
// as an int. The callable is held so that its last reference is dropped under
// the GIL (the mapping may go on any thread, or after the interpreter ended:
// then it is leaked); an unpin that raises is reported as unraisable (it runs
// from a destructor), a pin that raises propagates.
std::shared_ptr<nb::callable> hold_callable(const nb::callable& f) {
  return std::shared_ptr<nb::callable>(new nb::callable(f), [](nb::callable* c) {
    if (!Py_IsInitialized()) return;  // leaked: nothing to release into
    nb::gil_scoped_acquire g;
    delete c;
  });
}
std::function<void(void*, std::size_t)> pin_from(const std::optional<nb::callable>& f) {
  if (!f.has_value()) return nullptr;
  return [c = hold_callable(*f)](void* p, std::size_t n) {
    nb::gil_scoped_acquire g;
    (*c)(reinterpret_cast<uintptr_t>(p), n);
  };
}
std::function<void(void*)> unpin_from(const std::optional<nb::callable>& f) {
  if (!f.has_value()) return nullptr;
  return [c = hold_callable(*f)](void* p) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire g;
    try {
      (*c)(reinterpret_cast<uintptr_t>(p));
    } catch (nb::python_error& e) {
      e.discard_as_unraisable("ascend_attn_rt.sfa.HostKvPool unpin");
    }
  };
}

// The engine's request ids (sfa::BuildInputs::req_ids): a host 1-D tensor of
// exact identities (int64 / uint64 as they are; int32 / uint32 zero-extended from
// their 32 bits), or a sequence of str, turned into keys that never collide by the
// builder's RequestKeys (plan/request_keys.h).
plan::CSpan<uint64_t> req_id_keys(sfa::MetadataBuilder& b, nb::handle h, std::vector<uint64_t>& keep) {
  if (nb::isinstance<at::Tensor>(h)) {
    const at::Tensor t = nb::cast<at::Tensor>(h);
    AAR_CHECK_ARG(t.defined() && t.device().is_cpu() && t.dim() == 1 && t.is_contiguous(),
                  "req_ids must be a contiguous 1-D host tensor or a sequence of str, got a tensor of shape ",
                  t.defined() ? t.sizes() : c10::IntArrayRef{}, " on ", t.defined() ? t.device() : c10::Device(c10::kCPU));
    const auto dt = t.scalar_type();
    const auto n = static_cast<size_t>(t.numel());
    keep.resize(n);
    if (dt == at::kInt || dt == at::kUInt32) {
      const auto* p = static_cast<const uint32_t*>(t.const_data_ptr());
      for (size_t i = 0; i < n; ++i) keep[i] = p[i];
    } else {
      AAR_CHECK_ARG(dt == at::kLong || dt == at::kUInt64, "req_ids must be int64, uint64, int32 or uint32, got ", dt);
      const auto* p = static_cast<const uint64_t*>(t.const_data_ptr());
      std::copy(p, p + n, keep.begin());
    }
    return {keep.data(), keep.size()};
  }
  AAR_CHECK_ARG(nb::isinstance<nb::sequence>(h) && !nb::isinstance<nb::str>(h),
                "req_ids must be a 1-D host integer tensor or a sequence of str, got ", nb::inst_name(h).c_str());
  std::vector<std::string_view> ids;
  const nb::sequence seq = nb::borrow<nb::sequence>(h);
  const size_t n = nb::len(seq);
  ids.reserve(n);
  std::vector<nb::object> hold;  // the items stay alive while their views are read
  hold.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    nb::object item = seq[i];
    AAR_CHECK_ARG(nb::isinstance<nb::str>(item), "req_ids[", i, "] must be a str (or pass an integer tensor), got ",
                  nb::inst_name(item).c_str());
    Py_ssize_t len = 0;
    const char* c = PyUnicode_AsUTF8AndSize(item.ptr(), &len);
    if (c == nullptr) throw nb::python_error();
    ids.emplace_back(c, static_cast<size_t>(len));
    hold.push_back(std::move(item));
  }
  keep.resize(n);
  b.request_keys().assign(plan::CSpan<std::string_view>(ids.data(), n), plan::Span<uint64_t>(keep.data(), n));
  return {keep.data(), keep.size()};
}

sfa::BuildInputs sfa_build_inputs(sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt,
                                  int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
                                  const std::optional<at::Tensor>& num_spec_tokens, nb::handle req_ids,
                                  const std::optional<at::Tensor>& is_prefilling, std::vector<uint64_t>& keep) {
  sfa::BuildInputs in = latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens);
  if (!req_ids.is_none()) in.req_ids = req_id_keys(b, req_ids, keep);
  in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
  return in;
}

nb::dict stats_dict(const sfa::OffloadStepStats& s) {
  nb::dict d;
  d["route"] = sfa::to_string(s.route);
  d["decode_rows"] = s.decode_rows;
  d["prefill_tokens"] = s.prefill_tokens;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["resets"] = s.resets;
  d["invalidated"] = s.invalidated;
  d["duplicates"] = s.duplicates;
  d["onload_bytes"] = s.onload_bytes;
  d["commit_bytes"] = s.commit_bytes;
  d["decided_by"] = s.decided_by;
  d["resynced"] = s.resynced;
  return d;
}

template <typename T>
std::vector<int64_t> span_list(plan::CSpan<T> s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

void bind_sfa(nb::module_& root) {
  nb::module_ m = root.def_submodule("sfa", "SFA backend (DeepSeek-V3.2 sparse attention): facts, builders");

  nb::class_<sfa::Backend>(m, "Backend")
      .def_static("name", &sfa::Backend::name)
      .def_static("supported_block_sizes", &sfa::Backend::supported_block_sizes)
      .def_static("is_builder_block_size", &sfa::Backend::is_builder_block_size, "block_size"_a)
      .def_static("graph_support", &sfa::Backend::graph_support)
      .def_static("reorder_batch", &sfa::Backend::reorder_batch)
      .def_static("kv_cache_shape", &sfa::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &sfa::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static("main_cache_shapes", &sfa::Backend::main_cache_shapes, "num_blocks"_a, "block_size"_a,
                  "sfa_c8"_a = false, "kv_lora_rank"_a = sfa::kKvLoraRank, "qk_rope_head_dim"_a = sfa::kRopeHeadDim)
      .def_static(
          "main_cache_dtypes",
          [](bool sfa_c8, const std::string& device_kind, nb::handle model_dtype) {
            return dtypes_to(sfa::Backend::main_cache_dtypes(sfa_c8, parse_device_kind(device_kind),
                                                             dtype_from(model_dtype, "model_dtype")));
          },
          "sfa_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a);

  nb::class_<sfa::IndexerBackend>(m, "IndexerBackend")
      .def_static("name", &sfa::IndexerBackend::name)
      .def_static("supported_block_sizes", &sfa::IndexerBackend::supported_block_sizes)
      .def_static("graph_support", &sfa::IndexerBackend::graph_support)
      .def_static("kv_cache_shape", &sfa::IndexerBackend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &sfa::IndexerBackend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static("cache_shapes", &sfa::IndexerBackend::cache_shapes, "num_blocks"_a, "block_size"_a,
                  "li_c8"_a = false, "repl"_a = 1, "index_head_dim"_a = sfa::kIndexHeadDim)
      .def_static(
          "cache_dtypes",
          [](bool li_c8, const std::string& device_kind, nb::handle model_dtype) {
            return dtypes_to(sfa::IndexerBackend::cache_dtypes(li_c8, parse_device_kind(device_kind),
                                                               dtype_from(model_dtype, "model_dtype")));
          },
          "li_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a)
      .def_static(
          "page_bytes",
          [](int64_t block_size, bool li_c8, const std::string& device_kind, nb::handle model_dtype, int64_t repl,
             int64_t index_head_dim) {
            return sfa::IndexerBackend::page_bytes(block_size, li_c8, parse_device_kind(device_kind),
                                                   dtype_from(model_dtype, "model_dtype"), repl, index_head_dim);
          },
          "block_size"_a, "li_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a, "repl"_a = 1,
          "index_head_dim"_a = sfa::kIndexHeadDim);

  nb::enum_<sfa::CpMode>(m, "CpMode")
      .value("plain", sfa::CpMode::Plain)
      .value("dsa_cp", sfa::CpMode::DsaCp)
      .value("dcp", sfa::CpMode::Dcp)
      .value("dsa_cp_dcp", sfa::CpMode::DsaCpDcp)
      .value("pcp", sfa::CpMode::Pcp)
      .value("pcp_dcp", sfa::CpMode::PcpDcp);
  m.def("resolve_cp_mode", &sfa::resolve_cp_mode, "dsa_cp"_a, "dcp_size"_a, "pcp_size"_a = 1,
        "docs/design/sparse_cp.md §1, §11: the SFA context-parallel mode of the switches (ValueError for a size "
        "< 1; NotImplementedError for PCP with DSA-CP, which is not built).");
  m.def("remap_topk_to_dcp_rank", &sparse::remap_topk_to_dcp_rank, "topk"_a, nb::kw_only(), "world"_a, "rank"_a,
        "interleave"_a = 1,
        "docs/design/sparse_cp.md §3: a replicated-view top-k (..., K) int32 to this DCP rank's local positions, kept "
        "entries first in top-k order, then -1 (aten operators; the device form).");
  m.def(
      "remap_sparse_indices",
      [](const at::Tensor& topk, int32_t world, int32_t rank, int32_t interleave) {
        AAR_CHECK_ARG(topk.defined() && topk.dim() >= 1 && topk.scalar_type() == at::kInt && topk.device().is_cpu(),
                      "topk must be a CPU int32 tensor (..., K)");
        const at::Tensor in = topk.contiguous();
        at::Tensor out = at::empty_like(in);
        plan::remap_sparse_indices(plan::CSpan<int32_t>(in.data_ptr<int32_t>(), in.numel()),
                                   static_cast<int32_t>(in.size(-1)), plan::DcpShard{world, rank, interleave},
                                   plan::Span<int32_t>(out.data_ptr<int32_t>(), out.numel()));
        return out;
      },
      "topk"_a, nb::kw_only(), "world"_a, "rank"_a, "interleave"_a = 1,
      "docs/design/sparse_cp.md §3: the host (plan) form of remap_topk_to_dcp_rank, for tests and tracing.");

  m.def(
      "compose_kv_cache",
      [](const std::vector<at::Tensor>& main, const std::optional<std::vector<at::Tensor>>& indexer, bool sfa_c8,
         bool li_c8) {
        const sfa::ComposedKvCache c =
            sfa::compose_kv_cache(main, indexer.value_or(std::vector<at::Tensor>{}), sfa_c8, li_c8);
        nb::list caches;
        for (const at::Tensor& t : c.caches) caches.append(nb::cast(t));
        nb::object k = c.indexer_k_index < 0 ? nb::none() : nb::cast(c.indexer_k_index);
        nb::object s = c.indexer_scale_index < 0 ? nb::none() : nb::cast(c.indexer_scale_index);
        return nb::make_tuple(nb::tuple(caches), k, s);
      },
      "main_kv_cache"_a, "indexer_kv_cache"_a = nb::none(), nb::kw_only(), "sfa_c8"_a = false, "li_c8"_a = false,
      "docs/design/sfa.md §2.2: (composed tuple, indexer_k index or None, indexer_scale index or None); no indexer part: the "
      "main tuple.");

  nb::class_<sfa::TopkBuffer>(m, "TopkBuffer")
      .def(
          "__init__",
          [](sfa::TopkBuffer* self, int64_t max_num_tokens, int64_t index_topk, const std::string& device) {
            new (self) sfa::TopkBuffer(max_num_tokens, index_topk, c10::Device(device));
          },
          "max_num_tokens"_a, "index_topk"_a, nb::kw_only(), "device"_a = "cpu")
      .def_prop_ro("max_num_tokens", &sfa::TopkBuffer::max_num_tokens)
      .def_prop_ro("index_topk", &sfa::TopkBuffer::index_topk)
      .def_prop_ro("buffer", [](const sfa::TopkBuffer& b) { return b.buffer(); })
      .def(
          "view", [](const sfa::TopkBuffer& b, int64_t n) { return b.view(n); }, "num_tokens"_a,
          "(num_tokens, 1, index_topk) view of the first rows, at a stable address.")
      .def(
          "store", [](sfa::TopkBuffer& b, const at::Tensor& t) { return b.store(t); }, "topk"_a,
          "Copy a (T, 1, K) or (T, K) int32 selection into the first T rows; returns view(T).");

  // The layer's two operator steps for engines that project themselves (docs/design/sfa.md §4.5).
  nb::class_<sfa::IndexerStep>(m, "IndexerStep",
                               "An indexer layer's step for engines that compute the indexer's projections: the "
                               "key write, the lightning indexer, the top-k rows (docs/design/sfa.md §4.5).")
      .def(
          "__init__",
          [](sfa::IndexerStep* self, int64_t topk, bool glm_moe_dsa, const std::string& device_kind) {
            new (self) sfa::IndexerStep(sfa::IndexerStepConfig{topk, glm_moe_dsa, parse_device_kind(device_kind)});
          },
          nb::kw_only(), "topk"_a, "glm_moe_dsa"_a = false, "device_kind"_a = "a2")
      .def_prop_ro("topk", [](const sfa::IndexerStep& s) { return s.config().topk; })
      .def(
          "run",
          [](sfa::IndexerStep& s, const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights,
             const at::Tensor& index_cache, const sfa::Metadata& md, const at::Tensor& topk_out) {
            return s.run(k, q, weights, index_cache, md, topk_out);
          },
          "k"_a, "q"_a, "weights"_a, "index_cache"_a, "metadata"_a, "topk_out"_a,
          "Writes k[:tk] at the metadata's slots, the lightning indexer's rows into topk_out[:tk, :topk] (-1 "
          "padded; rows tk..T get -1); returns topk_out[:tk, :topk] as (tk, 1, topk). include/ascend_attn_rt/sfa/"
          "pieces.h has the shapes and dtypes.")
      .def(
          "run",
          [](sfa::IndexerStep& s, const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights,
             const at::Tensor& index_cache, const sfa::Metadata& md, sfa::TopkBuffer& topk_out) {
            return s.run(k, q, weights, index_cache, md, topk_out);
          },
          "k"_a, "q"_a, "weights"_a, "index_cache"_a, "metadata"_a, "topk_out"_a);

  nb::class_<sfa::SparseAttention>(m, "SparseAttention",
                                   "A sparse MLA layer's sparse flash attention over given top-k rows, for engines "
                                   "that compute the absorbed query (docs/design/sfa.md §4.5).")
      .def(
          "__init__",
          [](sfa::SparseAttention* self, double scale, cp::Comm* dcp_comm, int64_t workspace_group) {
            new (self) sfa::SparseAttention(sfa::SparseAttentionConfig{scale, dcp_comm, workspace_group});
          },
          nb::kw_only(), "scale"_a, "dcp_comm"_a = nb::none(), "workspace_group"_a = 0, nb::keep_alive<1, 3>(),
          "dcp_comm: the DCP group's aar.cp.Comm (kept alive by the layer) for metadata built with "
          "dcp_world_size > 1 (docs/design/sparse_cp.md §5).")
      .def_prop_ro("scale", &sfa::SparseAttention::scale)
      .def_prop_ro("dcp_world_size", [](const sfa::SparseAttention& s) {
        return s.config().dcp_comm != nullptr ? s.config().dcp_comm->size() : 1;
      })
      .def(
          "run",
          [](sfa::SparseAttention& s, const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& topk,
             const at::Tensor& nope_cache, const at::Tensor& rope_cache, const sfa::Metadata& md,
             std::optional<at::Tensor> out) {
            // Collectives run inside under DCP: never with the GIL held (comm/bindings.cpp's PyCommWork note).
            std::optional<nb::gil_scoped_release> nogil;
            if (s.config().dcp_comm != nullptr) nogil.emplace();
            return s.run(ql_nope, q_pe, topk, nope_cache, rope_cache, md, out);
          },
          "ql_nope"_a, "q_pe"_a, "topk"_a, "nope_cache"_a, "rope_cache"_a, "metadata"_a, nb::kw_only(),
          "out"_a = nb::none(),
          "(T, N, L) sparse attention of the metadata's tk tokens over the top-k rows (rows past tk zero), into "
          "out when given. include/ascend_attn_rt/sfa/pieces.h has the shapes and dtypes.");

  nb::class_<sfa::HostKvPool>(m, "HostKvPool",
                              "The KV-offload host pool (docs/design/sfa.md §6) in POSIX shared memory: per layer k (nb, bs, 1, "
                              "kv_lora_rank) and v (nb, bs, 1, qk_rope_head_dim) bf16; one owner writes, other "
                              "processes attach read-only by name.")
      .def_static(
          "create",
          [](int64_t num_layers, int64_t budget_bytes, std::optional<std::string> name, int64_t block_size,
             int64_t kv_lora_rank, int64_t qk_rope_head_dim, int64_t min_blocks, std::optional<nb::callable> pin,
             std::optional<nb::callable> unpin) {
            sfa::HostKvPoolConfig c;
            c.name = name.value_or("");
            c.num_layers = num_layers;
            c.budget_bytes = budget_bytes;
            c.block_size = block_size;
            c.kv_lora_rank = kv_lora_rank;
            c.qk_rope_head_dim = qk_rope_head_dim;
            c.min_blocks = min_blocks;
            c.pin = pin_from(pin);
            c.unpin = unpin_from(unpin);
            return sfa::HostKvPool::create(c);
          },
          nb::kw_only(), "num_layers"_a, "budget_bytes"_a, "name"_a = nb::none(), "block_size"_a = 128,
          "kv_lora_rank"_a = 512, "qk_rope_head_dim"_a = 64, "min_blocks"_a = 1, "pin"_a = nb::none(),
          "unpin"_a = nb::none(),
          "Creates the pool (this process owns it): as many blocks as budget_bytes holds. pin(address, nbytes) / "
          "unpin(address) are called on the mapping (NPU: host registration).")
      .def_static(
          "attach",
          [](const std::string& name, std::optional<nb::callable> pin, std::optional<nb::callable> unpin) {
            return sfa::HostKvPool::attach(name, pin_from(pin), unpin_from(unpin));
          },
          "name"_a, nb::kw_only(), "pin"_a = nb::none(), "unpin"_a = nb::none(),
          "Attaches read-only to the pool another process created under `name`.")
      .def_static("unlink", &sfa::HostKvPool::unlink, "name"_a,
                  "Removes a pool's name left by a process that died; False when there was none.")
      .def_static("block_bytes", &sfa::HostKvPool::block_bytes, "num_layers"_a, "block_size"_a, "kv_lora_rank"_a,
                  "qk_rope_head_dim"_a)
      .def_static("blocks_for_budget", &sfa::HostKvPool::blocks_for_budget, "budget_bytes"_a, "num_layers"_a,
                  "block_size"_a, "kv_lora_rank"_a, "qk_rope_head_dim"_a)
      .def_prop_ro("name", &sfa::HostKvPool::name)
      .def_prop_ro("is_owner", &sfa::HostKvPool::is_owner)
      .def_prop_ro("owner_alive", &sfa::HostKvPool::owner_alive)
      .def_prop_ro("num_layers", &sfa::HostKvPool::num_layers)
      .def_prop_ro("num_blocks", &sfa::HostKvPool::num_blocks)
      .def_prop_ro("block_size", &sfa::HostKvPool::block_size)
      .def_prop_ro("kv_lora_rank", &sfa::HostKvPool::kv_lora_rank)
      .def_prop_ro("qk_rope_head_dim", &sfa::HostKvPool::qk_rope_head_dim)
      .def_prop_ro("segment_bytes", &sfa::HostKvPool::segment_bytes)
      // On a process that attached, the mapping is read-only: a write through a
      // view would fault, so Python gets copies there.
      .def(
          "k", [](const sfa::HostKvPool& p, int64_t layer) { return p.is_owner() ? p.k(layer) : p.k(layer).clone(); },
          "layer"_a, "Layer's k rows (num_blocks, block_size, 1, kv_lora_rank) bf16: a view of the pool on its owner, "
          "a copy on a process that attached (read-only mapping).")
      .def(
          "v", [](const sfa::HostKvPool& p, int64_t layer) { return p.is_owner() ? p.v(layer) : p.v(layer).clone(); },
          "layer"_a, "Layer's v (rope) rows (num_blocks, block_size, 1, qk_rope_head_dim): as k.");

  nb::class_<sfa::OffloadCopyHooks, PyOffloadCopyHooks>(
      m, "OffloadCopyHooks",
      "How the offload path moves rows (subclass to count or batch; the base methods make the default tensor "
      "copies): commit(pool_rows, slots, rows) device -> host, before_onload(), onload(dst_rows, dst_index, "
      "src_rows, src_index) host -> device.")
      .def(nb::init<>())
      .def("commit", &sfa::OffloadCopyHooks::commit, "pool_rows"_a, "slots"_a, "rows"_a)
      .def("before_onload", &sfa::OffloadCopyHooks::before_onload)
      .def("onload", &sfa::OffloadCopyHooks::onload, "dst_rows"_a, "dst_index"_a, "src_rows"_a, "src_index"_a);

  nb::class_<sfa::OffloadConfig>(m, "OffloadConfig", "A layer's KV-offload settings (docs/design/sfa.md §6; sfa/offload.h).")
      .def(
          "__init__",
          [](sfa::OffloadConfig* self, std::shared_ptr<sfa::HostKvPool> pool, int64_t pool_layer,
             int64_t topk_buffer_size, bool keep_device_kv_cache, bool is_decode_consumer, int32_t max_num_reqs,
             int32_t max_num_tokens, int32_t num_speculative_tokens,
             std::shared_ptr<sfa::OffloadCopyHooks> copy_hooks, int32_t lru_threads) {
            new (self) sfa::OffloadConfig();
            self->pool = std::move(pool);
            self->pool_layer = pool_layer;
            self->topk_buffer_size = topk_buffer_size;
            self->keep_device_kv_cache = keep_device_kv_cache;
            self->is_decode_consumer = is_decode_consumer;
            self->max_num_reqs = max_num_reqs;
            self->max_num_tokens = max_num_tokens;
            self->num_speculative_tokens = num_speculative_tokens;
            self->copy_hooks = std::move(copy_hooks);
            self->lru_threads = lru_threads;
          },
          "pool"_a, nb::kw_only(), "pool_layer"_a = -1, "topk_buffer_size"_a = 4096,
          "keep_device_kv_cache"_a = false, "is_decode_consumer"_a = false, "max_num_reqs"_a = 256,
          "max_num_tokens"_a = 8192, "num_speculative_tokens"_a = 0, "copy_hooks"_a = nb::none(),
          "lru_threads"_a = 1)
      .def_ro("pool", &sfa::OffloadConfig::pool)
      .def_ro("pool_layer", &sfa::OffloadConfig::pool_layer)
      .def_ro("topk_buffer_size", &sfa::OffloadConfig::topk_buffer_size)
      .def_ro("keep_device_kv_cache", &sfa::OffloadConfig::keep_device_kv_cache)
      .def_ro("is_decode_consumer", &sfa::OffloadConfig::is_decode_consumer)
      .def_ro("max_num_reqs", &sfa::OffloadConfig::max_num_reqs)
      .def_ro("max_num_tokens", &sfa::OffloadConfig::max_num_tokens)
      .def_ro("num_speculative_tokens", &sfa::OffloadConfig::num_speculative_tokens)
      .def_ro("lru_threads", &sfa::OffloadConfig::lru_threads);
  m.def("offload_resident_rows", &sfa::offload_resident_rows, "max_num_tokens"_a, "max_num_reqs"_a,
        "num_speculative_tokens"_a = 0, "min(max_num_tokens, max_num_reqs * (1 + num_speculative_tokens))");

  nb::class_<sfa::BuilderOffloadConfig>(m, "BuilderOffloadConfig",
                                        "The KV-offload builder's settings (docs/design/sfa.md §6, \"Builder\").")
      .def(
          "__init__",
          [](sfa::BuilderOffloadConfig* self, bool is_decode_consumer) {
            new (self) sfa::BuilderOffloadConfig{is_decode_consumer};
          },
          nb::kw_only(), "is_decode_consumer"_a = false)
      .def_ro("is_decode_consumer", &sfa::BuilderOffloadConfig::is_decode_consumer);

  def_step_counts(nb::class_<sfa::Metadata>(m, "Metadata"))
      .def_ro("attn_state", &sfa::Metadata::attn_state)
      .def_ro("block_size", &sfa::Metadata::block_size)
      .def_ro("num_blocks", &sfa::Metadata::num_blocks)
      .def_ro("speculative", &sfa::Metadata::speculative)
      .def_ro("draft_index", &sfa::Metadata::draft_index)
      .def_prop_ro("generation", [](const sfa::Metadata& m) { return m.stamp.generation; })
      .def_prop_ro("is_current", [](const sfa::Metadata& m) { return m.stamp.current(); })
      .def_prop_ro("cum_query_lens", [](const sfa::Metadata& m) { return m.cum_query_lens; })
      .def_prop_ro("seq_lens", [](const sfa::Metadata& m) { return m.seq_lens; })
      .def_prop_ro("block_table", [](const sfa::Metadata& m) { return m.block_table; })
      .def_prop_ro("slot_mapping", [](const sfa::Metadata& m) { return m.slot_mapping; })
      .def_prop_ro("cos", [](const sfa::Metadata& m) { return m.cos; })
      .def_prop_ro("sin", [](const sfa::Metadata& m) { return m.sin; })
      .def_prop_ro("query_start_loc", [](const sfa::Metadata& m) { return m.query_start_loc; })
      .def_prop_ro("seq_lens_list", [](const sfa::Metadata& m) { return to_list(live(m).seq_lens_list); })
      .def_prop_ro("cum_query_lens_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).cum_query_lens_list); })
      // KV offload (an offload builder's metadata; offload_enabled False otherwise).
      .def_prop_ro("offload_enabled", [](const sfa::Metadata& m) { return m.offload.enabled; })
      .def_prop_ro("offload_decode_consumer", [](const sfa::Metadata& m) { return m.offload.decode_consumer; })
      .def_prop_ro("req_ids", [](const sfa::Metadata& m) { return m.offload.req_ids; })
      .def_prop_ro("token_to_req", [](const sfa::Metadata& m) { return m.offload.token_to_req; })
      .def_prop_ro("prefill_cum_query_lens", [](const sfa::Metadata& m) { return m.offload.prefill_cum_query_lens; })
      .def_prop_ro("prefill_seq_lens", [](const sfa::Metadata& m) { return m.offload.prefill_seq_lens; })
      .def_prop_ro("prefill_block_table", [](const sfa::Metadata& m) { return m.offload.prefill_block_table; })
      .def_prop_ro("req_ids_list", [](const sfa::Metadata& m) { return span_list(live(m).offload.req_ids_host); })
      .def_prop_ro("token_to_req_list",
                   [](const sfa::Metadata& m) { return span_list(live(m).offload.token_to_req_host); })
      .def_prop_ro("decode_req_ids_list",
                   [](const sfa::Metadata& m) { return span_list(live(m).offload.decode_req_ids); })
      .def_prop_ro("decode_seq_lens_list",
                   [](const sfa::Metadata& m) { return span_list(live(m).offload.decode_seq_lens); })
      .def_prop_ro("decode_stable_prefix_list",
                   [](const sfa::Metadata& m) { return span_list(live(m).offload.decode_stable_prefix); })
      // DCP with the replicated indexer (docs/design/sparse_cp.md §2; dcp_world_size 1 otherwise).
      .def_prop_ro("dcp_world_size", [](const sfa::Metadata& m) { return m.dcp.world_size; })
      .def_prop_ro("dcp_rank", [](const sfa::Metadata& m) { return m.dcp.rank; })
      .def_prop_ro("dcp_interleave", [](const sfa::Metadata& m) { return m.dcp.interleave; })
      .def_prop_ro("dcp_seq_lens", [](const sfa::Metadata& m) { return m.dcp.seq_lens; })
      .def_prop_ro("dcp_seq_lens_list", [](const sfa::Metadata& m) { return to_list(live(m).dcp.seq_lens_list); })
      .def_prop_ro("indexer_block_table", [](const sfa::Metadata& m) { return m.dcp.indexer_block_table; })
      .def_prop_ro("indexer_slot_mapping", [](const sfa::Metadata& m) { return m.dcp.indexer_slot_mapping; })
      // DSA-CP token sharding (docs/design/sparse_cp.md §4; dsa_cp_world_size 1 otherwise).
      .def_prop_ro("dsa_cp_world_size", [](const sfa::Metadata& m) { return m.dsa_cp.world_size; })
      .def_prop_ro("dsa_cp_rank", [](const sfa::Metadata& m) { return m.dsa_cp.rank; })
      .def_prop_ro("num_tokens_pad", [](const sfa::Metadata& m) { return m.dsa_cp.num_tokens_pad; })
      .def_prop_ro("tokens_per_rank", [](const sfa::Metadata& m) { return m.dsa_cp.tokens_per_rank; })
      .def_prop_ro("local_start", [](const sfa::Metadata& m) { return m.dsa_cp.local_start; })
      .def_prop_ro("local_end", [](const sfa::Metadata& m) { return m.dsa_cp.local_end; })
      .def_prop_ro("local_cum_query_lens_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).dsa_cp.cum_query_lens_list); })
      .def_prop_ro("local_seq_lens_list", [](const sfa::Metadata& m) { return to_list(live(m).dsa_cp.seq_lens_list); })
      .def_prop_ro("local_cos", [](const sfa::Metadata& m) { return m.dsa_cp.cos; })
      // PCP (docs/design/sparse_cp.md §11; pcp_world_size 1 otherwise).
      .def_prop_ro("pcp_world_size", [](const sfa::Metadata& m) { return m.pcp.world_size; })
      .def_prop_ro("pcp_rank", [](const sfa::Metadata& m) { return m.pcp.rank; })
      .def_prop_ro("num_local_tokens", [](const sfa::Metadata& m) { return m.pcp.num_local_tokens; })
      .def_prop_ro("pcp_local_token_index_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).pcp.local_token_index_list); })
      .def_prop_ro("pcp_indexer_cum_query_lens_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).pcp.indexer_cum_query_lens_list); })
      .def_prop_ro("pcp_indexer_seq_lens_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).pcp.indexer_seq_lens_list); })
      .def_prop_ro("pcp_cos", [](const sfa::Metadata& m) { return m.pcp.cos; });

  nb::class_<sfa::MetadataBuilder>(m, "MetadataBuilder")
      .def(
          "__init__",
          [](sfa::MetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, int32_t max_blocks_per_req,
             int32_t block_size, int32_t num_blocks, const at::Tensor& cos_table, const at::Tensor& sin_table,
             int32_t num_speculative_tokens, bool chunked_prefill_enabled, bool graph_decode_padding,
             std::optional<int32_t> num_drafts, const std::string& device, std::optional<bool> separate_device_buffers,
             int32_t staging_buffers, std::optional<sfa::BuilderOffloadConfig> offload, int32_t dcp_world_size,
             int32_t dcp_rank, int32_t cp_kv_cache_interleave_size, int32_t dsa_cp_world_size, int32_t dsa_cp_rank,
             int32_t pcp_world_size, int32_t pcp_rank) {
            sfa::BuilderConfig c;
            c.pcp_world_size = pcp_world_size;
            c.pcp_rank = pcp_rank;
            c.dsa_cp_world_size = dsa_cp_world_size;
            c.dsa_cp_rank = dsa_cp_rank;
            c.dcp_world_size = dcp_world_size;
            c.dcp_rank = dcp_rank;
            c.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.max_blocks_per_req = max_blocks_per_req;
            c.block_size = block_size;
            c.num_blocks = num_blocks;
            c.cos_table = cos_table;
            c.sin_table = sin_table;
            c.num_speculative_tokens = num_speculative_tokens;
            c.chunked_prefill_enabled = chunked_prefill_enabled;
            c.graph_decode_padding = graph_decode_padding;
            c.num_drafts = num_drafts;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            c.staging_buffers = staging_buffers;
            c.offload = offload;
            new (self) sfa::MetadataBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "cos_table"_a, "sin_table"_a, "num_speculative_tokens"_a = 0,
          "chunked_prefill_enabled"_a = true, "graph_decode_padding"_a = false, "num_drafts"_a = nb::none(),
          "device"_a = "cpu", "separate_device_buffers"_a = nb::none(), "staging_buffers"_a = 2,
          "offload"_a = nb::none(), "dcp_world_size"_a = 1, "dcp_rank"_a = 0, "cp_kv_cache_interleave_size"_a = 1,
          "dsa_cp_world_size"_a = 1, "dsa_cp_rank"_a = 0, "pcp_world_size"_a = 1, "pcp_rank"_a = 0)
      .def(
          "build",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             std::optional<plan::AttentionState> attn_state, const std::optional<at::Tensor>& num_spec_tokens,
             nb::handle req_ids, const std::optional<at::Tensor>& is_prefilling) -> sfa::Metadata {
            // A Python object per build (a copy of the builder's metadata, with
            // this build's stamp): one kept past the next build is rejected as stale.
            if (req_ids.is_none() && !is_prefilling.has_value()) {
              return b.build(latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens));
            }
            std::vector<uint64_t> keep;
            return b.build(sfa_build_inputs(b, qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens,
                                            req_ids, is_prefilling, keep));
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(), "req_ids"_a = nb::none(),
          "is_prefilling"_a = nb::none(), nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_graph_capture",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             plan::AttentionState state, nb::handle req_ids, const std::optional<at::Tensor>& is_prefilling)
              -> sfa::Metadata {
            if (req_ids.is_none() && !is_prefilling.has_value()) {
              return b.build_for_graph_capture(
                  latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, std::nullopt, std::nullopt), state);
            }
            // The KV-offload builder's capture build (docs/design/sfa.md §6.6) takes its ids like build.
            std::vector<uint64_t> keep;
            return b.build_for_graph_capture(sfa_build_inputs(b, qsl, seq_lens, bt, num_input_tokens, std::nullopt,
                                                              std::nullopt, req_ids, is_prefilling, keep),
                                             state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, "req_ids"_a = nb::none(), "is_prefilling"_a = nb::none(),
          nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_drafting",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens, nb::handle req_ids,
             const std::optional<at::Tensor>& is_prefilling) -> sfa::Metadata {
            std::vector<uint64_t> keep;
            return b.build_for_drafting(sfa_build_inputs(b, qsl, seq_lens, bt, num_input_tokens, attn_state,
                                                         num_spec_tokens, req_ids, is_prefilling, keep),
                                        draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "num_input_tokens"_a = 0, "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(),
          "req_ids"_a = nb::none(), "is_prefilling"_a = nb::none(),
          nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A draft step's metadata, in the draft lane's own buffers and stamp counter: it does not make the main "
          "build's metadata (or another draft index's) stale.")
      .def_prop_ro("metadata", &sfa::MetadataBuilder::metadata, nb::rv_policy::reference_internal)
      .def("draft_metadata", &sfa::MetadataBuilder::draft_metadata, "draft_index"_a, nb::rv_policy::reference_internal)
      .def_prop_ro("block_table_staging", [](const sfa::MetadataBuilder& b) { return b.block_table_staging(); })
      // PCP (docs/design/sparse_cp.md §11): int32, the global token of every local row of the latest build, -1 for a pad.
      .def_prop_ro("local_token_index", [](const sfa::MetadataBuilder& b) { return int_tensor(b.pcp_local_token_index()); })
      .def_prop_ro("decode_threshold", &sfa::MetadataBuilder::decode_threshold)
      .def_prop_ro("num_drafts", &sfa::MetadataBuilder::num_drafts)
      .def_prop_ro("generation", &sfa::MetadataBuilder::generation)
      .def("draft_generation", &sfa::MetadataBuilder::draft_generation, "draft_index"_a);

  nb::class_<sfa::IndexerMetadataBuilder>(m, "IndexerMetadataBuilder",
                                          "The indexer cache group's builder (docs/design/sfa.md §2.3): no metadata of its own; the "
                                          "indexer reads the main group's sfa.Metadata.")
      .def(nb::init<>())
      .def_prop_ro_static("reorder_batch_threshold",
                          [](nb::handle) { return sfa::IndexerMetadataBuilder::reorder_batch_threshold(); })
      .def(
          "build", [](const sfa::IndexerMetadataBuilder&, nb::args, nb::kwargs) { return nb::none(); },
          "Returns None, whatever it is given (upstream's contract).")
      .def(
          "build_for_graph_capture",
          [](const sfa::IndexerMetadataBuilder&, nb::args, nb::kwargs) { return nb::none(); },
          "Returns None.")
      .def(
          "build_for_drafting",
          [](const sfa::IndexerMetadataBuilder&, nb::args, nb::kwargs) { return nb::none(); },
          "Returns None (the indexer reads the main group's draft metadata).");

  nb::class_<sfa::Impl>(m, "Impl")
      .def(
          "__init__",
          [](sfa::Impl* self, int64_t num_heads, int64_t hidden_size, std::optional<int64_t> q_lora_rank,
             int64_t kv_lora_rank, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim, int64_t v_head_dim,
             std::optional<at::Tensor> q_a_proj, std::optional<at::Tensor> q_a_layernorm,
             std::optional<at::Tensor> q_proj, std::optional<at::Tensor> kv_a_proj_with_mqa,
             const at::Tensor& kv_a_layernorm, const at::Tensor& kv_b_proj, const at::Tensor& o_proj, double scale,
             double q_norm_eps, double kv_norm_eps,
             std::optional<int64_t> index_n_head, int64_t index_head_dim, int64_t index_topk,
             std::optional<at::Tensor> indexer_wq_b, std::optional<at::Tensor> indexer_wk,
             std::optional<at::Tensor> indexer_weights_proj, std::optional<at::Tensor> indexer_k_norm_weight,
             std::optional<at::Tensor> indexer_k_norm_bias, double indexer_k_norm_eps, bool glm_moe_dsa,
             bool use_index_cache, bool sfa_c8, bool li_c8, const std::string& device_kind, int64_t layer_index,
             int64_t workspace_group, std::optional<mla::QuantWeights> quant, bool is_kv_consumer,
             bool is_kv_producer, bool enable_mlapo, bool chunked_q_proj, bool dsa_cp, int64_t dcp_size,
             std::optional<sfa::OffloadConfig> offload, cp::Comm* dcp_comm, cp::Comm* dsa_cp_comm,
             bool dsa_cp_full_o_proj_prefill, cp::Comm* pcp_comm) {
            sfa::ImplConfig c;
            c.pcp_comm = pcp_comm;
            c.dcp_comm = dcp_comm;
            c.dsa_cp_comm = dsa_cp_comm;
            c.dsa_cp_full_o_proj_prefill = dsa_cp_full_o_proj_prefill;
            c.preprocess.quant = quant.has_value() ? quant->type : mla::QuantType::None;
            c.preprocess.is_kv_consumer = is_kv_consumer;
            c.preprocess.is_kv_producer = is_kv_producer;
            c.preprocess.enable_mlapo = enable_mlapo;
            c.preprocess.enable_sparse_sfa_c8 = sfa_c8;  // the selection follows the layer's SFA C8
            c.preprocess.chunked_q_proj = chunked_q_proj;
            c.preprocess.dsa_cp = dsa_cp;
            c.preprocess.dcp_size = dcp_size;
            c.offload = std::move(offload);  // the selection's kv_offload follows it
            c.dims = {num_heads, hidden_size, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                      v_head_dim};
            c.scale = scale;
            c.q_norm_eps = q_norm_eps;
            c.kv_norm_eps = kv_norm_eps;
            c.use_index_cache = use_index_cache;
            c.sfa_c8 = sfa_c8;
            c.li_c8 = li_c8;
            c.device_kind = parse_device_kind(device_kind);
            c.layer_index = layer_index;
            c.workspace_group = workspace_group;
            std::optional<sfa::IndexerWeights> iw;
            const bool any_idx = indexer_wq_b || indexer_wk || indexer_weights_proj || indexer_k_norm_weight ||
                                 indexer_k_norm_bias;
            if (index_n_head.has_value()) {
              AAR_CHECK_ARG(indexer_wq_b && indexer_wk && indexer_weights_proj && indexer_k_norm_weight &&
                                indexer_k_norm_bias,
                            "an indexer layer (index_n_head given) needs indexer_wq_b, indexer_wk, "
                            "indexer_weights_proj, indexer_k_norm_weight and indexer_k_norm_bias");
              sfa::IndexerConfig ic;
              ic.n_head = *index_n_head;
              ic.head_dim = index_head_dim;
              ic.topk = index_topk;
              ic.k_norm_eps = indexer_k_norm_eps;
              ic.glm_moe_dsa = glm_moe_dsa;
              c.indexer = ic;
              iw = sfa::IndexerWeights{*indexer_wq_b, *indexer_wk, *indexer_weights_proj, *indexer_k_norm_weight,
                                       *indexer_k_norm_bias};
            } else {
              AAR_CHECK_ARG(!any_idx, "indexer weights were given but index_n_head is None (a layer without an "
                            "indexer reuses the top-k buffer)");
            }
            mla::Weights w{q_a_proj,       q_a_layernorm, q_proj.value_or(at::Tensor()),
                           kv_a_proj_with_mqa.value_or(at::Tensor()), kv_a_layernorm, kv_b_proj, o_proj, quant};
            new (self) sfa::Impl(c, w, iw);
          },
          nb::kw_only(), "num_heads"_a, "hidden_size"_a, "q_lora_rank"_a = nb::none(), "kv_lora_rank"_a,
          "qk_nope_head_dim"_a, "qk_rope_head_dim"_a, "v_head_dim"_a, "q_a_proj"_a = nb::none(),
          "q_a_layernorm"_a = nb::none(), "q_proj"_a = nb::none(), "kv_a_proj_with_mqa"_a = nb::none(),
          "kv_a_layernorm"_a, "kv_b_proj"_a, "o_proj"_a, "scale"_a = 0.0, "q_norm_eps"_a = 1e-6,
          "kv_norm_eps"_a = 1e-6, "index_n_head"_a = nb::none(), "index_head_dim"_a = 128, "index_topk"_a = 2048,
          "indexer_wq_b"_a = nb::none(), "indexer_wk"_a = nb::none(), "indexer_weights_proj"_a = nb::none(),
          "indexer_k_norm_weight"_a = nb::none(), "indexer_k_norm_bias"_a = nb::none(),
          "indexer_k_norm_eps"_a = 1e-6, "glm_moe_dsa"_a = false, "use_index_cache"_a = false,
          "sfa_c8"_a = false, "li_c8"_a = false, "device_kind"_a = "a2", "layer_index"_a = -1, "workspace_group"_a = 0,
          "quant"_a = nb::none(), "is_kv_consumer"_a = false, "is_kv_producer"_a = false, "enable_mlapo"_a = false,
          "chunked_q_proj"_a = false, "dsa_cp"_a = false, "dcp_size"_a = 1, "offload"_a = nb::none(),
          "dcp_comm"_a = nb::none(), "dsa_cp_comm"_a = nb::none(), "dsa_cp_full_o_proj_prefill"_a = true,
          "pcp_comm"_a = nb::none(), nb::keep_alive<1, 43>(), nb::keep_alive<1, 44>(), nb::keep_alive<1, 46>())
      .def(
          "forward",
          [](sfa::Impl& impl, const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache,
             const sfa::Metadata* md, const at::Tensor& output, sfa::TopkBuffer* topk) -> at::Tensor {
            // A layer with a CP group runs collectives inside: never with the GIL held (a gloo worker that
            // frees a Python-owned tensor needs it; comm/bindings.cpp's PyCommWork note).
            const sfa::ImplConfig& cf = impl.config();
            std::optional<nb::gil_scoped_release> nogil;
            if (cf.dcp_comm != nullptr || cf.dsa_cp_comm != nullptr || cf.pcp_comm != nullptr) nogil.emplace();
            return impl.forward(hidden, kv_cache, md, output, topk);
          },
          "hidden_states"_a, "kv_cache"_a, "metadata"_a.none(), "output"_a, "topk_buffer"_a.none() = nb::none())
      .def("release_views", &sfa::Impl::release_views)
      .def_prop_ro("last_topk_source", [](const sfa::Impl& i) { return std::string(sfa::to_string(i.last_topk_source())); })
      .def_prop_ro("last_topk", [](const sfa::Impl& i) { return i.last_topk(); })
      .def_prop_ro("o_proj_weight", [](const sfa::Impl& i) { return i.o_proj_weight(); })
      .def_prop_ro("o_proj_full_pool", [](const sfa::Impl& i) { return i.o_proj_full_pool(); })
      .def_prop_ro("w_uk_t", [](const sfa::Impl& i) { return i.w_uk_t(); })
      .def_prop_ro("w_uv", [](const sfa::Impl& i) { return i.w_uv(); })
      .def_prop_ro("scale", [](const sfa::Impl& i) { return i.config().scale; })
      .def_prop_ro("sfa_c8", [](const sfa::Impl& i) { return i.config().sfa_c8; })
      .def_prop_ro("li_c8", [](const sfa::Impl& i) { return i.config().li_c8; })
      .def_prop_ro("preprocess", [](const sfa::Impl& i) { return std::string(sfa::to_string(i.preprocess())); })
      .def_prop_ro("preprocess_reason", [](const sfa::Impl& i) { return i.preprocess_reason(); })
      .def_prop_ro("last_preprocess",
                   [](const sfa::Impl& i) { return std::string(sfa::to_string(i.last_preprocess())); })
      // KV offload (ValueError on a layer without it).
      .def_prop_ro("offload", [](const sfa::Impl& i) { return i.config().offload.has_value(); })
      .def_prop_ro("last_offload_stats", [](const sfa::Impl& i) { return stats_dict(i.last_offload_stats()); })
      .def_prop_ro("resident_k", [](const sfa::Impl& i) { return i.resident_k(); })
      .def_prop_ro("resident_v", [](const sfa::Impl& i) { return i.resident_v(); })
      .def_prop_ro("resident_rows", &sfa::Impl::resident_rows)
      .def(
          "resident_tokens",
          [](const sfa::Impl& i) {
            // The LRU's state: (rows, topk_buffer_size) int32, the token each slot holds (-1 empty).
            const int64_t rows = i.resident_rows(), cap = i.resident_k().size(1);
            at::Tensor t = at::empty({rows, cap}, at::TensorOptions().dtype(at::kInt));
            int32_t* p = t.data_ptr<int32_t>();
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t s = 0; s < cap; ++s) {
                p[r * cap + s] = i.resident_token(static_cast<int32_t>(r), static_cast<int32_t>(s));
              }
            }
            return t;
          },
          "(resident_rows, topk_buffer_size) int32: the token each resident slot holds (-1: empty).")
      .def("reset_resident", &sfa::Impl::reset_resident, "Forgets every resident row (the LRU).");

  // docs/design/sfa.md §4.2's selection table on its own (sfa/preprocess.h).
  m.def(
      "resolve_preprocess",
      [](const std::string& quant_type, bool has_q_lora, bool is_kv_consumer, bool is_kv_producer, bool enable_mlapo,
         bool enable_sparse_sfa_c8, bool chunked_q_proj, bool dsa_cp, int64_t dcp_size, bool kv_offload) {
        sfa::PreprocessConfig c;
        c.quant = mla::parse_quant_type(quant_type);
        c.has_q_lora = has_q_lora;
        c.is_kv_consumer = is_kv_consumer;
        c.is_kv_producer = is_kv_producer;
        c.enable_mlapo = enable_mlapo;
        c.enable_sparse_sfa_c8 = enable_sparse_sfa_c8;
        c.chunked_q_proj = chunked_q_proj;
        c.dsa_cp = dsa_cp;
        c.dcp_size = dcp_size;
        c.kv_offload = kv_offload;
        const sfa::PreprocessChoice r = sfa::resolve_preprocess(c);
        return std::make_tuple(std::string(sfa::to_string(r.kind)), r.reason);
      },
      nb::kw_only(), "quant_type"_a = "none", "has_q_lora"_a = true, "is_kv_consumer"_a = false,
      "is_kv_producer"_a = false, "enable_mlapo"_a = false, "enable_sparse_sfa_c8"_a = false,
      "chunked_q_proj"_a = false, "dsa_cp"_a = false, "dcp_size"_a = 1, "kv_offload"_a = false,
      "docs/design/sfa.md §4.2: (\"native\" | \"prolog_v3\" | \"mlapo\", reason).");
  m.def(
      "runtime_preprocess",
      [](const std::string& resolved, plan::AttentionState state, int64_t num_input_tokens) {
        sfa::Preprocess p = sfa::Preprocess::Native;
        if (resolved == "prolog_v3") {
          p = sfa::Preprocess::PrologV3;
        } else if (resolved == "mlapo") {
          p = sfa::Preprocess::Mlapo;
        } else {
          AAR_CHECK_ARG(resolved == "native", "resolved must be \"native\", \"prolog_v3\" or \"mlapo\", got \"",
                        resolved, "\"");
        }
        return std::string(sfa::to_string(sfa::runtime_preprocess(p, state, num_input_tokens)));
      },
      "resolved"_a, "attn_state"_a, "num_input_tokens"_a,
      "The per-call path of a layer that resolved to `resolved` (docs/design/sfa.md §4.2's downgrade rules).");

  // The plan layer's docs/design/sparse.md §8 mask, next to the other plan functions.
  nb::module_ p = nb::borrow<nb::module_>(root.attr("plan"));
  p.def(
      "build_valid_topk_mask",
      [](const at::Tensor& topk, const at::Tensor& thresholds) {
        check_host_tensor(topk, "topk", at::kInt, topk.dim());
        AAR_CHECK_ARG(topk.dim() >= 1, "topk must have at least one dimension (..., K), got a scalar");
        check_host_tensor(thresholds, "thresholds", at::kInt, thresholds.dim());
        const int64_t K = topk.size(-1);
        AAR_CHECK_ARG(K > 0 && K <= INT32_MAX, "topk's last dimension (K) must be in [1, 2^31), got ", K);
        at::Tensor out = at::empty(topk.sizes(), at::TensorOptions().dtype(at::kBool));
        plan::build_valid_topk_mask(
            {topk.const_data_ptr<int32_t>(), static_cast<size_t>(topk.numel())}, static_cast<int32_t>(K),
            {thresholds.const_data_ptr<int32_t>(), static_cast<size_t>(thresholds.numel())},
            {static_cast<uint8_t*>(out.data_ptr()), static_cast<size_t>(out.numel())});
        return out;
      },
      "topk"_a, "thresholds"_a,
      "docs/design/sparse.md §8: (topk >= 0) & (topk < threshold of the row), for host int32 topk (..., K) and one int32 "
      "threshold per row (thresholds.numel() == topk.numel() / K); returns a bool tensor of topk's shape.");
}

const BindingRegistrar kRegisterSfa(/*order=*/40, &bind_sfa);
}  // namespace
}  // namespace aar::bindings
