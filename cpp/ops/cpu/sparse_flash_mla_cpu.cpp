// CPU twins of CANN's cann_ops_transformer::sparse_flash_mla and
// sparse_flash_mla_metadata (ascend_cpu_cot): SparseFlashMla, the A5 + bf16
// DeepSeek-V4 attention (docs/design/dsa.md §4.2; semantics in
// include/ascend_attn_rt/ops/sparse_flash_mla.h). The attention is the shared-KV
// sparse attention the npu_sparse_attn_sharedkv twin computes
// (shared_kv_attention.h); this file checks what differs in the interface.
//
// Decisions where the documentation is silent or leaves values open:
// - layout_kv "PA_BBND" only (the A5 + bf16 plan's layout); "BSND" / "TND"
//   are NotSupported by name. layout_q "TND" or "BSND".
// - seqused_ori_kv and ori_block_table are required with ori_kv (documented
//   for PA_BBND); cmp_block_table with cmp_kv.
// - With cmp_kv and cmp_ratio > 1: cmp_residual_kv is required (documented
//   for cmp_mask_mode 3), both it and seqused_cmp_kv (when given) have B int32
//   entries, 0 <= cmp_residual_kv[b] < cmp_ratio, and
//   seqused_cmp_kv[b] * cmp_ratio + cmp_residual_kv[b] == seqused_ori_kv[b]
//   (the documented identity; a mismatch is InvalidArgument naming b). Without
//   cmp_kv both must be unset.
// - cmp_ratio: >= 2 with cmp_kv, exactly 1 without (0 is documented illegal).
// - ori_mask_mode 4; cmp_mask_mode 3 with cmp_kv, 0 or 3 without (the
//   documented SWA example passes 0); ori_win_left / ori_win_right >= 0 (the
//   schema default -1 has no documented meaning).
// - topk_value_mode 1 only; ori_topk_length / cmp_topk_length are reserved
//   (documented "pass None"): a tensor there is NotSupported.
// - softmax_lse: a 0-dim fp32 tensor without return_softmax_lse; with it
//   (1, T, N1) for "TND" and (B, 1, S, N1) for "BSND".
//
// The metadata twin returns a deterministic (1024,) int32 blob that nothing
// reads on CPU: [0] 0x534D4C41 ("SMLA"), [1] 1, [2..4] num_heads_q,
// num_heads_kv, head_dim, [5..8] batch_size, max_seqlen_q, max_seqlen_ori_kv,
// max_seqlen_cmp_kv, [9..10] ori_topk, cmp_topk, [11..15] cmp_ratio,
// ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, [16] layout_q
// (0 TND, 1 BSND), [17..18] has_ori_kv, has_cmp_kv, [19] the sum of
// seqused_ori_kv or -1, [20] the sum of seqused_cmp_kv or -1; the rest 0.
// Unset scalars take the NPU wrapper's defaults before validation.
#include <torch/library.h>

#include <limits>
#include <vector>

#include "../op_signatures_cot.h"
#include "attention_reference.h"
#include "shared_kv_attention.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kSparseFlashMlaOp = "cann_ops_transformer::sparse_flash_mla";
constexpr const char* kSparseFlashMlaMetadataOp = "cann_ops_transformer::sparse_flash_mla_metadata";

bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

std::vector<int64_t> ints(const char* op, const at::Tensor& t, const char* name) {
  AAR_CHECK_ARG(t.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t.scalar_type());
  AAR_CHECK_ARG(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  AAR_CHECK_ARG(t.device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t.device());
  const at::Tensor c = t.contiguous();
  const int32_t* p = c.data_ptr<int32_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

// The compressed-length identity of the documentation, for every request.
void check_cmp_lengths(const char* op, const std::vector<int64_t>& ori, const std::optional<at::Tensor>& seqused_cmp,
                       const at::Tensor& residual_t, int64_t ratio) {
  const std::vector<int64_t> res = ints(op, residual_t, "cmp_residual_kv");
  AAR_CHECK_ARG(res.size() == ori.size(), op, ": cmp_residual_kv must have B = ", ori.size(),
                " entries (seqused_ori_kv's), got ", res.size());
  std::vector<int64_t> cmp;
  if (has(seqused_cmp)) {
    cmp = ints(op, *seqused_cmp, "seqused_cmp_kv");
    AAR_CHECK_ARG(cmp.size() == ori.size(), op, ": seqused_cmp_kv must have B = ", ori.size(), " entries, got ",
                  cmp.size());
  }
  for (size_t b = 0; b < ori.size(); ++b) {
    AAR_CHECK_ARG(res[b] >= 0 && res[b] < ratio, op, ": cmp_residual_kv[", b, "]=", res[b],
                  " must be in [0, cmp_ratio=", ratio, ")");
    if (!cmp.empty()) {
      AAR_CHECK_ARG(cmp[b] * ratio + res[b] == ori[b], op, ": seqused_cmp_kv[", b, "] * cmp_ratio + cmp_residual_kv[",
                    b, "] = ", cmp[b], " * ", ratio, " + ", res[b], " must equal seqused_ori_kv[", b, "]=", ori[b]);
    } else {
      AAR_CHECK_ARG((ori[b] - res[b]) % ratio == 0, op, ": cmp_residual_kv[", b, "]=", res[b],
                    " is not seqused_ori_kv[", b, "]=", ori[b], " mod cmp_ratio=", ratio);
    }
  }
}

sig::SasResult sparse_flash_mla(AAR_SPARSE_FLASH_MLA_PARAMS) {
  const char* op = kSparseFlashMlaOp;
  if (layout_kv != "PA_BBND") {
    throw_not_supported(op, ": not supported by the CPU twin: layout_kv=\"", layout_kv,
                        "\" (only \"PA_BBND\", the paged caches)");
  }
  reject_int(op, topk_value_mode, 1, "topk_value_mode");
  reject_tensor(op, ori_topk_length, "ori_topk_length");
  reject_tensor(op, cmp_topk_length, "cmp_topk_length");
  const bool with_cmp = has(cmp_kv);
  if (with_cmp) {
    AAR_CHECK_ARG(cmp_ratio >= 2, op, ": cmp_ratio must be >= 2 with cmp_kv, got ", cmp_ratio);
    AAR_CHECK_ARG(has(cmp_block_table), op, ": cmp_block_table is required with cmp_kv (layout_kv \"PA_BBND\")");
  } else {
    AAR_CHECK_ARG(cmp_ratio == 1, op, ": cmp_ratio must be 1 without cmp_kv (0 is illegal), got ", cmp_ratio);
    AAR_CHECK_ARG(cmp_mask_mode == 0 || cmp_mask_mode == 3, op,
                  ": cmp_mask_mode without cmp_kv must be 0 or 3, got ", cmp_mask_mode);
    AAR_CHECK_ARG(!has(seqused_cmp_kv) && !has(cmp_residual_kv), op,
                  ": seqused_cmp_kv / cmp_residual_kv are given without cmp_kv");
  }
  if (has(ori_kv)) {
    AAR_CHECK_ARG(has(ori_block_table), op, ": ori_block_table is required with ori_kv (layout_kv \"PA_BBND\")");
  }
  if (!has(seqused_ori_kv)) {
    throw_invalid(op, ": seqused_ori_kv is required with layout_kv \"PA_BBND\" (the per-request KV lengths S_b)");
  }
  if (with_cmp) {
    if (!has(cmp_residual_kv)) {
      throw_invalid(op, ": cmp_residual_kv is required with cmp_kv and cmp_ratio=", cmp_ratio,
                    " (S_b % cmp_ratio, cmp_mask_mode 3)");
    }
    check_cmp_lengths(op, ints(op, *seqused_ori_kv, "seqused_ori_kv"), seqused_cmp_kv, *cmp_residual_kv, cmp_ratio);
  }
  const bool tnd = layout_q == "TND";
  auto [out, lse] = shared_kv_attention(op, q, ori_kv, cmp_kv, ori_sparse_indices, cmp_sparse_indices,
                                        ori_block_table, cmp_block_table, cu_seqlens_q, cu_seqlens_ori_kv,
                                        cu_seqlens_cmp_kv, seqused_q, seqused_ori_kv, sinks, metadata, softmax_scale,
                                        with_cmp ? cmp_ratio : 0, ori_mask_mode, with_cmp ? cmp_mask_mode : 3,
                                        ori_win_left, ori_win_right, layout_q, "PA_ND", return_softmax_lse);
  if (!return_softmax_lse) return {out, at::zeros({}, at::kFloat)};
  return {out, tnd ? lse.unsqueeze(0) : lse.unsqueeze(1)};
}

at::Tensor sparse_flash_mla_metadata(AAR_SPARSE_FLASH_MLA_METADATA_PARAMS) {
  const char* op = kSparseFlashMlaMetadataOp;
  const int64_t bs = batch_size.value_or(0), mq = max_seqlen_q.value_or(0), mo = max_seqlen_ori_kv.value_or(0),
                mc = max_seqlen_cmp_kv.value_or(0), otk = ori_topk.value_or(0), ctk = cmp_topk.value_or(0),
                ratio = cmp_ratio.value_or(1), omm = ori_mask_mode.value_or(0), cmm = cmp_mask_mode.value_or(0),
                wl = ori_win_left.value_or(-1), wr = ori_win_right.value_or(-1);
  const c10::string_view lq = layout_q.value_or("BSND"), lkv = layout_kv.value_or("BSND");
  const bool ho = has_ori_kv.value_or(true), hc = has_cmp_kv.value_or(true);
  AAR_CHECK_ARG(num_heads_q >= 1, op, ": num_heads_q must be >= 1, got ", num_heads_q);
  reject_int(op, num_heads_kv, 1, "num_heads_kv");
  AAR_CHECK_ARG(head_dim >= 1, op, ": head_dim must be >= 1, got ", head_dim);
  AAR_CHECK_ARG(bs >= 0 && mq >= 0 && mo >= 0 && mc >= 0, op,
                ": batch_size / max_seqlen_q / max_seqlen_ori_kv / max_seqlen_cmp_kv must be >= 0, got ", bs, ", ",
                mq, ", ", mo, ", ", mc);
  AAR_CHECK_ARG(otk >= 0 && ctk >= 0, op, ": ori_topk / cmp_topk must be >= 0, got ", otk, ", ", ctk);
  AAR_CHECK_ARG(ho || hc, op, ": has_ori_kv and has_cmp_kv are both false");
  AAR_CHECK_ARG(hc ? ratio >= 2 : ratio == 1, op, ": cmp_ratio=", ratio, hc ? " with has_cmp_kv (needs >= 2)" :
                " without has_cmp_kv (needs 1; 0 is illegal)");
  reject_int(op, omm, 4, "ori_mask_mode");
  if (hc) {
    reject_int(op, cmm, 3, "cmp_mask_mode");
  } else {
    AAR_CHECK_ARG(cmm == 0 || cmm == 3, op, ": cmp_mask_mode without has_cmp_kv must be 0 or 3, got ", cmm);
  }
  AAR_CHECK_ARG(wl >= 0 && wr >= 0, op, ": ori_win_left / ori_win_right must be >= 0, got ", wl, ", ", wr);
  const bool tnd = lq == "TND";
  if (!tnd && lq != "BSND") throw_not_supported(op, ": not supported: layout_q=\"", lq, "\" (only \"TND\", \"BSND\")");
  if (lkv != "PA_BBND") throw_not_supported(op, ": not supported: layout_kv=\"", lkv, "\" (only \"PA_BBND\")");
  reject_tensor(op, seqused_q, "seqused_q");
  reject_tensor(op, ori_topk_length, "ori_topk_length");
  reject_tensor(op, cmp_topk_length, "cmp_topk_length");
  if (!has(seqused_ori_kv)) throw_invalid(op, ": seqused_ori_kv is required with layout_kv \"PA_BBND\"");
  const std::vector<int64_t> ori = ints(op, *seqused_ori_kv, "seqused_ori_kv");
  AAR_CHECK_ARG(static_cast<int64_t>(ori.size()) == bs, op, ": seqused_ori_kv must have batch_size = ", bs,
                " entries, got ", ori.size());
  int64_t sum_ori = 0, sum_cmp = -1;
  for (size_t b = 0; b < ori.size(); ++b) {
    AAR_CHECK_ARG(ori[b] >= 0 && ori[b] <= mo, op, ": seqused_ori_kv[", b, "]=", ori[b],
                  " must be in [0, max_seqlen_ori_kv=", mo, "]");
    sum_ori += ori[b];
  }
  if (hc) {
    if (!has(cmp_residual_kv)) throw_invalid(op, ": cmp_residual_kv is required with has_cmp_kv and cmp_ratio=", ratio);
    check_cmp_lengths(op, ori, seqused_cmp_kv, *cmp_residual_kv, ratio);
    AAR_CHECK_ARG(mc == mo / ratio, op, ": max_seqlen_cmp_kv=", mc, " must be max_seqlen_ori_kv / cmp_ratio = ",
                  mo / ratio);
    if (has(seqused_cmp_kv)) {
      sum_cmp = 0;
      for (int64_t v : ints(op, *seqused_cmp_kv, "seqused_cmp_kv")) sum_cmp += v;
    }
  } else {
    AAR_CHECK_ARG(!has(seqused_cmp_kv) && !has(cmp_residual_kv), op,
                  ": seqused_cmp_kv / cmp_residual_kv are given with has_cmp_kv false");
  }
  if (has(cu_seqlens_q)) {
    const std::vector<int64_t> cu = ints(op, *cu_seqlens_q, "cu_seqlens_q");
    AAR_CHECK_ARG(static_cast<int64_t>(cu.size()) == bs + 1 && cu[0] == 0, op,
                  ": cu_seqlens_q must have batch_size + 1 = ", bs + 1, " entries starting at 0, got ", *cu_seqlens_q);
    for (size_t i = 1; i < cu.size(); ++i) {
      AAR_CHECK_ARG(cu[i] >= cu[i - 1], op, ": cu_seqlens_q must be non-decreasing, got ", *cu_seqlens_q);
    }
  } else if (tnd) {
    throw_invalid(op, ": cu_seqlens_q is required for layout_q \"TND\"");
  }
  if (has(cu_seqlens_ori_kv)) ints(op, *cu_seqlens_ori_kv, "cu_seqlens_ori_kv");
  if (has(cu_seqlens_cmp_kv)) ints(op, *cu_seqlens_cmp_kv, "cu_seqlens_cmp_kv");
  const std::vector<int64_t> fields = {0x534D4C41, 1,   num_heads_q, num_heads_kv, head_dim, bs,      mq,
                                       mo,         mc,  otk,         ctk,          ratio,    omm,     cmm,
                                       wl,         wr,  tnd ? 0 : 1, ho ? 1 : 0,   hc ? 1 : 0, sum_ori, sum_cmp};
  at::Tensor blob = at::zeros({1024}, at::kInt);
  int32_t* w = blob.data_ptr<int32_t>();
  for (size_t i = 0; i < fields.size(); ++i) {
    AAR_CHECK_ARG(fields[i] >= std::numeric_limits<int32_t>::min() && fields[i] <= std::numeric_limits<int32_t>::max(),
                  op, ": a scalar argument does not fit int32 (metadata field ", i, " = ", fields[i], ")");
    w[i] = static_cast<int32_t>(fields[i]);
  }
  return blob;
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_cot, CPU, m) {
  m.impl("sparse_flash_mla", TORCH_FN(aar::ops::cpu::sparse_flash_mla));
  m.impl("sparse_flash_mla_metadata", TORCH_FN(aar::ops::cpu::sparse_flash_mla_metadata));
}

// The metadata operator may get no tensor at all: the dispatcher then runs the
// CompositeExplicitAutograd kernel (the same function).
TORCH_LIBRARY_IMPL(ascend_cpu_cot, CompositeExplicitAutograd, m) {
  m.impl("sparse_flash_mla_metadata", TORCH_FN(aar::ops::cpu::sparse_flash_mla_metadata));
}
