// The DSA multistream prolog's streams (docs/design/dsa.md §5.5); see streams.h.
#include "streams.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace aar::dsa::detail {

namespace {

// CPU (and Meta) have one in-order stream and no events.
bool single_stream_device(c10::Device d) { return d.type() == c10::DeviceType::CPU || d.type() == c10::DeviceType::Meta; }

}  // namespace

SideStream::SideStream(c10::Device device)
    : side_(single_stream_device(device) ? c10::Stream(c10::Stream::DEFAULT, device)
                                         : c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device)),
      events_(!single_stream_device(device)) {
  if (events_) {
    for (auto& e : ev_) e = std::make_unique<c10::Event>(device.type());
  }
}

StreamPlan::StreamPlan(SideStream* side, c10::Device device, std::vector<StreamLogEntry>* log)
    : side_(side),
      device_(device),
      main_(single_stream_device(device) ? c10::Stream(c10::Stream::DEFAULT, device)
                                         : c10::impl::VirtualGuardImpl(device.type()).getStream(device)),
      log_(log) {
  if (log_ != nullptr) log_->clear();
}

void StreamPlan::fork() {
  if (side_ == nullptr) return;
  log("fork", StreamRole::Side, side_->stream());
  if (!side_->has_events()) return;
  c10::Event& e = side_->event(kInputs);
  e.record(main_);
  e.block(side_->stream());
}

void StreamPlan::wait(Mark mark, const char* part) {
  if (side_ == nullptr) return;
  log(part, StreamRole::Main, main_);
  if (side_->has_events()) side_->event(mark).block(main_);
}

StreamPlan::Switch::Switch(StreamPlan& p, const c10::Stream& s)
    : p_(p), prev_(c10::impl::VirtualGuardImpl(p.device_.type()).exchangeStream(s)) {}

StreamPlan::Switch::~Switch() { c10::impl::VirtualGuardImpl(p_.device_.type()).exchangeStream(prev_); }

void StreamPlan::log(const char* part, StreamRole role, const c10::Stream& s) {
  if (log_ != nullptr) log_->push_back({part, role, s.id()});
}

}  // namespace aar::dsa::detail
