# The DSA layer forward (aar.dsa.Impl, dsa/impl.h) over multi-step runs with the
# metadata builders, against the float64 reference tests/python/_dsa_reference.py
# (spec sparse.md 1.6, 6.3, 6.8): outputs, and the SWA / compressed / indexer
# cache rows after each step. The A2 plan (bf16 rows, int8 indexer).
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import group_kw, slot_rows

F64 = torch.float64
CBS = 32  # cache block size (spec 6.2 table row 32)
MAXPOS = 1024


def spec(kind):
    return aar.dsa.cache_spec(kind, CBS, device_kind="a2", model_dtype="bfloat16")


class Run:
    """One layer, its caches and builders, requests with fixed token streams."""

    def __init__(self, d, dtype, nreq, k=0, seed=0, max_blocks=200, use_topk=False, dspark=0):
        self.d, self.dtype = d, dtype
        g = torch.Generator().manual_seed(seed)
        self.w = ref.make_dsa_weights(d, dtype, g)
        self.cos, self.sin = ref.rope_tables(MAXPOS, d.R)
        self.x = [torch.randn(400, d.hidden, generator=g, dtype=F64).to(dtype) for _ in range(nreq)]
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin,
                                      num_speculative_tokens=k)
        r = d.ratio
        kinds = ["swa"]
        if r > 1:
            kinds += ["c4_kv", "c4_attn_state"] if r == 4 else ["c128_kv", "c128_state"]
        if r == 4:
            kinds += ["c4_indexer_k", "c4_indexer_state"]
        self.kinds = kinds
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables = {}, {}
        for kd in kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, device_kind="a2",
                                               model_dtype="bfloat16", max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb, window=d.W, num_heads_q=d.N, index_topk=d.K,
                                               index_n_heads=d.n_idx, index_head_dim=d.Di,
                                               dspark_num_spec=dspark if kd == "swa" else 0)
            # request b owns blocks [1 + b * max_blocks, ...): block 0 stays unused
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
        rows = lambda kd: spec(kd)["storage_block_size"]
        self.swa = torch.zeros(self.nb, rows("swa"), 1, d.D, dtype=dtype)
        self.cmp = self.state = self.istate = self.ik = self.isc = None
        if r > 1:
            ck, sk = ("c4_kv", "c4_attn_state") if r == 4 else ("c128_kv", "c128_state")
            self.cmp = torch.zeros(self.nb, rows(ck), 1, d.D, dtype=dtype)
            self.state = torch.zeros(self.nb, rows(sk), 2 * d.coff * d.D, dtype=torch.float32)
        if r == 4:
            self.istate = torch.zeros(self.nb, rows("c4_indexer_state"), 4 * d.Di, dtype=torch.float32)
            self.ik = torch.zeros(self.nb, rows("c4_indexer_k"), 1, d.Di, dtype=torch.int8)
            self.isc = torch.zeros(self.nb, rows("c4_indexer_k"), 1, dtype=torch.float16)
        self.kv = aar.dsa.compose_kv_cache(compress_kv=self.cmp, swa_kv=self.swa, state=self.state,
                                           indexer_state=self.istate, indexer_k=self.ik, indexer_scale=self.isc)
        self.topk = aar.sfa.TopkBuffer(512, d.K) if use_topk else None
        self.impl = self.make_impl()
        self.S = [0] * nreq

    def make_impl(self, **kw):
        d = self.d
        return aar.dsa.Impl(self.w, hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R,
                            q_lora_rank=d.q_lora, window=d.W, compress_ratio=d.ratio, index_n_heads=d.n_idx,
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
        else:  # spec 6.5 draft mode: SWA-only layers, the draft lane `draft`
            st = self.sb.build_for_drafting(*args, draft, num_input_tokens=qsl[-1] + pad)
            md = {kd: self.gb[kd].build_for_drafting(st, self.tables[kd][reqs].contiguous(), draft)
                  for kd in self.kinds}
        return st, md, S, qsl

    def step(self, reqs, qlens, impl=None, pad=0, draft=None):
        st, md, S, qsl = self.build(reqs, qlens, draft, pad)
        self.last_md = md
        hid = torch.cat([self.x[b][S[i] - qlens[i]: S[i]] for i, b in enumerate(reqs)]
                        + [torch.zeros(pad, self.d.hidden, dtype=self.dtype)])
        out = torch.full_like(hid, float("nan"))
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
    # the indexer group's QLI blob (spec 6.5 step 3) was made for other indexer dims
    assert md["c4_indexer_k"].qli_metadata_filled
    other = aar.dsa.GroupBuilder(run.sb, kind="c4_indexer_k", cache_block_size=CBS, max_blocks_per_req=200,
                                 num_blocks=run.nb, index_topk=d.K, index_n_heads=d.n_idx + 1, index_head_dim=d.Di)
    st2 = run.sb.build(torch.tensor([0, 9], dtype=torch.int32), torch.tensor([9], dtype=torch.int32))
    md2 = {kd: run.gb[kd].build(st2, run.tables[kd][[0]].contiguous()) for kd in run.kinds}
    bad_ig = other.build(st2, run.tables["c4_indexer_k"][[0]].contiguous())
    with pytest.raises(ValueError, match="index_n_heads"):
        run.impl.forward(hid, run.kv, st2, md2["swa"], out, attention=md2["c4_kv"],
                         compressor_state=md2["c4_attn_state"], indexer_cache=bad_ig,
                         indexer_state=md2["c4_indexer_state"])
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
    # spec 6.6 / 6.5 "DSpark non-causal" / 6.8 (ratio <= 1: ori_sparse_indices): every draft row attends to the W
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
    # The batches a captured decode bucket would replay (spec 6.5 step 3, 11.13): B requests of which
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
