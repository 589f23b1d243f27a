#include "fia_common.h"

#include <limits>

namespace aar::ops::cpu {

namespace {

void check_same_kv_dtype(const char* op, const at::Tensor& q, const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::kChar) {
    throw_not_supported(op, ": int8 ", name,
                        " (antiquant KV) is not supported by the CPU twin; pass fp16/bf16/fp32 KV");
  }
  AAR_CHECK_ARG(t.scalar_type() == q.scalar_type(), op, ": ", name, " dtype ", t.scalar_type(),
                " must equal the query dtype ", q.scalar_type());
}

bool has(const std::optional<at::Tensor>* t) { return t != nullptr && t->has_value() && (*t)->defined(); }

// A per-channel (mode 0) antiquant scale/offset: (Nkv, 1, D) or per-tensor (1,)
// -> (1, Nkv, D) fp32.
at::Tensor antiquant_param(const char* op, const at::Tensor& t, const char* name, int64_t nkv, int64_t d) {
  AAR_CHECK_ARG(is_float_dtype(t.scalar_type()), op, ": ", name, " must be float16/bfloat16/float32, got ",
                t.scalar_type());
  AAR_CHECK_ARG(t.device().is_cpu(), op, ": the CPU twin needs a CPU ", name, ", got ", t.device());
  if (t.numel() == 1) return t.to(at::kFloat).reshape({1, 1, 1}).expand({1, nkv, d}).contiguous();
  if (!(t.dim() == 3 && t.size(0) == nkv && t.size(1) == 1 && t.size(2) == d)) {
    throw_not_supported(op, ": not supported by the CPU twin: ", name, " of shape ", t.sizes(),
                        " (only per-channel (Nkv=", nkv, ", 1, D=", d, ") as in BNSD, or per-tensor (1,))");
  }
  return t.to(at::kFloat).reshape({1, nkv, d}).contiguous();
}

// (S, Nkv, D) int8 -> fp32 (x + offset) * scale.
at::Tensor antiquant(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset) {
  at::Tensor f = x.to(at::kFloat);
  if (offset.defined()) f = f + offset;
  return f * scale;
}

}  // namespace

FiaPlan plan_fia(const FiaInputs& in) {
  const char* op = in.names.op;
  FiaPlan pl;
  const at::Tensor& q = in.query;

  // ---- scalar arguments
  if (in.layout == "TND") {
    pl.bnsd = false;
  } else if (in.layout == "BNSD") {
    pl.bnsd = true;
  } else {
    throw_not_supported(op, ": not supported by the CPU twin: input_layout=\"", in.layout,
                        "\" (only \"TND\" and \"BNSD\")");
  }
  if (in.sparse_mode != 0 && in.sparse_mode != 3 && in.sparse_mode != 4) {
    throw_not_supported(op, ": not supported by the CPU twin: sparse_mode=", in.sparse_mode, " (only 0, 3, 4)");
  }
  if (in.inner_precise != 0 && in.inner_precise != 1) {
    throw_not_supported(op, ": not supported by the CPU twin: inner_precise=", in.inner_precise, " (only 0, 1)");
  }
  AAR_CHECK_ARG(in.num_heads > 0, op, ": ", in.names.num_heads, " must be positive, got ", in.num_heads);
  AAR_CHECK_ARG(in.num_kv_heads >= 0, op, ": num_key_value_heads must be >= 0, got ", in.num_kv_heads);
  pl.heads = in.num_heads;
  pl.kv_heads = in.num_kv_heads == 0 ? in.num_heads : in.num_kv_heads;
  AAR_CHECK_ARG(pl.heads % pl.kv_heads == 0, op, ": num_key_value_heads=", pl.kv_heads, " must divide ",
                in.names.num_heads, "=", pl.heads);

  // ---- mask semantics
  pl.mask.sparse_mode = in.sparse_mode;
  if (in.sparse_mode == 0) {
    reject_tensor(op, in.atten_mask, "atten_mask with sparse_mode=0");
    if (in.pre_tokens != 2147483647 || in.next_tokens != 2147483647) {
      throw_not_supported(op, ": not supported by the CPU twin: sparse_mode=0 with pre_tokens=", in.pre_tokens,
                          ", next_tokens=", in.next_tokens, " (only the defaults 2147483647)");
    }
  } else {
    // The mask's content is a fixed convention (docs/design/ops.md §4.1): only its shape is
    // checked. Mode 3 ignores pre/next_tokens, as the kernel documents.
    check_compressed_mask(op, in.atten_mask, in.sparse_mode);
    if (in.sparse_mode == 4) {  // inclusive band p - pre <= j <= p + next (docs/design/gqa.md §4.2)
      pl.mask.pre_tokens = in.pre_tokens;
      pl.mask.next_tokens = in.next_tokens;
    }
  }

  // ---- dtypes / devices
  AAR_CHECK_ARG(is_float_dtype(q.scalar_type()), op, ": query dtype must be float16/bfloat16/float32, got ",
                q.scalar_type());
  const std::pair<const std::optional<at::Tensor>*, const char*> aq_args[] = {
      {in.key_antiquant_scale, "key_antiquant_scale"},
      {in.key_antiquant_offset, "key_antiquant_offset"},
      {in.value_antiquant_scale, "value_antiquant_scale"},
      {in.value_antiquant_offset, "value_antiquant_offset"}};
  const char* first_aq = nullptr;
  for (const auto& [t, name] : aq_args) {
    if (has(t) && first_aq == nullptr) first_aq = name;
  }
  const bool antiquant = first_aq != nullptr;
  if (antiquant) {
    // The one antiquant form the twin implements: int8 key/value, both scales,
    // offsets both or neither.
    const bool ok = has(in.key_antiquant_scale) && has(in.value_antiquant_scale) &&
                    has(in.key_antiquant_offset) == has(in.value_antiquant_offset) &&
                    in.key.scalar_type() == at::kChar && in.value.scalar_type() == at::kChar;
    if (!ok) {
      throw_not_supported(op, ": not supported by the CPU twin: ", first_aq, " in this combination (key ",
                          in.key.scalar_type(), ", value ", in.value.scalar_type(),
                          "); KV antiquant needs int8 key and value, key_antiquant_scale and value_antiquant_scale "
                          "together, and key/value_antiquant_offset both or neither");
    }
  } else {
    check_same_kv_dtype(op, q, in.key, "key");
    check_same_kv_dtype(op, q, in.value, "value");
  }
  AAR_CHECK_ARG(q.device().is_cpu() && in.key.device().is_cpu() && in.value.device().is_cpu(), op,
                ": the CPU twin needs CPU tensors, got query on ", q.device());

  // ---- query
  const std::vector<int64_t> q_list = to_vector(in.q_lens);
  if (!pl.bnsd) {
    AAR_CHECK_ARG(q.dim() == 3 && q.size(1) == pl.heads, op, ": TND query must be (T, ", in.names.num_heads, "=",
                  pl.heads, ", D), got ", q.sizes());
    AAR_CHECK_ARG(in.q_lens.has_value(), op, ": input_layout TND requires ", in.names.q_lens,
                  " (cumulative ends)");
    AAR_CHECK_ARG(!q_list.empty(), op, ": ", in.names.q_lens, " must not be empty");
    cumulative_to_ranges(op, in.names.q_lens, q_list, q.size(0), "the query token count T", pl.q_start, pl.q_len);
    pl.batch = static_cast<int64_t>(q_list.size());
  } else {
    AAR_CHECK_ARG(q.dim() == 4 && q.size(1) == pl.heads, op, ": BNSD query must be (B, ", in.names.num_heads,
                  "=", pl.heads, ", S, D), got ", q.sizes());
    pl.batch = q.size(0);
    pl.q_seq = q.size(2);
    pl.q_start.assign(pl.batch, 0);
    if (in.q_lens.has_value()) {
      AAR_CHECK_ARG(static_cast<int64_t>(q_list.size()) == pl.batch, op, ": ", in.names.q_lens,
                    " must have B=", pl.batch, " per-request lengths for BNSD, got ", q_list.size());
      for (int64_t b = 0; b < pl.batch; ++b) {
        AAR_CHECK_ARG(q_list[b] >= 0 && q_list[b] <= pl.q_seq, op, ": ", in.names.q_lens, "[", b, "]=", q_list[b],
                      " must be in [0, S=", pl.q_seq, "]");
      }
      pl.q_len = q_list;
    } else {
      pl.q_len.assign(pl.batch, pl.q_seq);
    }
  }
  pl.head_dim = q.size(-1);
  const int64_t d = pl.head_dim;

  // ---- key / value
  const at::Tensor& k = in.key;
  const at::Tensor& v = in.value;
  const std::vector<int64_t> kv_list = to_vector(in.kv_lens);
  pl.paged = in.block_table.has_value() && in.block_table->defined();
  if (pl.paged) {
    AAR_CHECK_ARG(in.kv_lens.has_value(), op, ": paged KV (block_table given) requires ", in.names.kv_lens,
                  " (per-request lengths)");
    AAR_CHECK_ARG(static_cast<int64_t>(kv_list.size()) == pl.batch, op, ": ", in.names.kv_lens, " must have ",
                  pl.batch, " per-request lengths (one per request), got ", kv_list.size());
    AAR_CHECK_ARG(k.dim() == v.dim() && k.size(0) == v.size(0), op,
                  ": key and value caches must have the same rank and block count, got ", k.sizes(), " and ",
                  v.sizes());
    const int64_t nkv = pl.kv_heads;
    int64_t bs = 0;
    if (k.dim() == 3) {
      pl.paged_layout = PagedLayout::Hidden3D;
      bs = k.size(1);
      AAR_CHECK_ARG(k.size(2) == nkv * d, op, ": 3-D key cache must be (num_blocks, block_size, Nkv*D=", nkv * d,
                    "), got ", k.sizes());
      AAR_CHECK_ARG(v.size(1) == bs && v.size(2) % nkv == 0, op,
                    ": 3-D value cache must be (num_blocks, block_size, Nkv*Dv), got ", v.sizes());
      pl.v_head_dim = v.size(2) / nkv;
    } else if (k.dim() == 4) {
      // torch_npu documents the 4-D paged cache as (blocknum, KV_N, blocksize, D).
      pl.paged_layout = PagedLayout::Bnbd4D;
      bs = k.size(2);
      if (!(k.size(1) == nkv && k.size(3) == d)) {
        throw_invalid(op, ": 4-D key cache must be (num_blocks, Nkv=", nkv, ", block_size, D=", d, ") as documented ",
                      "by torch_npu, got ", k.sizes(),
                      "; a vLLM (num_blocks, block_size, Nkv, D) cache must be passed as the 3-D view "
                      "(num_blocks, block_size, Nkv*D)");
      }
      AAR_CHECK_ARG(v.size(1) == nkv && v.size(2) == bs, op, ": 4-D value cache must be (num_blocks, Nkv, ",
                    "block_size, Dv), got ", v.sizes());
      pl.v_head_dim = v.size(3);
    } else if (k.dim() == 5) {
      pl.paged_layout = PagedLayout::Nz5D;
      const int64_t c = 32 / static_cast<int64_t>(k.element_size());
      bs = k.size(3);
      AAR_CHECK_ARG(k.size(1) == nkv && k.size(4) == c && k.size(2) * c == d, op,
                    ": 5-D NZ key cache must be (num_blocks, Nkv=", nkv, ", D/", c, ", block_size, ", c, "), got ",
                    k.sizes());
      AAR_CHECK_ARG(v.size(1) == nkv && v.size(3) == bs && v.size(4) == c, op,
                    ": 5-D NZ value cache must be (num_blocks, Nkv, Dv/", c, ", block_size, ", c, "), got ",
                    v.sizes());
      pl.v_head_dim = v.size(2) * c;
    } else {
      throw_invalid(op, ": paged key cache must be 3-D (nb, bs, Nkv*D), 4-D (nb, Nkv, bs, D) or 5-D NZ, got ",
                    k.sizes());
    }
    AAR_CHECK_ARG(in.block_size == bs, op, ": block_size=", in.block_size,
                  " must equal the cache block size ", bs);
    pl.block_size = bs;
    pl.kv_len = kv_list;
    pl.kv_start.assign(pl.batch, 0);
    check_block_table(op, *in.block_table, pl.batch, pl.kv_len, bs, k.size(0), in.names.kv_lens);
  } else if (!pl.bnsd) {
    AAR_CHECK_ARG(k.dim() == 3 && k.size(1) == pl.kv_heads && k.size(2) == d, op,
                  ": dense TND key must be (Tkv, Nkv=", pl.kv_heads, ", D=", d, "), got ", k.sizes());
    AAR_CHECK_ARG(v.dim() == 3 && v.size(0) == k.size(0) && v.size(1) == pl.kv_heads, op,
                  ": dense TND value must be (Tkv=", k.size(0), ", Nkv=", pl.kv_heads, ", Dv), got ", v.sizes());
    pl.v_head_dim = v.size(2);
    AAR_CHECK_ARG(in.kv_lens.has_value(), op, ": dense TND KV requires ", in.names.kv_lens,
                  " (cumulative ends)");
    AAR_CHECK_ARG(static_cast<int64_t>(kv_list.size()) == pl.batch, op, ": ", in.names.kv_lens, " must have ",
                  pl.batch, " cumulative ends (one per request), got ", kv_list.size());
    cumulative_to_ranges(op, in.names.kv_lens, kv_list, k.size(0), "the key token count Tkv", pl.kv_start,
                         pl.kv_len);
  } else {
    AAR_CHECK_ARG(k.dim() == 4 && k.size(0) == pl.batch && k.size(1) == pl.kv_heads && k.size(3) == d, op,
                  ": dense BNSD key must be (B=", pl.batch, ", Nkv=", pl.kv_heads, ", Skv, D=", d, "), got ",
                  k.sizes());
    AAR_CHECK_ARG(v.dim() == 4 && v.size(0) == pl.batch && v.size(1) == pl.kv_heads && v.size(2) == k.size(2),
                  op, ": dense BNSD value must be (B, Nkv, Skv, Dv) like key, got ", v.sizes());
    pl.v_head_dim = v.size(3);
    pl.kv_start.assign(pl.batch, 0);
    if (in.kv_lens.has_value()) {
      AAR_CHECK_ARG(static_cast<int64_t>(kv_list.size()) == pl.batch, op, ": ", in.names.kv_lens,
                    " must have B=", pl.batch, " per-request lengths for BNSD, got ", kv_list.size());
      for (int64_t b = 0; b < pl.batch; ++b) {
        AAR_CHECK_ARG(kv_list[b] >= 0 && kv_list[b] <= k.size(2), op, ": ", in.names.kv_lens, "[", b,
                      "]=", kv_list[b], " must be in [0, Skv=", k.size(2), "]");
      }
      pl.kv_len = kv_list;
    } else {
      pl.kv_len.assign(pl.batch, k.size(2));
    }
  }

  // ---- KV antiquant (v1, per-channel mode 0)
  if (antiquant) {
    pl.k_scale = antiquant_param(op, **in.key_antiquant_scale, "key_antiquant_scale", pl.kv_heads, d);
    pl.v_scale = antiquant_param(op, **in.value_antiquant_scale, "value_antiquant_scale", pl.kv_heads, pl.v_head_dim);
    if (has(in.key_antiquant_offset)) {
      pl.k_offset = antiquant_param(op, **in.key_antiquant_offset, "key_antiquant_offset", pl.kv_heads, d);
      pl.v_offset =
          antiquant_param(op, **in.value_antiquant_offset, "value_antiquant_offset", pl.kv_heads, pl.v_head_dim);
    }
  }

  // ---- learnable sink (v2)
  if (in.learnable_sink.has_value() && in.learnable_sink->defined()) {
    const at::Tensor& s = *in.learnable_sink;
    AAR_CHECK_ARG(is_float_dtype(s.scalar_type()), op, ": learnable_sink must be float32/bfloat16/float16, got ",
                  s.scalar_type());
    AAR_CHECK_ARG(s.dim() == 1 && s.size(0) == pl.heads, op, ": learnable_sink must be (num_query_heads=",
                  pl.heads, ",), got ", s.sizes());
    pl.sink = s.to(at::kFloat).contiguous();
  }

  // ---- output shapes
  if (!pl.bnsd) {
    pl.out_shape = {q.size(0), pl.heads, pl.v_head_dim};
    pl.lse_shape = {q.size(0), pl.heads, 1};
  } else {
    pl.out_shape = {pl.batch, pl.heads, pl.q_seq, pl.v_head_dim};
    pl.lse_shape = {pl.batch, pl.heads, pl.q_seq, 1};
  }
  return pl;
}

void run_fia(const FiaPlan& pl, const FiaInputs& in, at::Tensor& out, at::Tensor* lse) {
  for (int64_t b = 0; b < pl.batch; ++b) {
    const int64_t sq = pl.q_len[b];
    if (sq == 0) continue;
    const int64_t skv = pl.kv_len[b];
    at::Tensor q_b, out_b, lse_b;
    if (!pl.bnsd) {
      q_b = in.query.narrow(0, pl.q_start[b], sq);
      out_b = out.narrow(0, pl.q_start[b], sq);
      if (lse) lse_b = lse->narrow(0, pl.q_start[b], sq);
    } else {
      q_b = in.query.select(0, b).narrow(1, 0, sq).permute({1, 0, 2});
      out_b = out.select(0, b).narrow(1, 0, sq).permute({1, 0, 2});
      if (lse) lse_b = lse->select(0, b).narrow(1, 0, sq).permute({1, 0, 2});
    }
    if (skv == 0) {
      out_b.zero_();
      if (lse) lse_b.fill_(-std::numeric_limits<float>::infinity());
      continue;
    }
    at::Tensor k_b, v_b;
    if (pl.paged) {
      k_b = gather_paged(in.key, pl.paged_layout, *in.block_table, b, skv, pl.block_size, pl.kv_heads, pl.head_dim);
      v_b = gather_paged(in.value, pl.paged_layout, *in.block_table, b, skv, pl.block_size, pl.kv_heads,
                         pl.v_head_dim);
    } else if (!pl.bnsd) {
      k_b = in.key.narrow(0, pl.kv_start[b], skv);
      v_b = in.value.narrow(0, pl.kv_start[b], skv);
    } else {
      k_b = in.key.select(0, b).narrow(1, 0, skv).permute({1, 0, 2});
      v_b = in.value.select(0, b).narrow(1, 0, skv).permute({1, 0, 2});
    }
    if (pl.k_scale.defined()) {
      k_b = antiquant(k_b, pl.k_scale, pl.k_offset);
      v_b = antiquant(v_b, pl.v_scale, pl.v_offset);
    }
    attend(q_b, k_b, v_b, pl.mask, in.scale, pl.sink, out_b, lse_b);
  }
}

std::tuple<at::Tensor, at::Tensor> fia_functional(const FiaInputs& in, bool want_lse) {
  const FiaPlan pl = plan_fia(in);
  at::Tensor out = at::zeros(pl.out_shape, in.query.options());
  at::Tensor lse;
  if (want_lse) {
    lse = at::full(pl.lse_shape, -std::numeric_limits<float>::infinity(), in.query.options().dtype(at::kFloat));
  } else {
    lse = at::zeros({1}, in.query.options().dtype(at::kFloat));  // documented placeholder: shape [1], value 0
  }
  run_fia(pl, in, out, want_lse ? &lse : nullptr);
  return {out, lse};
}

void fia_out(const FiaInputs& in, bool want_lse, at::Tensor& attention_out, at::Tensor& softmax_lse) {
  const char* op = in.names.op;
  const FiaPlan pl = plan_fia(in);
  AAR_CHECK_ARG(attention_out.sizes() == c10::IntArrayRef(pl.out_shape), op, ": attention_out must have shape ",
                c10::IntArrayRef(pl.out_shape), ", got ", attention_out.sizes());
  AAR_CHECK_ARG(attention_out.scalar_type() == in.query.scalar_type(), op, ": attention_out dtype ",
                attention_out.scalar_type(), " must equal the query dtype ", in.query.scalar_type());
  if (want_lse) {
    AAR_CHECK_ARG(softmax_lse.sizes() == c10::IntArrayRef(pl.lse_shape), op, ": softmax_lse must have shape ",
                  c10::IntArrayRef(pl.lse_shape), ", got ", softmax_lse.sizes());
    AAR_CHECK_ARG(softmax_lse.scalar_type() == at::kFloat, op, ": softmax_lse must be float32, got ",
                  softmax_lse.scalar_type());
    softmax_lse.fill_(-std::numeric_limits<float>::infinity());
  }
  // Rows outside every request (BNSD padding) are defined as 0, as in the functional variant.
  if (pl.bnsd) attention_out.zero_();
  run_fia(pl, in, attention_out, want_lse ? &softmax_lse : nullptr);
}

at::Tensor fia_workspace(const FiaInputs& in) {
  const FiaPlan pl = plan_fia(in);
  int64_t total_kv = 0;
  for (int64_t n : pl.kv_len) total_kv += n;
  // Deterministic, grows with the total KV length; the twin never reads it.
  return at::zeros({64 + total_kv * pl.heads}, in.query.options().dtype(at::kByte));
}

}  // namespace aar::ops::cpu
