#include "dsa_common.h"

namespace aar::ops::cpu::dsa {

namespace {

void check_int_tensor(const char* op, const at::Tensor& t, const char* name, int64_t dim) {
  AAR_CHECK_ARG(t.defined(), op, ": ", name, " is required");
  AAR_CHECK_ARG(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
                " must be int32 (or int64), got ", t.scalar_type());
  AAR_CHECK_ARG(t.dim() == dim, op, ": ", name, " must be ", dim, "-D, got shape ", t.sizes());
  AAR_CHECK_ARG(t.device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t.device());
}

std::vector<int64_t> to_int64(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

}  // namespace

std::vector<int64_t> read_ints(const char* op, const at::Tensor& t, const char* name) {
  check_int_tensor(op, t, name, 1);
  return to_int64(t);
}

IntTable read_table(const char* op, const at::Tensor& t, const char* name) {
  check_int_tensor(op, t, name, 2);
  return IntTable{t.size(0), t.size(1), to_int64(t)};
}

int64_t check_cu_seqlens(const char* op, const std::vector<int64_t>& cu, int64_t tokens, const char* tokens_name) {
  AAR_CHECK_ARG(!cu.empty(), op, ": cu_seqlens must have B + 1 >= 1 entries, got none");
  AAR_CHECK_ARG(cu[0] == 0, op, ": cu_seqlens[0] must be 0 (cu_seqlens = [0, cu_1, ..., cu_B]), got ", cu[0]);
  for (size_t i = 1; i < cu.size(); ++i) {
    AAR_CHECK_ARG(cu[i] >= cu[i - 1], op, ": cu_seqlens must be non-decreasing, got cu_seqlens[", i, "]=", cu[i],
                  " < cu_seqlens[", i - 1, "]=", cu[i - 1]);
  }
  AAR_CHECK_ARG(tokens < 0 || cu.back() <= tokens, op, ": cu_seqlens[B]=", cu.back(), " exceeds ", tokens_name, "=",
                tokens);
  return static_cast<int64_t>(cu.size()) - 1;
}

bool is_byte_dtype(at::ScalarType t) {
  return t == at::kByte || t == at::kChar || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

}  // namespace aar::ops::cpu::dsa
