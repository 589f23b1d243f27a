"""Operators run under InferenceMode, taken once per entry point of the runtime (ops/inference_mode.h):
a forward, a graph update or a replay called from outside inference mode takes the guard once,
however many operators it calls; called inside torch.inference_mode() it takes none; an operator
wrapper called on its own from outside takes it for that call. Counted by the runtime
(_C._testing.inference_mode_entries, per thread)."""

import pytest
import torch

import ascend_attn_rt as aar
import test_graph as tg
from test_mla_graph import BUCKET as MLA_BUCKET, _setup as mla_setup

T = aar._C._testing


def entries(fn):
    before = T.inference_mode_entries()
    fn()
    return T.inference_mode_entries() - before


def gqa_graph(provider):
    gen = torch.Generator().manual_seed(3)
    model = tg.Model(gen, layer_indices=(0, 1, 2))
    g = aar.GraphParams(provider)
    model.capture(g, model.meta([1] * tg.BUCKET, [16] * tg.BUCKET, capture=True))
    md = model.meta([1] * tg.BUCKET, [20] * tg.BUCKET, num_input_tokens=tg.BUCKET)
    return model, g, md


def test_graph_update_takes_the_guard_once():
    _, g, md = gqa_graph("noop")
    # The NPU-like provider: the update re-issues the three fused calls, under one guard.
    assert entries(lambda: g.update(tg.BUCKET, md)) == 1
    with torch.inference_mode():
        assert entries(lambda: g.update(tg.BUCKET, md)) == 0


def test_graph_replay_takes_the_guard_once():
    _, g, md = gqa_graph("recording")
    g.update(tg.BUCKET, md)
    # Six recorded calls (three KV writes, three fused calls).
    assert entries(lambda: g.replay(tg.BUCKET)) == 1
    g.update(tg.BUCKET, md)
    with torch.inference_mode():
        assert entries(lambda: g.replay(tg.BUCKET)) == 0


def test_mla_graph_update_takes_the_guard_once():
    d, _, builder, table, kw, caches = mla_setup()
    layers = [aar.mla.Impl(layer_index=i, **kw) for i in range(2)]
    hidden = torch.zeros(MLA_BUCKET, d.hidden)
    outs = [torch.zeros(MLA_BUCKET, d.hidden) for _ in layers]
    qsl = torch.arange(MLA_BUCKET + 1, dtype=torch.int32)
    md = builder.build(qsl, torch.full((MLA_BUCKET,), 16, dtype=torch.int32), table)
    g = aar.GraphParams("noop")
    with g.capture(MLA_BUCKET):
        for layer, (nope, rope), out in zip(layers, caches, outs):
            layer.forward(hidden, nope, rope, md, out)
    md = builder.build(qsl, torch.full((MLA_BUCKET,), 20, dtype=torch.int32), table)
    assert entries(lambda: g.update(MLA_BUCKET, md)) == 1


def test_gqa_forward_takes_the_guard_once():
    model, _, _ = gqa_graph("recording")
    md = model.meta([1] * tg.BUCKET, [20] * tg.BUCKET)
    impl = model.impls[0]
    kc, vc = model.caches[0]
    # A KV write and a fused call.
    assert entries(lambda: impl.forward(model.q[0], model.k[0], model.v[0], kc, vc, md, model.out[0])) == 1
    with torch.inference_mode():
        assert entries(lambda: impl.forward(model.q[0], model.k[0], model.v[0], kc, vc, md, model.out[0])) == 0


def test_mla_forward_takes_the_guard_once():
    d, g, builder, table, kw, caches = mla_setup()
    layer = aar.mla.Impl(**kw)
    qsl = torch.arange(MLA_BUCKET + 1, dtype=torch.int32)
    md = builder.build(qsl, torch.full((MLA_BUCKET,), 16, dtype=torch.int32), table)
    hidden = torch.randn(MLA_BUCKET, d.hidden, generator=g)
    out = torch.zeros(MLA_BUCKET, d.hidden)
    nope, rope = caches[0]
    # Projections, norms, RoPE, the cache write, the fused call, W_UV and o_proj.
    assert entries(lambda: layer.forward(hidden, nope, rope, md, out)) == 1


def test_a_wrapper_called_on_its_own_takes_the_guard_for_the_call():
    lse = [torch.zeros(4), torch.ones(4)]
    outs = [torch.zeros(4, 8), torch.ones(4, 8)]
    assert entries(lambda: T.attention_update(lse, outs, 0, "cpu")) == 1
    with torch.inference_mode():
        assert entries(lambda: T.attention_update(lse, outs, 0, "cpu")) == 0
