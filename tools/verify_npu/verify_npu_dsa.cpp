// verify-npu rows of the DeepSeek-V4 (DSA) path (cpp/dsa): compressor and
// compressor_metadata, npu_sparse_attn_sharedkv (SWA, C4 top-k, C128) with its
// metadata, the A5 kv-quant form over 640-byte rows, sparse_flash_mla (+
// metadata), npu_vllm_quant_lightning_indexer (+ metadata), the epilogs,
// npu_scatter_nd_update_v2 and inplace_partial_rotary_mul. Conventions:
// verify_npu_cases.h.
#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "ascend_attn_rt/ops/dsa_compressor.h"
#include "ascend_attn_rt/ops/dsa_inplace_ops.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"
#include "verify_npu_cases.h"

namespace aar::verify::detail {

namespace {

constexpr at::ScalarType kBf = at::kBFloat16;

// ---- compressor / compressor_metadata
Case compressor(int64_t ratio) {
  const bool c4 = ratio == 4;
  std::ostringstream a;
  if (c4) {
    a << "C4 (indexer): D=128 coff=2 cmp_ratio=4 R=64, x (T=10,H=256) bfloat16, q_lens (1,9) start_pos (11,3)";
  } else {
    a << "C128: D=512 coff=1 cmp_ratio=128 R=64, x (T=41,H=256) bfloat16, q_lens (40,1) start_pos (100,255)";
  }
  a << ", fp32 paged state (nb,8|64,2*coff*D) with its block table, cu_seqlens + seqused + start_pos, rotary_mode=2 "
       "cache_mode=1";
  return Case{"compressor", a.str(),
              "output row j takes rope_cos / rope_sin row j (compressor_metadata's rows); positions before start_pos "
              "come from the state; every processed position is written to the state",
              2e-2, [=](const Side& s) {
                at::manual_seed(60 + ratio);
                const int64_t D = c4 ? 128 : 512, coff = c4 ? 2 : 1, H = 256, R = 64;
                const std::vector<int64_t> q = c4 ? std::vector<int64_t>{1, 9} : std::vector<int64_t>{40, 1};
                const std::vector<int64_t> start = c4 ? std::vector<int64_t>{11, 3} : std::vector<int64_t>{100, 255};
                const int64_t T = q[0] + q[1], rows = std::min<int64_t>(T, T / ratio + 2), sbs = c4 ? 8 : 64;
                std::vector<int64_t> seqused{start[0] + q[0], start[1] + q[1]};
                const Paged st = paged(seqused, sbs, {2 * coff * D}, at::kFloat, 61);
                at::manual_seed(62);
                ops::CompressorArgs c;
                c.x = s.to(rnd({T, H}, kBf));
                c.wkv = s.to(rnd({coff * D, H}, kBf, 0.06));
                c.wgate = s.to(rnd({coff * D, H}, kBf, 0.06));
                at::Tensor state = s.to(st.cache);
                c.state_cache = state;
                c.ape = s.to(at::randn({ratio, coff * D}));
                c.norm_weight = s.to((at::rand({D}) + 0.5).to(kBf));
                const at::Tensor ang = at::rand({rows, R / 2}) * 6;
                c.rope_cos = s.to(ang.cos().repeat_interleave(2, -1).to(kBf));
                c.rope_sin = s.to(ang.sin().repeat_interleave(2, -1).to(kBf));
                c.state_block_table = s.to(st.table);
                c.cu_seqlens = s.to(i32({0, q[0], T}));
                c.seqused = s.to(i32(seqused));
                c.start_pos = s.to(i32(start));
                c.rope_head_dim = R;
                c.cmp_ratio = ratio;
                c.coff = coff;
                c.norm_eps = 1e-6;
                const at::Tensor out = ops::compressor(c, s.pv);
                return on_cpu({out, state});
              }};
}

Case compressor_metadata(ops::CompressedSlotFormat fmt, bool out = false) {
  const bool flat = fmt == ops::CompressedSlotFormat::Flat;
  return Case{out ? "compressor_metadata_out" : "compressor_metadata",
              std::string("C4: rope tables (1024,64) fp32, q_lens (1,9,40) start_pos (11,3,500), kv_block_size=16, a -1 "
                          "table entry, num_compressed_tokens=15, slot_mapping_format=") +
                  (flat ? "1 (FLAT)" : "2 (BLOCK_OFFSET)") +
                  (out ? ", into the builder's (15,1,1,64) / slot buffers (its call)" : ""),
              "row c of request b takes the tables' row c*r and slot (table[b][c / bs], c % bs); an invalid row gets "
              "cos 1, sin 0 and slot -1 / (-1, bs-1)",
              0.0, [=](const Side& s) {
                at::manual_seed(63);
                const at::Tensor ang = at::rand({1024, 32}) * 6;
                ops::CompressorMetadataArgs m;
                m.rope_cos = s.to(ang.cos().repeat_interleave(2, -1));
                m.rope_sin = s.to(ang.sin().repeat_interleave(2, -1));
                m.cu_seqlens = s.to(i32({0, 1, 10, 50}));
                m.start_pos = s.to(i32({11, 3, 500}));
                at::Tensor table = at::randperm(30, at::kInt).narrow(0, 0, 27).view({3, 9}).contiguous();
                table[2][8] = -1;
                m.kv_block_table = s.to(table);
                m.kv_block_size = 16;
                m.slot_mapping_format = fmt;
                m.compress_ratio = 4;
                m.num_reqs_actual = 3;
                if (out) {
                  at::Tensor c = s.to(at::zeros({15, 1, 1, 64})), sn = s.to(at::zeros({15, 1, 1, 64}));
                  at::Tensor sl = s.to(flat ? at::zeros({15}, at::kInt) : at::zeros({15, 2}, at::kInt));
                  ops::compressor_metadata_out(m, c, sn, sl, s.pv);
                  return on_cpu({c, sn, sl});
                }
                auto [c, sn, sl] = ops::compressor_metadata(m, 15, s.pv);
                return on_cpu({c, sn, sl});
              }};
}

// ---- shared-KV sparse attention (one problem, three layer kinds)
struct SasProblem {
  std::vector<int64_t> q_lens{1, 5, 2}, S{300, 5, 140};
  int64_t N = 4, D = 512, bs = 64, cbs = 16, K = 16;
  int64_t T() const { return 8; }
};

// The 640-byte A5 rows [448 fp8 | 64 bf16 | 7 e8m0 | 57 pad] of random values.
at::Tensor fp8_rows(int64_t nb, int64_t bs) {
  at::Tensor rows = at::zeros({nb, bs, 1, 640}, at::kByte);
  rows.narrow(3, 0, 448).copy_(at::randn({nb, bs, 1, 448}).to(at::kFloat8_e4m3fn).view(at::kByte));
  rows.narrow(3, 448, 128).copy_(at::randn({nb, bs, 1, 64}).to(kBf).view(at::kByte));
  rows.narrow(3, 576, 7).copy_(at::randint(120, 130, {nb, bs, 1, 7}, at::kByte));
  return rows;
}

// ratio 1 (SWA), 4 (C4: top-k over the compressed rows), 128 (C128: all visible rows).
ops::SparseAttnSharedKvArgs sas_args(const Side& s, int64_t ratio, bool fp8, uint64_t seed) {
  const SasProblem p;
  const Paged ori = paged(p.S, p.bs, {1, p.D}, kBf, seed);
  at::manual_seed(seed + 1);
  ops::SparseAttnSharedKvArgs a;
  a.q = s.to(rnd({p.T(), p.N, p.D}, kBf));
  a.ori_kv = s.to(fp8 ? fp8_rows(ori.nb, p.bs) : ori.cache);
  a.ori_block_table = s.to(ori.table);
  a.cu_seqlens_q = s.to(i32(std::vector<int64_t>{0, 1, 6, 8}));
  a.seqused_kv = s.to(i32(p.S));
  a.sinks = s.to(at::randn({p.N}));
  a.softmax_scale = 1.0 / std::sqrt(512.0);
  a.cmp_ratio = ratio;
  a.ori_win_left = 127;
  a.ori_win_right = 0;
  if (ratio > 1) {
    std::vector<int64_t> rows;
    for (int64_t v : p.S) rows.push_back(v / ratio);
    const Paged cmp = paged(rows, p.cbs, {1, p.D}, kBf, seed + 2);
    a.cmp_kv = s.to(fp8 ? fp8_rows(cmp.nb, p.cbs) : cmp.cache);
    a.cmp_block_table = s.to(cmp.table);
    if (ratio == 4) {
      // Per row: K compressed-row ids among the visible ones (c < (pos + 1) / 4), then -1.
      at::manual_seed(seed + 3);
      at::Tensor idx = at::full({p.T(), 1, p.K}, -1, at::kInt);
      int64_t t = 0;
      for (size_t b = 0; b < p.S.size(); ++b) {
        for (int64_t i = 0; i < p.q_lens[b]; ++i, ++t) {
          const int64_t vis = (p.S[b] - p.q_lens[b] + i + 1) / 4, n = std::min(p.K, vis);
          if (n > 0) idx[t][0].narrow(0, 0, n).copy_(at::randperm(vis, at::kInt).narrow(0, 0, n));
        }
      }
      a.cmp_sparse_indices = s.to(idx);
    }
  }
  return a;
}

ops::SparseAttnSharedKvMetadataArgs sas_metadata_args(const ops::SparseAttnSharedKvArgs& a, int64_t ratio) {
  const SasProblem p;
  ops::SparseAttnSharedKvMetadataArgs m;
  m.num_heads_q = p.N;
  m.head_dim = p.D;
  m.cu_seqlens_q = a.cu_seqlens_q;
  m.seqused_kv = a.seqused_kv;
  m.batch_size = 3;
  m.max_seqlen_q = 5;
  m.max_seqlen_kv = 300;
  m.cmp_topk = ratio == 4 ? p.K : 0;
  m.cmp_ratio = std::max<int64_t>(ratio, 1);
  m.ori_win_left = 127;
  m.has_cmp_kv = ratio > 1;
  return m;
}

const char* kind(int64_t ratio) {
  return ratio == 1 ? "SWA (cmp_ratio=1)" : ratio == 4 ? "C4 (cmp_ratio=4, cmp_sparse_indices (T,1,16))"
                                                       : "C128 (cmp_ratio=128, every visible compressed row)";
}

const char* kSasAssumption =
    "window [p - ori_win_left, p] over ori_kv; compressed row c visible iff c < (p + 1) / cmp_ratio; sinks join the "
    "denominator only";

Case sharedkv(int64_t ratio, bool with_metadata) {
  std::ostringstream a;
  a << "_C_ascend " << kind(ratio) << ", TND q (T=8,N=4,D=512) bfloat16, PA_ND caches (nb,64|16,1,512), "
    << "ori_mask_mode=4 ori_win_left=127 cmp_mask_mode=3, sinks (N) fp32, S=(300,5,140) q=(1,5,2)";
  if (with_metadata) a << ", metadata from npu_sparse_attn_sharedkv_metadata on the same side";
  return Case{with_metadata ? "npu_sparse_attn_sharedkv_metadata" : "npu_sparse_attn_sharedkv", a.str(),
              with_metadata ? "the device's tiling blob drives the device kernel to the twin's answer" : kSasAssumption,
              5e-3, [=](const Side& s) {
                ops::SparseAttnSharedKvArgs a = sas_args(s, ratio, false, 64);
                if (with_metadata) a.metadata = ops::sparse_attn_sharedkv_metadata(sas_metadata_args(a, ratio), s.pv);
                return on_cpu({std::get<0>(ops::sparse_attn_sharedkv(a, s.pv))});
              }};
}

Case kv_quant_sharedkv(int64_t ratio, bool with_metadata) {
  std::ostringstream a;
  a << "A5 " << kind(ratio) << ", 640-byte fp8 rows [448 e4m3 | 64 bf16 | 7 e8m0 | pad] in (nb,64|16,1,640) uint8 "
    << "caches, kv_quant_mode=1 tile_size=64 rope_head_dim=64, q (T=8,N=4,512) bfloat16, sinks";
  if (with_metadata) a << ", metadata from npu_kv_quant_sparse_attn_sharedkv_metadata";
  return Case{with_metadata ? "npu_kv_quant_sparse_attn_sharedkv_metadata" : "npu_kv_quant_sparse_attn_sharedkv",
              a.str(),
              with_metadata ? "the device's tiling blob drives the device kernel to the twin's answer"
                            : "nope[d] = fp8[d] * 2^(e8m0[d / 64] - 127), the rope part bf16 as stored",
              5e-3, [=](const Side& s) {
                ops::KvQuantSparseAttnSharedKvArgs q;
                q.base = sas_args(s, ratio, true, 65);
                if (with_metadata) {
                  ops::KvQuantSparseAttnSharedKvMetadataArgs m;
                  m.base = sas_metadata_args(q.base, ratio);
                  q.base.metadata = ops::kv_quant_sparse_attn_sharedkv_metadata(m, s.pv);
                }
                return on_cpu({std::get<0>(ops::kv_quant_sparse_attn_sharedkv(q, s.pv))});
              }};
}

Case sparse_flash_mla(int64_t ratio, bool with_metadata) {
  std::ostringstream a;
  a << "cann_ops_transformer " << kind(ratio) << " through the sharedkv adapter: PA_BBND, seqused_ori_kv"
    << (ratio > 1 ? " + seqused_cmp_kv / cmp_residual_kv" : "") << ", topk_value_mode=1, bfloat16 D=512 sinks";
  if (with_metadata) a << ", metadata from sparse_flash_mla_metadata";
  return Case{with_metadata ? "sparse_flash_mla_metadata" : "sparse_flash_mla", a.str(),
              with_metadata ? "the device's tiling blob drives the device kernel to the twin's answer"
                            : "SparseFlashMla is sparse_attn_sharedkv with seqused_cmp_kv = S / r, cmp_residual_kv = S % r",
              5e-3, [=](const Side& s) {
                const ops::SparseAttnSharedKvArgs a = sas_args(s, ratio, false, 66);
                std::optional<ops::FlashMlaCmpLengthTensors> cmp;
                if (ratio > 1) cmp = ops::flash_mla_cmp_length_tensors(*a.seqused_kv, ratio);
                ops::SparseFlashMlaArgs f = ops::to_sparse_flash_mla_args(a, cmp);
                if (with_metadata) {
                  f.metadata = ops::sparse_flash_mla_metadata(
                      ops::to_sparse_flash_mla_metadata_args(sas_metadata_args(a, ratio), cmp), s.pv);
                }
                return on_cpu({std::get<0>(ops::sparse_flash_mla(f, s.pv))});
              }};
}

// ---- the DSV4 quantised indexer over compressed rows
Case vllm_qli(bool with_metadata) {
  std::ostringstream a;
  a << "_C_ascend A2/A3 C4: int8 query (T=8,8,128) per (token, head) float16 scales, int8 compressed-row key cache "
       "(nb,16,1,128) + float16 scales (nb,16,1), float16 weights, raw lengths S=(300,5,140), cmp_ratio=4 "
       "sparse_count=16 sparse_mode=3";
  if (with_metadata) a << ", metadata from npu_vllm_quant_lightning_indexer_metadata";
  return Case{with_metadata ? "npu_vllm_quant_lightning_indexer_metadata" : "npu_vllm_quant_lightning_indexer",
              a.str(),
              with_metadata ? "the device's tiling blob drives the device kernel to the twin's answer"
                            : "row i of request b sees compressed rows c < (S_b - q_b + i + 1) / cmp_ratio (compared "
                              "as sets per row)",
              0.0, [=](const Side& s) {
                const SasProblem p;
                std::vector<int64_t> rows;
                for (int64_t v : p.S) rows.push_back(v / 4);
                const Paged k = paged(rows, 16, {1, 128}, at::kFloat, 67);
                at::manual_seed(68);
                ops::VllmQuantLightningIndexerArgs a;
                ops::LightningIndexerArgs& b = a.quant.base;
                b.query = s.to(at::randint(-127, 128, {p.T(), 8, 128}, at::kChar));
                b.key = s.to(at::randint(-127, 128, {k.nb, 16, 1, 128}, at::kChar));
                b.weights = s.to(at::randn({p.T(), 8}).to(at::kHalf));
                b.actual_seq_lengths_query = s.to(i32(cumsum(p.q_lens)));
                b.actual_seq_lengths_key = s.to(i32(p.S));
                b.block_table = s.to(k.table);
                b.sparse_count = p.K;
                b.sparse_mode = 3;
                a.quant.query_dequant_scale = s.to((at::rand({p.T(), 8}) * 1e-2 + 1e-3).to(at::kHalf));
                a.quant.key_dequant_scale = s.to((at::rand({k.nb, 16, 1}) * 1e-2 + 1e-3).to(at::kHalf));
                a.cmp_ratio = 4;
                if (with_metadata) {
                  ops::VllmQuantLightningIndexerMetadataArgs m;
                  m.num_heads_q = 8;
                  m.head_dim = 128;
                  m.actual_seq_lengths_query = b.actual_seq_lengths_query;
                  m.actual_seq_lengths_key = b.actual_seq_lengths_key;
                  m.batch_size = 3;
                  m.max_seqlen_q = 5;
                  m.max_seqlen_k = 300;
                  m.sparse_count = p.K;
                  m.cmp_ratio = 4;
                  a.metadata = ops::vllm_quant_lightning_indexer_metadata(m, s.pv);
                }
                return Outputs{sorted_rows(std::get<0>(ops::vllm_quant_lightning_indexer(a, s.pv)))};
              }};
}

// ---- the A5 cache-write epilogs
Case kv_compress_epilog() {
  return Case{"kv_compress_epilog",
              "A5: x (N=6,512) bfloat16 into (rows=20,1,640) uint8 rows, flat slots with -1, quant_group_size=64 "
              "quant_mode=2 (MXFP8) round_scale_flag=True layout=1",
              "per 64-value group e = ceil(log2(amax / 448)), scale byte e + 127, fp8 = RNE(x / 2^e); rope bytes "
              "copied (compared byte for byte)",
              0.0, [](const Side& s) {
                at::manual_seed(69);
                ops::KvCompressEpilogArgs k;
                at::Tensor cache = s.to(at::zeros({20, 1, 640}, at::kByte));
                k.kv_compress_cache = cache;
                k.x = s.to(rnd({6, 512}, kBf, 3.0));
                k.slot_mapping = s.to(i32({4, -1, 0, 19, 7, 8}));
                ops::kv_compress_epilog(k, s.pv);
                return on_cpu({cache});
              }};
}

Case indexer_compress_epilog() {
  return Case{"indexer_compress_epilog_v2",
              "A5: x (N=6,128) bfloat16 into the indexer cache's byte view (nb=3,bs=16,1,132), flat slots with -1, "
              "layout=2",
              "a page holds bs rows of Di fp8 bytes then bs fp32 scales; scale = amax / 448 (compared dequantised)",
              7e-2, [](const Side& s) {
                at::manual_seed(70);
                ops::IndexerCompressEpilogArgs e;
                at::Tensor cache = s.to(at::zeros({3, 16, 1, 132}, at::kByte));
                e.indexer_compress_cache = cache;
                e.x = s.to(rnd({6, 128}, kBf, 2.0));
                e.slot_mapping = s.to(i32({5, 17, -1, 0, 47, 20}));
                ops::indexer_compress_epilog_v2(e, s.pv);
                const at::Tensor page = cache.cpu().view({3, -1});
                const at::Tensor k = page.narrow(1, 0, 16 * 128).contiguous().view(at::kFloat8_e4m3fn).to(at::kFloat);
                const at::Tensor sc = page.narrow(1, 16 * 128, 16 * 4).contiguous().view(at::kFloat).view({3, 16, 1});
                return Outputs{k.view({3, 16, 128}) * sc, sc};
              }};
}

Case scatter_v2() {
  return Case{"npu_scatter_nd_update_v2",
              "A2/A3 SWA / compressed cache write: (block, offset) int32 indices (N=5,2) with the (-1, bs-1) skip row, "
              "updates (N,512) bfloat16 into (nb=4,bs=16,1,512)",
              "a row with a negative component is skipped; updates may leave out var's size-1 dims", 0.0,
              [](const Side& s) {
                at::manual_seed(71);
                at::Tensor cache = s.to(rnd({4, 16, 1, 512}, kBf));
                ops::scatter_nd_update_v2(cache, s.to(i32({1, 3, -1, 15, 0, 0, 3, 15, 2, 7}).view({5, 2})),
                                          s.to(rnd({5, 512}, kBf)), s.pv);
                return on_cpu({cache});
              }};
}

Case partial_rope(bool inverse) {
  return Case{"inplace_partial_rotary_mul",
              std::string("DSV4 q / o: x (n=6,N=4,512) bfloat16, partial_slice=[448,512], rotary_mode=interleave, "
                          "fp32 tables (n,1,64) repeat-interleaved") +
                  (inverse ? ", r2 = -sin (the output de-rotation)" : ""),
              "only x[..., 448:512] changes: y = x r1 + rot(x) r2 on pairs (-x1, x0), fp32 maths", 1e-2,
              [=](const Side& s) {
                at::manual_seed(72);
                const at::Tensor ang = at::rand({6, 1, 32}) * 6;
                at::Tensor x = s.to(rnd({6, 4, 512}, kBf));
                const at::Tensor sn = ang.sin().repeat_interleave(2, -1);
                ops::inplace_partial_rotary_mul(x, s.to(ang.cos().repeat_interleave(2, -1)), s.to(inverse ? -sn : sn),
                                                "interleave", {448, 512}, s.pv);
                return on_cpu({x});
              }};
}

}  // namespace

void add_dsa_cases(std::vector<Case>& c) {
  c.push_back(compressor(4));
  c.push_back(compressor(128));
  c.push_back(compressor_metadata(ops::CompressedSlotFormat::BlockOffset));
  c.push_back(compressor_metadata(ops::CompressedSlotFormat::Flat));
  c.push_back(compressor_metadata(ops::CompressedSlotFormat::BlockOffset, true));
  c.push_back(sharedkv(1, false));
  c.push_back(sharedkv(4, false));
  c.push_back(sharedkv(128, false));
  c.push_back(sharedkv(4, true));
  c.push_back(kv_quant_sharedkv(4, false));
  c.push_back(kv_quant_sharedkv(1, true));
  c.push_back(sparse_flash_mla(4, false));
  c.push_back(sparse_flash_mla(128, true));
  c.push_back(vllm_qli(false));
  c.push_back(vllm_qli(true));
  c.push_back(kv_compress_epilog());
  c.push_back(indexer_compress_epilog());
  c.push_back(scatter_v2());
  c.push_back(partial_rope(false));
  c.push_back(partial_rope(true));
}

}  // namespace aar::verify::detail
