// _npu_paged_attention CPU twin against the float64 reference.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/paged_attention.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

struct PaSetup {
  std::vector<at::Tensor> ks, vs;
  PagedKv p;
  ops::PagedAttentionArgs a;
};

PaSetup make_pa(int64_t n, int64_t nkv, int64_t d, int64_t bs, at::ScalarType dt, const std::vector<int64_t>& lens) {
  at::manual_seed(42);
  PaSetup s;
  for (int64_t l : lens) {
    s.ks.push_back(at::randn({l, nkv, d}).to(dt));
    s.vs.push_back(at::randn({l, nkv, d}).to(dt));
  }
  s.p = make_paged(s.ks, s.vs, bs, 17);
  s.a.query = at::randn({static_cast<int64_t>(lens.size()), n, d}).to(dt);
  s.a.key_cache = s.p.key_cache;
  s.a.value_cache = s.p.value_cache;
  s.a.num_kv_heads = nkv;
  s.a.num_heads = n;
  s.a.scale_value = 1.0 / std::sqrt(static_cast<double>(d));
  s.a.block_table = s.p.block_table;
  s.a.context_lens = at::tensor(std::vector<int32_t>(lens.begin(), lens.end()), at::kInt);
  return s;
}

void check_pa(int64_t n, int64_t nkv, int64_t bs, at::ScalarType dt, const std::vector<int64_t>& lens) {
  PaSetup s = make_pa(n, nkv, 64, bs, dt, lens);
  at::Tensor out = at::full_like(s.a.query, 3.0);
  const at::Tensor ws = ops::paged_attention_get_workspace(s.a, out);
  EXPECT_EQ(ws.scalar_type(), at::kByte);
  ops::paged_attention(s.a, out, ws);
  for (size_t b = 0; b < lens.size(); ++b) {
    const RefResult r = ref_attention(s.a.query.narrow(0, b, 1), s.ks[b], s.vs[b], 0, kIntMax, kIntMax,
                                      s.a.scale_value);
    expect_close(out.narrow(0, b, 1), r.out, tol_for(dt), "pa request " + std::to_string(b));
  }
}

}  // namespace

TEST(RtOpsPagedAttention, Gqa1Bs128Fp32) { check_pa(4, 4, 128, at::kFloat, {1, 130, 257}); }
TEST(RtOpsPagedAttention, Gqa4Bs16Bf16) { check_pa(8, 2, 16, at::kBFloat16, {17, 3, 64, 1}); }
TEST(RtOpsPagedAttention, Gqa8Bs128Fp16) { check_pa(16, 2, 128, at::kHalf, {5, 128}); }

TEST(RtOpsPagedAttention, ZeroContextGivesZeroOutput) {
  PaSetup s = make_pa(4, 4, 32, 16, at::kFloat, {3, 5});
  s.a.context_lens = at::tensor(std::vector<int32_t>{0, 5}, at::kInt);
  at::Tensor out = at::full_like(s.a.query, 3.0);
  ops::paged_attention(s.a, out, std::nullopt);
  EXPECT_TRUE(at::all(out[0] == 0).item<bool>());
}

TEST(RtOpsPagedAttention, RejectsBadInput) {
  PaSetup s = make_pa(8, 2, 32, 16, at::kFloat, {3, 20});
  at::Tensor out = at::zeros_like(s.a.query);
  {
    auto a = s.a;
    a.context_lens = at::tensor(std::vector<int32_t>{3, 1000}, at::kInt);
    expect_throw_with<aar::InvalidArgument>([&] { ops::paged_attention(a, out, std::nullopt); }, "context_lens[1]");
  }
  {
    auto a = s.a;
    a.block_table = s.a.block_table.clone();
    a.block_table[0][0] = -1;
    expect_throw_with<aar::InvalidArgument>([&] { ops::paged_attention(a, out, std::nullopt); }, "block_table[0, 0]");
  }
  {
    auto a = s.a;
    a.num_kv_heads = 3;
    expect_throw_with<aar::InvalidArgument>([&] { ops::paged_attention(a, out, std::nullopt); }, "num_kv_heads=3");
  }
  {
    at::Tensor bad_out = at::zeros({2, 8, 16});
    expect_throw_with<aar::InvalidArgument>([&] { ops::paged_attention(s.a, bad_out, std::nullopt); }, "out must");
  }
}
