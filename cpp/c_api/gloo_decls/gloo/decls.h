// Declarations of the gloo names that torch's c10d/ProcessGroupGloo.hpp mentions, for
// cpp/c_api/cp_gloo.cpp only. The torch wheel ships ProcessGroupGloo.hpp but not gloo's headers,
// while libtorch_cpu exports ProcessGroupGloo's constructor; this header lets that one file
// include torch's class definition and call it (docs/design/c_api.md §4.1).
//
// Why this is sound: every gloo type ProcessGroupGloo.hpp names reaches ProcessGroupGloo's
// and its Options' layouts only through std::shared_ptr / std::unique_ptr members, so their
// sizes and offsets come from torch's own header whatever these declarations hold; the one
// file that includes it constructs Options and ProcessGroupGloo through the exported
// constructors, and calls no inline code that touches a gloo object (gloo::Context::setTimeout
// and the rendezvous store's virtuals are declared so the header's inline bodies parse, never
// called or emitted here). Not a general gloo header: nothing else includes it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport

namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous

}  // namespace gloo
