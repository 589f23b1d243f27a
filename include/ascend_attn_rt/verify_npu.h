// verify-npu (issue 14 part 5): every operator call the runtime makes, with
// the argument combinations the backends use, run once through torch_npu
// (provider npu, on the NPU) and once through the CPU twin on copies of the
// same inputs; a table of max errors per call with pass/fail against each
// row's stated tolerance, and the open assumption each row settles.
//
// One table (tools/verify_npu/verify_npu.cpp) serves both front ends: the C++
// executable `aar_verify_npu` and `python -m ascend_attn_rt verify-npu` call
// run_verify_cli with their argument lists.
//
// Options: --stand-in twin        the CPU twin stands in for the NPU (every row
//                                 must pass: a self-check of the harness)
//          --stand-in perturbed:OP the twin stands in, and the stand-in's
//                                 output of operator OP (e.g.
//                                 npu_fused_infer_attention_score) is perturbed:
//                                 its rows must fail, naming OP and arguments
//          --only SUBSTRING       rows whose operator or arguments contain it
//          --list                 print the rows without running them
// Without an NPU (no PrivateUse1 device: torch_npu not loaded, or no device)
// and without --stand-in, it refuses with exit code 2. Exit code 1: a row
// failed; 0: every row passed.
//
// The rows (77; `--list` prints them; FIA v1 / v2 and compressor_metadata
// also through the .out overloads the backends call eagerly) and the open assumptions they settle:
//  GQA / C8 / FA3 / CP: FIA sparse_mode 3 is bottom-right causal; the
//    sliding-window pre_tokens convention (pre_tokens = W - 1 keeps W keys);
//    FIA LSE layout; v2 sinks in the denominator only; the antiquant offset
//    sign (k = (k8 + offset) * scale); attention_update skips -inf partials;
//    the two paged cache writes (slot s -> block s / bs, row s % bs);
//    _npu_paged_attention's GQA head mapping; npu_fusion_attention modes 0 / 3.
//  MLA family: MLAPO's NZ weight staging and pre-permuted rope rows;
//    mla_prolog_v3 (bf16, W8A8, the SFA C8 packed row) and v2 (the int8
//    latent's multiplying scale, per-(token, head) query quantisation);
//    kv_rmsnorm_rope_cache (interleave in, half-split out, PA / PA_NZ, int8
//    latent with c_kv_scale); interleave_rope; FIA v2 TND_NTD / BNSD_NBSD /
//    FA-quant (query_quant_mode 3) output layouts; FIA v1 latent LSE (DCP) and
//    the MLA TND prefill (rope tensors, concatenated form, context chunks);
//    transpose_batchmatmul's perms; batch_matmul_transpose;
//    gather_pa_kv_cache's seq_offset.
//  SFA: sparse_flash_attention's index scan (first -1 stops, entries past the
//    causal threshold skipped); the lightning indexers' score rule (both
//    libraries, int8 and fp8 forms: scales before the relu); the packed
//    656-byte row; dynamic_block_quant's tile scale; rotary_mul half /
//    interleave; scatter_nd_update_ skipping a negative slot; the Hadamard.
//  DSA: the compressor's rope-row and state conventions; compressor_metadata's
//    slots in both formats (invalid rows -1 / (-1, bs-1)); sharedkv window /
//    compressed-row visibility / sinks (SWA, C4, C128) and the fp8 640-byte
//    rows; SparseFlashMla = sharedkv with S / r, S % r; the DSV4 QLI's
//    compressed-row visibility; the tiling blobs of the four metadata
//    operators (checked by driving their kernel, never byte for byte);
//    kv_compress_epilog's scale exponent (ceil) and RNE; the indexer epilog's
//    page layout; scatter_nd_update_v2's skip row; partial rotary (and its
//    inverse with -sin).
//  Quantisation: dynamic_quant int8 / fp8 (zero rows: scale 0); npu_quantize
//    multiplies with div_mode=False; quant_matmul's bias units and per-token
//    scale; dynamic_mx_quant's OCP scale rule (byte for byte);
//    transpose_quant_batchmatmul's MX scale pairing.
// Comparison rules (quantised outputs dequantised, index sets sorted, opaque
// blobs through their kernel): tools/verify_npu/verify_npu_cases.h.
#pragma once

#include <string>
#include <vector>

namespace aar::verify {

struct Row {
  std::string op;          // operator name (torch_npu / vllm-ascend schema name)
  std::string args;        // the argument combination
  std::string assumption;  // the open assumption the row settles
  double max_err = 0, tol = 0;
  bool pass = false;
  std::string error;  // an exception on either side
};

// Rows as a table, one line per row, then a summary line.
std::string format_table(const std::vector<Row>& rows);
// True when a PrivateUse1 (NPU) device is present.
bool npu_available();
// The CLI: returns the exit code, writes the report to `out`.
int run_verify_cli(const std::vector<std::string>& args, std::string& out);

}  // namespace aar::verify
