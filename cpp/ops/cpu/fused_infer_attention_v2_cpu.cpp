// CPU twin of npu_fused_infer_attention_score_v2, its .out variant and
// _npu_fused_infer_attention_score_v2_get_max_workspace. Same core as v1
// (fia_common.cpp) plus learnable_sink: exp(sink_h - m') joins the softmax
// denominator only (no value row); the returned lse includes the sink's mass.
// The fully quantised MLA form (the FA-quant decode, docs/design/mla.md §5.3): query,
// key and value int8, query_rope / key_rope in the output dtype,
// query_quant_mode 3 (per token and head: dequant_scale_query with one fp32
// scale per query row), key_quant_mode = value_quant_mode = 0 with per-tensor
// fp32 dequant_scale_key / dequant_scale_value (one element), no dequant
// offsets. The operands are dequantised (q * s_q, k * s_k, v * s_v, rounded to
// the rope dtype; an NZ int8 cache is re-tiled to that dtype's NZ block) and
// attended like the unquantised form; the output has the rope dtype. Other
// quantised forms are rejected by name.
#include <torch/library.h>

#include "../op_signatures.h"
#include "fia_common.h"
#include "fia_mla.h"
#include "attention_reference.h"

namespace aar::ops::cpu {

namespace {

constexpr FiaNames kNamesV2{"npu_fused_infer_attention_score_v2", "actual_seq_qlen", "actual_seq_kvlen",
                            "num_query_heads"};

FiaInputs v2_inputs(AAR_FIA_V2_PARAMS) {
  const char* op = kNamesV2.op;
  reject_tensor(op, query_rope, "query_rope");
  reject_tensor(op, key_rope, "key_rope");
  reject_tensor(op, pse_shift, "pse_shift");
  reject_tensor(op, dequant_scale_query, "dequant_scale_query");
  reject_tensor(op, dequant_scale_key, "dequant_scale_key");
  reject_tensor(op, dequant_offset_key, "dequant_offset_key");
  reject_tensor(op, dequant_scale_value, "dequant_scale_value");
  reject_tensor(op, dequant_offset_value, "dequant_offset_value");
  reject_tensor(op, dequant_scale_key_rope, "dequant_scale_key_rope");
  reject_tensor(op, quant_scale_out, "quant_scale_out");
  reject_tensor(op, quant_offset_out, "quant_offset_out");
  reject_tensor(op, quant_scale_p, "quant_scale_p");
  reject_int(op, query_quant_mode, 0, "query_quant_mode");
  reject_int(op, key_quant_mode, 0, "key_quant_mode");
  reject_int(op, value_quant_mode, 0, "value_quant_mode");
  reject_opt_int(op, query_dtype, "query_dtype");
  reject_opt_int(op, key_dtype, "key_dtype");
  reject_opt_int(op, value_dtype, "value_dtype");
  reject_opt_int(op, query_rope_dtype, "query_rope_dtype");
  reject_opt_int(op, key_rope_dtype, "key_rope_dtype");
  reject_opt_int(op, key_shared_prefix_dtype, "key_shared_prefix_dtype");
  reject_opt_int(op, value_shared_prefix_dtype, "value_shared_prefix_dtype");
  reject_opt_int(op, dequant_scale_query_dtype, "dequant_scale_query_dtype");
  reject_opt_int(op, dequant_scale_key_dtype, "dequant_scale_key_dtype");
  reject_opt_int(op, dequant_scale_value_dtype, "dequant_scale_value_dtype");
  reject_opt_int(op, dequant_scale_key_rope_dtype, "dequant_scale_key_rope_dtype");
  reject_opt_int(op, out_dtype, "out_dtype");
  return FiaInputs{query,           key,          value,        atten_mask,   block_table,
                   learnable_sink,  actual_seq_qlen, actual_seq_kvlen, num_query_heads,
                   num_key_value_heads, softmax_scale, pre_tokens, next_tokens, input_layout,
                   sparse_mode,     inner_precise, block_size,  kNamesV2};
}

// The fully quantised MLA form, dequantised (see the header comment); `active`
// false: the call is not quantised and passes through unchanged.
struct QuantFold {
  bool active = false;
  at::Tensor query, key, value;
};

// (nb, Nkv, D/c, bs, c) -> the same cache tiled for `dtype`'s NZ block.
at::Tensor retile_nz(const at::Tensor& z, at::ScalarType dtype) {
  const int64_t nb = z.size(0), n = z.size(1), bs = z.size(3), d = z.size(2) * z.size(4);
  const int64_t c = 32 / static_cast<int64_t>(c10::elementSize(dtype));
  const at::Tensor nd = z.permute({0, 3, 1, 2, 4}).reshape({nb, bs, n, d});
  return nd.view({nb, bs, n, d / c, c}).permute({0, 2, 3, 1, 4}).contiguous();
}

QuantFold fold_quant(AAR_FIA_V2_PARAMS) {
  const char* op = kNamesV2.op;
  QuantFold f;
  if (query_quant_mode == 0 && key_quant_mode == 0 && value_quant_mode == 0 && query.scalar_type() != at::kChar) {
    return f;  // unquantised; v2_inputs rejects stray scales
  }
  if (query_quant_mode != 3 || key_quant_mode != 0 || value_quant_mode != 0) {
    throw_not_supported(op, ": not supported by the CPU twin: query_quant_mode=", query_quant_mode,
                        ", key_quant_mode=", key_quant_mode, ", value_quant_mode=", value_quant_mode,
                        " (only the fully quantised MLA form 3 / 0 / 0, or none)");
  }
  reject_tensor(op, dequant_offset_key, "dequant_offset_key");
  reject_tensor(op, dequant_offset_value, "dequant_offset_value");
  reject_tensor(op, dequant_scale_key_rope, "dequant_scale_key_rope");
  AAR_CHECK_ARG(query.scalar_type() == at::kChar && key.scalar_type() == at::kChar &&
                    value.scalar_type() == at::kChar,
                op, ": query_quant_mode=3 needs int8 query, key and value, got ", query.scalar_type(), ", ",
                key.scalar_type(), ", ", value.scalar_type());
  AAR_CHECK_ARG(query_rope.has_value() && query_rope->defined() && key_rope.has_value() && key_rope->defined(), op,
                ": the fully quantised form needs query_rope and key_rope (its output dtype)");
  const auto dt = query_rope->scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt) && key_rope->scalar_type() == dt, op,
                ": query_rope / key_rope must share a float dtype, got ", dt, " / ", key_rope->scalar_type());
  auto scale_of = [&](sig::OptT t, const char* name, int64_t numel) -> const at::Tensor& {
    AAR_CHECK_ARG(t.has_value() && t->defined(), op, ": ", name, " is required with query_quant_mode=3");
    AAR_CHECK_ARG(t->scalar_type() == at::kFloat && t->numel() == numel, op, ": ", name, " must be float32 with ",
                  numel, " element(s), got ", t->scalar_type(), " ", t->sizes());
    return *t;
  };
  AAR_CHECK_ARG(query.dim() >= 2, op, ": query must have at least 2 dims, got ", query.sizes());
  const at::Tensor& sq = scale_of(dequant_scale_query, "dequant_scale_query", query.numel() / query.size(-1));
  const at::Tensor& sk = scale_of(dequant_scale_key, "dequant_scale_key (per-tensor)", 1);
  const at::Tensor& sv = scale_of(dequant_scale_value, "dequant_scale_value (per-tensor)", 1);
  std::vector<int64_t> qs(query.sizes().begin(), query.sizes().end());
  qs.back() = 1;
  f.active = true;
  f.query = (query.to(at::kFloat) * sq.reshape(qs)).to(dt);
  auto deq = [&](const at::Tensor& c, const at::Tensor& s) {
    const at::Tensor x = (c.to(at::kFloat) * s.reshape({})).to(dt);
    return c.dim() == 5 ? retile_nz(x, dt) : x;
  };
  f.key = deq(key, sk);
  f.value = value.is_same(key) && at::equal(sk, sv) ? f.key : deq(value, sv);
  return f;
}

// Hides query / key / value and the quantisation arguments behind their
// dequantised values inside an inner block (as AAR_FIA_MLA_SHADOW does).
#define AAR_FIA_QUANT_SHADOW(q)                                                         \
  const at::Tensor& query = (q).active ? (q).query : query_in;                          \
  const at::Tensor& key = (q).active ? (q).key : key_in;                                \
  const at::Tensor& value = (q).active ? (q).value : value_in;                          \
  sig::OptT dequant_scale_query = (q).active ? no_tensor() : dequant_scale_query_in;    \
  sig::OptT dequant_scale_key = (q).active ? no_tensor() : dequant_scale_key_in;        \
  sig::OptT dequant_scale_value = (q).active ? no_tensor() : dequant_scale_value_in;    \
  const int64_t query_quant_mode = (q).active ? 0 : query_quant_mode_in;

// MLA arguments (query_rope / key_rope, the _NBSD / _NTD / BSND layouts) are
// folded first, see fia_mla.h; the quantised form is dequantised before that.
std::tuple<at::Tensor, at::Tensor> fia_v2(AAR_FIA_V2_PARAMS) {
  const QuantFold qf = fold_quant(AAR_FIA_V2_ARGS);
  const at::Tensor &query_in = query, &key_in = key, &value_in = value;
  sig::OptT dequant_scale_query_in = dequant_scale_query, dequant_scale_key_in = dequant_scale_key,
            dequant_scale_value_in = dequant_scale_value;
  const int64_t query_quant_mode_in = query_quant_mode;
  {
    AAR_FIA_QUANT_SHADOW(qf)
    const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
    {
      AAR_FIA_MLA_SHADOW(f)
      return f.finish(fia_functional(v2_inputs(AAR_FIA_V2_ARGS), return_softmax_lse));
    }
  }
}

std::tuple<at::Tensor&, at::Tensor&> fia_v2_out(AAR_FIA_V2_PARAMS, AAR_OUT_TAIL_PARAMS) {
  const QuantFold qf = fold_quant(AAR_FIA_V2_ARGS);
  const at::Tensor &query_in = query, &key_in = key, &value_in = value;
  sig::OptT dequant_scale_query_in = dequant_scale_query, dequant_scale_key_in = dequant_scale_key,
            dequant_scale_value_in = dequant_scale_value;
  const int64_t query_quant_mode_in = query_quant_mode;
  {
    AAR_FIA_QUANT_SHADOW(qf)
    const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
    {
      AAR_FIA_MLA_SHADOW(f)
      f.out(kNamesV2.op, v2_inputs(AAR_FIA_V2_ARGS), return_softmax_lse, attention_out, softmax_lse);
    }
  }
  return {attention_out, softmax_lse};
}

at::Tensor fia_v2_workspace(AAR_FIA_V2_PARAMS) {
  const QuantFold qf = fold_quant(AAR_FIA_V2_ARGS);
  const at::Tensor &query_in = query, &key_in = key, &value_in = value;
  sig::OptT dequant_scale_query_in = dequant_scale_query, dequant_scale_key_in = dequant_scale_key,
            dequant_scale_value_in = dequant_scale_value;
  const int64_t query_quant_mode_in = query_quant_mode;
  {
    AAR_FIA_QUANT_SHADOW(qf)
    const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
    {
      AAR_FIA_MLA_SHADOW(f)
      return fia_workspace(v2_inputs(AAR_FIA_V2_ARGS));
    }
  }
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_fused_infer_attention_score_v2", TORCH_FN(aar::ops::cpu::fia_v2));
  m.impl("npu_fused_infer_attention_score_v2.out", TORCH_FN(aar::ops::cpu::fia_v2_out));
  m.impl("_npu_fused_infer_attention_score_v2_get_max_workspace", TORCH_FN(aar::ops::cpu::fia_v2_workspace));
}
