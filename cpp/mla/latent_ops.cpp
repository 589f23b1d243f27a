// The latent attention calls shared by mla::Impl and mla::LatentAttention (latent_ops.h).
#include "latent_ops.h"

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"
#include "ascend_attn_rt/ops/provider.h"

namespace aar::mla::detail {

DecodeLayout decode_layout_of(const Metadata& md, bool kv_nz) {
  if (md.speculative) return DecodeLayout::TND;
  return kv_nz ? DecodeLayout::BSND : DecodeLayout::BNSD;
}

void check_latent_cache(const at::Tensor& c, bool is_nope, int64_t width, const Metadata& md, bool nz,
                        at::ScalarType want, const char* why) {
  const char* name = is_nope ? "nope_cache" : "rope_cache";
  AAR_CHECK_ARG(c.defined(), name, " is missing");
  if (!nz) {
    AAR_CHECK_ARG(c.dim() == 4 && c.size(1) == md.block_size && c.size(2) == 1 && c.size(3) == width, name,
                  " must have shape (num_blocks, block_size=", md.block_size, ", 1, ",
                  is_nope ? "kv_lora_rank=" : "qk_rope_head_dim=", width, "), got ", c.sizes());
    ::aar::detail::check_kv_cache_layout(
        c, name,
        is_nope ? "(num_blocks, block_size, 1, kv_lora_rank) = kv_cache_shapes(...)[0]"
                : "(num_blocks, block_size, 1, qk_rope_head_dim) = kv_cache_shapes(...)[1]");
  } else {
    AAR_CHECK_ARG(c.dim() == 5, name, " must be the 5-D NZ cache (num_blocks, 1, D/c, block_size, c) (enable_kv_nz), got ",
                  c.sizes());
    const auto s = Backend::nz_cache_shape(c.size(0), md.block_size, width, c.element_size());
    AAR_CHECK_ARG(c.sizes() == c10::IntArrayRef(s), name, " must be the NZ cache ", c10::IntArrayRef(s),
                  " (enable_kv_nz), got ", c.sizes());
    ::aar::detail::check_kv_cache_layout(c, name, "(num_blocks, 1, D/c, block_size, c) = nz_cache_shape(...)");
  }
  AAR_CHECK_ARG(c.size(0) >= md.num_blocks, name, " has ", c.size(0), " blocks, fewer than the metadata's ",
                md.num_blocks);
  AAR_CHECK_ARG(c.scalar_type() == want, name, " dtype ", c.scalar_type(), " must be ", want, why);
}

void set_latent_decode_params(const Metadata& md, DecodeLayout layout, int64_t heads_padded, double scale,
                              ops::FiaV2Tensors& t, ops::FiaV2Params& p) {
  assign(t.block_table, md.decode.block_table);
  p.num_query_heads = heads_padded;
  p.num_key_value_heads = 1;
  p.softmax_scale = scale;
  p.block_size = md.block_size;
  p.actual_seq_kvlen = md.decode.seq_lens_list;
  switch (layout) {
    case DecodeLayout::TND:
      // Row A of docs/design/mla.md §5.3. Upstream also requires the state to be one of
      // SpecDecoding/ChunkedPrefill/DecodeOnly/PrefillNoCache and otherwise falls
      // to the BNSD row with a multi-token decode, mismatching block-table rows
      // and batch (docs/design/mla.md §5.3); we use TND_NTD whenever decodes may have several tokens.
      assign(t.atten_mask, md.attn_mask);
      p.sparse_mode = 3;
      p.input_layout = "TND_NTD";
      p.has_actual_seq_qlen = true;
      p.actual_seq_qlen = md.decode.actual_seq_lengths_q;
      break;
    case DecodeLayout::BSND:  // row D (NZ caches)
    case DecodeLayout::BNSD:  // row E
      t.atten_mask.reset();
      p.sparse_mode = 0;
      p.input_layout = layout == DecodeLayout::BSND ? "BSND_NBSD" : "BNSD_NBSD";
      p.has_actual_seq_qlen = false;
      break;
  }
}

void set_latent_shard_params(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& nope,
                             const at::Tensor& rope, const Metadata& md, double scale, ops::FiaTensors& t,
                             ops::FiaParams& p) {
  const int64_t L = nope.size(-1), R = rope.size(-1), bs = md.block_size;
  t.query = qn;
  t.query_rope = qr;
  // (nb, bs, 1, D) -> (nb, 1, bs, D): a reinterpretation (Nkv = 1) of the validated contiguous caches.
  t.key = nope.view({nope.size(0), 1, bs, L});
  t.value = t.key;
  t.key_rope = rope.view({rope.size(0), 1, bs, R});
  t.block_table = md.decode.block_table;
  p.num_heads = qn.size(1);
  p.num_key_value_heads = 1;
  p.scale = scale;
  p.input_layout = "BNSD";
  p.sparse_mode = 0;
  p.block_size = bs;
  p.has_actual_seq_lengths = false;
  p.actual_seq_lengths_kv = md.decode.seq_lens_list;  // this rank's local lengths
  p.softmax_lse_flag = true;
}

at::Tensor latent_prefill_attention(const PrefillSpec& s, const at::Tensor& q_nope, const at::Tensor& q_pe,
                                    const at::Tensor& k_nope, const at::Tensor& k_pe, const at::Tensor& value,
                                    const at::Tensor& nope, const at::Tensor& rope, const Metadata& md) {
  const int64_t tp = q_nope.size(0), H = s.heads, L = s.kv_lora_rank, P = s.nope_dim, R = s.rope_dim,
                V = s.v_head_dim;
  const bool concat = s.heads_padded != H;  // docs/design/mla.md §5.5: non-power-of-two heads pass concatenated q/k, no rope tensors
  const auto& pf = md.prefill;
  // docs/design/mla.md §5.5: the TND MLA kernel takes bf16 only; other dtypes attend in
  // bf16 (the caller casts the result back where it lands). On the CPU twins
  // this is off unless asked for: they attend in any dtype.
  const bool to_bf16 =
      q_nope.scalar_type() != at::kBFloat16 && s.in_bf16.value_or(ops::resolve_provider(q_nope) == ops::Provider::Npu);
  auto cast = [&](const at::Tensor& x) { return to_bf16 ? x.to(at::kBFloat16) : x; };
  const at::Tensor qn = cast(q_nope), qr = cast(q_pe);
  // Queries qn_in / qr_in (cast) against keys and values (cast here): (O (T, H, V), LSE (T, H, 1)).
  auto attend = [&](const at::Tensor& qn_in, const at::Tensor& qr_in, const at::Tensor& kn_in,
                    const at::Tensor& kp_in, const at::Tensor& v_in, bool causal, c10::IntArrayRef q_ends,
                    c10::IntArrayRef kv_ends) {
    const at::Tensor kn = cast(kn_in), kp = cast(kp_in), v = cast(v_in);
    ops::FiaTensors t;
    ops::FiaParams p;
    if (concat) {
      t.query = at::cat({qn_in, qr_in}, -1);
      t.key = at::cat({kn, kp}, -1);
    } else {
      t.query = qn_in;
      t.key = kn;
      t.query_rope = qr_in;
      t.key_rope = kp;
    }
    t.value = v;
    if (causal) t.atten_mask = md.attn_mask;
    p.sparse_mode = causal ? 3 : 0;
    p.num_heads = H;
    p.num_key_value_heads = H;
    p.scale = s.scale;
    p.input_layout = "TND";
    p.actual_seq_lengths = q_ends;
    p.actual_seq_lengths_kv = kv_ends;
    p.softmax_lse_flag = true;
    return ops::fused_infer_attention_score(t, p);
  };
  at::Tensor out0, lse0;
  if (md.pcp.world_size > 1) {
    // docs/design/cp.md §11 / §6.4: the keys are the restored prefill rows of every PCP rank;
    // each local chunk (head, tail) attends its own chunk causally and the request's earlier
    // chunks without a mask, merged by LSE, then back to the local order.
    const PcpInfo& pc = md.pcp;
    auto block = [&](const at::Tensor& q_idx, const at::Tensor& nomask_idx, int32_t nomask_tokens,
                     c10::IntArrayRef nomask_ends, const at::Tensor& mask_idx) {
      const at::Tensor bn = qn.index_select(0, q_idx), br = qr.index_select(0, q_idx);
      auto [om, lm] = attend(bn, br, k_nope.index_select(0, mask_idx), k_pe.index_select(0, mask_idx),
                             value.index_select(0, mask_idx), /*causal=*/true, pc.mask_seq_ends, pc.mask_seq_ends);
      if (nomask_tokens == 0) return std::make_tuple(om.to(at::kFloat), lm);
      auto [on, ln] = attend(bn, br, k_nope.index_select(0, nomask_idx), k_pe.index_select(0, nomask_idx),
                             value.index_select(0, nomask_idx), /*causal=*/false, pc.mask_seq_ends, nomask_ends);
      return cp::merge_two_partials(on, ln, om, lm);
    };
    auto [oh, lh] = block(pc.q_head_idx, pc.kv_head_nomask_idx, pc.head_nomask_tokens, pc.head_nomask_kv_ends,
                          pc.kv_head_mask_idx);
    auto [ot, lt] = block(pc.q_tail_idx, pc.kv_tail_nomask_idx, pc.tail_nomask_tokens, pc.tail_nomask_kv_ends,
                          pc.kv_tail_mask_idx);
    out0 = at::cat({oh, ot}).index_select(0, pc.q_full_idx);
    lse0 = at::cat({lh, lt}).index_select(0, pc.q_full_idx);
  } else {
    std::tie(out0, lse0) =
        attend(qn, qr, k_nope, k_pe, value, /*causal=*/true, pf.actual_seq_lengths_q, pf.actual_seq_lengths_q);
  }
  const ChunkedContext& cc = pf.chunked;
  if (cc.num_chunks == 0) return out0.reshape({tp, H * V});

  // docs/design/mla.md §5.6: gather each chunk from the caches, up-project, attend, merge.
  std::vector<at::Tensor> outs{out0.to(at::kFloat).reshape({tp * H, V})};
  std::vector<at::Tensor> lses{lse0.reshape({tp * H})};
  const auto opts = nope.options();
  // The KV is sharded over the DCP group, or with PCP over the Wp * Wd PCP x DCP ranks.
  const bool sharded = md.dcp.world_size > 1 || md.pcp.world_size > 1;
  for (int32_t c = 0; c < cc.num_chunks; ++c) {
    const int64_t toks = cc.seq_tot[c];
    at::Tensor kv_c, kpe;
    if (sharded) {
      // docs/design/mla.md §6.3: this rank's part of the chunk (the padded local lengths from
      // the local starts; every rank gathers the same row count), [latent | k_pe] all-gathered
      // over the DCP group, then (PCP, docs/design/cp.md §11) over the PCP group: rank-major over
      // the KV ranks rp * Wd + rd; then the real rows request by request.
      const int64_t lt = cc.local_seq_tot[c];
      at::Tensor lkv = at::empty({lt, 1, L}, opts);
      at::Tensor lpe = at::empty({lt, 1, R}, rope.options());
      ops::gather_pa_kv_cache(nope, rope, pf.block_table, cc.padded_chunk_seq_lens[c], lkv, lpe, cc.starts[c]);
      at::Tensor all = at::cat({lkv, lpe}, -1);
      if (md.dcp.world_size > 1) {
        AAR_CHECK_ARG(s.dcp_comm != nullptr, "metadata built for DCP needs the layer's dcp_comm");
        all = s.dcp_comm->all_gather(all, 0);
      }
      if (md.pcp.world_size > 1) {
        AAR_CHECK_ARG(s.pcp_comm != nullptr, "metadata built for PCP needs the layer's pcp_comm");
        all = s.pcp_comm->all_gather(all, 0);
      }
      const at::Tensor rows =
          all.index_select(0, cc.reorg_index.narrow(0, cc.reorg_offsets[c], toks));  // (toks, 1, L+R)
      kv_c = rows.narrow(-1, 0, L);
      kpe = rows.narrow(-1, L, R);
    } else {
      kv_c = at::empty({toks, 1, L}, opts);
      kpe = at::empty({toks, 1, R}, rope.options());
      ops::gather_pa_kv_cache(nope, rope, pf.block_table, cc.chunk_seq_lens[c], kv_c, kpe, cc.starts[c]);
    }
    // FA-quant: the int8 latent dequantised (docs/design/mla.md §5.7, upstream's A5 rule).
    const at::Tensor lat = s.kv_cache_scale.has_value()
                               ? (kv_c.view({toks, L}).to(at::kFloat) * *s.kv_cache_scale).to(s.kv_b_proj.scalar_type())
                               : kv_c.reshape({toks, L});
    const at::Tensor kv = ops::dense::linear(lat, s.kv_b_proj).view({toks, H, P + V});
    const at::Tensor kn = kv.narrow(-1, 0, P).contiguous();
    const at::Tensor v = kv.narrow(-1, P, V).contiguous();
    const at::Tensor kp = kpe.expand({toks, H, R});
    auto [out_c, lse_c] = attend(qn, qr, kn, kp, v, /*causal=*/false, pf.actual_seq_lengths_q, cc.kv_ends[c]);
    outs.push_back(out_c.to(at::kFloat).reshape({tp * H, V}));
    lses.push_back(lse_c.reshape({tp * H}));
  }
  const at::Tensor merged = std::get<0>(ops::attention_update(lses, outs, 0));
  return merged.view({tp, H * V});
}

}  // namespace aar::mla::detail
