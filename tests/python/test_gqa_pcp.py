"""GQA prefill context parallelism (aar.cp.PcpMetadataBuilder / PcpAttentionImpl,
include/ascend_attn_rt/cp/gqa_pcp.h) over real gloo process groups (docs/design/cp.md §9).

Every rank regenerates the whole model input (Q of every query head, K/V of every position)
from one seed, feeds its local rows (builder.local_token_index) and checks each real row of
its output against a single-process float64 attention over the whole sequence (softmax over an
explicit causal mask). Three steps per scenario: fresh prefills that force padding
(q mod 2Wp != 0, a 1-token prompt), a mixed step (decodes, including one whose KV is on fewer
ranks than the group, a chunked prefill over cached context, a fresh prefill), then a
decode-only step. Collectives are counted per step against docs/design/cp.md §8 (with this runtime's PCP
all-to-all for the context partials, see the header) and the logs compared across ranks.

Layout (docs/design/cp.md §1.1 with TP = DCP): global rank = rp * Wd + rd; DCP groups are consecutive ranks,
PCP groups stride Wd.
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import pcp_dcp_groups as _groups, run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

BS = 16          # KV block size
D = 16           # head size (a multiple of 8: npu_attention_update)
MB = 4           # block-table columns per request
PROMPTS = [7, 16, 16, 1, 5, 1]  # request 2 is prefilled in two chunks (3 + 13); 4 arrives at step B, 5 at D

# (request, num_computed, q, still prefilling) per step, decodes first.
STEPS = [
    [(0, 0, 7, True), (1, 0, 16, True), (2, 0, 3, True), (3, 0, 1, True)],
    [(0, 7, 1, False), (1, 16, 1, False), (3, 1, 1, False), (2, 3, 13, True), (4, 0, 5, True)],
    [(0, 8, 1, False), (1, 17, 1, False), (3, 2, 1, False), (2, 16, 1, False), (4, 5, 1, False)],
    # A lone 1-token prompt: every rank but one has only padding (sharded) or the dummy row (replicated).
    [(5, 0, 1, True)],
]


# ----------------------------------------------------------------------------- model data and reference

def _final_lens(steps):
    """Each request's sequence length after the last step that schedules it."""
    out = {}
    for step in steps:
        for (r, c, q, _) in step:
            out[r] = max(out.get(r, 0), c + q)
    return [out[r] for r in range(len(out))]


def _data(hq_total, hkv, dtype, seed, steps=STEPS):
    g = torch.Generator().manual_seed(seed)
    lens = _final_lens(steps)
    lmax = max(lens) + 2
    q = [torch.randn(lmax, hq_total, D, generator=g).to(dtype) for _ in lens]
    k = [torch.randn(lmax, hkv, D, generator=g).to(dtype) for _ in lens]
    v = [torch.randn(lmax, hkv, D, generator=g).to(dtype) for _ in lens]
    return q, k, v


def _num_decodes(step, spec=0):
    """The leading decodes (docs/design/cp.md §3.2: q <= 1 + spec and not prefilling; the first other splits)."""
    for i, (_, _, q, pf) in enumerate(step):
        if q > 1 + spec or pf:
            return i
    return len(step)


def _reference(q, k, v, pos, scale):
    """float64 attention of q (n, H, D) at positions pos (n,) over k/v (L, Hkv, D), causal."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, 1)
    v = v.repeat_interleave(rep, 1)
    s = torch.einsum("nhd,lhd->hnl", q, k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= pos[:, None]  # (n, L)
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1), v)


def _expected_calls(mode, step, wp, wd, spec=0):
    """(pcp all_gather, pcp all_to_all, dcp all_gather, dcp all_to_all) of one layer (docs/design/cp.md §8)."""
    nd = _num_decodes(step, spec)
    np_ = len(step) - nd
    ctx = any(c > 0 for (_, c, q, pf) in step[nd:])
    if mode == "replicated":
        return (2 if np_ else 0, 0, 0, 0)
    ag = int(np_ > 0) + int(nd > 0 and wp > 1) + int(ctx and wp > 1)
    a2a = int(ctx and wp > 1)
    dg = (int(nd > 0) + int(ctx)) if wd > 1 else 0
    return (ag, a2a, dg, dg)


# ----------------------------------------------------------------------------- the case (runs in each rank)

def _case(rank, world, wp, wd, configs, steps=STEPS, spec=0):
    pcp_group, dcp_group = _groups(rank, wp, wd)
    rp, rd = rank // wd, rank % wd
    pcp = aar.cp.Comm(pcp_group, timeout_s=20.0, log=True)
    dcp = aar.cp.Comm(dcp_group, timeout_s=20.0, log=True) if wd > 1 else None
    report, logs, dlogs = [], [], []
    for (mode, dtype, h, hkv, interleave) in configs:
        hq_total = wd * h
        scale = 1.0 / math.sqrt(D)
        qa, ka, va = _data(hq_total, hkv, dtype, seed=11, steps=steps)
        nreq = len(_final_lens(steps))
        num_blocks = nreq * MB
        block_table_all = torch.arange(num_blocks, dtype=torch.int32).view(nreq, MB)
        builder = aar.cp.PcpMetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=MB, block_size=BS,
                                            num_blocks=num_blocks, pcp_size=wp, pcp_rank=rp, dcp_size=wd,
                                            dcp_rank=rd, interleave_size=interleave, kv_mode=mode,
                                            num_speculative_tokens=spec)
        layer = aar.cp.PcpAttentionImpl(h, D, pcp=pcp, dcp=dcp, num_kv_heads=hkv)
        kc = torch.zeros(num_blocks, BS, hkv, D, dtype=dtype)
        vc = torch.zeros_like(kc)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for si, step in enumerate(steps):
            reqs = [r for (r, _, _, _) in step]
            qlens = [q for (_, _, q, _) in step]
            qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
            seq = torch.tensor([c + q for (_, c, q, _) in step], dtype=torch.int32)
            pref = torch.tensor([pf for (_, _, _, pf) in step], dtype=torch.bool)
            bt = block_table_all[reqs].contiguous()
            md = builder.build(qsl, seq, bt, is_prefilling=pref)
            idx = builder.local_token_index.long()
            # Global step tensors (token order of the batch), this rank's heads of Q.
            gq = torch.cat([qa[r][c:c + q, rd * h:(rd + 1) * h] for (r, c, q, _) in step])
            gk = torch.cat([ka[r][c:c + q] for (r, c, q, _) in step])
            gv = torch.cat([va[r][c:c + q] for (r, c, q, _) in step])
            n = md.num_local_tokens
            assert idx.numel() == n
            real = idx >= 0
            # Padding rows carry large garbage: it must never reach a real row.
            junk = torch.Generator().manual_seed(100 + rank)
            lq = (torch.randn(n, h, D, generator=junk) * 50).to(dtype)
            lk = (torch.randn(n, hkv, D, generator=junk) * 50).to(dtype)
            lv = (torch.randn(n, hkv, D, generator=junk) * 50).to(dtype)
            lq[real], lk[real], lv[real] = gq[idx[real]], gk[idx[real]], gv[idx[real]]
            out = torch.full((n, h, D), float("nan"), dtype=dtype)
            pcp.reset_counters()
            if dcp is not None:
                dcp.reset_counters()
            layer.forward(lq, lk, lv, kc, vc, md, out)
            calls = (pcp.calls_of("all_gather"), pcp.calls_of("all_to_all_single"),
                     dcp.calls_of("all_gather") if dcp else 0, dcp.calls_of("all_to_all_single") if dcp else 0)
            assert calls == _expected_calls(mode, step, wp, wd, spec), (mode, si, calls)
            assert md.num_decodes == _num_decodes(step, spec), (mode, si)
            logs += [(op, tuple(shape), dt, dim) for (_, op, shape, dt, dim, _) in pcp.log]
            dlogs += [(op, tuple(shape), dt, dim) for (_, op, shape, dt, dim, _) in dcp.log] if dcp else []
            # Reference for every real local row.
            starts = qsl.tolist()
            worst = 0.0
            for row in torch.nonzero(real).flatten().tolist():
                t = int(idx[row])
                b = max(i for i in range(len(step)) if starts[i] <= t)
                r, c, _, _ = step[b]
                p = c + t - starts[b]
                ref = _reference(qa[r][p:p + 1, rd * h:(rd + 1) * h], ka[r][:p + 1], va[r][:p + 1],
                                 torch.tensor([p]), scale)[0]
                got = out[row].double()
                assert torch.isfinite(got).all(), (mode, si, row)
                err = (got - ref).abs().max().item()
                worst = max(worst, err)
                assert torch.allclose(got, ref, rtol=tol, atol=tol), (mode, str(dtype), si, row, t, err)
            # Every real token of the step is some rank's row exactly once (checked across ranks by the test).
            report.append((mode, str(dtype), si, sorted(idx[real].tolist()), worst))
        # The KV cache: sharded, this rank holds exactly the tokens it owns, at their local index;
        # replicated, every PCP rank holds every token.
        w, r_kv = (wp * wd, rp * wd + rd) if mode == "sharded" else (1, 0)
        for ri, lmax in enumerate(_final_lens(steps)):
            for x in range(lmax):
                if (x // interleave) % w != r_kv:
                    continue
                li = (x // (w * interleave)) * interleave + x % interleave
                slot = int(block_table_all[ri, li // BS]) * BS + li % BS
                assert torch.equal(kc.view(-1, hkv, D)[slot], ka[ri][x]), (mode, ri, x)
                assert torch.equal(vc.view(-1, hkv, D)[slot], va[ri][x]), (mode, ri, x)
    return report, logs, dlogs


def _run(wp, wd, configs, steps=STEPS, spec=0):
    res = run_ranks(wp * wd, _case, wp, wd, configs, steps, spec, deadline_s=120.0)
    # Every rank of a DCP group issued the same collectives, and so did every PCP rank (docs/design/cp.md §8).
    assert all(r[1] == res[0][1] for r in res)
    assert all(r[2] == res[0][2] for r in res)
    # For every step, the ranks of one DCP index cover every real token exactly once (sharded:
    # their head/tail rows and the replicated decodes; replicated: their segments).
    for rd in range(wd):
        ranks = [rp * wd + rd for rp in range(wp)]
        for k in range(len(res[0][0])):
            mode = res[0][0][k][0]
            tokens = sorted(t for r in ranks for t in res[r][0][k][3])
            si = res[0][0][k][2]
            nd = _num_decodes(steps[si], spec)
            td = sum(q for (_, _, q, _) in steps[si][:nd])
            total = sum(q for (_, _, q, _) in steps[si])
            # Decodes are computed by every PCP rank; split tokens by one.
            expect = sorted(list(range(td)) * wp + list(range(td, total)))
            assert tokens == expect, (mode, si)
    return res


SHARDED_GQA = [("sharded", torch.float32, 4, 2, 1), ("sharded", torch.bfloat16, 4, 2, 2),
               ("sharded", torch.float32, 4, 4, BS)]          # the last: MHA
SHARDED_DCP = [("sharded", torch.float32, 4, 1, 1), ("sharded", torch.bfloat16, 2, 1, 2),
               ("sharded", torch.float32, 2, 1, BS)]
REPLICATED = [("replicated", torch.float32, 4, 2, 1), ("replicated", torch.bfloat16, 4, 4, 1)]


def test_sharded_pcp2():
    _run(2, 1, SHARDED_GQA)


def test_sharded_pcp3():
    _run(3, 1, SHARDED_GQA[:2])


def test_sharded_pcp2_dcp2():
    _run(2, 2, SHARDED_DCP)


def test_sharded_pcp3_dcp2():
    _run(3, 2, SHARDED_DCP[:1])


def test_replicated_pcp2():
    _run(2, 1, REPLICATED)


def test_replicated_pcp3():
    _run(3, 1, REPLICATED)


# Speculative decode (num_speculative_tokens = 2, decode threshold 3; docs/design/cp.md §6.6): decodes of 2
# and 3 tokens replicated on every PCP rank, one decode row per token with its own local KV length.
SPEC = 2
SPEC_STEPS = [
    [(0, 0, 6, True), (1, 0, 13, True), (2, 0, 2, True), (3, 0, 1, True)],
    # 3- and 2-token decodes (request 3 has a one-token history: with I = 2 its first query has no key on
    # rank 1), a chunked prefill over context, a fresh prompt and a short prompt (a prefill by is_prefilling).
    [(0, 6, 3, False), (3, 1, 2, False), (2, 2, 3, False), (1, 13, 5, True), (4, 0, 4, True), (5, 0, 2, True)],
    # Decode-only speculative step, then one-token and two-token decodes side by side.
    [(0, 9, 3, False), (3, 3, 2, False), (2, 5, 2, False), (1, 18, 3, False), (4, 4, 3, False)],
    [(0, 12, 1, False), (1, 21, 2, False), (5, 2, 3, False)],
]


def test_spec_decode_pcp2():
    _run(2, 1, [("sharded", torch.float32, 4, 2, 1), ("sharded", torch.bfloat16, 4, 4, 2),
                ("replicated", torch.float32, 4, 2, 1), ("replicated", torch.bfloat16, 4, 4, 1)],
         steps=SPEC_STEPS, spec=SPEC)


def test_spec_decode_pcp2_dcp2():
    _run(2, 2, [("sharded", torch.float32, 4, 1, 1)], steps=SPEC_STEPS, spec=SPEC)


# ----------------------------------------------------------------------------- single-process checks

def test_config_errors():
    kw = dict(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16)
    with pytest.raises(RuntimeError, match="replicated"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=2, pcp_rank=0, dcp_size=2, dcp_rank=0, kv_mode="replicated")
    with pytest.raises(ValueError, match=r"num_speculative_tokens must be in \[0, 15\]"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=2, pcp_rank=0, num_speculative_tokens=16)
    with pytest.raises(ValueError, match="pcp_rank"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=2, pcp_rank=2)
    with pytest.raises(ValueError, match="interleave_size"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=2, pcp_rank=0, interleave_size=3)
    with pytest.raises(ValueError, match="kv_mode"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=2, pcp_rank=0, kv_mode="mrv3")
    with pytest.raises(ValueError, match="16 partials"):
        aar.cp.PcpMetadataBuilder(**kw, pcp_size=9, pcp_rank=0, dcp_size=2)


def test_build_rejects_bad_batches_and_keeps_previous_metadata():
    b = aar.cp.PcpMetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=2, block_size=16,
                                  num_blocks=8, pcp_size=2, pcp_rank=1)
    qsl = torch.tensor([0, 1, 6], dtype=torch.int32)
    seq = torch.tensor([9, 5], dtype=torch.int32)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    md = b.build(qsl, seq, bt)
    assert (md.num_decodes, md.num_prefills, md.num_local_tokens) == (1, 1, 1 + 4)
    before = md.padded_slot_mapping.clone()
    with pytest.raises(ValueError, match="smaller than its query length"):
        b.build(qsl, torch.tensor([9, 4], dtype=torch.int32), bt)
    with pytest.raises(ValueError, match="out of range"):
        b.build(qsl, seq, torch.tensor([[0, 1], [99, 3]], dtype=torch.int32))
    # A sharded cache over W = 2 needs ceil(local_len(40, 2, 1, 0) / 16) = 2 columns, not 3.
    md2 = b.build(qsl, torch.tensor([40, 5], dtype=torch.int32), bt)
    assert md2.is_current and not md.is_current
    with pytest.raises(ValueError, match="needs 3 blocks per DCP rank"):
        b.build(qsl, torch.tensor([80, 5], dtype=torch.int32), bt)
    assert md2.is_current
    assert torch.equal(before, before)


def _case_bad_input(rank, world):
    pcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    out = []
    for mode in ("sharded", "replicated"):
        b = aar.cp.PcpMetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=2, block_size=16,
                                      num_blocks=8, pcp_size=2, pcp_rank=rank, kv_mode=mode)
        other = aar.cp.PcpMetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=2, block_size=16,
                                          num_blocks=8, pcp_size=2, pcp_rank=1 - rank, kv_mode=mode)
        qsl = torch.tensor([0, 1, 10], dtype=torch.int32)
        seq = torch.tensor([5, 12], dtype=torch.int32)
        bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
        md = b.build(qsl, seq, bt)
        wrong_rank = other.build(qsl, seq, bt)
        n = md.num_local_tokens
        layer = aar.cp.PcpAttentionImpl(4, 16, pcp=pcp, num_kv_heads=2)
        kc = torch.zeros(8, 16, 2, 16)
        vc = torch.zeros_like(kc)
        q, k, v = torch.randn(n, 4, 16), torch.randn(n, 2, 16), torch.randn(n, 2, 16)
        o = torch.zeros(n, 4, 16)
        bad = [
            (lambda: layer.forward(q[:-1], k, v, kc, vc, md, o), "rows"),
            (lambda: layer.forward(q, k.double(), v, kc, vc, md, o), "dtype"),
            (lambda: layer.forward(q, k, v, kc[:, :8], vc, md, o), "key_cache"),
            (lambda: layer.forward(q, k, v, kc, vc, wrong_rank, o), "pcp group"),
        ]
        bad.append((lambda: aar.cp.PcpAttentionImpl(4, 16, pcp=pcp, dcp=pcp, num_kv_heads=2), "one KV head"))
        for call, what in bad:
            with pytest.raises(ValueError, match=what):
                call()
        md2 = b.build(qsl, seq, bt)
        if mode == "replicated":
            assert md2.local_attn_state == "ChunkedPrefill"
        with pytest.raises(ValueError, match="stale"):
            layer.forward(q, k, v, kc, vc, md, o)
        state = (mode, pcp.calls, bool(kc.any()), bool(vc.any()), bool(o.any()))
        assert state == (mode, 0, False, False, False), state
        layer.forward(q, k, v, kc, vc, md2, o)  # the good call still works on every rank
        out.append(pcp.calls)
        pcp.reset_counters()
    return out


def test_forward_rejects_bad_input_before_any_collective_or_write():
    res = run_ranks(2, _case_bad_input, deadline_s=60.0)
    assert res[0] == res[1] == [4, 2]


# ----------------------------------------------------------------------------- the step core and the contract

def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


_KW = dict(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=2, block_size=16, num_blocks=8)


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_pcp_metadata_counts_are_the_global_steps(mode):
    b = aar.cp.PcpMetadataBuilder(**_KW, pcp_size=2, pcp_rank=1, kv_mode=mode)
    md = b.build(_i32([0, 1, 6]), _i32([9, 5]), _i32([[0, 1], [2, 3]]))
    assert (md.num_reqs, md.num_kernel_reqs, md.num_decodes, md.num_prefills) == (2, 2, 1, 1)
    assert (md.num_actual_tokens, md.num_input_tokens, md.num_decode_tokens, md.num_prefill_tokens) == (6, 6, 1, 5)
    assert (md.max_query_len, md.max_seq_len) == (5, 9)
    assert md.num_local_tokens == len(b.local_token_index)
    assert md.attn_state == aar.AttentionState.ChunkedPrefill  # the global step's (a decode and a fresh prompt)
    assert b.build(_i32([0, 1, 2]), _i32([9, 4]), _i32([[0, 1], [2, 3]])).attn_state == aar.AttentionState.DecodeOnly


def test_pcp_backend_contract():
    S = aar.AttentionState
    f = aar.backend_facts("gqa_pcp")
    assert f["capturable"] == ["DecodeOnly", "SpecDecoding"], f["capturable"]
    assert f["context_parallel"] and f["kv_caches"] == ["key_cache", "value_cache"]
    b = aar.cp.PcpMetadataBuilder(**_KW, pcp_size=2, pcp_rank=0)
    qsl, seq, bt = _i32([0, 1, 6]), _i32([9, 5]), _i32([[0, 1], [2, 3]])
    md = b.build(qsl, seq, bt)
    with pytest.raises(NotImplementedError, match="attention state ChunkedPrefill cannot be captured"):
        b.build_for_graph_capture(qsl, seq, bt, state=S.ChunkedPrefill)
    for state in (S.DecodeOnly, S.SpecDecoding):  # a step with a prefill is never captured
        with pytest.raises(NotImplementedError, match="captures decode-only steps"):
            b.build_for_graph_capture(qsl, seq, bt, state=state, num_input_tokens=8)
    assert md.is_current  # refused before anything was built
    want = (md.num_local_tokens, md.decode_kv_lens, md.padded_slot_mapping.clone())
    d = b.build_for_drafting(qsl, seq, bt, 0)
    assert not md.is_current and d.is_current
    assert (d.num_local_tokens, d.decode_kv_lens) == want[:2] and torch.equal(d.padded_slot_mapping, want[2])
    with pytest.raises(ValueError, match="draft_index must be >= 0, got -1"):
        b.build_for_drafting(qsl, seq, bt, -1)


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_pcp_staging_config_is_honoured(mode):
    # Separate device buffers on the CPU exercise the staging copy: the same metadata as the in-place path,
    # build after build, with 3 host buffers used in turn.
    kw = dict(_KW, pcp_size=2, pcp_rank=1, kv_mode=mode)
    plain = aar.cp.PcpMetadataBuilder(**kw)
    staged = aar.cp.PcpMetadataBuilder(**kw, separate_device_buffers=True, staging_buffers=3)
    steps = [([0, 1, 6], [9, 5]), ([0, 1, 2, 12], [10, 6, 20]), ([0, 7], [7]), ([0, 1, 2], [11, 7])]
    for qsl, seq in steps:
        args = (_i32(qsl), _i32(seq), _i32([[0, 1], [2, 3], [4, 5]][:len(seq)]))
        a, s = plain.build(*args), staged.build(*args)
        fields = ["write_slots"] if mode == "replicated" else ["padded_slot_mapping", "restore_idx"]
        for name in fields:
            assert torch.equal(getattr(a, name), getattr(s, name)), name
        assert (a.decode_kv_lens, a.ctx_kv_lens) == (s.decode_kv_lens, s.ctx_kv_lens)
        assert torch.equal(plain.local_token_index, staged.local_token_index)
    with pytest.raises(ValueError, match=r"staging_buffers must be in \[1, 4\], got 5"):
        aar.cp.PcpMetadataBuilder(**kw, separate_device_buffers=True, staging_buffers=5)


def _case_profiling_run(rank, world):
    pcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    layer = aar.cp.PcpAttentionImpl(4, 16, pcp=pcp, num_kv_heads=2)
    kc = torch.zeros(8, 16, 2, 16)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    out = torch.full((5, 4, 16), float("nan"))
    assert layer.forward(q, k, k, kc, kc, None, out) is out
    assert pcp.calls == 0 and bool((out == 0).all()) and not bool(kc.any())
    g = aar.GraphParams("recording")
    with pytest.raises(NotImplementedError, match="PCP forward without metadata"):
        with g.capture(5):
            layer.forward(q, k, k, kc, kc, None, out)
    return pcp.calls


def test_pcp_forward_without_metadata_is_a_profiling_run():
    assert run_ranks(2, _case_profiling_run, deadline_s=60.0) == [0, 0]
