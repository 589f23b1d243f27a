// Internal: reads one layer's tensors out of a checkpoint's name -> tensor map
// (dsa/checkpoint.h, sfa/checkpoint.h). Every problem is collected and
// reported at once, by full key, so a user fixing a prefix or a config sees
// all of them in one error instead of one per attempt.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace aar::detail {

class CheckpointReader {
 public:
  // Keys are looked up as prefix + name; a non-empty prefix gets a trailing
  // '.' when it has none, so "layers.1" never reads "layers.10.*". Keys that
  // do not start with the prefix are outside the layer and never looked at.
  // `what` names the layer kind in messages ("DSA", "SFA").
  CheckpointReader(const std::map<std::string, at::Tensor>& state, std::string_view prefix, std::string what);

  bool has(std::string_view name) const;
  // The tensor at prefix + name, recorded as read. Missing, undefined or of
  // another shape: recorded as a problem and an undefined tensor returned.
  at::Tensor take(std::string_view name, std::vector<int64_t> shape);

  // Throws NotSupported when an unread key of the layer is a companion of a
  // linear weight that the runtime has no use for (a bias, a quantisation
  // scale); else InvalidArgument listing the missing, misshapen and
  // unexpected (unread) keys. Returns when there is none.
  void finish() const;

  // The full key of a name (prefix + name), for messages.
  std::string key(std::string_view name) const { return prefix_ + std::string(name); }

 private:
  const std::map<std::string, at::Tensor>& state_;
  std::string prefix_, what_;
  std::set<std::string> read_;
  std::vector<std::string> missing_, misshapen_;
};

// Checks t is floating (bf16, fp16 or fp32) and of the layer's dtype `dt`;
// float8 weights (block-quantised checkpoints) are NotSupported. `key` is the
// checkpoint's name of t.
void check_linear_dtype(const at::Tensor& t, const std::string& key, at::ScalarType dt);
// Refuses a non-float t by key.
void check_float(const at::Tensor& t, const std::string& key);
// t in dtype `dt` (t itself when it has it): for norm weights, which some
// checkpoints keep in float32 next to bf16 projections. Refuses non-float t.
at::Tensor as_dtype(const at::Tensor& t, const std::string& key, at::ScalarType dt);

}  // namespace aar::detail
