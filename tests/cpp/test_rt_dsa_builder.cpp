// The DSA builders on the step core (core/step.h): the step's counts with their
// one meaning under graph padding, StepInput fields the step builder does not
// read refused by name before anything is written, a group's block geometry
// (block_size taken from its kind or checked against it), and the views of the
// per-step packed staging regions when their offsets move between steps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/errors.h"

namespace {

using aar::dsa::DsaCacheKind;

aar::dsa::StepBuilderConfig step_config() {
  aar::dsa::StepBuilderConfig c;
  c.max_num_reqs = 8;
  c.max_num_tokens = 64;
  const at::Tensor ang = at::arange(1024 * 16, at::kFloat).view({1024, 16}) * 1e-3;
  c.cos_table = c.compress_cos_table = ang.cos();
  c.sin_table = c.compress_sin_table = ang.sin();
  c.model.head_dim = 32;
  c.model.window = 8;
  return c;
}

aar::dsa::GroupConfig group_config(DsaCacheKind kind) {
  aar::dsa::GroupConfig g;
  g.kind = kind;
  g.cache_block_size = 32;
  g.plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  g.max_blocks_per_req = 8;
  g.num_blocks = 64;
  return g;
}

struct Step {
  std::vector<int32_t> qsl, seq;
  int32_t nra = -1, num_input_tokens = 0;
  aar::dsa::StepInputs inputs() const {
    aar::dsa::StepInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.num_reqs_actual = nra;
    in.num_input_tokens = num_input_tokens;
    return in;
  }
};

TEST(DsaBuilder, CountsHaveTheCoreMeaningUnderGraphPadding) {
  aar::dsa::StepBuilder sb(step_config());
  // Two real requests (a decode, a prefill of 5 tokens), two padding requests
  // of one token each (seq_len 0, 2), and two more rows of graph padding.
  const Step s{{0, 1, 6, 7, 8}, {30, 12, 0, 2}, 2, 10};
  const aar::dsa::StepMetadata& m = sb.build(s.inputs());
  EXPECT_EQ(m.num_reqs, 2);
  EXPECT_EQ(m.num_kernel_reqs, 4);
  EXPECT_EQ(m.num_actual_tokens, 6);  // the real requests' tokens
  EXPECT_EQ(m.num_kernel_tokens, 8);  // query_start_loc[B]
  EXPECT_EQ(m.num_input_tokens, 10);
  EXPECT_EQ(m.num_decodes, 1);
  EXPECT_EQ(m.num_decode_tokens, 1);
  EXPECT_EQ(m.num_prefills, 1);
  EXPECT_EQ(m.num_prefill_tokens, 5);
  EXPECT_EQ(m.max_query_len, 5);
  EXPECT_EQ(m.max_seq_len, 30);
  // The kernels' values over all B requests.
  EXPECT_EQ(m.max_seqlen_q, 5);
  EXPECT_EQ(m.max_seqlen_kv, 30);
  EXPECT_EQ(m.plan.split.num_decodes + m.plan.split.num_prefills, 4);
  EXPECT_TRUE(m.has_prefill());
  EXPECT_EQ(m.query_start_loc.numel(), 5);
  EXPECT_EQ(m.seq_lens.numel(), 4);

  // Padding requests that are decodes of the kernels' batch are not decodes of the step.
  const Step d{{0, 1, 2, 3}, {40, 1, 1}, 1, 4};
  const aar::dsa::StepMetadata& md = sb.build_for_graph_capture(d.inputs(), aar::plan::AttentionState::DecodeOnly);
  EXPECT_EQ(md.num_reqs, 1);
  EXPECT_EQ(md.num_kernel_reqs, 3);
  EXPECT_EQ(md.num_decodes, 1);
  EXPECT_EQ(md.num_decode_tokens, 1);
  EXPECT_EQ(md.num_prefills + md.num_prefill_tokens, 0);
  EXPECT_EQ(md.plan.split.num_decodes, 3);
  EXPECT_EQ(md.num_actual_tokens, 1);
  EXPECT_EQ(md.num_kernel_tokens, 3);
  EXPECT_EQ(md.max_seq_len, 40);

  // The groups carry both request counts; their table has the B rows.
  aar::dsa::GroupBuilder gb(sb, group_config(DsaCacheKind::Swa));
  std::vector<int32_t> table(3 * 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(1 + i);
  aar::dsa::GroupInputs gi;
  gi.block_table = {table.data(), table.size()};
  gi.block_table_stride = 8;
  const aar::dsa::GroupMetadata& g = gb.build(md, gi);
  EXPECT_EQ(g.num_reqs, 1);
  EXPECT_EQ(g.num_kernel_reqs, 3);
  EXPECT_EQ(g.block_table.size(0), 3);
}

TEST(DsaBuilder, UnreadStepFieldsAreRefusedByNameBeforeAnyWrite) {
  aar::dsa::StepBuilder sb(step_config());
  const Step s{{0, 1, 3}, {10, 20}};
  const aar::dsa::StepMetadata& m = sb.build(s.inputs());
  const uint64_t generation = m.stamp.generation;
  const std::vector<int32_t> first = {m.query_start_loc_host.begin(), m.query_start_loc_host.end()};
  const std::vector<int32_t> table(2 * 4, 1);
  const std::vector<uint8_t> prefilling(2, 1);
  const std::vector<uint64_t> ids{7, 9};
  const Step other{{0, 2, 3}, {11, 21}};
  for (const char* field : {"block_table", "is_prefilling", "req_ids"}) {
    SCOPED_TRACE(field);
    aar::dsa::StepInputs in = other.inputs();
    if (std::string(field) == "block_table") {
      in.block_table = {table.data(), table.size()};
      in.block_table_stride = 4;
    } else if (std::string(field) == "is_prefilling") {
      in.is_prefilling = {prefilling.data(), prefilling.size()};
    } else {
      in.req_ids = {ids.data(), ids.size()};
    }
    try {
      sb.build(in);
      ADD_FAILURE() << "accepted " << field;
    } catch (const aar::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(field) + " was given"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("DSA StepBuilder"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(m.stamp.current());
    EXPECT_EQ(m.stamp.generation, generation);
    EXPECT_EQ(std::vector<int32_t>(m.query_start_loc_host.begin(), m.query_start_loc_host.end()), first);
  }
  // The capacities are the core's checks, by name.
  std::vector<int32_t> qsl(10), seq(9, 1);
  for (int i = 0; i < 10; ++i) qsl[i] = i;
  aar::dsa::StepInputs big;
  big.query_start_loc = {qsl.data(), qsl.size()};
  big.seq_lens = {seq.data(), seq.size()};
  try {
    sb.build(big);
    ADD_FAILURE() << "accepted 9 requests";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_num_reqs=8"), std::string::npos) << e.what();
  }
}

TEST(DsaBuilder, GroupBlockSizeIsTheKindsOrRefusedByName) {
  aar::dsa::StepBuilder sb(step_config());
  aar::dsa::GroupBuilder c4(sb, group_config(DsaCacheKind::C4Kv));
  EXPECT_EQ(c4.config().block_size, 4 * 32);  // 0 took the kind's (cache block size times the ratio)
  EXPECT_EQ(c4.block_size(), 4 * 32);
  aar::dsa::GroupConfig same = group_config(DsaCacheKind::C4Kv);
  same.block_size = 128;
  EXPECT_NO_THROW({ aar::dsa::GroupBuilder g(sb, same); });
  aar::dsa::GroupConfig other = group_config(DsaCacheKind::C4Kv);
  other.block_size = 32;
  try {
    aar::dsa::GroupBuilder g(sb, other);
    ADD_FAILURE() << "accepted block_size 32 for a C4 KV group";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block_size=32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("128"), std::string::npos) << e.what();
  }
  aar::dsa::GroupConfig none = group_config(DsaCacheKind::Swa);
  none.num_blocks = 0;
  EXPECT_THROW({ aar::dsa::GroupBuilder g(sb, none); }, aar::InvalidArgument);
}

TEST(DsaBuilder, PackedRegionViewsFollowTheirOffsets) {
  // The row arrays and RoPE rows are packed per step: at the same token count a
  // step of another batch size puts them elsewhere. Every view must show the
  // step's own values, and a repeated shape keeps its addresses.
  aar::dsa::StepBuilder sb(step_config());
  // 40 tokens in 8 requests or in one: the ratio-4 and ratio-128 lists have
  // 18 / 8 and 11 / 1 rows, so the ratio-1 arrays (40 rows) move.
  const Step a{{0, 5, 10, 15, 20, 25, 30, 35, 40}, {40, 7, 129, 5, 10, 20, 33, 64}};
  const Step b{{0, 40}, {131}};
  std::vector<const void*> first;
  for (int round = 0; round < 2; ++round) {
    for (const Step* s : {&a, &b}) {
      const aar::dsa::StepMetadata& m = sb.build(s->inputs());
      for (int k = 0; k < 3; ++k) {
        const auto& ra = m.row_arrays[k];
        const std::vector<int32_t> host(ra.index_host.begin(), ra.index_host.end());
        const at::Tensor v = ra.index.contiguous();
        EXPECT_EQ(std::vector<int32_t>(v.data_ptr<int32_t>(), v.data_ptr<int32_t>() + v.numel()), host)
            << "ratio slot " << k << ", round " << round;
        const std::vector<int32_t> req(ra.request_host.begin(), ra.request_host.end());
        const at::Tensor r = ra.request.contiguous();
        EXPECT_EQ(std::vector<int32_t>(r.data_ptr<int32_t>(), r.data_ptr<int32_t>() + r.numel()), req);
      }
      const std::vector<int32_t> pos(m.positions_host.begin(), m.positions_host.end());
      const at::Tensor want = step_config().cos_table.index_select(0, at::tensor(pos, at::kLong));
      EXPECT_TRUE(at::equal(m.cos, want)) << "round " << round;
      if (round == 0) {
        first.push_back(m.cos.data_ptr());
      } else {
        EXPECT_EQ(m.cos.data_ptr(), first[s == &a ? 0 : 1]);
      }
    }
  }
}

}  // namespace
