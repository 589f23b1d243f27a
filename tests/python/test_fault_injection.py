"""Fault injection at every operator call of a step (issue 15, "Faults").

_C._testing.arm_fault(k) makes the k-th operator call on this thread raise (the hook sits in
every operator wrapper, before the dispatcher call: ops/fault_injection.h). For each backend's
forward, a fault-free run first counts the step's N operator calls and records the outputs;
then for every k in 1..N, from the same starting caches:
  * the fault surfaces as RuntimeError("fault injected at operator call k");
  * no cache tensor is half-written: each one is bit-identical either to its state before the
    step (its write had not run yet) or to its state after the fault-free step (its write ran
    completely). Caches written before the fault keep the step's values: a write op is never
    rolled back, and each is idempotent (it writes this step's values at this step's slots);
  * retrying the same step (same metadata, same layer) from that state succeeds and gives the
    fault-free output and caches, bit for bit.
The per-backend contract is in docs/reliability.md."""

from __future__ import annotations

import math

import pytest
import torch

import ascend_attn_rt as aar
from ascend_attn_rt import _C

T = _C._testing

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


def sweep(step, caches, whole=True):
    """step() runs one forward and returns its output tensor. Returns (N, per-cache first k
    after which it is written) for the caller's contract checks. whole=False: a cache may be
    written by several operator calls (each its own rows); then every element must be its value
    before the step or after it, and the first-written k is not tracked."""
    before = [c.clone() for c in caches]
    T.arm_fault(0)
    try:
        good_out = step().clone()
    finally:
        n = T.disarm_fault()
    assert n >= 1, "the step made no operator call"
    good = [c.clone() for c in caches]
    written_after = [None] * len(caches)  # smallest k whose fault leaves the cache written
    for k in range(1, n + 1):
        for c, b0 in zip(caches, before):
            c.copy_(b0)
        T.arm_fault(k)
        try:
            with pytest.raises(RuntimeError, match=rf"fault injected at operator call {k}$"):
                step()
        finally:
            T.disarm_fault()
        for i, (c, b0, g) in enumerate(zip(caches, before, good)):
            if not whole:
                cb, bb, gb = _bits(c), _bits(b0), _bits(g)
                assert bool(((cb == bb) | (cb == gb)).all()), f"cache {i}: a row neither old nor new at k={k}"
                continue
            if _same(c, g) and (written_after[i] is not None or not _same(b0, g)):
                if written_after[i] is None:
                    written_after[i] = k  # its write is among calls 1..k-1
            elif _same(c, b0):
                # untouched: no earlier (smaller) k may have found it written
                assert written_after[i] is None, f"cache {i} written at fault k={written_after[i]} but not at k={k}"
            else:
                pytest.fail(f"cache {i} half-written after a fault at operator call {k} of {n}")
        # Retry the same step from the faulted state: the fault-free result, bit for bit.
        out = step()
        assert _same(out, good_out), f"retry after a fault at call {k} gave a different output"
        for i, (c, g) in enumerate(zip(caches, good)):
            assert _same(c, g), f"retry after a fault at call {k}: cache {i} differs from the fault-free step"
    return n, written_after


def test_hook_counts_and_is_per_thread():
    import threading

    T.arm_fault(0)
    assert T.fault_calls() == 0
    seen = []
    th = threading.Thread(target=lambda: seen.append(T.fault_calls()))
    th.start()
    th.join()
    assert seen == [0]
    assert T.disarm_fault() == 0
    assert T.fault_calls() == 0


# ---------------------------------------------------------------- GQA / FA3 / C8

def _gqa_step(gen, impl_cls, block_size=16, **impl_kw):
    from _reference import make_batch

    b = make_batch([37, 140, 9, 60], [1, 1, 9, 12], num_heads=4, num_kv_heads=2, head_size=16, block_size=block_size,
                   gen=gen, dtype=torch.float32)
    builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=b.block_table.shape[1],
                                  block_size=b.block_size, num_blocks=b.num_blocks)
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table)
    impl = impl_cls(4, 16, num_kv_heads=2, **impl_kw)
    out = torch.zeros_like(b.q)

    def step():
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
        return out

    return step, [b.key_cache, b.value_cache]


def test_gqa_forward_faults(gen):
    step, caches = _gqa_step(gen, aar.AttentionImpl)
    n, written = sweep(step, caches)
    # GQA: the cache write is the first operator call; a fault there leaves both caches untouched.
    assert written[0] == written[1] == 2, (n, written)


def test_fa3_forward_faults(gen):
    step, caches = _gqa_step(gen, aar.FA3AttentionImpl, block_size=128)  # FA3 takes block 128 only
    n, written = sweep(step, caches)
    assert written[0] is not None and written[0] == written[1], (n, written)


def test_c8_forward_faults(gen):
    import test_c8 as c8

    b = c8.make_c8_batch([37, 140, 9, 60], [1, 1, 9, 12], gen=gen)
    builder = c8.make_builder(b)
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table, num_input_tokens=b.num_input_tokens)
    impl = c8.make_impl(b)
    out = torch.zeros(b.q.shape, dtype=b.dtype)

    def step():
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
        return out

    n, written = sweep(step, [b.key_cache, b.value_cache])
    assert written[0] is not None and written[1] is not None, (n, written)


# ---------------------------------------------------------------- MLA / SFA

def test_mla_forward_faults():
    from test_mla import setup_case

    c = setup_case([40, 3, 70], [1, 3, 9], workspace=256)
    out = torch.zeros_like(c.hidden)

    def step():
        c.impl.forward(c.hidden, c.nope, c.rope, c.md, out)
        return out

    # MLA writes the decode and the prefill tokens' cache rows in separate operator calls: a
    # failure between them leaves the decodes' rows written and the prefills' not.
    sweep(step, [c.nope, c.rope], whole=False)


def test_sfa_forward_faults():
    from test_sfa import Model, _qsl

    seq, q = [40, 21, 33], [1, 5, 33]
    m = Model(seq)
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    impl = m.impl()
    out = torch.zeros_like(hidden)
    caches = m.caches()

    def step():
        impl.forward(hidden, caches, md, out)
        return out

    n, written = sweep(step, caches)
    assert all(w is not None for w in written), (n, written)


# ---------------------------------------------------------------- DSA

def test_dsa_forward_faults():
    from test_dsa import Run, dims, group_kw

    run = Run(dims(4), torch.float32, nreq=2)
    run.step([0, 1], [13, 5])  # some context in every cache
    st, md, S, qsl = run.build([0, 1], [1, 6])
    hid = torch.cat([run.x[b][S[i] - q: S[i]] for i, (b, q) in enumerate(zip([0, 1], [1, 6]))])
    out = torch.zeros_like(hid)
    caches = [t for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc) if t is not None]

    def step():
        run.impl.forward(hid, run.kv, st, md["swa"], out, topk_buffer=run.topk, **group_kw(run.d.ratio, md, st))
        return out

    n, written = sweep(step, caches)
    assert all(w is not None for w in written), (n, written)


# ---------------------------------------------------------------- graph update (+ replay)
#
# A captured bucket, one step A updated into it, then the next step B: the engine's per-step
# sequence is update(B) and, on CPU (the "recording" provider), replay(B); on the NPU (the
# "hooks" provider, here "noop": the same code path with the hooks unset) update re-issues every
# parameterised call itself and the device graph replays. A and B come from two builders, so
# their host lists live in different buffers and the captured parameters of each call can be
# told apart. For every k the k-th operator call of that sequence raises, and:
#  * the error surfaces;
#  * every parameterised call keeps either A's lists (and block table) or B's, never a mix, and
#    the calls holding B's are a prefix in update order (the failing call keeps A's);
#  * the bucket counts as not updated: replay refuses it until an update completes;
#  * no cache is half-written (each one whole before-B or after-B; GQA/MLA graph updates write
#    no cache, the replay's cache writes are single operator calls);
#  * update(B) + replay(B) with the same inputs then gives the fault-free outputs and caches.
# Contract in include/ascend_attn_rt/graph/graph_params.h, docs/reliability.md.


def _lists(g, n):
    return [(q, kv, bt) for _, q, kv, bt in g.captured_lists(n)]


def graph_sweep(g, n, update_a, update_b, replay, outs, caches, a_lists_survive=True):
    """update_a(): brings the bucket back to step A's parameters (unarmed). update_b(): the new
    step's update. replay: None (NPU-like provider) or the replay of the bucket. Returns the
    number of operator calls of update(B)(+replay(B)). a_lists_survive=False when both steps are
    built by one builder (the bucket takes only its capturing builder's steps, docs/design/graph.md
    §1.2): B's build rewrites the host lists A's calls view, so after a fault only the calls updated
    before it are checked (they hold B's lists); the rest view the builder's storage, and the bucket
    is not updated, so the replay refuses it (checked)."""
    before = [c.clone() for c in caches]
    update_a()
    old = _lists(g, n)

    def step_b():
        update_b()
        if replay is not None:
            replay()

    T.arm_fault(0)
    try:
        update_b()
    finally:
        update_calls = T.disarm_fault()
    update_a()
    T.arm_fault(0)
    try:
        step_b()
    finally:
        calls = T.disarm_fault()
    assert calls >= 1
    new = _lists(g, n)
    # The update's operator calls are its re-issues, one per parameterised call (NPU-like
    # provider), or none (CPU: it rewrites host lists only).
    assert update_calls in (0, len(new)), (update_calls, len(new))
    assert all(o != w for o, w in zip(old, new)), "steps A and B must differ in every call's lists"
    good_out = [o.clone() for o in outs]
    good = [c.clone() for c in caches]
    for k in range(1, calls + 1):
        for c, b0 in zip(caches, before):
            c.copy_(b0)
        update_a()
        T.arm_fault(k)
        try:
            with pytest.raises(RuntimeError, match=rf"fault injected at operator call {k}$"):
                step_b()
        finally:
            T.disarm_fault()
        now = _lists(g, n)
        which = ["new" if x == w else "old" if x == o else "mixed" for x, o, w in zip(now, old, new)]
        # The calls updated before the fault hold B's lists, the failing call and the rest A's.
        want_new = k - 1 if k <= update_calls else len(new)
        if a_lists_survive:
            assert "mixed" not in which, (k, which)
            assert which == ["new"] * want_new + ["old"] * (len(new) - want_new), (k, which)
        else:
            assert which[:want_new] == ["new"] * want_new, (k, which)
        for i, (c, b0, gd) in enumerate(zip(caches, before, good)):
            assert _same(c, b0) or _same(c, gd), f"cache {i} half-written after a fault at call {k} of {calls}"
        if replay is not None:
            with pytest.raises(ValueError, match="before update"):
                replay()
        step_b()
        for o, go in zip(outs, good_out):
            assert _same(o, go), f"update+replay after a fault at call {k} gave a different output"
        for i, (c, gd) in enumerate(zip(caches, good)):
            assert _same(c, gd), f"after a fault at call {k}: cache {i} differs from the fault-free step"
    return calls


@pytest.mark.parametrize("provider", ["recording", "noop"])
def test_gqa_graph_update_faults(gen, provider):
    import test_graph as tg

    model = tg.Model(gen, layer_indices=(4, 1, 2))
    g = aar.GraphParams(provider)
    model.capture(g, model.meta([1] * tg.BUCKET, [16] * tg.BUCKET, capture=True))
    # Each update builds its step with the capturing builder (a bucket takes that builder's steps
    # only, docs/design/graph.md §1.2; a build makes the builder's earlier metadata stale).
    qa, ca = [1, 1, 6], [20, 35, 9]
    qb, cb = [1] * 5, [12, 30, 7, 50, 21]
    md_a = lambda: model.meta(qa, [c + q for c, q in zip(ca, qa)], num_input_tokens=tg.BUCKET)
    md_b = lambda: model.meta(qb, [c + q for c, q in zip(cb, qb)], num_input_tokens=tg.BUCKET)
    tg.prefill_history(model, [max(a, b) + 8 for a, b in zip(ca + [0, 0], cb)])
    qs, ks, vs = model.step_inputs(5)
    model.load_static(qs, ks, vs)
    caches = [t for kv in model.caches for t in kv]
    replay = (lambda: g.replay(tg.BUCKET)) if provider == "recording" else None
    n = graph_sweep(g, tg.BUCKET, lambda: g.update(tg.BUCKET, md_a()), lambda: g.update(tg.BUCKET, md_b()), replay,
                    model.out, caches, a_lists_survive=False)
    # recording: update rewrites host lists only, the 6 calls (3 KV writes, 3 FIA) run at replay;
    # noop: update re-issues the 3 FIA calls, the KV writes belong to the device graph.
    assert n == (6 if provider == "recording" else 3), n


@pytest.mark.parametrize("provider", ["recording", "noop"])
def test_mla_graph_update_faults(provider):
    from test_mla_graph import BUCKET, _setup

    d, gen, builder, table, kw, caches = _setup()
    layers = [aar.mla.Impl(layer_index=i, **kw) for i in range(2)]
    hidden_s = torch.zeros(BUCKET, d.hidden)
    outs = [torch.zeros(BUCKET, d.hidden) for _ in layers]
    qsl = torch.arange(BUCKET + 1, dtype=torch.int32)
    md = builder.build(qsl, torch.full((BUCKET,), 16, dtype=torch.int32), table)
    g = aar.GraphParams(provider)
    with g.capture(BUCKET):
        for layer, (nope, rope), out in zip(layers, caches, outs):
            layer.forward(hidden_s, nope, rope, md, out)
    # Each update builds its step with the capturing builder (docs/design/graph.md §1.2).
    md_a = lambda: builder.build(qsl, torch.tensor([5, 17, 33, 9], dtype=torch.int32), table)
    md_b = lambda: builder.build(qsl, torch.tensor([40, 2, 11, 23], dtype=torch.int32), table)
    hidden_s.copy_(torch.randn(BUCKET, d.hidden, generator=gen))
    flat = [t for c in caches for t in c]
    replay = (lambda: g.replay(BUCKET)) if provider == "recording" else None
    n = graph_sweep(g, BUCKET, lambda: g.update(BUCKET, md_a()), lambda: g.update(BUCKET, md_b()), replay, outs, flat,
                    a_lists_survive=False)
    assert n >= 2, n


def test_dsa_graph_update_replay_faults():
    # DSA: a captured layer is one Prepare call reading every per-step value at stable addresses,
    # so update re-issues nothing and makes no operator call (it checks that the step fits; its
    # rejections are tested in test_dsa_graph.py). Every operator call of the step is in the
    # replay: the forward contract holds for it (each cache whole or untouched), the failed
    # replay consumed the update (replay alone is refused), and update + replay redo the step
    # bit for bit.
    from test_dsa import Run, dims
    from test_dsa_graph import Bucket, caches as dsa_caches

    run = Run(dims(4), torch.float32, nreq=3)
    run.step([0, 1, 2], [13, 5, 9])
    bk = Bucket(run, B=4, q=1)
    bk.capture([0, 1, 2])
    st, md, S, _ = bk.build([0, 1, 2])
    bk.hidden.zero_()
    bk.hidden[:3] = torch.cat([run.x[b][S[i] - 1: S[i]] for i, b in enumerate([0, 1, 2])])

    T.arm_fault(0)
    aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    assert T.disarm_fault() == 0, "a DSA graph update makes no operator call"

    def step():
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
        bk.g.replay(bk.n)
        return bk.outs[0]

    # (A one-token decode step leaves some caches unchanged, e.g. no compressed row is emitted:
    # their `written` entry stays None.)
    n, written = sweep(step, dsa_caches(run))
    assert n > 1 and any(w is not None for w in written), (n, written)
    T.arm_fault(n)
    with pytest.raises(RuntimeError, match="fault injected"):
        step()
    T.disarm_fault()
    with pytest.raises(ValueError, match="before update"):
        bk.g.replay(bk.n)
