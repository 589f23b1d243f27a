// Shared by the C ABI's translation units (include/ascend_attn_rt/c_api.h):
// the per-thread error message, the catch-all entry guard, and the checks and
// conversions of what crosses the boundary (structs, host arrays, DLPack).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"
#include "handle.h"

namespace aar::gqa {
struct Metadata;
struct ImplConfig;
enum class AttnType : int32_t;
}
namespace aar::plan {
enum class DeviceKind : int32_t;
}
namespace aar::mla {
struct Metadata;
}
namespace aar::sfa {
class TopkBuffer;
}

// The metadata handle a build returns: a shell inside the builder's own shell
// that views the builder's metadata, so a build allocates nothing for it.
struct aar_gqa_metadata {
  static constexpr aar::capi::Kind kKind = aar::capi::Kind::GqaMetadata;
  aar::capi::Tag tag;
  const aar::gqa::Metadata* md;
};
struct aar_mla_metadata {
  static constexpr aar::capi::Kind kKind = aar::capi::Kind::MlaMetadata;
  aar::capi::Tag tag;
  const aar::mla::Metadata* md;
};

// The graph params handle (graph.cpp makes it; dsa.cpp updates it for DSA layers).
namespace aar::graph {
class GraphParams;
}
struct aar_graph_params {
  static constexpr aar::capi::Kind kKind = aar::capi::Kind::GraphParams;
  aar::capi::Tag tag;
  aar::graph::GraphParams* g;  // owned
};

// The model's top-k buffer (sfa/ and dsa/ layers share the type).
struct aar_sfa_topk_buffer {
  static constexpr aar::capi::Kind kKind = aar::capi::Kind::SfaTopkBuffer;
  aar::capi::Tag tag;
  aar::sfa::TopkBuffer* buffer;  // owned
};

namespace aar::capi {

inline const gqa::Metadata* unwrap(const aar_gqa_metadata_t* m, const char* name) { return checked(m, name)->md; }
inline const mla::Metadata* unwrap(const aar_mla_metadata_t* m, const char* name) { return checked(m, name)->md; }

void clear_error() noexcept;
const char* last_error() noexcept;
// Maps the exception in flight to a status and sets the thread's message
// "<fn>: <what>". Only called from inside a catch block.
aar_status_t status_of_current_exception(const char* fn) noexcept;

// Runs `body` with the boundary's guarantees: the thread's message reset, the
// operators under InferenceMode, every exception turned into a status.
template <typename F>
aar_status_t guarded(const char* fn, F&& body) noexcept {
  clear_error();
  try {
    c10::InferenceMode guard;
    body();
    return AAR_OK;
  } catch (...) {
    return status_of_current_exception(fn);
  }
}

// aar_*_destroy: NULL is ignored; anything but a live handle of H's kind is
// left alone (the thread's message says what it was), so a handle passed to
// the wrong destroy, or destroyed twice, frees nothing. `free_objects` frees
// what the shell owns, then the shell is retired (handle.h). A destroy that
// frees leaves the thread's message alone: engines destroy handles from static
// destructors, when this thread's thread_local message may be gone already.
template <typename H, typename F>
void destroy(const char* fn, H* h, const char* name, F&& free_objects) noexcept {
  if (h == nullptr) return;
  if (!has_tag(h, H::kKind)) {
    guarded(fn, [&] { check_tag(h, H::kKind, name); });
    return;
  }
  free_objects(h);
  retire(h);
}

template <typename T>
void check_not_null(const T* p, const char* name) {
  AAR_CHECK_ARG(p != nullptr, name, " is NULL");
}

// A config / inputs struct: not NULL and of this build's size.
template <typename T>
void check_struct(const T* s, const char* name, const char* init_fn) {
  check_not_null(s, name);
  AAR_CHECK_ARG(s->struct_size == sizeof(T), name, "->struct_size is ", s->struct_size, ", expected ", sizeof(T),
                " (initialise the struct with ", init_fn, "; a different value means another ABI version)");
}

// A 0/1 flag field.
bool flag(int32_t v, const char* name);
// A parallel group's size and this rank's place in it, checked by their C names: `prefix` names the
// struct ("cp->", "config->"), `size_field` and `rank_field` its fields.
void check_group(const char* prefix, const char* size_field, int32_t size, const char* rank_field, int32_t rank);
// The integer a C caller stored in an enum field or argument. A C enum object may hold any int,
// and loading an out-of-range value as the C++ enum type is undefined behaviour (UBSan's
// -fsanitize=enum reports it: make test-sanitize found it here), so every enum that crosses the
// ABI is read through its bytes, taken by reference, before it is checked.
template <typename E>
int32_t enum_int(const E& e) {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int32_t), "a C enum of int size");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
std::optional<bool> tristate(const aar_tristate_t& v, const char* name);
std::optional<plan::AttentionState> attn_state(const aar_attn_state_t& s, const char* name);
// A graph capture's `state` argument: an attention state, AAR_STATE_AUTO refused.
plan::AttentionState capture_state(const aar_attn_state_t& s);
// The GQA family's attn_type field (0 decoder .. 3 encoder-decoder) and a device_kind field
// (0 A2, 1 A3, 2 A5, 3 310P), checked by name.
gqa::AttnType attn_type(int32_t v, const char* name);
plan::DeviceKind device_kind(int32_t v, const char* name);
// The GQA layer's C config as the C++ one (aar_gqa_impl_create; the DCP and PCP layers take it
// too), every field checked by its C name.
gqa::ImplConfig gqa_impl_config(const aar_gqa_impl_config_t& config);
// A device the runtime can reach in this process: the host, or an NPU when
// torch_npu is loaded (else rejected naming `name` + `suffix` and torch_npu).
c10::Device device_of(const DLDevice& d, const char* name, const char* suffix = "");

// A host array given as pointer + length (NULL only with length 0).
template <typename T>
plan::CSpan<T> host_array(const T* p, size_t n, const char* name) {
  AAR_CHECK_ARG(p != nullptr || n == 0, name, " is NULL with length ", n);
  return plan::CSpan<T>(p, n);
}

// A borrowed tensor: aliases the DLTensor's memory, never calls its deleter.
// Rejects (naming `name`) NULL, a negative or too large ndim, a NULL shape,
// negative sizes or strides, NULL data with elements, vector lanes, sub-byte
// or unknown dtypes, a first element (data + byte_offset) not aligned to the
// element size, and devices not reachable here (device_of).
at::Tensor borrow(const DLManagedTensor* t, const char* name);
std::optional<at::Tensor> borrow_optional(const DLManagedTensor* t, const char* name);

// For tensors an engine passes again at every call (KV caches): returns the
// tensor made for the last DLTensor of the same description (data, offset,
// dtype, device, sizes, strides), so the layer's cache binding, keyed by the
// tensor, holds and its derived views are not remade per call. Two DLTensors
// with one description alias the same memory in the same geometry, so the
// reused tensor is the one a fresh borrow would make.
class BorrowCache {
 public:
  at::Tensor get(const DLManagedTensor* t, const char* name);
  void reset() { tensor_.reset(); key_.clear(); }

 private:
  static void describe(const DLTensor& d, std::vector<int64_t>& key);
  at::Tensor tensor_;
  std::vector<int64_t> key_, scratch_;
};

// The GQA family's forward (aar_{gqa,c8,fa3}_impl_forward): query, key/value (both or
// neither), the two caches (both or neither, borrowed through the layer's caches), metadata, output.
struct GqaCaches {
  BorrowCache key_cache, value_cache;
};
template <typename Impl, typename Md>
void gqa_forward(Impl& impl, GqaCaches& caches, const DLManagedTensor* query, const DLManagedTensor* key,
                 const DLManagedTensor* value, const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                 const Md* md, const DLManagedTensor* output) {
  AAR_CHECK_ARG((key == nullptr) == (value == nullptr), "key and value must both be given or both be NULL, got key ",
                key == nullptr ? "NULL" : "given", " and value ", value == nullptr ? "NULL" : "given");
  AAR_CHECK_ARG((key_cache == nullptr) == (value_cache == nullptr),
                "key_cache and value_cache must both be given or both be NULL, got key_cache ",
                key_cache == nullptr ? "NULL" : "given", " and value_cache ", value_cache == nullptr ? "NULL" : "given");
  const at::Tensor q = borrow(query, "query");
  const auto k = borrow_optional(key, "key");
  const auto v = borrow_optional(value, "value");
  const at::Tensor kc = key_cache ? caches.key_cache.get(key_cache, "key_cache") : at::Tensor();
  const at::Tensor vc = value_cache ? caches.value_cache.get(value_cache, "value_cache") : at::Tensor();
  const at::Tensor out = borrow(output, "output");
  impl.forward(q, k, v, kc, vc, md, out);
}

// A tensor the caller owns: a DLManagedTensor that keeps `t` alive until its deleter runs.
DLManagedTensor* lend(const at::Tensor& t);

aar_attn_state_t to_c(plan::AttentionState s);

// One metadata shell per lane of a builder: [0] the main lane, [1 + d] draft lane d; each
// made and retired like a handle, so a metadata of a destroyed builder is named as such.
template <typename Shell>
struct LaneShells {
  Shell** shells = nullptr;
  int32_t count = 0;
  void allocate(int32_t lanes) {
    std::unique_ptr<Shell*[]> s(new Shell*[lanes]());
    for (int32_t i = 0; i < lanes; ++i) s[i] = ::aar::capi::make<Shell>();
    shells = s.release();
    count = lanes;
  }
  void retire_all() noexcept {
    for (int32_t i = 0; i < count; ++i) retire(shells[i]);
    delete[] shells;
  }
  template <typename Md>
  const Shell* wrap(int32_t lane, const Md& md) const {
    shells[lane]->md = &md;
    return shells[lane];
  }
  // Lane 1 + draft_index of a draft build, draft_index checked in [0, count - 1).
  int32_t draft_lane(int32_t draft_index) const {
    const int32_t nd = count - 1;
    AAR_CHECK_ARG(draft_index >= 0 && draft_index < nd, "draft_index=", draft_index,
                  " is out of range [0, num_drafts=", nd, ")");
    return 1 + draft_index;
  }
};

// aar_{gqa,mla,sfa}_builder_block_table: the builder's staging block table, lent.
template <typename Handle>
aar_status_t lend_block_table(const char* fn, Handle* h, DLManagedTensor** out) noexcept {
  return guarded(fn, [&] {
    checked(h, "builder");
    check_not_null(out, "out");
    *out = lend(h->builder->block_table_staging());
  });
}

}  // namespace aar::capi
