#include "ascend_attn_rt/ops/provider.h"

#include <ATen/core/Tensor.h>

#include <atomic>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/cann_ops_library.h"

namespace aar::ops {

namespace {
std::atomic<Provider> g_override{Provider::Auto};
}  // namespace

const char* to_string(Provider p) {
  switch (p) {
    case Provider::Auto:
      return "Auto";
    case Provider::Npu:
      return "Npu";
    case Provider::Cpu:
      return "Cpu";
    case Provider::NoCompute:
      return "NoCompute";
  }
  return "<invalid Provider>";
}

void set_provider_override(Provider p) {
  AAR_CHECK_ARG(static_cast<int32_t>(p) >= 0 && static_cast<int32_t>(p) <= 3,
                "set_provider_override: invalid provider value ", static_cast<int32_t>(p));
  g_override.store(p, std::memory_order_relaxed);
}

Provider provider_override() { return g_override.load(std::memory_order_relaxed); }

Provider resolve_provider(const at::Tensor& t) {
  const Provider o = g_override.load(std::memory_order_relaxed);
  if (o != Provider::Auto) return o;
  AAR_CHECK_ARG(t.defined(), "resolve_provider: the operator's first tensor argument is undefined");
  switch (t.device().type()) {
    case c10::DeviceType::PrivateUse1:
      return Provider::Npu;
    case c10::DeviceType::CPU:
      return Provider::Cpu;
    case c10::DeviceType::Meta:
      // Meta tensors carry shapes only: the no-compute provider (host-time runs at any size).
      return Provider::NoCompute;
    default:
      throw_invalid("resolve_provider: no attention operator provider for device '", t.device(),
                    "' (supported: npu via torch_npu, cpu via the CPU twins, meta via the no-compute provider)");
  }
}

const char* to_string(OpLibrary l) {
  switch (l) {
    case OpLibrary::TorchNpu:
      return "TorchNpu";
    case OpLibrary::Atb:
      return "Atb";
    case OpLibrary::VllmAscend:
      return "VllmAscend";
    case OpLibrary::CannOpsTransformer:
      return "CannOpsTransformer";
  }
  return "<invalid OpLibrary>";
}

const char* provider_namespace(Provider p, OpLibrary lib) {
  AAR_CHECK_ARG(static_cast<int32_t>(lib) >= 0 && static_cast<int32_t>(lib) <= 3,
                "provider_namespace: invalid OpLibrary value ", static_cast<int32_t>(lib));
  const bool va = lib == OpLibrary::VllmAscend;
  const bool cot = lib == kCannOpsTransformer;
  switch (p) {
    case Provider::Npu:
      return cot ? "cann_ops_transformer" : (va ? "_C_ascend" : (lib == OpLibrary::Atb ? "atb" : "npu"));
    case Provider::Cpu:
      return cot ? "ascend_cpu_cot" : (va ? "ascend_cpu_va" : "ascend_cpu");
    case Provider::NoCompute:
      return cot ? "ascend_noop_cot" : (va ? "ascend_noop_va" : "ascend_noop");
    case Provider::Auto:
      break;
  }
  throw_invalid("provider_namespace: provider ", to_string(p),
                " has no namespace (resolve Auto with resolve_provider first)");
}

const char* provider_namespace(Provider p, bool atb) {
  return provider_namespace(p, atb ? OpLibrary::Atb : OpLibrary::TorchNpu);
}

}  // namespace aar::ops
