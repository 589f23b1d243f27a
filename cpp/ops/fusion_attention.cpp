// Typed wrapper for npu_fusion_attention (FlashAttentionScore); returns the
// attention output (element 0 of the operator's 7-tuple).
#include "ascend_attn_rt/ops/fusion_attention.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::FusionAttention> g_fa("npu_fusion_attention", "", OpLibrary::TorchNpu);

// An empty list means "not given" (BNSD/BSH layouts take no length lists).
inline at::OptionalIntArrayRef opt_int_list(c10::IntArrayRef v) {
  return v.empty() ? at::OptionalIntArrayRef() : at::OptionalIntArrayRef(v);
}
}  // namespace

at::Tensor fusion_attention(const FusionAttentionArgs& a, Provider pv) {
  const Provider prov = detail::pick_provider(pv, a.query);
  const auto& op = g_fa.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  auto r = op.call(a.query, a.key, a.value, a.head_num, a.input_layout, none /*pse*/, none /*padding_mask*/,
                   a.atten_mask, a.scale, /*keep_prob=*/1.0, a.pre_tockens, a.next_tockens,
                   /*inner_precise=*/0, at::OptionalIntArrayRef() /*prefix*/,
                   opt_int_list(a.actual_seq_qlen), opt_int_list(a.actual_seq_kvlen),
                   a.sparse_mode, /*gen_mask_parallel=*/true, /*sync=*/false, /*softmax_layout=*/"",
                   none /*sink*/, none /*dropout_mask*/, /*seed=*/0, /*offset=*/0);
  return std::move(std::get<0>(r));
}

}  // namespace aar::ops
