// Input checks shared by the backends that take GQA metadata (gqa, c8, fa3):
// cheap integer comparisons on the hot path; the message (argument, value) is
// only built on failure.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ascend_attn_rt/gqa/metadata.h"

namespace aar::gqa {

struct LayerShape {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
};

// query (T, N, D) in fp32/fp16/bf16 with T >= min_query_rows (`rows_what`
// names that bound in the error); output contiguous with the query's shape,
// dtype and device; key/value (given together) (rows, Nkv, D) with rows equal
// to num_input_tokens or num_actual_tokens, in the query's dtype and device.
void validate_layer_inputs(const LayerShape& s, const at::Tensor& query, const std::optional<at::Tensor>& key,
                           const std::optional<at::Tensor>& value, const Metadata& md, const at::Tensor& output,
                           int64_t min_query_rows, const char* rows_what);

// ND paged caches (num_blocks >= md.num_blocks, md.block_size, Nkv, D) in the
// given dtype and device, given together or not at all, contiguous (the
// kernels read them as row-major memory; any storage offset is fine): a
// permuted or sliced view is rejected with its shape and strides. The two caches, and the layer's
// `output`, must not share memory (docs/design/core.md §5).
void validate_nd_caches(const LayerShape& s, const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const Metadata& md, at::ScalarType dtype, c10::Device device, const at::Tensor& output);

// The ND cache layout as the layout errors name it (shared with FA3).
extern const char* const kNdCacheLayout;

}  // namespace aar::gqa
