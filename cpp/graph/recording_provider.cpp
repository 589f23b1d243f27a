#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/provider.h"

namespace aar::graph {

void GraphProvider::launch_host_func(void (*)(void*), void*) {
  throw_not_supported("the '", name(), "' graph provider cannot launch host functions: a captured host callback "
                      "(the SFA KV offload's resident-slot step, docs/design/graph.md §1.5) needs a device graph "
                      "provider with launch_host_func");
}

void HookGraphProvider::launch_host_func(void (*fn)(void*), void* arg) {
  if (!h_.launch_host_func) {
    throw_not_supported("the graph hooks have no launch_host_func: a captured host callback (the SFA KV offload's "
                        "resident-slot step, docs/design/graph.md §1.5) runs at every replay only through it "
                        "(torch_npu: npu._launch_host_func on the captured stream); an unset hook would skip it");
  }
  h_.launch_host_func(fn, arg);
}

namespace {
intptr_t id_of(Handle h) { return reinterpret_cast<intptr_t>(h); }
}  // namespace

Handle RecordingGraphProvider::create_event() {
  recorded_.push_back(0);
  ++live_events_;
  return reinterpret_cast<Handle>(static_cast<intptr_t>(recorded_.size()));
}

void RecordingGraphProvider::event_wait_and_reset(Handle e) { reset_event(e); }

void RecordingGraphProvider::task_group_begin() {
  if (in_group_) throw std::logic_error("task_group_begin: a task group is already open");
  in_group_ = true;
}

Handle RecordingGraphProvider::task_group_end() {
  if (!in_group_) throw std::logic_error("task_group_end: no task group is open");
  in_group_ = false;
  return reinterpret_cast<Handle>(next_task_++);
}

void RecordingGraphProvider::task_update_begin(Handle t) {
  if (in_update_) throw std::logic_error("task_update_begin: an update is already open");
  in_update_ = true;
  update_log_.push_back(id_of(t));
}

void RecordingGraphProvider::task_update_end() {
  if (!in_update_) throw std::logic_error("task_update_end: no update is open");
  in_update_ = false;
}

void RecordingGraphProvider::event_record(Handle e) {
  const intptr_t i = id_of(e);
  if (i < 1 || i > static_cast<intptr_t>(recorded_.size())) throw std::logic_error("event_record: unknown event");
  recorded_[i - 1] = 1;
}

void RecordingGraphProvider::release(Handle e, Handle) {
  if (e != nullptr) --live_events_;
}

bool RecordingGraphProvider::event_recorded(Handle e) const {
  const intptr_t i = id_of(e);
  return i >= 1 && i <= static_cast<intptr_t>(recorded_.size()) && recorded_[i - 1] != 0;
}

int64_t RecordingGraphProvider::run_deferred() {
  int64_t ran = 0;
  while (!queue_.empty()) {
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    work();
    ++ran;
  }
  return ran;
}

void RecordingGraphProvider::reset_event(Handle e) {
  const intptr_t i = id_of(e);
  if (i >= 1 && i <= static_cast<intptr_t>(recorded_.size())) recorded_[i - 1] = 0;
}

}  // namespace aar::graph
