// The C ABI of context parallelism (include/ascend_attn_rt/c_api.h: aar_cp_comm_*, aar_gqa_dcp_*,
// aar_gqa_pcp_*) in one process: the communicator's argument checks (bad rank / world / port /
// timeout, a group name not registered, a pointer that is not the registered group), a
// one-rank gloo group made over TCP, NULL / foreign / destroyed handles, a communicator whose
// group does not match the metadata's (refused before any collective, caches and output
// untouched), DCP and PCP decode buckets captured, updated and replayed (and what a capture
// refuses), PCP speculative decode (aar_gqa_pcp_builder_create_ext), and one-rank DCP and PCP
// layers against a float64 attention; MLA DCP / PCP (version 6): the cp struct's and the create
// functions' checks, aar_mla_builder_pcp_local_rows, the group checks, a one-rank DCP layer
// against the single-rank one. The two-rank runs are examples/c/c_gqa_cp.c and c_mla_cp.c
// (ctest example_c_gqa_cp, example_c_mla_cp). Version 7: MLA build inputs ext (is_prefilling, draft_step),
// SFA DCP / PCP and DSA DCP: the cp structs, the create functions, the group checks, one-rank layers
// against the single-rank ones (two-rank runs: example_c_sfa_cp, example_c_dsa_cp).
#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/mla/builder.h"
#include "c_api_test_util.h"

namespace {

using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int64_t kH = 4, kHkv = 2, kD = 16;
constexpr int32_t kBs = 16, kNb = 4, kMbr = 2;

// A backend that implements no collective (c10d::Backend's defaults throw): for the tests that
// must be refused before any collective is issued.
class IdleBackend : public c10d::Backend {
 public:
  IdleBackend(int rank, int size) : Backend(rank, size) {}
  const std::string getBackendName() const override { return "idle"; }
};

// A process group of `size` ranks in which this process is `rank`, registered under `name`.
c10::intrusive_ptr<c10d::ProcessGroup> register_group(const std::string& name, int rank, int size) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(rank, size);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM,
                 c10::make_intrusive<IdleBackend>(rank, size));
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  pg->setGroupName(name);
  c10d::register_process_group(name, pg);
  return pg;
}

aar_cp_comm_t* comm_from(const std::string& name) {
  aar_cp_comm_t* c = nullptr;
  EXPECT_EQ(aar_cp_comm_create_from_group(name.c_str(), nullptr, 5000, &c), AAR_OK) << last();
  return c;
}

aar_cp_comm_t* tcp_world1() {
  aar_cp_comm_tcp_config_t cc;
  aar_cp_comm_tcp_config_init(&cc);
  cc.host = "127.0.0.1";
  cc.device_host = "127.0.0.1";
  cc.port = 0;
  cc.rank = 0;
  cc.world_size = 1;
  cc.timeout_ms = 20000;
  aar_cp_comm_t* c = nullptr;
  EXPECT_EQ(aar_cp_comm_create_tcp(&cc, &c), AAR_OK) << last();
  return c;
}

aar_gqa_impl_config_t impl_config() {
  aar_gqa_impl_config_t ic;
  aar_gqa_impl_config_init(&ic);
  ic.num_heads = kH;
  ic.num_kv_heads = kHkv;
  ic.head_size = kD;
  return ic;
}

aar_gqa_dcp_builder_t* dcp_builder(int32_t world, int32_t rank) {
  aar_gqa_dcp_builder_config_t bc;
  aar_gqa_dcp_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 32;
  bc.max_blocks_per_req = kMbr;
  bc.block_size = kBs;
  bc.num_blocks = kNb;
  bc.dcp_world_size = world;
  bc.dcp_rank = rank;
  aar_gqa_dcp_builder_t* b = nullptr;
  EXPECT_EQ(aar_gqa_dcp_builder_create(&bc, &b), AAR_OK) << last();
  return b;
}

aar_gqa_pcp_builder_t* pcp_builder(int32_t pcp, int32_t rank) {
  aar_gqa_pcp_builder_config_t bc;
  aar_gqa_pcp_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 32;
  bc.max_blocks_per_req = kMbr;
  bc.block_size = kBs;
  bc.num_blocks = kNb;
  bc.pcp_size = pcp;
  bc.pcp_rank = rank;
  aar_gqa_pcp_builder_t* b = nullptr;
  EXPECT_EQ(aar_gqa_pcp_builder_create(&bc, &b), AAR_OK) << last();
  return b;
}

// One step of two requests: a prefill of 5 tokens (request 0) and one of 3 (request 1).
const std::vector<int32_t> kQsl = {0, 5, 8}, kSeq = {5, 3}, kTable = {0, 1, 2, 3};
const std::vector<uint8_t> kPref = {1, 1};

template <typename In>
In inputs() {
  In in{};
  in.struct_size = sizeof(In);
  in.query_start_loc = kQsl.data();
  in.query_start_loc_len = kQsl.size();
  in.seq_lens = kSeq.data();
  in.seq_lens_len = kSeq.size();
  in.block_table = kTable.data();
  in.block_table_len = kTable.size();
  in.block_table_stride = kMbr;
  in.is_prefilling = kPref.data();
  in.is_prefilling_len = kPref.size();
  return in;
}

aar_gqa_dcp_build_inputs_t dcp_inputs() {
  auto in = inputs<aar_gqa_dcp_build_inputs_t>();
  in.draft_step = -1;
  return in;
}

// float64 causal attention of the two prefills (q (8, H, D), k / v (8, Hkv, D)).
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  std::vector<at::Tensor> rows;
  for (size_t r = 0; r + 1 < kQsl.size(); ++r) {
    const int64_t s = kQsl[r], n = kQsl[r + 1] - kQsl[r];
    const at::Tensor qq = q.narrow(0, s, n).to(at::kDouble);
    const at::Tensor kk = k.narrow(0, s, n).to(at::kDouble).repeat_interleave(kH / kHkv, 1);
    const at::Tensor vv = v.narrow(0, s, n).to(at::kDouble).repeat_interleave(kH / kHkv, 1);
    at::Tensor sc = at::einsum("nhd,lhd->hnl", {qq, kk}) / std::sqrt(static_cast<double>(kD));
    const at::Tensor mask = at::ones({n, n}, at::kBool).triu(1);
    sc = sc.masked_fill(mask.unsqueeze(0), -INFINITY);
    rows.push_back(at::einsum("hnl,lhd->nhd", {at::softmax(sc, -1), vv}));
  }
  return at::cat(rows);
}

struct Tensors {
  at::Tensor q = at::randn({8, kH, kD}), k = at::randn({8, kHkv, kD}), v = at::randn({8, kHkv, kD});
  at::Tensor kc = at::zeros({kNb, kBs, kHkv, kD}), vc = at::zeros({kNb, kBs, kHkv, kD});
  at::Tensor out = at::full({8, kH, kD}, 7.0f);
};

TEST(CApiCp, TcpConfigRejectedByName) {
  aar_cp_comm_tcp_config_t cc;
  aar_cp_comm_tcp_config_init(&cc);
  cc.host = "127.0.0.1";
  cc.port = 29999;
  cc.rank = 0;
  cc.world_size = 2;
  aar_cp_comm_t* sentinel = reinterpret_cast<aar_cp_comm_t*>(0x1);
  aar_cp_comm_t* out = sentinel;
  auto bad = [&](auto edit, const char* needle) {
    aar_cp_comm_tcp_config_t c = cc;
    edit(c);
    EXPECT_REJECTED(aar_cp_comm_create_tcp(&c, &out), AAR_ERR_INVALID_ARGUMENT, needle);
    EXPECT_EQ(out, sentinel);  // nothing written on error
  };
  bad([](auto& c) { c.rank = 2; }, "config->rank=2 is out of range [0, world_size=2)");
  bad([](auto& c) { c.rank = -1; }, "config->rank=-1 is out of range");
  bad([](auto& c) { c.world_size = 0; }, "config->world_size must be >= 1, got 0");
  bad([](auto& c) { c.port = 70000; }, "config->port must be in [1, 65535], got 70000");
  bad([](auto& c) { c.port = 0; }, "config->port=0 (any free port) needs world_size 1");
  bad([](auto& c) { c.host = nullptr; }, "config->host must name rank 0's address, got NULL");
  bad([](auto& c) { c.timeout_ms = 0; }, "config->timeout_ms must be a positive number of milliseconds, got 0");
  bad([](auto& c) { c.group_name = ""; }, "config->group_name is the empty string");
  bad([](auto& c) {
        c.device_interface = "lo";
        c.device_host = "127.0.0.1";
      },
      "config->device_interface and config->device_host are both set");
  bad([](auto& c) { c.struct_size = 8; }, "config->struct_size is 8");
  bad([](auto& c) {
        c.rank = 1;
        c.listen_fd = 3;
      },
      "config->listen_fd=3 is for rank 0 (the store's server), given on rank 1");
  bad([](auto& c) { c.listen_fd = -2; }, "config->listen_fd must be -1 or a socket, got -2");
  // Named before any rendezvous (gloo's own text before: no field named).
  bad([](auto& c) { c.device_interface = "nosuchif0"; },
      "config->device_interface='nosuchif0' gives no gloo device");
  bad([](auto& c) { c.device_host = "no.such.host.invalid"; },
      "config->device_host='no.such.host.invalid' gives no gloo device");
  const int not_a_socket = open("/dev/null", O_RDONLY);
  ASSERT_GE(not_a_socket, 0);
  bad([&](auto& c) { c.listen_fd = not_a_socket; },
      (std::string("config->listen_fd=") + std::to_string(not_a_socket) + " is not a listening socket").c_str());
  close(not_a_socket);
  EXPECT_REJECTED(aar_cp_comm_create_tcp(nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  EXPECT_REJECTED(aar_cp_comm_create_tcp(&cc, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  // The unset required fields of an initialised struct are refused, not defaulted.
  aar_cp_comm_tcp_config_t fresh;
  aar_cp_comm_tcp_config_init(&fresh);
  fresh.host = "127.0.0.1";
  EXPECT_REJECTED(aar_cp_comm_create_tcp(&fresh, &out), AAR_ERR_INVALID_ARGUMENT, "config->world_size");
  EXPECT_EQ(out, sentinel);
}

TEST(CApiCp, TcpRendezvousWithoutPeersFailsWithinTheTimeout) {
  // Rank 1 of 2 whose rank 0 never comes: a runtime error after the timeout, not a hang.
  aar_cp_comm_tcp_config_t cc;
  aar_cp_comm_tcp_config_init(&cc);
  cc.host = "127.0.0.1";
  cc.port = 1;  // nothing listens there (a privileged port)
  cc.rank = 1;
  cc.world_size = 2;
  cc.timeout_ms = 300;
  aar_cp_comm_t* out = nullptr;
  EXPECT_REJECTED(aar_cp_comm_create_tcp(&cc, &out), AAR_ERR_RUNTIME,
                  "rank 1 of 2 could not join the gloo group at 127.0.0.1:1 within 300 ms");
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(last().find("frame #"), std::string::npos) << last();  // torch's message, not its backtrace
}

TEST(CApiCp, FromGroupChecksTheRegistryAndThePointer) {
  auto pg = register_group("aar_c_api_cp_from_group", 1, 2);
  aar_cp_comm_t* out = nullptr;
  EXPECT_REJECTED(aar_cp_comm_create_from_group("aar_no_such_group", nullptr, 1000, &out), AAR_ERR_INVALID_ARGUMENT,
                  "group_name 'aar_no_such_group' is not in torch's process-group registry");
  EXPECT_REJECTED(aar_cp_comm_create_from_group(nullptr, nullptr, 1000, &out), AAR_ERR_INVALID_ARGUMENT,
                  "group_name must name a registered process group, got NULL");
  EXPECT_REJECTED(aar_cp_comm_create_from_group("aar_c_api_cp_from_group", nullptr, 0, &out),
                  AAR_ERR_INVALID_ARGUMENT, "timeout_ms must be a positive number of milliseconds, got 0");
  int not_a_group = 0;
  EXPECT_REJECTED(aar_cp_comm_create_from_group("aar_c_api_cp_from_group", &not_a_group, 1000, &out),
                  AAR_ERR_INVALID_ARGUMENT, "is not the c10d::ProcessGroup registered under 'aar_c_api_cp_from_group'");
  EXPECT_EQ(out, nullptr);
  ASSERT_EQ(aar_cp_comm_create_from_group("aar_c_api_cp_from_group", pg.get(), 1000, &out), AAR_OK) << last();
  aar_cp_comm_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_cp_comm_get_info(out, &info), AAR_OK) << last();
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.calls, 0);
  aar_cp_comm_destroy(out);
  // A destroyed communicator is named as such, and a second destroy frees nothing.
  EXPECT_REJECTED(aar_cp_comm_get_info(out, &info), AAR_ERR_INVALID_ARGUMENT, "comm is an aar_cp_comm_t that has been destroyed");
  aar_cp_comm_destroy(out);
  EXPECT_NE(last().find("destroyed"), std::string::npos) << last();
  c10d::unregister_process_group("aar_c_api_cp_from_group");
}

TEST(CApiCp, HandlesAreChecked) {
  aar_cp_comm_t* comm = tcp_world1();
  ASSERT_NE(comm, nullptr);
  const aar_gqa_impl_config_t ic = impl_config();
  aar_gqa_dcp_impl_t* dcp = nullptr;
  aar_gqa_pcp_impl_t* pcp = nullptr;
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&ic, nullptr, &dcp), AAR_ERR_INVALID_ARGUMENT,
                  "comm is NULL, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_gqa_pcp_impl_create(&ic, nullptr, nullptr, &pcp), AAR_ERR_INVALID_ARGUMENT,
                  "pcp is NULL, expected an aar_cp_comm_t");
  // A builder passed as a communicator.
  aar_gqa_dcp_builder_t* b = dcp_builder(1, 0);
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&ic, reinterpret_cast<aar_cp_comm_t*>(b), &dcp), AAR_ERR_INVALID_ARGUMENT,
                  "comm is an aar_gqa_dcp_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_gqa_pcp_impl_create(&ic, comm, reinterpret_cast<aar_cp_comm_t*>(b), &pcp),
                  AAR_ERR_INVALID_ARGUMENT, "dcp is an aar_gqa_dcp_builder_t, expected an aar_cp_comm_t");
  EXPECT_EQ(dcp, nullptr);
  EXPECT_EQ(pcp, nullptr);
  // Unsupported layer options are refused by name (the GQA config's fields).
  aar_gqa_impl_config_t win = ic;
  win.sliding_window = 8;
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&win, comm, &dcp), AAR_ERR_NOT_SUPPORTED, "sliding_window");
  // The GQA layer's path options, which the DCP layer would not read.
  aar_gqa_impl_config_t path = ic;
  path.full_decode_only_graph = 1;
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&path, comm, &dcp), AAR_ERR_NOT_SUPPORTED,
                  "config->full_decode_only_graph with a DCP layer");
  const int32_t shapes[2] = {1, 2};
  path = ic;
  path.pa_shape_list = shapes;
  path.pa_shape_list_len = 2;
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&path, comm, &dcp), AAR_ERR_NOT_SUPPORTED, "config->pa_shape_list");
  path = ic;
  path.kv_cache_group = 1;
  EXPECT_REJECTED(aar_gqa_dcp_impl_create(&path, comm, &dcp), AAR_ERR_NOT_SUPPORTED, "config->kv_cache_group=1");
  EXPECT_EQ(dcp, nullptr);
  // A DCP metadata given to the PCP layer, and a NULL layer.
  ASSERT_EQ(aar_gqa_dcp_impl_create(&ic, comm, &dcp), AAR_OK) << last();
  ASSERT_EQ(aar_gqa_pcp_impl_create(&ic, comm, nullptr, &pcp), AAR_OK) << last();
  const aar_gqa_dcp_build_inputs_t in = dcp_inputs();
  const aar_gqa_dcp_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_dcp_builder_build(b, &in, &md), AAR_OK) << last();
  Tensors t;
  Dl q(t.q), k(t.k), v(t.v), kc(t.kc), vc(t.vc), o(t.out);
  EXPECT_REJECTED(aar_gqa_pcp_impl_forward(pcp, q.get(), k.get(), v.get(), kc.get(), vc.get(),
                                           reinterpret_cast<const aar_gqa_pcp_metadata_t*>(md), o.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_dcp_metadata_t, expected an aar_gqa_pcp_metadata_t");
  EXPECT_REJECTED(aar_gqa_dcp_impl_forward(nullptr, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()),
                  AAR_ERR_INVALID_ARGUMENT, "impl is NULL, expected an aar_gqa_dcp_impl_t");
  EXPECT_REJECTED(aar_gqa_pcp_impl_forward(pcp, q.get(), nullptr, v.get(), kc.get(), vc.get(), nullptr, o.get()),
                  AAR_ERR_INVALID_ARGUMENT, "key is NULL");
  EXPECT_TRUE(at::equal(t.out, at::full_like(t.out, 7.0f)));
  EXPECT_FALSE(t.kc.any().item<bool>());
  // The metadata of a destroyed builder.
  aar_gqa_dcp_builder_destroy(b);
  EXPECT_REJECTED(aar_gqa_dcp_impl_forward(dcp, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_dcp_metadata_t that has been destroyed");
  aar_gqa_dcp_impl_destroy(dcp);
  aar_gqa_pcp_impl_destroy(pcp);
  aar_cp_comm_destroy(comm);
}

TEST(CApiCp, BuilderConfigRejectedByName) {
  aar_gqa_dcp_builder_config_t dc;
  aar_gqa_dcp_builder_config_init(&dc);
  dc.num_blocks = kNb;
  aar_gqa_dcp_builder_t* d = nullptr;
  dc.dcp_world_size = 2;
  dc.dcp_rank = 2;
  EXPECT_REJECTED(aar_gqa_dcp_builder_create(&dc, &d), AAR_ERR_INVALID_ARGUMENT,
                  "config->dcp_rank=2 is out of range [0, dcp_world_size=2)");
  dc.dcp_world_size = 0;
  dc.dcp_rank = 0;
  EXPECT_REJECTED(aar_gqa_dcp_builder_create(&dc, &d), AAR_ERR_INVALID_ARGUMENT,
                  "config->dcp_world_size must be >= 1, got 0");
  EXPECT_EQ(d, nullptr);
  aar_gqa_pcp_builder_config_t pc;
  aar_gqa_pcp_builder_config_init(&pc);
  pc.num_blocks = kNb;
  aar_gqa_pcp_builder_t* p = nullptr;
  pc.pcp_size = 2;
  pc.pcp_rank = -1;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create(&pc, &p), AAR_ERR_INVALID_ARGUMENT,
                  "config->pcp_rank=-1 is out of range [0, pcp_size=2)");
  pc.pcp_rank = 0;
  pc.dcp_size = 2;
  pc.dcp_rank = 5;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create(&pc, &p), AAR_ERR_INVALID_ARGUMENT,
                  "config->dcp_rank=5 is out of range [0, dcp_size=2)");
  pc.dcp_size = 1;
  pc.dcp_rank = 0;
  int32_t seven = 7;
  std::memcpy(&pc.kv_mode, &seven, sizeof seven);
  EXPECT_REJECTED(aar_gqa_pcp_builder_create(&pc, &p), AAR_ERR_INVALID_ARGUMENT, "config->kv_mode must be");
  EXPECT_EQ(p, nullptr);
  // Build inputs of another size.
  aar_gqa_dcp_builder_t* b = dcp_builder(1, 0);
  aar_gqa_dcp_build_inputs_t in = dcp_inputs();
  in.struct_size = 4;
  const aar_gqa_dcp_metadata_t* md = nullptr;
  EXPECT_REJECTED(aar_gqa_dcp_builder_build(b, &in, &md), AAR_ERR_INVALID_ARGUMENT, "inputs->struct_size is 4");
  EXPECT_EQ(md, nullptr);
  aar_gqa_dcp_builder_destroy(b);
}

// The communicator's group and the metadata's CP world / rank must agree: refused before any
// collective, caches and output untouched.
TEST(CApiCp, CommWorldMismatchingTheBuildersIsRefused) {
  auto pg = register_group("aar_c_api_cp_mismatch", 1, 2);  // the registry may hold it weakly
  aar_cp_comm_t* two = comm_from("aar_c_api_cp_mismatch");
  aar_cp_comm_t* one = tcp_world1();
  ASSERT_NE(two, nullptr);
  ASSERT_NE(one, nullptr);
  const aar_gqa_impl_config_t ic = impl_config();
  Tensors t;
  Dl q(t.q), k(t.k), v(t.v), kc(t.kc), vc(t.vc), o(t.out);
  auto untouched = [&] {
    EXPECT_TRUE(at::equal(t.out, at::full_like(t.out, 7.0f)));
    EXPECT_FALSE(t.kc.any().item<bool>());
    EXPECT_FALSE(t.vc.any().item<bool>());
  };
  {  // DCP: metadata of rank 0 of 2 on the group's rank 1; metadata of one rank on a 2-rank group.
    aar_gqa_dcp_impl_t* layer = nullptr;
    ASSERT_EQ(aar_gqa_dcp_impl_create(&ic, two, &layer), AAR_OK) << last();
    aar_gqa_dcp_builder_t* b0 = dcp_builder(2, 0);
    aar_gqa_dcp_builder_t* b1 = dcp_builder(1, 0);
    const aar_gqa_dcp_build_inputs_t in = dcp_inputs();
    const aar_gqa_dcp_metadata_t* md = nullptr;
    ASSERT_EQ(aar_gqa_dcp_builder_build(b0, &in, &md), AAR_OK) << last();
    EXPECT_REJECTED(aar_gqa_dcp_impl_forward(layer, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()),
                    AAR_ERR_INVALID_ARGUMENT, "built for DCP rank 0 of 2 but the layer's group is rank 1 of 2");
    ASSERT_EQ(aar_gqa_dcp_builder_build(b1, &in, &md), AAR_OK) << last();
    EXPECT_REJECTED(aar_gqa_dcp_impl_forward(layer, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()),
                    AAR_ERR_INVALID_ARGUMENT, "built for DCP rank 0 of 1 but the layer's group is rank 1 of 2");
    untouched();
    aar_gqa_dcp_builder_destroy(b0);
    aar_gqa_dcp_builder_destroy(b1);
    aar_gqa_dcp_impl_destroy(layer);
  }
  {  // PCP: a 2-rank builder with a 1-rank group.
    aar_gqa_pcp_impl_t* layer = nullptr;
    ASSERT_EQ(aar_gqa_pcp_impl_create(&ic, one, nullptr, &layer), AAR_OK) << last();
    aar_gqa_pcp_builder_t* b = pcp_builder(2, 1);
    const auto in = inputs<aar_gqa_pcp_build_inputs_t>();
    const aar_gqa_pcp_metadata_t* md = nullptr;
    ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
    aar_gqa_pcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
    const int64_t n = info.num_local_tokens;
    at::Tensor lq = at::zeros({n, kH, kD}), lk = at::zeros({n, kHkv, kD}), lout = at::full({n, kH, kD}, 7.0f);
    Dl dq(lq), dk(lk), dv(lk), dout(lout);
    EXPECT_REJECTED(aar_gqa_pcp_impl_forward(layer, dq.get(), dk.get(), dv.get(), kc.get(), vc.get(), md, dout.get()),
                    AAR_ERR_INVALID_ARGUMENT, "pcp group: rank 0 of 1 but the metadata was built for PCP rank 1 of 2");
    EXPECT_TRUE(at::equal(lout, at::full_like(lout, 7.0f)));
    untouched();
    aar_gqa_pcp_builder_destroy(b);
    aar_gqa_pcp_impl_destroy(layer);
  }
  aar_cp_comm_destroy(two);
  aar_cp_comm_destroy(one);
  c10d::unregister_process_group("aar_c_api_cp_mismatch");
}

// float64 attention of one query row (H, D) over n keys / values (n, Hkv, D), all visible.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const at::Tensor kk = k.to(at::kDouble).repeat_interleave(kH / kHkv, 1);
  const at::Tensor vv = v.to(at::kDouble).repeat_interleave(kH / kHkv, 1);
  const at::Tensor sc = at::einsum("hd,lhd->hl", {q.to(at::kDouble), kk}) / std::sqrt(static_cast<double>(kD));
  return at::einsum("hl,lhd->hd", {at::softmax(sc, -1), vv});
}

// A DCP decode bucket captured through the C ABI (one rank: the recorded calls without a peer),
// updated and replayed over two steps, against float64; a prefill inside the capture, a PCP
// profiling forward inside it and non-capturable states are refused by name.
TEST(CApiCp, DcpDecodeGraphReplaysAndRefusals) {
  constexpr int64_t kBucket = 4;
  aar_cp_comm_t* comm = tcp_world1();
  const aar_gqa_impl_config_t ic = impl_config();
  aar_gqa_dcp_impl_t* layer = nullptr;
  aar_gqa_pcp_impl_t* pcp = nullptr;
  ASSERT_EQ(aar_gqa_dcp_impl_create(&ic, comm, &layer), AAR_OK) << last();
  ASSERT_EQ(aar_gqa_pcp_impl_create(&ic, comm, nullptr, &pcp), AAR_OK) << last();
  aar_gqa_dcp_builder_t* b = dcp_builder(1, 0);
  Tensors t;
  Dl q(t.q), k(t.k), v(t.v), kc(t.kc), vc(t.vc), o(t.out);
  // The history: the two prefills, eager.
  const aar_gqa_dcp_build_inputs_t pin = dcp_inputs();
  const aar_gqa_dcp_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_dcp_builder_build(b, &pin, &md), AAR_OK) << last();
  ASSERT_EQ(aar_gqa_dcp_impl_forward(layer, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()), AAR_OK)
      << last();
  std::vector<at::Tensor> hk = {t.k.narrow(0, 0, 5), t.k.narrow(0, 5, 3)};
  std::vector<at::Tensor> hv = {t.v.narrow(0, 0, 5), t.v.narrow(0, 5, 3)};

  const std::vector<int32_t> dqsl = {0, 1, 2};
  auto decode_inputs = [&](const std::vector<int32_t>& seq) {
    aar_gqa_dcp_build_inputs_t in = dcp_inputs();
    in.query_start_loc = dqsl.data();
    in.query_start_loc_len = dqsl.size();
    in.seq_lens = seq.data();
    in.seq_lens_len = seq.size();
    in.is_prefilling = nullptr;
    in.is_prefilling_len = 0;
    in.num_input_tokens = kBucket;
    return in;
  };
  // Not capturable states, before anything is built.
  std::vector<int32_t> seq = {6, 4};
  aar_gqa_dcp_build_inputs_t din = decode_inputs(seq);
  EXPECT_REJECTED(aar_gqa_dcp_builder_build_for_graph_capture(b, &din, AAR_STATE_PREFILL_NO_CACHE, &md),
                  AAR_ERR_NOT_SUPPORTED, "cannot be captured by the gqa_dcp backend");
  EXPECT_REJECTED(aar_gqa_dcp_builder_build_for_graph_capture(b, &din, AAR_STATE_AUTO, &md), AAR_ERR_INVALID_ARGUMENT,
                  "state");

  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  at::Tensor qs = at::zeros({kBucket, kH, kD}), ks = at::zeros({kBucket, kHkv, kD}), vs = at::zeros_like(ks);
  at::Tensor outs = at::zeros({kBucket, kH, kD});
  Dl dqs(qs), dks(ks), dvs(vs), douts(outs);
  {  // A prefill, and a PCP layer, inside an open capture.
    ASSERT_EQ(aar_graph_begin_capture(g, 8), AAR_OK) << last();
    ASSERT_EQ(aar_gqa_dcp_builder_build(b, &pin, &md), AAR_OK) << last();
    EXPECT_REJECTED(aar_gqa_dcp_impl_forward(layer, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()),
                    AAR_ERR_NOT_SUPPORTED, "decode-only");
    EXPECT_REJECTED(aar_gqa_pcp_impl_forward(pcp, q.get(), k.get(), v.get(), kc.get(), vc.get(), nullptr, o.get()),
                    AAR_ERR_NOT_SUPPORTED, "a GQA PCP forward without metadata (profiling run)");
    ASSERT_EQ(aar_graph_abort_capture(g), AAR_OK) << last();
  }
  ASSERT_EQ(aar_gqa_dcp_builder_build_for_graph_capture(b, &din, AAR_STATE_DECODE_ONLY, &md), AAR_OK) << last();
  ASSERT_EQ(aar_graph_begin_capture(g, kBucket), AAR_OK) << last();
  ASSERT_EQ(aar_gqa_dcp_impl_forward(layer, dqs.get(), dks.get(), dvs.get(), kc.get(), vc.get(), md, douts.get()),
            AAR_OK)
      << last();
  ASSERT_EQ(aar_graph_end_capture(g), AAR_OK) << last();
  int32_t has = 0;
  ASSERT_EQ(aar_graph_has(g, kBucket, &has), AAR_OK) << last();
  EXPECT_EQ(has, 1);
  for (int step = 0; step < 2; ++step) {
    seq = {6 + step, 4 + step};
    din = decode_inputs(seq);
    ASSERT_EQ(aar_gqa_dcp_builder_build(b, &din, &md), AAR_OK) << last();
    const at::Tensor nq = at::randn({2, kH, kD}), nk = at::randn({2, kHkv, kD}), nv = at::randn({2, kHkv, kD});
    qs.zero_(), ks.zero_(), vs.zero_();
    qs.narrow(0, 0, 2).copy_(nq), ks.narrow(0, 0, 2).copy_(nk), vs.narrow(0, 0, 2).copy_(nv);
    outs.fill_(NAN);
    ASSERT_EQ(aar_graph_update_gqa_dcp(g, kBucket, md), AAR_OK) << last();
    ASSERT_EQ(aar_graph_replay(g, kBucket), AAR_OK) << last();
    for (int r = 0; r < 2; ++r) {
      hk[r] = at::cat({hk[r], nk.narrow(0, r, 1)});
      hv[r] = at::cat({hv[r], nv.narrow(0, r, 1)});
      const at::Tensor ref = attend(nq[r], hk[r], hv[r]);
      EXPECT_LT((outs[r].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5) << "step " << step << " request " << r;
    }
  }
  // The update takes DCP metadata only.
  EXPECT_REJECTED(aar_graph_update_gqa_dcp(g, kBucket, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is NULL, expected an aar_gqa_dcp_metadata_t");
  aar_graph_params_destroy(g);
  aar_gqa_dcp_builder_destroy(b);
  aar_gqa_dcp_impl_destroy(layer);
  aar_gqa_pcp_impl_destroy(pcp);
  aar_cp_comm_destroy(comm);
}

// A PCP step's host arrays (kept alive with the inputs that point at them).
struct PcpStep {
  std::vector<int32_t> qsl = {0}, seq, table;
  std::vector<uint8_t> pref;
  int32_t num_input_tokens = 0;
  // Requests 0 and 1 in order with `qlens` new tokens after `hist` (their lengths so far).
  PcpStep(const std::vector<int32_t>& qlens, const std::vector<int64_t>& hist, bool prefilling) {
    for (size_t r = 0; r < qlens.size(); ++r) {
      qsl.push_back(qsl.back() + qlens[r]);
      seq.push_back(static_cast<int32_t>(hist[r]) + qlens[r]);
      table.insert(table.end(), kTable.begin() + r * kMbr, kTable.begin() + (r + 1) * kMbr);
      pref.push_back(prefilling ? 1 : 0);
    }
  }
  aar_gqa_pcp_build_inputs_t in() const {
    aar_gqa_pcp_build_inputs_t b;
    aar_gqa_pcp_build_inputs_init(&b);
    b.query_start_loc = qsl.data();
    b.query_start_loc_len = qsl.size();
    b.seq_lens = seq.data();
    b.seq_lens_len = seq.size();
    b.block_table = table.data();
    b.block_table_len = table.size();
    b.block_table_stride = kMbr;
    b.is_prefilling = pref.data();
    b.is_prefilling_len = pref.size();
    b.num_input_tokens = num_input_tokens;
    return b;
  }
};

aar_gqa_pcp_builder_t* pcp_spec_builder(aar_pcp_kv_mode_t mode, int32_t spec) {
  aar_gqa_pcp_builder_config_t bc;
  aar_gqa_pcp_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 32;
  bc.max_blocks_per_req = kMbr;
  bc.block_size = kBs;
  bc.num_blocks = kNb;
  bc.kv_mode = mode;
  aar_gqa_pcp_builder_ext_t ext;
  aar_gqa_pcp_builder_ext_init(&ext);
  EXPECT_EQ(ext.num_speculative_tokens, 0);
  ext.num_speculative_tokens = spec;
  aar_gqa_pcp_builder_t* b = nullptr;
  EXPECT_EQ(aar_gqa_pcp_builder_create_ext(&bc, &ext, &b), AAR_OK) << last();
  return b;
}

TEST(CApiCp, PcpBuilderExtRejectedByName) {
  aar_gqa_pcp_builder_config_t bc;
  aar_gqa_pcp_builder_config_init(&bc);
  bc.num_blocks = kNb;
  aar_gqa_pcp_builder_ext_t ext;
  aar_gqa_pcp_builder_ext_init(&ext);
  aar_gqa_pcp_builder_t* sentinel = reinterpret_cast<aar_gqa_pcp_builder_t*>(0x1);
  aar_gqa_pcp_builder_t* out = sentinel;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&bc, nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "ext is NULL");
  aar_gqa_pcp_builder_ext_t bad = ext;
  bad.struct_size = 4;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&bc, &bad, &out), AAR_ERR_INVALID_ARGUMENT,
                  "ext->struct_size is 4");
  bad = ext;
  bad.num_speculative_tokens = 16;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&bc, &bad, &out), AAR_ERR_INVALID_ARGUMENT,
                  "ext->num_speculative_tokens must be in [0, 15], got 16");
  bad.num_speculative_tokens = -1;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&bc, &bad, &out), AAR_ERR_INVALID_ARGUMENT,
                  "ext->num_speculative_tokens must be in [0, 15], got -1");
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(nullptr, &ext, &out), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&bc, &ext, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  aar_gqa_pcp_builder_config_t badc = bc;
  badc.pcp_size = 0;
  EXPECT_REJECTED(aar_gqa_pcp_builder_create_ext(&badc, &ext, &out), AAR_ERR_INVALID_ARGUMENT,
                  "config->pcp_size must be >= 1, got 0");
  EXPECT_EQ(out, sentinel);  // nothing written on error
  ASSERT_EQ(aar_gqa_pcp_builder_create_ext(&bc, &ext, &out), AAR_OK) << last();
  aar_gqa_pcp_builder_destroy(out);
}

// PCP speculative decode (eager) and a captured PCP decode bucket replayed, one rank, both KV
// modes, against float64; what the capture build, the forward inside a capture and the update
// refuse (by name, nothing written or built).
TEST(CApiCp, PcpSpecDecodeAndDecodeGraph) {
  constexpr int64_t kBucket = 8;
  for (const aar_pcp_kv_mode_t mode : {AAR_PCP_SHARDED, AAR_PCP_REPLICATED}) {
    SCOPED_TRACE(mode == AAR_PCP_SHARDED ? "sharded" : "replicated");
    aar_cp_comm_t* comm = tcp_world1();
    ASSERT_NE(comm, nullptr);
    const aar_gqa_impl_config_t ic = impl_config();
    aar_gqa_pcp_impl_t* layer = nullptr;
    ASSERT_EQ(aar_gqa_pcp_impl_create(&ic, comm, nullptr, &layer), AAR_OK) << last();
    aar_cp_comm_destroy(comm);
    aar_gqa_pcp_builder_t* b = pcp_spec_builder(mode, 2);
    at::Tensor kc = at::zeros({kNb, kBs, kHkv, kD}), vc = at::zeros({kNb, kBs, kHkv, kD});
    Dl dkc(kc), dvc(vc);
    std::vector<at::Tensor> hk(2), hv(2);
    std::vector<int64_t> hist = {0, 0};

    // One eager step: the global rows q / k / v of `s`, this rank's local rows through
    // local_rows; every real row checked against float64 over its request's history.
    auto eager = [&](const PcpStep& s, const aar_gqa_pcp_metadata_t* md, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v) {
      size_t n = 0;
      ASSERT_EQ(aar_gqa_pcp_builder_local_rows(b, nullptr, nullptr, 0, &n), AAR_OK) << last();
      std::vector<int32_t> idx(n);
      ASSERT_EQ(aar_gqa_pcp_builder_local_rows(b, idx.data(), nullptr, n, &n), AAR_OK) << last();
      const int64_t m = static_cast<int64_t>(n);
      at::Tensor lq = at::zeros({m, kH, kD}), lk = at::zeros({m, kHkv, kD}), lv = at::zeros({m, kHkv, kD});
      at::Tensor lout = at::full({m, kH, kD}, NAN);
      for (int64_t i = 0; i < m; ++i) {
        if (idx[i] < 0) continue;
        lq[i].copy_(q[idx[i]]), lk[i].copy_(k[idx[i]]), lv[i].copy_(v[idx[i]]);
      }
      Dl dq(lq), dk(lk), dv(lv), dout(lout);
      ASSERT_EQ(aar_gqa_pcp_impl_forward(layer, dq.get(), dk.get(), dv.get(), dkc.get(), dvc.get(), md, dout.get()),
                AAR_OK)
          << last();
      for (int r = 0; r < 2; ++r) {
        const int64_t s0 = s.qsl[r], len = s.qsl[r + 1] - s.qsl[r];
        hk[r] = hist[r] ? at::cat({hk[r], k.narrow(0, s0, len)}) : k.narrow(0, s0, len).clone();
        hv[r] = hist[r] ? at::cat({hv[r], v.narrow(0, s0, len)}) : v.narrow(0, s0, len).clone();
      }
      for (int64_t i = 0; i < m; ++i) {
        if (idx[i] < 0) continue;
        const int r = idx[i] >= s.qsl[1] ? 1 : 0;
        const int64_t pos = hist[r] + (idx[i] - s.qsl[r]);
        const at::Tensor ref = attend(q[idx[i]], hk[r].narrow(0, 0, pos + 1), hv[r].narrow(0, 0, pos + 1));
        EXPECT_LT((lout[i].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5) << "global token " << idx[i];
      }
      for (int r = 0; r < 2; ++r) hist[r] += s.qsl[r + 1] - s.qsl[r];
    };

    {  // History: the two prefills.
      const PcpStep s({5, 3}, hist, true);
      const aar_gqa_pcp_build_inputs_t in = s.in();
      const aar_gqa_pcp_metadata_t* md = nullptr;
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
      eager(s, md, at::randn({8, kH, kD}), at::randn({8, kHkv, kD}), at::randn({8, kHkv, kD}));
    }
    {  // A speculative decode step: 3 and 2 tokens (the threshold is 1 + 2), eager.
      const PcpStep s({3, 2}, hist, false);
      const aar_gqa_pcp_build_inputs_t in = s.in();
      const aar_gqa_pcp_metadata_t* md = nullptr;
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
      aar_gqa_pcp_metadata_info_t info;
      info.struct_size = sizeof(info);
      ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
      EXPECT_EQ(info.attn_state, AAR_STATE_SPEC_DECODING);
      EXPECT_EQ(info.num_decodes, 2);
      EXPECT_EQ(info.num_decode_tokens, 5);
      EXPECT_EQ(info.num_prefills, 0);
      eager(s, md, at::randn({5, kH, kD}), at::randn({5, kHkv, kD}), at::randn({5, kHkv, kD}));
    }

    // The capture build: what it refuses, before anything is built.
    const aar_gqa_pcp_metadata_t* md = nullptr;
    aar_gqa_pcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    PcpStep cap({3, 3}, hist, false);
    cap.num_input_tokens = kBucket;
    aar_gqa_pcp_build_inputs_t cin = cap.in();
    {
      const aar_gqa_pcp_metadata_t* none = nullptr;
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &cin, &md), AAR_OK) << last();  // a padded decode-only build
      ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
      EXPECT_EQ(info.num_local_tokens, kBucket);
      const uint64_t gen = info.generation;
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(b, &cin, AAR_STATE_PREFILL_NO_CACHE, &none),
                      AAR_ERR_NOT_SUPPORTED, "gqa_pcp");
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(b, &cin, AAR_STATE_AUTO, &none),
                      AAR_ERR_INVALID_ARGUMENT, "state");
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(nullptr, &cin, AAR_STATE_DECODE_ONLY, &none),
                      AAR_ERR_INVALID_ARGUMENT, "builder is NULL, expected an aar_gqa_pcp_builder_t");
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(b, &cin, AAR_STATE_DECODE_ONLY, nullptr),
                      AAR_ERR_INVALID_ARGUMENT, "out is NULL");
      aar_gqa_pcp_build_inputs_t bad = cin;
      bad.struct_size = 4;
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(b, &bad, AAR_STATE_DECODE_ONLY, &none),
                      AAR_ERR_INVALID_ARGUMENT, "inputs->struct_size is 4");
      PcpStep mixed({1, 9}, hist, false);
      mixed.pref = {0, 1};
      mixed.num_input_tokens = 12;
      const aar_gqa_pcp_build_inputs_t min = mixed.in();
      EXPECT_REJECTED(aar_gqa_pcp_builder_build_for_graph_capture(b, &min, AAR_STATE_DECODE_ONLY, &none),
                      AAR_ERR_NOT_SUPPORTED, "prefill");
      EXPECT_EQ(none, nullptr);
      ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
      EXPECT_EQ(info.generation, gen);  // nothing built
    }

    aar_graph_params_t* g = nullptr;
    ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
    at::Tensor qs = at::zeros({kBucket, kH, kD}), ks = at::zeros({kBucket, kHkv, kD}), vs = at::zeros_like(ks);
    at::Tensor outs = at::zeros({kBucket, kH, kD});
    Dl dqs(qs), dks(ks), dvs(vs), douts(outs);
    {  // A step with prefills inside an open capture: refused, nothing written, nothing recorded.
      const PcpStep s({1, 9}, hist, false);
      PcpStep pre = s;
      pre.pref = {0, 1};
      const aar_gqa_pcp_build_inputs_t in = pre.in();
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
      ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
      const int64_t n = info.num_local_tokens;
      at::Tensor lq = at::randn({n, kH, kD}), lk = at::randn({n, kHkv, kD}), lout = at::full({n, kH, kD}, 7.0f);
      const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
      Dl dq(lq), dk(lk), dout(lout);
      ASSERT_EQ(aar_graph_begin_capture(g, 16), AAR_OK) << last();
      EXPECT_REJECTED(aar_gqa_pcp_impl_forward(layer, dq.get(), dk.get(), dk.get(), dkc.get(), dvc.get(), md, dout.get()),
                      AAR_ERR_NOT_SUPPORTED, "inside a graph capture");
      ASSERT_EQ(aar_graph_abort_capture(g), AAR_OK) << last();
      EXPECT_TRUE(at::equal(lout, at::full_like(lout, 7.0f)));
      EXPECT_TRUE(at::equal(kc, kc0));
      EXPECT_TRUE(at::equal(vc, vc0));
      // Nothing was captured.
      int32_t has = 1;
      ASSERT_EQ(aar_graph_has(g, 16, &has), AAR_OK) << last();
      EXPECT_EQ(has, 0);
    }
    // The capture.
    ASSERT_EQ(aar_gqa_pcp_builder_build_for_graph_capture(b, &cin, AAR_STATE_SPEC_DECODING, &md), AAR_OK) << last();
    ASSERT_EQ(aar_gqa_pcp_metadata_get_info(md, &info), AAR_OK) << last();
    EXPECT_EQ(info.attn_state, AAR_STATE_SPEC_DECODING);
    ASSERT_EQ(info.num_local_tokens, kBucket);
    ASSERT_EQ(aar_graph_begin_capture(g, kBucket), AAR_OK) << last();
    ASSERT_EQ(aar_gqa_pcp_impl_forward(layer, dqs.get(), dks.get(), dvs.get(), dkc.get(), dvc.get(), md, douts.get()),
              AAR_OK)
        << last();
    ASSERT_EQ(aar_graph_end_capture(g), AAR_OK) << last();

    // Replays: a speculative step (3 + 2 tokens) and a one-token step, each built padded to
    // the bucket, updated and replayed.
    const std::vector<std::vector<int32_t>> qlens = {{3, 2}, {1, 1}};
    for (const auto& ql : qlens) {
      PcpStep s(ql, hist, false);
      s.num_input_tokens = kBucket;
      const aar_gqa_pcp_build_inputs_t in = s.in();
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
      size_t n = 0;
      std::vector<int32_t> idx(kBucket);
      ASSERT_EQ(aar_gqa_pcp_builder_local_rows(b, idx.data(), nullptr, idx.size(), &n), AAR_OK) << last();
      ASSERT_EQ(n, static_cast<size_t>(kBucket));
      const int64_t T = s.qsl.back();
      const at::Tensor q = at::randn({T, kH, kD}), k = at::randn({T, kHkv, kD}), v = at::randn({T, kHkv, kD});
      qs.zero_(), ks.zero_(), vs.zero_(), outs.fill_(NAN);
      for (int64_t i = 0; i < kBucket; ++i) {
        if (idx[i] < 0) continue;
        qs[i].copy_(q[idx[i]]), ks[i].copy_(k[idx[i]]), vs[i].copy_(v[idx[i]]);
      }
      ASSERT_EQ(aar_graph_update_gqa_pcp(g, kBucket, md), AAR_OK) << last();
      ASSERT_EQ(aar_graph_replay(g, kBucket), AAR_OK) << last();
      for (int r = 0; r < 2; ++r) {
        const int64_t s0 = s.qsl[r], len = s.qsl[r + 1] - s.qsl[r];
        hk[r] = at::cat({hk[r], k.narrow(0, s0, len)});
        hv[r] = at::cat({hv[r], v.narrow(0, s0, len)});
      }
      int64_t real = 0;
      for (int64_t i = 0; i < kBucket; ++i) {
        if (idx[i] < 0) continue;
        ++real;
        const int r = idx[i] >= s.qsl[1] ? 1 : 0;
        const int64_t pos = hist[r] + (idx[i] - s.qsl[r]);
        const at::Tensor ref = attend(q[idx[i]], hk[r].narrow(0, 0, pos + 1), hv[r].narrow(0, 0, pos + 1));
        EXPECT_LT((outs[i].to(at::kDouble) - ref).abs().max().item<double>(), 1e-5)
            << "replay of " << ql[0] << "+" << ql[1] << " tokens, global token " << idx[i];
      }
      EXPECT_EQ(real, T);  // every token of the step is a row of this rank (decodes are replicated)
      for (int r = 0; r < 2; ++r) hist[r] += ql[r];
    }

    // What the update refuses, by name.
    EXPECT_REJECTED(aar_graph_update_gqa_pcp(g, kBucket, nullptr), AAR_ERR_INVALID_ARGUMENT,
                    "metadata is NULL, expected an aar_gqa_pcp_metadata_t");
    EXPECT_REJECTED(aar_graph_update_gqa_pcp(nullptr, kBucket, md), AAR_ERR_INVALID_ARGUMENT,
                    "graph is NULL, expected an aar_graph_params_t");
    aar_gqa_dcp_builder_t* db = dcp_builder(1, 0);
    EXPECT_REJECTED(aar_graph_update_gqa_pcp(g, kBucket, reinterpret_cast<const aar_gqa_pcp_metadata_t*>(db)),
                    AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_dcp_builder_t, expected an aar_gqa_pcp_metadata_t");
    aar_gqa_dcp_builder_destroy(db);
    {
      PcpStep pre({1, 9}, hist, false);
      pre.pref = {0, 1};
      const aar_gqa_pcp_build_inputs_t in = pre.in();
      ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
      EXPECT_REJECTED(aar_graph_update_gqa_pcp(g, kBucket, md), AAR_ERR_INVALID_ARGUMENT,
                      "cannot update a captured bucket");
    }
    aar_graph_params_destroy(g);
    aar_gqa_pcp_builder_destroy(b);
    aar_gqa_pcp_impl_destroy(layer);
  }
}

// One-rank groups: DCP and PCP layers compute the plain attention (float64 reference), and a
// layer keeps its communicator alive after the handle is destroyed.
TEST(CApiCp, OneRankLayersMatchTheReference) {
  aar_cp_comm_t* comm = tcp_world1();
  ASSERT_NE(comm, nullptr);
  const aar_gqa_impl_config_t ic = impl_config();
  aar_gqa_dcp_impl_t* dcp = nullptr;
  aar_gqa_pcp_impl_t* pcp = nullptr;
  ASSERT_EQ(aar_gqa_dcp_impl_create(&ic, comm, &dcp), AAR_OK) << last();
  ASSERT_EQ(aar_gqa_pcp_impl_create(&ic, comm, nullptr, &pcp), AAR_OK) << last();
  aar_cp_comm_destroy(comm);  // the layers hold the group
  Tensors t;
  const at::Tensor ref = reference(t.q, t.k, t.v);
  {
    aar_gqa_dcp_builder_t* b = dcp_builder(1, 0);
    const aar_gqa_dcp_build_inputs_t in = dcp_inputs();
    const aar_gqa_dcp_metadata_t* md = nullptr;
    ASSERT_EQ(aar_gqa_dcp_builder_build(b, &in, &md), AAR_OK) << last();
    aar_gqa_dcp_metadata_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_gqa_dcp_metadata_get_info(md, &info), AAR_OK) << last();
    EXPECT_EQ(info.num_prefills, 2);
    EXPECT_EQ(info.num_local_writes, 8);
    EXPECT_EQ(info.dcp_world_size, 1);
    Dl q(t.q), k(t.k), v(t.v), kc(t.kc), vc(t.vc), o(t.out);
    ASSERT_EQ(aar_gqa_dcp_impl_forward(dcp, q.get(), k.get(), v.get(), kc.get(), vc.get(), md, o.get()), AAR_OK)
        << last();
    EXPECT_LT((t.out.to(at::kDouble) - ref).abs().max().item<double>(), 1e-5);
    aar_gqa_dcp_builder_destroy(b);
  }
  {
    aar_gqa_pcp_builder_t* b = pcp_builder(1, 0);
    const auto in = inputs<aar_gqa_pcp_build_inputs_t>();
    const aar_gqa_pcp_metadata_t* md = nullptr;
    ASSERT_EQ(aar_gqa_pcp_builder_build(b, &in, &md), AAR_OK) << last();
    size_t n = 0;
    ASSERT_EQ(aar_gqa_pcp_builder_local_rows(b, nullptr, nullptr, 0, &n), AAR_OK) << last();
    std::vector<int32_t> idx(n, -7), pos(n, -7);
    int32_t small[1] = {-7};
    size_t m = 0;
    EXPECT_REJECTED(aar_gqa_pcp_builder_local_rows(b, small, nullptr, 1, &m), AAR_ERR_INVALID_ARGUMENT,
                    "capacity=1 is less than the");
    EXPECT_EQ(small[0], -7);
    EXPECT_EQ(m, 0u);
    ASSERT_EQ(aar_gqa_pcp_builder_local_rows(b, idx.data(), pos.data(), n, &m), AAR_OK) << last();
    ASSERT_EQ(m, n);
    const at::Tensor ti = at::from_blob(idx.data(), {static_cast<int64_t>(n)}, at::kInt).to(at::kLong);
    const at::Tensor real = ti.ge(0);
    const at::Tensor rows = ti.masked_select(real);
    EXPECT_EQ(rows.numel(), 8);
    at::Tensor lq = at::zeros({static_cast<int64_t>(n), kH, kD}), lk = at::zeros({static_cast<int64_t>(n), kHkv, kD});
    at::Tensor lv = at::zeros_like(lk), lout = at::full({static_cast<int64_t>(n), kH, kD}, NAN);
    const at::Tensor where = real.nonzero().flatten();
    lq.index_copy_(0, where, t.q.index_select(0, rows));
    lk.index_copy_(0, where, t.k.index_select(0, rows));
    lv.index_copy_(0, where, t.v.index_select(0, rows));
    at::Tensor kc = at::zeros_like(t.kc), vc = at::zeros_like(t.vc);
    Dl q(lq), k(lk), v(lv), dkc(kc), dvc(vc), o(lout);
    ASSERT_EQ(aar_gqa_pcp_impl_forward(pcp, q.get(), k.get(), v.get(), dkc.get(), dvc.get(), md, o.get()), AAR_OK)
        << last();
    const at::Tensor got = lout.index_select(0, where).to(at::kDouble);
    EXPECT_LT((got - ref.index_select(0, rows)).abs().max().item<double>(), 1e-5);
    aar_gqa_pcp_builder_destroy(b);
  }
  aar_gqa_dcp_impl_destroy(dcp);
  aar_gqa_pcp_impl_destroy(pcp);
}

// ---------------------------------------------------------------- MLA DCP (version 6)

// A small MLA layer's configs over tensors the struct owns (no q-LoRA), and the builds of a
// 2-request step (a prefill of 3, a decode at length 2).
struct MlaCp {
  static constexpr int64_t kH = 2, kHidden = 32, kL = 16, kP = 8, kR = 8, kV = 8;
  static constexpr int32_t kB = 16, kNb = 4, kMax = 2;
  MlaCp()
      : cos(at::cos(at::arange(kMax * kB).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMax * kB, kR}).contiguous()),
        sin(at::sin(at::arange(kMax * kB).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMax * kB, kR}).contiguous()),
        q_proj(at::randn({kH * (kP + kR), kHidden}) * 0.3),
        kv_a(at::randn({kL + kR, kHidden}) * 0.3),
        kv_norm(at::ones({kL})),
        kv_b(at::randn({kH * (kP + kV), kL}) * 0.3),
        o_proj(at::randn({kHidden, kH * kV}) * 0.3),
        dcos(cos), dsin(sin), dq(q_proj), dkva(kv_a), dnorm(kv_norm), dkvb(kv_b), dout(o_proj) {
    aar_mla_builder_config_init(&bc);
    bc.max_num_reqs = 2;
    bc.max_num_tokens = 16;
    bc.max_blocks_per_req = kMax;
    bc.block_size = kB;
    bc.num_blocks = kNb;
    bc.cos_table = dcos.get();
    bc.sin_table = dsin.get();
    aar_mla_builder_cp_init(&cp);
    aar_mla_impl_config_init(&ic);
    ic.num_heads = kH;
    ic.hidden_size = kHidden;
    ic.kv_lora_rank = kL;
    ic.qk_nope_head_dim = kP;
    ic.qk_rope_head_dim = kR;
    ic.v_head_dim = kV;
    aar_mla_weights_init(&w);
    w.q_proj = dq.get();
    w.kv_a_proj_with_mqa = dkva.get();
    w.kv_a_layernorm = dnorm.get();
    w.kv_b_proj = dkvb.get();
    w.o_proj = dout.get();
    aar_mla_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 3;
    in.seq_lens = seq;
    in.seq_lens_len = 2;
    in.block_table = table;
    in.block_table_len = 4;
    in.block_table_stride = kMax;
  }
  at::Tensor cos, sin, q_proj, kv_a, kv_norm, kv_b, o_proj;
  Dl dcos, dsin, dq, dkva, dnorm, dkvb, dout;
  aar_mla_builder_config_t bc;
  aar_mla_builder_cp_t cp;
  aar_mla_impl_config_t ic;
  aar_mla_weights_t w;
  aar_mla_build_inputs_t in;
  const int32_t qsl[3] = {0, 1, 4}, seq[2] = {2, 3}, table[4] = {1, 0, 2, 3};
};

TEST(CApiCp, MlaBuilderCpRejectedByName) {
  MlaCp m;
  aar_mla_builder_t* const sentinel = reinterpret_cast<aar_mla_builder_t*>(0x1);
  aar_mla_builder_t* out = sentinel;
  auto bad = [&](auto edit, const char* needle, aar_status_t st = AAR_ERR_INVALID_ARGUMENT) {
    aar_mla_builder_cp_t c = m.cp;
    edit(c);
    EXPECT_REJECTED(aar_mla_builder_create_cp(&m.bc, &c, &out), st, needle);
    EXPECT_EQ(out, sentinel);
  };
  EXPECT_EQ(m.cp.dcp_world_size, 1);
  EXPECT_EQ(m.cp.interleave, 1);
  EXPECT_EQ(m.cp.pcp_world_size, 1);
  bad([](auto& c) { c.dcp_world_size = 0; }, "cp->dcp_world_size must be >= 1, got 0");
  bad([](auto& c) { c.dcp_world_size = 2, c.dcp_rank = 2; }, "cp->dcp_rank=2 is out of range [0, dcp_world_size=2)");
  bad([](auto& c) { c.dcp_rank = -1; }, "cp->dcp_rank=-1");
  bad([](auto& c) { c.interleave = 0; }, "cp->interleave=0 must be >= 1 and divide config->block_size=16");
  bad([](auto& c) { c.interleave = 5; }, "cp->interleave=5");
  bad([](auto& c) { c.pd_recompute_scheduler = 2; }, "cp->pd_recompute_scheduler");
  bad([](auto& c) { c.pcp_world_size = 0; }, "cp->pcp_world_size must be >= 1, got 0");
  bad([](auto& c) { c.pcp_world_size = 2, c.pcp_rank = 3; }, "cp->pcp_rank=3 is out of range [0, pcp_world_size=2)");
  bad([](auto& c) { c.struct_size = 8; }, "cp->struct_size is 8");
  EXPECT_REJECTED(aar_mla_builder_create_cp(&m.bc, nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "cp is NULL");
  EXPECT_REJECTED(aar_mla_builder_create_cp(nullptr, &m.cp, &out), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  EXPECT_REJECTED(aar_mla_builder_create_cp(&m.bc, &m.cp, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  aar_mla_builder_config_t bc = m.bc;
  bc.cos_table = nullptr;
  EXPECT_REJECTED(aar_mla_builder_create_cp(&bc, &m.cp, &out), AAR_ERR_INVALID_ARGUMENT, "config->cos_table");
  EXPECT_EQ(out, sentinel);
  // A DCP rank's build: its view of the step (rank 1 of 2 owns the odd tokens).
  aar_mla_builder_cp_t c = m.cp;
  c.dcp_world_size = 2;
  c.dcp_rank = 1;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c, &out), AAR_OK) << last();
  const aar_mla_metadata_t* md = nullptr;
  ASSERT_EQ(aar_mla_builder_build(out, &m.in, &md), AAR_OK) << last();
  aar_mla_metadata_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_mla_metadata_get_info(md, &info), AAR_OK) << last();
  EXPECT_EQ(info.num_decodes, 1);
  EXPECT_EQ(info.num_prefills, 1);
  size_t count = 99;
  ASSERT_EQ(aar_mla_builder_pcp_local_rows(out, nullptr, 0, &count), AAR_OK) << last();
  EXPECT_EQ(count, 0u);  // no PCP: no local rows
  aar_mla_builder_destroy(out);
  // A PCP rank's build: the global step, this rank's rows through aar_mla_builder_pcp_local_rows.
  c = m.cp;
  c.pcp_world_size = 2;
  c.pcp_rank = 1;
  out = sentinel;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c, &out), AAR_OK) << last();
  ASSERT_EQ(aar_mla_builder_build(out, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_builder_pcp_local_rows(out, nullptr, 0, &count), AAR_OK) << last();
  ASSERT_GE(count, 2u);  // the decode and at least one prefill row
  std::vector<int32_t> idx(count, -7);
  size_t got = 0;
  EXPECT_REJECTED(aar_mla_builder_pcp_local_rows(out, idx.data(), count - 1, &got), AAR_ERR_INVALID_ARGUMENT,
                  "capacity=" + std::to_string(count - 1) + " is less than the " + std::to_string(count));
  EXPECT_EQ(idx, std::vector<int32_t>(count, -7));
  EXPECT_EQ(got, 0u);
  EXPECT_REJECTED(aar_mla_builder_pcp_local_rows(out, idx.data(), count, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "count is NULL");
  EXPECT_REJECTED(aar_mla_builder_pcp_local_rows(nullptr, idx.data(), count, &got), AAR_ERR_INVALID_ARGUMENT,
                  "builder is NULL");
  ASSERT_EQ(aar_mla_builder_pcp_local_rows(out, idx.data(), count, &got), AAR_OK) << last();
  EXPECT_EQ(got, count);
  EXPECT_EQ(idx[0], 0);  // the decode (token 0) on every rank
  for (size_t i = 1; i < count; ++i) EXPECT_TRUE(idx[i] == -1 || (idx[i] >= 1 && idx[i] < 4)) << idx[i];
  aar_mla_builder_destroy(out);
}

TEST(CApiCp, MlaImplCreateCpRejectedByName) {
  MlaCp m;
  aar_cp_comm_t* comm = tcp_world1();
  ASSERT_NE(comm, nullptr);
  aar_mla_impl_t* const sentinel = reinterpret_cast<aar_mla_impl_t*>(0x1);
  aar_mla_impl_t* out = sentinel;
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, &m.w, nullptr, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "dcp_comm and pcp_comm are both NULL");
  aar_mla_builder_t* b = nullptr;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &m.cp, &b), AAR_OK) << last();
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, &m.w, reinterpret_cast<aar_cp_comm_t*>(b), nullptr, &out),
                  AAR_ERR_INVALID_ARGUMENT, "dcp_comm is an aar_mla_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, &m.w, comm, reinterpret_cast<aar_cp_comm_t*>(b), &out),
                  AAR_ERR_INVALID_ARGUMENT, "pcp_comm is an aar_mla_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, &m.w, comm, nullptr, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "out is NULL");
  EXPECT_REJECTED(aar_mla_impl_create_cp(nullptr, &m.w, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "config is NULL");
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, nullptr, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "weights is NULL");
  aar_mla_weights_t w = m.w;
  w.kv_b_proj = nullptr;
  EXPECT_REJECTED(aar_mla_impl_create_cp(&m.ic, &w, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "weights->kv_b_proj");
  // NZ caches with a group of more than one rank (DCP reads ND caches).
  auto pg = register_group("aar_c_api_mla_cp_nz", 0, 2);
  aar_cp_comm_t* two = comm_from("aar_c_api_mla_cp_nz");
  ASSERT_NE(two, nullptr);
  aar_mla_impl_config_t ic = m.ic;
  ic.enable_kv_nz = 1;
  EXPECT_REJECTED(aar_mla_impl_create_cp(&ic, &m.w, two, nullptr, &out), AAR_ERR_NOT_SUPPORTED,
                  "enable_kv_nz with DCP");
  EXPECT_EQ(out, sentinel);
  aar_mla_builder_destroy(b);
  aar_cp_comm_destroy(comm);
  aar_cp_comm_destroy(two);
  c10d::unregister_process_group("aar_c_api_mla_cp_nz");
}

// DCP and PCP layers refuse metadata of another group (or of a group they lack) before any
// collective (IdleBackend has none), with the caches and the output untouched; a one-rank DCP layer (a 1-rank gloo group, kept
// alive by the layer after its handle is destroyed) matches the single-rank layer.
TEST(CApiCp, MlaCpLayersCheckTheMetadataAndOneRankMatches) {
  MlaCp m;
  auto pg = register_group("aar_c_api_mla_cp_mismatch", 1, 2);
  aar_cp_comm_t* two = comm_from("aar_c_api_mla_cp_mismatch");
  aar_cp_comm_t* one = tcp_world1();
  ASSERT_NE(two, nullptr);
  ASSERT_NE(one, nullptr);
  at::Tensor nope = at::zeros({MlaCp::kNb, MlaCp::kB, 1, MlaCp::kL}), rope = at::zeros({MlaCp::kNb, MlaCp::kB, 1, MlaCp::kR});
  at::Tensor hidden = at::randn({4, MlaCp::kHidden}), out = at::full({4, MlaCp::kHidden}, 7.0f);
  Dl dn(nope), dr(rope), dh(hidden), dout(out);
  aar_mla_impl_t* layer = nullptr;
  ASSERT_EQ(aar_mla_impl_create_cp(&m.ic, &m.w, two, nullptr, &layer), AAR_OK) << last();
  aar_mla_builder_cp_t c0 = m.cp;
  c0.dcp_world_size = 2;
  aar_mla_builder_t *b0 = nullptr, *b1 = nullptr;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c0, &b0), AAR_OK) << last();
  ASSERT_EQ(aar_mla_builder_create(&m.bc, &b1), AAR_OK) << last();
  const aar_mla_metadata_t* md = nullptr;
  ASSERT_EQ(aar_mla_builder_build(b0, &m.in, &md), AAR_OK) << last();
  EXPECT_REJECTED(aar_mla_impl_forward(layer, dh.get(), dn.get(), dr.get(), md, dout.get()), AAR_ERR_INVALID_ARGUMENT,
                  "metadata was built for DCP rank 0 of 2 but the layer's dcp_comm is rank 1 of 2");
  ASSERT_EQ(aar_mla_builder_build(b1, &m.in, &md), AAR_OK) << last();
  EXPECT_REJECTED(aar_mla_impl_forward(layer, dh.get(), dn.get(), dr.get(), md, dout.get()), AAR_ERR_INVALID_ARGUMENT,
                  "the layer's dcp_comm has 2 ranks but the metadata was built without DCP");
  EXPECT_TRUE(at::equal(out, at::full_like(out, 7.0f)));
  EXPECT_FALSE(nope.any().item<bool>());
  EXPECT_FALSE(rope.any().item<bool>());
  aar_mla_impl_destroy(layer);
  aar_mla_builder_destroy(b0);
  {  // PCP: metadata of PCP rank 0 of 2 on the group's rank 1, and PCP metadata on a DCP-only layer.
    aar_mla_impl_t *pl = nullptr, *dl = nullptr;
    ASSERT_EQ(aar_mla_impl_create_cp(&m.ic, &m.w, nullptr, two, &pl), AAR_OK) << last();
    ASSERT_EQ(aar_mla_impl_create_cp(&m.ic, &m.w, one, nullptr, &dl), AAR_OK) << last();
    aar_mla_builder_cp_t cp = m.cp;
    cp.pcp_world_size = 2;
    aar_mla_builder_t* bp = nullptr;
    ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &cp, &bp), AAR_OK) << last();
    ASSERT_EQ(aar_mla_builder_build(bp, &m.in, &md), AAR_OK) << last();
    size_t n = 0;
    ASSERT_EQ(aar_mla_builder_pcp_local_rows(bp, nullptr, 0, &n), AAR_OK) << last();
    at::Tensor lh = at::randn({static_cast<int64_t>(n), MlaCp::kHidden});
    at::Tensor lo = at::full({static_cast<int64_t>(n), MlaCp::kHidden}, 7.0f);
    Dl dlh(lh), dlo(lo);
    EXPECT_REJECTED(aar_mla_impl_forward(pl, dlh.get(), dn.get(), dr.get(), md, dlo.get()), AAR_ERR_INVALID_ARGUMENT,
                    "metadata was built for PCP rank 0 of 2 but the layer's pcp_comm is rank 1 of 2");
    EXPECT_REJECTED(aar_mla_impl_forward(dl, dlh.get(), dn.get(), dr.get(), md, dlo.get()), AAR_ERR_INVALID_ARGUMENT,
                    "metadata was built for PCP rank 0 of 2 but the layer has no pcp_comm");
    EXPECT_TRUE(at::equal(lo, at::full_like(lo, 7.0f)));
    EXPECT_FALSE(nope.any().item<bool>());
    aar_mla_builder_destroy(bp);
    aar_mla_impl_destroy(pl);
    aar_mla_impl_destroy(dl);
  }

  // One rank: the DCP layer over a 1-rank group against the plain layer, same weights and step.
  aar_mla_impl_t *dcp = nullptr, *plain = nullptr;
  ASSERT_EQ(aar_mla_impl_create_cp(&m.ic, &m.w, one, nullptr, &dcp), AAR_OK) << last();
  aar_cp_comm_destroy(one);  // the layer keeps its Comm
  ASSERT_EQ(aar_mla_impl_create(&m.ic, &m.w, &plain), AAR_OK) << last();
  aar_mla_builder_t* bd = nullptr;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &m.cp, &bd), AAR_OK) << last();
  at::Tensor nope2 = at::zeros_like(nope), rope2 = at::zeros_like(rope), out2 = at::zeros_like(out);
  Dl dn2(nope2), dr2(rope2), dout2(out2);
  ASSERT_EQ(aar_mla_builder_build(bd, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_impl_forward(dcp, dh.get(), dn.get(), dr.get(), md, dout.get()), AAR_OK) << last();
  ASSERT_EQ(aar_mla_builder_build(b1, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_impl_forward(plain, dh.get(), dn2.get(), dr2.get(), md, dout2.get()), AAR_OK) << last();
  EXPECT_TRUE(at::allclose(out, out2, 1e-5, 1e-5)) << (out - out2).abs().max().item<float>();
  EXPECT_TRUE(at::equal(nope, nope2));
  aar_mla_impl_destroy(dcp);
  aar_mla_impl_destroy(plain);
  aar_mla_builder_destroy(bd);
  aar_mla_builder_destroy(b1);
  aar_cp_comm_destroy(two);
  c10d::unregister_process_group("aar_c_api_mla_cp_mismatch");
}

}  // namespace

// ---------------------------------------------------------------- MLA build inputs ext (version 7)

namespace {

aar_mla_metadata_info_t mla_info(const aar_mla_metadata_t* md) {
  aar_mla_metadata_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_EQ(aar_mla_metadata_get_info(md, &info), AAR_OK) << last();
  return info;
}

// The C++ builder's counts for the same config and step (the C layer converts and forwards).
void expect_same_counts(const aar_mla_metadata_info_t& c, const aar::mla::Metadata& cpp) {
  EXPECT_EQ(c.num_reqs, cpp.num_reqs);
  EXPECT_EQ(c.num_decodes, cpp.num_decodes);
  EXPECT_EQ(c.num_prefills, cpp.num_prefills);
  EXPECT_EQ(c.num_decode_tokens, cpp.num_decode_tokens);
  EXPECT_EQ(c.num_prefill_tokens, cpp.num_prefill_tokens);
  EXPECT_EQ(c.attn_state, static_cast<aar_attn_state_t>(static_cast<int32_t>(cpp.attn_state)));
}

aar::mla::BuilderConfig cpp_mla_config(const MlaCp& m, int32_t dcp_world, int32_t dcp_rank) {
  aar::mla::BuilderConfig b;
  b.max_num_reqs = m.bc.max_num_reqs;
  b.max_num_tokens = m.bc.max_num_tokens;
  b.max_blocks_per_req = m.bc.max_blocks_per_req;
  b.block_size = m.bc.block_size;
  b.num_blocks = m.bc.num_blocks;
  b.cos_table = m.cos;
  b.sin_table = m.sin;
  b.dcp_world_size = dcp_world;
  b.dcp_rank = dcp_rank;
  return b;
}

}  // namespace

TEST(CApiCp, MlaBuildExtRejectedByName) {
  MlaCp m;
  aar_mla_build_inputs_ext_t ext;
  aar_mla_build_inputs_ext_init(&ext);
  EXPECT_EQ(ext.draft_step, -1);
  EXPECT_EQ(ext.is_prefilling, nullptr);
  EXPECT_EQ(ext.is_prefilling_len, 0u);
  aar_mla_builder_t *single = nullptr, *dcp = nullptr, *pd = nullptr;
  ASSERT_EQ(aar_mla_builder_create(&m.bc, &single), AAR_OK) << last();
  aar_mla_builder_cp_t c = m.cp;
  c.dcp_world_size = 2;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c, &dcp), AAR_OK) << last();
  c.pd_recompute_scheduler = 1;
  ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c, &pd), AAR_OK) << last();
  const aar_mla_metadata_t* md = nullptr;
  ASSERT_EQ(aar_mla_builder_build_ext(dcp, &m.in, &ext, &md), AAR_OK) << last();  // the defaults: build()
  const uint64_t gen = mla_info(md).generation;
  const aar_mla_metadata_t* const sentinel = reinterpret_cast<const aar_mla_metadata_t*>(0x1);
  const aar_mla_metadata_t* out = sentinel;
  const uint8_t flags[3] = {0, 1, 0};
  auto bad = [&](aar_mla_builder_t* b, auto edit, const char* needle) {
    aar_mla_build_inputs_ext_t e = ext;
    edit(e);
    EXPECT_REJECTED(aar_mla_builder_build_ext(b, &m.in, &e, &out), AAR_ERR_INVALID_ARGUMENT, needle);
    EXPECT_EQ(out, sentinel);
    EXPECT_EQ(mla_info(md).generation, gen);  // nothing built: the previous metadata stands
  };
  bad(dcp, [](auto& e) { e.struct_size = 4; }, "ext->struct_size is 4");
  bad(dcp, [](auto& e) { e.draft_step = -2; }, "ext->draft_step must be -1 (a normal step) or a draft step >= 0, got -2");
  bad(dcp, [](auto& e) { e.is_prefilling_len = 2; }, "ext->is_prefilling is NULL with length 2");
  bad(dcp, [&](auto& e) { e.is_prefilling = flags, e.is_prefilling_len = 3; },
      "ext->is_prefilling_len=3 must equal inputs->seq_lens_len=2");
  bad(single, [&](auto& e) { e.is_prefilling = flags, e.is_prefilling_len = 2; },
      "ext->is_prefilling was given, but a builder without DCP or PCP does not read it");
  bad(pd, [&](auto& e) { e.is_prefilling = flags, e.is_prefilling_len = 2; },
      "a builder with cp->pd_recompute_scheduler does not read it");
  bad(dcp, [&](auto& e) { e.is_prefilling = flags, e.is_prefilling_len = 2, e.draft_step = 0; },
      "ext->is_prefilling was given with ext->draft_step=0");
  // The C++ builder's own checks of a draft step: its range, one query token per request.
  bad(dcp, [](auto& e) { e.draft_step = 16; }, "draft_step=16 is out of range");
  bad(dcp, [](auto& e) { e.draft_step = 0; }, "a draft step (draft_step=0");
  EXPECT_REJECTED(aar_mla_builder_build_ext(dcp, &m.in, nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "ext is NULL");
  EXPECT_REJECTED(aar_mla_builder_build_ext(dcp, &m.in, &ext, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_REJECTED(aar_mla_builder_build_ext(nullptr, &m.in, &ext, &out), AAR_ERR_INVALID_ARGUMENT, "builder is NULL");
  EXPECT_REJECTED(aar_mla_builder_build_ext(dcp, nullptr, &ext, &out), AAR_ERR_INVALID_ARGUMENT, "inputs is NULL");
  EXPECT_EQ(out, sentinel);
  aar_mla_builder_destroy(single);
  aar_mla_builder_destroy(dcp);
  aar_mla_builder_destroy(pd);
}

// is_prefilling under DCP: a short last chunk of a longer prompt is a decode by the lengths rule
// and a prefill with the engine's flag, as in the C++ builder given the same flags; a draft step
// is all decodes with the C++ builder's counts, and on one rank its forward is the forward of the
// decode step of the same lengths.
TEST(CApiCp, MlaBuildExtIsPrefillingAndDraftStepMatchTheCppBuilder) {
  MlaCp m;
  // Request 0: a decode at length 2; request 1: the 1-token last chunk of a 5-token prompt.
  const int32_t qsl[3] = {0, 1, 2}, seq[2] = {2, 5};
  aar_mla_build_inputs_t in = m.in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  const uint8_t flags[2] = {0, 1};
  for (int32_t rank = 0; rank < 2; ++rank) {
    aar_mla_builder_cp_t c = m.cp;
    c.dcp_world_size = 2;
    c.dcp_rank = rank;
    aar_mla_builder_t* b = nullptr;
    ASSERT_EQ(aar_mla_builder_create_cp(&m.bc, &c, &b), AAR_OK) << last();
    aar::mla::MetadataBuilder cpp(cpp_mla_config(m, 2, rank));
    aar::mla::BuildInputs ci;
    ci.query_start_loc = aar::plan::CSpan<int32_t>(qsl, 3);
    ci.seq_lens = aar::plan::CSpan<int32_t>(seq, 2);
    ci.block_table = aar::plan::CSpan<int32_t>(m.table, 4);
    ci.block_table_stride = MlaCp::kMax;

    const aar_mla_metadata_t* md = nullptr;
    ASSERT_EQ(aar_mla_builder_build(b, &in, &md), AAR_OK) << last();
    aar_mla_metadata_info_t info = mla_info(md);
    EXPECT_EQ(info.num_decodes, 2);
    EXPECT_EQ(info.num_prefills, 0);
    expect_same_counts(info, cpp.build(ci));

    aar_mla_build_inputs_ext_t ext;
    aar_mla_build_inputs_ext_init(&ext);
    ext.is_prefilling = flags;
    ext.is_prefilling_len = 2;
    ASSERT_EQ(aar_mla_builder_build_ext(b, &in, &ext, &md), AAR_OK) << last();
    info = mla_info(md);
    EXPECT_EQ(info.num_decodes, 1);
    EXPECT_EQ(info.num_prefills, 1);
    EXPECT_EQ(info.num_prefill_tokens, 1);
    ci.is_prefilling = aar::plan::CSpan<uint8_t>(flags, 2);
    expect_same_counts(info, cpp.build(ci));

    // Draft step 2 over base lengths {2, 5}: lengths 5 and 8, both decodes.
    aar_mla_build_inputs_ext_init(&ext);
    ext.draft_step = 2;
    ASSERT_EQ(aar_mla_builder_build_ext(b, &in, &ext, &md), AAR_OK) << last();
    info = mla_info(md);
    EXPECT_EQ(info.num_decodes, 2);
    EXPECT_EQ(info.num_prefills, 0);
    ci.is_prefilling = {};
    ci.draft_step = 2;
    const aar::mla::Metadata& cmd = cpp.build(ci);
    expect_same_counts(info, cmd);
    EXPECT_EQ(cmd.draft_step, 2);
    aar_mla_builder_destroy(b);
  }

  // One rank: the draft step's forward is the forward of a decode step at lengths base + d + 1.
  aar_mla_builder_t *bd = nullptr, *bn = nullptr;
  ASSERT_EQ(aar_mla_builder_create(&m.bc, &bd), AAR_OK) << last();
  ASSERT_EQ(aar_mla_builder_create(&m.bc, &bn), AAR_OK) << last();
  aar_mla_impl_t* layer = nullptr;
  ASSERT_EQ(aar_mla_impl_create(&m.ic, &m.w, &layer), AAR_OK) << last();
  at::Tensor nope = at::randn({MlaCp::kNb, MlaCp::kB, 1, MlaCp::kL}),
             rope = at::randn({MlaCp::kNb, MlaCp::kB, 1, MlaCp::kR});
  at::Tensor nope2 = nope.clone(), rope2 = rope.clone();
  at::Tensor hidden = at::randn({2, MlaCp::kHidden}), out = at::zeros({2, MlaCp::kHidden}),
             out2 = at::ones({2, MlaCp::kHidden});
  Dl dn(nope), dr(rope), dn2(nope2), dr2(rope2), dh(hidden), dout(out), dout2(out2);
  aar_mla_build_inputs_ext_t ext;
  aar_mla_build_inputs_ext_init(&ext);
  ext.draft_step = 1;
  const aar_mla_metadata_t* md = nullptr;
  ASSERT_EQ(aar_mla_builder_build_ext(bd, &in, &ext, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_impl_forward(layer, dh.get(), dn.get(), dr.get(), md, dout.get()), AAR_OK) << last();
  const int32_t seq_d[2] = {4, 7};
  aar_mla_build_inputs_t in_d = in;
  in_d.seq_lens = seq_d;
  ASSERT_EQ(aar_mla_builder_build(bn, &in_d, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_impl_forward(layer, dh.get(), dn2.get(), dr2.get(), md, dout2.get()), AAR_OK) << last();
  EXPECT_TRUE(at::equal(out, out2)) << (out - out2).abs().max().item<float>();
  EXPECT_TRUE(at::equal(nope, nope2));
  EXPECT_TRUE(at::equal(rope, rope2));
  aar_mla_impl_destroy(layer);
  aar_mla_builder_destroy(bd);
  aar_mla_builder_destroy(bn);
}

// ---------------------------------------------------------------- SFA DCP / PCP (version 7)

namespace {

// A small SFA layer (no q-LoRA, an indexer keeping every causal key) over tensors the struct
// owns, and the builds of a 2-request step (a decode at length 2, a prefill of 3).
struct SfaCp {
  static constexpr int64_t kH = 2, kHidden = 32, kL = 16, kP = 8, kR = 8, kV = 8, kNi = 2, kDi = 16, kTopk = 32;
  static constexpr int32_t kB = 16, kNb = 4, kMax = 2;
  SfaCp()
      : cos(at::cos(at::arange(kMax * kB).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMax * kB, kR}).contiguous()),
        sin(at::sin(at::arange(kMax * kB).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMax * kB, kR}).contiguous()),
        q_proj(at::randn({kH * (kP + kR), kHidden}) * 0.3),
        kv_a(at::randn({kL + kR, kHidden}) * 0.3),
        kv_norm(at::ones({kL})),
        kv_b(at::randn({kH * (kP + kV), kL}) * 0.3),
        o_proj(at::randn({kHidden, kH * kV}) * 0.3),
        wq_b(at::randn({kNi * kDi, kHidden}) * 0.3),
        wk(at::randn({kDi, kHidden}) * 0.3),
        proj(at::randn({kNi, kHidden}) * 0.3),
        nw(at::ones({kDi})),
        nb(at::zeros({kDi})),
        dcos(cos), dsin(sin), dq(q_proj), dkva(kv_a), dnorm(kv_norm), dkvb(kv_b), dout(o_proj), dwq(wq_b), dwk(wk),
        dproj(proj), dnw(nw), dnb(nb) {
    aar_sfa_builder_config_init(&bc);
    bc.max_num_reqs = 2;
    bc.max_num_tokens = 16;
    bc.max_blocks_per_req = kMax;
    bc.block_size = kB;
    bc.num_blocks = kNb;
    bc.cos_table = dcos.get();
    bc.sin_table = dsin.get();
    aar_sfa_builder_cp_init(&cp);
    aar_sfa_impl_config_init(&ic);
    ic.num_heads = kH;
    ic.hidden_size = kHidden;
    ic.kv_lora_rank = kL;
    ic.qk_nope_head_dim = kP;
    ic.qk_rope_head_dim = kR;
    ic.v_head_dim = kV;
    ic.index_n_heads = kNi;
    ic.index_head_dim = kDi;
    ic.index_topk = kTopk;
    aar_mla_weights_init(&w);
    w.q_proj = dq.get();
    w.kv_a_proj_with_mqa = dkva.get();
    w.kv_a_layernorm = dnorm.get();
    w.kv_b_proj = dkvb.get();
    w.o_proj = dout.get();
    aar_sfa_indexer_weights_init(&iw);
    iw.wq_b = dwq.get();
    iw.wk = dwk.get();
    iw.weights_proj = dproj.get();
    iw.k_norm_weight = dnw.get();
    iw.k_norm_bias = dnb.get();
    aar_sfa_build_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 3;
    in.seq_lens = seq;
    in.seq_lens_len = 2;
    in.block_table = table;
    in.block_table_len = 4;
    in.block_table_stride = kMax;
  }
  // The layer's cache tuple (nope, rope, index_k); the indexer cache has `replicas` times the blocks.
  struct Caches {
    explicit Caches(int64_t replicas)
        : nope(at::zeros({kNb, kB, 1, kL})), rope(at::zeros({kNb, kB, 1, kR})),
          index(at::zeros({kNb * replicas, kB, 1, kDi})), dn(nope), dr(rope), di(index) {}
    bool untouched() const { return !nope.any().item<bool>() && !rope.any().item<bool>() && !index.any().item<bool>(); }
    at::Tensor nope, rope, index;
    Dl dn, dr, di;
    const DLManagedTensor* tuple[3] = {dn.get(), dr.get(), di.get()};
  };
  at::Tensor cos, sin, q_proj, kv_a, kv_norm, kv_b, o_proj, wq_b, wk, proj, nw, nb;
  Dl dcos, dsin, dq, dkva, dnorm, dkvb, dout, dwq, dwk, dproj, dnw, dnb;
  aar_sfa_builder_config_t bc;
  aar_sfa_builder_cp_t cp;
  aar_sfa_impl_config_t ic;
  aar_mla_weights_t w;
  aar_sfa_indexer_weights_t iw;
  aar_sfa_build_inputs_t in;
  const int32_t qsl[3] = {0, 1, 4}, seq[2] = {2, 3}, table[4] = {1, 0, 2, 3};
};

aar_sfa_metadata_info_t sfa_info(const aar_sfa_metadata_t* md) {
  aar_sfa_metadata_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_EQ(aar_sfa_metadata_get_info(md, &info), AAR_OK) << last();
  return info;
}

}  // namespace

TEST(CApiCp, SfaBuilderCpRejectedByName) {
  SfaCp m;
  aar_sfa_builder_t* const sentinel = reinterpret_cast<aar_sfa_builder_t*>(0x1);
  aar_sfa_builder_t* out = sentinel;
  auto bad = [&](auto edit, const char* needle, aar_status_t st = AAR_ERR_INVALID_ARGUMENT) {
    aar_sfa_builder_cp_t c = m.cp;
    edit(c);
    EXPECT_REJECTED(aar_sfa_builder_create_cp(&m.bc, &c, &out), st, needle);
    EXPECT_EQ(out, sentinel);
  };
  EXPECT_EQ(m.cp.dcp_world_size, 1);
  EXPECT_EQ(m.cp.dcp_rank, 0);
  EXPECT_EQ(m.cp.interleave, 1);
  EXPECT_EQ(m.cp.pcp_world_size, 1);
  EXPECT_EQ(m.cp.pcp_rank, 0);
  bad([](auto& c) { c.dcp_world_size = 0; }, "cp->dcp_world_size must be >= 1, got 0");
  bad([](auto& c) { c.dcp_world_size = 2, c.dcp_rank = 2; }, "cp->dcp_rank=2 is out of range [0, dcp_world_size=2)");
  bad([](auto& c) { c.dcp_rank = -1; }, "cp->dcp_rank=-1");
  bad([](auto& c) { c.interleave = 0; }, "cp->interleave=0 must be >= 1 and divide config->block_size=16");
  bad([](auto& c) { c.interleave = 3; }, "cp->interleave=3");
  bad([](auto& c) { c.pcp_world_size = 0; }, "cp->pcp_world_size must be >= 1, got 0");
  bad([](auto& c) { c.pcp_world_size = 2, c.pcp_rank = 2; }, "cp->pcp_rank=2 is out of range [0, pcp_world_size=2)");
  bad([](auto& c) { c.pcp_world_size = 17; }, "pcp_world_size in [1, 16]");  // the C++ builder's check
  bad([](auto& c) { c.struct_size = 8; }, "cp->struct_size is 8");
  EXPECT_REJECTED(aar_sfa_builder_create_cp(&m.bc, nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "cp is NULL");
  EXPECT_REJECTED(aar_sfa_builder_create_cp(nullptr, &m.cp, &out), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  EXPECT_REJECTED(aar_sfa_builder_create_cp(&m.bc, &m.cp, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  aar_sfa_builder_config_t bc = m.bc;
  bc.cos_table = nullptr;
  EXPECT_REJECTED(aar_sfa_builder_create_cp(&bc, &m.cp, &out), AAR_ERR_INVALID_ARGUMENT, "config->cos_table");
  bad([](auto& c) { c.pcp_world_size = 8, c.dcp_world_size = 4; }, "pcp_world_size * dcp_world_size = 32 exceeds 16");
  EXPECT_EQ(out, sentinel);
  aar_sfa_builder_cp_t c = m.cp;

  // A DCP rank's build: the lengths rule splits the step (the decode, the fresh prefill).
  c = m.cp;
  c.dcp_world_size = 2;
  c.dcp_rank = 1;
  ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &c, &out), AAR_OK) << last();
  const aar_sfa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_sfa_builder_build(out, &m.in, &md), AAR_OK) << last();
  aar_sfa_metadata_info_t info = sfa_info(md);
  EXPECT_EQ(info.num_decodes, 1);
  EXPECT_EQ(info.num_prefills, 1);
  size_t count = 99;
  ASSERT_EQ(aar_sfa_builder_pcp_local_rows(out, nullptr, 0, &count), AAR_OK) << last();
  EXPECT_EQ(count, 0u);  // no PCP: no local rows
  aar_sfa_builder_destroy(out);

  // A PCP rank's build: the global step, this rank's rows through aar_sfa_builder_pcp_local_rows.
  c = m.cp;
  c.pcp_world_size = 2;
  c.pcp_rank = 1;
  out = sentinel;
  ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &c, &out), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_builder_build(out, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_builder_pcp_local_rows(out, nullptr, 0, &count), AAR_OK) << last();
  ASSERT_GE(count, 2u);  // the decode and at least one prefill row
  std::vector<int32_t> idx(count, -7);
  size_t got = 0;
  EXPECT_REJECTED(aar_sfa_builder_pcp_local_rows(out, idx.data(), count - 1, &got), AAR_ERR_INVALID_ARGUMENT,
                  "capacity=" + std::to_string(count - 1) + " is less than the " + std::to_string(count));
  EXPECT_EQ(idx, std::vector<int32_t>(count, -7));
  EXPECT_EQ(got, 0u);
  EXPECT_REJECTED(aar_sfa_builder_pcp_local_rows(out, idx.data(), count, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "count is NULL");
  EXPECT_REJECTED(aar_sfa_builder_pcp_local_rows(nullptr, idx.data(), count, &got), AAR_ERR_INVALID_ARGUMENT,
                  "builder is NULL");
  ASSERT_EQ(aar_sfa_builder_pcp_local_rows(out, idx.data(), count, &got), AAR_OK) << last();
  EXPECT_EQ(got, count);
  EXPECT_EQ(idx[0], 0);  // the decode (token 0) on every rank
  for (size_t i = 1; i < count; ++i) EXPECT_TRUE(idx[i] == -1 || (idx[i] >= 1 && idx[i] < 4)) << idx[i];
  aar_sfa_builder_destroy(out);
}

TEST(CApiCp, SfaImplCreateCpRejectedByName) {
  SfaCp m;
  aar_cp_comm_t* comm = tcp_world1();
  ASSERT_NE(comm, nullptr);
  aar_sfa_impl_t* const sentinel = reinterpret_cast<aar_sfa_impl_t*>(0x1);
  aar_sfa_impl_t* out = sentinel;
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, nullptr, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "dcp_comm and pcp_comm are both NULL");
  aar_sfa_builder_t* b = nullptr;
  ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &m.cp, &b), AAR_OK) << last();
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, reinterpret_cast<aar_cp_comm_t*>(b), nullptr, &out),
                  AAR_ERR_INVALID_ARGUMENT, "dcp_comm is an aar_sfa_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, comm, reinterpret_cast<aar_cp_comm_t*>(b), &out),
                  AAR_ERR_INVALID_ARGUMENT, "pcp_comm is an aar_sfa_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, comm, nullptr, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "out is NULL");
  EXPECT_REJECTED(aar_sfa_impl_create_cp(nullptr, &m.w, &m.iw, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "config is NULL");
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, nullptr, &m.iw, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "weights is NULL");
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, nullptr, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "indexer_weights must be given exactly when config->has_indexer is 1");
  aar_sfa_indexer_weights_t iw = m.iw;
  iw.wk = nullptr;
  EXPECT_REJECTED(aar_sfa_impl_create_cp(&m.ic, &m.w, &iw, comm, nullptr, &out), AAR_ERR_INVALID_ARGUMENT,
                  "indexer_weights->wk");
  EXPECT_EQ(out, sentinel);
  aar_sfa_builder_destroy(b);
  aar_cp_comm_destroy(comm);
}

// DCP and PCP layers refuse metadata of another group (or of a group they lack) before any
// collective (IdleBackend has none), with the caches and the output untouched; a one-rank DCP
// layer (a 1-rank gloo group, kept alive by the layer after its handle is destroyed) matches the
// single-rank layer.
TEST(CApiCp, SfaCpLayersCheckTheMetadataAndOneRankMatches) {
  SfaCp m;
  auto pg = register_group("aar_c_api_sfa_cp_mismatch", 1, 2);
  aar_cp_comm_t* two = comm_from("aar_c_api_sfa_cp_mismatch");
  aar_cp_comm_t* one = tcp_world1();
  ASSERT_NE(two, nullptr);
  ASSERT_NE(one, nullptr);
  SfaCp::Caches kv(2);
  at::Tensor hidden = at::randn({4, SfaCp::kHidden}), out = at::full({4, SfaCp::kHidden}, 7.0f);
  Dl dh(hidden), dout(out);
  aar_sfa_impl_t* layer = nullptr;
  ASSERT_EQ(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, two, nullptr, &layer), AAR_OK) << last();
  aar_sfa_builder_cp_t c0 = m.cp;
  c0.dcp_world_size = 2;
  aar_sfa_builder_t *b0 = nullptr, *b1 = nullptr;
  ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &c0, &b0), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_builder_create(&m.bc, &b1), AAR_OK) << last();
  const aar_sfa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_sfa_builder_build(b0, &m.in, &md), AAR_OK) << last();
  EXPECT_REJECTED(aar_sfa_impl_forward(layer, dh.get(), kv.tuple, 3, md, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "metadata was built for DCP rank 0 of 2 but the layer's dcp_comm is rank 1 of 2");
  ASSERT_EQ(aar_sfa_builder_build(b1, &m.in, &md), AAR_OK) << last();
  EXPECT_REJECTED(aar_sfa_impl_forward(layer, dh.get(), kv.tuple, 3, md, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "the layer's dcp_comm has 2 ranks but the metadata was built without DCP");
  EXPECT_TRUE(at::equal(out, at::full_like(out, 7.0f)));
  EXPECT_TRUE(kv.untouched());
  aar_sfa_impl_destroy(layer);
  aar_sfa_builder_destroy(b0);
  {  // PCP: metadata of PCP rank 0 of 2 on the group's rank 1, and PCP metadata on a DCP-only layer.
    aar_sfa_impl_t *pl = nullptr, *dl = nullptr;
    ASSERT_EQ(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, nullptr, two, &pl), AAR_OK) << last();
    ASSERT_EQ(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, one, nullptr, &dl), AAR_OK) << last();
    aar_sfa_builder_cp_t cp = m.cp;
    cp.pcp_world_size = 2;
    aar_sfa_builder_t* bp = nullptr;
    ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &cp, &bp), AAR_OK) << last();
    ASSERT_EQ(aar_sfa_builder_build(bp, &m.in, &md), AAR_OK) << last();
    size_t n = 0;
    ASSERT_EQ(aar_sfa_builder_pcp_local_rows(bp, nullptr, 0, &n), AAR_OK) << last();
    at::Tensor lh = at::randn({static_cast<int64_t>(n), SfaCp::kHidden});
    at::Tensor lo = at::full({static_cast<int64_t>(n), SfaCp::kHidden}, 7.0f);
    Dl dlh(lh), dlo(lo);
    EXPECT_REJECTED(aar_sfa_impl_forward(pl, dlh.get(), kv.tuple, 3, md, dlo.get(), nullptr),
                    AAR_ERR_INVALID_ARGUMENT, "metadata was built for PCP rank 0 of 2 but the layer's pcp_comm is rank 1 of 2");
    EXPECT_REJECTED(aar_sfa_impl_forward(dl, dlh.get(), kv.tuple, 3, md, dlo.get(), nullptr),
                    AAR_ERR_INVALID_ARGUMENT, "metadata was built for PCP rank 0 of 2 but the layer has no pcp_comm");
    EXPECT_TRUE(at::equal(lo, at::full_like(lo, 7.0f)));
    EXPECT_TRUE(kv.untouched());
    aar_sfa_builder_destroy(bp);
    aar_sfa_impl_destroy(pl);
    aar_sfa_impl_destroy(dl);
  }

  // One rank: the DCP layer over a 1-rank group against the plain layer, same weights and step.
  aar_sfa_impl_t *dcp = nullptr, *plain = nullptr;
  ASSERT_EQ(aar_sfa_impl_create_cp(&m.ic, &m.w, &m.iw, one, nullptr, &dcp), AAR_OK) << last();
  aar_cp_comm_destroy(one);  // the layer keeps its Comm
  ASSERT_EQ(aar_sfa_impl_create(&m.ic, &m.w, &m.iw, &plain), AAR_OK) << last();
  aar_sfa_builder_t* bd = nullptr;
  ASSERT_EQ(aar_sfa_builder_create_cp(&m.bc, &m.cp, &bd), AAR_OK) << last();
  SfaCp::Caches kv1(1), kv2(1);
  at::Tensor out2 = at::zeros_like(out);
  Dl dout2(out2);
  ASSERT_EQ(aar_sfa_builder_build(bd, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_impl_forward(dcp, dh.get(), kv1.tuple, 3, md, dout.get(), nullptr), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_builder_build(b1, &m.in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_impl_forward(plain, dh.get(), kv2.tuple, 3, md, dout2.get(), nullptr), AAR_OK) << last();
  EXPECT_TRUE(at::allclose(out, out2, 1e-5, 1e-5)) << (out - out2).abs().max().item<float>();
  EXPECT_TRUE(at::equal(kv1.nope, kv2.nope));
  EXPECT_TRUE(at::equal(kv1.index, kv2.index));
  aar_sfa_impl_destroy(dcp);
  aar_sfa_impl_destroy(plain);
  aar_sfa_builder_destroy(bd);
  aar_sfa_builder_destroy(b1);
  aar_cp_comm_destroy(two);
  c10d::unregister_process_group("aar_c_api_sfa_cp_mismatch");
}

// ---------------------------------------------------------------- DSA DCP (version 7)

namespace {

// A sliding-window (ratio 1) DSA layer's configs over tensors the struct owns, its SWA group, and
// the step of a decode at length 2 beside a prefill of 3.
struct DsaCp {
  static constexpr int64_t kHid = 32, kN = 2, kD = 32, kR = 8, kQ = 16, kW = 8, kG = 2, kOl = 8, kMaxPos = 64;
  static constexpr int32_t kBs = 32, kNb = 4, kMax = 2;
  DsaCp()
      : cos(at::cos(at::arange(kMaxPos).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMaxPos, kR}).contiguous()),
        sin(at::sin(at::arange(kMaxPos).unsqueeze(1).to(at::kFloat) * 0.1f).expand({kMaxPos, kR}).contiguous()),
        wq_a(at::randn({kQ, kHid}) * 0.3), q_norm(at::ones({kQ})), wq_b(at::randn({kN * kD, kQ}) * 0.3),
        wkv(at::randn({kD, kHid}) * 0.3), kv_norm(at::ones({kD})), sink(at::randn({kN})),
        wo_a(at::randn({kG, kN * kD / kG, kOl}) * 0.3), wo_b(at::randn({kHid, kG * kOl}) * 0.3),
        dcos(cos), dsin(sin), dwq_a(wq_a), dq_norm(q_norm), dwq_b(wq_b), dwkv(wkv), dkv_norm(kv_norm), dsink(sink),
        dwo_a(wo_a), dwo_b(wo_b) {
    aar_dsa_step_builder_config_init(&sc);
    sc.max_num_reqs = 2;
    sc.max_num_tokens = 16;
    sc.cos_table = dcos.get();
    sc.sin_table = dsin.get();
    sc.head_dim = kD;
    sc.window = kW;
    sc.num_heads_q = kN;
    aar_dsa_step_builder_cp_init(&cp);
    aar_dsa_group_config_init(&gc);
    gc.kind = AAR_DSA_SWA;
    gc.cache_block_size = kBs;
    gc.max_blocks_per_req = kMax;
    gc.num_blocks = kNb;
    aar_dsa_impl_config_init(&ic);
    ic.hidden_size = kHid;
    ic.num_heads = kN;
    ic.head_dim = kD;
    ic.rope_dim = kR;
    ic.q_lora_rank = kQ;
    ic.compress_ratio = 1;
    ic.o_groups = kG;
    ic.o_lora_rank = kOl;
    aar_dsa_weights_init(&w);
    w.wq_a = dwq_a.get();
    w.q_norm = dq_norm.get();
    w.wq_b = dwq_b.get();
    w.wkv = dwkv.get();
    w.kv_norm = dkv_norm.get();
    w.attn_sink = dsink.get();
    w.wo_a = dwo_a.get();
    w.wo_b = dwo_b.get();
    aar_dsa_step_inputs_init(&in);
    in.query_start_loc = qsl;
    in.query_start_loc_len = 3;
    in.seq_lens = seq;
    in.seq_lens_len = 2;
  }
  // A step builder (cp given: made by the _cp function) with its SWA group, built for the step.
  struct Built {
    Built(DsaCp& m, const aar_dsa_step_builder_cp_t* c) {
      if (c != nullptr) {
        EXPECT_EQ(aar_dsa_step_builder_create_cp(&m.sc, c, &step), AAR_OK) << last();
      } else {
        EXPECT_EQ(aar_dsa_step_builder_create(&m.sc, &step), AAR_OK) << last();
      }
      EXPECT_EQ(aar_dsa_group_builder_create(step, &m.gc, &swa), AAR_OK) << last();
      EXPECT_EQ(aar_dsa_step_builder_build(step, &m.in, &st), AAR_OK) << last();
      EXPECT_EQ(aar_dsa_group_builder_build(swa, st, m.table, 4, kMax, &gm), AAR_OK) << last();
    }
    ~Built() {
      aar_dsa_group_builder_destroy(swa);
      aar_dsa_step_builder_destroy(step);
    }
    aar_dsa_step_builder_t* step = nullptr;
    aar_dsa_group_builder_t* swa = nullptr;
    const aar_dsa_step_metadata_t* st = nullptr;
    const aar_dsa_group_metadata_t* gm = nullptr;
  };
  at::Tensor cos, sin, wq_a, q_norm, wq_b, wkv, kv_norm, sink, wo_a, wo_b;
  Dl dcos, dsin, dwq_a, dq_norm, dwq_b, dwkv, dkv_norm, dsink, dwo_a, dwo_b;
  aar_dsa_step_builder_config_t sc;
  aar_dsa_step_builder_cp_t cp;
  aar_dsa_group_config_t gc;
  aar_dsa_impl_config_t ic;
  aar_dsa_weights_t w;
  aar_dsa_step_inputs_t in;
  const int32_t qsl[3] = {0, 1, 4}, seq[2] = {2, 3}, table[4] = {1, 0, 2, 3};
};

}  // namespace

TEST(CApiCp, DsaCpRejectedByName) {
  DsaCp m;
  EXPECT_EQ(m.cp.dcp_world_size, 1);
  EXPECT_EQ(m.cp.dcp_rank, 0);
  EXPECT_EQ(m.cp.interleave, 1);
  aar_dsa_step_builder_t* const sentinel = reinterpret_cast<aar_dsa_step_builder_t*>(0x1);
  aar_dsa_step_builder_t* out = sentinel;
  auto bad = [&](auto edit, const char* needle) {
    aar_dsa_step_builder_cp_t c = m.cp;
    edit(c);
    EXPECT_REJECTED(aar_dsa_step_builder_create_cp(&m.sc, &c, &out), AAR_ERR_INVALID_ARGUMENT, needle);
    EXPECT_EQ(out, sentinel);
  };
  bad([](auto& c) { c.dcp_world_size = 0; }, "cp->dcp_world_size must be >= 1, got 0");
  bad([](auto& c) { c.dcp_world_size = 2, c.dcp_rank = 2; }, "cp->dcp_rank=2 is out of range [0, dcp_world_size=2)");
  bad([](auto& c) { c.interleave = 0; }, "cp->interleave must be >= 1, got 0");
  bad([](auto& c) { c.struct_size = 8; }, "cp->struct_size is 8");
  EXPECT_REJECTED(aar_dsa_step_builder_create_cp(&m.sc, nullptr, &out), AAR_ERR_INVALID_ARGUMENT, "cp is NULL");
  EXPECT_REJECTED(aar_dsa_step_builder_create_cp(nullptr, &m.cp, &out), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  EXPECT_REJECTED(aar_dsa_step_builder_create_cp(&m.sc, &m.cp, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_EQ(out, sentinel);

  aar_cp_comm_t* comm = tcp_world1();
  ASSERT_NE(comm, nullptr);
  aar_dsa_impl_t* const isentinel = reinterpret_cast<aar_dsa_impl_t*>(0x1);
  aar_dsa_impl_t* layer = isentinel;
  EXPECT_REJECTED(aar_dsa_impl_create_cp(&m.ic, &m.w, nullptr, &layer), AAR_ERR_INVALID_ARGUMENT, "dcp_comm is NULL");
  DsaCp::Built b(m, &m.cp);
  EXPECT_REJECTED(aar_dsa_impl_create_cp(&m.ic, &m.w, reinterpret_cast<aar_cp_comm_t*>(b.step), &layer),
                  AAR_ERR_INVALID_ARGUMENT, "dcp_comm is an aar_dsa_step_builder_t, expected an aar_cp_comm_t");
  EXPECT_REJECTED(aar_dsa_impl_create_cp(&m.ic, &m.w, comm, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_REJECTED(aar_dsa_impl_create_cp(nullptr, &m.w, comm, &layer), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  aar_dsa_weights_t w = m.w;
  w.wkv = nullptr;
  EXPECT_REJECTED(aar_dsa_impl_create_cp(&m.ic, &w, comm, &layer), AAR_ERR_INVALID_ARGUMENT, "weights->wkv");
  EXPECT_EQ(layer, isentinel);
  aar_cp_comm_destroy(comm);
}

// A DCP layer refuses metadata of another rank (or built without DCP) before any collective
// (IdleBackend has none), cache and output untouched; a one-rank DCP layer (its communicator's
// handle destroyed first) matches the single-rank layer.
TEST(CApiCp, DsaCpLayerChecksTheMetadataAndOneRankMatches) {
  DsaCp m;
  auto pg = register_group("aar_c_api_dsa_cp_mismatch", 1, 2);
  aar_cp_comm_t* two = comm_from("aar_c_api_dsa_cp_mismatch");
  aar_cp_comm_t* one = tcp_world1();
  ASSERT_NE(two, nullptr);
  ASSERT_NE(one, nullptr);
  aar_dsa_group_cache_info_t info;
  info.struct_size = sizeof(info);
  {
    DsaCp::Built probe(m, nullptr);
    ASSERT_EQ(aar_dsa_group_builder_cache_info(probe.swa, DsaCp::kNb, &info), AAR_OK) << last();
  }
  const std::vector<int64_t> shape(info.kv_shape, info.kv_shape + info.kv_ndim);
  at::Tensor swa = at::zeros(shape), hidden = at::randn({4, DsaCp::kHid}), out = at::full({4, DsaCp::kHid}, 7.0f);
  Dl dswa(swa), dh(hidden), dout(out);
  const DLManagedTensor* kv[6] = {nullptr, dswa.get(), nullptr, nullptr, nullptr, nullptr};
  aar_dsa_impl_t* layer = nullptr;
  ASSERT_EQ(aar_dsa_impl_create_cp(&m.ic, &m.w, two, &layer), AAR_OK) << last();
  aar_dsa_step_builder_cp_t c0 = m.cp;
  c0.dcp_world_size = 2;
  {
    DsaCp::Built b0(m, &c0);
    EXPECT_REJECTED(aar_dsa_impl_forward(layer, dh.get(), kv, 6, b0.st, &b0.gm, 1, dout.get(), nullptr),
                    AAR_ERR_INVALID_ARGUMENT, "the layer's dcp_comm is rank 1 of 2");
    DsaCp::Built b1(m, nullptr);
    EXPECT_REJECTED(aar_dsa_impl_forward(layer, dh.get(), kv, 6, b1.st, &b1.gm, 1, dout.get(), nullptr),
                    AAR_ERR_INVALID_ARGUMENT, "the layer's dcp_comm has 2 ranks but the metadata was built without DCP");
  }
  EXPECT_TRUE(at::equal(out, at::full_like(out, 7.0f)));
  EXPECT_FALSE(swa.any().item<bool>());
  aar_dsa_impl_destroy(layer);

  // One rank: the DCP layer over a 1-rank group against the plain layer, same weights and step.
  aar_dsa_impl_t *dcp = nullptr, *plain = nullptr;
  ASSERT_EQ(aar_dsa_impl_create_cp(&m.ic, &m.w, one, &dcp), AAR_OK) << last();
  aar_cp_comm_destroy(one);  // the layer keeps its Comm
  ASSERT_EQ(aar_dsa_impl_create(&m.ic, &m.w, &plain), AAR_OK) << last();
  at::Tensor swa2 = at::zeros(shape), out2 = at::zeros_like(out);
  Dl dswa2(swa2), dout2(out2);
  const DLManagedTensor* kv2[6] = {nullptr, dswa2.get(), nullptr, nullptr, nullptr, nullptr};
  {
    DsaCp::Built bd(m, &m.cp);
    ASSERT_EQ(aar_dsa_impl_forward(dcp, dh.get(), kv, 6, bd.st, &bd.gm, 1, dout.get(), nullptr), AAR_OK) << last();
    DsaCp::Built bp(m, nullptr);
    ASSERT_EQ(aar_dsa_impl_forward(plain, dh.get(), kv2, 6, bp.st, &bp.gm, 1, dout2.get(), nullptr), AAR_OK)
        << last();
  }
  EXPECT_TRUE(at::allclose(out, out2, 1e-5, 1e-5)) << (out - out2).abs().max().item<float>();
  EXPECT_TRUE(at::equal(swa, swa2));
  aar_dsa_impl_destroy(dcp);
  aar_dsa_impl_destroy(plain);
  aar_cp_comm_destroy(two);
  c10d::unregister_process_group("aar_c_api_dsa_cp_mismatch");
}
