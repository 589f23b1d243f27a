"""Glue between the reference batches (_reference.Batch) and the runtime:
build metadata with aar.MetadataBuilder, run aar.AttentionImpl.forward, and
check output + KV cache against the reference."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

import ascend_attn_rt as aar
from _reference import SENTINEL, Batch, assert_close, check_cache_after_write, new_output

S = aar.AttentionState


def make_builder(batch: Batch, **kw):
    cfg = dict(
        max_num_reqs=max(8, batch.num_reqs + 2),
        max_num_tokens=max(64, batch.q.shape[0]),
        max_blocks_per_req=max(batch.block_table.shape[1], 4),
        block_size=batch.block_size,
        num_blocks=batch.num_blocks,
    )
    cfg.update(kw)
    return aar.MetadataBuilder(**cfg)


def make_impl(batch: Batch, **kw):
    kw.setdefault("num_kv_heads", batch.num_kv_heads)
    return aar.AttentionImpl(batch.num_heads, batch.head_size, **kw)


def run_forward(
    batch: Batch,
    *,
    state=None,
    builder_kw: Optional[dict] = None,
    build_kw: Optional[dict] = None,
    impl_kw: Optional[dict] = None,
    pass_kv: bool = True,
    caches: bool = True,
):
    builder = make_builder(batch, **(builder_kw or {}))
    md = builder.build(
        batch.query_start_loc,
        batch.seq_lens_t,
        batch.block_table,
        num_input_tokens=batch.num_input_tokens,
        attn_state=state,
        **(build_kw or {}),
    )
    impl = make_impl(batch, **(impl_kw or {}))
    kc_before = batch.key_cache.clone()
    vc_before = batch.value_cache.clone()
    out = new_output(batch)
    ret = impl.forward(
        batch.q,
        batch.k if pass_kv else None,
        batch.v if pass_kv else None,
        batch.key_cache if caches else None,
        batch.value_cache if caches else None,
        md,
        out,
    )
    return SimpleNamespace(builder=builder, md=md, impl=impl, out=out, ret=ret, kc_before=kc_before,
                           vc_before=vc_before)


def check_output(batch: Batch, res, *, scale=None, causal=True, window=None, sinks=None):
    n = batch.num_actual_tokens
    ref = batch.reference(scale=scale, causal=causal, window=window, sinks=sinks)
    assert res.ret.data_ptr() == res.out.data_ptr(), "forward must return the output tensor"
    assert res.out.dtype == batch.dtype and res.out.shape == batch.q.shape
    assert_close(res.out[:n], ref, batch.dtype)
    kt = res.md.num_kernel_tokens
    assert kt >= n
    if kt < res.out.shape[0]:
        assert bool((res.out[kt:] == SENTINEL).all()), f"rows past num_kernel_tokens={kt} were written"


def check_cache_written(batch: Batch, res):
    n = batch.num_actual_tokens
    check_cache_after_write(res.kc_before, batch.key_cache, batch.new_slots, batch.k[:n])
    check_cache_after_write(res.vc_before, batch.value_cache, batch.new_slots, batch.v[:n])


def check_cache_unchanged(batch: Batch, res):
    assert torch.equal(res.kc_before, batch.key_cache), "key cache changed"
    assert torch.equal(res.vc_before, batch.value_cache), "value cache changed"
