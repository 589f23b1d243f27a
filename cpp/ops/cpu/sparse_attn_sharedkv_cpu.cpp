// CPU twins of vllm-ascend's _C_ascend::npu_sparse_attn_sharedkv and
// npu_sparse_attn_sharedkv_metadata (ascend_cpu_va), the DeepSeek-V4 shared-KV
// sparse attention (docs/design/dsa.md §1.4, §3.5, docs/design/ops.md §4.6; semantics in
// include/ascend_attn_rt/ops/sparse_attn_sharedkv.h).
//
// Decisions where upstream is silent:
// - layout_kv "PA_ND" only (paged caches (num_blocks, block_size, 1, D), one
//   KV head); layout_q "TND" (cu_seqlens_q required) or "BSND" (every request
//   has S = q.size(1) query rows; cu_seqlens_q must then be unset).
// - The KV lengths are seqused_kv; the paged caches are addressed through the
//   block tables. cu_seqlens_ori_kv / cu_seqlens_cmp_kv (A2/A3 pass
//   query_start_loc or an empty tensor there) are checked to be int32 1-D and
//   not read: under PA_ND they carry nothing the twin needs. The same holds for
//   `metadata` (int32, 1024 elements when given): tiling data for the device.
// - seqused_q is NotSupported; ori_mask_mode 4 and cmp_mask_mode 3 only.
// - softmax_scale must be finite and > 0 (the schema default 0 has no
//   documented device meaning, so it is refused rather than guessed).
// - cmp_ratio >= 2 with cmp_kv, 0 or 1 without; cmp_sparse_indices and
//   cmp_block_table need cmp_kv, ori_sparse_indices / ori_block_table need
//   ori_kv; at least one of ori_kv / cmp_kv.
// - seqused_kv[b] >= q_b (a query row's position p = S_b - q_b + i is >= 0).
// - ori_sparse_indices entries are physical slots block * bs + offset in
//   [0, num_blocks * bs) or -1 (skipped); the window is not applied on top of
//   them (they are the row's key set, docs/design/dsa.md §3.4). Any other negative entry is an
//   error. cmp_sparse_indices entries: -1 skipped, entries >= the row's visible
//   limit skipped (the indexer's tail), other negatives an error. Duplicates in
//   either count twice (the kernel reads what it is given).
// - Every block a row reads must be in its table (column < cols) and in
//   [0, num_blocks): checked for all rows before any arithmetic.
// - softmax_lse: fp32, q's shape minus the last dim, the log of the full
//   denominator (sink included); -inf for an empty row without a sink.
//
// The metadata twin returns a deterministic (1024,) int32 blob that is OPAQUE:
// nothing reads it on CPU (the attention twin above does not). Its layout, for
// debugging only: [0] 0x5341534D ("SASM"), [1] 1 (version), [2..4] num_heads_q,
// num_heads_kv, head_dim, [5..7] batch_size, max_seqlen_q, max_seqlen_kv,
// [8..9] ori_topk, cmp_topk, [10..14] cmp_ratio, ori_mask_mode, cmp_mask_mode,
// ori_win_left, ori_win_right, [15] layout_q (0 TND, 1 BSND), [16..17]
// has_ori_kv, has_cmp_kv, [18] cu_seqlens_q's last entry or -1, [19] the sum of
// seqused_kv or -1; the rest 0.
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mx_codec.h"
#include "shared_kv_attention.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kSparseAttnSharedkvOp = "_C_ascend::npu_sparse_attn_sharedkv";
constexpr const char* kSparseAttnSharedkvMetadataOp = "_C_ascend::npu_sparse_attn_sharedkv_metadata";
constexpr const char* kKvqOp = "_C_ascend::npu_kv_quant_sparse_attn_sharedkv";
constexpr const char* kKvqMdOp = "_C_ascend::npu_kv_quant_sparse_attn_sharedkv_metadata";

// The A5 FP8 row (docs/design/dsa.md §1.4): [448 fp8-e4m3 nope | 64 bf16 rope (128 B) | 7 e8m0 scales, one per 64 nope
// values | 57 pad] = 640 bytes; q is 512 wide (nope + rope).
constexpr int64_t kQuantRowBytes = 640, kQuantNope = 448, kQuantRope = 64, kQuantTile = 64;
constexpr int64_t kQuantScales = kQuantNope / kQuantTile;

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

std::vector<int64_t> read_i32_1d(const char* op, const at::Tensor& t, const char* name) {
  AAR_CHECK_ARG(t.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t.scalar_type());
  AAR_CHECK_ARG(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  AAR_CHECK_ARG(t.device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t.device());
  const at::Tensor c = t.contiguous();
  const int32_t* p = c.data_ptr<int32_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

void check_unread_lengths(const char* op, const std::optional<at::Tensor>& t, const char* name) {
  if (given(t)) read_i32_1d(op, *t, name);
}

// A paged cache (num_blocks, block_size, 1, D) and the block table it is read through.
struct Paged {
  const char* name = nullptr;
  const char* table_name = nullptr;
  at::Tensor rows;  // (nb, bs, D) view of the cache
  int64_t nb = 0, bs = 0;
  bool quant = false;
  at::Tensor table;  // (B, cols) int32 contiguous, undefined when absent
};

// quant: the cache holds A5 640-byte rows (any 1-byte dtype: float8_e4m3fn, uint8, int8), decoded on read.
Paged check_cache(const char* op, const at::Tensor& cache, const char* name, int64_t d, at::ScalarType dt,
                  bool quant) {
  AAR_CHECK_ARG(cache.dim() == 4, op, ": ", name, " must be the paged cache (num_blocks, block_size, 1, D) of ",
                "layout_kv \"PA_ND\", got ", cache.sizes());
  if (cache.size(2) != 1) {
    throw_not_supported(op, ": not supported: ", name, " with ", cache.size(2), " KV heads (shape ", cache.sizes(),
                        "); shared-KV attention has 1");
  }
  if (quant) {
    AAR_CHECK_ARG(cache.size(3) == kQuantRowBytes, op, ": ", name, " rows must be ", kQuantRowBytes,
                  " bytes (the A5 FP8 row), got ", cache.sizes());
    AAR_CHECK_ARG(cache.element_size() == 1, op, ": ", name, " must be a 1-byte dtype (float8_e4m3fn / uint8 / int8), got ",
                  cache.scalar_type());
  } else {
    AAR_CHECK_ARG(cache.size(3) == d, op, ": ", name, " rows must be D=", d, " wide like q, got ", cache.sizes());
    AAR_CHECK_ARG(cache.scalar_type() == dt, op, ": ", name, " must have q's dtype ", dt, ", got ",
                  cache.scalar_type());
  }
  AAR_CHECK_ARG(cache.size(1) >= 1, op, ": ", name, " block size must be positive, got ", cache.sizes());
  AAR_CHECK_ARG(cache.device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", cache.device());
  Paged p;
  p.quant = quant;
  p.name = name;
  p.rows = cache.select(2, 0);
  p.nb = cache.size(0);
  p.bs = cache.size(1);
  return p;
}

void attach_table(const char* op, Paged& p, const at::Tensor& table, const char* table_name, int64_t batch) {
  AAR_CHECK_ARG(table.scalar_type() == at::kInt, op, ": ", table_name, " must be int32, got ", table.scalar_type());
  AAR_CHECK_ARG(table.dim() == 2 && table.size(0) == batch, op, ": ", table_name, " must be (batch=", batch,
                ", max_blocks), got ", table.sizes());
  AAR_CHECK_ARG(table.device().is_cpu(), op, ": the CPU twin needs ", table_name, " on the CPU, got ",
                table.device());
  p.table_name = table_name;
  p.table = table.contiguous();
}

// Block and offset of logical row s of request b, checked against the table and the cache.
void locate(const char* op, const Paged& p, int64_t b, int64_t s, std::vector<int64_t>& blk, std::vector<int64_t>& off) {
  const int64_t col = s / p.bs;
  AAR_CHECK_ARG(col < p.table.size(1), op, ": ", p.table_name, " has ", p.table.size(1), " columns but request ", b,
                " reads ", p.name, " row ", s, " (column ", col, ", block size ", p.bs, ")");
  const int64_t id = p.table.data_ptr<int32_t>()[b * p.table.size(1) + col];
  AAR_CHECK_ARG(id >= 0 && id < p.nb, op, ": ", p.table_name, "[", b, ", ", col, "]=", id,
                " is out of range [0, ", p.nb, ") (", p.name, " has ", p.nb, " blocks)");
  blk.push_back(id);
  off.push_back(s % p.bs);
}

// Per query token, the (block, offset) pairs it reads, as CSR lists.
struct KeyRows {
  std::vector<int64_t> start{0}, blk, off;
  void close_row() { start.push_back(static_cast<int64_t>(blk.size())); }
};

// A5 rows (n, 640) of 1-byte elements -> fp32 (n, 512): nope[j] = fp8[j] * 2^(e8m0[j / 64] - 127) (an e8m0
// byte 255 is NaN, as in the OCP MX format), then the 64 rope values stored as bf16 bytes.
at::Tensor decode_quant_rows(const at::Tensor& rows) {
  const at::Tensor bytes = rows.view(at::kByte).contiguous();
  const int64_t n = bytes.size(0);
  const at::Tensor nope = bytes.narrow(1, 0, kQuantNope).view(at::kFloat8_e4m3fn).to(at::kFloat);
  const at::Tensor rope = bytes.narrow(1, kQuantNope, 2 * kQuantRope).contiguous().view(at::kBFloat16).to(at::kFloat);
  const at::Tensor scale = mx::e8m0_to_float(bytes.narrow(1, kQuantNope + 2 * kQuantRope, kQuantScales));
  const at::Tensor deq = (nope.view({n, kQuantScales, kQuantTile}) * scale.unsqueeze(2)).view({n, kQuantNope});
  return at::cat({deq, rope}, 1);
}

at::Tensor gather(const Paged& p, const KeyRows& kr, int64_t t) {
  const int64_t a = kr.start[t], n = kr.start[t + 1] - a;
  const at::Tensor bi = at::tensor(std::vector<int64_t>(kr.blk.begin() + a, kr.blk.begin() + a + n), at::kLong);
  const at::Tensor oi = at::tensor(std::vector<int64_t>(kr.off.begin() + a, kr.off.begin() + a + n), at::kLong);
  const at::Tensor rows = p.rows.index({bi, oi});  // (n, row width)
  if (!p.quant) return rows.to(at::kFloat);         // (n, D)
  return decode_quant_rows(rows);
}

void check_indices(const char* op, const at::Tensor& idx, const char* name, int64_t tokens) {
  AAR_CHECK_ARG(idx.scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", idx.scalar_type());
  AAR_CHECK_ARG(idx.dim() == 3 && idx.size(0) == tokens && idx.size(2) >= 1, op, ": ", name, " must be (T=", tokens,
                ", 1, K >= 1), got ", idx.sizes());
  if (idx.size(1) != 1) {
    throw_not_supported(op, ": not supported: ", name, " with ", idx.size(1), " KV heads (shape ", idx.sizes(),
                        "); only 1");
  }
  AAR_CHECK_ARG(idx.device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", idx.device());
}

sig::SasResult sas_core(const char* op, bool quant, AAR_SPARSE_ATTN_SHAREDKV_PARAMS) {
  // ---- modes and scalars
  if (layout_kv != "PA_ND") {
    throw_not_supported(op, ": not supported by the CPU twin: layout_kv=\"", layout_kv,
                        "\" (only \"PA_ND\", the paged caches)");
  }
  const bool tnd = layout_q == "TND";
  if (!tnd && layout_q != "BSND") {
    throw_not_supported(op, ": not supported by the CPU twin: layout_q=\"", layout_q, "\" (only \"TND\" and \"BSND\")");
  }
  reject_int(op, ori_mask_mode, 4, "ori_mask_mode");
  reject_int(op, cmp_mask_mode, 3, "cmp_mask_mode");
  reject_tensor(op, seqused_q, "seqused_q");
  AAR_CHECK_ARG(std::isfinite(softmax_scale) && softmax_scale > 0, op, ": softmax_scale must be finite and > 0, got ",
                softmax_scale, " (DSV4 passes head_dim^-0.5)");
  AAR_CHECK_ARG(ori_win_left >= 0, op, ": ori_win_left must be >= 0, got ", ori_win_left);
  AAR_CHECK_ARG(ori_win_right >= 0, op, ": ori_win_right must be >= 0, got ", ori_win_right);

  // ---- q and lengths
  const auto dt = q.scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt), op, ": q must be float32/float16/bfloat16, got ", dt);
  AAR_CHECK_ARG(q.device().is_cpu(), op, ": the CPU twin needs q on the CPU, got ", q.device());
  AAR_CHECK_ARG(q.dim() == (tnd ? 3 : 4), op, ": q must be ", tnd ? "(T, N, D) for layout_q \"TND\"" :
                "(B, S, N, D) for layout_q \"BSND\"", ", got ", q.sizes());
  const int64_t n = q.size(-2), d = q.size(-1);
  AAR_CHECK_ARG(n >= 1 && d >= 1, op, ": q must have N >= 1 heads and D >= 1, got ", q.sizes());
  if (!given(seqused_kv)) throw_invalid(op, ": seqused_kv is required (the per-request KV lengths S_b)");
  const std::vector<int64_t> kv_len = read_i32_1d(op, *seqused_kv, "seqused_kv");
  const int64_t batch = static_cast<int64_t>(kv_len.size());
  AAR_CHECK_ARG(batch >= 1, op, ": seqused_kv is empty (at least one request)");
  std::vector<int64_t> q_start(batch), q_len(batch);
  int64_t tokens = 0;
  if (tnd) {
    tokens = q.size(0);
    if (!given(cu_seqlens_q)) throw_invalid(op, ": cu_seqlens_q is required for layout_q \"TND\" (B + 1 entries)");
    const std::vector<int64_t> cu = read_i32_1d(op, *cu_seqlens_q, "cu_seqlens_q");
    AAR_CHECK_ARG(static_cast<int64_t>(cu.size()) == batch + 1, op, ": cu_seqlens_q must have B + 1 = ", batch + 1,
                  " entries (seqused_kv has ", batch, "), got ", cu.size());
    AAR_CHECK_ARG(cu[0] == 0, op, ": cu_seqlens_q[0] must be 0, got ", cu[0]);
    for (int64_t b = 0; b < batch; ++b) {
      AAR_CHECK_ARG(cu[b + 1] >= cu[b], op, ": cu_seqlens_q must be non-decreasing; cu_seqlens_q[", b + 1, "]=",
                    cu[b + 1], " after ", cu[b]);
      q_start[b] = cu[b];
      q_len[b] = cu[b + 1] - cu[b];
    }
    AAR_CHECK_ARG(cu[batch] == tokens, op, ": cu_seqlens_q's last entry (", cu[batch], ") must equal q's T (",
                  tokens, ")");
  } else {
    if (given(cu_seqlens_q)) {
      throw_invalid(op, ": cu_seqlens_q is for layout_q \"TND\"; with \"BSND\" every request has q.size(1)=",
                    q.size(1), " query rows (pass None)");
    }
    AAR_CHECK_ARG(q.size(0) == batch, op, ": q's batch dim (", q.size(0), ") must equal seqused_kv's length (",
                  batch, ")");
    tokens = batch * q.size(1);
    for (int64_t b = 0; b < batch; ++b) {
      q_start[b] = b * q.size(1);
      q_len[b] = q.size(1);
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    AAR_CHECK_ARG(kv_len[b] >= q_len[b], op, ": seqused_kv[", b, "]=", kv_len[b],
                  " is smaller than request ", b, "'s query count ", q_len[b], " (seq_len >= query_len)");
  }
  check_unread_lengths(op, cu_seqlens_ori_kv, "cu_seqlens_ori_kv");
  check_unread_lengths(op, cu_seqlens_cmp_kv, "cu_seqlens_cmp_kv");
  if (given(metadata)) {
    AAR_CHECK_ARG(metadata->scalar_type() == at::kInt && metadata->numel() == 1024, op,
                  ": metadata must be the (1024,) int32 blob of npu_sparse_attn_sharedkv_metadata, got ",
                  metadata->scalar_type(), " ", metadata->sizes());
  }
  at::Tensor sink;
  if (given(sinks)) {
    AAR_CHECK_ARG(sinks->scalar_type() == at::kFloat && sinks->dim() == 1 && sinks->size(0) == n, op,
                  ": sinks must be float32 (N=", n, "), got ", sinks->scalar_type(), " ", sinks->sizes());
    AAR_CHECK_ARG(sinks->device().is_cpu(), op, ": the CPU twin needs sinks on the CPU, got ", sinks->device());
    sink = sinks->contiguous();
  }

  // ---- caches, tables, indices
  const bool has_ori = given(ori_kv), has_cmp = given(cmp_kv);
  AAR_CHECK_ARG(has_ori || has_cmp, op, ": neither ori_kv nor cmp_kv is given (no keys to attend over)");
  Paged ori, cmp;
  if (has_ori) {
    ori = check_cache(op, *ori_kv, "ori_kv", d, dt, quant);
    if (given(ori_block_table)) attach_table(op, ori, *ori_block_table, "ori_block_table", batch);
    if (given(ori_sparse_indices)) {
      check_indices(op, *ori_sparse_indices, "ori_sparse_indices", tokens);
    } else if (!given(ori_block_table)) {
      throw_invalid(op, ": ori_block_table is required with ori_kv (layout_kv \"PA_ND\"), unless ",
                    "ori_sparse_indices gives physical slots");
    }
  } else {
    AAR_CHECK_ARG(!given(ori_block_table) && !given(ori_sparse_indices), op, ": ",
                  given(ori_block_table) ? "ori_block_table" : "ori_sparse_indices", " is given without ori_kv");
  }
  if (has_cmp) {
    AAR_CHECK_ARG(cmp_ratio >= 2, op, ": cmp_ratio must be >= 2 with cmp_kv (DSV4: 4 or 128), got ", cmp_ratio);
    cmp = check_cache(op, *cmp_kv, "cmp_kv", d, dt, quant);
    if (!given(cmp_block_table)) throw_invalid(op, ": cmp_block_table is required with cmp_kv");
    attach_table(op, cmp, *cmp_block_table, "cmp_block_table", batch);
    if (given(cmp_sparse_indices)) check_indices(op, *cmp_sparse_indices, "cmp_sparse_indices", tokens);
  } else {
    AAR_CHECK_ARG(!given(cmp_block_table) && !given(cmp_sparse_indices), op, ": ",
                  given(cmp_block_table) ? "cmp_block_table" : "cmp_sparse_indices", " is given without cmp_kv");
    AAR_CHECK_ARG(cmp_ratio == 0 || cmp_ratio == 1, op, ": cmp_ratio=", cmp_ratio,
                  " without cmp_kv (0 or 1 for an uncompressed layer)");
  }

  // ---- pass 1: every row's key set, checked before any arithmetic
  KeyRows ok, ck;
  at::Tensor ori_idx, cmp_idx;
  if (has_ori && given(ori_sparse_indices)) ori_idx = ori_sparse_indices->contiguous();
  if (has_cmp && given(cmp_sparse_indices)) cmp_idx = cmp_sparse_indices->contiguous();
  std::vector<int64_t> row_of(tokens, -1), req_of(tokens, -1);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < q_len[b]; ++i) {
      req_of[q_start[b] + i] = b;
      row_of[q_start[b] + i] = i;
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t b = req_of[t], s = kv_len[b];
    const int64_t p = s - q_len[b] + row_of[t];
    if (has_ori && ori_idx.defined()) {
      const int64_t k = ori_idx.size(2);
      const int32_t* row = ori_idx.data_ptr<int32_t>() + t * k;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t slot = row[j];
        if (slot == -1) continue;
        AAR_CHECK_ARG(slot >= 0 && slot < ori.nb * ori.bs, op, ": ori_sparse_indices[", t, ", 0, ", j, "]=", slot,
                      " is not -1 and not a physical slot in [0, num_blocks * block_size = ", ori.nb * ori.bs, ")");
        ok.blk.push_back(slot / ori.bs);
        ok.off.push_back(slot % ori.bs);
      }
    } else if (has_ori) {
      const int64_t lo = std::max<int64_t>(0, p - ori_win_left);
      const int64_t hi = std::min<int64_t>(s - 1, p > std::numeric_limits<int64_t>::max() - ori_win_right
                                                      ? std::numeric_limits<int64_t>::max()
                                                      : p + ori_win_right);
      for (int64_t pos = lo; pos <= hi; ++pos) locate(op, ori, b, pos, ok.blk, ok.off);
    }
    ok.close_row();
    if (has_cmp) {
      const int64_t limit = (p + 1) / cmp_ratio;
      if (cmp_idx.defined()) {
        const int64_t k = cmp_idx.size(2);
        const int32_t* row = cmp_idx.data_ptr<int32_t>() + t * k;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t c = row[j];
          if (c == -1 || c >= limit) continue;
          AAR_CHECK_ARG(c >= 0, op, ": cmp_sparse_indices[", t, ", 0, ", j, "]=", c,
                        " is negative and not -1");
          locate(op, cmp, b, c, ck.blk, ck.off);
        }
      } else {
        for (int64_t c = 0; c < limit; ++c) locate(op, cmp, b, c, ck.blk, ck.off);
      }
    }
    ck.close_row();
  }

  // ---- pass 2: attention in fp32
  const at::Tensor qf = q.reshape({tokens, n, d}).to(at::kFloat);
  at::Tensor out = at::zeros({tokens, n, d}, at::kFloat);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor lse = at::full({tokens, n}, neg_inf, at::kFloat);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<at::Tensor> parts;
    if (ok.start[t + 1] > ok.start[t]) parts.push_back(gather(ori, ok, t));
    if (ck.start[t + 1] > ck.start[t]) parts.push_back(gather(cmp, ck, t));
    if (parts.empty()) {
      if (sink.defined()) lse[t].copy_(sink);  // the denominator is e^sink alone; the output stays 0
      continue;
    }
    const at::Tensor keys = parts.size() == 1 ? parts[0] : at::cat(parts, 0);  // (M, D), V = K
    const at::Tensor logits = at::matmul(qf[t], keys.t()).mul_(softmax_scale);  // (N, M)
    at::Tensor m = std::get<0>(logits.max(1));                                  // (N)
    if (sink.defined()) m = at::maximum(m, sink);
    const at::Tensor e = (logits - m.unsqueeze(1)).exp_();
    at::Tensor den = e.sum(1);
    if (sink.defined()) den.add_((sink - m).exp_());
    out[t].copy_(at::matmul(e, keys).div_(den.unsqueeze(1)));
    lse[t].copy_(m + den.log());
  }
  std::vector<int64_t> lse_shape(q.sizes().begin(), q.sizes().end() - 1);
  return {out.view(q.sizes()).to(dt),
          return_softmax_lse ? lse.view(lse_shape) : at::empty({0}, at::kFloat)};
}

sig::SasResult sparse_attn_sharedkv(AAR_SPARSE_ATTN_SHAREDKV_PARAMS) {
  return sas_core(kSparseAttnSharedkvOp, false, AAR_SPARSE_ATTN_SHAREDKV_ARGS);
}

// A5: kv_quant_mode 1 (MXFP8 rows), tile_size 64, rope_head_dim 64, q 512 wide, only.
sig::SasResult kv_quant_sparse_attn_sharedkv(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_PARAMS) {
  const char* op = kKvqOp;
  reject_int(op, kv_quant_mode, 1, "kv_quant_mode");
  reject_int(op, tile_size, kQuantTile, "tile_size");
  reject_int(op, rope_head_dim, kQuantRope, "rope_head_dim");
  AAR_CHECK_ARG(q.dim() >= 1 && q.size(-1) == kQuantNope + kQuantRope, op, ": q must be ", kQuantNope + kQuantRope,
                " wide (448 nope + 64 rope) for the 640-byte rows, got ", q.sizes());
  return sas_core(op, true, AAR_SPARSE_ATTN_SHAREDKV_ARGS);
}

at::Tensor metadata_core(const char* op, int64_t magic, std::initializer_list<int64_t> extra,
                         AAR_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS) {
  AAR_CHECK_ARG(num_heads_q >= 1, op, ": num_heads_q must be >= 1, got ", num_heads_q);
  reject_int(op, num_heads_kv, 1, "num_heads_kv");
  AAR_CHECK_ARG(head_dim >= 1, op, ": head_dim must be >= 1, got ", head_dim);
  AAR_CHECK_ARG(batch_size >= 0, op, ": batch_size must be >= 0, got ", batch_size);
  AAR_CHECK_ARG(max_seqlen_q >= 0, op, ": max_seqlen_q must be >= 0, got ", max_seqlen_q);
  AAR_CHECK_ARG(max_seqlen_kv >= 0, op, ": max_seqlen_kv must be >= 0, got ", max_seqlen_kv);
  AAR_CHECK_ARG(ori_topk >= 0, op, ": ori_topk must be >= 0, got ", ori_topk);
  AAR_CHECK_ARG(cmp_topk >= 0, op, ": cmp_topk must be >= 0, got ", cmp_topk);
  AAR_CHECK_ARG(cmp_ratio >= 1, op, ": cmp_ratio must be >= 1 (1, 4 or 128 in DSV4), got ", cmp_ratio);
  AAR_CHECK_ARG(!has_cmp_kv || cmp_ratio >= 2, op, ": cmp_ratio=", cmp_ratio, " with has_cmp_kv (needs >= 2)");
  AAR_CHECK_ARG(has_ori_kv || has_cmp_kv, op, ": has_ori_kv and has_cmp_kv are both false");
  reject_int(op, ori_mask_mode, 4, "ori_mask_mode");
  reject_int(op, cmp_mask_mode, 3, "cmp_mask_mode");
  AAR_CHECK_ARG(ori_win_left >= 0, op, ": ori_win_left must be >= 0, got ", ori_win_left);
  AAR_CHECK_ARG(ori_win_right >= 0, op, ": ori_win_right must be >= 0, got ", ori_win_right);
  const bool tnd = layout_q == "TND";
  if (!tnd && layout_q != "BSND") {
    throw_not_supported(op, ": not supported: layout_q=\"", layout_q, "\" (only \"TND\" and \"BSND\")");
  }
  if (layout_kv != "PA_ND") throw_not_supported(op, ": not supported: layout_kv=\"", layout_kv, "\" (only \"PA_ND\")");
  reject_tensor(op, seqused_q, "seqused_q");
  int64_t total_q = -1, total_kv = -1;
  if (given(cu_seqlens_q)) {
    const std::vector<int64_t> cu = read_i32_1d(op, *cu_seqlens_q, "cu_seqlens_q");
    AAR_CHECK_ARG(static_cast<int64_t>(cu.size()) == batch_size + 1, op, ": cu_seqlens_q must have batch_size + 1 = ",
                  batch_size + 1, " entries, got ", cu.size());
    for (size_t i = 1; i < cu.size(); ++i) {
      AAR_CHECK_ARG(cu[i] >= cu[i - 1] && cu[0] == 0, op, ": cu_seqlens_q must start at 0 and be non-decreasing, got ",
                    *cu_seqlens_q);
    }
    total_q = cu.back();
  }
  if (given(seqused_kv)) {
    const std::vector<int64_t> s = read_i32_1d(op, *seqused_kv, "seqused_kv");
    AAR_CHECK_ARG(static_cast<int64_t>(s.size()) == batch_size, op, ": seqused_kv must have batch_size = ",
                  batch_size, " entries, got ", s.size());
    total_kv = 0;
    for (size_t b = 0; b < s.size(); ++b) {
      AAR_CHECK_ARG(s[b] >= 0, op, ": seqused_kv[", b, "]=", s[b], " is negative");
      total_kv += s[b];
    }
  }
  check_unread_lengths(op, cu_seqlens_ori_kv, "cu_seqlens_ori_kv");
  check_unread_lengths(op, cu_seqlens_cmp_kv, "cu_seqlens_cmp_kv");
  std::vector<int64_t> fields = {magic, 1, num_heads_q, num_heads_kv, head_dim, batch_size, max_seqlen_q,
                            max_seqlen_kv, ori_topk, cmp_topk, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left,
                            ori_win_right, tnd ? 0 : 1, has_ori_kv ? 1 : 0, has_cmp_kv ? 1 : 0, total_q, total_kv};
  fields.insert(fields.end(), extra.begin(), extra.end());
  at::Tensor blob = at::zeros({1024}, at::kInt);
  int32_t* w = blob.data_ptr<int32_t>();
  for (size_t i = 0; i < fields.size(); ++i) {
    AAR_CHECK_ARG(fields[i] >= std::numeric_limits<int32_t>::min() && fields[i] <= std::numeric_limits<int32_t>::max(),
                  op, ": a scalar argument does not fit int32 (metadata field ", i, " = ", fields[i], ")");
    w[i] = static_cast<int32_t>(fields[i]);
  }
  return blob;
}

at::Tensor sparse_attn_sharedkv_metadata(AAR_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS) {
  return metadata_core(kSparseAttnSharedkvMetadataOp, 0x5341534D, {}, AAR_SPARSE_ATTN_SHAREDKV_METADATA_ARGS);
}

at::Tensor kv_quant_sparse_attn_sharedkv_metadata(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS) {
  reject_int(kKvqMdOp, kv_quant_mode, 1, "kv_quant_mode");
  reject_int(kKvqMdOp, tile_size, kQuantTile, "tile_size");
  reject_int(kKvqMdOp, rope_head_dim, kQuantRope, "rope_head_dim");
  return metadata_core(kKvqMdOp, 0x53415351, {kv_quant_mode, tile_size, rope_head_dim},
                       AAR_SPARSE_ATTN_SHAREDKV_METADATA_ARGS);
}

}  // namespace

sig::SasResult shared_kv_attention(const char* op, AAR_SPARSE_ATTN_SHAREDKV_PARAMS) {
  return sas_core(op, false, AAR_SPARSE_ATTN_SHAREDKV_ARGS);
}

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_sparse_attn_sharedkv", TORCH_FN(aar::ops::cpu::sparse_attn_sharedkv));
  m.impl("npu_kv_quant_sparse_attn_sharedkv", TORCH_FN(aar::ops::cpu::kv_quant_sparse_attn_sharedkv));
  m.impl("npu_sparse_attn_sharedkv_metadata", TORCH_FN(aar::ops::cpu::sparse_attn_sharedkv_metadata));
  m.impl("npu_kv_quant_sparse_attn_sharedkv_metadata",
         TORCH_FN(aar::ops::cpu::kv_quant_sparse_attn_sharedkv_metadata));
}

// The metadata operators may be called with no tensor at all (every length
// tensor is optional): the dispatcher then runs the CompositeExplicitAutograd
// kernel (the same function).
TORCH_LIBRARY_IMPL(ascend_cpu_va, CompositeExplicitAutograd, m) {
  m.impl("npu_sparse_attn_sharedkv_metadata", TORCH_FN(aar::ops::cpu::sparse_attn_sharedkv_metadata));
  m.impl("npu_kv_quant_sparse_attn_sharedkv_metadata",
         TORCH_FN(aar::ops::cpu::kv_quant_sparse_attn_sharedkv_metadata));
}
