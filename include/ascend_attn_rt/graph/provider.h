// Graph providers: the device side of full-graph mode behind one small interface.
//
// In full-graph mode the fused-attention and paged-attention kernels take their
// sequence lengths as host lists, baked into the captured task. Before each
// replay every captured attention call is re-issued with the step's lists inside
// a task-update bracket (docs/design/graph.md §1.1, §1.2). The provider supplies that
// bracket and the per-call events the replay waits on:
//   HookGraphProvider      : NPU. Function hooks that the Python facade fills from
//                            torch_npu (graph_task_group_begin/end,
//                            graph_task_update_begin/end, ExternalEvent) and a C++
//                            engine fills from its own link. Nothing here needs
//                            torch_npu to build.
//   RecordingGraphProvider : CPU. Capture records the calls without running them;
//                            replay() re-issues the recorded calls in order.
// A captured host callback (graph/captured_call.h HostCallbackCall) is launched
// on the NPU through launch_host_func (torch_npu: npu._launch_host_func) and run
// in order by the CPU replay (docs/design/graph.md §1.5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

namespace aar::graph {

using Handle = void*;  // opaque: an event or a task-group handle

class GraphProvider {
 public:
  virtual ~GraphProvider() = default;
  virtual const char* name() const = 0;
  // Capture, per attention call: an event the replay waits on (then resets),
  // and a task-group bracket around the kernel launch.
  virtual Handle create_event() = 0;
  virtual void event_wait_and_reset(Handle event) = 0;
  virtual void task_group_begin() = 0;
  virtual Handle task_group_end() = 0;
  // Update, per attention call: re-issue the kernel between these, then record
  // the call's event so the replay may proceed past it.
  virtual void task_update_begin(Handle task) = 0;
  virtual void task_update_end() = 0;
  virtual void event_record(Handle event) = 0;
  virtual void release(Handle event, Handle task) = 0;
  // True when the runtime must run the recorded calls itself at replay (CPU);
  // false when the device graph replays them (NPU).
  virtual bool replays_recorded_calls() const = 0;
  // Capture (device graphs only): launches fn(arg) as a host function on the
  // stream being captured, so that every replay of the graph runs it in stream
  // order. `arg` lives until the bucket is released. The default refuses
  // (NotSupported naming the provider).
  virtual void launch_host_func(void (*fn)(void*), void* arg);
  // Whether a capture may record a host callback (CPU: run at replay; device:
  // launch_host_func works). Backends ask before recording anything.
  virtual bool supports_host_callbacks() const { return replays_recorded_calls(); }
};

// Hooks as plain callables: a C++ engine binds them to torch_npu's C++ API
// (c10_npu::graph_task_group_begin ...), the Python facade to torch_npu's Python
// functions. An unset hook is a no-op (benchmarks time the runtime's own work
// with all hooks unset).
struct GraphHooks {
  std::function<Handle()> create_event;
  std::function<void(Handle)> event_wait_and_reset;
  std::function<void()> task_group_begin;
  std::function<Handle()> task_group_end;
  std::function<void(Handle)> task_update_begin;
  std::function<void()> task_update_end;
  std::function<void(Handle)> event_record;
  std::function<void(Handle, Handle)> release;
  // Unlike the others, an unset launch_host_func is not a no-op: a capture that
  // records a host callback is refused (its work would silently not run).
  std::function<void(void (*)(void*), void*)> launch_host_func;
};

class HookGraphProvider final : public GraphProvider {
 public:
  explicit HookGraphProvider(GraphHooks hooks) : h_(std::move(hooks)) {}
  const char* name() const override { return "hooks"; }
  Handle create_event() override { return h_.create_event ? h_.create_event() : nullptr; }
  void event_wait_and_reset(Handle e) override {
    if (h_.event_wait_and_reset) h_.event_wait_and_reset(e);
  }
  void task_group_begin() override {
    if (h_.task_group_begin) h_.task_group_begin();
  }
  Handle task_group_end() override { return h_.task_group_end ? h_.task_group_end() : nullptr; }
  void task_update_begin(Handle t) override {
    if (h_.task_update_begin) h_.task_update_begin(t);
  }
  void task_update_end() override {
    if (h_.task_update_end) h_.task_update_end();
  }
  void event_record(Handle e) override {
    if (h_.event_record) h_.event_record(e);
  }
  void release(Handle e, Handle t) override {
    if (h_.release) h_.release(e, t);
  }
  bool replays_recorded_calls() const override { return false; }
  void launch_host_func(void (*fn)(void*), void* arg) override;
  bool supports_host_callbacks() const override { return static_cast<bool>(h_.launch_host_func); }

 private:
  GraphHooks h_;
};

// CPU: events are flags ("recorded since the last replay"), tasks are indices.
// replay() refuses to run a call whose event was not recorded by an update,
// which is what the NPU replay would block on.
//
// Deferred host callbacks (a test mode, off by default; docs/design/graph.md §1.6):
// the provider then models the device stream the host callbacks wait on. A replay
// runs its calls at once up to its first host callback; that callback and every
// call after it are queued (on a device they run when the stream reaches them, after
// the host has moved on), and while anything is queued a whole replay is queued
// behind it. run_deferred() runs the queue in order: a test can replay step n, build
// and update step n+1, then let step n's callbacks run.
//
// Thread safety: that of the GraphParams it serves (one thread at a time).
class RecordingGraphProvider final : public GraphProvider {
 public:
  const char* name() const override { return "recording"; }
  Handle create_event() override;
  void event_wait_and_reset(Handle e) override;
  void task_group_begin() override;
  Handle task_group_end() override;
  void task_update_begin(Handle t) override;
  void task_update_end() override;
  void event_record(Handle e) override;
  void release(Handle e, Handle t) override;
  bool replays_recorded_calls() const override { return true; }

  bool event_recorded(Handle e) const;
  void reset_event(Handle e);
  // Task handles in the order their updates began, since the last clear.
  const std::vector<intptr_t>& update_log() const { return update_log_; }
  void clear_update_log() { update_log_.clear(); }
  int64_t live_events() const { return live_events_; }

  void set_defer_host_callbacks(bool on) { defer_ = on; }
  bool defers_host_callbacks() const { return defer_; }
  // Queues `work` (GraphParams::replay in the deferred mode).
  void defer(std::function<void()> work) { queue_.push_back(std::move(work)); }
  size_t deferred() const { return queue_.size(); }
  // Runs the queued work in order and returns how many ran. A failing entry is dropped
  // and its error propagates; the entries after it stay queued.
  int64_t run_deferred();
  // Drops the queued work without running it.
  void drop_deferred() { queue_.clear(); }

 private:
  bool defer_ = false;
  std::deque<std::function<void()>> queue_;
  std::vector<uint8_t> recorded_;  // by event id - 1
  std::vector<intptr_t> update_log_;
  intptr_t next_task_ = 1;
  bool in_group_ = false, in_update_ = false;
  int64_t live_events_ = 0;
};

}  // namespace aar::graph
