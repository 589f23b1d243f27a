// Operator providers. Every NPU operator the runtime calls is reached through the
// c10 dispatcher by qualified name with the exact torch_npu 2.14.0 schema. The
// same schemas are served by three providers:
//   Npu       : namespace `npu` (aclnn ops) / `atb` (ATB ops), i.e. torch_npu
//   Cpu       : namespace `ascend_cpu`, our CPU twins (cpp/ops/cpu/)
//   NoCompute : namespace `ascend_noop`, correctly shaped outputs, no compute
//               (benchmarks of host time only; never a default)
#pragma once

#include <cstdint>

namespace at {
class Tensor;
}

namespace aar::ops {

enum class Provider : int32_t { Auto = 0, Npu = 1, Cpu = 2, NoCompute = 3 };

const char* to_string(Provider p);

// Process-wide override. Auto (the default) picks the provider from the device
// of the operator's first tensor argument: PrivateUse1 (NPU) -> Npu, CPU -> Cpu,
// Meta (shapes only, no data) -> NoCompute.
void set_provider_override(Provider p);
Provider provider_override();

// The provider that a call with `t` as its first tensor argument resolves to.
Provider resolve_provider(const at::Tensor& t);

// Dispatcher namespace of a provider; `atb` selects torch_npu's ATB namespace
// for the Npu provider (the ATB operators live there).
const char* provider_namespace(Provider p, bool atb = false);

// RAII override, for benchmarks and tests.
class ProviderOverride {
 public:
  explicit ProviderOverride(Provider p) : saved_(provider_override()) { set_provider_override(p); }
  ~ProviderOverride() { set_provider_override(saved_); }
  ProviderOverride(const ProviderOverride&) = delete;
  ProviderOverride& operator=(const ProviderOverride&) = delete;

 private:
  Provider saved_;
};

}  // namespace aar::ops
