"""The SFA layer's C8 combinations (docs/design/sparse.md §4, docs/design/sfa.md §5, docs/design/sparse.md §3, docs/design/sfa.md §2.2, §4.1) against float64 references.

Everything quantised is re-derived here, independently of the runtime and of its operator twins:
* the Sylvester Hadamard matrix by its recursion H_2n = [[H, H], [H, -H]];
* dynamic symmetric quantisation of a vector (scale = amax / QMAX, QMAX 127 for int8 and 448 for fp8 e4m3,
  q = round-half-even(x / scale)) and the SFA C8 row layout of docs/design/sfa.md §5:
  [k_nope_q 512 x int8 | k_rope 64 x bf16/fp16 (128 B) | 4 fp32 scales (16 B)] = 656 bytes,
  k_nope[d] = q[d] * scale[d // 128]; rows are packed and unpacked here with plain byte views;
* the indexer score sum_h w[t,h] relu(q_li[t,h] . k_li[s]) (the rotation is orthogonal: the unquantised score is
  unchanged by it) and the sparse attention in latent space (absorbed weights W_UK / W_UV) over keys read back
  from the packed cache and dequantised.

Checks per combination (no C8, SFA C8, LI C8, both; A2/A3 dtypes, and A5's fp8 LI C8, which the twins take on CPU):
the layer's output against the float64 reference over the keys it wrote (dequantised) and over the exact keys
(within the quantisation error); the selected top-k against the reference top-k wherever the score margin exceeds
the quantisation error; the bytes the layer writes (packed rows, indexer int8/fp8 keys and scales) against an
independent packing, and every other cache byte untouched; decode, prefill with context, mixed, speculative and
padded batches; graph capture; bad tuples rejected by name with every cache untouched.
"""

from __future__ import annotations

import math

import pytest
import torch

import ascend_attn_rt as aar
import _mx_reference as mx
from _mla_reference import MlaDims, half_split, project
from _sfa_reference import IdxDims, indexer_keys, indexer_queries, selected_positions, sfa_attend_request
from test_sfa import Model, _qsl

sfa = aar.sfa
F64 = torch.float64
FP8 = torch.float8_e4m3fn

# DeepSeek-V3.2's latent geometry (the packed rows hold L = 512, R = 64) and indexer head (128), small elsewhere.
C8_DIMS = MlaDims(H=4, hidden=128, Q=48, L=512, P=32, R=64, V=32)
C8_IDX = IdxDims(n_head=4, D=128, K=8)
ROW, NOPE, ROPE, TILE = 656, 512, 64, 128
QMAX = {torch.int8: 127.0, FP8: 448.0}
COMBOS = [(False, False), (True, False), (False, True), (True, True)]
COMBO_IDS = ["no_c8", "sfa_c8", "li_c8", "sfa_c8+li_c8"]


# ----------------------------------------------------------------------------- independent quantisers


def hadamard(n: int) -> torch.Tensor:
    """Sylvester's recursion, float64, unnormalised."""
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def quantise(x: torch.Tensor, qdtype) -> tuple:
    """Per-row (last axis) dynamic symmetric quantisation of float64 x: (q as float64 values, scale float64)."""
    qmax = QMAX[qdtype]
    scale = x.abs().amax(-1, keepdim=True) / qmax
    y = x / torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(y) if qdtype == torch.int8 else y.to(torch.float32).to(FP8).to(F64)
    return q, scale.squeeze(-1)


def pack_rows(k_nope: torch.Tensor, k_rope: torch.Tensor, rope_dtype, c8=torch.int8) -> torch.Tensor:
    """(n, 512) float, (n, 64) float -> (n, 656) rows as int8 bytes: per-128-tile q (int8: rint(x / scale), scale
    amax / 127; fp8 e4m3 (A5): the nearest e4m3 value of x / scale, scale amax / 448), rope bytes, fp32 scale bytes."""
    n = k_nope.shape[0]
    qmax = QMAX[c8]
    t = k_nope.to(F64).reshape(n, NOPE // TILE, TILE)
    scale = (t.abs().amax(-1) / qmax).to(torch.float32)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).to(F64)
    y = (t / safe[..., None]).clamp(-qmax, qmax)
    if c8 == torch.int8:
        q = torch.round(y).to(torch.int8).reshape(n, NOPE)
    else:
        q = mx.e4m3_round(y).to(FP8).view(torch.int8).reshape(n, NOPE)  # the e4m3 grid computed in float64
    rope = k_rope.to(rope_dtype).contiguous().view(torch.int8).reshape(n, 2 * ROPE)
    return torch.cat([q, rope, scale.contiguous().view(torch.int8).reshape(n, 16)], 1)


def unpack_rows(rows: torch.Tensor, rope_dtype, c8=torch.int8):
    """(..., 656) rows (any one-byte dtype; the nope bytes read as c8) -> (q (n, 512) f64, rope (n, 64) f64,
    scale (n, 4) f64, k_nope (n, 512) f64)."""
    r = rows.reshape(-1, ROW).contiguous().view(torch.int8)
    q = r[:, :NOPE].contiguous().view(c8).to(F64)
    rope = r[:, NOPE:NOPE + 2 * ROPE].contiguous().view(rope_dtype).to(F64)
    scale = r[:, NOPE + 2 * ROPE:].contiguous().view(torch.float32).to(F64)
    return q, rope, scale, (q.reshape(-1, NOPE // TILE, TILE) * scale[..., None]).reshape(-1, NOPE)


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8).clone()


# ----------------------------------------------------------------------------- the model


class C8Model(Model):
    """test_sfa.Model's weights, table and token streams, with the caches of one C8 combination (docs/design/sfa.md §2.2)."""

    def __init__(self, seq_lens, *, sfa_c8, li_c8, device_kind="a2", dtype=torch.bfloat16, dims=None, idx=None,
                 **kw):
        super().__init__(seq_lens, dims=dims or C8_DIMS, idx=idx or C8_IDX, dtype=dtype, **kw)
        self.sfa_c8, self.li_c8, self.device_kind = sfa_c8, li_c8, device_kind
        self.c8 = FP8 if device_kind == "a5" else torch.int8
        self.scale_dtype = torch.float32 if device_kind == "a5" else torch.float16
        g, nb, bs = self.g, self.nb, self.bs
        # Garbage where unused: random bytes (NaN / huge scales included) show any read of a wrong slot.
        if sfa_c8:
            self.packed = torch.randint(-128, 128, (nb, bs, 1, ROW), dtype=torch.int8, generator=g).view(self.c8)
        if li_c8:
            self.idx_k = torch.randint(-128, 128, (nb, bs, 1, self.idx.D), dtype=torch.int8, generator=g).view(self.c8)
            self.idx_scale = torch.randn(nb, bs, 1, 1, generator=g).to(self.scale_dtype)
        self.hn = hadamard(self.idx.D) / math.sqrt(self.idx.D)

    def where(self, r, p):
        return self.blocks[r][p // self.bs], p % self.bs

    def fill(self, r, n):
        """Writes the cache rows of request r's first n tokens (quantised here, independently)."""
        if n == 0:
            return
        d, pos = self.d, torch.arange(n)
        _, _, c, k_rope = project(d, self.ws, self.xs[r][:n], pos)
        kr = half_split(k_rope)
        k_idx = indexer_keys(d, self.idx, self.iw, self.xs[r][:n], pos)
        rows = pack_rows(c, kr, self.dtype, self.c8) if self.sfa_c8 else None
        if self.li_c8:
            kq, ks = quantise(k_idx @ self.hn, self.c8)
        for p in range(n):
            blk, off = self.where(r, p)
            if self.sfa_c8:
                self.packed[blk, off, 0] = rows[p].view(self.c8)
            else:
                self.nope[blk, off, 0] = c[p].to(self.dtype)
                self.rope[blk, off, 0] = kr[p].to(self.dtype)
            if self.li_c8:
                self.idx_k[blk, off, 0] = kq[p].to(self.c8)
                self.idx_scale[blk, off, 0, 0] = ks[p].to(self.scale_dtype)
            else:
                self.idx_k[blk, off, 0] = k_idx[p].to(self.dtype)

    def main(self):
        return [self.packed] if self.sfa_c8 else [self.nope, self.rope]

    def indexer(self):
        return [self.idx_k, self.idx_scale] if self.li_c8 else [self.idx_k]

    def caches(self, indexer=True):
        composed, k_at, s_at = sfa.compose_kv_cache(self.main(), self.indexer() if indexer else None,
                                                    sfa_c8=self.sfa_c8, li_c8=self.li_c8)
        assert k_at == (None if not indexer else 1 if self.sfa_c8 else 2)
        assert s_at == (None if not (indexer and self.li_c8) else k_at + 1)
        return list(composed)

    def all_caches(self):
        return self.main() + self.indexer()

    def impl(self, indexer=True, **kw):
        kw.setdefault("li_c8", self.li_c8 and indexer)
        return super().impl(indexer=indexer, sfa_c8=self.sfa_c8, device_kind=self.device_kind, **kw)

    # -- the keys the layer attends over, read back from its caches

    def cached_keys(self, r, s):
        """(k_nope (s, L), k_rope (s, R) half layout), float64, of request r's first s positions: dequantised
        from the packed rows with SFA C8."""
        blk_off = [self.where(r, p) for p in range(s)]
        if self.sfa_c8:
            rows = torch.stack([self.packed[b, o, 0].view(torch.int8) for b, o in blk_off])
            _, rope, _, nope = unpack_rows(rows, self.dtype, self.c8)
            return nope, rope
        return (torch.stack([self.nope[b, o, 0] for b, o in blk_off]).to(F64),
                torch.stack([self.rope[b, o, 0] for b, o in blk_off]).to(F64))


def attend_cached(m: C8Model, r, s, q_len, topk):
    """Output (q_len, hidden) of request r's last q_len tokens in latent space (docs/design/sfa.md §1) over the keys
    the caches hold (dequantised), attending the positions the top-k rows select (scan rule, causal)."""
    d = m.d
    pos = torch.arange(s)
    q_nope, q_rope, _, _ = project(d, m.ws, m.xs[r][:s], pos)
    k_nope, k_rope = m.cached_keys(r, s)
    w = m.ws["kv_b_proj"].to(F64).view(d.H, d.P + d.V, d.L)
    w_uk, w_uv = w[:, : d.P], w[:, d.P:]
    out = torch.zeros(q_len, d.H, d.V, dtype=F64)
    for i in range(q_len):
        t = s - q_len + i
        sel = selected_positions(topk[i], t + 1)
        if not sel:
            continue
        idx = torch.tensor(sel)
        ql = torch.einsum("hp,hpl->hl", q_nope[t], w_uk)
        qpe = half_split(q_rope[t])
        logit = m.scale * (ql @ k_nope[idx].T + qpe @ k_rope[idx].T)
        o_lat = torch.softmax(logit, -1) @ k_nope[idx]
        out[i] = torch.einsum("hl,hvl->hv", o_lat, w_uv)
    return out.reshape(q_len, d.H * d.V) @ m.ws["o_proj"].to(F64).T


# ----------------------------------------------------------------------------- checks


def check_topk(m: C8Model, r, s, q, rows):
    """The runtime's selection (q, K) against the float64 reference scores of request r. Without LI C8 the
    margin allowed is the bf16 one of test_sfa; with LI C8 it adds the quantisation error of the scores (the
    score of the same vectors quantised here, minus the exact one, with a safety factor): wherever two positions'
    reference scores differ by more than their errors, the higher one must be the selected one."""
    d, idx = m.d, m.idx
    pos = torch.arange(s)
    k = indexer_keys(d, idx, m.iw, m.xs[r][:s], pos)                                # (s, D)
    ql, w = indexer_queries(d, idx, m.ws, m.iw, m.xs[r][s - q:], pos[s - q:])       # (q, n_head, D), (q, n_head)
    dots = torch.einsum("thd,sd->ths", ql, k)
    ref = (w[:, :, None] * torch.relu(dots)).sum(1)                                 # (q, s)
    # bf16 computation of q_li, k_li and the weights: a few bf16 ulps of every |w| |q| |k| term.
    bf = 4 * 2.0 ** -8 * (w.abs()[:, :, None] * ql.norm(dim=-1)[:, :, None] * k.norm(dim=-1)[None, None]).sum(1)
    err = bf + 0.02 * ref.abs().amax(-1, keepdim=True)
    if m.li_c8:
        kq, ks = quantise(k @ m.hn, m.c8)
        qq, qs = quantise(ql @ m.hn, m.c8)
        w16 = w.to(torch.float16).to(F64)
        deq = qs[:, :, None] * ks[None, None] * torch.einsum("thd,sd->ths", qq, kq)
        quant = (w16[:, :, None] * torch.relu(deq)).sum(1)
        err = err + 3 * (quant - ref).abs()
    decided = 0
    for i in range(q):
        vis = s - q + i + 1
        sel = [p for p in rows[i].tolist() if p >= 0]
        assert rows[i, len(sel):].eq(-1).all(), rows[i]          # valid entries first, then -1
        assert len(sel) == min(idx.K, vis) and len(set(sel)) == len(sel) and all(p < vis for p in sel), (rows[i], vis)
        rest = [p for p in range(vis) if p not in sel]
        for a in sel:
            for b in rest:
                margin = float(ref[i, b] - ref[i, a])
                tol = float(err[i, a] + err[i, b])
                assert margin <= tol, (f"request {r} row {i}: position {b} (score {float(ref[i, b]):.4f}) beats "
                                       f"selected {a} ({float(ref[i, a]):.4f}) by more than the error {tol:.4f}")
                decided += abs(margin) > tol
    return decided


def check_packed_rows(m: C8Model, r, s, q, before):
    """The rows the layer wrote for request r's new tokens against an independent packing of the exact latent
    key (RMSNorm'd c_kv, half-layout RoPE'd k_pe), within bf16 + rounding."""
    d = m.d
    _, _, c, k_rope = project(d, m.ws, m.xs[r][:s], torch.arange(s))
    kr = half_split(k_rope)
    for p in range(s - q, s):
        blk, off = m.where(r, p)
        got = m.packed[blk, off, 0].view(torch.int8)
        assert not torch.equal(raw(got), raw(before[blk, off, 0])), "row not written"
        gq, grope, gscale, gnope = unpack_rows(got, m.dtype, m.c8)
        rq, rrope, rscale, _ = unpack_rows(pack_rows(c[p:p + 1], kr[p:p + 1], m.dtype, m.c8), m.dtype, m.c8)
        # Layout: each tile's largest |q| is exactly QMAX (the amax element maps to the bound: 127, or e4m3's 448).
        qmax = QMAX[m.c8]
        assert torch.equal(gq.reshape(4, TILE).abs().amax(-1), torch.full((4,), qmax, dtype=F64))
        torch.testing.assert_close(gscale, rscale, rtol=2e-2, atol=0)
        torch.testing.assert_close(grope, rrope, rtol=2e-2, atol=2e-2)
        tile_scale = rscale.repeat_interleave(TILE, -1)
        if m.c8 == torch.int8:
            dq = (gq - rq).abs()
            assert dq.max() <= 2 and dq.mean() < 0.3, (p, dq.max(), dq.mean())
            # dequantised: half an int8 step of the tile, plus the bf16 noise of the layer's k_nope
            assert ((gnope - c[p]).abs() <= 0.5 * tile_scale + 0.01 * c[p].abs() + 1e-3).all()
        else:
            # e4m3: 3 mantissa bits, so neighbouring values differ by at most 2^-3 of the larger one (2^-9 below
            # the normal range); the layer's q may sit up to two such steps from ours (bf16 inputs).
            step = 2.0 ** -3 * torch.maximum(gq.abs(), rq.abs()) + 2.0 ** -9
            assert ((gq - rq).abs() <= 2 * step).all(), (p, (gq - rq).abs().max())
            # dequantised: half a step (relative 2^-4) of the tile's scale, plus the bf16 noise
            assert ((gnope - c[p]).abs() <= (2.0 ** -4 * gq.abs() + 2.0 ** -10) * tile_scale
                    + 0.01 * c[p].abs() + 1e-3).all()


def check_indexer_rows(m: C8Model, r, s, q, before_k, before_s):
    """The indexer key bytes and scales the layer wrote (LI C8) against the rotated exact key quantised here."""
    d = m.d
    k = indexer_keys(d, m.idx, m.iw, m.xs[r][:s], torch.arange(s)) @ m.hn
    rq, rs = quantise(k, m.c8)
    qmax = QMAX[m.c8]
    for p in range(s - q, s):
        blk, off = m.where(r, p)
        gk = m.idx_k[blk, off, 0].to(F64)
        gs = m.idx_scale[blk, off, 0, 0].to(F64)
        assert m.idx_scale[blk, off, 0, 0].dtype == m.scale_dtype
        assert not torch.equal(raw(m.idx_k[blk, off, 0]), raw(before_k[blk, off, 0])), "key not written"
        assert float(gk.abs().max()) == qmax
        torch.testing.assert_close(gs, rs[p], rtol=3e-2, atol=0)
        if m.c8 == torch.int8:
            dq = (gk - rq[p]).abs()
            assert dq.max() <= 2 and dq.mean() < 0.3, (p, dq.max(), dq.mean())
        # dequantised: within half a quantisation step (fp8: a relative step) plus bf16 noise
        step = 0.5 * gs if m.c8 == torch.int8 else 2.0 ** -3 * gk.abs() * gs + gs * 2.0 ** -9
        assert ((gk * gs - k[p]).abs() <= step + 0.02 * k[p].abs().max()).all()


def run_case(seq_lens, q_lens, *, sfa_c8, li_c8, device_kind="a2", dtype=torch.bfloat16, spec=0, pad=0, seed=0):
    m = C8Model(seq_lens, sfa_c8=sfa_c8, li_c8=li_c8, device_kind=device_kind, dtype=dtype, seed=seed)
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        m.fill(r, s - q)
    md = m.builder(num_speculative_tokens=spec).build(_qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32),
                                                      m.table, num_input_tokens=sum(q_lens) + pad)
    hidden = torch.cat([m.xs[r][s - q:] for r, (s, q) in enumerate(zip(seq_lens, q_lens))]
                       + [torch.randn(pad, m.d.hidden, generator=m.g).to(dtype)])
    impl = m.impl()
    assert (impl.sfa_c8, impl.li_c8) == (sfa_c8, li_c8)
    before = [t.clone() for t in m.all_caches()]
    out = torch.full_like(hidden, 7.0)
    impl.forward(hidden, m.caches(), md, out)
    assert impl.last_topk_source == "indexer"
    topk = impl.last_topk[:, 0].to(torch.int64)
    # Every cache byte outside the new tokens' slots is as it was (slot -1 of the padding skipped).
    written = {m.where(r, p) for r, (s, q) in enumerate(zip(seq_lens, q_lens)) for p in range(s - q, s)}
    for now, was in zip(m.all_caches(), before):
        keep = torch.ones(now.shape[:2], dtype=torch.bool)
        for blk, off in written:
            keep[blk, off] = False
        assert torch.equal(now.view(torch.uint8)[keep], was.view(torch.uint8)[keep])
    t0, decided = 0, 0
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        rows = topk[t0:t0 + q]
        decided += check_topk(m, r, s, q, rows)
        got = out[t0:t0 + q].to(F64)
        # Against the reference over the keys the caches hold (the dequantised rows with SFA C8).
        torch.testing.assert_close(got, attend_cached(m, r, s, q, rows), atol=2e-2, rtol=2e-2)
        # Against the exact (unquantised) model over the same selection: within the quantisation error. int8
        # tiles: half a step is 0.5/127 of the tile's amax per element (4e-2 on the output); fp8 e4m3 rows (A5):
        # half a step is up to 2^-4 of each element itself (~3.6% rms for the Gaussian-like latents, against
        # int8's ~1%), so the allowance doubles (8e-2). The tight check is the one above (the cached keys).
        qtol = (8e-2 if m.c8 == FP8 else 4e-2) if sfa_c8 else 2e-2
        torch.testing.assert_close(got, sfa_attend_request(m.d, m.ws, m.xs[r][:s], q, m.scale, rows),
                                   atol=qtol, rtol=qtol)
        if sfa_c8:
            check_packed_rows(m, r, s, q, before[0])
        if li_c8:
            n_main = 1 if sfa_c8 else 2
            check_indexer_rows(m, r, s, q, before[n_main], before[n_main + 1])
        t0 += q
    if pad:
        assert torch.count_nonzero(out[t0:]) == 0
    assert decided > 0  # the margin check decided something
    return m, md, impl, out


BATCHES = {
    "decode": dict(seq_lens=[5, 20, 33, 9], q_lens=[1, 1, 1, 1]),
    "prefill_with_context": dict(seq_lens=[40, 19], q_lens=[9, 19]),
    "mixed": dict(seq_lens=[40, 7, 25, 30], q_lens=[1, 7, 9, 1]),
    "speculative": dict(seq_lens=[21, 14, 9], q_lens=[2, 2, 2], spec=1),
}


@pytest.mark.parametrize("sfa_c8,li_c8", COMBOS, ids=COMBO_IDS)
@pytest.mark.parametrize("batch", list(BATCHES))
def test_every_combination(batch, sfa_c8, li_c8):
    run_case(**BATCHES[batch], sfa_c8=sfa_c8, li_c8=li_c8)


@pytest.mark.parametrize("sfa_c8,li_c8", COMBOS[1:], ids=COMBO_IDS[1:])
def test_fp16_and_padding(sfa_c8, li_c8):
    run_case([12, 30], [1, 3], sfa_c8=sfa_c8, li_c8=li_c8, dtype=torch.float16, pad=3, seed=5)


@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_a5_fp8_indexer(batch):
    # A5: fp8 e4m3 keys with fp32 scales, torch_npu's npu_quant_lightning_indexer (its twin takes fp8).
    run_case(**BATCHES[batch], sfa_c8=False, li_c8=True, device_kind="a5")


@pytest.mark.parametrize("li_c8", [False, True], ids=["sfa_c8", "sfa_c8+li_c8"])
@pytest.mark.parametrize("batch", ["decode", "mixed", "prefill_with_context"])
def test_a5_fp8_sfa_c8(batch, li_c8):
    # A5's packed rows are fp8 e4m3 in the A2/A3 byte order: npu_dynamic_block_quant with the fp8 dst_type
    # (scale = tile amax / 448, the nearest e4m3 value), torch_npu's npu_kv_quant_sparse_flash_attention.
    run_case(**BATCHES[batch], sfa_c8=True, li_c8=li_c8, device_kind="a5")


def test_a5_fp8_sfa_c8_fp16_padding():
    run_case([12, 30], [1, 3], sfa_c8=True, li_c8=True, device_kind="a5", dtype=torch.float16, pad=3, seed=5)


@pytest.mark.parametrize("dst_type", [24, 292], ids=["scalar_type", "torch_npu_code"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_quant_twin_fp8(dst_type, dtype):
    # npu_dynamic_block_quant's fp8 destination (A5's packed rows): per (1 x 128) tile, scale = amax / 448 in fp32,
    # y = e4m3(x / scale) (nearest, ties to even; e4m3's grid from _mx_reference). Bit-equal: the twin's fp32
    # quotient is recomputed here in fp32, the rounding to e4m3 in float64. A zero tile, a partial last tile
    # and 3-D input included.
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 300, generator=g) * torch.pow(2.0, torch.randint(-6, 6, (5, 300), generator=g))).to(dtype)
    x[1, :128] = 0
    y, scale = torch.ops.ascend_cpu.npu_dynamic_block_quant(x, dst_type=dst_type, row_block_size=1, col_block_size=128)
    assert y.dtype == FP8 and y.shape == x.shape and scale.dtype == torch.float32 and scale.shape == (5, 3)
    xf = torch.nn.functional.pad(x.float(), (0, 384 - 300)).view(5, 3, 128)
    want_s = xf.abs().amax(-1) / 448.0
    assert torch.equal(scale, want_s)
    safe = torch.where(want_s == 0, torch.ones_like(want_s), want_s)
    want_y = mx.e4m3_round((xf / safe[..., None]).to(F64)).view(5, 384)[:, :300]
    assert torch.equal(y.to(F64), want_y)
    assert float(y[1, :128].to(F64).abs().max()) == 0 and float(y.to(F64).abs().max()) == 448.0
    y3, s3 = torch.ops.ascend_cpu.npu_dynamic_block_quant(x.view(5, 1, 300), dst_type=dst_type)
    assert torch.equal(y3.view(5, 300).view(torch.uint8), y.view(torch.uint8)) and torch.equal(s3.view(5, 3), scale)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: dst_type=23"):
        torch.ops.ascend_cpu.npu_dynamic_block_quant(x, dst_type=23)
    with pytest.raises(RuntimeError, match="dst_type_max=127"):
        torch.ops.ascend_cpu.npu_dynamic_block_quant(x, dst_type=dst_type, dst_type_max=127.0)


def test_layers_reusing_the_topk_buffer_with_c8_caches():
    seq, q = [15, 26, 9], [1, 4, 1]
    m = C8Model(seq, sfa_c8=True, li_c8=True)
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    buf = sfa.TopkBuffer(64, m.idx.K)
    writer = m.impl(use_index_cache=True)
    out = torch.zeros_like(hidden)
    writer.forward(hidden, m.caches(), md, out, buf)
    # A layer without an indexer: its tuple is the main part only; li_c8 has no meaning there and is refused.
    with pytest.raises(ValueError, match="li_c8"):
        m.impl(indexer=False, li_c8=True)
    reader = m.impl(indexer=False)
    out2 = torch.zeros_like(hidden)
    reader.forward(hidden, m.caches(indexer=False), md, out2, buf)
    assert reader.last_topk_source == "reused" and torch.equal(reader.last_topk, writer.last_topk)
    torch.testing.assert_close(out2, out, atol=0, rtol=0)


def test_plain_layers_unchanged_next_to_c8_layers():
    # C8 and plain layers of one shape share the latent core's workspace: a plain layer's result is bit-identical
    # before and after C8 layers ran (and equal to test_sfa's reference).
    seq, q = [15, 26], [1, 4]
    plain = C8Model(seq, sfa_c8=False, li_c8=False)
    quant = C8Model(seq, sfa_c8=True, li_c8=True)
    for m in (plain, quant):
        for r, (s, ql) in enumerate(zip(seq, q)):
            m.fill(r, s - ql)
    mds = [m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table) for m in (plain, quant)]
    hidden = torch.cat([plain.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    p_impl, q_impl = plain.impl(), quant.impl()
    outs = []
    for impl, m, md in ((p_impl, plain, mds[0]), (q_impl, quant, mds[1]), (p_impl, plain, mds[0])):
        out = torch.zeros_like(hidden)
        impl.forward(hidden, m.caches(), md, out)
        outs.append(out)
    assert torch.equal(outs[0], outs[2])
    t0 = 0
    for r, (s, ql) in enumerate(zip(seq, q)):
        ref = sfa_attend_request(plain.d, plain.ws, plain.xs[r][:s], ql, plain.scale, p_impl.last_topk[t0:t0 + ql, 0])
        torch.testing.assert_close(outs[0][t0:t0 + ql].to(F64), ref, atol=2e-2, rtol=2e-2)
        t0 += ql


def test_graph_capture_replays_c8_decode_buckets():
    bucket, seq = 4, [9, 14, 20, 11]
    m = C8Model(seq, sfa_c8=True, li_c8=True, spare_blocks=8)
    for r, s in enumerate(seq):
        m.fill(r, s - 1)
    builder = m.builder(graph_decode_padding=True)
    impl = m.impl()
    hidden = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    out = torch.zeros(bucket, m.d.hidden, dtype=m.dtype)
    g = aar.GraphParams("recording")
    md = builder.build_for_graph_capture(_qsl([1] * bucket), torch.tensor(seq, dtype=torch.int32), m.table,
                                         num_input_tokens=bucket)
    before = [raw(t) for t in m.all_caches()]
    with g.capture(bucket):
        impl.forward(hidden, m.caches(), md, out)
    assert all(torch.equal(raw(t), b) for t, b in zip(m.all_caches(), before))  # recorded, not run
    for B in (4, 2):
        md = builder.build(_qsl([1] * B), torch.tensor(seq[:B], dtype=torch.int32), m.table[:B],
                           num_input_tokens=bucket)
        hidden.zero_()
        hidden[:B] = torch.cat([m.xs[r][seq[r] - 1: seq[r]] for r in range(B)])
        g.replay(bucket)
        topk = impl.last_topk[:, 0].to(torch.int64)
        for r in range(B):
            torch.testing.assert_close(out[r:r + 1].to(F64), attend_cached(m, r, seq[r], 1, topk[r:r + 1]),
                                       atol=2e-2, rtol=2e-2)
        assert torch.count_nonzero(out[B:]) == 0


# ----------------------------------------------------------------------------- bad input


def _bad_tuples(m: C8Model):
    """(label, tuple, substring of the message) for the layer's combination: every entry's length, dtype,
    shape and layout broken in turn."""
    c = m.caches()
    n_main = 1 if m.sfa_c8 else 2
    other_c8 = torch.int8 if m.c8 == FP8 else FP8
    cases = [
        ("one short", c[:-1], "composed tuple"),
        ("one extra", c + [c[-1]], "composed tuple"),
        ("empty", [], "composed tuple"),
    ]
    if m.sfa_c8:
        p = m.packed
        cases += [
            ("packed float", [torch.zeros(p.shape, dtype=m.dtype)] + c[1:], "packed SFA C8"),
            ("packed other byte dtype", [p.view(torch.int8).view(other_c8)] + c[1:], "packed SFA C8"),
            ("packed width", [p[..., :-1].contiguous()] + c[1:], "packed SFA C8"),
            ("packed strided", [torch.zeros(p.shape[0], 2, *p.shape[1:], dtype=torch.int8).view(p.dtype)[:, 0]]
             + c[1:], "packed SFA C8"),
            ("latent and rope instead", [m.nope, m.rope] + c[1:], "composed tuple"),
        ]
    else:
        cases += [
            ("latent quantised", [m.nope.to(torch.int8)] + c[1:], "latent"),
            ("rope width", [c[0], m.rope[..., :-2].contiguous()] + c[2:], "rope"),
            ("packed instead", [torch.zeros(m.nb, m.bs, 1, ROW, dtype=torch.int8)] + c[2:], "composed tuple"),
        ]
    k = m.idx_k
    if m.li_c8:
        s = m.idx_scale
        other_scale = torch.float32 if s.dtype == torch.float16 else torch.float16
        cases += [
            ("indexer k float", c[:n_main] + [torch.zeros(k.shape, dtype=m.dtype), s], "indexer k"),
            ("indexer k other byte dtype", c[:n_main] + [k.view(torch.int8).view(other_c8), s], "indexer k"),
            ("indexer k width", c[:n_main] + [k[..., :-1].contiguous(), s], "indexer k"),
            ("indexer scale dtype", c[:n_main] + [k, s.to(other_scale)], "indexer scale"),
            ("indexer scale width", c[:n_main] + [k, torch.zeros(*s.shape[:3], 2, dtype=s.dtype)], "indexer scale"),
            ("indexer scale blocks", c[:n_main] + [k, torch.cat([s, s[:1]])], "indexer scale"),
            ("indexer scale strided", c[:n_main] + [k, s.transpose(0, 1).contiguous().transpose(0, 1)],
             "indexer scale"),
            ("no scale", c[:n_main] + [k], "composed tuple"),
        ]
    else:
        cases += [
            ("indexer k quantised", c[:n_main] + [k.to(torch.int8)], "indexer k"),
            ("indexer k width", c[:n_main] + [k[..., :-1].contiguous()], "indexer k"),
            ("indexer k strided", c[:n_main] + [k.transpose(1, 2)], "indexer k"),
        ]
    return cases


@pytest.mark.parametrize("device_kind", ["a2", "a5"])
@pytest.mark.parametrize("sfa_c8,li_c8", COMBOS, ids=COMBO_IDS)
def test_bad_tuples_are_rejected_by_name_before_any_write(sfa_c8, li_c8, device_kind):
    seq, q = [15, 26], [1, 4]
    m = C8Model(seq, sfa_c8=sfa_c8, li_c8=li_c8, device_kind=device_kind)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    impl = m.impl()
    out = torch.full_like(hidden, 3.0)
    snap = [raw(t) for t in m.all_caches() + [m.nope, m.rope]]
    for label, kv, match in _bad_tuples(m):
        with pytest.raises(ValueError, match=match) as e:
            impl.forward(hidden, kv, md, out)
        assert all(torch.equal(raw(t), b) for t, b in zip(m.all_caches() + [m.nope, m.rope], snap)), label
        assert torch.equal(out, torch.full_like(hidden, 3.0)), label
        assert "kv_cache" in str(e.value), (label, str(e.value))


def test_construction_rejects_what_c8_cannot_take():
    m = C8Model([9], sfa_c8=False, li_c8=False)
    with pytest.raises(ValueError, match="kv_lora_rank=512"):
        Model([9], dims=MlaDims(), idx=C8_IDX, dtype=torch.bfloat16).impl(sfa_c8=True)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        Model([9], dims=C8_DIMS, idx=C8_IDX, dtype=torch.float32).impl(sfa_c8=True)
    with pytest.raises(ValueError, match="power of two"):
        Model([9], dims=C8_DIMS, idx=IdxDims(D=96), dtype=torch.bfloat16).impl(li_c8=True)
    with pytest.raises(ValueError, match="li_c8"):
        m.impl(indexer=False, li_c8=True)
    # fp32 weights take LI C8 (the indexer casts what its operator needs).
    Model([9], dims=MlaDims(), idx=IdxDims(D=32), dtype=torch.float32).impl(li_c8=True)


# ----------------------------------------------------------------------------- PROLOG_V3 on SFA C8 layers


class QC8Model(C8Model):
    """A C8 model with W8A8-dynamic projections: the layer gets the quantised weights, the context rows and the
    references the dequantised ones (docs/design/sfa.md §4.2: a W8A8-dynamic SFA C8 layer on a KV consumer takes PROLOG_V3)."""

    def __init__(self, seq_lens, **kw):
        super().__init__(seq_lens, **kw)
        from _quant_reference import quantize_mla_weights
        self.qkw, self.ws = quantize_mla_weights(self.ws, "w8a8_dynamic", self.dtype)

    def impl(self, indexer=True, **kw):
        ws = self.ws
        self.ws = self.qkw
        try:
            return super().impl(indexer=indexer, **kw)
        finally:
            self.ws = ws


@pytest.mark.parametrize("li_c8", [False, True], ids=["sfa_c8", "sfa_c8+li_c8"])
@pytest.mark.parametrize("batch", ["decode", "speculative"])
def test_prolog_v3_writes_the_packed_rows(batch, li_c8):
    seq_lens, q_lens, spec = BATCHES[batch]["seq_lens"], BATCHES[batch]["q_lens"], BATCHES[batch].get("spec", 0)
    m = QC8Model(seq_lens, sfa_c8=True, li_c8=li_c8)
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        m.fill(r, s - q)
    extra = dict(num_spec_tokens=torch.full((len(q_lens),), spec, dtype=torch.int32)) if spec else {}
    md = m.builder(num_speculative_tokens=spec).build(_qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32),
                                                      m.table, **extra)
    assert md.attn_state == (aar.AttentionState.SpecDecoding if spec else aar.AttentionState.DecodeOnly)
    hidden = torch.cat([m.xs[r][s - q:] for r, (s, q) in enumerate(zip(seq_lens, q_lens))])
    native, fused = m.impl(), m.impl(is_kv_consumer=True)
    assert native.preprocess == "native" and fused.preprocess == "prolog_v3", fused.preprocess_reason
    before = [t.clone() for t in m.all_caches()]
    outs, packed = [], []
    for impl in (native, fused):
        for t, b in zip(m.all_caches(), before):
            t.copy_(b)
        out = torch.full_like(hidden, 7.0)
        impl.forward(hidden, m.caches(), md, out)
        outs.append((out, impl.last_topk[:, 0].to(torch.int64)))
        packed.append(m.packed.clone())
    assert fused.last_preprocess == "prolog_v3" and native.last_preprocess == "native"
    # The fused layer wrote what the native one did: rows of the same latent key (within one quantisation step).
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        for p in range(s - q, s):
            blk, off = m.where(r, p)
            assert not torch.equal(raw(packed[1][blk, off, 0]), raw(before[0][blk, off, 0])), "row not written"
            gq, grope, gscale, gnope = unpack_rows(packed[1][blk, off, 0].view(torch.int8), m.dtype)
            nq, nrope, nscale, nnope = unpack_rows(packed[0][blk, off, 0].view(torch.int8), m.dtype)
            torch.testing.assert_close(gscale, nscale, rtol=2e-2, atol=0)
            torch.testing.assert_close(grope, nrope, rtol=2e-2, atol=2e-2)
            assert (gq - nq).abs().max() <= 2
        # ... and of the exact latent key (dequantised weights), within the tile step plus the activations'
        # per-token int8 quantisation.
        _, _, c, _ = project(m.d, m.ws, m.xs[r][:s], torch.arange(s))
        for p in range(s - q, s):
            blk, off = m.where(r, p)
            gq, _, gscale, gnope = unpack_rows(packed[1][blk, off, 0].view(torch.int8), m.dtype)
            tile_scale = gscale.repeat_interleave(TILE, -1)
            assert ((gnope - c[p]).abs() <= 0.5 * tile_scale + 0.03 * c[p].abs().max()).all()
    # Outputs: the float64 layer (dequantised weights) over the keys the fused layer wrote and its selection.
    out, topk = outs[1]
    t0 = 0
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        rows = topk[t0:t0 + q]
        check_topk(m, r, s, q, rows)
        torch.testing.assert_close(out[t0:t0 + q].to(F64), attend_cached(m, r, s, q, rows), atol=4e-2, rtol=4e-2)
        t0 += q
    torch.testing.assert_close(outs[1][0].to(F64), outs[0][0].to(F64), atol=4e-2, rtol=4e-2)
