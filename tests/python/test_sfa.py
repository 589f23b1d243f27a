"""The SFA layer (DeepSeek-V3.2 sparse attention, docs/design/sfa.md §1, §4) against the float64 reference of
_sfa_reference (written from the model equations): the lightning indexer's top-k (exact, with distinct scores),
the sparse attention over the selected positions, the whole layer with its cache writes, for decode, prefill,
chunked prefill with context, mixed and speculative batches, with and without q-LoRA, top-k larger and smaller than
the visible context, fp32 and bf16; layers reusing the top-k buffer; graph capture; bad input."""

from __future__ import annotations

import math

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, fill_context, make_weights, rope_tables
from _sfa_reference import (IdxDims, indexer_keys, indexer_topk_request, make_indexer_weights, sfa_attend_request,
                            selected_positions)

sfa = aar.sfa
F64 = torch.float64


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


class Model:
    """One SFA layer's weights and caches, a paged block table, per-request token streams."""

    def __init__(self, seq_lens, *, dims=None, idx=None, dtype=torch.float32, bs=16, seed=0, spare_blocks=3):
        self.d = dims or MlaDims()
        self.idx = idx or IdxDims()
        self.dtype, self.bs = dtype, bs
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.ws = make_weights(self.d, dtype, g)
        self.iw = make_indexer_weights(self.d, self.idx, dtype, g)
        per_req = [math.ceil(s / bs) for s in seq_lens]
        self.nb = sum(per_req) + spare_blocks
        perm = torch.randperm(self.nb, generator=g).tolist()
        self.mbr = max(per_req)
        self.table = torch.zeros(len(seq_lens), self.mbr, dtype=torch.int32)
        self.blocks, k = [], 0
        for r, n in enumerate(per_req):
            self.blocks.append(perm[k:k + n])
            self.table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
            k += n
        d = self.d
        # Garbage where unused: a read from a wrong slot shows.
        self.nope = torch.randn(self.nb, bs, 1, d.L, generator=g).to(dtype)
        self.rope = torch.randn(self.nb, bs, 1, d.R, generator=g).to(dtype)
        self.idx_k = torch.randn(self.nb, bs, 1, self.idx.D, generator=g).to(dtype)
        self.xs = [torch.randn(s, d.hidden, generator=g, dtype=F64).to(dtype) for s in seq_lens]
        self.scale = 1.0 / math.sqrt(d.P + d.R)
        self.cos, self.sin = rope_tables(max(seq_lens) + 8, d.R)

    def fill(self, r, n):
        """Writes the cache rows (latent, rope, indexer key) of request r's first n tokens."""
        if n == 0:
            return
        fill_context(self.d, self.ws, self.xs[r][:n], self.nope, self.rope, self.blocks[r], self.bs)
        k = indexer_keys(self.d, self.idx, self.iw, self.xs[r][:n], torch.arange(n))
        for p in range(n):
            self.idx_k[self.blocks[r][p // self.bs], p % self.bs, 0] = k[p].to(self.dtype)

    def impl(self, indexer=True, **kw):
        d, ws = self.d, self.ws
        extra = {}
        if indexer:
            extra = dict(index_n_head=self.idx.n_head, index_head_dim=self.idx.D, index_topk=self.idx.K,
                         indexer_wq_b=self.iw["wq_b"], indexer_wk=self.iw["wk"],
                         indexer_weights_proj=self.iw["weights_proj"], indexer_k_norm_weight=self.iw["k_norm_weight"],
                         indexer_k_norm_bias=self.iw["k_norm_bias"], indexer_k_norm_eps=self.idx.eps,
                         glm_moe_dsa=not self.idx.neox)
        extra.update(kw)
        return sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                        qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, scale=self.scale, **extra, **ws)

    def builder(self, **kw):
        args = dict(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=self.mbr, block_size=self.bs,
                    num_blocks=self.nb, cos_table=self.cos.to(self.dtype), sin_table=self.sin.to(self.dtype))
        args.update(kw)
        return sfa.MetadataBuilder(**args)

    def caches(self, indexer=True):
        return [self.nope, self.rope] + ([self.idx_k] if indexer else [])


def _qsl(q_lens):
    return torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)


def run_case(seq_lens, q_lens, *, dtype=torch.float32, dims=None, idx=None, spec=0, seed=0, pad=0):
    m = Model(seq_lens, dims=dims, idx=idx, dtype=dtype, seed=seed)
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        m.fill(r, s - q)
    builder = m.builder(num_speculative_tokens=spec)
    md = builder.build(_qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32), m.table,
                       num_input_tokens=sum(q_lens) + pad)
    hidden = torch.cat([m.xs[r][s - q:] for r, (s, q) in enumerate(zip(seq_lens, q_lens))]
                       + [torch.randn(pad, m.d.hidden, generator=m.g).to(dtype)])
    impl = m.impl()
    out = torch.full_like(hidden, 7.0)
    impl.forward(hidden, m.caches(), md, out)
    assert impl.last_topk_source == "indexer"
    got_topk = impl.last_topk[:, 0].to(torch.int64)
    t0 = 0
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        ref_topk, scores = indexer_topk_request(m.d, m.idx, m.ws, m.iw, m.xs[r][:s], q)
        rows = got_topk[t0:t0 + q]
        if dtype == torch.float32:
            assert torch.equal(rows, ref_topk), (r, rows, ref_topk)
        else:
            # bf16 scores may reorder near-ties: every selected score is within tolerance of the best unselected.
            for i in range(q):
                vis = s - q + i + 1
                sel = [p for p in rows[i].tolist() if p >= 0]
                assert len(sel) == min(m.idx.K, vis) and len(set(sel)) == len(sel)
                rest = [p for p in range(vis) if p not in sel]
                if rest:
                    tol = 0.05 * float(scores[i, :vis].abs().max())
                    assert min(float(scores[i, p]) for p in sel) >= max(float(scores[i, p]) for p in rest) - tol
        # Attention over the runtime's selection (identical to the reference's in fp32).
        ref = sfa_attend_request(m.d, m.ws, m.xs[r][:s], q, m.scale, rows)
        torch.testing.assert_close(out[t0:t0 + q].to(F64), ref, **_tol(dtype))
        t0 += q
    if pad:
        assert torch.count_nonzero(out[t0:]) == 0  # padded rows: o_proj(0)
    return m, md, impl, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode(dtype):
    run_case([5, 20, 33, 9], [1, 1, 1, 1], dtype=dtype)  # K=8: larger and smaller than the visible context


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_without_context(dtype):
    run_case([6, 19], [6, 19], dtype=dtype)


def test_chunked_prefill_with_context_and_mixed():
    run_case([40, 7, 25, 30], [1, 7, 9, 1])


def test_speculative_decode():
    run_case([21, 14, 9], [2, 2, 2], spec=1)


def test_without_q_lora():
    run_case([12, 30], [1, 5], dims=MlaDims(Q=None))


def test_glm_interleaved_indexer_rope():
    run_case([12, 30], [1, 5], idx=IdxDims(neox=False))


def test_padded_tokens_get_zero_rows():
    run_case([12, 30], [1, 3], pad=3)


def test_cache_rows_written_at_the_slots():
    m, md, impl, out = run_case([10, 17], [1, 4])
    # Re-fill every token's rows from the reference and compare: the layer wrote the new tokens' rows.
    nope, rope, idx_k = m.nope.clone(), m.rope.clone(), m.idx_k.clone()
    for r, s in enumerate([10, 17]):
        m.fill(r, s)
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nope, m.nope, **tol)
    torch.testing.assert_close(rope, m.rope, **tol)
    torch.testing.assert_close(idx_k, m.idx_k, **tol)


def test_layers_reusing_the_topk_buffer():
    seq, q = [15, 26, 9], [1, 4, 1]
    m = Model(seq)
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    buf = sfa.TopkBuffer(64, m.idx.K)
    writer = m.impl(use_index_cache=True)
    out = torch.zeros_like(hidden)
    writer.forward(hidden, m.caches(), md, out, buf)
    reader = m.impl(indexer=False)
    out2 = torch.zeros_like(hidden)
    reader.forward(hidden, m.caches(indexer=False), md, out2, buf)
    assert reader.last_topk_source == "reused"
    assert torch.equal(reader.last_topk, writer.last_topk)
    # Same caches, same weights, same selection: the reader attends like the writer.
    torch.testing.assert_close(out2, out, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="TopkBuffer"):
        reader.forward(hidden, m.caches(indexer=False), md, out2)


def test_bad_input_is_rejected_before_any_write():
    seq, q = [15, 26], [1, 4]
    m = Model(seq)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.randn(sum(q), m.d.hidden)
    impl = m.impl()
    snap = [t.clone() for t in m.caches()]
    cases = [
        (dict(kv=[m.nope, m.rope]), "kv_cache"),
        (dict(kv=[m.nope, m.rope, m.idx_k.half()]), "indexer k"),
        (dict(kv=[m.nope, m.rope.double(), m.idx_k]), "rope"),
        (dict(kv=[m.nope[:1], m.rope, m.idx_k]), "latent"),
        (dict(kv=[m.nope, m.rope, m.idx_k.transpose(1, 2)]), "indexer k"),
        (dict(buf=sfa.TopkBuffer(64, m.idx.K + 1), impl=m.impl(use_index_cache=True)), "topk"),
        (dict(buf=sfa.TopkBuffer(2, m.idx.K), impl=m.impl(use_index_cache=True)), "topk buffer has 2 rows"),
        (dict(hidden=hidden[:2]), "hidden_states"),
    ]
    for over, match in cases:
        with pytest.raises(ValueError, match=match):
            (over.get("impl") or impl).forward(over.get("hidden", hidden), over.get("kv", m.caches()), md,
                                               torch.zeros(over.get("hidden", hidden).shape), over.get("buf"))
        for a, b in zip(snap, m.caches()):
            assert torch.equal(a, b)


def test_graph_capture_replays_padded_decode_buckets():
    bucket = 4
    seq = [9, 14, 20, 11]
    m = Model(seq, spare_blocks=8)
    for r, s in enumerate(seq):
        m.fill(r, s - 1)
    builder = m.builder(graph_decode_padding=True)
    impl = m.impl()
    hidden = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    out = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    g = aar.GraphParams("recording")
    md = builder.build_for_graph_capture(_qsl([1] * bucket), torch.tensor(seq, dtype=torch.int32), m.table,
                                         num_input_tokens=bucket)
    nope0, rope0, idx0 = m.nope.clone(), m.rope.clone(), m.idx_k.clone()
    with g.capture(bucket):
        impl.forward(hidden, m.caches(), md, out)
    # Nothing ran during capture on the CPU recording provider... and the caches are as they were.
    assert torch.equal(nope0, m.nope) and torch.equal(rope0, m.rope) and torch.equal(idx0, m.idx_k)
    for B in (4, 2, 3):
        hs = torch.cat([m.xs[r][seq[r] - 1: seq[r]] for r in range(B)])
        md = builder.build(_qsl([1] * B), torch.tensor(seq[:B], dtype=torch.int32), m.table[:B],
                           num_input_tokens=bucket)
        g.clear_update_log()
        hidden.zero_()
        hidden[:B] = hs
        # The SFA call reads its lengths from the builder's stable buffers: nothing to update.
        g.replay(bucket)
        ref = torch.cat([sfa_attend_request(m.d, m.ws, m.xs[r][:seq[r]], 1, m.scale,
                                            indexer_topk_request(m.d, m.idx, m.ws, m.iw, m.xs[r][:seq[r]], 1)[0])
                         for r in range(B)])
        torch.testing.assert_close(out[:B].to(F64), ref, **_tol(m.dtype))
        assert torch.count_nonzero(out[B:]) == 0
        assert g.update_log == []  # no host parameter was re-issued


def test_graph_capture_replays_speculative_decode_buckets():
    # num_speculative_tokens = 1: every request brings 2 tokens; a bucket of 8 tokens holds 4 requests.
    bucket, q = 8, 2
    seq = [12, 17, 9, 21]
    m = Model(seq, spare_blocks=8)
    for r, s in enumerate(seq):
        m.fill(r, s - q)
    builder = m.builder(num_speculative_tokens=1, graph_decode_padding=True)
    impl = m.impl()
    hidden = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    out = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    g = aar.GraphParams("recording")
    md = builder.build_for_graph_capture(_qsl([q] * 4), torch.tensor(seq, dtype=torch.int32), m.table,
                                         num_input_tokens=bucket, state=aar.AttentionState.SpecDecoding)
    snap = [c.clone() for c in m.caches()]
    with g.capture(bucket):
        impl.forward(hidden, m.caches(), md, out)
    for a, b in zip(snap, m.caches()):
        assert torch.equal(a, b)
    for B in (4, 1, 3):
        hs = torch.cat([m.xs[r][seq[r] - q: seq[r]] for r in range(B)])
        md = builder.build(_qsl([q] * B), torch.tensor(seq[:B], dtype=torch.int32), m.table[:B],
                           num_input_tokens=bucket)
        g.clear_update_log()
        hidden.zero_()
        hidden[:B * q] = hs
        g.replay(bucket)
        ref = torch.cat([sfa_attend_request(m.d, m.ws, m.xs[r][:seq[r]], q, m.scale,
                                            indexer_topk_request(m.d, m.idx, m.ws, m.iw, m.xs[r][:seq[r]], q)[0])
                         for r in range(B)])
        torch.testing.assert_close(out[:B * q].to(F64), ref, **_tol(m.dtype))
        assert torch.count_nonzero(out[B * q:]) == 0
        assert g.update_log == []
