// Shared by the C ABI's translation units (include/ascend_attn_rt/c_api.h):
// the per-thread error message, the catch-all entry guard, and the checks and
// conversions of what crosses the boundary (structs, host arrays, DLPack).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::gqa {
struct Metadata;
}
namespace aar::mla {
struct Metadata;
}

namespace aar::capi {

// A C metadata handle is the builder's metadata object itself.
inline const gqa::Metadata* unwrap(const aar_gqa_metadata_t* m) { return reinterpret_cast<const gqa::Metadata*>(m); }
inline const mla::Metadata* unwrap(const aar_mla_metadata_t* m) { return reinterpret_cast<const mla::Metadata*>(m); }

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
c10::Device device_of(const DLDevice& d, const char* name);

// A host array given as pointer + length (NULL only with length 0).
template <typename T>
plan::CSpan<T> host_array(const T* p, size_t n, const char* name) {
  AAR_CHECK_ARG(p != nullptr || n == 0, name, " is NULL with length ", n);
  return plan::CSpan<T>(p, n);
}

// A borrowed tensor: aliases the DLTensor's memory, never calls its deleter.
// Rejects (naming `name`) NULL, a negative or too large ndim, a NULL shape,
// negative sizes, NULL data with elements, vector lanes, dtypes and devices
// torch cannot represent.
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

// A tensor the caller owns: a DLManagedTensor that keeps `t` alive until its deleter runs.
DLManagedTensor* lend(const at::Tensor& t);

aar_attn_state_t to_c(plan::AttentionState s);

// aar_{gqa,mla}_builder_block_table: the builder's staging block table, lent.
template <typename Handle>
aar_status_t lend_block_table(const char* fn, Handle* h, DLManagedTensor** out) noexcept {
  return guarded(fn, [&] {
    check_not_null(h, "builder");
    check_not_null(out, "out");
    *out = lend(h->builder.block_table_staging());
  });
}

}  // namespace aar::capi
