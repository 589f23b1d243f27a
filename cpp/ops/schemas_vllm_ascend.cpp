// The schema table of vllm-ascend's own operators (library `_C_ascend`) that the
// runtime calls. Every string is copied verbatim from third_party/vllm_ascend_ops.txt
// (vllm-project/vllm-ascend csrc/torch_binding.cpp at commit 182b75ea). Our CPU
// twins (`ascend_cpu_va`) and no-compute kernels (`ascend_noop_va`) are registered
// from this one table; tests/python/test_schemas.py compares it with that file.
#include "ascend_attn_rt/ops/schemas.h"

namespace aar::ops {

const std::vector<OpSchema>& vllm_ascend_op_schemas() {
  static const std::vector<OpSchema> table = {
      {"npu_lightning_indexer",
        "npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, "
        "int sparse_mode=3, int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, "
        "bool return_value=False) -> (Tensor sparse_indices, Tensor sparse_values)",
       false},
      {"npu_lightning_indexer_quant",
        "npu_lightning_indexer_quant(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, *, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_key=None, Tensor? block_table=None, int query_quant_mode=0, "
        "int key_quant_mode=0, str layout_query='BSND', str layout_key='BSND', int sparse_count=2048, "
        "int sparse_mode=3) -> Tensor",
       false},
      {"npu_sparse_flash_attention",
        "npu_sparse_flash_attention(Tensor query, Tensor key, Tensor value, Tensor sparse_indices, "
        "float scale_value, *, Tensor? block_table=None, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_kv=None, Tensor? query_rope=None, Tensor? key_rope=None, "
        "int sparse_block_size=1, str layout_query='BSND', str layout_kv='BSND', int sparse_mode=3, "
        "int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int attention_mode=2, "
        "bool return_softmax_lse=False) -> (Tensor attention_out, Tensor softmax_max, Tensor softmax_sum)",
       false},
      {"npu_kv_quant_sparse_flash_attention",
        "npu_kv_quant_sparse_flash_attention(Tensor query, Tensor key, Tensor value, Tensor sparse_indices, "
        "float scale_value, *, int key_quant_mode=1, int value_quant_mode=1, Tensor? key_dequant_scale=None, "
        "Tensor? value_dequant_scale=None, Tensor? block_table=None, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_kv=None, int sparse_block_size=1, str layout_query='BSND', "
        "str layout_kv='BSND', int sparse_mode=3, int pre_tokens=9223372036854775807, "
        "int next_tokens=9223372036854775807, int attention_mode=2, int quant_scale_repo_mode=1, "
        "int tile_size=128, int rope_head_dim=64, bool return_softmax_lse=False) -> (Tensor attention_out, "
        "Tensor softmax_max, Tensor softmax_sum)",
       false},
      {"mla_preprocess",
        "mla_preprocess(Tensor hiddenState, Tensor wdqkv, Tensor? descale0, Tensor gamma1, Tensor? beta1, "
        "Tensor wuq, Tensor? descale1, Tensor gamma2, Tensor? cos, Tensor? sin, Tensor wuk, Tensor kv_cache, "
        "Tensor kv_cache_rope, Tensor slotmapping, Tensor? quant_scale0, Tensor? quant_offset0, Tensor? bias0, "
        "Tensor? quant_scale1, Tensor? quant_offset1, Tensor? bias1, Tensor? ctkv_scale, Tensor? q_nope_scale, "
        "str? cache_mode, str? quant_mode, bool? enable_inner_out, Tensor! q_out0, Tensor! kv_cache_out0, "
        "Tensor! q_out1, Tensor! kv_cache_out1, Tensor! inner_out) -> (Tensor q_out0, Tensor kv_cache_out0, "
        "Tensor q_out1, Tensor kv_cache_out1, Tensor inner_out)",
       false},
      {"batch_matmul_transpose",
        "batch_matmul_transpose(Tensor tensor_a, Tensor tensor_b, Tensor tensor_c, str? format_mode=None, "
        "str? quant_mode=None) -> ()",
       false},
      // DeepSeek-V4 quantised lightning indexer (issue 12).
      {"npu_vllm_quant_lightning_indexer",
        "npu_vllm_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights, "
        "Tensor query_dequant_scale, Tensor key_dequant_scale, int query_quant_mode=0, int key_quant_mode=0, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, Tensor? metadata=None, str layout_query=\"BSND\", str layout_key=\"BSND\", "
        "int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, "
        "int next_tokens=9223372036854775807, int cmp_ratio=1, "
        "bool return_value=False) -> (Tensor sparse_indices, Tensor sparse_values)",
       false},
      {"npu_vllm_quant_lightning_indexer_metadata",
        "npu_vllm_quant_lightning_indexer_metadata(int num_heads_q, int num_heads_k, int head_dim, "
        "int query_quant_mode, int key_quant_mode, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_key=None, int batch_size=0, int max_seqlen_q=0, int max_seqlen_k=0, "
        "str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, int sparse_mode=3, "
        "int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int cmp_ratio=1, "
        "str device=\"npu\") -> (Tensor metadata)",
       false},
  };
  return table;
}

}  // namespace aar::ops
