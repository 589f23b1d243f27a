// CPU twin of vllm-ascend's _C_ascend::compressor (namespace ascend_cpu_va;
// docs/design/dsa.md §1.2, docs/design/ops.md §4.6): the DeepSeek-V4 KV compressor with its paged
// fp32 state cache. Semantics and the decisions where upstream is silent (which
// rope rows it reads, seqused vs start_pos, which state positions it reads and
// writes, precision): include/ascend_attn_rt/ops/dsa_compressor.h.
//
// Order of work: every check (shapes, dtypes, lengths, every state-table entry
// the step reads or writes, rope rows) precedes any write; the state reads
// happen before the state writes, so a rejected call leaves state_cache
// untouched and requests sharing a state block (a caller error) read the old
// contents.
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "dsa_common.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kCompressorOp = "_C_ascend::compressor";

struct Request {
  int64_t tok0 = 0, q = 0, start = 0;  // first token in x, query length, context (start_pos)
  int64_t c0 = 0, c1 = 0;              // completed groups [c0, c1)
  int64_t base = 0;                    // first raw position the groups read ((c0 - coff + 1) r)
};

// state row of raw position p of request b; checked.
struct StateLoc {
  int64_t block, row;
};

StateLoc locate(const dsa::IntTable& table, int64_t b, int64_t p, int64_t sbs, int64_t nb, const char* why) {
  const int64_t col = p / sbs;
  AAR_CHECK_ARG(col < table.cols, kCompressorOp, ": state_block_table has ", table.cols, " columns but request ", b,
                " needs column ", col, " (raw position ", p, " ", why, ", state block size ", sbs, ")");
  const int64_t blk = table.at(b, col);
  AAR_CHECK_ARG(blk >= 0 && blk < nb, kCompressorOp, ": state_block_table[", b, "][", col, "]=", blk,
                " is outside [0, num_blocks=", nb, ") (raw position ", p, " ", why, ")");
  return {blk, p % sbs};
}

at::Tensor compressor(AAR_COMPRESSOR_PARAMS) {
  // ---- arguments
  reject_int(kCompressorOp, rotary_mode, 2, "rotary_mode");
  reject_int(kCompressorOp, cache_mode, 1, "cache_mode");
  AAR_CHECK_ARG(coff == 1 || coff == 2, kCompressorOp, ": coff must be 1 or 2, got ", coff);
  AAR_CHECK_ARG(cmp_ratio >= 1, kCompressorOp, ": cmp_ratio must be >= 1, got ", cmp_ratio);
  AAR_CHECK_ARG(norm_eps >= 0, kCompressorOp, ": norm_eps must be >= 0, got ", norm_eps);
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&x, &wkv, &wgate, &state_cache, &ape,
                                                                       &norm_weight, &rope_sin, &rope_cos}) {
    AAR_CHECK_ARG(t->defined() && t->device().is_cpu(), kCompressorOp, ": the CPU twin needs CPU tensors, got one on ",
                  t->defined() ? t->device() : c10::Device(c10::kCPU));
  }
  AAR_CHECK_ARG(x.dim() == 2, kCompressorOp, ": x must be (T, H), got ", x.sizes());
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kCompressorOp, ": x must be float32/float16/bfloat16, got ", x.scalar_type());
  const int64_t T = x.size(0), H = x.size(1);
  AAR_CHECK_ARG(norm_weight.dim() == 1 && norm_weight.size(0) >= 1, kCompressorOp, ": norm_weight must be (D), got ",
                norm_weight.sizes());
  const int64_t D = norm_weight.size(0), W = coff * D, r = cmp_ratio;
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&wkv, "wkv"}, {&wgate, "wgate"}}) {
    AAR_CHECK_ARG(t->dim() == 2 && t->size(0) == W && t->size(1) == H, kCompressorOp, ": ", name, " must be (coff*D=", W,
                  ", H=", H, "), got ", t->sizes());
    AAR_CHECK_ARG(is_float_dtype(t->scalar_type()), kCompressorOp, ": ", name, " must be a float dtype, got ",
                  t->scalar_type());
  }
  AAR_CHECK_ARG(is_float_dtype(norm_weight.scalar_type()), kCompressorOp, ": norm_weight must be a float dtype, got ",
                norm_weight.scalar_type());
  AAR_CHECK_ARG(ape.dim() == 2 && ape.size(0) == r && ape.size(1) == W, kCompressorOp, ": ape must be (cmp_ratio=", r,
                ", coff*D=", W, "), got ", ape.sizes());
  AAR_CHECK_ARG(is_float_dtype(ape.scalar_type()), kCompressorOp, ": ape must be a float dtype, got ", ape.scalar_type());
  AAR_CHECK_ARG(state_cache.scalar_type() == at::kFloat, kCompressorOp, ": state_cache must be float32, got ",
                state_cache.scalar_type());
  AAR_CHECK_ARG(state_cache.dim() == 3 && state_cache.size(2) == 2 * W && state_cache.size(1) >= 1, kCompressorOp,
                ": state_cache must be (num_blocks, block_size, 2*coff*D=", 2 * W, "), got ", state_cache.sizes());
  const int64_t nb = state_cache.size(0), sbs = state_cache.size(1);
  AAR_CHECK_ARG(rope_head_dim >= 2 && rope_head_dim % 2 == 0 && rope_head_dim <= D, kCompressorOp,
                ": rope_head_dim must be even and in [2, D=", D, "], got ", rope_head_dim);
  const int64_t R = rope_head_dim;
  for (const auto& [t, name] :
       {std::pair<const at::Tensor*, const char*>{&rope_cos, "rope_cos"}, {&rope_sin, "rope_sin"}}) {
    AAR_CHECK_ARG(t->dim() >= 1 && t->size(-1) == R, kCompressorOp, ": ", name, " must end in rope_head_dim=", R,
                  " ((rows, R) or (rows, 1, 1, R)), got ", t->sizes());
    AAR_CHECK_ARG(is_float_dtype(t->scalar_type()), kCompressorOp, ": ", name, " must be a float dtype, got ",
                  t->scalar_type());
  }
  AAR_CHECK_ARG(rope_cos.numel() == rope_sin.numel(), kCompressorOp, ": rope_cos ", rope_cos.sizes(), " and rope_sin ",
                rope_sin.sizes(), " must hold the same rows");
  const int64_t rope_rows = rope_cos.numel() / R;

  // ---- lengths
  if (!cu_seqlens.has_value() || !cu_seqlens->defined()) {
    throw_not_supported(kCompressorOp, ": cu_seqlens=None is not supported (pass query_start_loc, (B + 1) int32)");
  }
  const std::vector<int64_t> cu = dsa::read_ints(kCompressorOp, *cu_seqlens, "cu_seqlens");
  const int64_t B = dsa::check_cu_seqlens(kCompressorOp, cu, T, "x.size(0) (T)");
  const bool has_start = start_pos.has_value() && start_pos->defined();
  const bool has_used = seqused.has_value() && seqused->defined();
  if (!has_start && !has_used) {
    throw_invalid(kCompressorOp, ": start_pos or seqused is required (start_pos = S - q, seqused = S per request)");
  }
  std::vector<int64_t> start(B);
  if (has_start) {
    start = dsa::read_ints(kCompressorOp, *start_pos, "start_pos");
    AAR_CHECK_ARG(static_cast<int64_t>(start.size()) == B, kCompressorOp, ": start_pos must have B=", B,
                  " entries (cu_seqlens has B + 1), got ", start.size());
  }
  if (has_used) {
    const std::vector<int64_t> used = dsa::read_ints(kCompressorOp, *seqused, "seqused");
    AAR_CHECK_ARG(static_cast<int64_t>(used.size()) == B, kCompressorOp, ": seqused must have B=", B,
                  " entries (cu_seqlens has B + 1), got ", used.size());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s = used[b] - (cu[b + 1] - cu[b]);
      AAR_CHECK_ARG(s >= 0, kCompressorOp, ": seqused[", b, "]=", used[b], " is below the request's query length ",
                    cu[b + 1] - cu[b]);
      AAR_CHECK_ARG(!has_start || start[b] == s, kCompressorOp, ": start_pos[", b, "]=", start[b], " disagrees with seqused[",
                    b, "] - q = ", s);
      start[b] = s;
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    AAR_CHECK_ARG(start[b] >= 0, kCompressorOp, ": start_pos[", b, "] must be >= 0, got ", start[b]);
  }
  if (!state_block_table.has_value() || !state_block_table->defined()) {
    throw_not_supported(kCompressorOp, ": state_block_table=None is not supported (cache_mode 1: the state cache is paged)");
  }
  const dsa::IntTable table = dsa::read_table(kCompressorOp, *state_block_table, "state_block_table");
  AAR_CHECK_ARG(table.rows >= B, kCompressorOp, ": state_block_table has ", table.rows, " rows, fewer than B=", B);

  // ---- plan: groups per request, every state location touched (checked here)
  std::vector<Request> reqs(B);
  std::vector<int64_t> rd_blk, rd_row, rd_dst, wr_blk, wr_row, wr_src;  // reads / writes of state rows
  int64_t emitted = 0;
  for (int64_t b = 0; b < B; ++b) {
    Request& q = reqs[b];
    q.tok0 = cu[b];
    q.q = cu[b + 1] - cu[b];
    q.start = start[b];
    q.c0 = q.start / r;
    q.c1 = (q.start + q.q) / r;
    q.base = (q.c0 - coff + 1) * r;
    emitted += q.c1 - q.c0;
    for (int64_t p = q.start; p < q.start + q.q; ++p) {
      const StateLoc l = locate(table, b, p, sbs, nb, "written by this step");
      wr_blk.push_back(l.block);
      wr_row.push_back(l.row);
      wr_src.push_back(q.tok0 + (p - q.start));
    }
  }
  const int64_t out_rows = std::min(T, T / r + B);
  AAR_CHECK_ARG(emitted <= out_rows, kCompressorOp, ": ", emitted, " compressed rows exceed min(T, T // r + B)=", out_rows);
  AAR_CHECK_ARG(rope_rows >= emitted, kCompressorOp, ": rope_cos / rope_sin hold ", rope_rows, " rows but the step emits ",
                emitted, " compressed rows (one rope row per emitted row, from compressor_metadata)");

  // Raw entries of earlier positions the completed groups need, gathered into
  // per-request buffers: request b's buffer covers positions [base, start + q).
  std::vector<int64_t> buf_off(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    const Request& q = reqs[b];
    const int64_t len = q.c1 > q.c0 ? q.start + q.q - q.base : 0;
    buf_off[b + 1] = buf_off[b] + len;
    if (len == 0) continue;
    for (int64_t p = std::max<int64_t>(q.base, 0); p < q.start; ++p) {
      const StateLoc l = locate(table, b, p, sbs, nb, "read by this step");
      rd_blk.push_back(l.block);
      rd_row.push_back(l.row);
      rd_dst.push_back(buf_off[b] + (p - q.base));
    }
  }

  const auto opts_d = at::TensorOptions().dtype(at::kDouble);
  const auto opts_l = at::TensorOptions().dtype(at::kLong);
  at::Tensor out = at::zeros({out_rows, D}, x.options());
  if (T == 0 || cu[B] == 0) return out;

  // ---- this step's raw entries [kv | score] (fp32, what the state holds)
  const int64_t used_tokens = cu[B];
  std::vector<int64_t> pos(used_tokens);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < reqs[b].q; ++i) pos[reqs[b].tok0 + i] = (reqs[b].start + i) % r;
  }
  const at::Tensor xd = x.narrow(0, 0, used_tokens).to(at::kDouble);
  const at::Tensor kv = at::matmul(xd, wkv.to(at::kDouble).t());
  const at::Tensor score =
      at::matmul(xd, wgate.to(at::kDouble).t()).add_(ape.to(at::kDouble).index_select(0, at::tensor(pos, opts_l)));
  const at::Tensor raw = at::cat({kv, score}, 1).to(at::kFloat);  // (used_tokens, 2W)

  // ---- read the earlier entries (before any write)
  const int64_t buf_rows = buf_off[B];
  at::Tensor buf = at::empty({buf_rows, 2 * W}, opts_d);
  if (buf_rows > 0) {
    buf.narrow(1, 0, W).zero_();  // positions < 0 (coff 2, group 0): kv 0, score -inf
    buf.narrow(1, W, W).fill_(-std::numeric_limits<double>::infinity());
    if (!rd_blk.empty()) {
      const at::Tensor rows = state_cache.index({at::tensor(rd_blk, opts_l), at::tensor(rd_row, opts_l)});
      buf.index_copy_(0, at::tensor(rd_dst, opts_l), rows.to(at::kDouble));
    }
    std::vector<int64_t> dst, src;
    for (int64_t b = 0; b < B; ++b) {
      const Request& q = reqs[b];
      if (q.c1 == q.c0) continue;
      for (int64_t i = 0; i < q.q; ++i) {
        dst.push_back(buf_off[b] + (q.start + i - q.base));
        src.push_back(q.tok0 + i);
      }
    }
    buf.index_copy_(0, at::tensor(dst, opts_l), raw.index_select(0, at::tensor(src, opts_l)).to(at::kDouble));
  }

  // ---- the completed groups
  const at::Tensor nw = norm_weight.to(at::kDouble);
  const at::Tensor cos_t = rope_cos.reshape({rope_rows, R}).to(at::kDouble);
  const at::Tensor sin_t = rope_sin.reshape({rope_rows, R}).to(at::kDouble);
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Request& q = reqs[b];
    const int64_t G = q.c1 - q.c0;
    if (G == 0) continue;
    const at::Tensor e = buf.narrow(0, buf_off[b], buf_off[b + 1] - buf_off[b]);
    // Entry k of group c (k < coff r) is raw position (c - coff + 1) r + k: its
    // buffer row is (c - c0) r + k. Entries from the previous group (k < r when
    // coff is 2) take columns [0, D), the current group's [D, 2D) (or [0, D) when coff is 1).
    at::Tensor kv_g = at::empty({G, coff * r, D}, opts_d), sc_g = at::empty({G, coff * r, D}, opts_d);
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t h = 0; h < coff; ++h) {
        const at::Tensor part = e.narrow(0, g * r + h * r, r);
        const int64_t col = (coff == 2 ? h : 0) * D;
        kv_g[g].narrow(0, h * r, r).copy_(part.narrow(1, col, D));
        sc_g[g].narrow(0, h * r, r).copy_(part.narrow(1, W + col, D));
      }
    }
    at::Tensor y = (at::softmax(sc_g, 1) * kv_g).sum(1);  // (G, D)
    y = y * at::rsqrt(y.pow(2).mean(-1, /*keepdim=*/true) + norm_eps) * nw;
    const at::Tensor c = cos_t.narrow(0, row, G), s = sin_t.narrow(0, row, G);
    const at::Tensor rp = y.narrow(1, D - R, R);
    const at::Tensor x0 = rp.slice(1, 0, R, 2), x1 = rp.slice(1, 1, R, 2);
    const at::Tensor y0 = x0 * c.slice(1, 0, R, 2) - x1 * s.slice(1, 0, R, 2);
    const at::Tensor y1 = x1 * c.slice(1, 1, R, 2) + x0 * s.slice(1, 1, R, 2);
    at::Tensor rot = at::stack({y0, y1}, -1).reshape({G, R});
    y = at::cat({y.narrow(1, 0, D - R), rot}, 1);
    out.narrow(0, row, G).copy_(y);
    row += G;
  }

  // ---- write this step's raw entries into the state (last: nothing above writes)
  if (!wr_blk.empty()) {
    state_cache.index_put_({at::tensor(wr_blk, opts_l), at::tensor(wr_row, opts_l)},
                           raw.index_select(0, at::tensor(wr_src, opts_l)));
  }
  return out;
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) { m.impl("compressor", TORCH_FN(aar::ops::cpu::compressor)); }
