"""Graph mode for the vLLM adapter (docs/design/vllm_sparse.md §6): what the adapter declares to vLLM
and how vLLM's full-graph capture of decode runs through the runtime's capture, update and replay.

* Every adapter builder (GQA, MLA, sparse MLA and its indexer group, the DeepSeek-V4 groups) declares
  ``AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE`` (vLLM then captures full graphs of decode-only
  batches of one-token requests, FULL_DECODE_ONLY) and implements ``build_for_cudagraph_capture`` with
  the runtime builder's ``build_for_graph_capture`` (state DecodeOnly). With speculative tokens (and no
  decode context parallel) the GQA, MLA, sparse MLA / indexer and DeepSeek-V4 builders declare ``UNIFORM_BATCH``
  instead and capture requests of 1 + num_speculative_tokens tokens (state SpecDecoding).
* ``set_graph_provider("recording")`` makes the runtime's parameter store (``aar.GraphParams``) the
  adapter records into: while ``capture(n)`` is open, the impls' calls (GQA forward, the MLA
  cache write and latent decode, the sparse indexer step and sparse attention, the DeepSeek-V4 layer's
  ``Impl.forward``) are recorded into bucket ``n`` instead of run; per step ``update(n, attn_metadata)``
  refreshes the recorded calls from the step's metadata and ``replay(n)`` re-issues them (CPU).
* ``set_graph_provider("torch_npu", stream=, update_stream=, npu=)`` makes it the runtime's hooks provider
  filled from torch.npu's graph-task API (``ascend_attn_rt.npu_graph``): ``capture(n, device_graph=G)``
  launches the calls into the device graph (attention calls in task groups with their events), per step
  ``update`` (checks, waits for the previous replay, re-issues on the update stream) then ``replay(n, G)``.
  Not run on an NPU here: tested with a double of torch.npu.

The recording provider re-issues only the runtime's recorded calls: vLLM's own tensor work around
them (the MLA layer's W_UK absorption and W_UV, the indexer's projections) is what a device graph
replays and the recording provider does not. A CPU engine (and the tests) therefore capture the
adapter's entry points vLLM's layers call, with their inputs in static buffers.

vLLM's own graph wrapper (docs/design/vllm_sparse.md §6.1): ``AscendAttnRtGraphWrapper`` has the constructor and
``__call__`` contract of vLLM's ``CUDAGraphWrapper`` and drives capture / update / replay from the forward
context's FULL batch descriptor; ``install_graph_wrapper()`` makes vLLM construct it (the platform's
``get_static_graph_wrapper_cls`` and the GPU model runner's ``CUDAGraphWrapper``), ``uninstall_graph_wrapper()``
undoes that. On the recording provider it captures each adapter entry-point call into a segment of its own
(``_Tape``) and replays the segments inside an eager run of the runnable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from typing import Any, Callable, Optional

from vllm.v1.attention.backend import AttentionCGSupport

from .. import _C as aar

#: The cudagraph support every adapter builder declares to vLLM.
CUDAGRAPH_SUPPORT = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

_PROVIDERS = ("recording", "torch_npu")
_REFUSED = {
    "hooks": "the adapter builds the hooks itself from torch.npu's graph-task API: give provider 'torch_npu' "
             "(stream=, update_stream=, npu=); a C++ engine fills aar::graph::GraphHooks instead",
}

_store: Optional[object] = None


class _Device:
    """The torch_npu provider's device side: the torch.npu module (or a double), the stream a capture records on
    (None: the stream current at each captured call, the one torch.npu.graph captures on) and the update stream."""

    def __init__(self, npu, stream, update_stream):
        self.npu, self.stream, self.update_stream = npu, stream, update_stream
        self.updated: set = set()  # buckets updated since their last device replay

    def replay_stream(self):
        return self.npu.current_stream() if self.stream is None else self.stream


_device: Optional[_Device] = None

#: What the torch_npu provider calls on torch.npu (checked when it is set, so a missing piece is named there).
_NPU_API = ("ExternalEvent", "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
            "graph_task_update_end", "current_stream", "stream", "graph")


def _torch_npu_module():
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None or not hasattr(npu, "graph_task_update_begin"):
        raise RuntimeError("graph provider 'torch_npu': torch_npu is not loaded (torch.npu's graph-task API is "
                           "missing): import torch_npu first, or pass npu=")
    return npu


def set_graph_provider(provider: str = "recording", *, stream=None, update_stream=None, npu=None):
    """Makes a new parameter store (``aar.GraphParams``) of ``provider`` the one the adapter's graph
    mode records into, releasing the previous one's buckets; returns it.

    * ``"recording"`` (CPU): capture records, ``replay(n)`` re-issues the records. Takes no other argument.
    * ``"torch_npu"`` (NPU, docs/design/vllm_sparse.md §6): the runtime's hooks provider filled from torch.npu's
      graph-task API (``ascend_attn_rt.npu_graph.torch_npu_hooks``). ``stream``: the stream the device graph is
      captured on (None: the stream current at each captured call); ``update_stream``: the stream the per-step
      updates re-issue on (None: a new ``npu.Stream()``); ``npu``: ``torch.npu`` by default (torch_npu must be
      imported), a double in tests. Captures go inside a device-graph capture (``capture(n, device_graph=...)``
      or the engine's own ``torch.npu.graph``); per step ``update(n, md)`` then ``replay(n, device_graph)``.

    ``"hooks"`` raises NotImplementedError naming ``"torch_npu"``; anything else ValueError."""
    global _store, _device
    if provider in _REFUSED:
        raise NotImplementedError(f"graph provider {provider!r} is not supported by ascend_attn_rt's vLLM adapter: "
                                  f"{_REFUSED[provider]}")
    if provider not in _PROVIDERS:
        raise ValueError(f"provider={provider!r} is not one of {list(_PROVIDERS) + sorted(_REFUSED)}")
    device = None
    if provider == "recording":
        given = [name for name, v in (("stream", stream), ("update_stream", update_stream), ("npu", npu))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: arguments of the 'torch_npu' graph provider, not of 'recording'")
        new = aar.GraphParams("recording")
    else:
        from ..npu_graph import torch_npu_hooks

        npu = _torch_npu_module() if npu is None else npu
        missing = [name for name in _NPU_API + (() if update_stream is not None else ("Stream",))
                   if not hasattr(npu, name)]
        if missing:
            raise ValueError(f"npu={npu!r} lacks {missing}: the 'torch_npu' graph provider needs torch.npu's "
                             "graph-task API")
        if update_stream is None:
            update_stream = npu.Stream()  # a stream of its own, as vllm-ascend's model runner makes one
        device = _Device(npu, stream, update_stream)
        new = aar.GraphParams("hooks", **torch_npu_hooks(stream, update_stream, npu=npu))
    if _store is not None:
        _store.release_all()
    _drop_tapes(_tapes)
    _store, _device = new, device
    return _store


def clear_graph_provider() -> None:
    """Releases the store's buckets and unsets it (graph mode off)."""
    global _store, _device
    if _store is not None:
        _store.release_all()
    _drop_tapes(_tapes)
    _store, _device = None, None


def graph_params():
    """The store set by set_graph_provider (None when graph mode is off)."""
    return _store


def graph_provider() -> Optional[str]:
    """``"recording"``, ``"torch_npu"`` or None (graph mode off)."""
    if _store is None:
        return None
    return "recording" if _device is None else "torch_npu"


def _require_store():
    if _store is None:
        raise RuntimeError("no graph provider is set: call ascend_attn_rt.vllm.graph.set_graph_provider('recording') "
                           "(CPU) or set_graph_provider('torch_npu', ...) (NPU) before capturing")
    return _store


def refuse_if_capturing(what: str) -> None:
    """The capture policy (graph.md §1.1) for adapter work done in Python: refused inside a capture."""
    if _store is not None and _store.capturing:
        raise NotImplementedError(f"{what} inside a graph capture is not supported by ascend_attn_rt's vLLM adapter "
                                  "(it would not be recorded)")


@contextlib.contextmanager
def capture(num_tokens: int, device_graph=None):
    """Opens bucket ``num_tokens`` of the store on this thread: the adapter impls' calls made inside are
    recorded (graph.md §1.1). An exception inside drops the partial bucket.

    Recording provider: nothing runs; ``device_graph`` must be None. torch_npu provider: the calls are
    launched inside the device graph's capture, each attention call in a task group with its event
    (graph.md §3): with ``device_graph`` (a ``torch.npu.NPUGraph``) its capture is opened here
    (``npu.graph(device_graph)``, on ``stream`` when one was given) around the bucket; without it the
    engine's own device capture (vLLM's graph wrapper) must be open on this thread, checked through
    ``npu.is_current_stream_capturing`` where torch.npu has it."""
    g = _require_store()
    n = int(num_tokens)
    if any(t.n == n for t in _tapes):
        raise ValueError(f"bucket {n} is already captured by AscendAttnRtGraphWrapper on this graph provider")
    dev = _device
    if dev is None:
        if device_graph is not None:
            raise ValueError("device_graph: the 'recording' graph provider replays its own records, it captures no "
                             "device graph")
        with g.capture(n):
            yield n
        return
    with contextlib.ExitStack() as stack:
        if device_graph is not None:
            kw = {} if dev.stream is None else {"stream": dev.stream}
            stack.enter_context(dev.npu.graph(device_graph, **kw))
        else:
            is_capturing = getattr(dev.npu, "is_current_stream_capturing", None)
            if is_capturing is not None and not is_capturing():
                raise RuntimeError(f"capture({n}) on the 'torch_npu' graph provider outside a device-graph capture: "
                                   "pass device_graph= (a torch.npu.NPUGraph) or open torch.npu.graph first (the "
                                   "calls would run eagerly and their task groups belong to no graph)")
        dev.updated.discard(n)
        stack.enter_context(g.capture(n))
        yield n


def _step_metadata(md):
    """The runtime metadata an update refreshes calls from, or None for a metadata whose calls have
    nothing to refresh (sparse MLA: prepare calls over the builder's stable buffers, graph.md §4.3)."""
    from .sparse import AscendAttnRtSparseMlaMetadata

    if isinstance(md, AscendAttnRtSparseMlaMetadata):
        return None
    if isinstance(md, (aar.Metadata, aar.DcpMetadata, aar.mla.Metadata)):  # DcpMetadata: GQA under DCP
        return md
    raise TypeError(f"attn_metadata of type {type(md).__name__} is not an ascend_attn_rt adapter's metadata")


def update(num_tokens: int, attn_metadata) -> None:
    """Refreshes every recorded call of bucket ``num_tokens`` from the step's metadata: vLLM's per-layer
    dict (layer name -> metadata, as the forward context carries it) or one metadata. The adapter's
    impls record their calls in KV-cache group 0, so the distinct metadata with parameters must be one
    (the builders of one group give all its layers the same object); DeepSeek-V4 metadata (every group of the
    step) goes to aar.dsa.graph_update with the SWA groups' metadata in their graph order. Sparse MLA buckets have no
    per-step parameters: nothing is refreshed, but each step is checked to fill the bucket with decodes, vLLM's
    padding requests as the SFA builder's dummy decodes (call update before every replay).

    On the torch_npu provider the update comes BEFORE the step's device replay (docs/design/vllm_sparse.md §6):
    everything is checked first; then it waits for the previous replay on the replay stream (the task updates
    rewrite the graph's tasks), and re-issues each attention call between torch.npu's task-update hooks with
    ``update_stream`` current, recording its event there; the replay that follows waits on those events."""
    n = int(num_tokens)
    g = _require_store()
    tapes = [t for t in _tapes if t.n == n]
    if tapes and not g.has(n):
        # Buckets the graph wrapper captured on the recording provider (§6.1): every segment's store is refreshed.
        runs = [_update_call(n, attn_metadata, seg.store) for t in tapes for seg in t.segments]
        for run in runs:
            run()
        return
    run = _update_call(n, attn_metadata, g)
    dev = _device
    if dev is None:
        run()
        return
    dev.updated.discard(n)
    dev.replay_stream().synchronize()
    with dev.npu.stream(dev.update_stream):
        run()
    dev.updated.add(n)


def _update_call(num_tokens: int, attn_metadata, g):
    """Checks the step's metadata against the adapter's rules and returns the runtime update of store ``g`` to run
    (which checks the step against the bucket before its first hook, graph.md §1.2)."""
    from .dsa import AscendAttnRtDsaMetadata, graph_update_args
    from .sparse import AscendAttnRtSparseMlaMetadata

    if isinstance(attn_metadata, list):  # vLLM's list[dict] under speculative decoding: [0] is the base model's
        attn_metadata = attn_metadata[0] if attn_metadata else None
    items = list(attn_metadata.values()) if isinstance(attn_metadata, dict) else [attn_metadata]
    dsa = [md for md in items if isinstance(md, AscendAttnRtDsaMetadata)]
    if dsa:
        # DeepSeek-V4 (docs/design/vllm_dsa.md §6): the captured layers re-issue nothing; the update checks the
        # step fits the bucket, each layer against the SWA group it reads.
        if len(dsa) != len(items):
            raise NotImplementedError("DeepSeek-V4 metadata mixed with another backend's in one graph update is not "
                                      "supported by ascend_attn_rt's vLLM adapter")
        step, swa = graph_update_args(dsa)
        return lambda: aar.dsa.graph_update(g, num_tokens, step, swa)
    distinct = []
    for md in items:
        if isinstance(md, AscendAttnRtSparseMlaMetadata):
            # The sparse calls read the capture's token count: a step must fill the bucket with decodes, vLLM's
            # padding requests as the runtime's dummy decodes (graph decode padding, docs/design/sfa.md §3.4).
            s = md.sfa
            kernel_tokens = s.num_input_tokens if s.num_kernel_reqs > s.num_reqs else s.num_actual_tokens
            if md.num_prefills or kernel_tokens != num_tokens:
                raise ValueError(f"sparse MLA bucket {num_tokens} takes decode-only steps of {num_tokens} kernel "
                                 f"tokens (vLLM's padding included), got {md.num_decode_tokens} decode tokens, "
                                 f"{kernel_tokens} kernel tokens and {md.num_prefills} prefills")
        step = _step_metadata(md)
        if step is not None and not any(step is d for d in distinct):
            distinct.append(step)
    if len(distinct) > 1:
        raise NotImplementedError(f"{len(distinct)} distinct metadata objects with per-step parameters: graph "
                                  "mode through the adapter takes one KV-cache group")
    if distinct:
        return lambda: g.update(num_tokens, distinct[0])
    if not g.has(num_tokens):
        raise ValueError(f"num_tokens={num_tokens}: no captured graph bucket of that size")
    return lambda: None


def replay(num_tokens: int, device_graph=None) -> None:
    """Recording provider: re-issues bucket ``num_tokens``'s records (after update, for buckets with
    per-step parameters); ``device_graph`` must be None. torch_npu provider: replays ``device_graph`` (the
    ``torch.npu.NPUGraph`` captured around ``capture(num_tokens)``), which must follow an update of that
    bucket since its last replay (the graph waits on the events the update records)."""
    n = int(num_tokens)
    g = _require_store()
    dev = _device
    if dev is None:
        if device_graph is not None:
            raise ValueError("device_graph: the 'recording' graph provider replays its own records")
        if not g.has(n) and any(t.n == n for t in _tapes):
            raise ValueError(f"bucket {n} was captured by AscendAttnRtGraphWrapper on the 'recording' provider: its "
                             "segments replay inside the wrapper's run of the runnable (docs/design/vllm_sparse.md "
                             "§6.1), not through replay()")
        g.replay(n)
        return
    if device_graph is None:
        raise ValueError(f"replay({n}) on the 'torch_npu' graph provider replays the device graph: pass "
                         "device_graph= (the torch.npu.NPUGraph captured around capture(n))")
    if not g.has(n):
        raise ValueError(f"num_tokens={n}: no captured graph bucket of that size")
    if n not in dev.updated:
        raise ValueError(f"replay of bucket {n} before update: on the 'torch_npu' provider every device replay "
                         "needs the step's update first (the graph waits on the events the update records)")
    dev.updated.discard(n)
    device_graph.replay()


def uniform_query_len(vllm_config, spec_graphs: bool = True) -> int:
    """The query length of the decode requests vLLM captures (its ``uniform_decode_query_len``): 1 plus the
    speculative tokens for a family that captures speculative buckets, else 1."""
    from .dcp import num_speculative_tokens

    return 1 + num_speculative_tokens(vllm_config) if spec_graphs else 1


def check_uniform_decode(m, what: str, query_len: int = 1) -> None:
    """build_for_cudagraph_capture's batch: decode-only requests of ``query_len`` tokens each (vLLM's uniform
    decode: one token, or 1 + the speculative tokens under UNIFORM_BATCH), every request real (the bucket is
    the batch)."""
    n = m.num_reqs
    q_lens = (m.query_start_loc_cpu[1: n + 1] - m.query_start_loc_cpu[:n]).tolist()
    if any(q != query_len for q in q_lens) or m.num_actual_tokens != n * query_len:
        declared = ("uniform single-token decode batches (the declared UNIFORM_SINGLE_TOKEN_DECODE)" if query_len == 1
                    else f"uniform decode batches of {query_len}-token requests (the declared UNIFORM_BATCH with "
                         f"{query_len - 1} speculative tokens; a capture size that is not a multiple of {query_len} "
                         "gives vLLM's capture batch a shorter last request: choose cudagraph_capture_sizes as "
                         "multiples of it)")
        raise NotImplementedError(f"{what}: build_for_cudagraph_capture takes {declared}, got query lengths "
                                  f"{q_lens} for num_actual_tokens={m.num_actual_tokens}")
    _require_store()


class GraphBuilderMixin:
    """build_for_cudagraph_capture and the declared support of the adapter's builders (see the module
    docstring). The builder defines ``_graph_build(common_attn_metadata)``, which builds the runtime's capture
    step in state ``self._graph_state()``."""

    _cudagraph_support = CUDAGRAPH_SUPPORT
    #: Whether the family's runtime capture takes speculative decode buckets through the adapter (then, with
    #: speculative tokens in vLLM's config and no decode context parallel, the builder declares UNIFORM_BATCH).
    _spec_graphs: bool = False

    @classmethod
    def _spec_buckets(cls, vllm_config) -> bool:
        from .dcp import num_speculative_tokens

        pc = vllm_config.parallel_config
        return (cls._spec_graphs and num_speculative_tokens(vllm_config) > 0
                and getattr(pc, "decode_context_parallel_size", 1) == 1)

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
        if cls._spec_buckets(vllm_config):
            return AttentionCGSupport.UNIFORM_BATCH
        return CUDAGRAPH_SUPPORT

    def _graph_query_len(self) -> int:
        return uniform_query_len(self.vllm_config, type(self)._spec_buckets(self.vllm_config))

    def _graph_state(self):
        return aar.AttentionState.SpecDecoding if self._graph_query_len() > 1 else aar.AttentionState.DecodeOnly

    def build_for_cudagraph_capture(self, common_attn_metadata):
        check_uniform_decode(common_attn_metadata, type(self).__name__, self._graph_query_len())
        return self._graph_build(common_attn_metadata)


# --- vLLM's graph wrapper (docs/design/vllm_sparse.md §6.1)

class _Segment:
    """One adapter entry-point call captured by the graph wrapper on the recording provider: its own store (one
    bucket), the static copies of the call's activations the recorded calls read and write, and the call's result."""

    __slots__ = ("kind", "store", "statics", "outputs", "result", "fixed")

    def __init__(self, kind, store, statics, outputs, result, fixed):
        self.kind, self.store, self.statics, self.outputs, self.result, self.fixed = \
            kind, store, statics, outputs, result, fixed


class _Tape:
    """The recording provider's capture of one FULL decode bucket by AscendAttnRtGraphWrapper: the segments in call
    order. ``mode``: "capture" while the wrapper's capture runs the runnable, "replay" while a replay runs it."""

    def __init__(self, n: int):
        self.n = n
        self.segments: list = []
        self.mode: Optional[str] = None
        self.cursor = 0
        self.recording = None  # the segment store a capture records into while the entry point's call runs

    def run(self, kind: str, call: Callable, inputs: dict, outputs: dict, fixed: tuple):
        live = {**inputs, **outputs}
        if self.mode == "capture":
            # The call on static copies of its activations, recorded into a bucket of its own (nothing runs, as in a
            # device-graph capture).
            statics = {k: None if t is None else t.clone() for k, t in live.items()}
            store = aar.GraphParams("recording")
            self.recording = store
            try:
                with store.capture(self.n):
                    result = call(**statics)
            finally:
                self.recording = None
            seg = _Segment(kind, store, statics, tuple(outputs), result, tuple(fixed))
            self.segments.append(seg)
        else:
            if self.cursor >= len(self.segments):
                raise RuntimeError(f"the runnable made more adapter calls ({kind}) than at the capture of bucket "
                                   f"{self.n} ({len(self.segments)}): a replay must repeat the captured forward")
            seg = self.segments[self.cursor]
            self.cursor += 1
            if seg.kind != kind or list(seg.statics) != list(live):
                raise RuntimeError(f"adapter call {self.cursor - 1} of bucket {self.n} is {kind}, the capture's was "
                                   f"{seg.kind}: a replay must repeat the captured forward")
            for t, c in zip(fixed, seg.fixed):
                if t is not c and (t.data_ptr(), tuple(t.shape)) != (c.data_ptr(), tuple(c.shape)):
                    raise ValueError(f"{kind}: the KV cache is not the one captured in bucket {self.n} (a captured "
                                     "graph keeps its buffers)")
            for k, t in live.items():
                st = seg.statics[k]
                if (t is None) != (st is None) or (t is not None and t.shape != st.shape):
                    raise ValueError(f"{kind}: {k} of shape {None if t is None else tuple(t.shape)}, the capture of "
                                     f"bucket {self.n} took {None if st is None else tuple(st.shape)}")
            for k in inputs:
                if inputs[k] is not None:
                    seg.statics[k].copy_(inputs[k])
            seg.store.replay(self.n)
            result = seg.result
        for k in seg.outputs:
            if live[k] is not None:
                live[k].copy_(seg.statics[k])
        return result


_tls = threading.local()  # the tape the graph wrapper runs on this thread
_tapes: list = []  # the wrapper's recording-provider buckets (cleared with the provider)


def in_wrapper_run() -> bool:
    """True while AscendAttnRtGraphWrapper runs the runnable on the recording provider on this thread: the adapter's
    entry points then go through ``run_segment``; otherwise they call the runtime directly (no per-call cost)."""
    return getattr(_tls, "tape", None) is not None


def run_segment(kind: str, call: Callable, inputs: dict, outputs: Optional[dict] = None, fixed: tuple = ()):
    """An adapter entry point's runtime call: ``call(**inputs, **outputs)`` (``outputs``: tensors it writes in place;
    ``fixed``: persistent buffers it reads, the KV caches). Outside the graph wrapper's recording-provider run it is
    just the call; inside it the call is captured into / replayed from the bucket's segment (§6.1)."""
    outputs = outputs or {}
    tape = getattr(_tls, "tape", None)
    if tape is None:
        return call(**inputs, **outputs)
    return tape.run(kind, call, inputs, outputs, fixed)


def capturing_store():
    """The store this thread's adapter calls are recorded into right now: the provider's store inside ``capture``, or
    the segment's own store while AscendAttnRtGraphWrapper captures an entry point on the recording provider (§6.1);
    None when nothing captures. (What a layer holding captured state checks before it changes, e.g. the DeepSeek-V4
    layer's Impl.)"""
    tape = getattr(_tls, "tape", None)
    if tape is not None and tape.recording is not None:
        return tape.recording
    return _store if _store is not None and _store.capturing else None


def _drop_tapes(tapes) -> None:
    """Forgets the wrapper's recording-provider buckets ``tapes``, releasing their segments' stores (so a layer that
    checks its captured store, capturing_store, sees no bucket left)."""
    for t in list(tapes):
        for seg in t.segments:
            seg.store.release_all()
        if t in _tapes:
            _tapes.remove(t)


@contextlib.contextmanager
def _on_tape(tape: _Tape, mode: str):
    if getattr(_tls, "tape", None) is not None:
        raise RuntimeError("an AscendAttnRtGraphWrapper run is already open on this thread")
    tape.mode, tape.cursor, _tls.tape = mode, 0, tape
    try:
        yield tape
    finally:
        _tls.tape, tape.mode = None, None


def _vllm_wrapper_base():
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    # The class itself even when install_graph_wrapper has put this adapter's wrapper in its module's place.
    return getattr(CUDAGraphWrapper, "_aar_base", CUDAGraphWrapper)


@dataclasses.dataclass
class _Entry:
    batch_descriptor: Any
    store: Any  # the provider's store the bucket was captured on
    graph: Any = None  # the torch.npu graph, or the recording provider's _Tape
    output: Any = None
    input_addresses: Optional[list] = None


def _tensor_addresses(args, kwargs) -> list:
    import torch

    return [x.data_ptr() for x in list(args) + list(kwargs.values()) if isinstance(x, torch.Tensor)]


def _make_wrapper_cls():
    import torch  # noqa: F401  (vLLM's wrapper module imports it too)
    from vllm.compilation.cuda_graph import CUDAGraphOptions
    from vllm.compilation.monitor import validate_cudagraph_capturing_enabled
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context, is_forward_context_available

    base = _vllm_wrapper_base()

    class AscendAttnRtGraphWrapper(base):
        """vLLM's static graph wrapper over the adapter's graph mode (docs/design/vllm_sparse.md §6.1): same
        constructor and ``__call__`` contract as vLLM's CUDAGraphWrapper. A FULL batch descriptor of a uniform decode
        batch captures bucket ``batch_descriptor.num_tokens`` on first sight and afterwards, per call, runs
        ``update(n, forward_context.attn_metadata)`` and then the replay; NONE or another runtime mode than the
        wrapper's runs the runnable (vLLM's dispatch). A PIECEWISE wrapper and a FULL descriptor of a non-uniform
        batch are refused by name (the adapter honours FULL_DECODE_ONLY)."""

        def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None):
            # Not base.__init__: it takes the platform's CUDA graph pool, which no provider here uses.
            if runtime_mode != CUDAGraphMode.FULL:
                raise NotImplementedError(
                    f"runtime_mode={getattr(runtime_mode, 'name', runtime_mode)}: ascend_attn_rt's graph wrapper "
                    "captures FULL graphs of decode batches only (cudagraph_mode FULL_DECODE_ONLY); piecewise graphs "
                    "are not supported by ascend_attn_rt's vLLM adapter")
            self.runnable = runnable
            self.vllm_config = vllm_config
            self.runtime_mode = runtime_mode
            self.compilation_config = vllm_config.compilation_config
            self.first_run_finished = False
            self.is_debugging_mode = False
            self._runnable_str = None
            self.graph_pool = None
            self.cudagraph_options = cudagraph_options or CUDAGraphOptions()
            self.concrete_cudagraph_entries = {}
            base._all_instances.add(self)

        _aar_base = base

        def clear_graphs(self) -> None:
            """Drops the captured buckets (the provider's buckets released, the recording provider's segments
            dropped)."""
            for e in self.concrete_cudagraph_entries.values():
                if isinstance(e.graph, _Tape):
                    _drop_tapes([e.graph])
                elif e.store is _store and _store is not None and _store.has(e.batch_descriptor.num_tokens):
                    _store.release(e.batch_descriptor.num_tokens)
            self.concrete_cudagraph_entries.clear()

        def __call__(self, *args, **kwargs):
            if not is_forward_context_available():
                return self.runnable(*args, **kwargs)
            ctx = get_forward_context()
            mode, desc = ctx.cudagraph_runtime_mode, ctx.batch_descriptor
            if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
                return self.runnable(*args, **kwargs)
            if desc is None or not desc.uniform:
                raise NotImplementedError(
                    f"cudagraph_runtime_mode=FULL with batch_descriptor={desc}: ascend_attn_rt's graph wrapper "
                    "captures FULL graphs of uniform decode batches only (cudagraph_mode FULL_DECODE_ONLY)")
            store = _require_store()
            entry = self.concrete_cudagraph_entries.get(desc)
            if entry is not None and entry.store is not store:
                raise RuntimeError(f"bucket {desc.num_tokens} was captured on another graph provider's store: "
                                   "clear_graphs() and capture again")
            if entry is None:
                return self._capture(desc, store, args, kwargs)
            return self._replay(entry, ctx, args, kwargs)

        def _capture(self, desc, store, args, kwargs):
            validate_cudagraph_capturing_enabled()
            n = int(desc.num_tokens)
            entry = _Entry(desc, store, input_addresses=_tensor_addresses(args, kwargs))
            dev = _device
            if dev is None:
                # Recording provider: each adapter call of the runnable captured into a segment of its own.
                if store.has(n) or any(t.n == n for t in _tapes):
                    raise ValueError(f"bucket {n} is already captured on this graph provider (one wrapped runnable "
                                     "per bucket size)")
                tape = _Tape(n)
                with _on_tape(tape, "capture"):
                    output = self.runnable(*args, **kwargs)
                entry.graph = tape
                _tapes.append(tape)
            else:
                # torch_npu provider: the whole runnable inside one device-graph capture.
                graph = dev.npu.NPUGraph()
                with capture(n, device_graph=graph):
                    output = self.runnable(*args, **kwargs)
                entry.graph = graph
            entry.output = output
            self.concrete_cudagraph_entries[desc] = entry
            return output

        def _replay(self, entry, ctx, args, kwargs):
            n = int(entry.batch_descriptor.num_tokens)
            if ctx.attn_metadata is None:
                raise ValueError(f"a FULL replay of bucket {n} without attention metadata in the forward context")
            if isinstance(entry.graph, _Tape):
                update(n, ctx.attn_metadata)
                with _on_tape(entry.graph, "replay") as tape:
                    output = self.runnable(*args, **kwargs)
                    if tape.cursor != len(tape.segments):
                        raise RuntimeError(f"the runnable made {tape.cursor} adapter calls, the capture of bucket {n} "
                                           f"{len(tape.segments)}: a replay must repeat the captured forward")
                return output
            addresses = _tensor_addresses(args, kwargs)
            if addresses != entry.input_addresses:
                raise ValueError(f"bucket {n}: the runnable's input tensors are not at the captured addresses (the "
                                 "device graph reads the captured buffers)")
            update(n, ctx.attn_metadata)
            replay(n, entry.graph)
            return entry.output

    return AscendAttnRtGraphWrapper


_WRAPPER_CLS = None


def __getattr__(name):  # the wrapper class is made on first use (it subclasses vLLM's)
    global _WRAPPER_CLS
    if name == "AscendAttnRtGraphWrapper":
        if _WRAPPER_CLS is None:
            _WRAPPER_CLS = _make_wrapper_cls()
        return _WRAPPER_CLS
    raise AttributeError(name)


WRAPPER_QUALNAME = "ascend_attn_rt.vllm.graph.AscendAttnRtGraphWrapper"
_installed: Optional[list] = None  # (object, attribute, previous value or _ABSENT) in patch order
_ABSENT = object()


def install_graph_wrapper() -> list:
    """Makes vLLM construct AscendAttnRtGraphWrapper where it builds its static graph wrapper (§6.1); returns the
    patched names. Patched: the current platform's ``get_static_graph_wrapper_cls`` (an attribute of the platform
    object returning WRAPPER_QUALNAME: what vLLM's compile backends and any runner resolving the wrapper through the
    platform build), ``vllm.compilation.cuda_graph.CUDAGraphWrapper`` (what modules importing it later get) and,
    when it is imported, ``vllm.v1.worker.gpu_model_runner.CUDAGraphWrapper`` (what vLLM's GPU model runner wraps
    the model with for FULL graphs). ``uninstall_graph_wrapper()`` restores them. Idempotent."""
    global _installed
    if _installed is not None:
        return [f"{getattr(o, '__name__', type(o).__name__)}.{a}" for o, a, _ in _installed]
    import vllm.compilation.cuda_graph as cg
    from vllm.platforms import current_platform

    cls = __getattr__("AscendAttnRtGraphWrapper")
    targets = [(current_platform, "get_static_graph_wrapper_cls", lambda: WRAPPER_QUALNAME), (cg, "CUDAGraphWrapper",
                                                                                               cls)]
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    if runner is not None:
        targets.append((runner, "CUDAGraphWrapper", cls))
    done = []
    for obj, attr, value in targets:
        prev = obj.__dict__.get(attr, _ABSENT) if not isinstance(obj, type(cg)) else getattr(obj, attr)
        setattr(obj, attr, value)
        done.append((obj, attr, prev))
    _installed = done
    return [f"{getattr(o, '__name__', type(o).__name__)}.{a}" for o, a, _ in done]


def uninstall_graph_wrapper() -> None:
    """Undoes install_graph_wrapper (a no-op when it is not installed)."""
    global _installed
    if _installed is None:
        return
    for obj, attr, prev in reversed(_installed):
        if prev is _ABSENT:
            delattr(obj, attr)
        else:
            setattr(obj, attr, prev)
    _installed = None
