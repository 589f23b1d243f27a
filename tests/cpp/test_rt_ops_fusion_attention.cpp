// npu_fusion_attention CPU twin (TND, modes 0 and 3) against the float64 reference.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fusion_attention.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

void check_fa(int mode, int64_t n, int64_t nkv, at::ScalarType dt, std::vector<int64_t> ql, std::vector<int64_t> kl) {
  at::manual_seed(8);
  std::vector<at::Tensor> qs, ks, vs;
  for (size_t b = 0; b < ql.size(); ++b) {
    qs.push_back(at::randn({ql[b], n, 32}).to(dt));
    ks.push_back(at::randn({kl[b], nkv, 32}).to(dt));
    vs.push_back(at::randn({kl[b], nkv, 32}).to(dt));
  }
  const std::vector<int64_t> qc = cumsum(ql), kc = cumsum(kl);
  ops::FusionAttentionArgs a;
  a.query = at::cat(qs);
  a.key = at::cat(ks);
  a.value = at::cat(vs);
  a.head_num = n;
  a.scale = 0.17;
  a.actual_seq_qlen = qc;
  a.actual_seq_kvlen = kc;
  a.sparse_mode = mode;
  if (mode == 3) {
    a.atten_mask = at::triu(at::ones({2048, 2048}, at::kBool), 1);
    a.next_tockens = 0;  // as the large-head fallback passes it; ignored in mode 3
  }
  const at::Tensor out = ops::fusion_attention(a);
  int64_t row = 0;
  for (size_t b = 0; b < ql.size(); ++b) {
    const RefResult r = ref_attention(qs[b], ks[b], vs[b], mode, kIntMax, kIntMax, 0.17);
    expect_close(out.narrow(0, row, ql[b]), r.out, tol_for(dt), "fa request " + std::to_string(b));
    row += ql[b];
  }
}

}  // namespace

TEST(RtOpsFusionAttention, Mode0FullPerSequenceFp32) { check_fa(0, 4, 4, at::kFloat, {3, 5, 1}, {3, 5, 1}); }
TEST(RtOpsFusionAttention, Mode0Gqa4Bf16) { check_fa(0, 8, 2, at::kBFloat16, {4, 6}, {4, 6}); }
TEST(RtOpsFusionAttention, Mode3CausalGqa8Fp32) { check_fa(3, 16, 2, at::kFloat, {7, 2}, {7, 9}); }
TEST(RtOpsFusionAttention, Mode3CausalFp16) { check_fa(3, 4, 1, at::kHalf, {5}, {5}); }

TEST(RtOpsFusionAttention, RejectsUnsupported) {
  ops::FusionAttentionArgs a;
  a.query = at::randn({4, 2, 8});
  a.key = at::randn({4, 2, 8});
  a.value = at::randn({4, 2, 8});
  a.head_num = 2;
  const std::vector<int64_t> l{4};
  a.actual_seq_qlen = l;
  a.actual_seq_kvlen = l;
  EXPECT_NO_THROW(ops::fusion_attention(a));
  auto b = a;
  b.input_layout = "BNSD";
  expect_throw_with<aar::NotSupported>([&] { ops::fusion_attention(b); }, "input_layout=\"BNSD\"");
  b = a;
  b.sparse_mode = 2;
  expect_throw_with<aar::NotSupported>([&] { ops::fusion_attention(b); }, "sparse_mode=2");
  b = a;
  b.sparse_mode = 3;
  expect_throw_with<aar::InvalidArgument>([&] { ops::fusion_attention(b); }, "atten_mask");
  b = a;
  b.pre_tockens = 5;
  expect_throw_with<aar::NotSupported>([&] { ops::fusion_attention(b); }, "pre_tockens=5");
  b = a;
  const std::vector<int64_t> bad{3};
  b.actual_seq_qlen = bad;
  expect_throw_with<aar::InvalidArgument>([&] { ops::fusion_attention(b); }, "actual_seq_qlen");
}
