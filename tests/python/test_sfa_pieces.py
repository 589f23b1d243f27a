"""The SFA layer's two operator steps for engines that compute their own projections (sfa.IndexerStep,
sfa.SparseAttention, docs/design/sfa.md §4.5), on the runtime builder's metadata:
  * against the float64 references of _sfa_reference (the indexer keys written at the slots, the top-k of the
    reference scores, the sparse attention over the selected positions through W_UV and o_proj);
  * against sfa.Impl.forward on the same tokens and weights: the same indexer cache rows, the same top-k, and the
    pieces composed (with the layer's own top-k) give the layer's output;
for decode, prefill, mixed (with graph-padding rows past the kernel tokens) batches in fp32 and bf16, both indexer
RoPE pairings; and bad input refused by name with the caches and the top-k buffer untouched."""

from __future__ import annotations

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import fill_context, half_split, project
from _sfa_reference import IdxDims, indexer_keys, indexer_queries, indexer_topk_request, sfa_attend_request
from test_sfa import Model, _qsl

sfa = aar.sfa
F64 = torch.float64


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _engine_inputs(m, seq_lens, q_lens, pad):
    """What an engine that projects itself hands over for the step's new tokens (float64 projections of the
    reference, rounded to the layer's dtype): the indexer key rows k (T, D), query (T, n, D) and weights (T, n);
    the absorbed query ql_nope (T, H, L) = q_nope W_UK and q_pe (T, H, R) in the caches' half-split RoPE order.
    `pad` extra rows of noise follow the real tokens (graph padding)."""
    d, idx = m.d, m.idx
    wkv = m.ws["kv_b_proj"].to(F64).view(d.H, d.P + d.V, d.L)
    ks, qs, ws, qn, qr = [], [], [], [], []
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        x, pos = m.xs[r][:s], torch.arange(s)
        ks.append(indexer_keys(d, idx, m.iw, x, pos)[s - q:])
        ql, w = indexer_queries(d, idx, m.ws, m.iw, x[s - q:], pos[s - q:])
        qs.append(ql)
        ws.append(w)
        q_nope, q_rope, _, _ = project(d, m.ws, x, pos)
        qn.append(torch.einsum("thp,hpl->thl", q_nope[s - q:], wkv[:, : d.P]))
        qr.append(half_split(q_rope[s - q:]))
    g = torch.Generator().manual_seed(11)

    def cat(parts, *tail):
        return torch.cat(parts + [torch.randn(pad, *tail, generator=g, dtype=F64)]).to(m.dtype)

    return (cat(ks, idx.D), cat(qs, idx.n_head, idx.D), cat(ws, idx.n_head), cat(qn, d.H, d.L), cat(qr, d.H, d.R))


def _layer_output(m, attn):
    """W_UV and o_proj of the latent attention output (T, H, L), in float64."""
    d = m.d
    wkv = m.ws["kv_b_proj"].to(F64).view(d.H, d.P + d.V, d.L)
    y = torch.einsum("thl,hvl->thv", attn.to(F64), wkv[:, d.P:]).reshape(attn.shape[0], d.H * d.V)
    return y @ m.ws["o_proj"].to(F64).T


CASES = [
    pytest.param([5, 20, 33, 9], [1, 1, 1, 1], 0, True, id="decode"),
    pytest.param([6, 19], [6, 19], 0, True, id="prefill"),
    pytest.param([40, 7, 25, 30], [1, 7, 9, 1], 3, True, id="mixed_padded"),
    pytest.param([12, 30], [1, 5], 0, False, id="mixed_glm_rope"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_lens,q_lens,pad,neox", CASES)
def test_pieces_against_reference_and_layer(dtype, seq_lens, q_lens, pad, neox):
    m = Model(seq_lens, dtype=dtype, idx=IdxDims(neox=neox))
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        m.fill(r, s - q)  # the context's rows (latent, rope, indexer keys)
    tk = sum(q_lens)
    T = tk + pad
    md = m.builder().build(_qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32), m.table, num_input_tokens=T)
    nope0, rope0, idx0 = m.nope.clone(), m.rope.clone(), m.idx_k.clone()

    # The layer (its own copies of the caches): projections, cache writes, indexer, attention, W_UV, o_proj.
    hidden = torch.cat([m.xs[r][s - q:s] for r, (s, q) in enumerate(zip(seq_lens, q_lens))]
                       + [torch.zeros(pad, m.d.hidden, dtype=dtype)])
    impl = m.impl()
    lay_caches = [nope0.clone(), rope0.clone(), idx0.clone()]
    lay_out = torch.full_like(hidden, 7.0)
    impl.forward(hidden, lay_caches, md, lay_out)
    lay_topk = impl.last_topk

    # The engine's side: the latent rows are the engine's own write (vLLM's do_kv_cache_update); the indexer
    # cache is vLLM's 3-D (num_blocks, block_size, D).
    nope, rope = nope0.clone(), rope0.clone()
    for r, s in enumerate(seq_lens):
        fill_context(m.d, m.ws, m.xs[r][:s], nope, rope, m.blocks[r], m.bs)
    icache = idx0.clone().squeeze(2)
    k, q, w, ql_nope, q_pe = _engine_inputs(m, seq_lens, q_lens, pad)
    buf = torch.full((T + 4, m.idx.K), 5, dtype=torch.int32)
    step = sfa.IndexerStep(topk=m.idx.K, glm_moe_dsa=not neox)
    rows = step.run(k, q, w.float(), icache, md, buf)  # vLLM's weights are float32
    assert rows.shape == (tk, 1, m.idx.K) and rows.data_ptr() == buf.data_ptr()
    assert bool((buf[tk:T] == -1).all()) and bool((buf[T:] == 5).all())

    # The indexer cache: the new keys at the slots (as the layer wrote them), everything else untouched.
    torch.testing.assert_close(icache.unsqueeze(2).to(F64), lay_caches[2].to(F64), **_tol(dtype))
    written = torch.zeros(m.nb, m.bs, dtype=torch.bool)
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        for p in range(s - ql, s):
            written[m.blocks[r][p // m.bs], p % m.bs] = True
    assert torch.equal(icache[~written], idx0.squeeze(2)[~written])

    # The top-k: the reference's (exact in fp32) and the layer's.
    got = rows[:, 0].long()
    t0 = 0
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        ref, scores = indexer_topk_request(m.d, m.idx, m.ws, m.iw, m.xs[r][:s], ql)
        if dtype == torch.float32:
            assert torch.equal(got[t0:t0 + ql], ref), (r, got[t0:t0 + ql], ref)
        else:  # bf16 near-ties may reorder: every selected score within tolerance of the best unselected one
            for i in range(ql):
                vis = s - ql + i + 1
                sel = [p for p in got[t0 + i].tolist() if p >= 0]
                assert len(sel) == min(m.idx.K, vis) and len(set(sel)) == len(sel) and max(sel) < vis
                rest = [p for p in range(vis) if p not in sel]
                if rest:
                    tol = 0.05 * float(scores[i, :vis].abs().max())
                    assert min(float(scores[i, p]) for p in sel) >= max(float(scores[i, p]) for p in rest) - tol
        t0 += ql
    if dtype == torch.float32:
        assert torch.equal(rows, lay_topk)

    # The sparse attention over the indexer's rows (the engine's buffer, 2-D) against the float64 reference.
    sa = sfa.SparseAttention(scale=m.scale)
    attn = sa.run(ql_nope, q_pe, buf, nope, rope, md)
    assert attn.shape == (T, m.d.H, m.d.L) and torch.count_nonzero(attn[tk:]) == 0
    y = _layer_output(m, attn)
    t0 = 0
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        ref = sfa_attend_request(m.d, m.ws, m.xs[r][:s], ql, m.scale, got[t0:t0 + ql])
        torch.testing.assert_close(y[t0:t0 + ql], ref, **(_tol(dtype) if dtype == torch.float32
                                                             else dict(atol=3e-2, rtol=3e-2)))
        t0 += ql

    # Composed with the layer's own top-k ((tk, 1, K)), into a given out: the layer's output.
    out = torch.full((T, m.d.H, m.d.L), 3.0, dtype=dtype)
    res = sa.run(ql_nope, q_pe, lay_topk, nope, rope, md, out=out)
    assert res.data_ptr() == out.data_ptr() and torch.count_nonzero(out[tk:]) == 0
    if dtype == torch.float32:
        torch.testing.assert_close(out, attn, atol=0, rtol=0)
    torch.testing.assert_close(_layer_output(m, out)[:tk], lay_out[:tk].to(F64),
                               **(dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)))
    # The latent rows the engine wrote are the layer's.
    torch.testing.assert_close(nope, lay_caches[0], **_tol(dtype))
    torch.testing.assert_close(rope, lay_caches[1], **_tol(dtype))


def test_topk_buffer_destination_and_empty_step():
    seq, ql = [15, 26, 9], [1, 4, 1]
    m = Model(seq)
    for r, (s, q) in enumerate(zip(seq, ql)):
        m.fill(r, s - q)
    md = m.builder().build(_qsl(ql), torch.tensor(seq, dtype=torch.int32), m.table)
    k, q, w, _, _ = _engine_inputs(m, seq, ql, 0)
    step = sfa.IndexerStep(topk=m.idx.K)
    engine_buf = torch.zeros(8, m.idx.K + 2, dtype=torch.int32)  # wider than topk: the rest gets -1
    c1 = m.idx_k.clone()
    rows = step.run(k, q, w, c1, md, engine_buf)
    assert bool((engine_buf[:6, m.idx.K:] == -1).all())
    tb = sfa.TopkBuffer(16, m.idx.K)
    c2 = m.idx_k.clone()
    rows2 = step.run(k, q, w, c2, md, tb)
    assert torch.equal(rows2, rows) and torch.equal(tb.view(6), rows) and torch.equal(c1, c2)
    # A step without tokens writes nothing but -1 rows; the attention gives zeros.
    md0 = m.builder().build(_qsl([0]), torch.tensor([3], dtype=torch.int32), m.table[:1])
    c3 = m.idx_k.clone()
    buf = torch.full((2, m.idx.K), 5, dtype=torch.int32)
    assert step.run(k[:2], q[:2], w[:2], c3, md0, buf).shape == (0, 1, m.idx.K)
    assert torch.equal(c3, m.idx_k) and bool((buf == -1).all())
    o = sfa.SparseAttention(scale=m.scale).run(torch.ones(2, m.d.H, m.d.L), torch.ones(2, m.d.H, m.d.R), buf,
                                               m.nope, m.rope, md0)
    assert o.shape == (2, m.d.H, m.d.L) and torch.count_nonzero(o) == 0


def test_bad_input_refused_by_name_before_any_write():
    seq, ql = [15, 26], [1, 4]
    m = Model(seq)
    md = m.builder().build(_qsl(ql), torch.tensor(seq, dtype=torch.int32), m.table)
    k, q, w, qn, qr = _engine_inputs(m, seq, ql, 0)
    K = m.idx.K
    buf = torch.full((8, K), 5, dtype=torch.int32)
    step = sfa.IndexerStep(topk=K)
    ic = m.idx_k
    snap = [t.clone() for t in (m.nope, m.rope, m.idx_k, buf)]
    step_cases = [
        (dict(k=k[:, :-1]), "k must have shape"),
        (dict(k=k[:2]), r"k must have shape \(T >= 5"),
        (dict(k=k.half()), "k dtype"),
        (dict(q=q.half()), "q dtype"),
        (dict(q=q[:, :, :-1]), "q must have shape"),
        (dict(w=w[:, :-1]), "weights must have shape"),
        (dict(w=w.long()), "weights dtype"),
        (dict(ic=ic[:1]), "index_cache has 1 blocks"),
        (dict(ic=ic.view(m.nb * 2, m.bs // 2, 1, -1)), "index_cache must have shape"),
        (dict(ic=ic.to(torch.int8)), "index_cache dtype"),
        (dict(ic=ic.transpose(0, 1).contiguous().transpose(0, 1)), "index_cache must be contiguous"),
        (dict(buf=buf[:3]), "topk_out must have shape"),
        (dict(buf=buf[:, :-1]), "topk_out must have shape"),
        (dict(buf=buf.long()), "topk_out dtype"),
        (dict(buf=sfa.TopkBuffer(8, K + 1)), "index_topk="),
    ]
    for over, match in step_cases:
        with pytest.raises(ValueError, match=match):
            step.run(over.get("k", k), over.get("q", q), over.get("w", w), over.get("ic", ic), md,
                     over.get("buf", buf))
        for a, b in zip(snap, (m.nope, m.rope, m.idx_k, buf)):
            assert torch.equal(a, b), match
    with pytest.raises(ValueError, match="topk must be positive"):
        sfa.IndexerStep(topk=0)

    sa = sfa.SparseAttention(scale=m.scale)
    out = torch.full((5, m.d.H, m.d.L), 3.0)
    snap_out = out.clone()
    attn_cases = [
        (dict(qn=qn[:, :, :-1]), "ql_nope must have shape"),
        (dict(qn=qn[:2], qr=qr[:2]), r"ql_nope must have shape \(T >= 5"),
        (dict(qr=qr[:4]), "q_pe must have shape"),
        (dict(qn=qn.bfloat16(), qr=qr.bfloat16()), "ql_nope / q_pe dtypes"),
        (dict(topk=buf.long()), "topk dtype"),
        (dict(topk=buf[:2]), "topk must have shape"),
        (dict(nope=m.nope[:1]), "nope_cache has 1 blocks"),
        (dict(rope=m.rope.double()), "rope_cache dtype"),
        (dict(nope=m.nope.to(torch.int8)), "nope_cache dtype"),
        (dict(out=out[:4]), "out must have shape"),
        (dict(out=out.transpose(0, 1).contiguous().transpose(0, 1)), "out must be contiguous"),
        (dict(out=out.double()), "out dtype"),
    ]
    for over, match in attn_cases:
        with pytest.raises(ValueError, match=match):
            sa.run(over.get("qn", qn), over.get("qr", qr), over.get("topk", buf), over.get("nope", m.nope),
                   over.get("rope", m.rope), md, out=over.get("out", out))
        assert torch.equal(out, snap_out), match
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        sfa.SparseAttention(scale=0.0)

    # Metadata of a decode-context-parallel builder (the pieces run DCP, tests/python/test_vllm_sparse_dcp.py):
    # the indexer needs the replicated cache (num_blocks * W blocks), the attention the layer's DCP comm.
    dmd = m.builder(dcp_world_size=2, dcp_rank=0).build(_qsl(ql), torch.tensor(seq, dtype=torch.int32), m.table)
    with pytest.raises(ValueError, match="x dcp_world_size=2"):
        step.run(k, q, w, ic, dmd, buf)
    with pytest.raises(ValueError, match="built for DCP rank 0 of 2 but the layer has no dcp_comm"):
        sa.run(qn, qr, buf, m.nope, m.rope, dmd)
    for a, b in zip(snap, (m.nope, m.rope, m.idx_k, buf)):
        assert torch.equal(a, b)


def test_pieces_run_on_the_no_compute_provider():
    """The host path of both steps (what a host-time benchmark of the vLLM adapter measures) under the
    no-compute provider: it runs, with the decode step's shapes, and writes nothing."""
    seq, ql = [5, 20, 33, 9], [1, 1, 1, 1]
    m = Model(seq)
    md = m.builder().build(_qsl(ql), torch.tensor(seq, dtype=torch.int32), m.table)
    k, q, w, qn, qr = _engine_inputs(m, seq, ql, 0)
    buf = torch.full((8, m.idx.K), 5, dtype=torch.int32)
    ic = m.idx_k.clone()
    step, sa = sfa.IndexerStep(topk=m.idx.K), sfa.SparseAttention(scale=m.scale)
    aar.set_provider("no_compute")
    try:
        rows = step.run(k, q.to(torch.float8_e4m3fn), w, ic, md, buf)
        out = torch.full((4, m.d.H, m.d.L), 3.0)
        res = sa.run(qn.transpose(0, 1).contiguous().transpose(0, 1), qr, rows, m.nope, m.rope, md, out=out)
    finally:
        aar.set_provider("auto")
    assert rows.shape == (4, 1, m.idx.K) and res.data_ptr() == out.data_ptr()
    assert torch.equal(ic, m.idx_k) and bool((buf == 5).all()) and bool((out == 3.0).all())
