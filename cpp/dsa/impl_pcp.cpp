// DSA (DeepSeek-V4) PCP forward (docs/design/sparse_cp.md §13): Impl::run_pcp. Kept apart from impl.cpp, whose
// single-rank road it reuses (write_step_caches, indexer_select, attend, run_o_proj).
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/dsa_inplace_ops.h"
#include "ascend_attn_rt/ops/quant.h"
#include "streams.h"
#include "workspace.h"

namespace aar::dsa {

void Impl::run_pcp(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
                   sfa::TopkBuffer* topk, detail::Workspace& ws) {
  // A step with prefills only (StepMetadata::pcp_split; a step without is replicated and runs the single-rank
  // road, §13.4). Every rank issues its one all-gather, whatever its rows hold (a rank of pads only too).
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const PcpStepMetadata& pc = st.pcp;
  const int64_t tl = pc.num_local_tokens, tk = st.num_kernel_tokens;
  const int64_t D = cf.head_dim, R = cf.rope_dim;
  const int32_t ratio = cf.compress_ratio;

  // ---- 1. the global step's hidden rows: the ranks' local rows gathered rank-major, each token picked
  // from the rank that computes it (a decode from rank 0's copy).
  AAR_CHECK_ARG(st.pcp_split(), "internal: run_pcp on a step without prefill (a replicated step)");
  detail::StreamPlan sp = stream_plan(hidden.device());
  sp.on_main("gather_hidden");
  const at::Tensor gathered = cf.pcp_comm->all_gather(hidden, 0);
  const at::Tensor x = ops::dense::index_select(gathered, 0, pc.gather_index);

  // ---- 2. every token's rows into this rank's complete caches, at the global step's slots. With multistream
  // the compressed caches' writers run on the side stream (forked after the gather, which they read), joined
  // below before the selection and the attention read them (docs/design/dsa.md §5.5).
  ws.tokens(std::max(tk, tl));  // the workspace at its size for the step before the side stream takes views of it
  write_step_caches(x, c, md, tk, ws, sp);

  // ---- 3. this rank's rows: the query, the C4 selection and SAS attention per segment (each segment a request
  // of its own, bottom-right causal over the segment's lengths; the segments' block-table rows).
  GroupMetadata swa = *md.swa, att, idx;
  swa.block_table = md.swa->pcp_block_table;
  LayerMetadata ml = md;
  ml.swa = &swa;
  if (md.attention != nullptr) {
    att = *md.attention;
    att.block_table = md.attention->pcp_block_table;
    ml.attention = &att;
  }
  if (md.indexer_cache != nullptr) {
    idx = *md.indexer_cache;
    idx.block_table = md.indexer_cache->pcp_block_table;
    ml.indexer_cache = &idx;
  }
  const detail::TokenViews& v = ws.tokens(tl);
  // The query rotates with the rows of the layer's table (compressed layers: compress_rope_theta).
  const bool ctab = ratio > 1;
  const at::Tensor cos3 = (ctab ? pc.compress_cos : pc.cos).view({tl, 1, R});
  const at::Tensor sin3 = (ctab ? pc.compress_sin : pc.sin).view({tl, 1, R});
  const at::Tensor neg3 = (ctab ? pc.compress_neg_sin : pc.neg_sin).view({tl, 1, R});
  sp.on_main("prolog");
  // docs/design/dsa.md §5.4: a W8A8 layer quantises the local rows per token (the same codes as their rows of
  // the gathered step: the rule is per row).
  std::optional<ops::W8A8DynamicInput> xq;
  if (w8a8_) xq = quantize_x(hidden, v, /*graph=*/false);
  project_q(hidden, xq ? &*xq : nullptr, v, /*graph=*/false);
  ops::dense::rms_norm_out(v.q, v.q, ones_d_, cf.eps);
  at::Tensor q = v.q;
  ops::inplace_partial_rotary_mul(q, cos3, sin3, "interleave", {D - R, D});
  at::Tensor sel;
  if (ratio == 4) {
    sp.wait(detail::StreamPlan::kIndexerCache, "wait_indexer_cache");
    // A layer without its own selection reads the buffer's rows (every layer of a step has the same rows).
    sp.on_main(cf.skip_topk ? "topk_reuse" : "indexer_select");
    sel = cf.skip_topk ? topk->view(tl)
                       : indexer_select(hidden, c, ml, v, cos3, sin3, pc.q_ends, pc.indexer_seq_lens, tl,
                                        /*graph=*/false, topk);
  }
  last_topk_ = sel;
  if (ratio > 1) sp.wait(detail::StreamPlan::kCompressedKv, "wait_compressed_kv");
  sp.on_main("attention");
  at::Tensor o = attend(c, ml, v.q, pc.query_start_loc, pc.seq_lens, sel, at::Tensor(), at::Tensor());
  ops::inplace_partial_rotary_mul(o, cos3, neg3, "interleave", {D - R, D});
  sp.on_main("o_proj");
  run_o_proj(o, output);
  // Pad rows (past their request's tokens) are zeros.
  output.masked_fill_(pc.local_token_index.lt(0).unsqueeze(1), 0);
}

}  // namespace aar::dsa
