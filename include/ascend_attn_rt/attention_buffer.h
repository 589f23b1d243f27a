// One process-wide registry of shared, address-stable buffers (issue 14 part
// 4): the workspaces that layers of one shape share (the MLA decode
// workspace) and that an engine may want to share with its own kernels.
//
// get_or_register_attention_buffer(name, shape, dtype, device): the first call
// with a name allocates the buffer (uninitialised, or zeros with
// zero_init) and keeps it; later calls with the same name and a compatible spec
// (same shape, dtype and device; zero_init is the first caller's) return a
// tensor over the same storage (same data_ptr). Any other spec raises
// InvalidArgument naming the buffer, the registered spec and the requested one.
// Thread safety: every function may be called from any number of threads at
// once (one mutex; tests/cpp/test_concurrency.cpp). The registry holds its buffers until
// release_attention_buffer(name): that drops the registry's reference only;
// tensors already handed out keep their storage alive.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace aar {

at::Tensor get_or_register_attention_buffer(const std::string& name, c10::IntArrayRef shape, c10::ScalarType dtype,
                                            c10::Device device, bool zero_init = false);
// True when the registry held `name`.
bool release_attention_buffer(const std::string& name);
// Names currently registered (sorted), for tests and diagnostics.
std::vector<std::string> attention_buffer_names();

}  // namespace aar
