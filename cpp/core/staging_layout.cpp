#include "staging_layout.h"

#include <ATen/ATen.h>

#include <sstream>

#include "ascend_attn_rt/errors.h"

namespace aar::core {

Region StagingLayout::add(std::string name, int64_t words, int64_t align) {
  AAR_CHECK_ARG(words >= 0 && align > 0, "staging region ", name, ": words=", words, ", align=", align);
  const Region r{align_words(end_, align), words};
  end_ = r.end();
  regions_.emplace_back(std::move(name), r);
  return r;
}

std::string StagingLayout::describe() const {
  std::ostringstream os;
  for (const auto& [name, r] : regions_) os << name << " [" << r.offset << ", " << r.end() << ") ";
  return os.str();
}

RegionViews::RegionViews(at::Tensor buffer, Region r, int64_t max_count, at::ScalarType dtype, int64_t cols)
    : buffer_(std::move(buffer)), region_(r), dtype_(dtype), cols_(cols), cache_(max_count) {}

at::Tensor RegionViews::make(int64_t n) const {
  const int64_t per = dtype_ == at::kLong ? 2 : 1;  // int32 words per element
  const int64_t elems = n * (cols_ > 0 ? cols_ : 1);
  at::Tensor v = buffer_.narrow(0, region_.offset, elems * per);
  if (per == 2) v = v.view(at::kLong);
  return cols_ > 0 ? v.view({n, cols_}) : v;
}

}  // namespace aar::core
