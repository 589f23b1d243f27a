"""Decode context parallel (DCP) through the vLLM adapter, GQA and MLA (docs/design/vllm_sparse.md §7) and the
sparse MLA backend with its indexer (§8, ``ascend_attn_rt.vllm.sparse``: the same set-up and Comm).

What the adapter reads from vLLM:

* ``parallel_config.decode_context_parallel_size`` (W) and ``cp_kv_cache_interleave_size`` (I;
  vLLM copies ``dcp_kv_cache_interleave_size`` into it when that one is set);
* vLLM's DCP group (``vllm.distributed.parallel_state.get_dcp_group()``): its ``world_size`` (must
  be W), ``rank_in_group`` (the builder's DCP rank) and ``device_group`` (the c10d ProcessGroup the
  runtime's ``aar.cp.Comm`` runs its collectives over; one Comm per group and process, shared by
  every layer, so the layers share one DCP workspace).

The runtime's DCP impls merge the partials themselves (query-head gather, local attention over the
rank's shard, LSE exchange and merge inside ``forward``): vLLM must not gather or merge again. GQA's
``Attention`` layer leaves DCP to the impl anyway; MLA's ``MLAAttention.forward_impl`` gathers the
decode query and merges the returned LSE when ``impl.dcp_world_size > 1``, so the MLA impl shows the
layer ``dcp_world_size = 1`` (its real group size stays in ``runtime_dcp_world_size``). Graph mode
(decode buckets, ``ascend_attn_rt.vllm.graph``) works under DCP as without it: the runtime's DCP decode
records the query gather, the shard's call and the exchange + merge, whose collectives run inside each
replay. Refused by name: prefill context parallel (``prefill_context_parallel_size > 1``), the
DCP-replicated MLA query (``dcp_q_replicate``), and the impl options the runtime's DCP layers do not take
(sliding windows, sinks, ALiBi, soft-cap, encoder layers, quantised caches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import _C as aar

#: Collective timeout of the adapter's Comm (a dead peer raises CommError naming the op, never hangs).
COMM_TIMEOUT_S = 60.0

_comms: dict = {}  # id(device_group) -> (device_group, aar.cp.Comm)


@dataclass(frozen=True)
class DcpSetup:
    """vLLM's DCP set-up as the runtime's builders take it."""

    world_size: int
    rank: int
    interleave: int


def refuse_pcp(vllm_config, what: str) -> None:
    pcp = int(getattr(vllm_config.parallel_config, "prefill_context_parallel_size", 1) or 1)
    if pcp > 1:
        raise NotImplementedError(f"prefill_context_parallel_size={pcp}: prefill context parallel through "
                                  f"ascend_attn_rt's {what} is not supported (decode context parallel is)")


def _dcp_group(world_size: int):
    from vllm.distributed.parallel_state import get_dcp_group

    try:
        g = get_dcp_group()
    except AssertionError as e:
        raise RuntimeError(f"decode_context_parallel_size={world_size} but vLLM's DCP group is not initialised "
                           "(vllm.distributed.initialize_model_parallel(decode_context_model_parallel_size=...))"
                           ) from e
    if g.world_size != world_size:
        raise ValueError(f"vLLM's DCP group has {g.world_size} ranks but decode_context_parallel_size={world_size}")
    return g


def dcp_setup(vllm_config, what: str) -> Optional[DcpSetup]:
    """The DCP set-up of ``vllm_config`` and vLLM's DCP group, or None without DCP. PCP is refused by name."""
    refuse_pcp(vllm_config, what)
    pc = vllm_config.parallel_config
    w = int(getattr(pc, "decode_context_parallel_size", 1) or 1)
    if w <= 1:
        return None
    g = _dcp_group(w)
    interleave = int(getattr(pc, "cp_kv_cache_interleave_size", 1) or 1)
    return DcpSetup(world_size=w, rank=int(g.rank_in_group), interleave=interleave)


def dcp_comm(world_size: int):
    """The runtime's ``aar.cp.Comm`` over vLLM's DCP group (``device_group``), one per group and process."""
    g = _dcp_group(world_size)
    pg = g.device_group
    entry = _comms.get(id(pg))
    if entry is None or entry[0] is not pg:
        entry = (pg, aar.cp.Comm(pg, timeout_s=COMM_TIMEOUT_S))
        _comms[id(pg)] = entry
    comm = entry[1]
    if comm.size != world_size or comm.rank != g.rank_in_group:
        raise ValueError(f"the DCP group's ProcessGroup is rank {comm.rank} of {comm.size}, vLLM's DCP group rank "
                         f"{g.rank_in_group} of {g.world_size}")
    return comm


def take_over_dcp(impl):
    """The runtime's merge in place of vLLM's for an MLA-family impl under DCP.

    Returns the ``aar.cp.Comm`` of vLLM's DCP group (None without DCP). The impl keeps vLLM's
    size as ``runtime_dcp_world_size`` and shows vLLM ``dcp_world_size = 1``, so vLLM neither
    gathers the query nor merges: the runtime's layer does both (docs/design/vllm_sparse.md §7).
    ``need_to_return_lse_for_decode`` stays True, since vLLM checks that a DCP impl combines LSE
    partials, which the runtime does.
    """
    impl.runtime_dcp_world_size = impl.dcp_world_size
    if impl.dcp_world_size <= 1:
        return None
    comm = dcp_comm(impl.dcp_world_size)
    impl.need_to_return_lse_for_decode = True
    impl.dcp_world_size = 1
    return comm


def num_speculative_tokens(vllm_config) -> int:
    spec = getattr(vllm_config, "speculative_config", None)
    return 0 if spec is None else int(spec.num_speculative_tokens or 0)
