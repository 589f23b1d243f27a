// The DCP top-k remap on the device (docs/design/sparse_cp.md §3).
#include "ascend_attn_rt/sparse/topk_remap.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"

namespace aar::sparse {

at::Tensor remap_topk_to_dcp_rank(const at::Tensor& topk, int32_t world, int32_t rank, int32_t interleave) {
  AAR_CHECK_ARG(world >= 1 && world <= plan::kMaxCpMergePartitions && rank >= 0 && rank < world, "dcp rank ", rank,
                " of world size ", world, " is not a valid DCP rank (world in [1, ", plan::kMaxCpMergePartitions,
                "])");
  AAR_CHECK_ARG(interleave >= 1, "cp_kv_cache_interleave_size must be positive, got ", interleave);
  AAR_CHECK_ARG(topk.defined() && topk.dim() >= 1 && topk.scalar_type() == at::kInt,
                "topk must be an int32 tensor (..., K), got ", topk.defined() ? topk.sizes() : c10::IntArrayRef{},
                topk.defined() ? " " : "", topk.defined() ? c10::toString(topk.scalar_type()) : "undefined");
  if (world == 1) return topk;
  // Under the no-compute provider: the shape only (a benchmark measures the host work; on the device
  // the arithmetic below is launched, not run on the host).
  if (ops::dense::no_compute()) return ops::dense::zeros(topk.sizes(), topk.options());
  const int64_t K = topk.size(-1), W = world, I = interleave;
  // Integer arithmetic on clamped positions (exact over the whole int32 range; upstream's
  // float32 form is exact below 2^24 only).
  const at::Tensor x = topk.clamp_min(0);
  const at::Tensor keep = topk.ge(0).logical_and_(at::div(x, I, "floor").remainder_(W).eq_(rank));
  const at::Tensor local = at::div(x, W * I, "floor").mul_(I).add_(x.remainder(I));
  // Kept entries first in their top-k order, then the rest: distinct keys j + (keep ? 0 : K).
  const at::Tensor key = at::arange(K, topk.options()).add(keep.logical_not().to(at::kInt).mul_(K));
  const at::Tensor order = std::get<1>(key.sort(/*dim=*/-1, /*descending=*/false));
  return at::where(keep, local, at::full({}, -1, topk.options())).gather(-1, order);
}

void remap_topk_to_dcp_rank_out(const at::Tensor& out, const at::Tensor& topk, const at::Tensor& limit,
                                int32_t world, int32_t rank, int32_t interleave) {
  AAR_CHECK_ARG(world >= 1 && world <= plan::kMaxCpMergePartitions && rank >= 0 && rank < world, "dcp rank ", rank,
                " of world size ", world, " is not a valid DCP rank (world in [1, ", plan::kMaxCpMergePartitions,
                "])");
  AAR_CHECK_ARG(interleave >= 1, "cp_kv_cache_interleave_size must be positive, got ", interleave);
  AAR_CHECK_ARG(topk.defined() && topk.dim() >= 1 && topk.scalar_type() == at::kInt,
                "topk must be an int32 tensor (..., K), got ", topk.defined() ? topk.sizes() : c10::IntArrayRef{},
                topk.defined() ? " " : "", topk.defined() ? c10::toString(topk.scalar_type()) : "undefined");
  AAR_CHECK_ARG(out.defined() && out.scalar_type() == at::kInt && out.sizes() == topk.sizes(),
                "out must be an int32 tensor of topk's shape ", topk.sizes(), ", got ",
                out.defined() ? out.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(limit.defined() && limit.scalar_type() == at::kInt && limit.dim() == topk.dim(),
                "limit must be an int32 tensor of ", topk.dim(), " dims broadcasting against topk, got ",
                limit.defined() ? limit.sizes() : c10::IntArrayRef{});
  if (ops::dense::no_compute()) return;
  const int64_t K = topk.size(-1), W = world, I = interleave;
  const at::Tensor x = topk.clamp_min(0);
  const at::Tensor keep = topk.ge(0).logical_and_(topk.lt(limit)).logical_and_(
      at::div(x, I, "floor").remainder_(W).eq_(rank));
  const at::Tensor local = at::div(x, W * I, "floor").mul_(I).add_(x.remainder(I));
  const at::Tensor key = at::arange(K, topk.options()).add(keep.logical_not().to(at::kInt).mul_(K));
  const at::Tensor order = std::get<1>(key.sort(/*dim=*/-1, /*descending=*/false));
  at::Tensor dst = out;  // a handle on the caller's storage
  at::gather_out(dst, at::where(keep, local, at::full({}, -1, topk.options())), -1, order);
}

}  // namespace aar::sparse
