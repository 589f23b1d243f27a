// Contract adapters of the GQA context-parallel backends ("gqa_dcp", "gqa_pcp"):
// the GQA adapter's decode step (three requests with context, one token each)
// through the DCP / PCP builder and layer (contract_util.h), over a one-rank
// group (a c10d backend whose collectives are the identity, as a real group of
// one is): the contract is the same on every rank; the multi-rank behaviour is
// tests/python/test_gqa_dcp.py / test_gqa_pcp.py's.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <string>
#include <vector>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "contract_util.h"

namespace aar_contract {
namespace {

constexpr int64_t kHeads = 4, kHead = 32, kBlock = 16, kBlocks = 8;

class DoneWork : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds) override { return true; }
  bool isCompleted() override { return true; }
};

// A group of one: every collective hands the rank its own input.
class SelfBackend : public c10d::Backend {
 public:
  SelfBackend() : Backend(0, 1) {}
  const std::string getBackendName() const override { return "self"; }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    out.copy_(in);
    return c10::make_intrusive<DoneWork>();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>&,
                                               std::vector<int64_t>&, const c10d::AllToAllOptions&) override {
    out.copy_(in);
    return c10::make_intrusive<DoneWork>();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions&) override {
    out.copy_(in);
    return c10::make_intrusive<DoneWork>();
  }
};

std::unique_ptr<aar::cp::Comm> group_of_one(const char* name) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(0, 1);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, c10::make_intrusive<SelfBackend>());
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  pg->setGroupName(name);
  return std::make_unique<aar::cp::Comm>(pg);
}

struct Step {
  std::vector<int32_t> qsl{0, 1, 2, 3}, seq{5, 17, 9}, table;
  int32_t stride = 2;
  Step() {
    for (int i = 0; i < 3 * stride; ++i) table.push_back(1 + i);  // distinct ids within num_blocks
  }
  template <class In>
  In inputs() const {
    In in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.block_table = {table.data(), table.size()};
    in.block_table_stride = stride;
    return in;
  }
};

template <class Config>
Config sizes() {
  Config c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 2;
  c.block_size = kBlock;
  c.num_blocks = kBlocks;
  return c;
}

const AdapterRegistrar kGqaDcp("gqa_dcp", [](const BackendFacts& f) {
  auto comm = group_of_one("contract_gqa_dcp");
  auto config = [] {
    aar::gqa::DcpBuilderConfig c = sizes<aar::gqa::DcpBuilderConfig>();
    c.shard = aar::plan::DcpShard{1, 0, 1};
    return c;
  };
  const Step step;
  using In = aar::gqa::DcpBuildInputs;
  aar::gqa::DcpMetadataBuilder b(config());
  check_builder(b, step.inputs<In>(), f, /*decode_threshold=*/1);
  aar::gqa::DcpMetadataBuilder eager_b(config()), capture_b(config());
  const aar::gqa::DcpMetadata& md = eager_b.build(step.inputs<In>());
  const aar::gqa::DcpMetadata& cmd = capture_b.build_for_graph_capture(step.inputs<In>(), AttentionState::DecodeOnly);
  aar::gqa::ImplConfig c;
  c.num_heads = kHeads;
  c.num_kv_heads = 1;
  c.head_size = kHead;
  aar::gqa::DcpAttentionImpl layer(c, *comm);
  const at::Tensor kc = at::randn({kBlocks, kBlock, 1, kHead}), vc = at::randn_like(kc);
  const at::Tensor q = at::randn({3, kHeads, kHead}), k = at::randn({3, 1, kHead}), v = at::randn_like(k);
  check_impl<aar::gqa::DcpMetadata>(
      f,
      [&](const aar::gqa::DcpMetadata* m, const at::Tensor& out) -> const at::Tensor& {
        return layer.forward(q, k, v, kc, vc, m, out);
      },
      md, cmd, q, /*bucket=*/3);
});

const AdapterRegistrar kGqaPcp("gqa_pcp", [](const BackendFacts& f) {
  auto comm = group_of_one("contract_gqa_pcp");
  for (aar::plan::PcpKvMode mode : {aar::plan::PcpKvMode::Sharded, aar::plan::PcpKvMode::Replicated}) {
    SCOPED_TRACE(mode == aar::plan::PcpKvMode::Sharded ? "sharded" : "replicated");
    auto config = [mode] {
      aar::cp::PcpConfig c = sizes<aar::cp::PcpConfig>();
      c.pcp_size = 1;
      c.pcp_rank = 0;
      c.kv_mode = mode;
      return c;
    };
    const Step step;
    using In = aar::cp::PcpBuildInputs;
    aar::cp::PcpMetadataBuilder b(config());
    check_builder(b, step.inputs<In>(), f, /*decode_threshold=*/1);
    aar::cp::PcpMetadataBuilder eager_b(config()), capture_b(config());
    const aar::cp::PcpMetadata& md = eager_b.build(step.inputs<In>());
    const aar::cp::PcpMetadata& cmd = capture_b.build_for_graph_capture(step.inputs<In>(), AttentionState::DecodeOnly);
    aar::gqa::ImplConfig c;
    c.num_heads = kHeads;
    c.num_kv_heads = 2;
    c.head_size = kHead;
    aar::cp::PcpAttentionImpl layer(c, comm.get());
    const at::Tensor kc = at::randn({kBlocks, kBlock, 2, kHead}), vc = at::randn_like(kc);
    const at::Tensor q = at::randn({3, kHeads, kHead}), k = at::randn({3, 2, kHead}), v = at::randn_like(k);
    // A decode-only bucket is captured (docs/design/cp.md §6.6).
    check_impl<aar::cp::PcpMetadata>(
        f,
        [&](const aar::cp::PcpMetadata* m, const at::Tensor& out) -> const at::Tensor& {
          return layer.forward(q, k, v, kc, vc, m, out);
        },
        md, cmd, q, /*bucket=*/3);
  }
});

// The GQA layer's decode-path and graph-key settings have no meaning for the DCP
// layer: each is refused by name rather than ignored.
TEST(GqaDcpImpl, RefusesTheGqaLayersPathSettingsByName) {
  auto comm = group_of_one("gqa_dcp_settings");
  const auto base = [] {
    aar::gqa::ImplConfig c;
    c.num_heads = kHeads;
    c.num_kv_heads = 1;
    c.head_size = kHead;
    return c;
  };
  const auto refused = [&](aar::gqa::ImplConfig c, const std::string& name) {
    try {
      aar::gqa::DcpAttentionImpl layer(c, *comm);
      ADD_FAILURE() << name << " was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  aar::gqa::ImplConfig c = base();
  c.pa_shape_list = {1, 2};
  refused(c, "pa_shape_list");
  c = base();
  c.full_decode_only_graph = true;
  refused(c, "full_decode_only_graph");
  c = base();
  c.has_speculative_config = true;
  refused(c, "has_speculative_config");
  c = base();
  c.kv_cache_group = 1;
  refused(c, "kv_cache_group=1");
  EXPECT_NO_THROW(aar::gqa::DcpAttentionImpl(base(), *comm));
}

}  // namespace
}  // namespace aar_contract
