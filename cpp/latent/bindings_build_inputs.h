// The MLA family's build inputs from Python arguments (aar.mla / aar.sfa
// MetadataBuilder.build): borrowed from the Python tensors (no caster copies),
// each span checked by i32_span (dtype, device, dims, contiguity), naming the
// argument.
#pragma once

#include <optional>

#include "ascend_attn_rt/latent/build_inputs.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace aar::bindings {

inline mla::BuildInputs latent_build_inputs(nb::handle qsl, nb::handle seq_lens, nb::handle bt,
                                            int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
                                            const std::optional<at::Tensor>& num_spec_tokens) {
  const at::Tensor& b = borrow_tensor(bt, "block_table", false);
  mla::BuildInputs in;
  in.query_start_loc = i32_span(borrow_tensor(qsl, "query_start_loc", false), "query_start_loc");
  in.seq_lens = i32_span(borrow_tensor(seq_lens, "seq_lens", false), "seq_lens");
  in.block_table = i32_span(b, "block_table", 2);
  in.block_table_stride = static_cast<int32_t>(b.size(1));
  in.num_input_tokens = num_input_tokens;
  in.attn_state = attn_state;
  if (num_spec_tokens.has_value()) in.num_spec_tokens = i32_span(*num_spec_tokens, "num_spec_tokens");
  return in;
}

}  // namespace aar::bindings
