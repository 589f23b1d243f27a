// Operators run under c10::InferenceMode (DESIGN.md, rules of the house): without it a
// custom operator with no Autograd kernel goes through PyTorch's boxed autograd fallback.
// The runtime takes the guard once per entry point (a layer's forward, a graph update or
// replay), and only when its caller is not inside inference mode already; the operator
// wrappers then find it active. A wrapper called on its own from outside inference mode
// (a test, an engine calling one operator) takes the guard for that call.
#pragma once

#include <cstdint>

namespace aar::ops::testing {

// Test-only: the inference-mode guards the runtime took on the calling thread (one per
// forward, update or replay that was called from outside inference mode; one per operator
// call only for wrappers called on their own). Entries that found the thread inside
// inference mode already take no guard and are not counted.
int64_t inference_mode_entries();

}  // namespace aar::ops::testing
