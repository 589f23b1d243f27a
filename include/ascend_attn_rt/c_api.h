/* The C ABI of ascend_attn_rt: the GQA (with its C8 and FA3 variants), MLA (with
 * LatentAttention), SFA and DSA backends (metadata builders and per-layer
 * attention) and graph mode, for engines that are not written in C++ (C, Rust,
 * Go, Zig, ... through their C FFI). Context parallelism: GQA, MLA and SFA DCP and PCP, DSA
 * DCP, over a communicator handle (aar_cp_comm_t); the other families are single rank here
 * (docs/c_api.md). Pure C11; also compiles as C++.
 *
 * Library: libascend_attn_rt_c.so (CMake: find_package(ascend_attn_rt
 * COMPONENTS c_api), target ascend_attn_rt::c_api; no Torch needed to compile or
 * link against it: the library finds libtorch at run time through its RUNPATH).
 * Include path: <prefix>/include and <prefix>/include/ascend_attn_rt/third_party
 * (DLPack's dlpack.h, shipped with its license; an engine's own dlpack.h of
 * major version 1 may come first on the path instead).
 *
 * ERRORS. Every function returns an aar_status_t. On anything but AAR_OK,
 * aar_last_error() is a message naming the function, the bad argument and its
 * value; nothing has been written (a rejected build leaves the previous
 * metadata valid, a rejected forward leaves the caches and the output
 * untouched), and output handles are left as they were. The message is per
 * thread and describes the last call that thread made (the empty string after a
 * success); it is valid until that thread's next call. No C++ exception crosses
 * this boundary.
 *
 * HANDLES. Opaque pointers made by *_create and freed by the matching
 * *_destroy (NULL is accepted and ignored). A handle is used by one thread at a
 * time (no internal locking); different handles may be used concurrently, but
 * MLA, LatentAttention, SFA and DSA layers that run concurrently need different
 * workspace groups (their configs' workspace_group), and a top-k buffer is used
 * by one thread at a time.
 * Handles are typed: each carries a tag that every function checks before it
 * uses the handle. NULL where a handle is required, a handle of another type
 * (an MLA metadata given to a GQA function, an impl given as a builder, any
 * pointer cast to a handle type) and a destroyed handle are rejected with
 * AAR_ERR_INVALID_ARGUMENT, the message naming the argument, the expected type
 * and what was found. A *_destroy given anything but a live handle of its type
 * frees nothing (so a double destroy is harmless) and leaves the reason in
 * aar_last_error() (a destroy that frees, or of NULL, leaves the message as it
 * was). Detecting a destroyed handle (or a metadata whose builder
 * was destroyed) is best effort: it holds for the most recently destroyed
 * handles (their memory is kept, marked dead, for a while); using an older
 * destroyed handle is undefined behaviour, as is any pointer that points at
 * fewer than 8 readable bytes.
 *
 * TENSORS cross as DLPack DLManagedTensor. The runtime BORROWS every tensor it
 * is given: it never calls a DLManagedTensor's deleter, and the caller keeps
 * ownership and frees it. The memory must stay valid
 *   - for per-call tensors (query, key, value, output, hidden): during the call;
 *   - for every tensor of a forward recorded into a graph capture (caches,
 *     query, output, ...): as long as that bucket exists (aar_graph_release /
 *     aar_graph_params_destroy), since replays read them at their addresses;
 *   - for construction tensors (GQA sinks, C8 scales, MLA / SFA / DSA weights,
 *     RoPE tables): until the handle is destroyed (the layers alias their
 *     weights; the MLA, SFA and DSA builders keep host copies of the tables, so
 *     those may go after create returns).
 * The DLManagedTensor structs themselves need only live during the call.
 * Tensors on an Ascend NPU are DLPack device kDLExtDev (torch's PrivateUse1,
 * which torch_npu registers); host tensors kDLCPU (or kDLCUDAHost, pinned host
 * memory). A kDLExtDev tensor or device is accepted only when torch_npu is
 * loaded in the process (its PrivateUse1 backend "npu" registered) and sees
 * that device_id; otherwise it is rejected by name, saying torch_npu is
 * needed. Strides may be NULL (compact row-major), else non-negative.
 * byte_offset is honoured; data + byte_offset must be a multiple of the
 * element size (bits / 8) when the tensor has elements. dtype: lanes 1, bits a
 * positive multiple of 8, a (code, bits) pair torch represents. Anything else
 * is rejected by name with its value.
 * Tensors the runtime RETURNS (aar_*_builder_block_table, aar_sfa_topk_buffer_tensor) are new
 * DLManagedTensors owned by the caller, who calls their deleter once; their
 * memory aliases the runtime's buffer, which the deleter keeps alive.
 *
 * HOST ARRAYS cross as pointer + length (int32 unless named otherwise); they
 * are read during the call only.
 *
 * METADATA. aar_*_builder_build returns a handle to the builder's metadata:
 * owned by the builder (one per builder, and one per draft lane for builders
 * with build_for_drafting: a build allocates none), valid until the builder is
 * destroyed, and describing the latest build of its lane (the next build
 * rewrites it in place, as the C++ API's `const Metadata&` does). */
#ifndef ASCEND_ATTN_RT_C_API_H_
#define ASCEND_ATTN_RT_C_API_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define AAR_C_API __attribute__((visibility("default")))
#else
#define AAR_C_API
#endif

/* Bumped when a struct, a signature or the handles' layout changes.
 * 2: typed handles (a metadata handle is no longer the builder's C++ metadata
 * object); byte_offset alignment and NPU availability checked.
 * 3: the C8, FA3, MLA LatentAttention, SFA and DSA families.
 * 4: the CP communicator and GQA DCP / PCP (new functions and structs only).
 * 5: GQA PCP speculative decode (aar_gqa_pcp_builder_ext_t, aar_gqa_pcp_builder_create_ext) and
 * decode graph capture (aar_gqa_pcp_builder_build_for_graph_capture, aar_graph_update_gqa_pcp;
 * aar_gqa_pcp_impl_forward records inside a capture); new functions and structs only.
 * 6: MLA context parallelism, DCP and PCP (aar_mla_builder_cp_t, aar_mla_builder_create_cp,
 * aar_mla_builder_pcp_local_rows, aar_mla_impl_create_cp); new functions and structs only.
 * 7: MLA build inputs with is_prefilling and draft_step (aar_mla_build_inputs_ext_t,
 * aar_mla_builder_build_ext); SFA context parallelism, DCP and PCP (aar_sfa_builder_cp_t,
 * aar_sfa_builder_create_cp, aar_sfa_builder_pcp_local_rows, aar_sfa_impl_create_cp); DSA DCP
 * (aar_dsa_step_builder_cp_t, aar_dsa_step_builder_create_cp, aar_dsa_impl_create_cp); new
 * functions and structs only. */
#define AAR_C_API_VERSION 7

typedef enum aar_status {
  AAR_OK = 0,
  AAR_ERR_INVALID_ARGUMENT = 1, /* bad input: the message names the argument and its value */
  AAR_ERR_NOT_SUPPORTED = 2,    /* a feature the runtime does not implement: the message names it */
  AAR_ERR_OUT_OF_MEMORY = 3,
  AAR_ERR_RUNTIME = 4 /* anything else (an operator failed, a device error, ...) */
} aar_status_t;

AAR_C_API int aar_c_api_version(void);
/* "AAR_OK", "AAR_ERR_INVALID_ARGUMENT", ...; "unknown" for other values. */
AAR_C_API const char* aar_status_name(aar_status_t status);
/* The calling thread's message for its last call (see ERRORS above). Never NULL. */
AAR_C_API const char* aar_last_error(void);

/* Operator provider (process-wide): AAR_PROVIDER_AUTO follows the tensors'
 * device (torch_npu's operators on an NPU, the CPU twins on the host). */
typedef enum aar_provider {
  AAR_PROVIDER_AUTO = 0,
  AAR_PROVIDER_NPU = 1,
  AAR_PROVIDER_CPU = 2,
  AAR_PROVIDER_NO_COMPUTE = 3
} aar_provider_t;
AAR_C_API aar_status_t aar_set_provider(aar_provider_t provider);

/* Attention state of a step (docs/design/gqa.md §2.1); AAR_STATE_AUTO: derived by the build. */
typedef enum aar_attn_state {
  AAR_STATE_AUTO = -1,
  AAR_STATE_PREFILL_NO_CACHE = 0,
  AAR_STATE_PREFILL_CACHE_HIT = 1,
  AAR_STATE_DECODE_ONLY = 2,
  AAR_STATE_CHUNKED_PREFILL = 3,
  AAR_STATE_SPEC_DECODING = 4
} aar_attn_state_t;

/* Tri-state for options whose C++ default depends on the device. */
typedef enum aar_tristate { AAR_DEFAULT = -1, AAR_FALSE = 0, AAR_TRUE = 1 } aar_tristate_t;

/* Every config / inputs struct starts with struct_size: fill it with its
 * aar_*_init function (which sets the C++ defaults), then set fields. A struct
 * whose struct_size is not sizeof(the struct) is rejected by name (an
 * uninitialised struct, or a caller built against another version). */

/* ---------------------------------------------------------------- GQA / MHA */

typedef struct aar_gqa_builder aar_gqa_builder_t;
typedef struct aar_gqa_impl aar_gqa_impl_t;
typedef struct aar_gqa_metadata aar_gqa_metadata_t;

typedef struct aar_gqa_builder_config {
  size_t struct_size;
  int32_t max_num_reqs;           /* 256 */
  int32_t max_num_tokens;         /* 8192 */
  int32_t max_blocks_per_req;     /* 64 */
  int32_t block_size;             /* 128 */
  int32_t num_blocks;             /* required (range checks of block ids and slots) */
  int32_t num_speculative_tokens; /* 0; decode threshold 1 + this (<= 16) */
  int32_t spec_method;            /* 0 none, 1 MTP, 2 other */
  int32_t chunked_prefill_enabled; /* 1 */
  int32_t pooling;                /* 0: model_runner_type == "pooling" */
  int32_t pad_fia_batch;          /* 1: a dummy request for padded tokens (docs/design/gqa.md §2.5) */
  int32_t uniform_decode_padding; /* 0 */
  DLDevice device;                /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers; /* AAR_DEFAULT: separate unless the device is the CPU */
  int32_t staging_buffers;        /* 2 (1..4) */
  aar_tristate_t dense_context;   /* AAR_DEFAULT: on demand, once per build, when a layer reads it; 1: every build; 0: never */
} aar_gqa_builder_config_t;
AAR_C_API void aar_gqa_builder_config_init(aar_gqa_builder_config_t* config);

typedef struct aar_gqa_build_inputs {
  size_t struct_size;
  const int32_t* query_start_loc; /* B+1 exclusive prefix sums */
  size_t query_start_loc_len;
  const int32_t* seq_lens; /* B: context + new tokens */
  size_t seq_lens_len;
  const int32_t* block_table; /* B x block_table_stride, row-major, host */
  size_t block_table_len;
  int32_t block_table_stride;
  int32_t num_input_tokens;       /* 0: query_start_loc[B] */
  aar_attn_state_t attn_state;    /* AAR_STATE_AUTO */
  const uint8_t* is_prefilling;   /* optional (NULL, 0) */
  size_t is_prefilling_len;
  const int32_t* num_spec_tokens; /* optional (NULL, 0) */
  size_t num_spec_tokens_len;
  int32_t causal; /* 1 */
} aar_gqa_build_inputs_t;
AAR_C_API void aar_gqa_build_inputs_init(aar_gqa_build_inputs_t* inputs);

/* Facts of a build, for the engine (which output rows are written, ...). */
typedef struct aar_gqa_metadata_info {
  size_t struct_size;
  aar_attn_state_t attn_state;
  int32_t num_reqs;          /* scheduled (real) requests */
  int32_t num_kernel_reqs;   /* requests the kernels see (incl. a padding dummy) */
  int32_t num_actual_tokens; /* scheduled tokens (written to the cache) */
  int32_t num_input_tokens;  /* rows the layers receive */
  int32_t num_kernel_tokens; /* rows a forward writes into its output */
  int32_t num_decodes, num_prefills, num_decode_tokens;
  int32_t max_query_len, max_seq_len;
  uint64_t generation; /* the build's generation (1 for the first build) */
} aar_gqa_metadata_info_t;

AAR_C_API aar_status_t aar_gqa_builder_create(const aar_gqa_builder_config_t* config, aar_gqa_builder_t** out);
AAR_C_API void aar_gqa_builder_destroy(aar_gqa_builder_t* builder);
/* Validates, plans and stages one step; *out: the builder's metadata (see METADATA). */
AAR_C_API aar_status_t aar_gqa_builder_build(aar_gqa_builder_t* builder, const aar_gqa_build_inputs_t* inputs,
                                             const aar_gqa_metadata_t** out);
/* Graph capture of a bucket (docs/design/gqa.md §3.4): state DECODE_ONLY, CHUNKED_PREFILL or SPEC_DECODING. */
AAR_C_API aar_status_t aar_gqa_builder_build_for_graph_capture(aar_gqa_builder_t* builder,
                                                               const aar_gqa_build_inputs_t* inputs,
                                                               aar_attn_state_t state,
                                                               const aar_gqa_metadata_t** out);
/* The host int32 (capacity, max_blocks_per_req) block table an engine may keep
 * its block table in and pass back as inputs.block_table (zero copy on the
 * CPU). A new DLManagedTensor the caller frees (see TENSORS). */
AAR_C_API aar_status_t aar_gqa_builder_block_table(aar_gqa_builder_t* builder, DLManagedTensor** out);
/* info->struct_size must be set (sizeof(aar_gqa_metadata_info_t)). */
AAR_C_API aar_status_t aar_gqa_metadata_get_info(const aar_gqa_metadata_t* metadata, aar_gqa_metadata_info_t* info);

typedef struct aar_gqa_impl_config {
  size_t struct_size;
  int64_t num_heads;
  int64_t head_size;
  double scale;           /* 0: 1/sqrt(head_size) */
  int64_t num_kv_heads;   /* 0: num_heads */
  int64_t sliding_window; /* 0: none; else > 0 (keys in (p - W, p]) */
  const DLManagedTensor* sinks; /* NULL or (num_heads,) learnable sinks (borrowed until destroy) */
  int32_t has_alibi_slopes;     /* 0; 1 is rejected (not supported) */
  double logits_soft_cap;       /* 0: none; > 0 is rejected (not supported) */
  const char* kv_cache_dtype;   /* NULL: "auto" (the only one; INT8 is the C8 backend) */
  int32_t attn_type;            /* 0 decoder, 1 encoder-only, 2 encoder, 3 encoder-decoder (rejected) */
  int32_t kv_sharing;           /* 0 */
  int32_t device_kind;          /* 0 A2, 1 A3, 2 A5, 3 310P */
  int32_t has_speculative_config;
  int32_t full_decode_only_graph;
  const int32_t* pa_shape_list; /* optional (NULL, 0) */
  size_t pa_shape_list_len;
  int64_t layer_index; /* -1 */
  int32_t kv_cache_group;
} aar_gqa_impl_config_t;
AAR_C_API void aar_gqa_impl_config_init(aar_gqa_impl_config_t* config);

AAR_C_API aar_status_t aar_gqa_impl_create(const aar_gqa_impl_config_t* config, aar_gqa_impl_t** out);
AAR_C_API void aar_gqa_impl_destroy(aar_gqa_impl_t* impl);
/* query (T, N, D); key/value (T, Nkv, D) or both NULL (no cache write);
 * key_cache/value_cache (num_blocks, block_size, Nkv, D) contiguous, or both
 * NULL (encoder layers without a cache); output (T, N, D), rows
 * [0, num_kernel_tokens) written. metadata NULL (profiling run) zero-fills the
 * output. Inside an open capture (aar_graph_begin_capture, same thread) the
 * calls are recorded instead. */
AAR_C_API aar_status_t aar_gqa_impl_forward(aar_gqa_impl_t* impl, const DLManagedTensor* query,
                                            const DLManagedTensor* key, const DLManagedTensor* value,
                                            const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                            const aar_gqa_metadata_t* metadata, const DLManagedTensor* output);
/* Which kernel path the last forward took (gqa::ForwardPath, e.g. "fused_paged"); never NULL:
 * "" when impl is NULL or not a live aar_gqa_impl_t (aar_last_error() says which). */
AAR_C_API const char* aar_gqa_impl_last_path(const aar_gqa_impl_t* impl);

/* ---------------------------------------------------------------- C8 and FA3
 * GQA variants over the GQA builder's metadata (aar_gqa_metadata_t), each a layer
 * type of its own with the GQA forward's arguments. C8 (docs/design/gqa.md §5):
 * the static INT8 KV cache, int8 NZ (num_blocks, Nkv, D/32, block_size, 32) or
 * the ND shape (num_blocks, block_size, Nkv, D) holding NZ bytes; block_size 32,
 * 64 or 128, head_size a multiple of 32. FA3 (docs/design/gqa.md §6): K/V read
 * from the paged cache (block_size 128) in up to two kernel calls. Neither has
 * sliding windows, sinks, ALiBi or a logits soft cap (GQA's fields, absent here). */

typedef struct aar_c8_impl aar_c8_impl_t;
typedef struct aar_fa3_impl aar_fa3_impl_t;

typedef struct aar_c8_impl_config {
  size_t struct_size;
  int64_t num_heads, head_size;
  double scale;           /* 0: 1/sqrt(head_size) */
  int64_t num_kv_heads;   /* 0: num_heads */
  int32_t attn_type;      /* as aar_gqa_impl_config_t */
  int32_t kv_sharing;     /* 0 */
  int32_t kv_transfer;    /* 0 none, 1 producer (float caches, the GQA path), 2 consumer */
  int32_t device_kind;    /* 0 A2, 1 A3, 2 A5, 3 310P */
  int64_t tp_rank, tp_size; /* 0, 1: the shard of all-head scales */
  /* The checkpoint's k_cache_scale, k_cache_offset, v_cache_scale, v_cache_offset (any shape:
   * 1 element, Nkv*D, or every head's), borrowed until destroy. */
  const DLManagedTensor *k_scale, *k_offset, *v_scale, *v_offset;
  int64_t layer_index;    /* -1 */
  int32_t kv_cache_group;
} aar_c8_impl_config_t;
AAR_C_API void aar_c8_impl_config_init(aar_c8_impl_config_t* config);
AAR_C_API aar_status_t aar_c8_impl_create(const aar_c8_impl_config_t* config, aar_c8_impl_t** out);
AAR_C_API void aar_c8_impl_destroy(aar_c8_impl_t* impl);
/* As aar_gqa_impl_forward (query/key/value float, the caches C8's); rows [0, num_actual_tokens) written. */
AAR_C_API aar_status_t aar_c8_impl_forward(aar_c8_impl_t* impl, const DLManagedTensor* query,
                                           const DLManagedTensor* key, const DLManagedTensor* value,
                                           const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                           const aar_gqa_metadata_t* metadata, const DLManagedTensor* output);
/* The last forward's path ("c8_decode", "c8_dequant", ...); "" as aar_gqa_impl_last_path. */
AAR_C_API const char* aar_c8_impl_last_path(const aar_c8_impl_t* impl);

typedef struct aar_fa3_impl_config {
  size_t struct_size;
  int64_t num_heads, head_size;
  double scale;           /* 0: 1/sqrt(head_size) */
  int64_t num_kv_heads;   /* 0: num_heads */
  int32_t attn_type;      /* as aar_gqa_impl_config_t */
  int32_t kv_sharing;     /* 0 */
  int32_t enforce_eager;  /* 1 */
  int32_t full_decode_only_graph; /* 0 */
} aar_fa3_impl_config_t;
AAR_C_API void aar_fa3_impl_config_init(aar_fa3_impl_config_t* config);
AAR_C_API aar_status_t aar_fa3_impl_create(const aar_fa3_impl_config_t* config, aar_fa3_impl_t** out);
AAR_C_API void aar_fa3_impl_destroy(aar_fa3_impl_t* impl);
/* As aar_gqa_impl_forward; caches (num_blocks, 128, Nkv, D). */
AAR_C_API aar_status_t aar_fa3_impl_forward(aar_fa3_impl_t* impl, const DLManagedTensor* query,
                                            const DLManagedTensor* key, const DLManagedTensor* value,
                                            const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                            const aar_gqa_metadata_t* metadata, const DLManagedTensor* output);
/* "fa3_paged" or "encoder"; "" as aar_gqa_impl_last_path. */
AAR_C_API const char* aar_fa3_impl_last_path(const aar_fa3_impl_t* impl);

/* ---------------------------------------------------------------- MLA */

typedef struct aar_mla_builder aar_mla_builder_t;
typedef struct aar_mla_impl aar_mla_impl_t;
typedef struct aar_mla_metadata aar_mla_metadata_t;

typedef struct aar_mla_builder_config {
  size_t struct_size;
  int32_t max_num_reqs, max_num_tokens, max_blocks_per_req, block_size; /* 256, 8192, 64, 128 */
  int32_t num_blocks;             /* required */
  int32_t max_model_len;          /* 0: max_blocks_per_req * block_size */
  int32_t num_speculative_tokens; /* 0 */
  int32_t chunked_prefill_enabled; /* 1 */
  int32_t graph_decode_padding;   /* 0 (docs/design/mla.md §3.5 "enable-pad") */
  int32_t disable_padded_drafter_batch; /* 0 */
  int64_t workspace_tokens;       /* 0: the upstream rule */
  /* RoPE tables (max_position, R), both halves equal (docs/design/mla.md §1.3); required.
   * The builder keeps a host copy: borrowed during create only. */
  const DLManagedTensor* cos_table;
  const DLManagedTensor* sin_table;
  DLDevice device; /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers;
  int32_t staging_buffers; /* 2 */
} aar_mla_builder_config_t;
AAR_C_API void aar_mla_builder_config_init(aar_mla_builder_config_t* config);

typedef struct aar_mla_build_inputs {
  size_t struct_size;
  const int32_t* query_start_loc;
  size_t query_start_loc_len;
  const int32_t* seq_lens;
  size_t seq_lens_len;
  const int32_t* block_table;
  size_t block_table_len;
  int32_t block_table_stride;
  int32_t num_input_tokens;    /* 0: query_start_loc[B] */
  aar_attn_state_t attn_state; /* AAR_STATE_AUTO */
  const int32_t* num_spec_tokens; /* optional */
  size_t num_spec_tokens_len;
} aar_mla_build_inputs_t;
AAR_C_API void aar_mla_build_inputs_init(aar_mla_build_inputs_t* inputs);

typedef struct aar_mla_metadata_info {
  size_t struct_size;
  aar_attn_state_t attn_state;
  int32_t num_reqs;        /* scheduled (real) requests */
  int32_t num_kernel_reqs; /* requests the kernels see (incl. graph decode padding's dummies) */
  int32_t num_actual_tokens, num_input_tokens;
  int32_t num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens;
  uint64_t generation;
} aar_mla_metadata_info_t;

AAR_C_API aar_status_t aar_mla_builder_create(const aar_mla_builder_config_t* config, aar_mla_builder_t** out);
AAR_C_API void aar_mla_builder_destroy(aar_mla_builder_t* builder);
AAR_C_API aar_status_t aar_mla_builder_build(aar_mla_builder_t* builder, const aar_mla_build_inputs_t* inputs,
                                             const aar_mla_metadata_t** out);
AAR_C_API aar_status_t aar_mla_builder_block_table(aar_mla_builder_t* builder, DLManagedTensor** out);
AAR_C_API aar_status_t aar_mla_metadata_get_info(const aar_mla_metadata_t* metadata, aar_mla_metadata_info_t* info);

typedef struct aar_mla_impl_config {
  size_t struct_size;
  int64_t num_heads, hidden_size;
  int64_t q_lora_rank;      /* 0: no q-LoRA (q_proj straight from hidden) */
  int64_t kv_lora_rank;     /* L, 512 */
  int64_t qk_nope_head_dim; /* P, 128 */
  int64_t qk_rope_head_dim; /* R, 64 */
  int64_t v_head_dim;       /* V, 128 */
  double scale;             /* 0: 1/sqrt(P+R) */
  double q_norm_eps, kv_norm_eps; /* 1e-6 */
  int32_t enable_prolog;    /* 0 */
  int32_t enable_kv_nz;     /* 0 */
  int64_t layer_index;      /* -1 */
  aar_tristate_t prefill_in_bf16; /* AAR_DEFAULT: when the operators run on the NPU */
  int64_t workspace_group;  /* 0 */
} aar_mla_impl_config_t;
AAR_C_API void aar_mla_impl_config_init(aar_mla_impl_config_t* config);

/* Linear weights in torch layout (out_features, in_features), borrowed until
 * the impl is destroyed (it aliases them). Unquantised weights only: the C ABI
 * has no W8A8 / FA-quant weights yet. */
typedef struct aar_mla_weights {
  size_t struct_size;
  const DLManagedTensor* q_a_proj;      /* (Q, hidden), with q-LoRA; else NULL */
  const DLManagedTensor* q_a_layernorm; /* (Q), with q-LoRA; else NULL */
  const DLManagedTensor* q_proj;        /* (H*(P+R), Q or hidden) */
  const DLManagedTensor* kv_a_proj_with_mqa; /* (L+R, hidden) */
  const DLManagedTensor* kv_a_layernorm;     /* (L) */
  const DLManagedTensor* kv_b_proj;          /* (H*(P+V), L) */
  const DLManagedTensor* o_proj;             /* (hidden, H*V) */
} aar_mla_weights_t;
AAR_C_API void aar_mla_weights_init(aar_mla_weights_t* weights);

AAR_C_API aar_status_t aar_mla_impl_create(const aar_mla_impl_config_t* config, const aar_mla_weights_t* weights,
                                           aar_mla_impl_t** out);
AAR_C_API void aar_mla_impl_destroy(aar_mla_impl_t* impl);
/* hidden (T, hidden_size); nope_cache (nb, bs, 1, L) and rope_cache (nb, bs, 1, R)
 * (or their NZ forms with enable_kv_nz), contiguous; output (T, hidden_size).
 * metadata NULL zero-fills the output. Decode-only steps inside an open capture
 * are recorded. */
AAR_C_API aar_status_t aar_mla_impl_forward(aar_mla_impl_t* impl, const DLManagedTensor* hidden,
                                            const DLManagedTensor* nope_cache, const DLManagedTensor* rope_cache,
                                            const aar_mla_metadata_t* metadata, const DLManagedTensor* output);

/* ---------------------------------------------------------------- MLA LatentAttention
 * MLA attention without the projections (docs/design/mla.md §5.3, §5.5, §5.6), for
 * engines whose model code projects itself: the cache write, the absorbed decode,
 * the un-absorbed prefill, over aar_mla_builder_t's metadata. Not supported (each
 * refused by name): graph decode padding, NZ / FA-quant caches, graph capture.
 * Caches: nope (nb, bs, 1, L) and rope (nb, bs, 1, R); one engine buffer
 * (nb, bs, L + R) holds both as its first nb*bs*L elements and the rest. */

typedef struct aar_mla_latent aar_mla_latent_t;

typedef struct aar_mla_latent_config {
  size_t struct_size;
  int64_t num_heads;        /* required */
  int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; /* 512, 128, 64, 128 */
  double scale;             /* 0: 1/sqrt(P+R) */
  aar_tristate_t prefill_in_bf16; /* AAR_DEFAULT: when the operators run on the NPU */
  int64_t workspace_group;  /* 0 (as aar_mla_impl_config_t) */
} aar_mla_latent_config_t;
AAR_C_API void aar_mla_latent_config_init(aar_mla_latent_config_t* config);
AAR_C_API aar_status_t aar_mla_latent_create(const aar_mla_latent_config_t* config, aar_mla_latent_t** out);
AAR_C_API void aar_mla_latent_destroy(aar_mla_latent_t* latent);
/* kv_c (T, L) and k_pe (T, R) or (T, 1, R), rows r < len(slot_mapping) written at
 * slot_mapping[r] (int64 or int32; negative: skipped). Everything checked before the first write. */
AAR_C_API aar_status_t aar_mla_latent_write_kv(aar_mla_latent_t* latent, const DLManagedTensor* kv_c,
                                               const DLManagedTensor* k_pe, const DLManagedTensor* slot_mapping,
                                               const DLManagedTensor* nope_cache, const DLManagedTensor* rope_cache);
/* The step's decode tokens: ql_nope (B, H, L) (q_nope with W_UK absorbed) and q_pe (B, H, R);
 * out (B, H, L) contiguous gets the latent output (the engine applies W_UV). metadata NULL
 * zero-fills out. */
AAR_C_API aar_status_t aar_mla_latent_forward_decode(aar_mla_latent_t* latent, const DLManagedTensor* ql_nope,
                                                     const DLManagedTensor* q_pe, const DLManagedTensor* nope_cache,
                                                     const DLManagedTensor* rope_cache,
                                                     const aar_mla_metadata_t* metadata, const DLManagedTensor* out);
/* The step's prefill tokens (after the decodes): q (tp, H, P+R), kv_c (tp, L), k_pe (tp, R) or
 * (tp, 1, R); out (tp, H*V) gets the attention output; kv_b_proj (H*(P+V), L) in the
 * activations' dtype. metadata NULL zero-fills out. */
AAR_C_API aar_status_t aar_mla_latent_forward_prefill(aar_mla_latent_t* latent, const DLManagedTensor* q,
                                                      const DLManagedTensor* kv_c, const DLManagedTensor* k_pe,
                                                      const DLManagedTensor* nope_cache,
                                                      const DLManagedTensor* rope_cache,
                                                      const aar_mla_metadata_t* metadata, const DLManagedTensor* out,
                                                      const DLManagedTensor* kv_b_proj);

/* ---------------------------------------------------------------- SFA
 * DeepSeek-V3.2 sparse attention (docs/design/sfa.md): the MLA family's latent
 * caches plus the lightning indexer's cache, and the model's top-k buffer.
 * Unquantised weights, no KV offload: W8A8 weights and the offload variant are
 * not in the C ABI; context parallelism (DCP, PCP) is the "SFA context parallel"
 * section after the MLA one (version 7), DSA-CP token sharding is not in the C ABI. The
 * indexer cache group has no builder here: its layers read the main
 * metadata (docs/design/sfa.md §2.3). */

typedef struct aar_sfa_builder aar_sfa_builder_t;
typedef struct aar_sfa_impl aar_sfa_impl_t;
typedef struct aar_sfa_metadata aar_sfa_metadata_t;
typedef struct aar_sfa_topk_buffer aar_sfa_topk_buffer_t;

typedef struct aar_sfa_builder_config {
  size_t struct_size;
  int32_t max_num_reqs, max_num_tokens, max_blocks_per_req, block_size; /* 256, 8192, 64, 128 */
  int32_t num_blocks;             /* required */
  int32_t num_speculative_tokens; /* 0 */
  int32_t num_drafts;             /* -1: num_speculative_tokens (draft lanes of build_for_drafting) */
  int32_t chunked_prefill_enabled; /* 1 */
  int32_t graph_decode_padding;   /* 0 */
  /* RoPE tables (max_position, R), both halves equal; required, borrowed during create only. */
  const DLManagedTensor* cos_table;
  const DLManagedTensor* sin_table;
  DLDevice device; /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers;
  int32_t staging_buffers; /* 2 */
} aar_sfa_builder_config_t;
AAR_C_API void aar_sfa_builder_config_init(aar_sfa_builder_config_t* config);

typedef struct aar_sfa_build_inputs {
  size_t struct_size;
  const int32_t* query_start_loc;
  size_t query_start_loc_len;
  const int32_t* seq_lens;
  size_t seq_lens_len;
  const int32_t* block_table;
  size_t block_table_len;
  int32_t block_table_stride;
  int32_t num_input_tokens;    /* 0: query_start_loc[B] */
  aar_attn_state_t attn_state; /* AAR_STATE_AUTO */
  const int32_t* num_spec_tokens; /* optional */
  size_t num_spec_tokens_len;
} aar_sfa_build_inputs_t;
AAR_C_API void aar_sfa_build_inputs_init(aar_sfa_build_inputs_t* inputs);

typedef struct aar_sfa_metadata_info {
  size_t struct_size;
  aar_attn_state_t attn_state;
  int32_t num_reqs, num_kernel_reqs; /* scheduled; incl. graph decode padding's dummies */
  int32_t num_actual_tokens, num_input_tokens;
  int32_t num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens;
  int32_t max_query_len, max_seq_len;
  int32_t draft_index; /* -1: a main build */
  uint64_t generation;
} aar_sfa_metadata_info_t;

AAR_C_API aar_status_t aar_sfa_builder_create(const aar_sfa_builder_config_t* config, aar_sfa_builder_t** out);
AAR_C_API void aar_sfa_builder_destroy(aar_sfa_builder_t* builder);
/* *out: the main lane's metadata (see METADATA). */
AAR_C_API aar_status_t aar_sfa_builder_build(aar_sfa_builder_t* builder, const aar_sfa_build_inputs_t* inputs,
                                             const aar_sfa_metadata_t** out);
/* state AAR_STATE_DECODE_ONLY or AAR_STATE_SPEC_DECODING (others: AAR_ERR_NOT_SUPPORTED). */
AAR_C_API aar_status_t aar_sfa_builder_build_for_graph_capture(aar_sfa_builder_t* builder,
                                                               const aar_sfa_build_inputs_t* inputs,
                                                               aar_attn_state_t state,
                                                               const aar_sfa_metadata_t** out);
/* A draft step in lane draft_index ([0, num_drafts)); *out: that lane's metadata, one per lane,
 * owned by the builder like the main one (a draft build leaves the main metadata as it was). */
AAR_C_API aar_status_t aar_sfa_builder_build_for_drafting(aar_sfa_builder_t* builder,
                                                          const aar_sfa_build_inputs_t* inputs, int32_t draft_index,
                                                          const aar_sfa_metadata_t** out);
AAR_C_API aar_status_t aar_sfa_builder_block_table(aar_sfa_builder_t* builder, DLManagedTensor** out);
AAR_C_API aar_status_t aar_sfa_metadata_get_info(const aar_sfa_metadata_t* metadata, aar_sfa_metadata_info_t* info);

/* The model's top-k buffer (docs/design/sparse.md §6): (max_num_tokens, index_topk) int32 on
 * `device`, filled with -1. One per engine, shared by its SFA layers in order: a layer with
 * an indexer and use_index_cache writes its selection, a layer without an indexer reads it. */
AAR_C_API aar_status_t aar_sfa_topk_buffer_create(int64_t max_num_tokens, int64_t index_topk, DLDevice device,
                                                  aar_sfa_topk_buffer_t** out);
AAR_C_API void aar_sfa_topk_buffer_destroy(aar_sfa_topk_buffer_t* buffer);
/* The whole buffer, lent (a new DLManagedTensor the caller frees, see TENSORS). */
AAR_C_API aar_status_t aar_sfa_topk_buffer_tensor(aar_sfa_topk_buffer_t* buffer, DLManagedTensor** out);

typedef struct aar_sfa_impl_config {
  size_t struct_size;
  int64_t num_heads, hidden_size;
  int64_t q_lora_rank;      /* 0: no q-LoRA */
  int64_t kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim; /* 512, 128, 64, 128 */
  double scale;             /* 0: 1/sqrt(P+R) */
  double q_norm_eps, kv_norm_eps; /* 1e-6 */
  int32_t has_indexer;      /* 1; 0: the layer reuses the top-k buffer's selection */
  int64_t index_n_heads, index_head_dim, index_topk; /* 64, 128, 2048 (with an indexer) */
  double index_k_norm_eps;  /* 1e-6 */
  int32_t glm_moe_dsa;      /* 0: 1 rotates the indexer's interleaved pairs (GLM-MoE-DSA) */
  int32_t use_index_cache;  /* 0: 1 writes the indexer's top-k into the top-k buffer */
  int32_t sfa_c8, li_c8;    /* 0: the quantised main / indexer cache (docs/design/sfa.md §5) */
  int32_t device_kind;      /* 0 A2, 1 A3, 2 A5, 3 310P (decides the C8 dtypes) */
  int64_t layer_index;      /* -1 */
  int64_t workspace_group;  /* 0 */
  int32_t is_kv_consumer, is_kv_producer, chunked_q_proj; /* 0: the preprocess selection's inputs (§4.2) */
} aar_sfa_impl_config_t;
AAR_C_API void aar_sfa_impl_config_init(aar_sfa_impl_config_t* config);

/* The lightning indexer's weights, torch layout, borrowed until the impl is destroyed. */
typedef struct aar_sfa_indexer_weights {
  size_t struct_size;
  const DLManagedTensor* wq_b;          /* (n_heads * head_dim, Q or hidden) */
  const DLManagedTensor* wk;            /* (head_dim, hidden) */
  const DLManagedTensor* weights_proj;  /* (n_heads, hidden) */
  const DLManagedTensor* k_norm_weight; /* (head_dim) */
  const DLManagedTensor* k_norm_bias;   /* (head_dim) */
} aar_sfa_indexer_weights_t;
AAR_C_API void aar_sfa_indexer_weights_init(aar_sfa_indexer_weights_t* weights);

/* weights: the MLA layer's (aar_mla_weights_t); indexer_weights: given exactly when has_indexer. */
AAR_C_API aar_status_t aar_sfa_impl_create(const aar_sfa_impl_config_t* config, const aar_mla_weights_t* weights,
                                           const aar_sfa_indexer_weights_t* indexer_weights, aar_sfa_impl_t** out);
AAR_C_API void aar_sfa_impl_destroy(aar_sfa_impl_t* impl);
/* hidden (T, hidden_size); output (T, hidden_size). kv_cache: the layer's cache tuple
 * (num_kv_cache tensors, contiguous), main part then indexer part (docs/design/sfa.md §2.2):
 *   sfa_c8 li_c8  tuple
 *   0      0      nope (nb, bs, 1, L), rope (nb, bs, 1, R), index_k (nb', bs, 1, D_i)
 *   1      0      packed (nb, bs, 1, 656) int8/fp8, index_k
 *   0      1      nope, rope, index_k int8/fp8, index_scale (nb', bs, 1, 1)
 *   1      1      packed, index_k, index_scale
 * without an indexer the indexer part is absent. topk: the model's buffer, required by
 * layers without an indexer or with use_index_cache, else may be NULL. metadata NULL
 * zero-fills the output. Inside an open capture the layer is recorded (decode buckets,
 * built with aar_sfa_builder_build_for_graph_capture; replays need no update). */
AAR_C_API aar_status_t aar_sfa_impl_forward(aar_sfa_impl_t* impl, const DLManagedTensor* hidden,
                                            const DLManagedTensor* const* kv_cache, size_t num_kv_cache,
                                            const aar_sfa_metadata_t* metadata, const DLManagedTensor* output,
                                            aar_sfa_topk_buffer_t* topk);

/* ---------------------------------------------------------------- DSA
 * DeepSeek-V4 attention (docs/design/dsa.md): a step builder per step, a group
 * builder per KV-cache group (SWA, compressed KV, compressor states, indexer),
 * and the layer, which picks the groups its compress ratio reads from all of the
 * step's group metadata (route_layer). DCP: the "DSA context parallel" section
 * (version 7); DSA-CP and PCP are not in the C ABI. Layers with an indexer cache share the model's top-k
 * buffer, an aar_sfa_topk_buffer_t (the same buffer type). */

typedef struct aar_dsa_step_builder aar_dsa_step_builder_t;
typedef struct aar_dsa_group_builder aar_dsa_group_builder_t;
typedef struct aar_dsa_impl aar_dsa_impl_t;
typedef struct aar_dsa_step_metadata aar_dsa_step_metadata_t;
typedef struct aar_dsa_group_metadata aar_dsa_group_metadata_t;

/* The cache kinds (docs/design/dsa.md §2.2). */
typedef enum aar_dsa_cache_kind {
  AAR_DSA_SWA = 0,
  AAR_DSA_C4_KV = 1,
  AAR_DSA_C128_KV = 2,
  AAR_DSA_C4_INDEXER_K = 3,
  AAR_DSA_C4_ATTN_STATE = 4,
  AAR_DSA_C4_INDEXER_STATE = 5,
  AAR_DSA_C128_STATE = 6
} aar_dsa_cache_kind_t;

/* What the KV plan is made from (docs/design/dsa.md §4.2); groups and layers of one model give the same. */
typedef struct aar_dsa_plan_config {
  int32_t device_kind;     /* 0 A2, 1 A3, 2 A5 */
  const char* cache_dtype; /* NULL: not set; else the engine's cache dtype ("auto", "fp8", ...) */
  int32_t model_dtype;     /* the attention KV dtype off A5: 0 bfloat16 (default), 1 float16 */
} aar_dsa_plan_config_t;

typedef struct aar_dsa_step_builder_config {
  size_t struct_size;
  int32_t max_num_reqs, max_num_tokens; /* 256, 8192 */
  int32_t num_speculative_tokens;       /* 0 */
  int32_t num_drafts;                   /* -1: num_speculative_tokens */
  int32_t chunked_prefill_enabled;      /* 1 */
  /* RoPE tables (max_position, R), required; the compressor's pair optional (both or neither).
   * Borrowed during create only. */
  const DLManagedTensor* cos_table;
  const DLManagedTensor* sin_table;
  const DLManagedTensor* compress_cos_table;
  const DLManagedTensor* compress_sin_table;
  /* The model (read by every group builder of the step): D, W, heads, the indexer's. */
  int32_t head_dim, window;             /* 512, 128 */
  int32_t dspark_num_spec, dspark_width; /* 0, 0 */
  int32_t num_heads_q;                  /* required */
  int32_t index_topk, index_n_heads, index_head_dim; /* 512, 64, 128 */
  DLDevice device; /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers;
  int32_t staging_buffers; /* 2 */
} aar_dsa_step_builder_config_t;
AAR_C_API void aar_dsa_step_builder_config_init(aar_dsa_step_builder_config_t* config);

typedef struct aar_dsa_step_inputs {
  size_t struct_size;
  const int32_t* query_start_loc;
  size_t query_start_loc_len;
  const int32_t* seq_lens;
  size_t seq_lens_len;
  int32_t num_input_tokens;    /* 0: query_start_loc[B] */
  aar_attn_state_t attn_state; /* AAR_STATE_AUTO */
  const int32_t* num_spec_tokens; /* optional */
  size_t num_spec_tokens_len;
  int32_t num_reqs_actual;     /* -1: B (no graph padding) */
} aar_dsa_step_inputs_t;
AAR_C_API void aar_dsa_step_inputs_init(aar_dsa_step_inputs_t* inputs);

typedef struct aar_dsa_step_metadata_info {
  size_t struct_size;
  aar_attn_state_t attn_state;
  int32_t num_reqs, num_kernel_reqs, num_actual_tokens, num_input_tokens;
  int32_t num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens;
  int32_t max_query_len, max_seq_len;
  int32_t draft_index; /* -1: a main build */
  uint64_t generation;
} aar_dsa_step_metadata_info_t;

AAR_C_API aar_status_t aar_dsa_step_builder_create(const aar_dsa_step_builder_config_t* config,
                                                   aar_dsa_step_builder_t** out);
/* Destroy its group builders first (their builds read the step builder). */
AAR_C_API void aar_dsa_step_builder_destroy(aar_dsa_step_builder_t* builder);
AAR_C_API aar_status_t aar_dsa_step_builder_build(aar_dsa_step_builder_t* builder, const aar_dsa_step_inputs_t* inputs,
                                                  const aar_dsa_step_metadata_t** out);
AAR_C_API aar_status_t aar_dsa_step_builder_build_for_graph_capture(aar_dsa_step_builder_t* builder,
                                                                    const aar_dsa_step_inputs_t* inputs,
                                                                    aar_attn_state_t state,
                                                                    const aar_dsa_step_metadata_t** out);
/* A draft step in lane draft_index; *out: that lane's metadata (one per lane, owned by the builder). */
AAR_C_API aar_status_t aar_dsa_step_builder_build_for_drafting(aar_dsa_step_builder_t* builder,
                                                               const aar_dsa_step_inputs_t* inputs,
                                                               int32_t draft_index,
                                                               const aar_dsa_step_metadata_t** out);
AAR_C_API aar_status_t aar_dsa_step_metadata_get_info(const aar_dsa_step_metadata_t* metadata,
                                                      aar_dsa_step_metadata_info_t* info);

typedef struct aar_dsa_group_config {
  size_t struct_size;
  aar_dsa_cache_kind_t kind;  /* AAR_DSA_SWA */
  int32_t cache_block_size;   /* 128 (32, 64, 128: gives the group's block sizes and ratio) */
  int32_t max_blocks_per_req; /* 64 */
  int32_t num_blocks;         /* required */
  aar_dsa_plan_config_t plan;
} aar_dsa_group_config_t;
AAR_C_API void aar_dsa_group_config_init(aar_dsa_group_config_t* config);

/* A group's cache for num_blocks blocks: the tensor a layer takes for it (and, for
 * AAR_DSA_C4_INDEXER_K, the scale tensor); shapes in elements, ndim 0 when absent. */
typedef struct aar_dsa_group_cache_info {
  size_t struct_size;
  aar_dsa_cache_kind_t kind;
  int32_t compress_ratio;     /* 1, 4, 128 */
  int64_t block_size;         /* the scheduler's block (raw tokens) */
  int64_t storage_block_size; /* rows per page */
  int32_t kv_ndim;
  int64_t kv_shape[4];
  DLDataType kv_dtype;        /* the plan's (a CPU model in float32 keeps float32 caches) */
  int32_t scale_ndim;
  int64_t scale_shape[4];
  DLDataType scale_dtype;
} aar_dsa_group_cache_info_t;

/* step_builder must outlive the group builder. */
AAR_C_API aar_status_t aar_dsa_group_builder_create(const aar_dsa_step_builder_t* step_builder,
                                                    const aar_dsa_group_config_t* config,
                                                    aar_dsa_group_builder_t** out);
AAR_C_API void aar_dsa_group_builder_destroy(aar_dsa_group_builder_t* builder);
AAR_C_API aar_status_t aar_dsa_group_builder_cache_info(const aar_dsa_group_builder_t* builder, int64_t num_blocks,
                                                        aar_dsa_group_cache_info_t* info);
/* The group's part of step `step` (a main build of the group's step builder): its block
 * table (B x block_table_stride, host, the scheduler's). *out: the group's metadata. */
AAR_C_API aar_status_t aar_dsa_group_builder_build(aar_dsa_group_builder_t* builder,
                                                   const aar_dsa_step_metadata_t* step, const int32_t* block_table,
                                                   size_t block_table_len, int32_t block_table_stride,
                                                   const aar_dsa_group_metadata_t** out);
/* A draft step's group part (SWA groups only; compressed groups: AAR_ERR_NOT_SUPPORTED). */
AAR_C_API aar_status_t aar_dsa_group_builder_build_for_drafting(aar_dsa_group_builder_t* builder,
                                                                const aar_dsa_step_metadata_t* step,
                                                                const int32_t* block_table, size_t block_table_len,
                                                                int32_t block_table_stride, int32_t draft_index,
                                                                const aar_dsa_group_metadata_t** out);

typedef struct aar_dsa_impl_config {
  size_t struct_size;
  int64_t hidden_size, num_heads;  /* required */
  int64_t head_dim, rope_dim;      /* 512, 64 */
  int64_t q_lora_rank;             /* required */
  int64_t window;                  /* 0: the step's */
  int32_t compress_ratio;          /* 1 (SWA only), 4, 128 */
  int64_t index_n_heads, index_head_dim, index_topk; /* 64, 128, 512 (ratio 4) */
  double eps;                      /* 1e-6 */
  int64_t o_groups, o_lora_rank;   /* 1, required */
  aar_dsa_plan_config_t plan;
  int32_t use_index_cache, skip_topk; /* 0, 0 (ratio 4: write / read the top-k buffer) */
  int64_t layer_index, workspace_group; /* -1, 0 */
} aar_dsa_impl_config_t;
AAR_C_API void aar_dsa_impl_config_init(aar_dsa_impl_config_t* config);

/* Torch layout (out, in), borrowed until the impl is destroyed; NULL where the layer has none
 * (the compressor's for ratio 1, the indexer's off ratio 4, wo_a_scale for unquantised wo_a). */
typedef struct aar_dsa_weights {
  size_t struct_size;
  const DLManagedTensor *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *attn_sink, *wo_a, *wo_b, *wo_a_scale;
  const DLManagedTensor *cmp_wkv, *cmp_wgate, *cmp_ape, *cmp_norm;
  const DLManagedTensor *idx_wq_b, *idx_weights_proj;
  const DLManagedTensor *idx_cmp_wkv, *idx_cmp_wgate, *idx_cmp_ape, *idx_cmp_norm;
} aar_dsa_weights_t;
AAR_C_API void aar_dsa_weights_init(aar_dsa_weights_t* weights);

AAR_C_API aar_status_t aar_dsa_impl_create(const aar_dsa_impl_config_t* config, const aar_dsa_weights_t* weights,
                                           aar_dsa_impl_t** out);
AAR_C_API void aar_dsa_impl_destroy(aar_dsa_impl_t* impl);
/* hidden (T, hidden_size); output (T, hidden_size). kv_cache: the layer's tuple
 * (compress_kv, swa_kv, state, indexer_state, indexer_k, indexer_scale[, indexer_full on A5]),
 * num_kv_cache 6 or 7, NULL for what the layer's ratio has none of (docs/design/dsa.md §2.3).
 * step and groups: the step's metadata and the step's group metadata (any order, every
 * group of the step may be given: the layer picks those of its ratio), or step NULL
 * (profiling run: zero-filled output; groups ignored). topk: needed by use_index_cache /
 * skip_topk layers. Inside an open capture the layer is recorded (decode buckets; per step
 * aar_graph_update_dsa, then aar_graph_replay). */
AAR_C_API aar_status_t aar_dsa_impl_forward(aar_dsa_impl_t* impl, const DLManagedTensor* hidden,
                                            const DLManagedTensor* const* kv_cache, size_t num_kv_cache,
                                            const aar_dsa_step_metadata_t* step,
                                            const aar_dsa_group_metadata_t* const* groups, size_t num_groups,
                                            const DLManagedTensor* output, aar_sfa_topk_buffer_t* topk);

/* ---------------------------------------------------------------- context parallel: the communicator
 * The collectives of the context-parallel layers (cp::Comm, docs/design/cp.md §1.2) over a
 * c10d process group: all-gather, all-to-all, reduce-scatter. Every rank of a group must
 * create its communicator and then run the same layers in the same order (a layer's forward
 * issues collectives); a silent or failed peer is AAR_ERR_RUNTIME within the timeout, never
 * a hang. A communicator is used by one thread at a time; layers created with it keep it
 * alive, so it may be destroyed before them (docs/design/c_api.md §6). */

typedef struct aar_cp_comm aar_cp_comm_t;

/* A gloo group over a TCP rendezvous, made inside the library (the caller needs no torch):
 * rank 0's store listens on host:port, every rank connects to it; the call returns once the
 * whole group has joined, or fails once timeout_ms has passed (the store's connect retries may
 * add a few seconds: 32 s for 20000 ms here). Host tensors only (gloo). */
typedef struct aar_cp_comm_tcp_config {
  size_t struct_size;
  const char* host;       /* required: rank 0's address ("127.0.0.1", a host name) */
  int32_t port;           /* required: 1..65535; 0 (any free port) only with world_size 1 */
  int32_t rank;           /* required: 0 <= rank < world_size */
  int32_t world_size;     /* required: >= 1 */
  int64_t timeout_ms;     /* 60000: the rendezvous and each collective */
  const char* group_name; /* NULL: "aar_tcp:<host>:<port>" (the name the runtime's messages use) */
  /* The address this rank's gloo device binds to: NULL for both picks gloo's default (this
   * machine's host name, else the loopback); else one of them, a network interface name
   * ("eth0") or an address / host name ("127.0.0.1"). */
  const char* device_interface;
  const char* device_host;
  /* -1: rank 0 binds host:port itself. Else (rank 0 only) a socket already bound to port, and
   * listening, that rank 0's store takes over (it belongs to the store from then on): a
   * launcher that picks a free port keeps it, with no window for another process to take it. */
  int32_t listen_fd;
} aar_cp_comm_tcp_config_t;
AAR_C_API void aar_cp_comm_tcp_config_init(aar_cp_comm_tcp_config_t* config);
AAR_C_API aar_status_t aar_cp_comm_create_tcp(const aar_cp_comm_tcp_config_t* config, aar_cp_comm_t** out);

/* A group the process already has: the c10d::ProcessGroup registered under group_name in
 * torch's process-group registry (c10d::register_process_group; torch.distributed registers
 * every group it makes, whatever its backend, under its ProcessGroup.group_name: on the NPU the
 * HCCL groups torch_npu provides, unverified here without an NPU).
 * process_group: NULL, or the c10d::ProcessGroup* the engine holds (an intrusive_ptr's get()):
 * then it must be the very object registered under that name, else AAR_ERR_INVALID_ARGUMENT
 * (the pointer is compared, never dereferenced). The communicator holds a reference to the
 * group (it stays alive while the communicator or a layer using it does). */
AAR_C_API aar_status_t aar_cp_comm_create_from_group(const char* group_name, const void* process_group,
                                                     int64_t timeout_ms, aar_cp_comm_t** out);
AAR_C_API void aar_cp_comm_destroy(aar_cp_comm_t* comm);

typedef struct aar_cp_comm_info {
  size_t struct_size;
  int32_t rank, world_size;
  int64_t calls; /* collectives issued so far */
} aar_cp_comm_info_t;
/* info->struct_size must be set (sizeof(aar_cp_comm_info_t)). */
AAR_C_API aar_status_t aar_cp_comm_get_info(const aar_cp_comm_t* comm, aar_cp_comm_info_t* info);

/* ---------------------------------------------------------------- GQA DCP
 * Decode context parallelism (docs/design/cp.md §3-§5): the KV cache is sharded along the
 * sequence over the DCP group (token x on rank (x / interleave) % world); each rank holds
 * its own query heads (the tensor-parallel split); decodes and cached context are attended on
 * the local shard and merged over the group, the current prefill chunk locally. Every rank
 * builds the same global step (the scheduler's lengths and one block table of local blocks)
 * and gives its layers the step's full query rows (its heads) and K/V rows: a layer writes
 * the rank's own tokens. Refused by name: windows, sinks, ALiBi, soft cap, non-decoder
 * layers, quantised caches. Graph mode (docs/design/graph.md §4.4): decode-only steps padded
 * to a bucket (inputs.num_input_tokens = the bucket) are captured; per step
 * aar_graph_update_gqa_dcp, then aar_graph_replay (the collectives run inside the replay). */

typedef struct aar_gqa_dcp_builder aar_gqa_dcp_builder_t;
typedef struct aar_gqa_dcp_impl aar_gqa_dcp_impl_t;
typedef struct aar_gqa_dcp_metadata aar_gqa_dcp_metadata_t;

typedef struct aar_gqa_dcp_builder_config {
  size_t struct_size;
  int32_t max_num_reqs;           /* 256 */
  int32_t max_num_tokens;         /* 8192 */
  int32_t max_blocks_per_req;     /* 64 */
  int32_t block_size;             /* 128 */
  int32_t num_blocks;             /* required: this rank's cache */
  int32_t num_speculative_tokens; /* 0 */
  int32_t dcp_world_size;         /* 1: the DCP group's size (its communicator's) */
  int32_t dcp_rank;               /* 0: this rank in it */
  int32_t interleave;             /* 1: tokens per shard run (block_size % interleave == 0) */
  int32_t pd_recompute_scheduler; /* 0 (docs/design/cp.md §3.1) */
  DLDevice device;                /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers;
  int32_t staging_buffers;        /* 2 */
} aar_gqa_dcp_builder_config_t;
AAR_C_API void aar_gqa_dcp_builder_config_init(aar_gqa_dcp_builder_config_t* config);

typedef struct aar_gqa_dcp_build_inputs {
  size_t struct_size;
  const int32_t* query_start_loc; /* B+1, decodes first */
  size_t query_start_loc_len;
  const int32_t* seq_lens;        /* B: global lengths (context + new tokens) */
  size_t seq_lens_len;
  const int32_t* block_table;     /* B x block_table_stride: local block ids */
  size_t block_table_len;
  int32_t block_table_stride;
  int32_t num_input_tokens;       /* 0: query_start_loc[B] */
  const uint8_t* is_prefilling;   /* optional (NULL, 0) */
  size_t is_prefilling_len;
  int32_t draft_step;             /* -1; d >= 0: a draft model's step d over base lengths */
} aar_gqa_dcp_build_inputs_t;
AAR_C_API void aar_gqa_dcp_build_inputs_init(aar_gqa_dcp_build_inputs_t* inputs);

typedef struct aar_gqa_dcp_metadata_info {
  size_t struct_size;
  int32_t num_reqs, num_kernel_reqs, num_actual_tokens, num_input_tokens;
  int32_t num_decodes, num_prefills, num_decode_tokens;
  int32_t dcp_world_size, dcp_rank, interleave;
  int32_t num_local_writes; /* tokens of this step whose KV this rank writes */
  int32_t draft_step;       /* -1: not a draft step */
  uint64_t generation;
} aar_gqa_dcp_metadata_info_t;

AAR_C_API aar_status_t aar_gqa_dcp_builder_create(const aar_gqa_dcp_builder_config_t* config,
                                                  aar_gqa_dcp_builder_t** out);
AAR_C_API void aar_gqa_dcp_builder_destroy(aar_gqa_dcp_builder_t* builder);
AAR_C_API aar_status_t aar_gqa_dcp_builder_build(aar_gqa_dcp_builder_t* builder,
                                                 const aar_gqa_dcp_build_inputs_t* inputs,
                                                 const aar_gqa_dcp_metadata_t** out);
/* A draft model's step (seq_lens: the draft step's own lengths; inputs->draft_step -1 or
 * draft_index). Builds into the builder's one metadata, as build does. */
AAR_C_API aar_status_t aar_gqa_dcp_builder_build_for_drafting(aar_gqa_dcp_builder_t* builder,
                                                              const aar_gqa_dcp_build_inputs_t* inputs,
                                                              int32_t draft_index,
                                                              const aar_gqa_dcp_metadata_t** out);
/* build() for the capture of a bucket: state AAR_STATE_DECODE_ONLY or AAR_STATE_SPEC_DECODING
 * (others: AAR_ERR_NOT_SUPPORTED, nothing built); the metadata's state is `state`. */
AAR_C_API aar_status_t aar_gqa_dcp_builder_build_for_graph_capture(aar_gqa_dcp_builder_t* builder,
                                                                   const aar_gqa_dcp_build_inputs_t* inputs,
                                                                   aar_attn_state_t state,
                                                                   const aar_gqa_dcp_metadata_t** out);
AAR_C_API aar_status_t aar_gqa_dcp_metadata_get_info(const aar_gqa_dcp_metadata_t* metadata,
                                                     aar_gqa_dcp_metadata_info_t* info);

/* config: the GQA layer's (num_heads: this rank's query heads); its decode-path fields
 * (pa_shape_list, full_decode_only_graph, has_speculative_config, kv_cache_group) must keep
 * their defaults: the DCP layer reads none of them. comm: the DCP group, of the builder's
 * dcp_world_size with this process at dcp_rank (checked at each forward). */
AAR_C_API aar_status_t aar_gqa_dcp_impl_create(const aar_gqa_impl_config_t* config, aar_cp_comm_t* comm,
                                               aar_gqa_dcp_impl_t** out);
AAR_C_API void aar_gqa_dcp_impl_destroy(aar_gqa_dcp_impl_t* impl);
/* query (T, N, D) this rank's heads; key/value (T, Nkv, D) or both NULL (a KV-sharing layer
 * or a decode-only step of a layer that writes nothing); key_cache/value_cache (num_blocks,
 * block_size, Nkv, D) contiguous, required; output (T, N, D), rows [0, num_actual_tokens)
 * written. metadata NULL (profiling run): zero-filled output, no collective (every rank runs
 * it alike). Issues collectives: every rank of the group calls it. Inside an open capture
 * (aar_graph_begin_capture, same thread) a decode-only step padded to the bucket is recorded
 * (no collective then; key/value of bucket rows, contiguous, at stable addresses, as query and
 * output); anything else is refused. */
AAR_C_API aar_status_t aar_gqa_dcp_impl_forward(aar_gqa_dcp_impl_t* impl, const DLManagedTensor* query,
                                                const DLManagedTensor* key, const DLManagedTensor* value,
                                                const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                                const aar_gqa_dcp_metadata_t* metadata,
                                                const DLManagedTensor* output);

/* ---------------------------------------------------------------- GQA PCP
 * Prefill context parallelism (docs/design/cp.md §6) over a PCP group, optionally with DCP:
 * every rank builds the global step; the builder gives the rank's local rows
 * (aar_gqa_pcp_builder_local_rows: which global token each local row is), and the layer takes
 * and returns those rows only. Sharded mode: the KV cache sharded over all pcp_size *
 * dcp_size ranks; replicated mode: every rank holds the whole KV. Speculative decode: a builder
 * made by aar_gqa_pcp_builder_create_ext with num_speculative_tokens (decodes of up to 1 + n
 * tokens, replicated on every PCP rank, not split). Graph capture of decode-only buckets
 * (docs/design/cp.md §6.6): a decode-only step built with inputs.num_input_tokens = the bucket
 * (or by aar_gqa_pcp_builder_build_for_graph_capture) is padded with decode rows of KV length 0
 * (-1 in local_rows' token_index); steps with prefills run eagerly only. */

typedef struct aar_gqa_pcp_builder aar_gqa_pcp_builder_t;
typedef struct aar_gqa_pcp_impl aar_gqa_pcp_impl_t;
typedef struct aar_gqa_pcp_metadata aar_gqa_pcp_metadata_t;

typedef enum aar_pcp_kv_mode { AAR_PCP_SHARDED = 0, AAR_PCP_REPLICATED = 1 } aar_pcp_kv_mode_t;

typedef struct aar_gqa_pcp_builder_config {
  size_t struct_size;
  int32_t max_num_reqs;       /* 256: of the global batch */
  int32_t max_num_tokens;     /* 8192: scheduled tokens of the global batch */
  int32_t max_blocks_per_req; /* 64 */
  int32_t block_size;         /* 128 */
  int32_t num_blocks;         /* required: this rank's cache */
  int32_t pcp_size, pcp_rank; /* 1, 0 */
  int32_t dcp_size, dcp_rank; /* 1, 0 (sharded mode only) */
  int32_t interleave_size;    /* 1 (sharded mode) */
  aar_pcp_kv_mode_t kv_mode;  /* AAR_PCP_SHARDED */
  DLDevice device;            /* {kDLCPU, 0} */
  aar_tristate_t separate_device_buffers;
  int32_t staging_buffers;    /* 2 */
} aar_gqa_pcp_builder_config_t;
AAR_C_API void aar_gqa_pcp_builder_config_init(aar_gqa_pcp_builder_config_t* config);

typedef struct aar_gqa_pcp_build_inputs {
  size_t struct_size;
  const int32_t* query_start_loc; /* N+1, the global batch, decodes first */
  size_t query_start_loc_len;
  const int32_t* seq_lens;        /* N: context + new tokens */
  size_t seq_lens_len;
  const int32_t* block_table;     /* N x block_table_stride: local block ids */
  size_t block_table_len;
  int32_t block_table_stride;
  int32_t num_input_tokens;       /* 0, query_start_loc[N], or more on a decode-only step (padding
                                   * decode rows up to a graph bucket) */
  const uint8_t* is_prefilling;   /* optional (NULL, 0) */
  size_t is_prefilling_len;
} aar_gqa_pcp_build_inputs_t;
AAR_C_API void aar_gqa_pcp_build_inputs_init(aar_gqa_pcp_build_inputs_t* inputs);

typedef struct aar_gqa_pcp_metadata_info {
  size_t struct_size;
  aar_attn_state_t attn_state; /* the global step's */
  int32_t num_reqs, num_actual_tokens;
  int32_t num_decodes, num_prefills, num_decode_tokens;
  aar_pcp_kv_mode_t kv_mode;
  int32_t pcp_size, pcp_rank, dcp_size, dcp_rank;
  int32_t num_local_tokens; /* rows of this rank's query / key / value / output */
  int32_t has_context;      /* a prefill with cached context (batch-global) */
  uint64_t generation;
} aar_gqa_pcp_metadata_info_t;

AAR_C_API aar_status_t aar_gqa_pcp_builder_create(const aar_gqa_pcp_builder_config_t* config,
                                                  aar_gqa_pcp_builder_t** out);
/* Version 5: the PCP builder's options beyond aar_gqa_pcp_builder_config_t (whose size is
 * fixed), for aar_gqa_pcp_builder_create_ext. */
typedef struct aar_gqa_pcp_builder_ext {
  size_t struct_size;
  int32_t num_speculative_tokens; /* 0 (0..15): the decode threshold is 1 + this */
} aar_gqa_pcp_builder_ext_t;
AAR_C_API void aar_gqa_pcp_builder_ext_init(aar_gqa_pcp_builder_ext_t* ext);
/* aar_gqa_pcp_builder_create with the options of ext (required; initialised by
 * aar_gqa_pcp_builder_ext_init, which gives what aar_gqa_pcp_builder_create builds). */
AAR_C_API aar_status_t aar_gqa_pcp_builder_create_ext(const aar_gqa_pcp_builder_config_t* config,
                                                      const aar_gqa_pcp_builder_ext_t* ext,
                                                      aar_gqa_pcp_builder_t** out);
AAR_C_API void aar_gqa_pcp_builder_destroy(aar_gqa_pcp_builder_t* builder);
AAR_C_API aar_status_t aar_gqa_pcp_builder_build(aar_gqa_pcp_builder_t* builder,
                                                 const aar_gqa_pcp_build_inputs_t* inputs,
                                                 const aar_gqa_pcp_metadata_t** out);
/* build() for the capture of a bucket (inputs->num_input_tokens): a decode-only step, state
 * AAR_STATE_DECODE_ONLY or AAR_STATE_SPEC_DECODING (another state, or a step with prefills:
 * AAR_ERR_NOT_SUPPORTED, nothing built); the metadata's attn_state is `state`. */
AAR_C_API aar_status_t aar_gqa_pcp_builder_build_for_graph_capture(aar_gqa_pcp_builder_t* builder,
                                                                   const aar_gqa_pcp_build_inputs_t* inputs,
                                                                   aar_attn_state_t state,
                                                                   const aar_gqa_pcp_metadata_t** out);
/* This rank's rows after the latest build: *count = num_local_tokens; token_index[i] the
 * global token (query_start_loc units) of local row i, -1 for a padding row; positions[i] its
 * position within its request's scheduled tokens (sharded: >= the request's length for a
 * padding row of a prefill, -1 for a padding decode row; replicated: -1). Either array may be NULL; a given one needs capacity >=
 * num_local_tokens (else AAR_ERR_INVALID_ARGUMENT, nothing written). */
AAR_C_API aar_status_t aar_gqa_pcp_builder_local_rows(const aar_gqa_pcp_builder_t* builder, int32_t* token_index,
                                                      int32_t* positions, size_t capacity, size_t* count);
AAR_C_API aar_status_t aar_gqa_pcp_metadata_get_info(const aar_gqa_pcp_metadata_t* metadata,
                                                     aar_gqa_pcp_metadata_info_t* info);

/* config: the GQA layer's (num_heads: this rank's heads); pcp: the PCP group (size
 * pcp_size); dcp: the DCP group, NULL when dcp_size is 1. Checked against the metadata at
 * each forward. */
AAR_C_API aar_status_t aar_gqa_pcp_impl_create(const aar_gqa_impl_config_t* config, aar_cp_comm_t* pcp,
                                               aar_cp_comm_t* dcp, aar_gqa_pcp_impl_t** out);
AAR_C_API void aar_gqa_pcp_impl_destroy(aar_gqa_pcp_impl_t* impl);
/* query (T_loc, N, D), key/value (T_loc, Nkv, D) required (T_loc = num_local_tokens, rows as
 * aar_gqa_pcp_builder_local_rows gives them; padding rows any finite values); caches as for
 * aar_gqa_dcp_impl_forward; output (T_loc, N, D) written in full. metadata NULL: profiling run
 * (zero-filled output, no collective). Issues collectives: every rank of the groups calls it.
 * Inside an open capture (aar_graph_begin_capture, same thread) a decode-only step padded to the
 * bucket is recorded (no collective then: they run inside the replay; query, key, value
 * contiguous and output at stable addresses); a step with prefills, or metadata NULL, is refused
 * (AAR_ERR_NOT_SUPPORTED) before anything is written. */
AAR_C_API aar_status_t aar_gqa_pcp_impl_forward(aar_gqa_pcp_impl_t* impl, const DLManagedTensor* query,
                                                const DLManagedTensor* key, const DLManagedTensor* value,
                                                const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                                const aar_gqa_pcp_metadata_t* metadata,
                                                const DLManagedTensor* output);

/* ---------------------------------------------------------------- MLA context parallel
 * Version 6: the MLA builder and layer of context-parallel ranks (docs/design/cp.md, MLA DCP
 * docs/design/mla.md section 6). The handles are the MLA ones (aar_mla_builder_t,
 * aar_mla_impl_t): build, forward, get_info, destroy and (DCP) decode graph capture with
 * aar_graph_update_mla as for a single rank. */

/* This rank's place in the groups (aar_mla_builder_cp_init: a single rank). DCP: the builds
 * are this rank's (its KV shard: local slots and KV lengths, the context chunks of its shard);
 * the block table is the same on every rank of the group, the caches are each rank's own. */
typedef struct aar_mla_builder_cp {
  size_t struct_size;
  int32_t dcp_world_size;         /* 1 */
  int32_t dcp_rank;               /* 0: in [0, dcp_world_size) */
  int32_t interleave;             /* 1: cp_kv_cache_interleave_size I, block_size % I == 0 */
  int32_t pd_recompute_scheduler; /* 0: with 1, requests of at most the decode threshold are decodes */
  int32_t pcp_world_size;         /* 1: prefill context parallel (see aar_mla_builder_pcp_local_rows);
                                     KV sharded over pcp_world_size * dcp_world_size ranks (<= 16),
                                     rank pcp_rank * dcp_world_size + dcp_rank */
  int32_t pcp_rank;               /* 0: in [0, pcp_world_size) */
} aar_mla_builder_cp_t;
AAR_C_API void aar_mla_builder_cp_init(aar_mla_builder_cp_t* cp);
/* aar_mla_builder_create with this rank's place in the groups (cp required). Under DCP (or PCP)
 * a request is a prefill when its query is longer than the decode threshold
 * (1 + num_speculative_tokens) or it is still prefilling its prompt: aar_mla_builder_build
 * derives that from the lengths (none of it computed before: seq_len == query length, so a short
 * last chunk of a longer prompt is a decode); aar_mla_builder_build_ext takes the engine's flags
 * (aar_mla_build_inputs_ext_t.is_prefilling). */
AAR_C_API aar_status_t aar_mla_builder_create_cp(const aar_mla_builder_config_t* config,
                                                 const aar_mla_builder_cp_t* cp, aar_mla_builder_t** out);
/* PCP (pcp_world_size > 1): a build takes the GLOBAL batch (the same inputs on every rank of
 * the PCP group) and plans this rank's rows: the decodes (every rank computes them) and the head
 * and tail chunks of every prefill. *count = num_local_tokens of the latest build (0 without
 * PCP): the rows of hidden and output the rank's aar_mla_impl_forward takes; token_index[i] the
 * global token (query_start_loc units) of local row i, -1 for a padding row (any finite hidden
 * row; its output row is not a token's). token_index may be NULL (the count only); given, it
 * needs capacity >= num_local_tokens (else AAR_ERR_INVALID_ARGUMENT, nothing written). */
AAR_C_API aar_status_t aar_mla_builder_pcp_local_rows(const aar_mla_builder_t* builder, int32_t* token_index,
                                                      size_t capacity, size_t* count);
/* aar_mla_impl_create for a context-parallel rank: config->num_heads this rank's heads, the
 * weights this rank's; dcp_comm the DCP group (NULL when dcp_world_size is 1), pcp_comm the PCP
 * group (NULL when pcp_world_size is 1), not both NULL. The layer keeps the communicators alive.
 * Each forward checks the metadata's group size and rank against the communicator's
 * (AAR_ERR_INVALID_ARGUMENT naming dcp_comm / pcp_comm, nothing written) and issues
 * collectives: every rank of the group calls it, in the same order. Not with enable_kv_nz
 * when a group has more than one rank (AAR_ERR_NOT_SUPPORTED: DCP and PCP read ND caches). */
AAR_C_API aar_status_t aar_mla_impl_create_cp(const aar_mla_impl_config_t* config, const aar_mla_weights_t* weights,
                                              aar_cp_comm_t* dcp_comm, aar_cp_comm_t* pcp_comm,
                                              aar_mla_impl_t** out);

/* Version 7: what an MLA build takes beyond aar_mla_build_inputs_t (whose size is fixed), for
 * aar_mla_builder_build_ext (aar_mla_build_inputs_ext_init: a normal step, no flags, which is
 * what aar_mla_builder_build builds). */
typedef struct aar_mla_build_inputs_ext {
  size_t struct_size;
  /* Optional (NULL, 0), else one flag per request (length inputs->seq_lens_len), nonzero: the
   * request is still prefilling its prompt (a short last chunk is then a prefill, not a decode).
   * Read by a builder whose KV is sharded (DCP or PCP) without pd_recompute_scheduler; given to
   * any other builder, or with draft_step >= 0, it is refused (AAR_ERR_INVALID_ARGUMENT: it
   * would be ignored). */
  const uint8_t* is_prefilling;
  size_t is_prefilling_len;
  /* -1: a normal step. d >= 0 (< 16): a draft model's (MTP proposer's) step d: seq_lens are the
   * requests' base lengths, each request has one query token (query_start_loc 0, 1, ..., B) at
   * position base + d, so its length is base + d + 1 (under DCP its local KV length is this
   * rank's share of base + d + 1, upstream's draft_cp_seq_len); every request is a decode. */
  int32_t draft_step;
} aar_mla_build_inputs_ext_t;
AAR_C_API void aar_mla_build_inputs_ext_init(aar_mla_build_inputs_ext_t* ext);
/* aar_mla_builder_build with the fields of ext (required). Any MLA builder (single rank, DCP,
 * PCP); the metadata is the builder's one, as for aar_mla_builder_build. */
AAR_C_API aar_status_t aar_mla_builder_build_ext(aar_mla_builder_t* builder, const aar_mla_build_inputs_t* inputs,
                                                 const aar_mla_build_inputs_ext_t* ext,
                                                 const aar_mla_metadata_t** out);

/* ---------------------------------------------------------------- SFA context parallel
 * Version 7: the SFA builder and layer of context-parallel ranks (docs/design/sparse_cp.md: DCP
 * §2-§5, PCP §11). The handles are the SFA ones (aar_sfa_builder_t, aar_sfa_impl_t): build,
 * forward, get_info, block table, top-k buffer and destroy as for a single rank.
 * DCP: the main (latent) cache is sharded along the sequence over the DCP group (token x on
 * rank (x / interleave) % W, local slots through the group's one block table of local blocks);
 * the lightning indexer's cache is replicated on every rank and has num_blocks * W blocks
 * (local block lb stands for the replicated blocks lb * W .. lb * W + W - 1); every rank builds
 * the same global step and gives its layer every token's hidden row; the layer writes the
 * main cache rows this rank owns and every indexer row, selects the global top-k, attends the
 * selected keys it holds and merges the partial results over the group; its output is every
 * token's row. Decode buckets are captured as for a single rank (graph_decode_padding,
 * aar_sfa_builder_build_for_graph_capture; replays need no update).
 * PCP: a build takes the GLOBAL step and plans this rank's rows (aar_sfa_builder_pcp_local_rows);
 * the layer takes and returns those rows; the main cache is sharded over the pcp_world_size *
 * dcp_world_size ranks (rank pcp_rank * dcp_world_size + dcp_rank), the indexer cache
 * replicated (num_blocks * pcp_world_size * dcp_world_size blocks); a step with prefills runs
 * eagerly (capturing one is refused by name), decode buckets are captured as for DCP. Refused by
 * name, as in C++: SFA C8 and KV offload with DCP or PCP. Not in the C ABI: DSA-CP token sharding
 * (the C++ dsa_cp_* options). */

/* This rank's place in the groups (aar_sfa_builder_cp_init: a single rank). */
typedef struct aar_sfa_builder_cp {
  size_t struct_size;
  int32_t dcp_world_size; /* 1 */
  int32_t dcp_rank;       /* 0: in [0, dcp_world_size) */
  int32_t interleave;     /* 1: cp_kv_cache_interleave_size I, config->block_size % I == 0 */
  int32_t pcp_world_size; /* 1: prefill context parallel (pcp_world_size * dcp_world_size <= 16) */
  int32_t pcp_rank;       /* 0: in [0, pcp_world_size) */
} aar_sfa_builder_cp_t;
AAR_C_API void aar_sfa_builder_cp_init(aar_sfa_builder_cp_t* cp);
/* aar_sfa_builder_create with this rank's place in the groups (cp required). */
AAR_C_API aar_status_t aar_sfa_builder_create_cp(const aar_sfa_builder_config_t* config,
                                                 const aar_sfa_builder_cp_t* cp, aar_sfa_builder_t** out);
/* PCP (pcp_world_size > 1): *count = the local rows of the main lane's latest build (0 without
 * PCP), the rows of hidden and output the rank's aar_sfa_impl_forward takes; token_index[i] the
 * global token (query_start_loc units) of local row i, -1 for a padding row (any finite hidden
 * row; its output row is not a token's). token_index may be NULL (the count only); given, it needs
 * capacity >= the count (else AAR_ERR_INVALID_ARGUMENT, nothing written). */
AAR_C_API aar_status_t aar_sfa_builder_pcp_local_rows(const aar_sfa_builder_t* builder, int32_t* token_index,
                                                      size_t capacity, size_t* count);
/* aar_sfa_impl_create for a context-parallel rank: config->num_heads this rank's heads, the
 * weights this rank's; dcp_comm the DCP group (NULL when dcp_world_size is 1), pcp_comm the PCP
 * group (NULL when pcp_world_size is 1), not both NULL. The layer keeps the communicators alive.
 * Each forward checks the metadata's group sizes and ranks against the communicators'
 * (AAR_ERR_INVALID_ARGUMENT naming dcp_comm / pcp_comm, before any collective or write) and
 * issues collectives: every rank of the group calls it, in the same order. */
AAR_C_API aar_status_t aar_sfa_impl_create_cp(const aar_sfa_impl_config_t* config, const aar_mla_weights_t* weights,
                                              const aar_sfa_indexer_weights_t* indexer_weights,
                                              aar_cp_comm_t* dcp_comm, aar_cp_comm_t* pcp_comm,
                                              aar_sfa_impl_t** out);

/* ---------------------------------------------------------------- DSA context parallel
 * Version 7: DSA (DeepSeek-V4) DCP (docs/design/sparse_cp.md §12). The handles are the DSA ones:
 * the step builder made by aar_dsa_step_builder_create_cp, its group builders, step and group
 * builds, forward and destroy as for a single rank. The SWA and compressed-KV caches are sharded
 * over the DCP group (token x on rank (x / interleave) % W): those groups' builds take the group's
 * table of this rank's local blocks and write local slots; the indexer and compressor-state groups
 * stay whole (the scheduler's global table, every row written on every rank). Every rank builds
 * the same global step and gives its layer every token's hidden row; the output is every token's
 * row. Not in the C ABI: DSA PCP and DSA-CP token sharding. */

/* This rank's place in the DCP group (aar_dsa_step_builder_cp_init: a single rank). */
typedef struct aar_dsa_step_builder_cp {
  size_t struct_size;
  int32_t dcp_world_size; /* 1 */
  int32_t dcp_rank;       /* 0: in [0, dcp_world_size) */
  int32_t interleave;     /* 1: dcp_interleave, tokens per shard run (checked by the C++ builder) */
} aar_dsa_step_builder_cp_t;
AAR_C_API void aar_dsa_step_builder_cp_init(aar_dsa_step_builder_cp_t* cp);
/* aar_dsa_step_builder_create with this rank's place in the DCP group (cp required). Refused by
 * name, as in C++: DCP with DSpark (dspark_num_spec). */
AAR_C_API aar_status_t aar_dsa_step_builder_create_cp(const aar_dsa_step_builder_config_t* config,
                                                      const aar_dsa_step_builder_cp_t* cp,
                                                      aar_dsa_step_builder_t** out);
/* aar_dsa_impl_create for a DCP rank: dcp_comm the DCP group (required; the layer keeps it alive).
 * Each forward checks the step metadata's DCP size and rank against the communicator's
 * (AAR_ERR_INVALID_ARGUMENT naming dcp_comm, before any collective or write) and issues
 * collectives: every rank of the group calls it, in the same order. The A2/A3 plan only (others
 * refused by name by the C++ layer). */
AAR_C_API aar_status_t aar_dsa_impl_create_cp(const aar_dsa_impl_config_t* config, const aar_dsa_weights_t* weights,
                                              aar_cp_comm_t* dcp_comm, aar_dsa_impl_t** out);

/* ---------------------------------------------------------------- graph mode */

typedef struct aar_graph_params aar_graph_params_t;

/* The NPU side of graph mode (graph/provider.h): an engine binds these to
 * torch_npu's graph-task API (c10_npu::graph_task_group_begin, ...). A NULL
 * function is a no-op. `user` is passed back to every function. */
typedef struct aar_graph_hooks {
  size_t struct_size;
  void* user;
  void* (*create_event)(void* user);
  void (*event_wait_and_reset)(void* user, void* event);
  void (*task_group_begin)(void* user);
  void* (*task_group_end)(void* user);
  void (*task_update_begin)(void* user, void* task);
  void (*task_update_end)(void* user);
  void (*event_record)(void* user, void* event);
  void (*release)(void* user, void* event, void* task);
} aar_graph_hooks_t;
AAR_C_API void aar_graph_hooks_init(aar_graph_hooks_t* hooks);

/* provider: "recording" (CPU: capture records, replay re-issues, hooks must be
 * NULL), "hooks" (NPU: hooks required), "noop" (hooks must be NULL).
 * use_max_workspace: 0 first-wins, 1 max over layers (docs/design/graph.md §2.2). */
AAR_C_API aar_status_t aar_graph_params_create(const char* provider, const aar_graph_hooks_t* hooks,
                                               int32_t use_max_workspace, aar_graph_params_t** out);
AAR_C_API void aar_graph_params_destroy(aar_graph_params_t* graph);
/* While a capture is open on this thread, forwards on this thread are recorded
 * into it. A capture left open by a failing forward should be aborted. */
AAR_C_API aar_status_t aar_graph_begin_capture(aar_graph_params_t* graph, int64_t num_tokens);
AAR_C_API aar_status_t aar_graph_end_capture(aar_graph_params_t* graph);
AAR_C_API aar_status_t aar_graph_abort_capture(aar_graph_params_t* graph);
/* Refreshes every captured call of bucket num_tokens: groups[g] is the GQA
 * metadata of KV-cache group g (its latest build), from the builder the capture used
 * when the captured calls write the KV cache (its slot mapping; another builder's
 * metadata is refused, docs/design/graph.md §1.2). */
AAR_C_API aar_status_t aar_graph_update_gqa(aar_graph_params_t* graph, int64_t num_tokens,
                                            const aar_gqa_metadata_t* const* groups, size_t num_groups);
/* Draft model (docs/design/graph.md §1.2): per-(draft step, layer) metadata cycled over the calls. */
AAR_C_API aar_status_t aar_graph_update_draft_gqa(aar_graph_params_t* graph, int64_t num_tokens,
                                                  const aar_gqa_metadata_t* const* per_call, size_t num_calls);
AAR_C_API aar_status_t aar_graph_update_mla(aar_graph_params_t* graph, int64_t num_tokens,
                                            const aar_mla_metadata_t* metadata);
/* DSA layers (docs/design/dsa.md §6): a captured DSA layer reads every per-step value from the
 * builders' stable buffers; the update checks the step (its metadata and its SWA group's
 * latest build) fits the bucket. SFA layers need no update (the same holds for them). */
AAR_C_API aar_status_t aar_graph_update_dsa(aar_graph_params_t* graph, int64_t num_tokens,
                                            const aar_dsa_step_metadata_t* step, const aar_dsa_group_metadata_t* swa);
/* GQA DCP layers (docs/design/graph.md §4.4): metadata is the step's DCP build, a decode-only
 * step built with inputs.num_input_tokens = num_tokens. */
AAR_C_API aar_status_t aar_graph_update_gqa_dcp(aar_graph_params_t* graph, int64_t num_tokens,
                                                const aar_gqa_dcp_metadata_t* metadata);
/* GQA PCP layers (docs/design/cp.md §6.6): metadata is the step's PCP build, a decode-only step
 * built with inputs.num_input_tokens = num_tokens (sharded: its decode rows refresh the recorded
 * paged call; replicated: its local GQA build, as aar_graph_update_gqa). */
AAR_C_API aar_status_t aar_graph_update_gqa_pcp(aar_graph_params_t* graph, int64_t num_tokens,
                                                const aar_gqa_pcp_metadata_t* metadata);
/* "recording" provider: runs the bucket's recorded calls (each updated since the last replay). */
AAR_C_API aar_status_t aar_graph_replay(aar_graph_params_t* graph, int64_t num_tokens);
/* *out: 1 when bucket num_tokens is captured, else 0. */
AAR_C_API aar_status_t aar_graph_has(const aar_graph_params_t* graph, int64_t num_tokens, int32_t* out);
AAR_C_API aar_status_t aar_graph_release(aar_graph_params_t* graph, int64_t num_tokens);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ASCEND_ATTN_RT_C_API_H_ */
