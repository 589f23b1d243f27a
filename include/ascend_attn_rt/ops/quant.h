// Quantisation and in-place scatter operators of the sparse (SFA) paths, torch_npu's:
// npu_scatter_nd_update_, npu_dynamic_quant, npu_dynamic_block_quant.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// In place: self[indices[i]] = updates[i] for each row i of indices (N, k)
// (int64 or int32), indexing the first k dims of self; updates is
// (N, self.shape[k:]...). A row whose linear index into self's first k dims is
// negative or out of range is skipped (spec sparse.md 11.8: the upstream kernel
// drops negative ones; slot -1 and the (-1, bs-1) block/offset encoding land
// here). Later rows win over earlier rows with the same index. Any dtype.
at::Tensor& scatter_nd_update_(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates,
                               Provider pv = Provider::Auto);

struct DynamicQuantArgs {
  at::Tensor input;                                    // (..., H), at least 2-D
  std::optional<at::Tensor> smooth_scales, group_index;  // NotSupported by the CPU twin
  std::optional<int64_t> dst_type;                     // at::ScalarType value: None/int8, or float8_e4m3fn
  c10::string_view quant_mode = "pertoken";
  double dst_type_max = 0.0;                           // 0: the dtype's max (127 / 448)
};

// Per-row symmetric: scale = amax(|x|) / QMAX, q = round(x / scale) (half to
// even); returns (q (input shape, int8 or float8_e4m3fn), scale fp32
// (input.shape[:-1]): the dequant scale). An all-zero row gives scale 0, q 0.
std::tuple<at::Tensor, at::Tensor> dynamic_quant(const DynamicQuantArgs& a, Provider pv = Provider::Auto);

// Per (row_block_size x col_block_size) tile: scale = amax(|x|) / 127,
// y = rint(x / scale); returns (y int8 (x's shape), scale fp32
// (x.shape[:-1] + (ceil(cols / col_block_size),))). x 2-D or 3-D; the CPU twin
// implements row_block_size 1, col_block_size 128, dst_type 1 (int8),
// min_scale 0, round_mode "rint", dst_type_max 0 (others: NotSupported by name).
std::tuple<at::Tensor, at::Tensor> dynamic_block_quant(const at::Tensor& x, int64_t row_block_size,
                                                       int64_t col_block_size, int64_t dst_type = 1,
                                                       double min_scale = 0.0, c10::string_view round_mode = "rint",
                                                       double dst_type_max = 0.0, Provider pv = Provider::Auto);

}  // namespace aar::ops
