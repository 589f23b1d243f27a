// Internal: the C++ function types of torch_npu's MX (microscaling) fp8
// operators (schemas in schemas.cpp), as op_signatures.h does for the others.
#pragma once

#include "op_signatures.h"

namespace aar::ops::sig {

#define AAR_DYNAMIC_MX_QUANT_PARAMS                                                                   \
  const at::Tensor &input, int64_t axis, sig::Str round_mode, int64_t dst_type, int64_t block_size,  \
      sig::OptInt scale_alg, double dst_type_max, double max_low_bound
using DynamicMxQuant = std::tuple<at::Tensor, at::Tensor>(AAR_DYNAMIC_MX_QUANT_PARAMS);

#define AAR_TRANSPOSE_QUANT_BMM_PARAMS                                                                 \
  const at::Tensor &x1, const at::Tensor &x2, int64_t dtype, sig::OptT bias, sig::OptT x1_scale,      \
      sig::OptT x2_scale, at::OptionalIntArrayRef group_sizes, at::OptionalIntArrayRef perm_x1,       \
      at::OptionalIntArrayRef perm_x2, at::OptionalIntArrayRef perm_y, sig::OptInt batch_split_factor, \
      sig::OptInt x1_dtype, sig::OptInt x2_dtype
using TransposeQuantBatchMatmul = at::Tensor(AAR_TRANSPOSE_QUANT_BMM_PARAMS);

}  // namespace aar::ops::sig
