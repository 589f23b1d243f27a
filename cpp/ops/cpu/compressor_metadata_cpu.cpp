// CPU twins of vllm-ascend's _C_ascend::compressor_metadata and
// compressor_metadata_out (namespace ascend_cpu_va; docs/design/dsa.md §2.2, §4.1, docs/design/ops.md §4.6):
// the rope rows and cache slots of the compressed rows a step emits, bit-exact
// to the pseudocode of docs/design/ops.md §4.6 (see include/ascend_attn_rt/ops/dsa_compressor.h).
// The kernel's own rules are kept where they are lenient: a request with
// start_pos < 0 or no tokens emits nothing; a row whose table column is beyond
// the table, whose rope position is beyond the tables, or whose block is
// negative is an invalid row (cos 1, sin 0, slot (-1, bs - 1) / -1), not an
// error. Malformed arguments (dtypes, shapes, cu_seqlens, formats) are errors.
// The _out form checks its three buffers before writing any of them.
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "dsa_common.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kCompressorMetadataOp = "_C_ascend::compressor_metadata";

struct Result {
  at::Tensor cos, sin, slots;  // (rows, 1, 1, R), (rows, 1, 1, R), (rows, 2) / (rows) int32
};

Result compute(const char* op, AAR_COMPRESSOR_METADATA_HEAD_PARAMS, int64_t rows, int64_t num_reqs_actual) {
  for (const at::Tensor* t : {&rope_cos, &rope_sin, &cu_seqlens, &start_pos, &kv_block_table}) {
    AAR_CHECK_ARG(t->defined() && t->device().is_cpu(), op, ": the CPU twin needs CPU tensors");
  }
  AAR_CHECK_ARG(rope_cos.dim() == 2 && rope_cos.size(1) >= 1, op, ": rope_cos must be the full table (max_pos, R), got ",
                rope_cos.sizes());
  AAR_CHECK_ARG(rope_sin.sizes() == rope_cos.sizes(), op, ": rope_sin must have rope_cos's shape ", rope_cos.sizes(),
                ", got ", rope_sin.sizes());
  AAR_CHECK_ARG(is_float_dtype(rope_cos.scalar_type()) && rope_sin.scalar_type() == rope_cos.scalar_type(), op,
                ": rope_cos / rope_sin must share a float dtype, got ", rope_cos.scalar_type(), " and ",
                rope_sin.scalar_type());
  AAR_CHECK_ARG(kv_block_size >= 1, op, ": kv_block_size must be >= 1, got ", kv_block_size);
  AAR_CHECK_ARG(slot_mapping_format == 1 || slot_mapping_format == 2, op, ": slot_mapping_format must be 1 (FLAT) or ",
                "2 (BLOCK_OFFSET), got ", slot_mapping_format);
  AAR_CHECK_ARG(compress_ratio >= 1, op, ": compress_ratio must be >= 1, got ", compress_ratio);
  AAR_CHECK_ARG(rows >= 0, op, ": num_compressed_tokens must be >= 0, got ", rows);
  const std::vector<int64_t> cu = dsa::read_ints(op, cu_seqlens, "cu_seqlens");
  const int64_t B = dsa::check_cu_seqlens(op, cu, -1, "");
  const std::vector<int64_t> start = dsa::read_ints(op, start_pos, "start_pos");
  AAR_CHECK_ARG(static_cast<int64_t>(start.size()) == B, op, ": start_pos must have B=", B,
                " entries (cu_seqlens has B + 1), got ", start.size());
  AAR_CHECK_ARG(num_reqs_actual >= 0 && num_reqs_actual <= B, op, ": num_reqs_actual must be in [0, B=", B,
                "], got ", num_reqs_actual);
  const dsa::IntTable table = dsa::read_table(op, kv_block_table, "kv_block_table");
  AAR_CHECK_ARG(table.rows >= num_reqs_actual, op, ": kv_block_table has ", table.rows,
                " rows, fewer than num_reqs_actual=", num_reqs_actual);

  const int64_t R = rope_cos.size(1), max_pos = rope_cos.size(0), r = compress_ratio, bs = kv_block_size;
  const bool flat = slot_mapping_format == 1;
  // (request, compressed row id) of every emitted row, truncated to `rows`.
  std::vector<int64_t> req_of, c_of;
  for (int64_t b = 0; b < num_reqs_actual && static_cast<int64_t>(req_of.size()) < rows; ++b) {
    const int64_t q = cu[b + 1] - cu[b], s = start[b];
    if (s < 0 || q <= 0) continue;
    for (int64_t c = s / r; c < (s + q) / r && static_cast<int64_t>(req_of.size()) < rows; ++c) {
      req_of.push_back(b);
      c_of.push_back(c);
    }
  }
  std::vector<int64_t> src(rows, -1), slot(flat ? rows : 2 * rows);
  for (int64_t i = 0; i < rows; ++i) {
    bool valid = false;
    int64_t blk = -1, c = 0;
    if (i < static_cast<int64_t>(req_of.size())) {
      c = c_of[i];
      const int64_t col = c / bs, rope_pos = c * r;
      if (col < table.cols && rope_pos < max_pos) {
        blk = table.at(req_of[i], col);
        valid = blk >= 0;
      }
    }
    if (valid) {
      src[i] = c * r;
      if (flat) {
        const int64_t v = blk * bs + c % bs;
        AAR_CHECK_ARG(v <= std::numeric_limits<int32_t>::max(), op, ": slot ", v, " of compressed row ", c,
                      " (kv_block_table block ", blk, ") does not fit the int32 slot_mapping");
        slot[i] = v;
      } else {
        slot[2 * i] = blk;
        slot[2 * i + 1] = c % bs;
      }
    } else if (flat) {
      slot[i] = -1;
    } else {
      slot[2 * i] = -1;
      slot[2 * i + 1] = bs - 1;
    }
  }
  Result res;
  const auto opts = rope_cos.options();
  res.cos = at::ones({rows, 1, 1, R}, opts);
  res.sin = at::zeros({rows, 1, 1, R}, opts);
  std::vector<int64_t> dst, from;
  for (int64_t i = 0; i < rows; ++i) {
    if (src[i] >= 0) {
      dst.push_back(i);
      from.push_back(src[i]);
    }
  }
  if (!dst.empty()) {
    const auto lo = at::TensorOptions().dtype(at::kLong);
    const at::Tensor d = at::tensor(dst, lo), f = at::tensor(from, lo);
    res.cos.view({rows, R}).index_copy_(0, d, rope_cos.index_select(0, f));
    res.sin.view({rows, R}).index_copy_(0, d, rope_sin.index_select(0, f));
  }
  res.slots = at::tensor(slot, at::TensorOptions().dtype(at::kLong)).to(at::kInt);
  res.slots = flat ? res.slots.view({rows}) : res.slots.view({rows, 2});
  return res;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> compressor_metadata(AAR_COMPRESSOR_METADATA_PARAMS) {
  Result r = compute(kCompressorMetadataOp, rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size,
                     slot_mapping_format, compress_ratio, num_compressed_tokens, num_reqs_actual);
  return {r.cos, r.sin, r.slots};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> compressor_metadata_out(AAR_COMPRESSOR_METADATA_OUT_PARAMS) {
  constexpr const char* op = "_C_ascend::compressor_metadata_out";
  AAR_CHECK_ARG(rope_cos.defined() && rope_cos.dim() == 2, op, ": rope_cos must be the full table (max_pos, R), got ",
                rope_cos.sizes());
  const int64_t R = rope_cos.size(1);
  AAR_CHECK_ARG(compress_cos.dim() >= 1, op, ": compress_cos must be (rows, 1, 1, R), got ", compress_cos.sizes());
  const int64_t rows = compress_cos.size(0);
  for (const auto& [t, name] :
       {std::pair<const at::Tensor*, const char*>{&compress_cos, "compress_cos"}, {&compress_sin, "compress_sin"}}) {
    AAR_CHECK_ARG(t->device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t->device());
    AAR_CHECK_ARG(t->dim() >= 1 && t->size(0) == rows && t->numel() == rows * R, op, ": ", name,
                  " must be (rows=", rows, ", 1, 1, R=", R, "), got ", t->sizes());
    AAR_CHECK_ARG(t->scalar_type() == rope_cos.scalar_type(), op, ": ", name, " must have rope_cos's dtype ",
                  rope_cos.scalar_type(), ", got ", t->scalar_type());
  }
  AAR_CHECK_ARG(slot_mapping.device().is_cpu(), op, ": the CPU twin needs slot_mapping on the CPU");
  AAR_CHECK_ARG(slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong, op,
                ": slot_mapping must be int32 (or int64), got ", slot_mapping.scalar_type());
  const bool flat = slot_mapping_format == 1;
  AAR_CHECK_ARG(slot_mapping_format != 2 ||
                    (slot_mapping.dim() == 2 && slot_mapping.size(0) == rows && slot_mapping.size(1) == 2),
                op, ": slot_mapping must be (rows=", rows, ", 2) for slot_mapping_format 2 (BLOCK_OFFSET), got ",
                slot_mapping.sizes());
  AAR_CHECK_ARG(!flat || (slot_mapping.dim() == 1 && slot_mapping.size(0) == rows), op,
                ": slot_mapping must be (rows=", rows, ") for slot_mapping_format 1 (FLAT), got ",
                slot_mapping.sizes());
  const Result r = compute(op, rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size,
                           slot_mapping_format, compress_ratio, rows, num_reqs_actual);
  compress_cos.copy_(r.cos.reshape(compress_cos.sizes()));
  compress_sin.copy_(r.sin.reshape(compress_sin.sizes()));
  slot_mapping.copy_(r.slots);
  return {compress_cos, compress_sin, slot_mapping};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("compressor_metadata", TORCH_FN(aar::ops::cpu::compressor_metadata));
  m.impl("compressor_metadata_out", TORCH_FN(aar::ops::cpu::compressor_metadata_out));
}
