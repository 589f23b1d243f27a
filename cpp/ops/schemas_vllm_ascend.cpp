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
      // DeepSeek-V4 (DSA) shared-KV sparse attention and its in-place helpers (issue 12).
      {"npu_sparse_attn_sharedkv",
        "npu_sparse_attn_sharedkv(Tensor q, *, Tensor? ori_kv=None, Tensor? cmp_kv=None, "
        "Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, Tensor? ori_block_table=None, "
        "Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, "
        "Tensor? sinks=None, Tensor? metadata=None, float softmax_scale=0, int cmp_ratio=0, "
        "int ori_mask_mode=4, int cmp_mask_mode=3, int ori_win_left=128, int ori_win_right=0, "
        "str layout_q=\"BSND\", str layout_kv=\"PA_ND\", bool return_softmax_lse=False) -> (Tensor out, "
        "Tensor softmax_lse)",
       false},
      {"npu_sparse_attn_sharedkv_metadata",
        "npu_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, "
        "Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, int max_seqlen_q=0, "
        "int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int cmp_ratio=4, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=128, int ori_win_right=0, str layout_q=\"BSND\", "
        "str layout_kv=\"PA_ND\", bool has_ori_kv=True, bool has_cmp_kv=True, "
        "str device=\"npu\") -> (Tensor metadata)",
       false},
      {"npu_scatter_nd_update_v2",
        "npu_scatter_nd_update_v2(Tensor(a!) var, Tensor indices, Tensor update) -> ()",
       false},
      {"inplace_partial_rotary_mul",
        "inplace_partial_rotary_mul(Tensor(a!) x, Tensor r1, Tensor r2, str rotary_mode, "
        "int[] partial_slice) -> ()",
       false},
      // issue 30: the W8A8-dynamic DSA prolog's fused RMSNorm + per-token int8 quantisation.
      {"npu_rms_norm_dynamic_quant",
        "npu_rms_norm_dynamic_quant(Tensor x, Tensor gamma, Tensor? smooth_scale=None, Tensor? beta=None, "
        "float epsilon=1e-6) -> (Tensor y_out, Tensor scale_out)",
       false},
      {"npu_kv_quant_sparse_attn_sharedkv",
        "npu_kv_quant_sparse_attn_sharedkv(Tensor q, int kv_quant_mode, Tensor? ori_kv=None, "
        "Tensor? cmp_kv=None, Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, "
        "Tensor? ori_block_table=None, Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, "
        "Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, "
        "Tensor? seqused_kv=None, Tensor? sinks=None, Tensor? metadata=None, int tile_size=0, "
        "int rope_head_dim=0, float softmax_scale=0.0, int cmp_ratio=0, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=127, int ori_win_right=0, str layout_q='BSND', "
        "str layout_kv='PA_ND', bool return_softmax_lse=False) -> (Tensor out, Tensor softmax_lse)",
       false},
      {"npu_kv_quant_sparse_attn_sharedkv_metadata",
        "npu_kv_quant_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, "
        "int kv_quant_mode, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, "
        "int max_seqlen_q=0, int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int tile_size=0, "
        "int rope_head_dim=0, int cmp_ratio=-1, int ori_mask_mode=4, int cmp_mask_mode=3, "
        "int ori_win_left=127, int ori_win_right=0, str layout_q='BSND', str layout_kv='PA_ND', "
        "bool has_ori_kv=True, bool has_cmp_kv=True, str device='npu') -> Tensor",
       false},
      {"compressor",
        "compressor(Tensor x, Tensor wkv, Tensor wgate, Tensor(a!) state_cache, Tensor ape, "
        "Tensor norm_weight, Tensor rope_sin, Tensor rope_cos, Tensor? state_block_table, "
        "Tensor? cu_seqlens, Tensor? seqused, Tensor? start_pos, int rope_head_dim, int cmp_ratio, int coff, "
        "float norm_eps, int rotary_mode, int cache_mode) -> Tensor",
       false},
      {"compressor_metadata",
        "compressor_metadata(Tensor rope_cos, Tensor rope_sin, Tensor cu_seqlens, Tensor start_pos, "
        "Tensor kv_block_table, int kv_block_size, int slot_mapping_format, int compress_ratio, "
        "int num_compressed_tokens, int num_reqs_actual) -> (Tensor, Tensor, Tensor)",
       false},
      {"compressor_metadata_out",
        "compressor_metadata_out(Tensor rope_cos, Tensor rope_sin, Tensor cu_seqlens, Tensor start_pos, "
        "Tensor kv_block_table, int kv_block_size, int slot_mapping_format, int compress_ratio, "
        "int num_reqs_actual, Tensor(a!) compress_cos, Tensor(b!) compress_sin, "
        "Tensor(c!) slot_mapping) -> (Tensor(a!), Tensor(b!), Tensor(c!))",
       false},
      {"kv_compress_epilog",
        "kv_compress_epilog(Tensor(a!) kv_compress_cache, Tensor x, Tensor slot_mapping, "
        "int quant_group_size, int quant_mode, bool round_scale_flag, int layout) -> ()",
       false},
      {"indexer_compress_epilog_v2",
        "indexer_compress_epilog_v2(Tensor(a!) indexer_compress_cache, Tensor x, Tensor slot_mapping, "
        "int layout=2) -> ()",
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
