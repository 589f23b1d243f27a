# The DSA layer forward (aar.dsa.Impl) and builders on the A5 + BF16 plan (docs/design/dsa.md §4.2 "A5 + BF16"):
# SparseFlashMla (CANN cann_ops_transformer::sparse_flash_mla + _metadata) over PA_BBND bf16 rows of 512, the SWA
# and compressed KV written by in-place npu_scatter_nd_update_ with (block, offset) pairs over the valid rows only,
# the A5 fp8 indexer flow, the BF16 grouped-bmm o_proj. And the issue's "every plan (A2/A3, A5 FP8, A5 BF16
# SparseFlashMla) giving the same results within quantisation error" on the same weights and steps.
#
# References, all float64: _dsa_reference.dsa_layer (and its cache rows) written from docs/design/dsa.md §1.1; for the A5 fp8 plan
# the reference over the rows decoded from its caches (test_dsa_a5.ref_q_layer). Tolerances: fp32 2e-5 and bf16
# 3e-2 relative to the output's magnitude (the A2 tests' own, tests/python/test_dsa.py); across plans, the A5 fp8
# allowance is the measured float64 quantisation effect |ref_q - ref| per element plus twice the bf16 tolerance
# (test_dsa_a5.py explains why it is measured, never guessed).
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ascend_attn_rt as aar
import _dsa_reference as ref
import test_dsa_a5 as a5t
from _dsa_harness import LayerRun, group_kw
# The A5 + BF16 plan has plain rows: the A2 tests' small dims and tolerances (unlike the fp8 rows' D 512 / R 64).
from test_dsa import dims, tol

F64 = torch.float64
FP8 = torch.float8_e4m3fn
COT = torch.ops.ascend_cpu_cot
CBS = 32
DT = [torch.float32, torch.bfloat16]




def cmp_kind(ratio):
    return "c4_kv" if ratio == 4 else "c128_kv"


class OpLog(TorchDispatchMode):
    """Records the dispatcher calls (name, args, kwargs) the C++ layer makes."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((str(func), args, kwargs))
        return func(*args, **kwargs)

    def named(self, op):
        return [(a, kw) for name, a, kw in self.calls if name.split(".")[1] == op]


def check_step(run, reqs, qlens, out, qsl, S):
    """Outputs against the float64 layer (C4: given the run's own selection, checked by check_topk)."""
    d = run.d
    at, rt = tol(run.dtype)
    for i, b in enumerate(reqs):
        o = out[qsl[i]: qsl[i + 1]].to(F64)
        tk = run.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64) if d.ratio == 4 else None
        want = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin, topk=tk)
        torch.testing.assert_close(o, want, atol=at * max(1.0, want.abs().max().item()), rtol=rt)


def check_caches(run, b):
    """The SWA / compressed bf16 rows against the float64 rows, nothing past them; the fp8 indexer rows (per-row
    fp32 scale amax / 448) against the float64 indexer keys."""
    d = run.d
    at, rt = tol(run.dtype)
    S = run.S[b]
    xs = run.x[b][:S]
    pairs = [("swa", run.swa, ref.swa_rows(d, run.w, xs, run.cos, run.sin))]
    if d.ratio > 1:
        pairs.append((cmp_kind(d.ratio), run.cmp, ref.compressed_kv_rows(d, run.w, xs, run.cos, run.sin)))
    for kd, cache, want in pairs:
        n = want.shape[0]
        torch.testing.assert_close(run.slot_rows(cache, kd, b, n).to(F64), want, atol=at * 4, rtol=rt)
        rows = cache.shape[1]
        assert cache[run.tables[kd][b][n // rows], n % rows].abs().sum() == 0, kd  # nothing beyond
    if d.ratio == 4:
        k = ref.indexer_k_rows(d, run.w, xs, run.cos, run.sin)
        n = k.shape[0]
        kq = run.slot_rows(run.ik, "c4_indexer_k", b, n).to(F64)
        sc = run.slot_rows(run.isc.unsqueeze(-1), "c4_indexer_k", b, n).to(F64)
        amax = k.abs().amax(-1, keepdim=True)
        assert bool(((sc - amax / 448).abs() <= 0.05 * amax / 448 + 1e-12).all())
        assert bool(((kq * sc - k).abs() <= k.abs() * 2.0 ** -4 + sc * 2.0 ** -9 + 0.02 * amax + 1e-6).all())


def check_calls(run, log, md, S):
    """The plan's operators with the adapter's arguments: one sparse_flash_mla call (no sharedkv one), PA_BBND,
    seqused_ori_kv = S, compressed layers' S // r and S % r from the builder, the builder's blob, no cu_seqlens
    extras; the KV writes are in-place npu_scatter_nd_update_ calls over the groups' valid rows, never a block -1
    pair; the indexer writes through indexer_compress_epilog_v2 (the A5 fp8 flow)."""
    d = run.d
    assert not log.named("npu_sparse_attn_sharedkv") and not log.named("npu_kv_quant_sparse_attn_sharedkv")
    assert not log.named("npu_scatter_nd_update_v2") and not log.named("kv_compress_epilog")
    (args, kw), = log.named("sparse_flash_mla")
    common = md[cmp_kind(d.ratio)] if d.ratio > 1 else md["swa"]
    assert kw["layout_kv"] == "PA_BBND" and kw["layout_q"] == "TND"
    assert kw["seqused_ori_kv"].tolist() == S
    assert kw.get("cu_seqlens_ori_kv") is None and kw.get("cu_seqlens_cmp_kv") is None
    assert torch.equal(kw["metadata"], common.sas_metadata) and common.sas_metadata_filled
    assert kw.get("cmp_ratio", 1) == max(d.ratio, 1)  # the schema default (1) is left out of kwargs
    if d.ratio > 1:
        assert kw["seqused_cmp_kv"].tolist() == [s // d.ratio for s in S]
        assert kw["cmp_residual_kv"].tolist() == [s % d.ratio for s in S]
        assert kw["seqused_cmp_kv"].data_ptr() == common.seqused_cmp_kv.data_ptr()  # the staged buffer
    else:
        assert kw.get("seqused_cmp_kv") is None and kw.get("cmp_residual_kv") is None
    writes = log.named("npu_scatter_nd_update_")
    want = [md["swa"].num_valid_rows]
    if d.ratio > 1 and md[cmp_kind(d.ratio)].num_valid_rows > 0:
        want.append(md[cmp_kind(d.ratio)].num_valid_rows)
    assert [a[1].shape[0] for a, _ in writes] == want
    for a, _ in writes:
        idx, upd = a[1], a[2]
        assert idx.shape[1] == 2 and bool((idx >= 0).all()), idx
        assert upd.shape == (idx.shape[0], 1, d.D)
    assert len(log.named("indexer_compress_epilog_v2")) == (1 if d.ratio == 4 else 0)


STEPS = {
    # prefill (two requests), chunked prefill over steps, a mixed step, decodes
    1: [([0, 1], [13, 5]), ([0, 1], [7, 20]), ([0, 1, 2], [1, 1, 9]), ([0, 1, 2], [1, 1, 1]),
        ([0, 2, 1], [1, 1, 6])],
    # request 0: 300 tokens in chunks crossing two compressed rows; request 1 one prefill then decodes
    128: [([0], [90]), ([0, 1], [50, 129]), ([1, 0], [1, 100]), ([1, 0], [1, 60]), ([1, 0], [1, 1])],
    4: [([0], [23]), ([0, 1], [18, 10]), ([0, 1], [1, 1]), ([0, 1], [1, 14]), ([1, 0], [1, 9])],
}


@pytest.mark.parametrize("dtype", DT, ids=["fp32", "bf16"])
@pytest.mark.parametrize("ratio", [1, 128, 4], ids=["swa", "c128", "c4"])
def test_sfmla_plan_against_reference_multi_step(ratio, dtype):
    d = dims(ratio)
    run = LayerRun(d, "a5_bf16", dtype, nreq=3)
    for reqs, qlens in STEPS[ratio]:
        with OpLog() as log:
            out, qsl, S = run.step(reqs, qlens)
        check_calls(run, log, run.last_md, S)
        if ratio == 4:
            assert run.impl.last_topk.shape == (sum(qlens), 1, d.K)
            a5t.check_topk(run, reqs, qlens, qsl, S)  # the fp8 indexer's selection (fp8-quantised float64 scores)
        check_step(run, reqs, qlens, out, qsl, S)
        for b in reqs:
            check_caches(run, b)
    # the SWA, compressed and state caches are the weights' dtype / float32; the indexer the A5 fp8 one
    assert run.swa.dtype == dtype and (run.cmp is None or run.cmp.dtype == dtype)
    if ratio == 4:
        assert run.ik.dtype == FP8 and run.isc.dtype == torch.float32


@pytest.mark.parametrize("ratio", [1, 4, 128], ids=["swa", "c4", "c128"])
def test_sfmla_speculative_decode(ratio):
    # MTP: 3 tokens per request per step (num_speculative_tokens 2: short extends count as decodes), a rejected
    # draft rolls the context back by one (its rows are written again)
    d = dims(ratio)
    run = LayerRun(d, "a5_bf16", torch.float32, nreq=2, k=2, seed=1)
    out, qsl, S = run.step([0, 1], [30, 126])
    check_step(run, [0, 1], [30, 126], out, qsl, S)
    for step in range(4):
        if step == 2:
            run.S = [s - 1 for s in run.S]  # one rejected token each
        st, md, S, qsl = run.build([0, 1], [3, 3])
        assert st.num_decodes == 2 and st.num_prefills == 0
        with OpLog() as log:
            out, qsl, S = run.step([0, 1], [3, 3])
        check_calls(run, log, run.last_md, S)
        if ratio == 4:
            a5t.check_topk(run, [0, 1], [3, 3], qsl, S)
        check_step(run, [0, 1], [3, 3], out, qsl, S)
        for b in range(2):
            check_caches(run, b)


@pytest.mark.parametrize("ratio", [1, 4, 128], ids=["swa", "c4", "c128"])
def test_kv_scatter_writes_only_valid_rows(ratio):
    # A graph-padded decode batch: 2 real requests, 2 padding requests WITH tokens (seq_len >= tokens: the layer
    # accepts them; their zeroed table rows point at block 0) and 3 padding tokens past them. The builder's token
    # slot mapping has (-1, -1) on every skip row (docs/design/dsa.md §4.2); npu_scatter_nd_update_ gets only the valid prefix
    # (never a block -1 pair: its documented indices may not be out of range); every cache row other than the
    # real requests' new ones is unchanged, block 0 above all. The A2 plan on the same batch (its v2 scatter skips
    # (-1, bs-1) rows itself) writes the same rows.
    d = dims(ratio)
    runs = {p: LayerRun(d, p, torch.float32, nreq=2, seed=2) for p in ("a5_bf16", "a2")}
    first = {1: [21, 10], 4: [39, 29], 128: [127, 40]}[ratio]  # the decode completes a compressed row (C4, C128)
    for r in runs.values():
        r.step([0, 1], first)
        r.x_pad = torch.randn(7, d.hidden, generator=torch.Generator().manual_seed(9))
    B, nra, qlens, bucket = 4, 2, [1, 1, 4, 2], 11
    outs, topk = {}, {}
    for p, run in runs.items():
        S = [run.S[0] + 1, run.S[1] + 1, 4, 2]
        qsl = [0, 1, 2, 6, 8]
        st = run.sb.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32),
                          num_reqs_actual=nra, num_input_tokens=bucket)
        md = {kd: run.gb[kd].build(st, run.tables[kd][[0, 1, 0, 1]].contiguous()) for kd in run.kinds}
        hid = torch.cat([run.x[0][S[0] - 1: S[0]], run.x[1][S[1] - 1: S[1]], run.x_pad[:4],
                         torch.zeros(bucket - 6, d.hidden)])
        snap = [t.clone() for t in run.caches()]
        out = torch.full_like(hid, float("nan"))
        with OpLog() as log:
            run.impl.forward(hid, run.kv, st, md["swa"], out, **group_kw(ratio, md, st))
        run.S[0], run.S[1] = S[0], S[1]
        sw = md["swa"]
        slots = torch.tensor(sw.slot_mapping_list).view(-1, 2)
        assert sw.num_valid_rows == 2 and slots.shape[0] == bucket
        assert bool((slots[:2, 0] >= 0).all())
        skip = [-1, -1] if p == "a5_bf16" else [-1, CBS - 1]
        assert slots[2:].tolist() == [skip] * (bucket - 2), p
        if p == "a5_bf16":
            check_calls(run, log, md, S)
        # only the real requests' new rows changed in the SWA and compressed caches
        for kd, cache, old in [("swa", run.swa, snap[0])] + ([(cmp_kind(ratio), run.cmp, snap[1])] if ratio > 1
                                                            else []):
            rows = cache.shape[1]
            changed = set(map(tuple, (cache != old).any(-1).any(-1).nonzero().tolist()))
            want = set()
            for b in range(nra):
                if kd == "swa":
                    new = [S[b] - 1]
                else:
                    new = list(range((S[b] - 1) // ratio, S[b] // ratio))
                for c in new:
                    want.add((int(run.tables[kd][b][c // rows]), c % rows))
            assert changed == want and all(blk != 0 for blk, _ in want), (p, kd, changed, want)
            assert torch.equal(cache[0], old[0]), (p, kd)  # block 0 (the padding rows' target) untouched
        outs[p] = out
        topk[p] = run.impl.last_topk[:2, 0] if ratio == 4 else None
        check_step(run, [0, 1], [1, 1], out, qsl[:3], S)
        if ratio > 1:
            assert md[cmp_kind(ratio)].num_valid_rows == sum(S[b] // ratio - (S[b] - 1) // ratio for b in range(2))
    for b in range(2):
        check_caches(runs["a5_bf16"], b)
    # both plans wrote the same KV rows
    for x, y in zip(runs["a5_bf16"].caches()[:2], runs["a2"].caches()[:2]):
        assert torch.equal(x, y)
    # the same outputs (C4: where both plans' indexers, A2 int8 and A5 fp8, select the same rows)
    rows = [j for j in range(2) if ratio != 4 or set(topk["a5_bf16"][j].tolist()) == set(topk["a2"][j].tolist())]
    torch.testing.assert_close(outs["a5_bf16"][rows], outs["a2"][rows], atol=1e-5, rtol=1e-5)


def test_builder_sfmla_lengths_and_metadata_blob():
    # docs/design/dsa.md §3.5 / §4.2: the compressed groups stage S // r and S % r at stable addresses and fill the SAS blob with
    # sparse_flash_mla_metadata through the adapter (seqused_ori_kv, max_seqlen_ori_kv, the compressed lengths,
    # max_seqlen_cmp_kv = max // r, PA_BBND, no device); decode passes cu_seqlens_ori_kv = [0, cumsum(S)] (A5).
    cos, sin = ref.rope_tables(1024, 16)
    sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=cos, sin_table=sin,
                             compress_cos_table=cos, compress_sin_table=sin, num_heads_q=16, index_topk=512,
                             window=128)
    kw = dict(device_kind="a5", cache_dtype="bfloat16", num_blocks=4096, max_blocks_per_req=64)
    gbs = {kd: aar.dsa.GroupBuilder(sb, kind=kd, **kw) for kd in ("swa", "c4_kv", "c128_kv", "c4_attn_state")}
    table = torch.arange(1, 1 + 3 * 64, dtype=torch.int32).view(3, 64)
    ptrs = {}
    for qlens, S in [([1, 1, 1], [100, 300, 500]), ([1, 1, 1], [101, 301, 501]), ([5, 9, 3], [5, 309, 3])]:
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        st = sb.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32))
        prefill = st.has_prefill
        for kd, gb in gbs.items():
            gm = gb.build(st, table)
            ratio = {"c4_kv": 4, "c128_kv": 128}.get(kd, 1)
            if kd == "c4_attn_state":
                assert not gm.sas_metadata_filled and gm.seqused_cmp_kv is None
                continue
            assert gm.sas_metadata_filled
            args = dict(cu_seqlens_q=torch.tensor(qsl, dtype=torch.int32), seqused_ori_kv=torch.tensor(S).int(),
                        batch_size=3, max_seqlen_q=max(qlens), max_seqlen_ori_kv=max(S), ori_topk=0,
                        cmp_topk=512 if ratio == 4 else 0, cmp_ratio=ratio, ori_mask_mode=4, cmp_mask_mode=3,
                        ori_win_left=127, ori_win_right=0, layout_q="TND", layout_kv="PA_BBND", has_ori_kv=True,
                        has_cmp_kv=ratio > 1)
            cu = [0]
            for s in S:
                cu.append(cu[-1] + s)
            args["cu_seqlens_ori_kv"] = torch.tensor(qsl if prefill else cu, dtype=torch.int32)
            assert gm.cu_seqlens_cmp_kv is None
            if ratio > 1:
                assert gm.seqused_cmp_kv.tolist() == [s // ratio for s in S]
                assert gm.cmp_residual_kv.tolist() == [s % ratio for s in S]
                assert gm.max_seqlen_cmp_kv == max(S) // ratio
                args.update(seqused_cmp_kv=gm.seqused_cmp_kv.clone(), cmp_residual_kv=gm.cmp_residual_kv.clone(),
                            max_seqlen_cmp_kv=max(S) // ratio)
                p = (gm.seqused_cmp_kv.data_ptr(), gm.cmp_residual_kv.data_ptr())
                assert ptrs.setdefault(kd, p) == p  # stable for a given batch size
            else:
                assert gm.seqused_cmp_kv is None and gm.cmp_residual_kv is None and gm.max_seqlen_cmp_kv == 0
            assert torch.equal(gm.sas_metadata, COT.sparse_flash_mla_metadata(16, 1, 512, **args)), (kd, S)


def test_every_plan_same_results_within_quantisation_error():
    # The check over the three plans on the same weights, tokens and steps, for SWA, C128 and C4 layers
    # (the A5 fp8 rows need D 512 / R 64: test_dsa_a5's dims):
    #  - A5 + BF16 (SparseFlashMla) against the float64 layer within the bf16 tolerance;
    #  - A5 + BF16 against A2: the same bf16 KV rows bit for bit; the same output on SWA / C128 (only the attention
    #    operator differs: the same maths); C4 rows whose top-k agree within 2x the bf16 tolerance (A2's int8
    #    indexer may select differently from A5's fp8 one);
    #  - A5 + BF16 against A5 fp8: the same fp8 indexer flow (identical selection and indexer pages); outputs within
    #    the measured fp8 quantisation effect |ref_q - ref| plus 2x the bf16 tolerance;
    #  - A5 fp8 against its decoded-row reference, the float64 layer and A2 (test_dsa_a5.check_step).
    for ratio in (1, 128, 4):
        d = a5t.dims(ratio)
        runs = {"a5_bf16": LayerRun(d, "a5_bf16", torch.bfloat16, nreq=3, seed=4)}
        b16 = runs["a5_bf16"]
        for p in ("a2", "a5"):
            runs[p] = LayerRun(d, p, torch.bfloat16, nreq=3, w=b16.w, x=b16.x)
        a2, a5 = runs["a2"], runs["a5"]
        at, _ = tol(torch.bfloat16)
        for reqs, qlens in a5t.PLANS[ratio]:
            out = {p: r.step(reqs, qlens)[0] for p, r in runs.items()}
            qsl = [0]
            for q in qlens:
                qsl.append(qsl[-1] + q)
            S = [b16.S[b] for b in reqs]
            check_step(b16, reqs, qlens, out["a5_bf16"], qsl, S)
            a5t.check_step(a5, a2, reqs, qlens, out["a5"], out["a2"], qsl, S)
            if ratio == 4:
                assert torch.equal(b16.impl.last_topk, a5.impl.last_topk)
            else:
                assert torch.equal(out["a5_bf16"], out["a2"]), ratio
            for i, b in enumerate(reqs):
                o16, o2, o5 = (out[p][qsl[i]: qsl[i + 1]].to(F64) for p in ("a5_bf16", "a2", "a5"))
                tk = b16.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64) if ratio == 4 else None
                xs = b16.x[b][: S[i]]
                want = ref.dsa_layer(d, b16.w, xs, qlens[i], b16.cos, b16.sin, topk=tk)
                want_q = a5t.ref_q_layer(d, b16.w, xs, qlens[i], b16.cos, b16.sin, tk, *a5t.decoded_rows(a5, b, S[i]))
                bf = at * max(1.0, want.abs().max().item())
                qerr = (want_q - want).abs()
                assert bool(((o16 - o5).abs() <= qerr + 2 * bf).all()), (ratio, b)
                rows = range(qlens[i])
                if ratio == 4:
                    t2 = a2.impl.last_topk[qsl[i]: qsl[i + 1], 0]
                    t16 = b16.impl.last_topk[qsl[i]: qsl[i + 1], 0]
                    rows = [j for j in rows if set(t2[j].tolist()) == set(t16[j].tolist())]
                for j in rows:
                    assert bool(((o16[j] - o2[j]).abs() <= 2 * bf).all()), (ratio, b, j)
        # the caches: bf16 KV rows as A2's, the indexer pages as A5 fp8's (both bit for bit)
        assert torch.equal(b16.swa, a2.swa)
        if ratio > 1:
            # (the state caches are not compared: A5's C128 state pages hold half A2's rows, docs/design/dsa.md §2.1)
            assert torch.equal(b16.cmp, a2.cmp)
        if ratio == 4:
            assert torch.equal(b16.raw, a5.raw) and torch.equal(b16.istate, a5.istate)
        for b in range(3):
            check_caches(b16, b)


def test_bad_input_named_nothing_written():
    d = dims(4)
    run = LayerRun(d, "a5_bf16", torch.float32, nreq=1)
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][:9].clone()
    out = torch.zeros_like(hid)
    kw = group_kw(4, md, st)
    snap = [t.clone() for t in run.caches()]

    def untouched():
        for a, b in zip(snap, run.caches()):
            assert torch.equal(a, b)
        assert torch.equal(out, torch.zeros_like(out))

    def bad(i, t, match):
        kv = list(run.kv)
        kv[i] = t
        with pytest.raises(ValueError, match=match):
            run.impl.forward(hid, kv, st, md["swa"], out, **kw)

    rows = run.swa.shape[1]
    bad(1, torch.zeros(run.nb, rows, 1, 640, dtype=FP8), "swa_kv")            # the A5 fp8 plan's 640-byte rows
    bad(1, torch.zeros(run.nb, rows, 1, d.D, dtype=torch.bfloat16), "swa_kv")  # not the weights' dtype
    bad(1, torch.zeros(run.nb, 1, rows, d.D), "swa_kv")                         # (nb, 1, bs, D): not PA_BBND
    bad(0, torch.zeros(run.nb, rows, d.D), "compress_kv")                       # 3-D
    bad(0, torch.zeros(run.nb, rows, 1, 2 * d.D)[..., : d.D], "compress_kv")   # rows not dense
    bad(4, torch.zeros(run.nb, rows, 1, d.Di, dtype=torch.int8), "indexer_k")  # the A2 indexer dtype
    bad(5, torch.zeros(run.nb, rows, 1, dtype=torch.float16), "indexer_scale")
    with pytest.raises(ValueError, match="kv_cache has 6 entries"):  # the A2 tuple (no full indexer view)
        run.impl.forward(hid, list(run.kv)[:6], st, md["swa"], out, **kw)
    # a group under the A5 fp8 plan cannot hold this model's rows (its 640-byte rows are D 512 / R 64): refused
    # when it is made, by name
    with pytest.raises(ValueError, match="640-byte fp8 rows hold head_dim 512 and rope_dim 64, got head_dim=64"):
        aar.dsa.GroupBuilder(run.sb, kind="swa", cache_block_size=CBS, device_kind="a5", max_blocks_per_req=200,
                             num_blocks=run.nb)
    # groups built under other plans: no SparseFlashMla lengths (A2)
    for plan, kd, match in [("a2", "c4_kv", "seqused_cmp_kv / cmp_residual_kv")]:
        dk, cd = {"a2": ("a2", None)}[plan]
        other = aar.dsa.GroupBuilder(run.sb, kind=kd, cache_block_size=CBS, device_kind=dk, cache_dtype=cd,
                                     max_blocks_per_req=200, num_blocks=run.nb)
        st2 = run.sb.build(torch.tensor([0, 9], dtype=torch.int32), torch.tensor([9], dtype=torch.int32))
        md2 = {k: run.gb[k].build(st2, run.tables[k][[0]].contiguous()) for k in run.kinds}
        md2[kd] = other.build(st2, run.tables[kd][[0]].contiguous())
        with pytest.raises(ValueError, match=match):
            run.impl.forward(hid, run.kv, st2, md2["swa"], out, **group_kw(4, md2, st2))
    untouched()
    # float16 weights: not the plan's bf16 rows
    w16 = {k: (v.to(torch.float16) if v.dtype == torch.float32 and k != "attn_sink" else v) for k, v in run.w.items()}
    with pytest.raises(ValueError, match="float16"):
        LayerRun(d, "a5_bf16", torch.float16, nreq=1, w=w16)
    # a prefill step inside a graph capture: refused by name before anything runs (the plan's decode buckets are
    # captured: test_dsa_graph_plans.py)
    st, md, S, qsl = run.build([0], [9])
    g = aar.GraphParams("recording")
    with g.capture(1):
        with pytest.raises(NotImplementedError, match="graph capture takes DecodeOnly and SpecDecoding"):
            run.impl.forward(hid, run.kv, st, md["swa"], out, **group_kw(4, md, st))
    untouched()


def test_sfmla_dspark_non_causal_swa():
    # docs/design/dsa.md §3.4 / §5.1 (ratio <= 1): a step without prefill on an SWA group configured for DSpark passes
    # ori_sparse_indices (the builder's visible slots) and ori_win_left = W + num_spec - 1 through the adapter;
    # every draft row sees the W context tokens before its block and the whole block.
    ns = 3
    d = dims(1)
    run = LayerRun(d, "a5_bf16", torch.float32, nreq=3, k=ns, dspark=ns)
    at, rt = tol(torch.float32)
    out, qsl, S = run.step([0, 1, 2], [13, 5, 20])  # prefill: causal
    for reqs, qlens in [([0, 1, 2], [1, 3, 2]), ([2, 0, 1], [3, 3, 1])]:
        with OpLog() as log:
            out, qsl, S = run.step(reqs, qlens)
        (_, kw), = log.named("sparse_flash_mla")
        gm = run.last_md["swa"]
        assert kw["ori_win_left"] == d.W + ns - 1 == gm.ori_win_left
        assert torch.equal(kw["ori_sparse_indices"], gm.dspark_swa_indices[: qsl[-1]])
        for i, b in enumerate(reqs):
            want = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin, dspark=ns)
            torch.testing.assert_close(out[qsl[i]: qsl[i + 1]].to(F64), want,
                                       atol=at * max(1.0, want.abs().max().item()), rtol=rt)
    for b in range(3):
        check_caches(run, b)
