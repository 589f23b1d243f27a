#include "op_handle.h"

namespace aar::ops::detail {

void throw_lookup_failure(Provider p, const std::string& qualified, const char* overload, const char* what) {
  const std::string full = qualified + (overload && *overload ? std::string(".") + overload : std::string());
  if (p == Provider::Npu) {
    if (qualified.rfind("_C_ascend::", 0) == 0) {
      throw_not_supported("operator ", full,
                          " is not registered: vllm-ascend's custom-operator library (_C_ascend) is not loaded (load "
                          "vllm-ascend's compiled extension before calling the runtime on NPU tensors)");
    }
    throw_not_supported("operator ", full,
                        " is not registered: torch_npu is not loaded (import torch_npu, or load "
                        "libtorch_npu.so, before calling the runtime on NPU tensors)");
  }
  throw_not_supported("operator ", full, " is not registered for provider ", to_string(p),
                      " (is libascend_attn_rt linked and loaded?): ", what);
}

}  // namespace aar::ops::detail
