// Internal: the MLA arguments of the FIA v1/v2 CPU twins (docs/design/mla.md §5.3, docs/design/ops.md §4.1).
// `query_rope` / `key_rope` are folded into query / key by concatenation on
// the head dim (s = scale * (q.k + q_rope.k_rope) is exactly the score of the
// concatenated vectors; value keeps its own width, so a latent cache passed as
// key and value still yields Dv = L); the MLA layouts are reduced to the base
// TND / BNSD layouts the twin core computes, and the output is permuted back:
//   TND_NTD   : query (T, N, D),    output (N, T, Dv)
//   BNSD_NBSD : query (B, N, S, D), output (N, B, S, Dv)
//   BSND      : query (B, S, N, D), output (B, S, N, Dv)   (paged KV only)
//   BSND_NBSD : query (B, S, N, D), output (N, B, S, Dv)   (paged KV only)
// The LSE keeps the base layout's shape ((T, N, 1) or (B, N, S, 1)).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fia_common.h"

namespace aar::ops::cpu {

struct MlaFold {
  at::Tensor query, key;          // folded (or the originals)
  std::string base_layout;        // "TND" or "BNSD" (or the input layout when not an MLA layout)
  std::vector<int64_t> out_perm;  // applied to the base-layout output; empty = none

  std::tuple<at::Tensor, at::Tensor> finish(std::tuple<at::Tensor, at::Tensor> r) const;
  bool permutes() const { return !out_perm.empty(); }
  // The .out variants: compute in place, or (permuted layouts) compute, permute
  // and copy into the caller's buffers after checking them.
  void out(const char* op, const FiaInputs& in, bool want_lse, at::Tensor& attention_out,
           at::Tensor& softmax_lse) const;
};

MlaFold fold_mla(const char* op, const at::Tensor& query, const at::Tensor& key,
                 const std::optional<at::Tensor>& query_rope, const std::optional<at::Tensor>& key_rope,
                 c10::string_view layout, bool paged);

// .out variants with a permuted layout: checks the caller's buffers against the
// permuted result and copies into them.
void copy_out(const char* op, const std::tuple<at::Tensor, at::Tensor>& r, bool want_lse, at::Tensor& attention_out,
              at::Tensor& softmax_lse);

}  // namespace aar::ops::cpu

// Inside an inner block of a v1/v2 entry point: hides the parameters query,
// key, query_rope, key_rope and input_layout behind their folded values, so
// the unchanged argument macros (AAR_FIA_V1_ARGS / AAR_FIA_V2_ARGS) pass them on.
#define AAR_FIA_MLA_SHADOW(f)                                                 \
  const at::Tensor& query = (f).query;                                        \
  const at::Tensor& key = (f).key;                                            \
  const std::optional<at::Tensor>& query_rope = ::aar::ops::cpu::no_tensor(); \
  const std::optional<at::Tensor>& key_rope = ::aar::ops::cpu::no_tensor();   \
  const c10::string_view input_layout = (f).base_layout;
