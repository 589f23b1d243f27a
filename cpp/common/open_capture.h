#pragma once
// Private to cpp/: whether a graph capture is open on this thread, kept below the
// graph layer so that the code under it (the KV-connector hooks) can refuse host
// work that a replay would not redo, without knowing the graph store. The store
// (cpp/graph/graph_params.cpp) marks the thread when it opens a capture and
// clears the mark when it closes it.
#include <cstdint>

namespace aar::detail {

// The bucket being captured on this thread, -1 when no capture is open.
int64_t open_capture_bucket() noexcept;
void set_open_capture_bucket(int64_t bucket) noexcept;

// Throws NotSupported naming `what` when a capture is open on this thread.
void refuse_if_capturing(const char* what);

}  // namespace aar::detail
