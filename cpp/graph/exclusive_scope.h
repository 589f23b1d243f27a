#pragma once
// Private to cpp/: how forwards hold the shared workspaces they use
// (common/exclusive_use.h). Each layer forward that may touch a shared
// workspace opens a ForwardScope on its stack; a workspace that hands out its
// buffers calls use_in_forward(), which enters it for the rest of that forward
// (refused by name when another thread is inside) and, inside an open graph
// capture on this thread, records it in the bucket being captured, so that
// GraphParams::replay enters it for each replay. Outside any ForwardScope
// (a workspace used directly, as the unit tests do) nothing is checked.
#include <array>
#include <cstddef>
#include <memory>

#include "../common/exclusive_use.h"

namespace aar::graph {

class ForwardScope {
 public:
  ForwardScope() noexcept;
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

  // Enters `use` until this scope ends (once per scope); throws when another
  // thread holds it.
  void hold(const std::shared_ptr<detail::ExclusiveUse>& use);

 private:
  static constexpr std::size_t kMax = 8;
  ForwardScope* prev_;
  // Owning: a workspace made for one call (the DSA prefill path's local one)
  // may be destroyed before the scope ends; the scope still leaves it.
  std::array<std::shared_ptr<detail::ExclusiveUse>, kMax> held_{};
  std::size_t n_ = 0;
};

// The innermost ForwardScope of this thread holds `use` (no scope: nothing).
void use_in_forward(const std::shared_ptr<detail::ExclusiveUse>& use);

}  // namespace aar::graph
