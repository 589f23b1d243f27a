#include "checkpoint_reader.h"

#include <sstream>

#include "ascend_attn_rt/errors.h"

namespace aar::detail {

namespace {

std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << (s.size() == 1 ? ",)" : ")");
  return os.str();
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// A whole model's state under an empty prefix would list thousands of keys.
constexpr size_t kMaxListed = 20;

void list(std::ostringstream& os, const char* label, const std::vector<std::string>& items) {
  if (items.empty()) return;
  os << "; " << label << ": ";
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) os << (i ? ", " : "") << items[i];
  if (items.size() > kMaxListed) os << ", ... (" << items.size() - kMaxListed << " more)";
}

}  // namespace

CheckpointReader::CheckpointReader(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                   std::string what)
    : state_(state), prefix_(prefix), what_(std::move(what)) {
  if (!prefix_.empty() && prefix_.back() != '.') prefix_ += '.';
}

bool CheckpointReader::has(std::string_view name) const { return state_.count(key(name)) != 0; }

at::Tensor CheckpointReader::take(std::string_view name, std::vector<int64_t> shape) {
  const std::string k = key(name);
  const auto it = state_.find(k);
  if (it == state_.end() || !it->second.defined()) {
    missing_.push_back("'" + k + "'" + " " + shape_str(shape));
    if (it != state_.end()) read_.insert(k);
    return at::Tensor();
  }
  read_.insert(k);
  if (it->second.sizes() != c10::IntArrayRef(shape)) {
    misshapen_.push_back("'" + k + "' is " + shape_str(it->second.sizes()) + ", expected " + shape_str(shape));
    return at::Tensor();
  }
  return it->second;
}

void CheckpointReader::finish() const {
  std::vector<std::string> unexpected;
  for (auto it = state_.lower_bound(prefix_); it != state_.end() && starts_with(it->first, prefix_); ++it) {
    const std::string& k = it->first;
    if (read_.count(k)) continue;
    const size_t dot = k.rfind('.');
    if (dot != std::string::npos && dot >= prefix_.size() && read_.count(k.substr(0, dot) + ".weight")) {
      const std::string suffix = k.substr(dot + 1);
      if (suffix == "bias") {
        throw_not_supported(what_, " checkpoint: '", k, "' is a bias of '", k.substr(0, dot), ".weight', which the "
                            "runtime's layer takes without one (checkpoints with attention_bias=False only)");
      }
      if (suffix == "scale" || suffix == "weight_scale" || suffix == "weight_scale_inv" || suffix == "input_scale") {
        throw_not_supported(what_, " checkpoint: '", k, "' is a quantisation scale: quantised checkpoint weights are "
                            "not supported here, dequantise them to bfloat16 (or float16 / float32) first");
      }
    }
    unexpected.push_back("'" + k + "'");
  }
  if (missing_.empty() && misshapen_.empty() && unexpected.empty()) return;
  std::ostringstream os;
  os << what_ << " checkpoint weights under prefix '" << prefix_ << "' do not match the layer's config";
  list(os, "missing", missing_);
  list(os, "wrong shape", misshapen_);
  list(os, "unexpected", unexpected);
  throw InvalidArgument(os.str());
}

void check_linear_dtype(const at::Tensor& t, const std::string& key, at::ScalarType dt) {
  const at::ScalarType s = t.scalar_type();
  if (s == at::kFloat8_e4m3fn || s == at::kFloat8_e5m2 || s == at::kFloat8_e4m3fnuz || s == at::kFloat8_e5m2fnuz ||
      s == at::kFloat8_e8m0fnu) {
    throw_not_supported("'", key, "' is ", s, ": quantised checkpoint weights are not supported here, dequantise "
                        "them to bfloat16 (or float16 / float32) first");
  }
  AAR_CHECK_ARG(s == at::kBFloat16 || s == at::kHalf || s == at::kFloat, "'", key, "' is ", s,
                ", expected bfloat16, float16 or float32");
  AAR_CHECK_ARG(s == dt, "'", key, "' is ", s, " but the layer's projections are ", dt,
                " (one dtype for every projection)");
}

void check_float(const at::Tensor& t, const std::string& key) {
  AAR_CHECK_ARG(at::isFloatingType(t.scalar_type()), "'", key, "' is ", t.scalar_type(), ", expected a float dtype");
}

at::Tensor as_dtype(const at::Tensor& t, const std::string& key, at::ScalarType dt) {
  check_float(t, key);
  return t.scalar_type() == dt ? t : t.to(dt);
}

}  // namespace aar::detail
