// Every argument a CPU twin does not implement raises an error naming it; the
// twins are called by qualified name through the dispatcher (arguments the
// wrappers never pass are reachable only that way).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "../../cpp/ops/op_signatures.h"
#include "ascend_attn_rt/errors.h"
#include "test_rt_ops_util.h"

namespace sig = aar::ops::sig;
using namespace aar_test;

namespace {

at::OptionalSymIntArrayRef sym(const std::optional<std::vector<int64_t>>& v) {
  if (!v) return std::nullopt;
  return at::OptionalSymIntArrayRef(c10::fromIntArrayRefUnchecked(*v));
}

template <class Sig>
c10::TypedOperatorHandle<Sig> op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Sig>();
}

struct V1Args {
  at::Tensor query;
  at::Tensor key;
  at::Tensor value;
  std::optional<at::Tensor> pse_shift;
  std::optional<at::Tensor> atten_mask;
  std::optional<std::vector<int64_t>> actual_seq_lengths;
  std::optional<std::vector<int64_t>> actual_seq_lengths_kv;
  std::optional<at::Tensor> dequant_scale1;
  std::optional<at::Tensor> quant_scale1;
  std::optional<at::Tensor> dequant_scale2;
  std::optional<at::Tensor> quant_scale2;
  std::optional<at::Tensor> quant_offset2;
  std::optional<at::Tensor> antiquant_scale;
  std::optional<at::Tensor> antiquant_offset;
  std::optional<at::Tensor> key_antiquant_scale;
  std::optional<at::Tensor> key_antiquant_offset;
  std::optional<at::Tensor> value_antiquant_scale;
  std::optional<at::Tensor> value_antiquant_offset;
  std::optional<at::Tensor> block_table;
  std::optional<at::Tensor> query_padding_size;
  std::optional<at::Tensor> kv_padding_size;
  std::optional<at::Tensor> key_shared_prefix;
  std::optional<at::Tensor> value_shared_prefix;
  std::optional<std::vector<int64_t>> actual_shared_prefix_len;
  std::optional<at::Tensor> query_rope;
  std::optional<at::Tensor> key_rope;
  std::optional<at::Tensor> key_rope_antiquant_scale;
  int64_t num_heads = 1;
  double scale = 1.0;
  int64_t pre_tokens = kIntMax;
  int64_t next_tokens = kIntMax;
  std::string input_layout = "TND";
  int64_t num_key_value_heads = 0;
  int64_t sparse_mode = 0;
  int64_t inner_precise = 0;
  int64_t block_size = 0;
  int64_t antiquant_mode = 0;
  int64_t key_antiquant_mode = 0;
  int64_t value_antiquant_mode = 0;
  bool softmax_lse_flag = false;
};

struct V2Args {
  at::Tensor query;
  at::Tensor key;
  at::Tensor value;
  std::optional<at::Tensor> query_rope;
  std::optional<at::Tensor> key_rope;
  std::optional<at::Tensor> pse_shift;
  std::optional<at::Tensor> atten_mask;
  std::optional<std::vector<int64_t>> actual_seq_qlen;
  std::optional<std::vector<int64_t>> actual_seq_kvlen;
  std::optional<at::Tensor> block_table;
  std::optional<at::Tensor> dequant_scale_query;
  std::optional<at::Tensor> dequant_scale_key;
  std::optional<at::Tensor> dequant_offset_key;
  std::optional<at::Tensor> dequant_scale_value;
  std::optional<at::Tensor> dequant_offset_value;
  std::optional<at::Tensor> dequant_scale_key_rope;
  std::optional<at::Tensor> quant_scale_out;
  std::optional<at::Tensor> quant_offset_out;
  std::optional<at::Tensor> quant_scale_p;
  std::optional<at::Tensor> learnable_sink;
  int64_t num_query_heads = 1;
  int64_t num_key_value_heads = 0;
  double softmax_scale = 1.0;
  int64_t pre_tokens = kIntMax;
  int64_t next_tokens = kIntMax;
  std::string input_layout = "TND";
  int64_t sparse_mode = 0;
  int64_t block_size = 0;
  int64_t query_quant_mode = 0;
  int64_t key_quant_mode = 0;
  int64_t value_quant_mode = 0;
  int64_t inner_precise = 0;
  bool return_softmax_lse = false;
  std::optional<int64_t> query_dtype;
  std::optional<int64_t> key_dtype;
  std::optional<int64_t> value_dtype;
  std::optional<int64_t> query_rope_dtype;
  std::optional<int64_t> key_rope_dtype;
  std::optional<int64_t> key_shared_prefix_dtype;
  std::optional<int64_t> value_shared_prefix_dtype;
  std::optional<int64_t> dequant_scale_query_dtype;
  std::optional<int64_t> dequant_scale_key_dtype;
  std::optional<int64_t> dequant_scale_value_dtype;
  std::optional<int64_t> dequant_scale_key_rope_dtype;
  std::optional<int64_t> out_dtype;
};

V1Args base_v1() {
  V1Args a;
  a.query = at::randn({4, 2, 8});
  a.key = at::randn({4, 2, 8});
  a.value = at::randn({4, 2, 8});
  a.actual_seq_lengths = std::vector<int64_t>{4};
  a.actual_seq_lengths_kv = std::vector<int64_t>{4};
  a.num_heads = 2;
  return a;
}

V2Args base_v2() {
  V2Args a;
  a.query = at::randn({4, 2, 8});
  a.key = at::randn({4, 2, 8});
  a.value = at::randn({4, 2, 8});
  a.actual_seq_qlen = std::vector<int64_t>{4};
  a.actual_seq_kvlen = std::vector<int64_t>{4};
  a.num_query_heads = 2;
  return a;
}

void call_v1(const V1Args& a) {
  c10::InferenceMode guard;
  op<sig::FiaV1>("ascend_cpu::npu_fused_infer_attention_score").call(a.query, a.key, a.value, a.pse_shift, a.atten_mask, sym(a.actual_seq_lengths), sym(a.actual_seq_lengths_kv), a.dequant_scale1, a.quant_scale1, a.dequant_scale2, a.quant_scale2, a.quant_offset2, a.antiquant_scale, a.antiquant_offset, a.key_antiquant_scale, a.key_antiquant_offset, a.value_antiquant_scale, a.value_antiquant_offset, a.block_table, a.query_padding_size, a.kv_padding_size, a.key_shared_prefix, a.value_shared_prefix, sym(a.actual_shared_prefix_len), a.query_rope, a.key_rope, a.key_rope_antiquant_scale, a.num_heads, a.scale, a.pre_tokens, a.next_tokens, a.input_layout, a.num_key_value_heads, a.sparse_mode, a.inner_precise, a.block_size, a.antiquant_mode, a.key_antiquant_mode, a.value_antiquant_mode, a.softmax_lse_flag);
}

void call_v2(const V2Args& a) {
  c10::InferenceMode guard;
  op<sig::FiaV2>("ascend_cpu::npu_fused_infer_attention_score_v2").call(a.query, a.key, a.value, a.query_rope, a.key_rope, a.pse_shift, a.atten_mask, sym(a.actual_seq_qlen), sym(a.actual_seq_kvlen), a.block_table, a.dequant_scale_query, a.dequant_scale_key, a.dequant_offset_key, a.dequant_scale_value, a.dequant_offset_value, a.dequant_scale_key_rope, a.quant_scale_out, a.quant_offset_out, a.quant_scale_p, a.learnable_sink, a.num_query_heads, a.num_key_value_heads, a.softmax_scale, a.pre_tokens, a.next_tokens, a.input_layout, a.sparse_mode, a.block_size, a.query_quant_mode, a.key_quant_mode, a.value_quant_mode, a.inner_precise, a.return_softmax_lse, a.query_dtype, a.key_dtype, a.value_dtype, a.query_rope_dtype, a.key_rope_dtype, a.key_shared_prefix_dtype, a.value_shared_prefix_dtype, a.dequant_scale_query_dtype, a.dequant_scale_key_dtype, a.dequant_scale_value_dtype, a.dequant_scale_key_rope_dtype, a.out_dtype);
}

}  // namespace

TEST(RtOpsUnsupported, FiaV1BaseCallIsValid) {
  EXPECT_NO_THROW(call_v1(base_v1()));
}

TEST(RtOpsUnsupported, FiaV1TensorArguments) {
  const std::vector<std::pair<const char*, std::optional<at::Tensor> V1Args::*>> args = {
      {"pse_shift", &V1Args::pse_shift},
      {"dequant_scale1", &V1Args::dequant_scale1},
      {"quant_scale1", &V1Args::quant_scale1},
      {"dequant_scale2", &V1Args::dequant_scale2},
      {"quant_scale2", &V1Args::quant_scale2},
      {"quant_offset2", &V1Args::quant_offset2},
      {"antiquant_scale", &V1Args::antiquant_scale},
      {"antiquant_offset", &V1Args::antiquant_offset},
      {"key_antiquant_scale", &V1Args::key_antiquant_scale},
      {"key_antiquant_offset", &V1Args::key_antiquant_offset},
      {"value_antiquant_scale", &V1Args::value_antiquant_scale},
      {"value_antiquant_offset", &V1Args::value_antiquant_offset},
      {"query_padding_size", &V1Args::query_padding_size},
      {"kv_padding_size", &V1Args::kv_padding_size},
      {"key_shared_prefix", &V1Args::key_shared_prefix},
      {"value_shared_prefix", &V1Args::value_shared_prefix},
      {"query_rope", &V1Args::query_rope},
      {"key_rope", &V1Args::key_rope},
      {"key_rope_antiquant_scale", &V1Args::key_rope_antiquant_scale},
  };
  for (const auto& [name, member] : args) {
    V1Args a = base_v1();
    a.*member = at::ones({2, 1, 8});
    expect_throw_with<aar::NotSupported>([&] { call_v1(a); },
                                         std::string("not supported by the CPU twin: ") + name);
  }
}

TEST(RtOpsUnsupported, FiaV1ScalarArguments) {
  auto with = [](auto f) {
    V1Args a = base_v1();
    f(a);
    return a;
  };
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.antiquant_mode = 1; })); },
                                       "antiquant_mode=1");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.key_antiquant_mode = 2; })); },
                                       "key_antiquant_mode=2");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.value_antiquant_mode = 1; })); },
                                       "value_antiquant_mode=1");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.inner_precise = 2; })); },
                                       "inner_precise=2");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.sparse_mode = 2; })); },
                                       "sparse_mode=2");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.input_layout = "BSH"; })); },
                                       "input_layout=\"BSH\"");
  expect_throw_with<aar::NotSupported>([&] { call_v1(with([](V1Args& a) { a.pre_tokens = 7; })); },
                                       "pre_tokens=7");
  expect_throw_with<aar::NotSupported>(
      [&] { call_v1(with([](V1Args& a) { a.actual_shared_prefix_len = std::vector<int64_t>{2}; })); },
      "actual_shared_prefix_len");
  expect_throw_with<aar::NotSupported>(
      [&] { call_v1(with([](V1Args& a) { a.atten_mask = at::ones({2048, 2048}, at::kBool); })); }, "atten_mask");
  expect_throw_with<aar::NotSupported>(
      [&] {
        call_v1(with([](V1Args& a) {
          a.key = a.key.to(at::kChar);
          a.value = a.value.to(at::kChar);
        }));
      },
      "int8 key");
}

TEST(RtOpsUnsupported, FiaV2Arguments) {
  EXPECT_NO_THROW(call_v2(base_v2()));
  const std::vector<std::pair<const char*, std::optional<at::Tensor> V2Args::*>> tensors = {
      {"query_rope", &V2Args::query_rope},
      {"key_rope", &V2Args::key_rope},
      {"pse_shift", &V2Args::pse_shift},
      {"dequant_scale_query", &V2Args::dequant_scale_query},
      {"dequant_scale_key", &V2Args::dequant_scale_key},
      {"dequant_offset_key", &V2Args::dequant_offset_key},
      {"dequant_scale_value", &V2Args::dequant_scale_value},
      {"dequant_offset_value", &V2Args::dequant_offset_value},
      {"dequant_scale_key_rope", &V2Args::dequant_scale_key_rope},
      {"quant_scale_out", &V2Args::quant_scale_out},
      {"quant_offset_out", &V2Args::quant_offset_out},
      {"quant_scale_p", &V2Args::quant_scale_p},
  };
  for (const auto& [name, member] : tensors) {
    V2Args a = base_v2();
    a.*member = at::ones({2, 1, 8});
    expect_throw_with<aar::NotSupported>([&] { call_v2(a); },
                                         std::string("not supported by the CPU twin: ") + name);
  }
  const std::vector<std::pair<const char*, std::optional<int64_t> V2Args::*>> dtypes = {
      {"query_dtype", &V2Args::query_dtype},
      {"key_dtype", &V2Args::key_dtype},
      {"value_dtype", &V2Args::value_dtype},
      {"query_rope_dtype", &V2Args::query_rope_dtype},
      {"key_rope_dtype", &V2Args::key_rope_dtype},
      {"key_shared_prefix_dtype", &V2Args::key_shared_prefix_dtype},
      {"value_shared_prefix_dtype", &V2Args::value_shared_prefix_dtype},
      {"dequant_scale_query_dtype", &V2Args::dequant_scale_query_dtype},
      {"dequant_scale_key_dtype", &V2Args::dequant_scale_key_dtype},
      {"dequant_scale_value_dtype", &V2Args::dequant_scale_value_dtype},
      {"dequant_scale_key_rope_dtype", &V2Args::dequant_scale_key_rope_dtype},
      {"out_dtype", &V2Args::out_dtype},
  };
  for (const auto& [name, member] : dtypes) {
    V2Args a = base_v2();
    a.*member = 1;
    expect_throw_with<aar::NotSupported>([&] { call_v2(a); }, std::string(name) + "=1");
  }
  // Only the fully quantised MLA form (query_quant_mode 3 over int8 operands,
  // test_rt_ops_mla_quant.cpp) is implemented: other modes are rejected by name,
  // mode 3 over float operands is an invalid call.
  const std::vector<std::pair<const char*, int64_t V2Args::*>> ints = {
      {"query_quant_mode", &V2Args::query_quant_mode},
      {"key_quant_mode", &V2Args::key_quant_mode},
      {"value_quant_mode", &V2Args::value_quant_mode},
  };
  for (const auto& [name, member] : ints) {
    for (int64_t mode : {1, 3}) {
      V2Args a = base_v2();
      a.*member = mode;
      if (member == &V2Args::query_quant_mode && mode == 3) {
        expect_throw_with<aar::InvalidArgument>([&] { call_v2(a); }, "query_quant_mode=3 needs int8");
      } else {
        expect_throw_with<aar::NotSupported>([&] { call_v2(a); }, std::string(name) + "=" + std::to_string(mode));
      }
    }
  }
  V2Args a = base_v2();
  a.learnable_sink = at::zeros({3});
  expect_throw_with<aar::InvalidArgument>([&] { call_v2(a); }, "learnable_sink");
}

TEST(RtOpsUnsupported, ScatterCompressArguments) {
  auto h = op<sig::ScatterPaKvCache>("ascend_cpu::npu_scatter_pa_kv_cache");
  at::Tensor kc = at::zeros({2, 16, 2, 8}), vc = at::zeros({2, 16, 2, 8});
  const at::Tensor k = at::ones({1, 2, 8}), v = at::ones({1, 2, 8});
  const at::Tensor slots = at::zeros({1}, at::kInt);
  const std::optional<at::Tensor> t = at::zeros({1}, at::kInt), none;
  c10::InferenceMode guard;
  expect_throw_with<aar::NotSupported>([&] { h.call(k, v, kc, vc, slots, t, none, none, "Norm"); },
                                       "compress_lens");
  expect_throw_with<aar::NotSupported>([&] { h.call(k, v, kc, vc, slots, none, t, none, "Norm"); },
                                       "compress_seq_offsets");
  expect_throw_with<aar::NotSupported>([&] { h.call(k, v, kc, vc, slots, none, none, t, "Norm"); }, "seq_lens");
  expect_throw_with<aar::InvalidArgument>([&] { h.call(k, v, kc, vc, slots, none, none, none, std::nullopt); },
                                          "cache_mode");
  EXPECT_TRUE(at::all(kc == 0).item<bool>());
}

TEST(RtOpsUnsupported, FusionAttentionArguments) {
  auto h = op<sig::FusionAttention>("ascend_cpu::npu_fusion_attention");
  const at::Tensor q = at::randn({4, 2, 8});
  const std::vector<int64_t> l{4};
  const std::optional<at::Tensor> t = at::zeros({1}), none;
  c10::InferenceMode guard;
  auto call = [&](const std::optional<at::Tensor>& pse, const std::optional<at::Tensor>& pad,
                  const std::optional<at::Tensor>& sink, const std::optional<at::Tensor>& drop, double keep,
                  at::OptionalIntArrayRef prefix) {
    h.call(q, q, q, 2, "TND", pse, pad, none, 1.0, keep, kIntMax, kIntMax, 0, prefix, l, l, 0, true, false, "",
           sink, drop, 0, 0);
  };
  EXPECT_NO_THROW(call(none, none, none, none, 1.0, std::nullopt));
  expect_throw_with<aar::NotSupported>([&] { call(t, none, none, none, 1.0, std::nullopt); }, "pse");
  expect_throw_with<aar::NotSupported>([&] { call(none, t, none, none, 1.0, std::nullopt); }, "padding_mask");
  expect_throw_with<aar::NotSupported>([&] { call(none, none, t, none, 1.0, std::nullopt); }, "sink");
  expect_throw_with<aar::NotSupported>([&] { call(none, none, none, t, 1.0, std::nullopt); }, "dropout_mask");
  expect_throw_with<aar::NotSupported>([&] { call(none, none, none, none, 0.9, std::nullopt); }, "keep_prob=0.9");
  expect_throw_with<aar::NotSupported>([&] { call(none, none, none, none, 1.0, l); }, "prefix");
}
