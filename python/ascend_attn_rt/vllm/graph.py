"""Graph mode for the vLLM adapter (docs/design/vllm_sparse.md §6): what the adapter declares to vLLM
and how vLLM's full-graph capture of decode runs through the runtime's capture, update and replay.

* Every adapter builder (GQA, MLA, sparse MLA and its indexer group, the DeepSeek-V4 groups) declares
  ``AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE`` (vLLM then captures full graphs of decode-only
  batches of one-token requests, FULL_DECODE_ONLY) and implements ``build_for_cudagraph_capture`` with
  the runtime builder's ``build_for_graph_capture`` (state DecodeOnly).
* ``set_graph_provider("recording")`` makes the runtime's parameter store (``aar.GraphParams``) the
  adapter records into: while ``capture(n)`` is open, the impls' calls (GQA forward, the MLA
  cache write and latent decode, the sparse indexer step and sparse attention, the DeepSeek-V4 layer's
  ``Impl.forward``) are recorded into
  bucket ``n`` instead of run; per step ``update(n, attn_metadata)`` refreshes the recorded calls from
  the step's metadata and ``replay(n)`` re-issues them (the recording provider's replay, on CPU).
* The NPU provider (torch_npu's graph-task hooks, ``ascend_attn_rt.npu_graph``) is refused by name
  here: there is no NPU to capture on, and the adapter's wiring of vLLM's NPU graph wrapper to those
  hooks is not written.

The recording provider re-issues only the runtime's recorded calls: vLLM's own tensor work around
them (the MLA layer's W_UK absorption and W_UV, the indexer's projections) is what a device graph
replays and the recording provider does not. A CPU engine (and the tests) therefore capture the
adapter's entry points vLLM's layers call, with their inputs in static buffers.
"""

from __future__ import annotations

import contextlib
from typing import Optional

from vllm.v1.attention.backend import AttentionCGSupport

from .. import _C as aar

#: The cudagraph support every adapter builder declares to vLLM.
CUDAGRAPH_SUPPORT = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

_PROVIDERS = ("recording",)
_REFUSED = {
    "hooks": "the NPU provider (torch_npu's graph-task hooks) needs an NPU and vLLM's NPU graph wrapper, "
             "neither of which the adapter drives here",
    "torch_npu": "torch_npu's graph capture needs an NPU and vLLM's NPU graph wrapper, neither of which the "
                 "adapter drives here",
}

_store: Optional[object] = None


def set_graph_provider(provider: str = "recording"):
    """Makes a new parameter store (``aar.GraphParams``) of ``provider`` the one the adapter's graph
    mode records into, releasing the previous one's buckets; returns it. Only ``"recording"`` (the CPU
    provider: capture records, ``replay`` re-issues) is supported; ``"hooks"`` / ``"torch_npu"`` raise
    NotImplementedError naming why, anything else ValueError."""
    global _store
    if provider in _REFUSED:
        raise NotImplementedError(f"graph provider {provider!r} is not supported by ascend_attn_rt's vLLM adapter: "
                                  f"{_REFUSED[provider]}")
    if provider not in _PROVIDERS:
        raise ValueError(f"provider={provider!r} is not one of {list(_PROVIDERS) + sorted(_REFUSED)}")
    if _store is not None:
        _store.release_all()
    _store = aar.GraphParams(provider)
    return _store


def clear_graph_provider() -> None:
    """Releases the store's buckets and unsets it (graph mode off)."""
    global _store
    if _store is not None:
        _store.release_all()
    _store = None


def graph_params():
    """The store set by set_graph_provider (None when graph mode is off)."""
    return _store


def _require_store():
    if _store is None:
        raise RuntimeError("no graph provider is set: call ascend_attn_rt.vllm.graph.set_graph_provider('recording') "
                           "before capturing")
    return _store


def refuse_if_capturing(what: str) -> None:
    """The capture policy (graph.md §1.1) for adapter work done in Python: refused inside a capture."""
    if _store is not None and _store.capturing:
        raise NotImplementedError(f"{what} inside a graph capture is not supported by ascend_attn_rt's vLLM adapter "
                                  "(it would not be recorded)")


@contextlib.contextmanager
def capture(num_tokens: int):
    """Opens bucket ``num_tokens`` of the store on this thread: the adapter impls' calls made inside are
    recorded, not run (graph.md §1.1). An exception inside drops the partial bucket."""
    with _require_store().capture(int(num_tokens)):
        yield int(num_tokens)


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
    per-step parameters: nothing is refreshed, but each step is checked to fill the bucket with decodes
    (call update before every replay)."""
    from .dsa import AscendAttnRtDsaMetadata, graph_update_args
    from .sparse import AscendAttnRtSparseMlaMetadata

    g = _require_store()
    items = list(attn_metadata.values()) if isinstance(attn_metadata, dict) else [attn_metadata]
    dsa = [md for md in items if isinstance(md, AscendAttnRtDsaMetadata)]
    if dsa:
        # DeepSeek-V4 (docs/design/vllm_dsa.md §6): the captured layers re-issue nothing; the update checks the
        # step fits the bucket, each layer against the SWA group it reads.
        if len(dsa) != len(items):
            raise NotImplementedError("DeepSeek-V4 metadata mixed with another backend's in one graph update is not "
                                      "supported by ascend_attn_rt's vLLM adapter")
        step, swa = graph_update_args(dsa)
        aar.dsa.graph_update(g, int(num_tokens), step, swa)
        return
    distinct = []
    for md in items:
        if isinstance(md, AscendAttnRtSparseMlaMetadata) and (md.num_prefills or md.num_decode_tokens != num_tokens):
            # The sparse calls read the capture's token count: a step must fill the bucket with decodes.
            raise ValueError(f"sparse MLA bucket {num_tokens} takes steps of {num_tokens} decode tokens, got "
                             f"{md.num_decode_tokens} decode tokens and {md.num_prefills} prefills (a padded step "
                             "is not supported through the adapter)")
        step = _step_metadata(md)
        if step is not None and not any(step is d for d in distinct):
            distinct.append(step)
    if len(distinct) > 1:
        raise NotImplementedError(f"{len(distinct)} distinct metadata objects with per-step parameters: graph "
                                  "mode through the adapter takes one KV-cache group")
    if distinct:
        g.update(int(num_tokens), distinct[0])


def replay(num_tokens: int) -> None:
    """The recording provider's replay of bucket ``num_tokens`` (after update, for buckets with
    per-step parameters)."""
    _require_store().replay(int(num_tokens))


def check_uniform_decode(m, what: str) -> None:
    """build_for_cudagraph_capture's batch: decode-only one-token requests (vLLM's uniform decode),
    every request real (the bucket is the batch)."""
    n = m.num_reqs
    q_lens = (m.query_start_loc_cpu[1: n + 1] - m.query_start_loc_cpu[:n]).tolist()
    if any(q != 1 for q in q_lens) or m.num_actual_tokens != n:
        raise NotImplementedError(f"{what}: build_for_cudagraph_capture takes uniform single-token decode batches "
                                  f"(the declared UNIFORM_SINGLE_TOKEN_DECODE), got query lengths {q_lens} for "
                                  f"num_actual_tokens={m.num_actual_tokens}")
    _require_store()


class GraphBuilderMixin:
    """build_for_cudagraph_capture and the declared support of the adapter's builders (see the module
    docstring). The builder defines ``_graph_build(common_attn_metadata)``."""

    _cudagraph_support = CUDAGRAPH_SUPPORT

    def build_for_cudagraph_capture(self, common_attn_metadata):
        check_uniform_decode(common_attn_metadata, type(self).__name__)
        return self._graph_build(common_attn_metadata)
