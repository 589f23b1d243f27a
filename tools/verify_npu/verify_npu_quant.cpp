// verify-npu rows of the quantisation operators (npu_dynamic_quant, npu_rms_norm_dynamic_quant, npu_quantize
// on its own and with npu_quant_matmul of the W8A8 MLA linears, the DSV4 MX-fp8
// o_proj: npu_dynamic_mx_quant + npu_transpose_quant_batchmatmul) and of the
// GQA paths not covered by the FIA rows (_npu_paged_attention,
// npu_fusion_attention). Conventions: verify_npu_cases.h.
#include <ATen/ATen.h>

#include <sstream>

#include "ascend_attn_rt/ops/fusion_attention.h"
#include "ascend_attn_rt/ops/mx_quant.h"
#include "ascend_attn_rt/ops/paged_attention.h"
#include "ascend_attn_rt/ops/quant.h"
#include "verify_npu_cases.h"

namespace aar::verify::detail {

namespace {

Case dynamic_quant(bool fp8) {
  return Case{"npu_dynamic_quant",
              fp8 ? "A5 indexer: x (tk=6,8,128) bfloat16, dst_type=float8_e4m3fn, quant_mode=pertoken"
                  : "x (tk=6,8,128) bfloat16 (3-D: per (token, head) rows), dst_type=None (int8), quant_mode=pertoken, "
                    "with an all-zero row",
              fp8 ? "scale = amax / 448 per row, q = x / scale in e4m3 (compared dequantised)"
                  : "scale = amax / 127 per row, q = round(x / scale) half to even, an all-zero row gives scale 0 "
                    "(compared dequantised)",
              fp8 ? 7e-2 : 1e-2, [fp8](const Side& s) {
                at::manual_seed(80);
                at::Tensor x = rnd({6, 8, 128}, at::kBFloat16, 3.0);
                x[2][5].zero_();
                ops::DynamicQuantArgs a;
                a.input = s.to(x);
                if (fp8) a.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
                auto [q, scale] = ops::dynamic_quant(a, s.pv);
                const at::Tensor sc = scale.cpu();
                return Outputs{q.cpu().to(at::kFloat) * sc.unsqueeze(-1), sc};
              }};
}

// vllm-ascend's npu_rms_norm_dynamic_quant: the W8A8-dynamic DSA prolog's qr quantisation (the
// layers without an indexer of their own), compared dequantised.
Case rms_norm_dynamic_quant() {
  return Case{"npu_rms_norm_dynamic_quant",
              "DSV4 qr: x (tk=6,64) bfloat16 (qa rows, one all-zero), gamma (64) bfloat16, epsilon=1e-6, "
              "no smooth_scale / beta",
              "y = rmsnorm(x) * gamma in fp32, not rounded to bf16 before its per-row int8 quantisation "
              "(scale = amax / 127, half to even)",
              1e-2, [](const Side& s) {
                at::manual_seed(81);
                at::Tensor x = rnd({6, 64}, at::kBFloat16, 3.0);
                x[4].zero_();
                ops::RmsNormDynamicQuantArgs a;
                a.x = s.to(x);
                a.gamma = s.to(rnd({64}, at::kBFloat16, 1.0));
                const ops::W8A8DynamicInput r = ops::rms_norm_dynamic_quant(a, s.pv);
                const at::Tensor sc = r.scale.cpu();
                return Outputs{r.q.cpu().to(at::kFloat) * sc.unsqueeze(-1), sc};
              }};
}

// npu_quantize on its own (the W8A8-static activation quantisation), so a disagreement is
// named here and not only through the linear it feeds: both the per-tensor scale expanded per
// channel (what vllm-ascend passes) and truly per-channel scales and offsets, with values that
// saturate at both ends.
Case quantize(bool per_channel) {
  return Case{"npu_quantize",
              per_channel ? "x (T=5,256) bfloat16 with saturating values, scales (256) and zero_points (256) "
                            "bfloat16, one value per channel, dtype=QInt8, axis=-1, div_mode=False"
                          : "W8A8-static activation: x (T=5,256) bfloat16, scales = 1/input_scale and zero_points = "
                            "input_offset expanded to (256) bfloat16, dtype=QInt8, axis=-1, div_mode=False",
              "div_mode=False multiplies: y = saturate_int8(rint(x * scales + zero_points)), in fp32, half to even; "
              "compared as integers, one step allowed (tol x (1 + 127) = 1) where fp32 rounding of x * scales "
              "lands on a tie",
              1.0 / 128, [per_channel](const Side& s) {
                at::manual_seed(per_channel ? 87 : 86);
                const at::Tensor x = rnd({5, 256}, at::kBFloat16, per_channel ? 6.0 : 3.0);
                const at::Tensor inv = per_channel ? (at::rand({256}) * 60 + 5).to(at::kBFloat16)
                                                   : at::full({256}, 1.0 / 0.03).to(at::kBFloat16);
                const at::Tensor off = per_channel ? at::randint(-20, 20, {256}).to(at::kBFloat16)
                                                   : at::full({256}, 3.0).to(at::kBFloat16);
                const at::Tensor q = ops::quantize(s.to(x), s.to(inv), s.to(off), static_cast<int64_t>(at::kQInt8),
                                                   -1, /*div_mode=*/false, s.pv);
                return Outputs{q.cpu().to(at::kFloat)};
              }};
}

Case w8a8_linear(bool dynamic) {
  return Case{"npu_quant_matmul",
              dynamic ? "W8A8-dynamic MLA linear: npu_dynamic_quant(x (T=5,256) bfloat16) -> x1 int8 + pertoken_scale, "
                        "x2 (256,96) int8, scale (96) fp32, output_dtype=bfloat16"
                      : "W8A8-static MLA linear: npu_quantize(x (T=5,256) bfloat16, 1/input_scale, input_offset, "
                        "QInt8, axis=-1, div_mode=False) -> x1, x2 (256,96) int8, int32 bias, scale (96), "
                        "output_dtype=bfloat16",
              dynamic ? "y = (x1 @ x2) * scale * pertoken_scale[row]"
                      : "npu_quantize with div_mode=False multiplies: x_q = rint(x * scales + zero_points); the int32 "
                        "bias is in accumulator units",
              2e-2, [dynamic](const Side& s) {
                at::manual_seed(81);
                const at::Tensor x = s.to(rnd({5, 256}, at::kBFloat16));
                ops::QuantMatmulArgs a;
                a.x2 = s.to(at::randint(-100, 100, {256, 96}, at::kChar));
                a.scale = s.to(at::rand({96}) * 1e-3 + 1e-4);
                a.output_dtype = static_cast<int64_t>(at::kBFloat16);
                if (dynamic) {
                  ops::DynamicQuantArgs q;
                  q.input = x;
                  auto [xq, sc] = ops::dynamic_quant(q, s.pv);
                  a.x1 = xq;
                  a.pertoken_scale = sc;
                } else {
                  const at::Tensor inv = s.to(at::full({256}, 1.0 / 0.03).to(at::kBFloat16));
                  const at::Tensor off = s.to(at::full({256}, 3.0).to(at::kBFloat16));
                  a.x1 = ops::quantize(x, inv, off, static_cast<int64_t>(at::kQInt8), -1, /*div_mode=*/false, s.pv);
                  a.bias = s.to(at::randint(-3000, 3000, {96}, at::kInt));
                }
                return on_cpu({ops::quant_matmul(a, s.pv)});
              }};
}

Case dynamic_mx_quant() {
  return Case{"npu_dynamic_mx_quant",
              "DSV4 A5 o_proj input: o (tk=6,G=2,k=256) bfloat16, axis=-1 dst_type=float8_e4m3fn block_size=32 "
              "scale_alg=0 round_mode=rint",
              "OCP MX: scale 2^(floor(log2(amax)) - 8) per 32 values, e8m0 bytes paired (.., k/64, 2); y = RNE(x / "
              "scale) saturated to 448 (compared byte for byte)",
              0.0, [](const Side& s) {
                at::manual_seed(82);
                ops::DynamicMxQuantArgs a;
                a.input = s.to(rnd({6, 2, 256}, at::kBFloat16, 4.0));
                a.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
                auto [y, scale] = ops::dynamic_mx_quant(a, s.pv);
                return Outputs{y.cpu().to(at::kFloat), scale.cpu().view(at::kByte).to(at::kInt)};
              }};
}

Case transpose_quant_bmm() {
  return Case{"npu_transpose_quant_batchmatmul",
              "DSV4 A5 MX-fp8 o_proj: x1 (tk=6,G=2,k=256) float8_e4m3fn + x1_scale (tk,G,k/64,2) e8m0, x2 (G,k,n=64) "
              "+ x2_scale (G,k/64,n,2), perm_x1=(1,0,2) perm_x2=(0,1,2) perm_y=(1,0,2) group_sizes=(0,0,32) "
              "dtype=bfloat16",
              "out[m,b,n] = sum_k x1 s1[k/32] x2 s2[k/32] with scale block j at [.., j/2, j%2]", 1e-2,
              [](const Side& s) {
                at::manual_seed(83);
                static const int64_t p102[3] = {1, 0, 2}, p012[3] = {0, 1, 2}, groups[3] = {0, 0, 32};
                ops::TransposeQuantBatchMatmulArgs b;
                b.x1 = s.to(at::randn({6, 2, 256}).mul(8).to(at::kFloat8_e4m3fn));
                b.x2 = s.to(at::randn({2, 256, 64}).mul(8).to(at::kFloat8_e4m3fn));
                b.x1_scale = s.to(at::randint(118, 126, {6, 2, 4, 2}, at::kByte).view(at::kFloat8_e8m0fnu));
                b.x2_scale = s.to(at::randint(118, 126, {2, 4, 64, 2}, at::kByte).view(at::kFloat8_e8m0fnu));
                b.dtype = static_cast<int64_t>(at::kBFloat16);
                b.group_sizes = c10::IntArrayRef(groups, 3);
                b.perm_x1 = c10::IntArrayRef(p102, 3);
                b.perm_x2 = c10::IntArrayRef(p012, 3);
                b.perm_y = c10::IntArrayRef(p102, 3);
                return on_cpu({ops::transpose_quant_batchmatmul(b, s.pv)});
              }};
}

Case paged_attention() {
  return Case{"_npu_paged_attention",
              "GQA decode (ATB): query (B=3,N=8,D=128) float16, caches (nb,bs=128,Nkv=2,D), int32 block_table, host "
              "int32 context_lens (300,1,129)",
              "one query row per request over its context_lens keys, GQA head h reads kv head h / (N / Nkv)", 5e-3,
              [](const Side& s) {
                const Paged k = paged({300, 1, 129}, 128, {2, 128}, at::kHalf, 84);
                const at::Tensor v = like_pages(k, {2, 128}, at::kHalf, 85);
                at::manual_seed(86);
                ops::PagedAttentionArgs a;
                a.query = s.to(rnd({3, 8, 128}, at::kHalf));
                a.key_cache = s.to(k.cache);
                a.value_cache = s.to(v);
                a.num_kv_heads = 2;
                a.num_heads = 8;
                a.scale_value = 1.0 / std::sqrt(128.0);
                a.block_table = s.to(k.table);
                a.context_lens = i32({300, 1, 129});  // a host tensor on both sides
                at::Tensor out = s.to(at::zeros({3, 8, 128}, at::kHalf));
                ops::paged_attention(a, out, std::nullopt, s.pv);
                return on_cpu({out});
              }};
}

Case fusion_attention(bool causal) {
  return Case{"npu_fusion_attention",
              causal ? "GQA large-head fallback: TND float16 N=4 Nkv=2 D=256, cumulative actual_seq_qlen (3,8) over "
                       "gathered context ends (10,30), bool 2048 mask, sparse_mode=3 next_tockens=0"
                     : "GQA encoder: TND bfloat16 N=4 Nkv=4 D=64, actual_seq_qlen = actual_seq_kvlen = (3,8,9), "
                       "sparse_mode=0 (bidirectional)",
              causal ? "sparse_mode 3 with the bool triu mask is bottom-right causal when kv > q" 
                     : "sparse_mode 0 without a mask attends every key of the request",
              5e-3, [causal](const Side& s) {
                at::manual_seed(87);
                const std::vector<int64_t> q{3, 8, 9}, qc{3, 8}, kvc{10, 30};
                const int64_t N = 4, Nkv = causal ? 2 : 4, D = causal ? 256 : 64;
                const int64_t T = causal ? 8 : 9, S = causal ? 30 : 9;
                const at::ScalarType dt = causal ? at::kHalf : at::kBFloat16;
                ops::FusionAttentionArgs a;
                a.query = s.to(rnd({T, N, D}, dt));
                a.key = s.to(rnd({S, Nkv, D}, dt));
                a.value = s.to(rnd({S, Nkv, D}, dt));
                a.head_num = N;
                a.scale = 1.0 / std::sqrt(static_cast<double>(D));
                a.actual_seq_qlen = causal ? c10::IntArrayRef(qc) : c10::IntArrayRef(q);
                a.actual_seq_kvlen = causal ? c10::IntArrayRef(kvc) : c10::IntArrayRef(q);
                if (causal) {
                  a.atten_mask = s.to(at::triu(at::ones({2048, 2048}, at::kBool), 1));
                  a.next_tockens = 0;
                  a.sparse_mode = 3;
                }
                return on_cpu({ops::fusion_attention(a, s.pv)});
              }};
}

}  // namespace

void add_quant_cases(std::vector<Case>& c) {
  c.push_back(dynamic_quant(false));
  c.push_back(dynamic_quant(true));
  c.push_back(rms_norm_dynamic_quant());
  c.push_back(quantize(false));
  c.push_back(quantize(true));
  c.push_back(w8a8_linear(false));
  c.push_back(w8a8_linear(true));
  c.push_back(dynamic_mx_quant());
  c.push_back(transpose_quant_bmm());
  c.push_back(paged_attention());
  c.push_back(fusion_attention(false));
  c.push_back(fusion_attention(true));
}

}  // namespace aar::verify::detail
