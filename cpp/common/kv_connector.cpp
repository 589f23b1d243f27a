#include "ascend_attn_rt/kv_connector.h"

#include <exception>
#include <stdexcept>

#include "ascend_attn_rt/errors.h"
#include "open_capture.h"

namespace aar::detail {

namespace {

[[noreturn]] void rethrow_named(const char* hook, const std::string& layer) {
  std::string what;
  try {
    throw;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  throw std::runtime_error(std::string("KV connector hook ") + hook + "(layer '" + layer + "') failed: " + what);
}

}  // namespace

void kv_hook_wait(KvConnector& c, const std::string& layer) {
  if (open_capture_bucket() >= 0) {
    throw_not_supported("KV connector hooks inside a graph capture (layer '", layer,
                        "'): the hooks are host calls a replay would not make; capture without a connector");
  }
  try {
    c.wait_for_layer_load(layer);
  } catch (...) {
    rethrow_named("wait_for_layer_load", layer);
  }
}

void kv_hook_done(KvConnector& c, const std::string& layer, const std::vector<at::Tensor>& kv_layer, bool wrote,
                  const KvLayerMetadata& md) {
  try {
    c.on_kv_cache_written(layer, wrote);
  } catch (...) {
    rethrow_named("on_kv_cache_written", layer);
  }
  try {
    c.save_kv_layer(layer, kv_layer, md);
  } catch (...) {
    rethrow_named("save_kv_layer", layer);
  }
}

}  // namespace aar::detail
