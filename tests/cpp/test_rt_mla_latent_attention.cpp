// mla::LatentAttention through the C++ API (mla/latent_attention.h): a mixed
// step (a decode and a prefill, both with cached context) as an engine that
// projects itself runs it (cache write, absorbed decode + its own W_UV, the
// prefill with kv_b_proj), against a float64 reference written here; and a
// rejected cache write that leaves the buffer untouched. (The Python tests
// cover the batch kinds, dtypes and head paddings.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/latent_attention.h"

namespace {

constexpr int64_t H = 4, L = 16, P = 8, R = 8, V = 8, BS = 16;

// float64 un-absorbed attention of a request's last q_len tokens: q (q_len, H, P+R),
// c (s, L), kpe (s, R), w (H*(P+V), L) -> (q_len, H, V).
at::Tensor reference(const at::Tensor& q, const at::Tensor& c, const at::Tensor& kpe, const at::Tensor& w,
                     double scale) {
  const int64_t s = c.size(0), ql = q.size(0);
  const at::Tensor kv = at::matmul(c.to(at::kDouble), w.to(at::kDouble).t()).view({s, H, P + V});
  const at::Tensor qd = q.to(at::kDouble);
  at::Tensor out = at::zeros({ql, H, V}, at::kDouble);
  for (int64_t i = 0; i < ql; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t last = s - ql + i;  // keys j <= last
      std::vector<double> sc(last + 1);
      double mx = -INFINITY;
      for (int64_t j = 0; j <= last; ++j) {
        double d = 0;
        for (int64_t p = 0; p < P; ++p) d += qd[i][h][p].item<double>() * kv[j][h][p].item<double>();
        for (int64_t r = 0; r < R; ++r) d += qd[i][h][P + r].item<double>() * kpe[j][r].item<double>();
        sc[j] = d * scale;
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (double& x : sc) z += (x = std::exp(x - mx));
      for (int64_t j = 0; j <= last; ++j) out[i][h] += kv[j][h].narrow(0, P, V) * (sc[j] / z);
    }
  }
  return out;
}

aar::mla::LatentAttentionConfig config() {
  aar::mla::LatentAttentionConfig cfg;
  cfg.num_heads = H;
  cfg.kv_lora_rank = L;
  cfg.qk_nope_head_dim = P;
  cfg.qk_rope_head_dim = R;
  cfg.v_head_dim = V;
  return cfg;
}

}  // namespace

TEST(MlaLatentAttention, MixedStepAgainstFloat64Reference) {
  at::manual_seed(5);
  const std::vector<int32_t> seq_lens{21, 40}, q_lens{1, 9}, qsl{0, 1, 10};
  const int64_t nb = 8;
  const std::vector<int32_t> table{5, 2, 0, 7, 1, 3};  // 2 requests x 3 blocks
  at::Tensor kv_cache = at::randn({nb, BS, L + R});     // garbage where unused
  auto [nope, rope] = aar::mla::LatentAttention::split_kv_cache(kv_cache, L);
  ASSERT_EQ(nope.data_ptr(), kv_cache.data_ptr());
  std::vector<at::Tensor> c, kpe, q;
  for (size_t r = 0; r < 2; ++r) {
    c.push_back(at::randn({seq_lens[r], L}));
    kpe.push_back(at::randn({seq_lens[r], R}));
    q.push_back(at::randn({q_lens[r], H, P + R}));
    for (int32_t p = 0; p < seq_lens[r] - q_lens[r]; ++p) {  // the context, by plain indexing
      const int64_t blk = table[r * 3 + p / BS], off = p % BS;
      nope[blk][off][0].copy_(c[r][p]);
      rope[blk][off][0].copy_(kpe[r][p]);
    }
  }
  const at::Tensor w = at::randn({H * (P + V), L}) / std::sqrt(double(L));

  aar::mla::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 64;
  bc.max_blocks_per_req = 3;
  bc.block_size = BS;
  bc.num_blocks = nb;
  bc.cos_table = at::zeros({64, R});
  bc.sin_table = at::zeros({64, R});
  aar::mla::MetadataBuilder builder(bc);
  aar::mla::BuildInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq_lens;
  in.block_table = table;
  in.block_table_stride = 3;
  const aar::mla::Metadata& md = builder.build(in);
  ASSERT_EQ(md.num_decodes, 1);
  ASSERT_EQ(md.num_prefills, 1);

  aar::mla::LatentAttention attn(config());
  const double scale = 1.0 / std::sqrt(double(P + R));
  EXPECT_DOUBLE_EQ(attn.config().scale, scale);

  auto tail = [&](const std::vector<at::Tensor>& xs) {
    return at::cat({xs[0].narrow(0, seq_lens[0] - q_lens[0], q_lens[0]), xs[1].narrow(0, seq_lens[1] - q_lens[1], q_lens[1])});
  };
  const at::Tensor kv_c = tail(c), k_pe = tail(kpe), qs = at::cat(q);
  attn.write_kv(kv_c, k_pe.unsqueeze(1), md.slot_mapping.narrow(0, 0, md.num_actual_tokens), nope, rope);

  // Decode: the engine absorbs W_UK and applies W_UV itself.
  const at::Tensor wv = w.to(at::kDouble).view({H, P + V, L});
  const at::Tensor ql_nope = at::einsum("ihp,hpl->ihl", {qs.narrow(0, 0, 1).narrow(-1, 0, P).to(at::kDouble),
                                                         wv.narrow(1, 0, P)})
                                 .to(at::kFloat);
  at::Tensor lat = at::full({1, H, L}, 7.0);
  attn.forward_decode(ql_nope, qs.narrow(0, 0, 1).narrow(-1, P, R), nope, rope, &md, lat);
  const at::Tensor dec = at::einsum("ihl,hvl->ihv", {lat.to(at::kDouble), wv.narrow(1, P, V)});
  // Prefill into a row slice of a larger output.
  at::Tensor out = at::full({10, H * V}, 7.0);
  attn.forward_prefill(qs.narrow(0, 1, 9), kv_c.narrow(0, 1, 9), k_pe.narrow(0, 1, 9), nope, rope, &md,
                       out.narrow(0, 1, 9), w);
  EXPECT_TRUE(at::allclose(dec, reference(q[0], c[0], kpe[0], w, scale), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(out.narrow(0, 1, 9).view({9, H, V}).to(at::kDouble), reference(q[1], c[1], kpe[1], w, scale),
                           1e-4, 1e-5));
  EXPECT_TRUE(at::all(out[0] == 7.0).item<bool>()) << "forward_prefill wrote outside its rows";
}

TEST(MlaLatentAttention, RejectedWriteLeavesTheCacheUntouched) {
  at::Tensor kv_cache = at::randn({2, BS, L + R});
  auto [nope, rope] = aar::mla::LatentAttention::split_kv_cache(kv_cache, L);
  const aar::mla::LatentAttention attn(config());
  const at::Tensor before = kv_cache.clone();
  const at::Tensor slots = at::tensor(std::vector<int64_t>{1, 2 * BS});  // the second is past the cache
  EXPECT_THROW(attn.write_kv(at::randn({2, L}), at::randn({2, R}), slots, nope, rope), std::exception);
  EXPECT_TRUE(at::equal(kv_cache, before));
  try {
    attn.write_kv(at::randn({2, L + 1}), at::randn({2, R}), slots, nope, rope);
    ADD_FAILURE() << "a kv_c of the wrong width was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_c must have shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(at::equal(kv_cache, before));
}
