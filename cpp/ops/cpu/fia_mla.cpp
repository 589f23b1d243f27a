#include "fia_mla.h"

#include "ascend_attn_rt/errors.h"

namespace aar::ops::cpu {

std::tuple<at::Tensor, at::Tensor> MlaFold::finish(std::tuple<at::Tensor, at::Tensor> r) const {
  if (out_perm.empty()) return r;
  return {std::get<0>(r).permute(out_perm).contiguous(), std::get<1>(r)};
}

MlaFold fold_mla(const char* op, const at::Tensor& query, const at::Tensor& key,
                 const std::optional<at::Tensor>& query_rope, const std::optional<at::Tensor>& key_rope,
                 c10::string_view layout, bool paged) {
  MlaFold f;
  f.query = query;
  f.key = key;
  f.base_layout = std::string(layout.data(), layout.size());
  bool bsnd = false;
  if (layout == "TND_NTD") {
    f.base_layout = "TND";
    f.out_perm = {1, 0, 2};
  } else if (layout == "BNSD_NBSD") {
    f.base_layout = "BNSD";
    f.out_perm = {1, 0, 2, 3};
  } else if (layout == "BSND" || layout == "BSND_NBSD") {
    if (!paged) {
      throw_not_supported(op, ": not supported by the CPU twin: input_layout=\"", layout,
                          "\" with dense key/value (only with a block_table)");
    }
    bsnd = true;
    f.base_layout = "BNSD";
    f.out_perm = layout == "BSND" ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 0, 2, 3};
  }
  const bool has_qr = query_rope.has_value() && query_rope->defined();
  const bool has_kr = key_rope.has_value() && key_rope->defined();
  if (has_qr != has_kr) {
    throw_not_supported(op, ": not supported by the CPU twin: ", has_qr ? "query_rope without key_rope" : "key_rope without query_rope",
                        " (MLA passes query_rope and key_rope together)");
  }
  if (has_qr) {
    const at::Tensor& qr = *query_rope;
    const at::Tensor& kr = *key_rope;
    AAR_CHECK_ARG(qr.scalar_type() == query.scalar_type() && kr.scalar_type() == key.scalar_type(), op,
                  ": query_rope/key_rope dtypes (", qr.scalar_type(), ", ", kr.scalar_type(),
                  ") must equal the query/key dtypes (", query.scalar_type(), ", ", key.scalar_type(), ")");
    AAR_CHECK_ARG(qr.dim() == query.dim() && qr.sizes().slice(0, qr.dim() - 1) == query.sizes().slice(0, query.dim() - 1),
                  op, ": query_rope must match query ", query.sizes(), " except in the last dim, got ", qr.sizes());
    // 5-D NZ caches (nb, Nkv, D/c, bs, c) concatenate on dim 2, everything else on the last dim.
    const int64_t kdim = key.dim() == 5 ? 2 : key.dim() - 1;
    bool ok = kr.dim() == key.dim();
    for (int64_t i = 0; ok && i < key.dim(); ++i) ok = i == kdim || kr.size(i) == key.size(i);
    AAR_CHECK_ARG(ok, op, ": key_rope must match key ", key.sizes(), " except in dim ", kdim, ", got ", kr.sizes());
    f.query = at::cat({query, qr}, -1);
    f.key = at::cat({key, kr}, kdim);
  }
  if (bsnd) f.query = f.query.permute({0, 2, 1, 3});
  return f;
}

void MlaFold::out(const char* op, const FiaInputs& in, bool want_lse, at::Tensor& attention_out,
                  at::Tensor& softmax_lse) const {
  if (permutes()) {
    copy_out(op, finish(fia_functional(in, want_lse)), want_lse, attention_out, softmax_lse);
  } else {
    fia_out(in, want_lse, attention_out, softmax_lse);
  }
}

void copy_out(const char* op, const std::tuple<at::Tensor, at::Tensor>& r, bool want_lse, at::Tensor& attention_out,
              at::Tensor& softmax_lse) {
  const at::Tensor& o = std::get<0>(r);
  AAR_CHECK_ARG(attention_out.sizes() == o.sizes(), op, ": attention_out must have shape ", o.sizes(), ", got ",
                attention_out.sizes());
  AAR_CHECK_ARG(attention_out.scalar_type() == o.scalar_type(), op, ": attention_out dtype ",
                attention_out.scalar_type(), " must equal the query dtype ", o.scalar_type());
  if (want_lse) {
    const at::Tensor& l = std::get<1>(r);
    AAR_CHECK_ARG(softmax_lse.sizes() == l.sizes() && softmax_lse.scalar_type() == at::kFloat, op,
                  ": softmax_lse must be float32 of shape ", l.sizes(), ", got ", softmax_lse.scalar_type(), " ",
                  softmax_lse.sizes());
    softmax_lse.copy_(l);
  }
  attention_out.copy_(o);
}

}  // namespace aar::ops::cpu
