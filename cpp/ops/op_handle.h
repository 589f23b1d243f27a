// Internal: lazily resolved, per-provider typed operator handles.
//
// A wrapper keeps one OpHandle per operator (a namespace-scope static). The
// first call for a provider looks the schema up by qualified name and caches the
// typed handle; every later call costs one acquire load before the unboxed
// dispatcher call. No strings are built on the hot path.
//
// Thread safety: get() from any number of threads at once; a provider's first
// resolution takes the handle's mutex, raced first calls resolve once
// (tests/cpp/test_concurrency.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/ops/provider.h"
#include "inference_scope.h"

namespace aar::ops::detail {

// The provider a wrapper call uses: an explicit argument wins, then the
// process-wide override, then the device of the first tensor argument.
inline Provider pick_provider(Provider pv, const at::Tensor& first) {
  return pv != Provider::Auto ? pv : resolve_provider(first);
}

// Keeps the call off PyTorch's boxed autograd fallback: every provider's
// operators are called under InferenceMode (ops/inference_mode.h). The runtime's
// entry points take it once; inside them this finds it active, and a wrapper
// called on its own takes it for the call. No provider has an Autograd kernel
// (torch_npu registers none for these operators, and cpp/ops/registry.cpp none
// for ours), so the CPU twins and the no-compute provider dispatch exactly like
// the NPU path.
class DispatchGuard {
 public:
  explicit DispatchGuard(Provider) {
    // Test-only fault injection (ops/fault_injection.h): one relaxed load unless a test armed it.
    if (__builtin_expect(testing::detail::any_fault_armed(), 0)) testing::detail::fault_point_slow();
  }

 private:
  InferenceScope inference_;
};

inline const std::optional<at::Tensor>& none_tensor() {
  static const std::optional<at::Tensor> none;
  return none;
}

[[noreturn]] void throw_lookup_failure(Provider p, const std::string& qualified, const char* overload,
                                       const char* what);

template <class Sig>
class OpHandle {
 public:
  OpHandle(const char* name, const char* overload, OpLibrary lib) : name_(name), overload_(overload), lib_(lib) {}
  // The older form: `atb` selects OpLibrary::Atb, otherwise OpLibrary::TorchNpu.
  OpHandle(const char* name, const char* overload, bool atb)
      : OpHandle(name, overload, atb ? OpLibrary::Atb : OpLibrary::TorchNpu) {}
  OpHandle(const OpHandle&) = delete;
  OpHandle& operator=(const OpHandle&) = delete;

  const c10::TypedOperatorHandle<Sig>& get(Provider p) {
    const auto i = static_cast<uint32_t>(p);
    if (__builtin_expect(i < 4 && ready_[i].load(std::memory_order_acquire), 1)) {
      return *handles_[i];
    }
    return resolve(p);
  }

 private:
  const c10::TypedOperatorHandle<Sig>& resolve(Provider p) {
    const auto i = static_cast<uint32_t>(p);
    AAR_CHECK_ARG(i >= 1 && i < 4, "operator ", name_, ": cannot dispatch to provider value ",
                  static_cast<int32_t>(p));
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready_[i].load(std::memory_order_relaxed)) {
      const std::string qualified = std::string(provider_namespace(p, lib_)) + "::" + name_;
      try {
        auto h = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), overload_);
        handles_[i].emplace(h.template typed<Sig>());
      } catch (const c10::Error& e) {
        throw_lookup_failure(p, qualified, overload_, e.what_without_backtrace());
      }
      ready_[i].store(true, std::memory_order_release);
    }
    return *handles_[i];
  }

  const char* name_;
  const char* overload_;
  OpLibrary lib_;
  std::mutex mu_;
  std::atomic<bool> ready_[4] = {};
  std::optional<c10::TypedOperatorHandle<Sig>> handles_[4];
};

}  // namespace aar::ops::detail
