# The DSA layer forward (aar.dsa.Impl, dsa/impl.h) over multi-step runs with the
# metadata builders, against the float64 reference tests/python/_dsa_reference.py
# (docs/design/dsa.md §1.1, §2.3, §5.1): outputs, and the SWA / compressed / indexer
# cache rows after each step. The A2 plan (bf16 rows, int8 indexer).
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import allocate_caches, group_kw, slot_rows

F64 = torch.float64
CBS = 32  # cache block size (docs/design/dsa.md §2.2 table row 32)
MAXPOS = 1024


class Run:
    """One layer, its caches and builders, requests with fixed token streams."""

    def __init__(self, d, dtype, nreq, k=0, seed=0, max_blocks=200, use_topk=False, dspark=0):
        self.d, self.dtype = d, dtype
        g = torch.Generator().manual_seed(seed)
        self.w = ref.make_dsa_weights(d, dtype, g)
        self.cos, self.sin = ref.rope_tables(MAXPOS, d.R)
        self.x = [torch.randn(400, d.hidden, generator=g, dtype=F64).to(dtype) for _ in range(nreq)]
        # The model's settings, once: every group reads them from the step builder.
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin,
                                      num_speculative_tokens=k, head_dim=d.D, window=d.W, num_heads_q=d.N,
                                      index_topk=d.K, index_n_heads=d.n_idx, index_head_dim=d.Di,
                                      dspark_num_spec=dspark)
        self.kinds = aar.dsa.layer_cache_kinds(d.ratio)
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables = {}, {}
        for kd in self.kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, device_kind="a2",
                                               model_dtype="bfloat16", max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb)
            # request b owns blocks [1 + b * max_blocks, ...): block 0 stays unused
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
        c = allocate_caches(self.gb, dtype)  # the runtime's shapes (GroupBuilder.cache_spec)
        self.swa, self.cmp, self.state, self.istate = c["swa"], c["compress_kv"], c["state"], c["indexer_state"]
        self.ik, self.isc = c["indexer_k"], c["indexer_scale"]
        self.kv = aar.dsa.compose_kv_cache(compress_kv=self.cmp, swa_kv=self.swa, state=self.state,
                                           indexer_state=self.istate, indexer_k=self.ik, indexer_scale=self.isc)
        self.topk = aar.sfa.TopkBuffer(512, d.K) if use_topk else None
        self.impl = self.make_impl()
        self.S = [0] * nreq

    def make_impl(self, **kw):
        d = self.d
        return aar.dsa.Impl(self.w, hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R,
                            q_lora_rank=d.q_lora, compress_ratio=d.ratio, index_n_heads=d.n_idx,
                            index_head_dim=d.Di, index_topk=d.K, eps=d.eps, o_groups=d.G, o_lora_rank=d.o_lora,
                            device_kind="a2", model_dtype="bfloat16", **kw)

    def build(self, reqs, qlens, draft=None, pad=0):
        S = [self.S[b] + q for b, q in zip(reqs, qlens)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        args = (torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32))
        if draft is None:
            st = self.sb.build(*args, num_input_tokens=qsl[-1] + pad)
            md = {kd: self.gb[kd].build(st, self.tables[kd][reqs].contiguous()) for kd in self.kinds}
        else:  # docs/design/dsa.md §3.1 draft mode: SWA-only layers, the draft lane `draft`
            st = self.sb.build_for_drafting(*args, draft, num_input_tokens=qsl[-1] + pad)
            md = {kd: self.gb[kd].build_for_drafting(st, self.tables[kd][reqs].contiguous(), draft)
                  for kd in self.kinds}
        return st, md, S, qsl

    def step(self, reqs, qlens, impl=None, pad=0, draft=None, routed=False):
        st, md, S, qsl = self.build(reqs, qlens, draft, pad)
        self.last_md = md
        hid = torch.cat([self.x[b][S[i] - qlens[i]: S[i]] for i, b in enumerate(reqs)]
                        + [torch.zeros(pad, self.d.hidden, dtype=self.dtype)])
        out = torch.full_like(hid, float("nan"))
        if routed:  # route_layer's result as forward's metadata (docs/python_api.md)
            (impl or self.impl).forward(hid, self.kv, aar.dsa.route_layer(self.d.ratio, st, md), out,
                                        topk_buffer=self.topk)
        else:
            (impl or self.impl).forward(hid, self.kv, st, md["swa"], out, topk_buffer=self.topk,
                                        **group_kw(self.d.ratio, md, st))
        for i, b in enumerate(reqs):
            self.S[b] = S[i]
        return out, qsl, S

    def slot_rows(self, cache, kd, b, n):
        """Rows 0..n-1 of request b in a paged cache (logical table, physical rows)."""
        return slot_rows(cache, self.tables[kd][b], n)


def dims(ratio, **kw):
    base = dict(hidden=64, N=4, D=64, R=16, q_lora=32, W=8, ratio=ratio, n_idx=4, Di=32, K=8, G=2, o_lora=16)
    base.update(kw)
    return ref.DsaDims(**base)


def tol(dtype):
    return (2e-5, 2e-5) if dtype == torch.float32 else (3e-2, 3e-2)


def check_step(run, reqs, qlens, out, qsl, S, topk_rows=None):
    d = run.d
    at, rt = tol(run.dtype)
    for i, b in enumerate(reqs):
        o = out[qsl[i]: qsl[i + 1]].to(F64)
        tk = None
        if d.ratio == 4:
            tk = topk_rows[qsl[i]: qsl[i + 1], 0].to(torch.int64)
        want = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin, topk=tk)
        torch.testing.assert_close(o, want, atol=at * max(1.0, want.abs().max().item()), rtol=rt)


def check_caches(run, b):
    d = run.d
    at, rt = tol(run.dtype)
    S = run.S[b]
    xs = run.x[b][:S]
    swa = ref.swa_rows(d, run.w, xs, run.cos, run.sin)
    torch.testing.assert_close(run.slot_rows(run.swa, "swa", b, S).to(F64), swa, atol=at * 4, rtol=rt)
    if d.ratio > 1:
        want = ref.compressed_kv_rows(d, run.w, xs, run.cos, run.sin)
        kd = "c4_kv" if d.ratio == 4 else "c128_kv"
        got = run.slot_rows(run.cmp, kd, b, want.shape[0]).to(F64)
        torch.testing.assert_close(got, want, atol=at * 4, rtol=rt)
        # nothing beyond the complete rows was written
        n = want.shape[0]
        rows = run.cmp.shape[1]
        nxt = run.tables[kd][b][n // rows]
        assert run.cmp[nxt, n % rows].abs().sum() == 0
    if d.ratio == 4:
        k = ref.indexer_k_rows(d, run.w, xs, run.cos, run.sin)
        n = k.shape[0]
        q = run.slot_rows(run.ik, "c4_indexer_k", b, n).to(F64)
        sc = run.slot_rows(run.isc.unsqueeze(-1), "c4_indexer_k", b, n).to(F64)
        deq = q * sc
        amax = k.abs().amax(-1, keepdim=True)
        # int8 per-row: error <= scale / 2 (+ the dtype's error on k itself)
        assert ((deq - k).abs() <= amax / 127 * 0.5 + 0.02 * amax + 1e-6).all()


def check_topk(run, reqs, qlens, qsl, S, topk_rows):
    """The selection is the reference's top-K up to int8 quantisation: every selected row's float64 score is
    at least the best unselected visible row's minus a quantisation margin; counts match."""
    d = run.d
    for i, b in enumerate(reqs):
        _, scores = ref.indexer_topk(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin)
        for j in range(qlens[i]):
            p = S[i] - qlens[i] + j
            vis = ref.visible_compressed(p, 4)
            sel = [int(e) for e in topk_rows[qsl[i] + j, 0].tolist() if e >= 0]
            assert len(sel) == min(vis, d.K), (sel, vis)
            assert len(set(sel)) == len(sel) and all(0 <= e < vis for e in sel)
            rest = [c for c in range(vis) if c not in sel]
            if rest:
                row = scores[j]
                margin = 0.05 * row[:vis].abs().max().item() + 1e-6
                assert min(row[e].item() for e in sel) >= max(row[c].item() for c in rest) - margin


DT = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DT)
def test_swa_prefill_chunked_decode_mixed(dtype):
    d = dims(1)
    run = Run(d, dtype, nreq=3)
    # prefill (two requests), chunked prefill over steps, decodes, a mixed step
    for reqs, qlens in [([0, 1], [13, 5]), ([0, 1], [7, 20]), ([0, 1, 2], [1, 1, 9]), ([0, 1, 2], [1, 1, 1]),
                        ([0, 2, 1], [1, 1, 6])]:
        out, qsl, S = run.step(reqs, qlens)
        check_step(run, reqs, qlens, out, qsl, S)
    for b in range(3):
        check_caches(run, b)


@pytest.mark.parametrize("dtype", DT)
def test_c128_chunked_prefill_carries_state(dtype):
    d = dims(128)
    run = Run(d, dtype, nreq=2)
    # request 0: 300 tokens in 4 chunks crossing two group boundaries; request 1 one prefill then decodes
    plan = [([0], [90]), ([0, 1], [50, 129]), ([1, 0], [1, 100]), ([1, 0], [1, 60]), ([1, 0], [1, 1])]
    for reqs, qlens in plan:
        # decodes first (the builder's decode-first rule)
        out, qsl, S = run.step(reqs, qlens)
        check_step(run, reqs, qlens, out, qsl, S)
        for b in reqs:
            check_caches(run, b)
    assert run.S[0] == 301


@pytest.mark.parametrize("dtype", DT)
def test_c4_indexer_prefill_chunks_decode(dtype):
    d = dims(4)
    run = Run(d, dtype, nreq=2)
    plan = [([0], [23]), ([0, 1], [18, 10]), ([0, 1], [1, 1]), ([0, 1], [1, 14]), ([1, 0], [1, 9])]
    for reqs, qlens in plan:
        out, qsl, S = run.step(reqs, qlens)
        tk = run.impl.last_topk
        assert tk.shape == (sum(qlens), 1, d.K) and tk.dtype == torch.int32
        check_topk(run, reqs, qlens, qsl, S, tk)
        check_step(run, reqs, qlens, out, qsl, S, tk)
        for b in reqs:
            check_caches(run, b)


def test_c4_speculative_decode_and_index_cache():
    d = dims(4)
    run = Run(d, torch.float32, nreq=2, k=2, use_topk=True)
    run.impl = run.make_impl(use_index_cache=True)
    out, qsl, S = run.step([0, 1], [30, 21])
    check_step(run, [0, 1], [30, 21], out, qsl, S, run.impl.last_topk)
    for _ in range(3):  # speculative decode: 3 tokens per request
        out, qsl, S = run.step([0, 1], [3, 3])
        tk = run.impl.last_topk
        check_topk(run, [0, 1], [3, 3], qsl, S, tk)
        check_step(run, [0, 1], [3, 3], out, qsl, S, tk)
        assert torch.equal(run.topk.buffer[:6], tk[:, 0])
    # a skip_topk layer (IndexCache) attends over the stored selection: same output as the reference given it
    skip = run.make_impl(skip_topk=True)
    st, md, S, qsl = run.build([0, 1], [1, 1])
    stored = run.topk.buffer[:2].clone()
    stored[:, 1:] = -1  # keep only each row's best compressed row
    run.topk.store(stored)
    hid = torch.cat([run.x[b][S[i] - 1: S[i]] for i, b in enumerate([0, 1])])
    out = torch.empty_like(hid)
    skip.forward(hid, run.kv, st, md["swa"], out, attention=md["c4_kv"], compressor_state=md["c4_attn_state"],
                 indexer_cache=md["c4_indexer_k"], indexer_state=md["c4_indexer_state"], topk_buffer=run.topk)
    run.S = S
    check_step(run, [0, 1], [1, 1], out, qsl, S, stored[:, None, :])
    for b in range(2):
        check_caches(run, b)


def test_padding_rows_zero_and_profiling():
    d = dims(1)
    run = Run(d, torch.float32, nreq=1)
    st, md, S, qsl = run.build([0], [5])
    hid = torch.randn(8, d.hidden)
    hid[:5] = run.x[0][:5]
    out = torch.full_like(hid, float("nan"))
    run.impl.forward(hid, run.kv, st, md["swa"], out)
    run.S[0] = 5
    assert torch.equal(out[5:], torch.zeros(3, d.hidden))
    want = ref.dsa_layer(d, run.w, run.x[0][:5], 5, run.cos, run.sin)
    torch.testing.assert_close(out[:5].to(F64), want, atol=2e-5, rtol=2e-5)
    prof = torch.full_like(hid, 3.0)
    run.impl.forward(hid, run.kv, None, None, prof)
    assert torch.equal(prof, torch.zeros_like(prof))


def test_bad_input_raises_before_writing():
    d = dims(4)
    run = Run(d, torch.float32, nreq=1)
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][:9].clone()
    out = torch.zeros_like(hid)
    full = dict(attention=md["c4_kv"], compressor_state=md["c4_attn_state"], indexer_cache=md["c4_indexer_k"],
                indexer_state=md["c4_indexer_state"])
    snap = [t.clone() for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc)]

    def untouched():
        for a, b in zip(snap, (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc)):
            assert torch.equal(a, b)

    with pytest.raises(ValueError, match="kv_cache"):
        run.impl.forward(hid, list(run.kv)[:5], st, md["swa"], out, **full)
    bad = list(run.kv)
    bad[4] = torch.zeros_like(run.ik, dtype=torch.uint8)
    with pytest.raises(ValueError, match="indexer_k"):
        run.impl.forward(hid, bad, st, md["swa"], out, **full)
    bad = list(run.kv)
    bad[1] = torch.zeros(run.nb, 16, 1, d.D)  # wrong block geometry
    with pytest.raises(ValueError, match="swa_kv"):
        run.impl.forward(hid, bad, st, md["swa"], out, **full)
    bad = list(run.kv)
    bad[2] = None
    with pytest.raises(ValueError, match="state"):
        run.impl.forward(hid, bad, st, md["swa"], out, **full)
    with pytest.raises(ValueError, match="hidden"):
        run.impl.forward(hid.to(torch.bfloat16), run.kv, st, md["swa"], out, **full)
    with pytest.raises(ValueError, match="indexer"):
        run.impl.forward(hid, run.kv, st, md["swa"], out, attention=md["c4_kv"], compressor_state=md["c4_attn_state"])
    with pytest.raises(ValueError, match="output"):
        run.impl.forward(hid, run.kv, st, md["swa"], out[:4], **full)
    # the indexer group's QLI blob (docs/design/dsa.md §3.2) was made for the builders' indexer dims, not this layer's
    assert md["c4_indexer_k"].qli_metadata_filled
    d5 = dims(4, n_idx=d.n_idx + 1)
    other = aar.dsa.Impl(ref.make_dsa_weights(d5, torch.float32, torch.Generator().manual_seed(3)),
                         hidden_size=d5.hidden, num_heads=d5.N, head_dim=d5.D, rope_dim=d5.R, q_lora_rank=d5.q_lora,
                         compress_ratio=4, index_n_heads=d5.n_idx, index_head_dim=d5.Di, index_topk=d5.K,
                         o_groups=d5.G, o_lora_rank=d5.o_lora)
    with pytest.raises(ValueError, match="index_n_heads"):
        other.forward(hid, run.kv, st, md["swa"], out, **full)
    untouched()
    with pytest.raises(ValueError, match="use_index_cache"):
        run.make_impl(skip_topk=True, use_index_cache=True)
    d1 = dims(1)
    with pytest.raises(ValueError, match="wq_b"):
        w = ref.make_dsa_weights(d1, torch.float32, torch.Generator().manual_seed(1))
        w["wq_b"] = w["wq_b"][:-1]
        aar.dsa.Impl(w, hidden_size=64, num_heads=4, head_dim=64, rope_dim=16, q_lora_rank=32, window=8,
                     o_groups=2, o_lora_rank=16)


def test_unimplemented_plans_refused_by_name():
    d = dims(1)
    w = ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(2))
    kw = dict(hidden_size=64, num_heads=4, head_dim=64, rope_dim=16, q_lora_rank=32, window=8, o_groups=2,
              o_lora_rank=16)
    # A5 fp8 plan: implemented (tests/python/test_dsa_a5.py), but its 640-byte rows need D 512 / R 64
    with pytest.raises(ValueError, match="head_dim 512 and rope_dim 64"):
        aar.dsa.Impl(w, device_kind="a5", **kw)
    # A5 + bf16 cache (SparseFlashMla, tests/python/test_dsa_sfmla.py) and A3 (the A2 plan): accepted
    aar.dsa.Impl(w, device_kind="a5", cache_dtype="bfloat16", **kw)
    aar.dsa.Impl(w, device_kind="a3", **kw)


def test_compose_and_unpack_tuple():
    swa = torch.zeros(2, 32, 1, 64)
    t = aar.dsa.compose_kv_cache(swa_kv=swa)
    assert len(t) == 6 and t[1] is not None and all(t[i] is None for i in (0, 2, 3, 4, 5))
    with pytest.raises(ValueError, match="indexer_full"):
        aar.dsa.compose_kv_cache(swa_kv=swa, indexer_full=torch.zeros(2, 32, 1, 132, dtype=torch.int8))


def test_graph_capture_of_a_prefill_state_refused_by_name_before_writing():
    # The capture itself is tested in test_dsa_graph.py; a step that is no DecodeOnly / SpecDecoding one is not
    # captured (and the profiling run never is).
    d = dims(1)
    run = Run(d, torch.float32, nreq=1)
    st, md, S, qsl = run.build([0], [1])
    hid = run.x[0][:1].clone()
    out = torch.zeros_like(hid)
    swa0 = run.swa.clone()
    g = aar.GraphParams("recording")
    with g.capture(1):
        with pytest.raises(NotImplementedError, match="graph capture takes DecodeOnly and SpecDecoding"):
            run.impl.forward(hid, run.kv, st, md["swa"], out)
        with pytest.raises(NotImplementedError, match="profiling"):
            run.impl.forward(hid, run.kv, None, None, out)
    assert torch.equal(run.swa, swa0) and torch.equal(out, torch.zeros_like(out))


class OpLog(TorchDispatchMode):
    """Records the dispatcher calls (name, kwargs) the C++ layer makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((str(func), kwargs))
        return func(*args, **kwargs)

    def sas(self):
        return [kw for name, kw in self.calls if "npu_sparse_attn_sharedkv." in name]


@pytest.mark.parametrize("dtype", DT)
def test_dspark_draft_steps_swa_only(dtype):
    # docs/design/dsa.md §3.4 / §3.1 "DSpark non-causal" / §5.1 (ratio <= 1: ori_sparse_indices): every draft row attends to the W
    # context tokens before its block and the whole block (num_spec tokens at most), non-causally.
    ns = 3
    d = dims(1)
    run = Run(d, dtype, nreq=3, k=ns, dspark=ns)
    at, rt = tol(dtype)

    def check(reqs, qlens, out, qsl, S, log, dspark, T):
        (kw,) = log.sas()
        gm = run.last_md["swa"]
        if dspark:
            assert kw["ori_win_left"] == d.W + ns - 1 == gm.ori_win_left
            idx = kw["ori_sparse_indices"]
            assert idx.shape == (qsl[-1], 1, gm.dspark_width)
            assert torch.equal(idx, gm.dspark_swa_indices[: qsl[-1]])
            assert gm.dspark_swa_indices.shape[0] == T
        else:
            assert kw.get("ori_win_left", 127) == d.W - 1 == gm.ori_win_left
            assert kw.get("ori_sparse_indices") is None and gm.dspark_swa_indices is None
        for i, b in enumerate(reqs):
            want = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin,
                                 dspark=ns if dspark else None)
            got = out[qsl[i]: qsl[i + 1]].to(F64)
            torch.testing.assert_close(got, want, atol=at * max(1.0, want.abs().max().item()), rtol=rt)
            if dspark and qlens[i] > 1:  # the non-causal block is observable: the causal window differs
                causal = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin)
                assert (causal - want).abs().max() > 10 * at * max(1.0, want.abs().max().item())
        assert torch.equal(out[qsl[-1]:], torch.zeros_like(out[qsl[-1]:]))

    # prefill on the main lane: causal window, no DSpark indices
    with OpLog() as log:
        out, qsl, S = run.step([0, 1, 2], [13, 5, 20])
    check([0, 1, 2], [13, 5, 20], out, qsl, S, log, False, 38)
    # draft steps on the draft lanes (blocks of <= num_spec tokens), one graph-padded
    for draft, reqs, qlens, pad in [(0, [0, 1, 2], [3, 3, 3], 0), (1, [2, 0, 1], [2, 3, 1], 2),
                                    (2, [1, 2], [3, 1], 0)]:
        with OpLog() as log:
            out, qsl, S = run.step(reqs, qlens, draft=draft, pad=pad)
        check(reqs, qlens, out, qsl, S, log, True, qsl[-1] + pad)
        assert run.last_md["swa"].draft_index == draft
    # a main-lane step without prefill (blocks of <= num_spec tokens) is non-causal too
    with OpLog() as log:
        out, qsl, S = run.step([0, 1, 2], [1, 3, 2])
    check([0, 1, 2], [1, 3, 2], out, qsl, S, log, True, 6)
    # and a main step with a prefill falls back to the causal window
    with OpLog() as log:
        out, qsl, S = run.step([0, 2], [1, 9])
    check([0, 2], [1, 9], out, qsl, S, log, False, 10)
    for b in range(3):
        check_caches(run, b)


@pytest.mark.parametrize("ratio,k", [(1, 0), (4, 0), (128, 0), (4, 1), (1, 1)])
def test_graph_padded_decode_batch_eager(ratio, k):
    # The batches a captured decode bucket would replay (docs/design/dsa.md §3.2): B requests of which
    # [num_reqs_actual, B) are padding (0 tokens, S = 0, zeroed table rows), T = the bucket. Real rows as the
    # reference, padding rows zero, caches as the reference, block 0 (the zeroed rows' target) untouched. A padding
    # request with tokens but no KV is refused before anything is written.
    d = dims(ratio)
    q = 1 + k
    run = Run(d, torch.float32, nreq=2, k=k)
    run.step([0, 1], [37, 29])
    state = aar.AttentionState.SpecDecoding if k else aar.AttentionState.DecodeOnly
    B, bucket = 4, 4 * q + 1

    def build(S, qsl):
        st = run.sb.build_for_graph_capture(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32),
                                            num_reqs_actual=2, num_input_tokens=bucket, state=state)
        md = {kd: run.gb[kd].build(st, run.tables[kd][[0, 1, 0, 1]].contiguous()) for kd in run.kinds}
        kw = {}
        if ratio > 1:
            kw["attention"] = md["c4_kv" if ratio == 4 else "c128_kv"]
            kw["compressor_state"] = md["c4_attn_state" if ratio == 4 else "c128_state"]
        if ratio == 4:
            kw["indexer_cache"] = md["c4_indexer_k"]
            kw["indexer_state"] = md["c4_indexer_state"]
        return st, md, kw

    caches = lambda: [t for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc) if t is not None]
    snap = [t.clone() for t in caches()]
    for _ in range(3):
        S = [run.S[0] + q, run.S[1] + q, 0, 0]
        qsl = [0, q, 2 * q, 2 * q, 2 * q]
        st, md, kw = build(S, qsl)
        hid = torch.randn(bucket, d.hidden)
        hid[:q] = run.x[0][S[0] - q: S[0]]
        hid[q: 2 * q] = run.x[1][S[1] - q: S[1]]
        out = torch.full_like(hid, float("nan"))
        run.impl.forward(hid, run.kv, st, md["swa"], out, **kw)
        run.S[0], run.S[1] = S[0], S[1]
        tk = run.impl.last_topk if ratio == 4 else None
        check_step(run, [0, 1], [q, q], out, qsl[:3], S, tk)
        assert torch.equal(out[2 * q:], torch.zeros_like(out[2 * q:]))
    for b in range(2):
        check_caches(run, b)
    for a, b in zip(snap, caches()):
        assert torch.equal(a[0], b[0])  # block 0: never written
    # a dummy with tokens but no KV (S = 0 < q): named, nothing written
    st, md, kw = build([run.S[0] + q, run.S[1] + q, 0, 0], [i * q for i in range(B + 1)])
    snap = [t.clone() for t in caches()]
    hid = torch.randn(bucket, d.hidden)
    out = torch.zeros_like(hid)
    with pytest.raises(ValueError, match="graph-padding request 2"):
        run.impl.forward(hid, run.kv, st, md["swa"], out, **kw)
    for a, b in zip(snap, caches()):
        assert torch.equal(a, b)
    assert torch.equal(out, torch.zeros_like(out))


# ---- issue 26 (user defects): one source for the model's settings, every cache and table checked by name

KV_NAMES = ("compress_kv", "swa_kv", "state", "indexer_state", "indexer_k", "indexer_scale", "indexer_full")


def test_window_is_the_builders_and_a_layer_window_is_checked():
    # The window is set once, on the StepBuilder; a layer without one takes it, a layer given another is refused
    # by name before anything is written (it was silently ignored: 0.59 off with 32 against the builder's 16).
    d = dims(1, W=16)
    run = Run(d, torch.float32, nreq=1)
    assert run.sb.model["window"] == 16
    out, qsl, S = run.step([0], [40])
    check_step(run, [0], [40], out, qsl, S)  # the reference at W = 16
    assert run.last_md["swa"].window == 16 and run.last_md["swa"].ori_win_left == 15
    st, md, S, qsl = run.build([0], [1])
    hid = run.x[0][S[0] - 1: S[0]].clone()
    out = torch.zeros_like(hid)
    snap = run.swa.clone()
    with pytest.raises(ValueError, match=r"window=32 \(the layer's\) differs from the SWA group's window=16"):
        run.make_impl(window=32).forward(hid, run.kv, st, md["swa"], out)
    assert torch.equal(run.swa, snap) and torch.equal(out, torch.zeros_like(out))
    run.make_impl(window=16).forward(hid, run.kv, st, md["swa"], out)  # the same window: accepted
    run.S[0] = S[0]
    check_step(run, [0], [1], out, qsl, S)
    with pytest.raises(ValueError, match="window must be >= 0"):
        run.make_impl(window=-1)
    with pytest.raises(ValueError, match="window must be positive"):
        aar.dsa.StepBuilder(max_num_reqs=1, max_num_tokens=8, cos_table=run.cos, sin_table=run.sin, window=0)
    # the groups take no window (nor heads, indexer or DSpark settings) of their own
    with pytest.raises(TypeError):
        aar.dsa.GroupBuilder(run.sb, kind="swa", cache_block_size=CBS, num_blocks=run.nb, window=16)


@pytest.mark.parametrize("entry", range(6))
def test_a_cache_short_of_its_groups_blocks_is_named_before_any_write(entry):
    # Every cache of the tuple against its group's num_blocks (e.g. swa_kv=cache[:3] wrote some tokens and dropped
    # others; a short indexer_k was blamed on kv_cache[5]).
    d = dims(4)
    run = Run(d, torch.float32, nreq=1)
    run.step([0], [20])
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][S[0] - 9: S[0]].clone()
    out = torch.zeros_like(hid)
    kv = list(run.kv)
    kv[entry] = kv[entry][: run.nb - 1]
    group = {0: "attention", 1: "swa", 2: "compressor_state", 3: "indexer_state"}.get(entry, "indexer_cache")
    snap = [t.clone() for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc)]
    msg = (rf"kv_cache\[{entry}\] \({KV_NAMES[entry]}\) has {run.nb - 1} blocks, fewer than metadata\.{group}'s "
           rf"num_blocks={run.nb}")
    with pytest.raises(ValueError, match=msg):
        run.impl.forward(hid, kv, st, md["swa"], out, **group_kw(4, md, st))
    for a, b in zip(snap, (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc)):
        assert torch.equal(a, b)
    assert torch.equal(out, torch.zeros_like(out))
    # more blocks than the group's are fine (the table addresses [0, num_blocks))
    kv = list(run.kv)
    kv[1] = torch.cat([run.swa, run.swa[:1]])
    run.impl.forward(hid, kv, st, md["swa"], out, **group_kw(4, md, st))


def test_the_full_indexer_view_short_of_blocks_is_named():
    from _dsa_harness import LayerRun

    run = LayerRun(dims(4), "a5_bf16", torch.float32, nreq=1, max_blocks=8)
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][:9].clone()
    out = torch.zeros_like(hid)
    kv = list(run.kv)
    kv[6] = kv[6][: run.nb - 1]
    snap = [t.clone() for t in run.caches()]
    with pytest.raises(ValueError, match=rf"kv_cache\[6\] \(indexer_full\) has {run.nb - 1} blocks"):
        run.impl.forward(hid, kv, st, md["swa"], out, **group_kw(4, md, st))
    assert all(torch.equal(a, b) for a, b in zip(snap, run.caches()))


@pytest.mark.parametrize("kind", ["c4_kv", "c4_indexer_k"])
def test_a_block_id_past_the_cache_in_a_read_column_is_refused_at_build(kind):
    # The C4 KV and indexer-key groups' kernels read every compressed row before S / 4 (attention over the top-k,
    # the indexer over all keys), not only the rows the step writes: an id at or past num_blocks there was
    # accepted, and the forward wrote the SWA and state caches and the top-k buffer before a kernel failed (on an
    # NPU: read out of bounds). Now the group build refuses it by name, and nothing of the step is written.
    d = dims(4)
    run = Run(d, torch.float32, nreq=2, use_topk=True)
    run.impl = run.make_impl(use_index_cache=True)
    run.step([0, 1], [150, 60])
    run.step([0, 1], [1, 1])  # request 0 at 151 positions: compressed rows [0, 37) in columns 0..1; none written
    snap = [t.clone() for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc, run.topk.buffer)]
    good = run.tables[kind].clone()
    run.tables[kind][0, 0] = run.nb  # a column the step reads but does not write
    S = list(run.S)
    with pytest.raises(ValueError, match=rf"block_table\[0\]\[0\]={run.nb} is out of range \[0, "
                                         rf"num_blocks={run.nb}\) \(request 0: the attention / indexer reads its "
                                         rf"compressed rows \[0, 38\)"):
        run.step([0, 1], [1, 1])
    assert run.S == S
    for a, b in zip(snap, (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc, run.topk.buffer)):
        assert torch.equal(a, b)
    run.tables[kind][0, 0] = -1
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]=-1 is out of range"):
        run.step([0, 1], [1, 1])
    run.tables[kind] = good
    out, qsl, S = run.step([0, 1], [1, 1])
    check_step(run, [0, 1], [1, 1], out, qsl, S, run.impl.last_topk)


def test_compress_ratio_and_topk_buffer_sizes_named():
    d = dims(1)
    w = ref.make_dsa_weights(d, torch.float32, torch.Generator().manual_seed(1))
    kw = dict(hidden_size=64, num_heads=4, head_dim=64, rope_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16)
    for r in (0, 2, 16):
        with pytest.raises(ValueError, match=rf"compress_ratio={r} is not a DSA layer ratio: the supported ones are "
                                             r"1 \(sliding window only\), 4 \(C4\) and 128 \(C128\)"):
            aar.dsa.Impl(w, compress_ratio=r, **kw)
    assert aar.dsa.Impl(w, **kw).compress_ratio == 1
    with pytest.raises(ValueError, match="max_num_tokens=1000000000000 x index_topk=2048 entries exceed the top-k "
                                         "buffer's bound of 2147483647"):
        aar.sfa.TopkBuffer(10**12, 2048)
    with pytest.raises(ValueError, match="max_num_tokens=4611686018427387904 x index_topk=4 entries exceed"):
        aar.sfa.TopkBuffer(2**62, 4)  # the product overflows int64
    with pytest.raises(ValueError, match="max_num_tokens must be positive, got 0"):
        aar.sfa.TopkBuffer(0, 8)
    with pytest.raises(ValueError, match="index_topk must be positive, got -3"):
        aar.sfa.TopkBuffer(8, -3)
    b = aar.sfa.TopkBuffer(1 << 16, 64)  # its views are made on demand, at stable addresses
    v = b.view(5)
    assert v.shape == (5, 1, 64) and b.view(1 << 16).shape == (1 << 16, 1, 64)
    assert b.view(5).data_ptr() == v.data_ptr()


def test_non_metadata_arguments_are_type_errors():
    d = dims(4)
    run = Run(d, torch.float32, nreq=1)
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][:9].clone()
    out = torch.zeros_like(hid)
    full = group_kw(4, md, st)
    with pytest.raises(TypeError, match="step must be an aar.dsa.StepMetadata .* got .*GroupMetadata"):
        run.impl.forward(hid, run.kv, md["swa"], md["swa"], out, **full)
    with pytest.raises(TypeError, match="indexer_state must be an aar.dsa.GroupMetadata .* got str"):
        run.impl.forward(hid, run.kv, st, md["swa"], out, **dict(full, indexer_state="c4_indexer_state"))
    kv = list(run.kv)
    kv[3] = "state"
    with pytest.raises(TypeError, match=r"kv_cache\[3\] must be a torch.Tensor or None, got str"):
        run.impl.forward(hid, kv, st, md["swa"], out, **full)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_route_layer_result_is_forwards_metadata(ratio):
    # What route_layer returns goes to forward as it is (routed once, e.g. once per step and ratio for all the
    # layers of that ratio): the same outputs and caches as the form that takes the step and the groups.
    d = dims(ratio)
    a, b = Run(d, torch.float32, nreq=2, seed=5), Run(d, torch.float32, nreq=2, seed=5)
    for reqs, qlens in [([0, 1], [37, 20]), ([0, 1], [1, 1]), ([1, 0], [1, 9])]:
        oa, qsl, S = a.step(reqs, qlens)
        ob, _, _ = b.step(reqs, qlens, routed=True)
        assert torch.equal(oa, ob)
        check_step(b, reqs, qlens, ob, qsl, S, b.impl.last_topk if ratio == 4 else None)
    for ca, cb in zip((a.swa, a.cmp, a.state, a.istate, a.ik, a.isc), (b.swa, b.cmp, b.state, b.istate, b.ik, b.isc)):
        assert (ca is None and cb is None) or torch.equal(ca, cb)
    # keywords, and one routing for two layers of the ratio
    st, md, S, qsl = b.build([0], [1])
    routed = aar.dsa.route_layer(ratio, st, md)
    hid = b.x[0][S[0] - 1: S[0]].clone()
    o1, o2 = torch.zeros_like(hid), torch.zeros_like(hid)
    b.impl.forward(hid, b.kv, metadata=routed, output=o1)
    assert routed.step is st and routed.swa is md["swa"]
    other = {1: 4, 4: 128, 128: 1}[ratio]
    with pytest.raises(ValueError, match=f"metadata was routed for compress_ratio {ratio} but the layer's is {other}"):
        Run(dims(other), torch.float32, nreq=1).impl.forward(hid, b.kv, routed, o2)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_small_model_served_from_the_runtimes_cache_shapes(ratio):
    # A model other than DeepSeek-V4's sizes (head_dim 64, rope 16, indexer 2 x 32, window 8): its seven cache shapes
    # come from the runtime (the step builder's model settings -> GroupBuilder.cache_spec, the same as
    # aar.dsa.cache_spec for these dims); served end to end against the float64 reference.
    d = dims(ratio, n_idx=2)
    run = Run(d, torch.float32, nreq=2)
    assert run.sb.cache_dims == dict(head_dim=64, rope_dim=16, index_head_dim=32)
    for kd in aar.dsa.layer_cache_kinds(4) + ["c128_kv", "c128_state"]:
        sp = aar.dsa.cache_spec(kd, CBS, head_dim=64, rope_dim=16, index_head_dim=32, num_blocks=run.nb)
        if kd in run.gb:
            assert run.gb[kd].cache_spec["shape"] == sp["shape"]
    spec = lambda kd: run.gb[kd].cache_spec
    assert list(run.swa.shape) == spec("swa")["shape"] == [run.nb, 32, 1, 64]
    if ratio == 4:
        assert list(run.state.shape) == spec("c4_attn_state")["shape"] == [run.nb, 2, 4 * 64]
        assert list(run.istate.shape) == spec("c4_indexer_state")["shape"] == [run.nb, 2, 4 * 32]
        assert list(run.ik.shape) == spec("c4_indexer_k")["shape"] == [run.nb, 32, 1, 32]
        assert list(run.isc.shape) == spec("c4_indexer_k")["scale_shape"] == [run.nb, 32, 1]
    if ratio == 128:
        assert list(run.state.shape) == spec("c128_state")["shape"] == [run.nb, 8, 2 * 64]
    for reqs, qlens in [([0, 1], [130, 21]), ([0, 1], [1, 1]), ([1, 0], [1, 3]), ([0, 1], [1, 1])]:
        out, qsl, S = run.step(reqs, qlens)
        tk = run.impl.last_topk if ratio == 4 else None
        if tk is not None:
            check_topk(run, reqs, qlens, qsl, S, tk)
        check_step(run, reqs, qlens, out, qsl, S, tk)
    for b in range(2):
        check_caches(run, b)
