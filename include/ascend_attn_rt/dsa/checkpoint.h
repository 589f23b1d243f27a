// DeepSeek-V4 (DSA) layer weights from a checkpoint's names (DeepSeek's published
// names or transformers'), for one layer under `prefix`. Tensors are the
// checkpoint's own except wo_a (per-group transpose), mixed-dtype norms (cast) and
// the sinks (fp32). Missing / misshapen / unexpected keys: InvalidArgument listing
// them by full name; quantised projections and biases: NotSupported by key, except
// the W8A8-dynamic prolog (wq_a / wq_b / wkv int8 with weight_scale, zero weight_offset:
// Weights::wq_a_scale ...; docs/design/dsa.md §5.4).
// Name table and rules: docs/design/dsa.md §7.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <string_view>

#include "ascend_attn_rt/dsa/impl.h"

namespace aar::dsa {

Weights weights_from_checkpoint(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                const ImplConfig& cfg);

}  // namespace aar::dsa
