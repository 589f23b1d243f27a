#include "ascend_attn_rt/attention_buffer.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <sstream>

#include "ascend_attn_rt/errors.h"

namespace aar {

namespace {

// Both leaked on purpose: workspaces release their entries from destructors
// that may run during static teardown.
std::mutex& registry_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<std::string, at::Tensor>& registry() {
  static auto* r = new std::map<std::string, at::Tensor>();  // never destroyed: tensors outlive static teardown
  return *r;
}

std::string spec(c10::IntArrayRef shape, c10::ScalarType dtype, c10::Device device) {
  std::ostringstream os;
  os << "shape " << shape << ", dtype " << dtype << ", device " << device;
  return os.str();
}

}  // namespace

at::Tensor get_or_register_attention_buffer(const std::string& name, c10::IntArrayRef shape, c10::ScalarType dtype,
                                            c10::Device device, bool zero_init) {
  AAR_CHECK_ARG(!name.empty(), "get_or_register_attention_buffer: name must not be empty");
  for (int64_t s : shape) {
    AAR_CHECK_ARG(s >= 0, "get_or_register_attention_buffer('", name, "'): shape ", shape, " has a negative size");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  auto it = r.find(name);
  if (it != r.end()) {
    const at::Tensor& t = it->second;
    if (t.sizes() != shape || t.scalar_type() != dtype || t.device() != device) {
      throw_invalid("get_or_register_attention_buffer('", name, "'): registered with ",
                    spec(t.sizes(), t.scalar_type(), t.device()), ", requested with ", spec(shape, dtype, device));
    }
    return t;
  }
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  at::Tensor t = zero_init ? at::zeros(shape, opts) : at::empty(shape, opts);
  r.emplace(name, t);
  return t;
}

bool release_attention_buffer(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().erase(name) > 0;
}

std::vector<std::string> attention_buffer_names() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& kv : registry()) names.push_back(kv.first);
  return names;
}

}  // namespace aar
