// Python facade of the KV-connector hooks (kv_connector.h) and the
// attention-buffer registry (attention_buffer.h). A Python connector object is
// wrapped in a C++ KvConnector that calls its methods by name (duck typing, no
// vLLM import): wait_for_layer_load(layer_name), on_kv_cache_written(layer_name,
// wrote_cache) when the object has it, and save_kv_layer(layer_name, kv_layer,
// attn_metadata) with kv_layer the tuple of the layer's cache tensors and
// attn_metadata the Python metadata object the forward was given (DSA: its
// StepMetadata). ascend_attn_rt.kv_connector adapts vLLM connectors to this.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "ascend_attn_rt/attention_buffer.h"
#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/fa3/impl.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/mla/impl.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "common.h"
#include "tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {

namespace {

class PyKvConnector final : public KvConnector {
 public:
  explicit PyKvConnector(nb::object obj) : obj_(std::move(obj)) {
    has_written_ = nb::hasattr(obj_, "on_kv_cache_written");
  }
  ~PyKvConnector() override {
    nb::gil_scoped_acquire gil;
    obj_.reset();
  }
  void wait_for_layer_load(const std::string& layer) override {
    nb::gil_scoped_acquire gil;
    guarded([&] { obj_.attr("wait_for_layer_load")(layer); });
  }
  void on_kv_cache_written(const std::string& layer, bool wrote) override {
    if (!has_written_) return;  // vLLM connectors have no such method: nothing to notify
    nb::gil_scoped_acquire gil;
    guarded([&] { obj_.attr("on_kv_cache_written")(layer, wrote); });
  }
  void save_kv_layer(const std::string& layer, const std::vector<at::Tensor>& kv_layer,
                     const KvLayerMetadata& md) override {
    nb::gil_scoped_acquire gil;
    nb::list kv;
    for (const at::Tensor& t : kv_layer) kv.append(t.defined() ? nb::cast(t) : nb::none());  // DSA: absent entries
    guarded([&] { obj_.attr("save_kv_layer")(layer, nb::tuple(kv), metadata_object(md)); });
  }
  const nb::object& object() const { return obj_; }

 private:
  // A Python exception becomes "Type: message" (its traceback stays in Python's
  // hands); the hook layer adds the hook and the layer.
  template <class F>
  static void guarded(F&& f) {
    try {
      f();
    } catch (nb::python_error& e) {
      std::string msg = std::string(nb::str(e.type().attr("__name__")).c_str()) + ": " + nb::str(e.value()).c_str();
      throw std::runtime_error(msg);
    }
  }
  // The Python object the forward's metadata came from (always one: forward
  // takes it from Python), None if it has none.
  static nb::object metadata_object(const KvLayerMetadata& md) {
    nb::handle h;
    if (auto* p = md.as<gqa::Metadata>()) h = nb::find(p);
    else if (auto* p = md.as<mla::Metadata>()) h = nb::find(p);
    else if (auto* p = md.as<sfa::Metadata>()) h = nb::find(p);
    else if (auto* p = md.as<dsa::LayerMetadata>()) h = p->step ? nb::find(p->step) : nb::handle();
    else if (auto* p = md.as<gqa::DcpMetadata>()) h = nb::find(p);
    else if (auto* p = md.as<cp::PcpMetadata>()) h = nb::find(p);
    return h.is_valid() ? nb::borrow(h) : nb::none();
  }
  nb::object obj_;
  bool has_written_ = false;
};

template <class Impl>
void add_hook_methods(const char* qualname) {
  nb::handle cls = nb::type<Impl>();
  AAR_CHECK_ARG(cls.is_valid(), "kv connector bindings: ", qualname, " is not bound yet");
  nb::setattr(cls, "set_kv_connector",
              nb::cpp_function(
                  [](Impl& self, nb::object connector, const std::string& layer_name) {
                    if (connector.is_none()) {
                      self.kv_hooks.set(nullptr, layer_name);
                      return;
                    }
                    for (const char* m : {"wait_for_layer_load", "save_kv_layer"}) {
                      AAR_CHECK_ARG(nb::hasattr(connector, m), "connector must have a ", m, " method (got ",
                                    nb::str(nb::type_name(connector.type())).c_str(), ")");
                    }
                    AAR_CHECK_ARG(!layer_name.empty(), "layer_name must not be empty");
                    self.kv_hooks.set(std::make_shared<PyKvConnector>(std::move(connector)), layer_name);
                  },
                  nb::is_method(), "connector"_a.none(), "layer_name"_a,
                  "Call the connector's wait_for_layer_load / on_kv_cache_written / save_kv_layer around every "
                  "eager forward of this layer (kv_connector.h); None removes it."));
  nb::setattr(cls, "kv_connector",
              nb::cpp_function(
                  [](const Impl& self) -> nb::object {
                    auto* c = dynamic_cast<const PyKvConnector*>(self.kv_hooks.connector.get());
                    return c ? c->object() : nb::none();
                  },
                  nb::is_method()));
  nb::setattr(cls, "kv_layer_name",
              nb::cpp_function([](const Impl& self) { return self.kv_hooks.layer_name; }, nb::is_method()));
}

void bind_kv_connector(nb::module_& m) {
  add_hook_methods<gqa::AttentionImpl>("AttentionImpl");
  add_hook_methods<c8::AttentionImpl>("C8AttentionImpl");
  add_hook_methods<fa3::AttentionImpl>("FA3AttentionImpl");
  add_hook_methods<mla::Impl>("mla.Impl");
  add_hook_methods<sfa::Impl>("sfa.Impl");
  add_hook_methods<dsa::Impl>("dsa.Impl");
  add_hook_methods<gqa::DcpAttentionImpl>("DcpAttentionImpl");
  add_hook_methods<cp::PcpAttentionImpl>("PcpAttentionImpl");

  m.def(
      "get_or_register_attention_buffer",
      [](const std::string& name, const std::vector<int64_t>& shape, nb::handle dtype, const std::string& device,
         bool zero_init) {
        // Any torch dtype: torch itself reads it (an empty tensor of that dtype).
        nb::object torch = nb::module_::import_("torch");
        AAR_CHECK_ARG(nb::isinstance(dtype, torch.attr("dtype")), "dtype must be a torch.dtype, got ",
                      nb::str(dtype).c_str());
        const at::ScalarType st = nb::cast<at::Tensor>(torch.attr("empty")(0, "dtype"_a = dtype)).scalar_type();
        return get_or_register_attention_buffer(name, shape, st, c10::Device(device), zero_init);
      },
      "name"_a, "shape"_a, "dtype"_a, "device"_a = "cpu", "zero_init"_a = false,
      "One process-wide registry of shared, address-stable buffers (attention_buffer.h): the same name with the "
      "same shape, dtype and device returns the same storage; another spec raises ValueError naming both.");
  m.def("release_attention_buffer", &release_attention_buffer, "name"_a,
        "Drop the registry's reference to a buffer (tensors handed out keep theirs). True if it was registered.");
  m.def("attention_buffer_names", &attention_buffer_names, "Names registered in the attention-buffer registry.");
}

}  // namespace

// After every Impl class is bound (the context-parallel layers are bound at 910).
const BindingRegistrar kRegisterKvConnector(/*order=*/950, &bind_kv_connector);

}  // namespace aar::bindings
