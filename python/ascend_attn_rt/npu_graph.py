"""Graph hooks from torch_npu: what ``aar.GraphParams("hooks", **hooks)`` needs on an NPU.

The runtime's graph layer calls these around every captured attention call (docs/design/graph.md §1.1) and
every per-step update (docs/design/graph.md §1.2):

* capture: ``event = torch.npu.ExternalEvent()``; ``event.wait(stream)``; ``event.reset(stream)``;
  ``torch.npu.graph_task_group_begin(stream)``; launch; ``handle = torch.npu.graph_task_group_end(stream)``
* update:  ``torch.npu.graph_task_update_begin(update_stream, handle)``; re-issue;
  ``torch.npu.graph_task_update_end(update_stream)``; ``event.record(update_stream)``
* a captured host callback (the SFA KV offload's resident-slot step, docs/design/graph.md §1.5):
  ``torch_npu.npu._launch_host_func(stream, fn, None)`` at capture; the graph runs it at every replay.
  torch_npu runs launched host functions on a thread subscribed to the stream: call
  ``torch_npu.npu._subscribe_report(stream)`` before the capture (not done here: once per stream).

Usage on an NPU (not exercised on hardware in this repository)::

    import torch_npu, ascend_attn_rt as aar
    from ascend_attn_rt.npu_graph import torch_npu_hooks
    g = aar.GraphParams("hooks", **torch_npu_hooks(capture_stream, update_stream))

A C++ engine fills ``aar::graph::GraphHooks`` from its own link to torch_npu instead.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional


def torch_npu_hooks(stream: Any, update_stream: Any, npu: Optional[Any] = None) -> Dict[str, Callable]:
    """The eight hook callables for ``aar.GraphParams("hooks", ...)``.

    ``stream``: the stream being captured, or None for the stream current at each captured call
    (``npu.current_stream()``: the one ``torch.npu.graph`` captures on, which is what vllm-ascend's attention
    takes); ``update_stream``: the stream the per-step updates run on (the re-issued operators must run on it
    too: enter ``npu.stream(update_stream)`` around the update, as ``ascend_attn_rt.vllm.graph`` does).
    ``npu`` defaults to ``torch.npu`` (torch_npu must be imported); tests pass a double.
    """
    if npu is None:
        import torch

        npu = getattr(torch, "npu", None)
        if npu is None or not hasattr(npu, "graph_task_update_begin"):
            raise RuntimeError("torch_npu is not loaded: import torch_npu first (torch.npu graph-task API missing)")

    def captured():
        return npu.current_stream() if stream is None else stream

    def event_wait_and_reset(event):
        s = captured()
        event.wait(s)
        event.reset(s)

    return dict(
        create_event=npu.ExternalEvent,
        event_wait_and_reset=event_wait_and_reset,
        task_group_begin=lambda: npu.graph_task_group_begin(captured()),
        task_group_end=lambda: npu.graph_task_group_end(captured()),
        task_update_begin=lambda handle: npu.graph_task_update_begin(update_stream, handle),
        task_update_end=lambda: npu.graph_task_update_end(update_stream),
        event_record=lambda event: event.record(update_stream),
        # torch_npu calls fn(args); the runtime's callback takes none.
        launch_host_func=lambda run: npu._launch_host_func(captured(), lambda _args: run(), None),
    )
