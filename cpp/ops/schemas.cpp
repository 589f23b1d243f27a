// The operator schema table. Every string is copied verbatim from the torch_npu
// 2.14.0 wheel: npu_* from torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml,
// the ATB ops (`atb` namespace) from op_plugin's AtbOpsInterface.h signatures.
// Registering the CPU twins and the no-compute provider from this one table is
// what guarantees the three providers share byte-identical schemas.
#include "ascend_attn_rt/ops/schemas.h"

namespace aar::ops {

const std::vector<OpSchema>& op_schemas() {
  static const std::vector<OpSchema> table = {
      {"npu_fused_infer_attention_score",
        "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, "
        "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
        "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, "
        "Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
        "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, "
        "Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
        "Tensor? value_antiquant_offset=None, Tensor? block_table=None, Tensor? query_padding_size=None, "
        "Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
        "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
        "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
        "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
        "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
        "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
        "bool softmax_lse_flag=False) -> (Tensor, Tensor)",
       false},
      {"npu_fused_infer_attention_score.out",
        "npu_fused_infer_attention_score.out(Tensor query, Tensor key, Tensor value, *, "
        "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
        "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, "
        "Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
        "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, "
        "Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
        "Tensor? value_antiquant_offset=None, Tensor? block_table=None, Tensor? query_padding_size=None, "
        "Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
        "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
        "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
        "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
        "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
        "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
        "bool softmax_lse_flag=False, Tensor? workspace=None, Tensor(a!) attention_out, "
        "Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))",
       false},
      {"_npu_fused_infer_attention_score_get_max_workspace",
        "_npu_fused_infer_attention_score_get_max_workspace(Tensor query, Tensor key, Tensor value, *, "
        "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
        "SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, "
        "Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
        "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, "
        "Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
        "Tensor? value_antiquant_offset=None, Tensor? block_table=None, Tensor? query_padding_size=None, "
        "Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
        "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
        "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
        "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
        "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
        "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
        "bool softmax_lse_flag=False) -> Tensor",
       false},
      {"npu_fused_infer_attention_score_v2",
        "npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, "
        "Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, "
        "Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
        "Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, "
        "Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
        "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, "
        "Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, "
        "Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, "
        "float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, "
        "str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, int query_quant_mode=0, "
        "int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "
        "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, "
        "int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, "
        "int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, "
        "int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, "
        "int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, "
        "int? out_dtype=None) -> (Tensor, Tensor)",
       false},
      {"npu_fused_infer_attention_score_v2.out",
        "npu_fused_infer_attention_score_v2.out(Tensor query, Tensor key, Tensor value, *, "
        "Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, "
        "Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
        "Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, "
        "Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
        "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, "
        "Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, "
        "Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, "
        "float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, "
        "str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, int query_quant_mode=0, "
        "int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "
        "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, "
        "int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, "
        "int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, "
        "int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, "
        "int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, "
        "int? out_dtype=None, Tensor? workspace=None, Tensor(a!) attention_out, "
        "Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))",
       false},
      {"_npu_fused_infer_attention_score_v2_get_max_workspace",
        "_npu_fused_infer_attention_score_v2_get_max_workspace(Tensor query, Tensor key, Tensor value, "
        "*, Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, "
        "Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
        "Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, "
        "Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
        "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, "
        "Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, "
        "Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, "
        "float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, "
        "str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, int query_quant_mode=0, "
        "int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "
        "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, "
        "int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, "
        "int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, "
        "int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, "
        "int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, "
        "int? out_dtype=None) -> Tensor",
       false},
      {"npu_fusion_attention",
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
        "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, "
        "int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, "
        "int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
        "str softmax_layout=\"\", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, "
        "int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
       false},
      {"npu_scatter_pa_kv_cache",
        "npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
        "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> ()",
       false},
      {"_npu_paged_attention",
        "_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
        "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out, *, "
        "Tensor? workspace=None) -> ()",
       true},
      {"_npu_paged_attention_get_workspace",
        "_npu_paged_attention_get_workspace(Tensor query, Tensor key_cache, Tensor value_cache, "
        "int num_kv_heads, int num_heads, float scale_value, Tensor block_table, Tensor context_lens, "
        "Tensor(a!) out) -> Tensor",
       true},
      {"_npu_reshape_and_cache",
        "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_indices) -> ()",
       true},
      // ---- MLA operators (issue 5)
      {"npu_interleave_rope", "npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor", false},
      {"npu_rotary_mul",
        "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
       false},
      {"npu_kv_rmsnorm_rope_cache",
        "npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, "
        "Tensor k_cache, Tensor ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, "
        "Tensor? k_rope_offset=None, Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-5, "
        "str cache_mode='Norm', bool is_output_kv=False) -> (Tensor, Tensor, Tensor, Tensor)",
       false},
      {"npu_gather_pa_kv_cache",
        "npu_gather_pa_kv_cache(Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor(a!) key, Tensor(b!) value, *, Tensor? seq_offset=None, bool is_seq_lens_cumsum=False) -> ()",
       false},
      {"npu_attention_update",
        "npu_attention_update(Tensor[] lse, Tensor[] local_out, int update_type) -> (Tensor, Tensor)", false},
      {"npu_transpose_batchmatmul",
        "npu_transpose_batchmatmul(Tensor input, Tensor weight, *, Tensor? bias=None, Tensor? scale=None, "
        "int[]? perm_x1=None, int[]? perm_x2=None, int[]? perm_y=None, int? batch_split_factor=1) -> Tensor",
       false},
      {"npu_mla_prolog_v3",
        "npu_mla_prolog_v3(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, "
        "Tensor rope_cos, Tensor(a!) kv_cache, Tensor(b!) kr_cache, *, Tensor? cache_index=None, "
        "Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
        "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
        "Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode=\"PA_BSND\", "
        "bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, "
        "int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, "
        "float qc_qr_scale=1.0, float kc_scale=1.0, int? token_x_dtype=None, int? weight_dq_dtype=None, "
        "int? weight_uq_qr_dtype=None, int? weight_dkv_kr_dtype=None, int? kv_cache_dtype=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
       false},
      {"npu_mla_prolog_v2",
        "npu_mla_prolog_v2(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, "
        "Tensor rope_cos, Tensor cache_index, Tensor kv_cache, Tensor kr_cache, *, "
        "Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
        "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
        "Tensor? smooth_scales_cq=None, float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, "
        "str cache_mode=\"PA_BSND\") -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
       false},
      // ---- sparse attention (SFA, DeepSeek-V3.2) and quantisation operators (issue 10)
      {"npu_lightning_indexer",
        "npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, "
        "int sparse_mode=3, int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, "
        "bool return_value=False) -> (Tensor, Tensor)",
       false},
      {"npu_quant_lightning_indexer",
        "npu_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, int query_quant_mode, int key_quant_mode, *, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, "
        "int sparse_mode=3, int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, "
        "int? query_dtype=None, int? key_dtype=None) -> Tensor",
       false},
      {"npu_sparse_flash_attention",
        "npu_sparse_flash_attention(Tensor query, Tensor key, Tensor? value, Tensor sparse_indices, "
        "float scale_value, *, Tensor? block_table=None, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_kv=None, Tensor? query_rope=None, Tensor? key_rope=None, "
        "int sparse_block_size=1, str layout_query=\"BSND\", str layout_kv=\"BSND\", int sparse_mode=3, "
        "int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int attention_mode=0, "
        "bool return_softmax_lse=False, Tensor? sinks=None) -> (Tensor, Tensor, Tensor)",
       false},
      {"npu_kv_quant_sparse_flash_attention",
        "npu_kv_quant_sparse_flash_attention(Tensor query, Tensor key, Tensor value, Tensor sparse_indices, "
        "float scale_value, int key_quant_mode, int value_quant_mode, *, Tensor? key_dequant_scale=None, "
        "Tensor? value_dequant_scale=None, Tensor? block_table=None, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_kv=None, int sparse_block_size=1, str layout_query=\"BSND\", "
        "str layout_kv=\"BSND\", int sparse_mode=3, int pre_tokens=9223372036854775807, "
        "int next_tokens=9223372036854775807, int attention_mode=0, int quant_scale_repo_mode=1, "
        "int tile_size=128, int rope_head_dim=64, int? key_dtype=None, int? value_dtype=None) -> Tensor",
       false},
      {"npu_scatter_nd_update_",
        "npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, Tensor updates) -> Tensor(a!)",
       false},
      {"npu_dynamic_quant",
        "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
        "int? dst_type=None, str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
       false},
      // ---- W8A8 linears of the quantised MLA-family preprocess (issue 10)
      {"npu_quantize",
        "npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, "
        "bool div_mode=True) -> Tensor",
       false},
      {"npu_quant_matmul",
        "npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, "
        "Tensor? pertoken_scale=None, Tensor? bias=None, int? output_dtype=None, int? x1_dtype=None, "
        "int? x2_dtype=None, int? pertoken_scale_dtype=None, int? scale_dtype=None, int[]? group_sizes=None, "
        "Tensor? y_scale=None) -> Tensor",
       false},
      // ---- the A5 MX-fp8 o_proj of the DeepSeek-V4 attention (issue 12, docs/design/dsa.md §5.2)
      {"npu_dynamic_mx_quant",
        "npu_dynamic_mx_quant(Tensor input, *, int axis=-1, str round_mode=\"rint\", int dst_type=296, "
        "int block_size=32, int? scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0) -> (Tensor, Tensor)",
       false},
      {"npu_transpose_quant_batchmatmul",
        "npu_transpose_quant_batchmatmul(Tensor x1, Tensor x2, int dtype, *, Tensor? bias=None, "
        "Tensor? x1_scale=None, Tensor? x2_scale=None, int[]? group_sizes=None, int[]? perm_x1=None, "
        "int[]? perm_x2=None, int[]? perm_y=None, int? batch_split_factor=1, int? x1_dtype=None, "
        "int? x2_dtype=None) -> Tensor",
       false},
      {"npu_dynamic_block_quant",
        "npu_dynamic_block_quant(Tensor x, *, float min_scale=0.0, str round_mode=\"rint\", int dst_type=1, "
        "int row_block_size=1, int col_block_size=128, float dst_type_max=0.0) -> (Tensor y, Tensor scale)",
       false},
  };
  return table;
}

}  // namespace aar::ops
