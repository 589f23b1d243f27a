// Operator providers. Every NPU operator the runtime calls is reached through the
// c10 dispatcher by qualified name with its exact schema. The operators come from
// two libraries: torch_npu 2.14.0 (namespaces `npu`, aclnn ops, and `atb`, ATB
// ops) and vllm-ascend's own custom ops (namespace `_C_ascend`). The same
// schemas are served by three providers:
//   Npu       : the real device: `npu` / `atb` (torch_npu) or `_C_ascend` (vllm-ascend)
//   Cpu       : our CPU twins (cpp/ops/cpu/): `ascend_cpu` for torch_npu's
//               operators, `ascend_cpu_va` for vllm-ascend's
//   NoCompute : correctly shaped outputs, no compute (benchmarks of host time
//               only; never a default): `ascend_noop` / `ascend_noop_va`
// vllm-ascend's twins need namespaces of their own: several of its operators
// share a name with a torch_npu operator but not its schema
// (npu_lightning_indexer, npu_sparse_flash_attention, ...).
#pragma once

#include <cstdint>

namespace at {
class Tensor;
}

namespace aar::ops {

enum class Provider : int32_t { Auto = 0, Npu = 1, Cpu = 2, NoCompute = 3 };

// The library an operator belongs to on the NPU (selects its namespaces).
enum class OpLibrary : int32_t { TorchNpu = 0, Atb = 1, VllmAscend = 2, CannOpsTransformer = 3 };

const char* to_string(Provider p);
const char* to_string(OpLibrary l);

// Process-wide override. Thread safety: one atomic, read at every operator call
// on every thread: set it before the threads calling operators start (a
// ProviderOverride on one thread changes the provider of all of them). Auto (the default) picks the provider from the device
// of the operator's first tensor argument: PrivateUse1 (NPU) -> Npu, CPU -> Cpu,
// Meta (shapes only, no data) -> NoCompute.
void set_provider_override(Provider p);
Provider provider_override();

// The provider that a call with `t` as its first tensor argument resolves to.
Provider resolve_provider(const at::Tensor& t);

// Dispatcher namespace of a provider for an operator of `lib`:
//   TorchNpu   -> npu       / ascend_cpu    / ascend_noop
//   Atb        -> atb       / ascend_cpu    / ascend_noop
//   VllmAscend -> _C_ascend / ascend_cpu_va / ascend_noop_va
const char* provider_namespace(Provider p, OpLibrary lib = OpLibrary::TorchNpu);
// The older form: `atb` selects OpLibrary::Atb, otherwise OpLibrary::TorchNpu.
const char* provider_namespace(Provider p, bool atb);

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
