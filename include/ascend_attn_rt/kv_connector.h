// KV-connector hooks around a layer's attention (vLLM's KVConnectorBase_V1 worker
// API): with a connector set, an eager forward with metadata calls
// wait_for_layer_load before its first operator, then on_kv_cache_written(layer,
// wrote) and save_kv_layer after its writes and outputs; with none set each hook
// point is one null test. Inside a graph capture a forward with a connector is
// refused. A throwing hook surfaces naming the hook and layer.
// Design: docs/design/core.md §5.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

namespace aar {

// The layer's attention metadata as the forward received it: `type` is the
// backend's metadata type (gqa::Metadata, mla::Metadata, sfa::Metadata,
// dsa::LayerMetadata), `ptr` valid for the duration of the hook call only.
struct KvLayerMetadata {
  const void* ptr = nullptr;
  const std::type_info* type = nullptr;
  const char* backend = "";
  template <class T>
  const T* as() const {
    return type != nullptr && *type == typeid(T) ? static_cast<const T*>(ptr) : nullptr;
  }
};

// Thread safety: the hooks are called on the thread running the layer's forward; a
// connector shared by layers that run on several threads must synchronise itself.
class KvConnector {
 public:
  virtual ~KvConnector() = default;
  virtual void wait_for_layer_load(const std::string& layer_name) = 0;
  virtual void on_kv_cache_written(const std::string& layer_name, bool wrote_cache) = 0;
  virtual void save_kv_layer(const std::string& layer_name, const std::vector<at::Tensor>& kv_layer,
                             const KvLayerMetadata& attn_metadata) = 0;
};

namespace detail {
void kv_hook_wait(KvConnector& c, const std::string& layer);
void kv_hook_done(KvConnector& c, const std::string& layer, const std::vector<at::Tensor>& kv_layer, bool wrote,
                  const KvLayerMetadata& md);
}  // namespace detail

// One per layer (a public member of every Impl).
struct KvHooks {
  std::shared_ptr<KvConnector> connector;
  std::string layer_name;

  void set(std::shared_ptr<KvConnector> c, std::string name) {
    connector = std::move(c);
    layer_name = std::move(name);
  }
  // Hook point 1 (forward entry, after validation).
  void wait() const {
    if (connector) detail::kv_hook_wait(*connector, layer_name);
  }
  // Hook points 2 and 3 (forward end).
  template <class Md>
  void done(const std::vector<at::Tensor>& kv_layer, bool wrote, const Md& md, const char* backend) const {
    if (connector) detail::kv_hook_done(*connector, layer_name, kv_layer, wrote, KvLayerMetadata{&md, &typeid(Md), backend});
  }
};

// Hook points 1-3 around one forward, one line in each backend's forward:
// the constructor waits (point 1), the destructor of a scope left by a normal
// return calls points 2 and 3; a scope left by an exception calls nothing more
// (the forward failed; its own error propagates). The cache tensors are held
// by pointer (they outlive the forward), so with no connector the scope costs
// the pointer test and a few stores.
template <class Md>
class KvHookScope {
 public:
  KvHookScope(const KvHooks& h, const at::Tensor& a, const at::Tensor& b, bool wrote, const Md& md,
              const char* backend)
      : h_(h.connector ? &h : nullptr), a_(&a), b_(&b), wrote_(wrote), md_(md), backend_(backend) {
    if (h_ != nullptr) start();
  }
  KvHookScope(const KvHooks& h, const std::vector<at::Tensor>& kv, bool wrote, const Md& md, const char* backend)
      : h_(h.connector ? &h : nullptr), v_(&kv), wrote_(wrote), md_(md), backend_(backend) {
    if (h_ != nullptr) start();
  }
  KvHookScope(const KvHookScope&) = delete;
  KvHookScope& operator=(const KvHookScope&) = delete;
  ~KvHookScope() noexcept(false) {
    if (h_ == nullptr || !started_ || std::uncaught_exceptions() != exceptions_) return;
    if (v_ != nullptr) {
      h_->done(*v_, wrote_, md_, backend_);
    } else {
      std::vector<at::Tensor> kv;
      if (a_->defined()) kv.push_back(*a_);
      if (b_->defined()) kv.push_back(*b_);
      h_->done(kv, wrote_, md_, backend_);
    }
  }

 private:
  void start() {
    exceptions_ = std::uncaught_exceptions();
    h_->wait();
    started_ = true;
  }
  const KvHooks* h_;
  const at::Tensor* a_ = nullptr;
  const at::Tensor* b_ = nullptr;
  const std::vector<at::Tensor>* v_ = nullptr;
  bool wrote_;
  bool started_ = false;
  int exceptions_ = 0;
  const Md& md_;
  const char* backend_;
};

}  // namespace aar
