"""Graph capture of GQA PCP decode (aar.cp.PcpMetadataBuilder / PcpAttentionImpl, docs/design/cp.md §6.6)
over real gloo groups (PCP 2 on 2 ranks, sharded KV and the replicated kv_mode; PCP 2 x DCP 2 on 4 ranks).

A decode bucket is captured once; each step then builds its metadata padded to the bucket
(padding decode rows of KV length 0), updates the graph and replays it, the PCP all-gather of
the wire partials running inside the replayed calls. Every replay is compared with an eager PCP
forward of the same step on a twin cache (same rank, same batch, unpadded) and with the float64
reference over the whole sequence, over steps whose batch and lengths change (one-token and
speculative decodes); the captured addresses never move. Steps with prefills are refused inside
a capture by name before anything is written.
"""

import math

import pytest
import torch

from _cp_harness import pcp_dcp_groups, run_ranks
from test_gqa_pcp import D, _reference

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

BUCKET = 8
BS, MB = 16, 4


def _case(rank, world, wp, wd, configs):
    import ascend_attn_rt as aar

    torch.set_num_threads(1)
    pcp_group, dcp_group = pcp_dcp_groups(rank, wp, wd)
    rp, rd = rank // wd, rank % wd
    pcp = aar.cp.Comm(pcp_group, timeout_s=20.0)
    dcp = aar.cp.Comm(dcp_group, timeout_s=20.0) if wd > 1 else None
    results = []
    for (mode, dtype_name, H, Hkv, I, spec) in configs:
        dtype = getattr(torch, dtype_name)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        scale = 1.0 / math.sqrt(D)
        gen = torch.Generator().manual_seed(7 + H + Hkv + I + spec)
        nreq, lmax = 6, 48
        num_blocks = nreq * MB + 1
        bt = (torch.randperm(num_blocks - 1, generator=gen)[: nreq * MB] + 1).view(nreq, MB).to(torch.int32)
        # The model input of every position (the same on every rank: one seed).
        qa = torch.randn(nreq, lmax, wd * H, D, generator=gen)[:, :, rd * H:(rd + 1) * H].to(dtype)
        ka = torch.randn(nreq, lmax, Hkv, D, generator=gen).to(dtype)
        va = torch.randn(nreq, lmax, Hkv, D, generator=gen).to(dtype)
        caches = {m: (torch.zeros(num_blocks, BS, Hkv, D, dtype=dtype), torch.zeros(num_blocks, BS, Hkv, D, dtype=dtype))
                  for m in ("graph", "eager")}
        mk = dict(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=MB, block_size=BS, num_blocks=num_blocks,
                  pcp_size=wp, pcp_rank=rp, dcp_size=wd, dcp_rank=rd, interleave_size=I, kv_mode=mode,
                  num_speculative_tokens=spec)
        b_graph, b_eager = aar.cp.PcpMetadataBuilder(**mk), aar.cp.PcpMetadataBuilder(**mk)
        layer_graph = aar.cp.PcpAttentionImpl(H, D, pcp=pcp, dcp=dcp, num_kv_heads=Hkv)
        layer_eager = aar.cp.PcpAttentionImpl(H, D, pcp=pcp, dcp=dcp, num_kv_heads=Hkv)
        hist = [0] * nreq

        def step_inputs(builder, reqs, qlens, prefilling):
            """This rank's local rows of the step (builder.local_token_index after its build)."""
            idx = builder.local_token_index.long()
            rows = [(r, hist[r] + j) for r, n in zip(reqs, qlens) for j in range(n)]
            n = idx.numel()
            lq, lk, lv = (torch.zeros(n, H, D, dtype=dtype), torch.zeros(n, Hkv, D, dtype=dtype),
                          torch.zeros(n, Hkv, D, dtype=dtype))
            for i, t in enumerate(idx.tolist()):
                if t >= 0:
                    r, p = rows[t]
                    lq[i], lk[i], lv[i] = qa[r, p], ka[r, p], va[r, p]
            return lq, lk, lv, idx, rows

        def build(builder, reqs, qlens, prefilling, **kw):
            qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
            seq = torch.tensor([hist[r] + n for r, n in zip(reqs, qlens)], dtype=torch.int32)
            return builder.build(qsl, seq, bt[reqs].contiguous(), is_prefilling=torch.tensor(prefilling, dtype=torch.bool), **kw)

        # History: fresh prompts of every request (eager, on both caches).
        plens = [1, 2, 5, 9, 17, 23]
        for m, b, lay in (("graph", b_graph, layer_graph), ("eager", b_eager, layer_eager)):
            md = build(b, list(range(nreq)), plens, [True] * nreq)
            lq, lk, lv, _, _ = step_inputs(b, list(range(nreq)), plens, None)
            lay.forward(lq, lk, lv, *caches[m], md, torch.empty_like(lq))
        hist = list(plens)

        # Capture one decode bucket on static buffers.
        qs, ks, vs = (torch.zeros(BUCKET, H, D, dtype=dtype), torch.zeros(BUCKET, Hkv, D, dtype=dtype),
                      torch.zeros(BUCKET, Hkv, D, dtype=dtype))
        out_s = torch.zeros(BUCKET, H, D, dtype=dtype)
        g = aar.GraphParams("recording")
        dlen = 1 + spec
        ncap = min(BUCKET // dlen, nreq)  # the capture step: padded when it is smaller than the bucket
        state = aar.AttentionState.SpecDecoding if spec else aar.AttentionState.DecodeOnly
        qsl = torch.arange(ncap + 1, dtype=torch.int32) * dlen
        seq = torch.tensor([hist[r] + dlen for r in range(ncap)], dtype=torch.int32)
        md = b_graph.build_for_graph_capture(qsl, seq, bt[:ncap].contiguous(), state=state, num_input_tokens=BUCKET)
        assert md.attn_state == state and md.num_local_tokens == BUCKET and md.num_input_tokens == BUCKET
        if mode == "sharded":
            assert md.decode_kernel_rows == BUCKET and md.decode_kv_lens[ncap * dlen:] == [0] * (BUCKET - ncap * dlen)
        calls_before = (pcp.calls, dcp.calls if dcp else 0)
        with g.capture(BUCKET):
            layer_graph.forward(qs, ks, vs, *caches["graph"], md, out_s)
        assert (pcp.calls, dcp.calls if dcp else 0) == calls_before  # the recording capture runs nothing
        kinds = [c[0] for c in g.calls(BUCKET)]
        if mode == "sharded":
            assert kinds == ["kv_write", "prepare", "fia", "prepare"], kinds
        addrs = g.call_addresses(BUCKET)

        # A step with prefills is refused inside the capture of another bucket, before any write or collective.
        mixed = build(b_eager, [0, 5], [1, 4], [False, True])
        lq, lk, lv, _, _ = step_inputs(b_eager, [0, 5], [1, 4], None)
        snapshot = (caches["eager"][0].clone(), pcp.calls)
        g2 = aar.GraphParams("recording")
        with pytest.raises(NotImplementedError, match="a GQA PCP forward of a step with 1 prefills"):
            with g2.capture(lq.shape[0]):
                layer_eager.forward(lq, lk, lv, *caches["eager"], mixed, torch.empty_like(lq))
        assert torch.equal(caches["eager"][0], snapshot[0]) and pcp.calls == snapshot[1]
        # ... and cannot update a captured bucket (it would replay its decode rows only).
        with pytest.raises(ValueError, match="cannot update a captured bucket"):
            g.update(BUCKET, mixed)
        # ... and never padded (refused by name before anything is built).
        with pytest.raises(NotImplementedError, match="pads a step with 1 prefills"):
            build(b_eager, [0, 5], [1, 4], [False, True], num_input_tokens=BUCKET)
        assert mixed.is_current

        # Decode steps with changing batches and lengths, each padded to the bucket.
        steps = [[0, 1, 2], list(range(ncap)), [1, 3], [0, 2, 3], [2]]
        worst = 0.0
        for reqs in steps:
            reqs = list(dict.fromkeys(r % ncap for r in reqs))  # the requests the bucket holds
            qlens = [dlen] * len(reqs)
            if spec and len(reqs) > 1:
                qlens[-1] = 1  # a one-token decode beside the speculative ones
            T = sum(qlens)
            pref = [False] * len(reqs)
            md_g = build(b_graph, reqs, qlens, pref, num_input_tokens=BUCKET)
            lq_g, lk_g, lv_g, idx_g, _ = step_inputs(b_graph, reqs, qlens, pref)
            md_e = build(b_eager, reqs, qlens, pref)
            lq, lk, lv, idx, rows = step_inputs(b_eager, reqs, qlens, pref)
            assert md_g.num_local_tokens == BUCKET and torch.equal(idx_g[:T], idx) and bool((idx_g[T:] < 0).all())
            qs.copy_(lq_g), ks.copy_(lk_g), vs.copy_(lv_g)
            out_s.fill_(float("nan"))
            g.update(BUCKET, md_g)
            before = (pcp.calls, dcp.calls if dcp else 0)
            g.replay(BUCKET)
            # Sharded: the PCP all-gather of the wire partials (and with DCP the query gather and the
            # partials' all-to-all); replicated: no collective.
            after = (pcp.calls, dcp.calls if dcp else 0)
            assert (after[0] - before[0], after[1] - before[1]) == ((1, 2 if dcp else 0) if mode == "sharded" else (0, 0))
            out_e = torch.full_like(lq, float("nan"))
            layer_eager.forward(lq, lk, lv, *caches["eager"], md_e, out_e)
            # Replay == eager (the same kernels on the same rows; padding rows change nothing).
            close = 1e-6 if dtype == torch.float32 else 1e-2
            assert torch.allclose(out_s[:T].double(), out_e.double(), rtol=close, atol=close), "replay vs eager"
            if mode == "sharded":
                assert not torch.isnan(out_s).any()  # padding rows merge to 0 on the CPU twin, never NaN
            for i, t in enumerate(idx.tolist()):
                r, p = rows[t]
                ref = _reference(qa[r, p:p + 1], ka[r, :p + 1], va[r, :p + 1], torch.tensor([p]), scale)[0]
                err = (out_s[i].double() - ref).abs().max().item()
                worst = max(worst, err)
                assert torch.allclose(out_s[i].double(), ref, rtol=tol, atol=tol), (mode, r, p, err)
            # The padded metadata run eagerly (rewrites the same rows into the graph cache): the real rows as
            # the replay, the padding rows zero.
            out_p = torch.full_like(out_s, float("nan"))
            layer_graph.forward(qs, ks, vs, *caches["graph"], md_g, out_p)
            assert torch.allclose(out_p[:T].double(), out_e.double(), rtol=close, atol=close), "padded eager"
            assert float(out_p[T:].abs().sum()) == 0.0
            for r, n in zip(reqs, qlens):
                hist[r] += n
            assert g.call_addresses(BUCKET) == addrs
        assert torch.equal(caches["graph"][0], caches["eager"][0])
        assert torch.equal(caches["graph"][1], caches["eager"][1])
        results.append((mode, len(steps), worst))
    return results


CONFIGS = [
    ("sharded", "float32", 4, 2, 1, 0),     # GQA, one-token decodes
    ("sharded", "bfloat16", 4, 4, 2, 0),    # MHA, I = 2
    ("sharded", "float32", 4, 2, 1, 2),     # speculative decode, 3 (and 1) tokens per request
    ("sharded", "bfloat16", 2, 1, 16, 1),   # speculative decode, 2 tokens, I = B
    ("replicated", "float32", 4, 2, 1, 0),
    ("replicated", "float32", 4, 2, 1, 1),
]


def test_gqa_pcp_decode_graph_replays_like_eager():
    res = run_ranks(2, _case, 2, 1, CONFIGS, deadline_s=120.0)
    assert [[(m, n) for (m, n, _) in r] for r in res] == [[(c[0], 5) for c in CONFIGS]] * 2


DCP_CONFIGS = [("sharded", "float32", 2, 1, 1, 0), ("sharded", "bfloat16", 2, 1, 2, 1)]


def test_gqa_pcp2_dcp2_decode_graph_replays_like_eager():
    # The DCP leg inside the recorded calls too: query gather, partials' all-to-all, then the PCP all-gather.
    res = run_ranks(4, _case, 2, 2, DCP_CONFIGS, deadline_s=120.0)
    assert [[(m, n) for (m, n, _) in r] for r in res] == [[(c[0], 5) for c in DCP_CONFIGS]] * 4
