// Internal: the two streams of the DSA multistream prolog (docs/design/dsa.md §5.5). The
// compressors and the indexer's cache write run on a side stream taken once from the device's
// stream pool, the prolog, the selection and the attention on the caller's current stream; events
// order the side stream after the layer's inputs and the main stream after the KV writes it reads.
// On CPU there is one in-order stream: both roles are the default stream and the events are
// elided (the order of the calls is the order of execution). An optional log records which role
// and which c10 stream each part ran on (Impl::stream_log).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/dsa/impl.h"

namespace aar::dsa::detail {

// One device's side stream and the layer's events, made on the first multistream forward.
class SideStream {
 public:
  // The side stream of `device` (the pool's; CPU: the default stream).
  explicit SideStream(c10::Device device);
  const c10::Stream& stream() const { return side_; }
  bool has_events() const { return events_; }
  c10::Event& event(size_t i) { return *ev_[i]; }

 private:
  c10::Stream side_;
  bool events_ = false;
  std::array<std::unique_ptr<c10::Event>, 3> ev_;
};

// One forward's use of the two streams.
class StreamPlan {
 public:
  // Marks: 0 the layer's inputs (fork), 1 the indexer cache written, 2 the compressed KV written.
  enum Mark : size_t { kInputs = 0, kIndexerCache = 1, kCompressedKv = 2 };
  // side == nullptr: single stream (everything on the current stream); log may be nullptr.
  StreamPlan(SideStream* side, c10::Device device, std::vector<StreamLogEntry>* log);
  bool multistream() const { return side_ != nullptr; }
  // The side stream waits for the main stream's work so far.
  void fork();
  // Runs f for `part` on the side stream (the current stream without multistream), then records `mark`.
  template <class F>
  void on_side(const char* part, Mark mark, F&& f) {
    if (side_ == nullptr) {
      log(part, StreamRole::Main, main_);
      f();
      return;
    }
    log(part, StreamRole::Side, side_->stream());
    {
      const Switch s(*this, side_->stream());
      f();
      if (side_->has_events()) side_->event(mark).record(side_->stream());
    }
  }
  // `part` on the main stream (logged).
  void on_main(const char* part) { log(part, StreamRole::Main, main_); }
  // The main stream waits for the side stream's work up to `mark` (no-op without multistream).
  void wait(Mark mark, const char* part);

 private:
  // Makes a stream current for a scope.
  class Switch {
   public:
    Switch(StreamPlan& p, const c10::Stream& s);
    ~Switch();
    Switch(const Switch&) = delete;
    Switch& operator=(const Switch&) = delete;

   private:
    StreamPlan& p_;
    c10::Stream prev_;
  };
  void log(const char* part, StreamRole role, const c10::Stream& s);

  SideStream* side_;
  c10::Device device_;
  c10::Stream main_;
  std::vector<StreamLogEntry>* log_;
};

}  // namespace aar::dsa::detail
