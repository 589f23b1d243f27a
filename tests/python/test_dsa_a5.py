# The DSA layer forward (aar.dsa.Impl) on the A5 FP8 plan (docs/design/dsa.md §4.1 A5 column, §4.2 "A5 other"):
# SWA / compressed KV as 640-byte MXFP8 rows written by kv_compress_epilog (flat slots), the fp8 indexer k
# written by indexer_compress_epilog_v2 through the full byte view, fp8 indexer query + fp32 scales, fp32 LI
# weights, attention through npu_kv_quant_sparse_attn_sharedkv (kv_quant_mode 1, tile 64, rope 64). o_proj follows
# upstream's rule (dsa/impl.h): a bf16 checkpoint (no wo_a_scale) runs the grouped bf16 transpose-bmm, an MX-fp8
# checkpoint (fp8 wo_a (G, k, n) + its e8m0 wo_a_scale) runs npu_dynamic_mx_quant + npu_transpose_quant_batchmatmul
# (test_a5_mx_o_proj_against_reference, its references and tolerance described there).
#
# References, all float64 and written here or in _dsa_reference.py:
#  - ref:   _dsa_reference.dsa_layer (no quantisation at all);
#  - ref_q: the same layer composed from the reference's pieces (prolog q, sas_attention, inverse RoPE, o_proj)
#           attending over the KV rows DECODED from the A5 caches (nope fp8 * 2^(e8m0 - 127), rope bf16). The
#           decoded rows are themselves checked: bit-exact against the MXFP8 model of docs/design/dsa.md §1.4 applied to the A2
#           plan's bf16 rows of the same step (e8m0 exponent per 64 nope dims = the smallest e with
#           448 * 2^e >= amax, e4m3 round-to-nearest-even, rope bf16 verbatim, zero pad), and against the float64
#           reference rows within one e4m3 rounding plus the bf16 tolerance. (Quantising the float64 rows instead
#           is no model of the kernel: bf16 arithmetic moves values across e4m3 rounding midpoints, measured at
#           2-3x the bf16 tolerance on the output.) The C4 selection is the A5 run's own top-k, checked
#           separately against fp8-quantised float64 indexer scores.
# Tolerances (measured bound): the A5 output must match ref_q within a bf16 tolerance (OUT_TOL below); against
# ref (and against the A2 plan's output on the same weights and steps) the allowance is the measured float64
# quantisation effect |ref_q - ref| per element plus that bf16 tolerance (twice it against A2, which carries its
# own bf16 error). The fp8 error is never guessed: the float64 layer over the real quantised rows tells how much
# the quantisation may move the output (measured here: 0.03 - 0.08 on outputs of magnitude ~2, 3-7x the A2
# plan's error).
import math

import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
import _mx_reference as mx
from _dsa_harness import allocate_caches, group_kw, slot_rows

F64 = torch.float64
FP8 = torch.float8_e4m3fn
CBS = 32
MAXPOS = 1024
BF16_TOL = 3e-2  # the A2 tests' bf16 tolerance (cache rows)
# The output tolerance of the A5 run against ref_q, relative to the output's magnitude: the bf16 arithmetic of the
# layer, measured at <= 0.008 over these runs (the A2 plan against ref: <= 0.009); twice that. It is below the
# measured quantisation effect |ref_q - ref| (0.014 - 0.064 of the magnitude), so check 1 fails if the A5 path
# did not quantise as modelled.
OUT_TOL = 1.5e-2


def mx_exponent(amax):
    """Per-group e8m0 exponent (float64 tensor in, int64 out): smallest e with 448 * 2^e >= amax; 0 -> -127."""
    e = torch.ceil(torch.log2(torch.clamp(amax, min=1e-300) / 448.0))
    e = torch.where(448.0 * torch.pow(2.0, e) < amax, e + 1, e)
    e = torch.where(448.0 * torch.pow(2.0, e - 1) >= amax, e - 1, e)
    e = torch.clamp(e, -127, 127)
    return torch.where(amax == 0, torch.full_like(e, -127), e).to(torch.int64)


def mx_round_trip(rows):
    """The 640-byte row's value model (rows (n, 512), any float): bf16 input, nope MXFP8, rope bf16 -> float64."""
    x = rows.to(torch.bfloat16).to(F64)
    nope = x[:, :448].reshape(-1, 7, 64)
    e = mx_exponent(nope.abs().amax(-1, keepdim=True)).to(F64)
    q = (nope / torch.pow(2.0, e)).to(FP8).to(F64) * torch.pow(2.0, e)
    return torch.cat([q.reshape(-1, 448), x[:, 448:]], 1)


def decode_640(rows_u8):
    """(n, 640) uint8 cache rows -> ((n, 512) float64 values, (n, 7) exponents): nope fp8 * 2^(e8m0 - 127)."""
    e = rows_u8[:, 576:583].to(torch.int64) - 127
    nope = rows_u8[:, :448].contiguous().view(FP8).to(F64).view(-1, 7, 64) * torch.pow(2.0, e.to(F64))[..., None]
    rope = rows_u8[:, 448:576].contiguous().view(torch.bfloat16).to(F64)
    return torch.cat([nope.reshape(-1, 448), rope], 1), e


def fp8_row_quant(x):
    """Per-row fp8 with fp32 scale amax / 448 (the indexer's k and q quantisation), float64 value model."""
    x = x.to(F64)
    s = (x.abs().amax(-1, keepdim=True) / 448.0).to(torch.float32).to(F64)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (x / s).to(FP8).to(F64) * s


class Run:
    """One layer on plan "a2" or "a5" with its caches and builders; requests with fixed token streams."""

    def __init__(self, d, plan, nreq, seed=0, max_blocks=200, x=None, w=None):
        self.d, self.plan = d, plan
        self.dtype = torch.bfloat16
        g = torch.Generator().manual_seed(seed)
        self.w = w if w is not None else ref.make_dsa_weights(d, self.dtype, g)
        self.cos, self.sin = ref.rope_tables(MAXPOS, d.R)
        self.x = x if x is not None else [torch.randn(400, d.hidden, generator=g, dtype=F64).to(self.dtype)
                                          for _ in range(nreq)]
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin, head_dim=d.D,
                                      window=d.W, num_heads_q=d.N, index_topk=d.K, index_n_heads=d.n_idx,
                                      index_head_dim=d.Di)
        self.kinds = aar.dsa.layer_cache_kinds(d.ratio)
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables = {}, {}
        for kd in self.kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, device_kind=plan,
                                               model_dtype="bfloat16", max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb)
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
        self.rows = {kd: gb.storage_block_size for kd, gb in self.gb.items()}
        # The caches from the runtime's specs: on A5 the 640-byte fp8 rows and the indexer's raw pages viewed as
        # k rows, fp32 scales and the full byte rows (docs/design/dsa.md §2.2).
        c = allocate_caches(self.gb, self.dtype)
        self.swa, self.cmp, self.state, self.istate = c["swa"], c["compress_kv"], c["state"], c["indexer_state"]
        self.ik, self.isc, self.ifull, self.raw = c["indexer_k"], c["indexer_scale"], c["indexer_full"], c["indexer_raw"]
        self.kv = aar.dsa.compose_kv_cache(device_kind=plan, compress_kv=self.cmp, swa_kv=self.swa,
                                           state=self.state, indexer_state=self.istate, indexer_k=self.ik,
                                           indexer_scale=self.isc, indexer_full=self.ifull)
        self.impl = self.make_impl()
        self.S = [0] * nreq

    def make_impl(self, **kw):
        d = self.d
        return aar.dsa.Impl(self.w, hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R,
                            q_lora_rank=d.q_lora, compress_ratio=d.ratio, index_n_heads=d.n_idx,
                            index_head_dim=d.Di, index_topk=d.K, eps=d.eps, o_groups=d.G, o_lora_rank=d.o_lora,
                            device_kind=self.plan, model_dtype="bfloat16", **kw)

    def build(self, reqs, qlens):
        S = [self.S[b] + q for b, q in zip(reqs, qlens)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        st = self.sb.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32))
        md = {kd: self.gb[kd].build(st, self.tables[kd][reqs].contiguous()) for kd in self.kinds}
        return st, md, S, qsl

    def group_kw(self, md, st):
        return group_kw(self.d.ratio, md, st)

    def step(self, reqs, qlens):
        st, md, S, qsl = self.build(reqs, qlens)
        hid = torch.cat([self.x[b][S[i] - qlens[i]: S[i]] for i, b in enumerate(reqs)])
        out = torch.full_like(hid, float("nan"))
        self.impl.forward(hid, self.kv, st, md["swa"], out, **self.group_kw(md, st))
        for i, b in enumerate(reqs):
            self.S[b] = S[i]
        return out, qsl, S

    def slot_rows(self, cache, kd, b, n):
        return slot_rows(cache, self.tables[kd][b], n)


def dims(ratio, **kw):
    # the A5 fp8 rows fix D = 512, R = 64 (Fp8KvRowLayout); the indexer head dim is the layer's (>= R)
    base = dict(hidden=64, N=2, D=512, R=64, q_lora=32, W=8, ratio=ratio, n_idx=4, Di=64, K=8, G=2, o_lora=16)
    base.update(kw)
    return ref.DsaDims(**base)


def ref_q_attn(d, w, x_all, q_len, cos, sin, topk, swa_rows, cmp_rows):
    """The o_proj input (q_len, N, D) of dsa_layer attending over the given (decoded) SWA / compressed KV rows."""
    S = x_all.shape[0]
    pos = torch.arange(S - q_len, S)
    q_all, _ = ref.prolog(d, w, x_all, torch.arange(S), cos, sin)
    o = ref.sas_attention(d, q_all[S - q_len:], swa_rows, cmp_rows, pos, w["attn_sink"],
                          topk if d.ratio == 4 else None)
    o[..., d.D - d.R:] = ref.interleave_rope(o[..., d.D - d.R:], cos[pos], -sin[pos])
    return o


def ref_q_layer(d, w, x_all, q_len, cos, sin, topk, swa_rows, cmp_rows):
    """dsa_layer attending over the given (decoded) SWA / compressed KV rows instead of the float64 ones."""
    return ref.o_proj(d, w, ref_q_attn(d, w, x_all, q_len, cos, sin, topk, swa_rows, cmp_rows))


def decoded_rows(a5, b, S):
    """(SWA rows (S, 512), compressed rows (S // ratio, 512) or None) of request b decoded from the A5 caches."""
    d = a5.d
    swa = decode_640(a5.slot_rows(a5.swa.view(torch.uint8), "swa", b, S))[0]
    cmp = None
    if d.ratio > 1:
        kd = "c4_kv" if d.ratio == 4 else "c128_kv"
        cmp = decode_640(a5.slot_rows(a5.cmp.view(torch.uint8), kd, b, S // d.ratio))[0]
    return swa, cmp


def check_step(a5, a2, reqs, qlens, out5, out2, qsl, S):
    d = a5.d
    for i, b in enumerate(reqs):
        o5 = out5[qsl[i]: qsl[i + 1]].to(F64)
        o2 = out2[qsl[i]: qsl[i + 1]].to(F64)
        tk = None
        if d.ratio == 4:
            tk = a5.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64)
        xs = a5.x[b][: S[i]]
        want = ref.dsa_layer(d, a5.w, xs, qlens[i], a5.cos, a5.sin, topk=tk)
        want_q = ref_q_layer(d, a5.w, xs, qlens[i], a5.cos, a5.sin, tk, *decoded_rows(a5, b, S[i]))
        scale = max(1.0, want.abs().max().item())
        bf = OUT_TOL * scale
        # 1. the A5 run is the quantised model up to bf16 arithmetic
        assert bool(((o5 - want_q).abs() <= bf).all()), float((o5 - want_q).abs().max())
        # 2. against the unquantised reference: the measured quantisation effect plus bf16
        qerr = (want_q - want).abs()
        assert bool(((o5 - want).abs() <= qerr + bf).all())
        # the quantisation did move the output (the fp8 path really ran), and by a small amount
        assert qerr.max().item() > 0
        assert qerr.max().item() <= 0.1 * scale
        # 3. against the A2 plan on the same weights and steps (A2's own selection on C4 may differ: only
        #    rows whose selections agree are compared)
        rows = range(qlens[i])
        if d.ratio == 4:
            t2 = a2.impl.last_topk[qsl[i]: qsl[i + 1], 0]
            t5 = a5.impl.last_topk[qsl[i]: qsl[i + 1], 0]
            rows = [j for j in rows if set(t2[j].tolist()) == set(t5[j].tolist())]
        for j in rows:
            assert bool(((o5[j] - o2[j]).abs() <= qerr[j] + 2 * bf).all()), (b, j)


def check_caches(a5, a2, b):
    """The A5 640-byte rows decoded (nope fp8 * 2^(e8m0 - 127), rope bf16) are the A2 plan's bf16 rows within one
    e4m3 rounding (half ulp: 2^-4 relative, 2^(e - 10) in the subnormal range), rope verbatim; and the float64
    reference's rows within that plus the bf16 tolerance the A2 tests use."""
    d = a5.d
    S = a5.S[b]
    xs = a5.x[b][:S]
    pairs = [("swa", a5.swa, a2.swa, ref.swa_rows(d, a5.w, xs, a5.cos, a5.sin))]
    if d.ratio > 1:
        kd = "c4_kv" if d.ratio == 4 else "c128_kv"
        pairs.append((kd, a5.cmp, a2.cmp, ref.compressed_kv_rows(d, a5.w, xs, a5.cos, a5.sin)))
    for kd, c5, c2, want in pairs:
        n = want.shape[0]
        dec, e = decode_640(a5.slot_rows(c5.view(torch.uint8), kd, b, n))
        plain = a2.slot_rows(c2, kd, b, n).to(F64)
        assert torch.equal(dec[:, 448:], plain[:, 448:]), kd
        # bit-exact: the MXFP8 model of the A2 plan's bf16 rows
        assert torch.equal(dec, mx_round_trip(plain)), kd
        half_ulp = (plain[:, :448].abs() * 2.0 ** -4).view(-1, 7, 64) + torch.pow(2.0, (e - 10).to(F64))[..., None]
        assert bool(((dec[:, :448] - plain[:, :448]).abs().view(-1, 7, 64) <= half_ulp).all()), kd
        # the exponents are the e8m0 rule on the bf16 rows
        assert torch.equal(e, mx_exponent(plain[:, :448].view(-1, 7, 64).abs().amax(-1))), kd
        fp8_bound = want.abs() * (2.0 ** -4 + 2 * BF16_TOL) + 4 * BF16_TOL
        assert bool(((dec - want).abs() <= fp8_bound).all()), kd
        # nothing beyond the written rows
        rows = c5.shape[1]
        nxt = a5.tables[kd][b][n // rows]
        assert torch.count_nonzero(c5.view(torch.uint8)[nxt, n % rows]) == 0
        # the pad bytes of every written row stay zero
        raw = a5.slot_rows(c5.view(torch.uint8), kd, b, n)
        assert torch.count_nonzero(raw[:, 583:]) == 0
    if d.ratio == 4:
        k = ref.indexer_k_rows(d, a5.w, xs, a5.cos, a5.sin)
        n = k.shape[0]
        kq = a5.slot_rows(a5.ik, "c4_indexer_k", b, n).to(F64)
        sc = a5.slot_rows(a5.isc.unsqueeze(-1), "c4_indexer_k", b, n).to(F64)
        amax = k.abs().amax(-1, keepdim=True)
        assert bool(((sc - amax / 448).abs() <= 0.05 * amax / 448 + 1e-12).all())
        deq = kq * sc
        assert bool(((deq - k).abs() <= k.abs() * 2.0 ** -4 + sc * 2.0 ** -9 + 0.02 * amax + 1e-6).all())


def check_topk(a5, reqs, qlens, qsl, S):
    """The A5 selection is the top-K of the float64 scores computed from the fp8-quantised indexer q (per token and
    head) and k (per row), up to the bf16 drift of the inputs; counts and ranges exact."""
    d = a5.d
    tk = a5.impl.last_topk
    for i, b in enumerate(reqs):
        xs = a5.x[b][: S[i]]
        pos = torch.arange(S[i] - qlens[i], S[i])
        k = fp8_row_quant(ref.indexer_k_rows(d, a5.w, xs, a5.cos, a5.sin))
        qi, wt = ref.indexer_queries(d, a5.w, xs[S[i] - qlens[i]:], pos, a5.cos, a5.sin)
        qi = fp8_row_quant(qi)
        scores = (wt[:, :, None] * torch.relu(torch.einsum("thd,cd->thc", qi, k))).sum(1)
        for j in range(qlens[i]):
            vis = ref.visible_compressed(int(pos[j]), 4)
            sel = [int(e) for e in tk[qsl[i] + j, 0].tolist() if e >= 0]
            assert len(sel) == min(vis, d.K) and len(set(sel)) == len(sel) and all(0 <= e < vis for e in sel)
            rest = [c for c in range(vis) if c not in sel]
            if rest:
                row = scores[j]
                margin = 0.05 * row[:vis].abs().max().item() + 1e-6
                assert min(row[e].item() for e in sel) >= max(row[c].item() for c in rest) - margin


PLANS = {
    1: [([0, 1], [13, 5]), ([0, 1], [7, 20]), ([0, 1, 2], [1, 1, 9]), ([0, 1, 2], [1, 1, 1]),
        ([0, 2, 1], [1, 1, 6])],
    128: [([0], [90]), ([0, 1], [50, 129]), ([1, 0], [1, 100]), ([1, 0], [1, 1])],
    4: [([0], [23]), ([0, 1], [18, 10]), ([0, 1], [1, 1]), ([0, 1], [1, 14]), ([1, 0], [1, 9])],
}


@pytest.mark.parametrize("ratio", [1, 128, 4], ids=["swa", "c128", "c4"])
def test_a5_fp8_plan_against_reference_and_a2(ratio):
    d = dims(ratio)
    nreq = 3
    a5 = Run(d, "a5", nreq)
    a2 = Run(d, "a2", nreq, w=a5.w, x=a5.x)
    for reqs, qlens in PLANS[ratio]:
        out5, qsl, S = a5.step(reqs, qlens)
        out2, _, _ = a2.step(reqs, qlens)
        assert a5.impl.o_proj == "Bmm" and a2.impl.o_proj == "Bmm"  # bf16 checkpoints: the grouped bmm
        assert torch.isfinite(out5).all()
        if ratio == 4:
            assert a5.impl.last_topk.shape == (sum(qlens), 1, d.K)
            check_topk(a5, reqs, qlens, qsl, S)
        check_step(a5, a2, reqs, qlens, out5, out2, qsl, S)
        for b in reqs:
            check_caches(a5, a2, b)


def mx_weights(w):
    """An MX-fp8 checkpoint of the bf16 weights w: wo_a quantised along k in upstream's (G, k, n) layout with its
    e8m0 scales (G, k / 64, n, 2) (_mx_reference, OCP rule); returns (the layer's weights, the reference's weights
    with wo_a = the decoded fp8 values)."""
    w8, ws, wdeq = mx.quantize_weight_kn(w["wo_a"])
    return dict(w, wo_a=w8, wo_a_scale=ws), dict(w, wo_a=wdeq)


def mx_o_proj(d, w_ref, o):
    """The float64 model of the MX-fp8 o_proj: o (T, N, D) in the layer's bf16, viewed (T, G, k), MX-quantised per
    32 values (OCP rule), times the decoded wo_a per group, the bf16 result of the quantised bmm, then wo_b."""
    T = o.shape[0]
    og = o.to(torch.bfloat16).to(F64).reshape(T, d.G, d.N * d.D // d.G)
    y = torch.einsum("tgi,gio->tgo", mx.round_trip(og), w_ref["wo_a"]).to(torch.bfloat16).to(F64)
    return y.reshape(T, d.G * d.o_lora) @ w_ref["wo_b"].to(F64).T


# The MX o_proj's tolerance against its float64 model (relative to the output's magnitude, as OUT_TOL). The model
# quantises the reference's o_proj input rounded to bf16, the layer its own bf16 o; where the two bf16 values differ
# (the attention's bf16 arithmetic) an element may land on the neighbouring e4m3 value, 2^-3 of it, and a few such
# flips per group of k = 512 values move the output by ~1-2 % of its magnitude. Measured over these runs (seed 7):
# 0.016 (SWA), 0.022 (C128), 0.020 (C4); the same runs with the decoded wo_a as a bf16 checkpoint (no MX o_proj)
# against ref_q: 0.005-0.008. MX_TOL is ~1.8x the largest measured. It stays below the o_proj's quantisation effect
# (the run against the unquantised o_proj: 0.055), and the run is checked to follow the MX model ~3x more closely
# than the unquantised o_proj (sum of per-request max errors: ratio 0.29-0.32, required < 0.75).
MX_TOL = 4e-2


@pytest.mark.parametrize("ratio", [1, 128, 4], ids=["swa", "c128", "c4"])
def test_a5_mx_o_proj_against_reference(ratio):
    """An A5 fp8 layer with an MX-fp8 checkpoint, over multi-step runs, against three float64 references: want_mx
    (ref_q's attention over the decoded A5 KV rows, then the MX o_proj model: the o_proj input and wo_a quantised as
    the kernels do), want_q (the same attention, the unquantised o_proj with the bf16 wo_a) and want (no
    quantisation at all). The run must follow want_mx within MX_TOL; it must be measurably closer to want_mx than
    to want_q (the o_proj really quantised, as modelled); and its distance to want is the measured quantisation
    effect |want_mx - want| plus MX_TOL."""
    d = dims(ratio)
    nreq = 3
    w = ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(7))
    w_mx, w_ref = mx_weights(w)
    a5 = Run(d, "a5", nreq, w=w_mx, seed=7)
    assert a5.impl.o_proj == "MxFp8QuantBmm"
    closer = []
    for reqs, qlens in PLANS[ratio]:
        out5, qsl, S = a5.step(reqs, qlens)
        assert torch.isfinite(out5).all()
        for i, b in enumerate(reqs):
            o5 = out5[qsl[i]: qsl[i + 1]].to(F64)
            tk = a5.impl.last_topk[qsl[i]: qsl[i + 1], 0].to(torch.int64) if ratio == 4 else None
            xs = a5.x[b][: S[i]]
            o = ref_q_attn(d, w, xs, qlens[i], a5.cos, a5.sin, tk, *decoded_rows(a5, b, S[i]))
            want_mx = mx_o_proj(d, w_ref, o)
            want_q = ref.o_proj(d, w, o)
            want = ref.dsa_layer(d, w, xs, qlens[i], a5.cos, a5.sin, topk=tk)
            scale = max(1.0, want.abs().max().item())
            err_mx = (o5 - want_mx).abs()
            assert float(err_mx.max()) <= MX_TOL * scale, (b, float(err_mx.max()) / scale)
            closer.append((float(err_mx.max()), float((o5 - want_q).abs().max())))
            qerr = (want_mx - want).abs()
            assert bool(((o5 - want).abs() <= qerr + MX_TOL * scale).all())
            assert 0 < qerr.max().item() <= 0.15 * scale
    # over the run, the MX model explains the output better than the unquantised o_proj does
    assert sum(a for a, _ in closer) < 0.75 * sum(b for _, b in closer), closer


def test_o_proj_rule_plan_and_weight_scale():
    """Upstream's rule: the MX o_proj iff the plan allows it (A5) and the checkpoint has wo_a's scale; the scale on
    a plan without it, an fp8 wo_a without its scale and malformed scales are refused by name."""
    d = dims(1)
    w = ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(3))
    w_mx, _ = mx_weights(w)
    kw = dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora, window=d.W,
              o_groups=d.G, o_lora_rank=d.o_lora)
    assert aar.dsa.Impl(w, device_kind="a5", **kw).o_proj == "Bmm"  # bf16 checkpoint on A5
    assert aar.dsa.Impl(w_mx, device_kind="a5", **kw).o_proj == "MxFp8QuantBmm"
    assert aar.dsa.Impl(w_mx, device_kind="a5", cache_dtype=None, **kw).o_proj == "MxFp8QuantBmm"
    assert aar.dsa.Impl(w, device_kind="a2", **kw).o_proj == "Bmm"
    with pytest.raises(ValueError, match="wo_a_scale is given but the plan's o_proj is Bmm"):
        aar.dsa.Impl(w_mx, device_kind="a2", **kw)
    with pytest.raises(ValueError, match="wo_a_scale is not given"):
        aar.dsa.Impl({k: v for k, v in w_mx.items() if k != "wo_a_scale"}, device_kind="a5", **kw)
    with pytest.raises(ValueError, match=r"wo_a_scale must have shape"):
        aar.dsa.Impl(dict(w_mx, wo_a_scale=w_mx["wo_a_scale"][:, :1].contiguous()), device_kind="a5", **kw)
    with pytest.raises(ValueError, match="wo_a_scale is Float"):
        aar.dsa.Impl(dict(w_mx, wo_a_scale=w_mx["wo_a_scale"].view(torch.uint8).float()), device_kind="a5", **kw)
    with pytest.raises(ValueError, match="wo_a is BFloat16, expected Float8_e4m3fn"):
        aar.dsa.Impl(dict(w_mx, wo_a=w["wo_a"]), device_kind="a5", **kw)
    with pytest.raises(ValueError, match="weight wo_a must have shape"):
        aar.dsa.Impl(dict(w_mx, wo_a=w_mx["wo_a"].transpose(1, 2).contiguous()), device_kind="a5", **kw)
    # the scales' raw bytes (uint8, as npu_dynamic_mx_quant returns them) are taken as e8m0
    assert aar.dsa.Impl(dict(w_mx, wo_a_scale=w_mx["wo_a_scale"].view(torch.uint8)), device_kind="a5",
                        **kw).o_proj == "MxFp8QuantBmm"
    # k = N D / G must be a multiple of 64 on the MX path (G = 16: k = 64 passes; a 1024 / 32 = 32 does not)
    d32 = dims(1, G=32, o_lora=4)
    w32 = ref.make_dsa_weights(d32, torch.bfloat16, torch.Generator().manual_seed(5))
    w32["wo_a_scale"] = torch.zeros(32, 0, 4, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of 64"):
        aar.dsa.Impl(w32, device_kind="a5", **dict(kw, o_groups=32, o_lora_rank=4))
    # the former escape hatch is gone (a bf16 checkpoint takes the bmm by the rule above)
    with pytest.raises(TypeError):
        aar.dsa.Impl(w, device_kind="a5", o_proj_override="Bmm", **kw)


def test_a5_plan_needs_d512_r64():
    for D, R in [(256, 64), (512, 32)]:
        d = dims(1, D=D, R=R)
        w = ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(4))
        with pytest.raises(ValueError, match="head_dim 512 and rope_dim 64"):
            aar.dsa.Impl(w, hidden_size=d.hidden, num_heads=d.N, head_dim=D, rope_dim=R, q_lora_rank=d.q_lora,
                         window=d.W, o_groups=d.G, o_lora_rank=d.o_lora, device_kind="a5")


def test_a5_bad_caches_named_before_writing():
    d = dims(4)
    run = Run(d, "a5", 1)
    st, md, S, qsl = run.build([0], [9])
    hid = run.x[0][:9].clone()
    out = torch.zeros_like(hid)
    kw = run.group_kw(md, st)
    snap = [t.clone() for t in (run.swa, run.cmp, run.state, run.istate, run.raw)]

    def untouched():
        for a, b in zip(snap, (run.swa, run.cmp, run.state, run.istate, run.raw)):
            assert torch.equal(a.view(torch.uint8) if a.dtype == FP8 else a,
                               b.view(torch.uint8) if b.dtype == FP8 else b)

    # the 6-entry tuple: the A5 plan needs the full indexer view
    with pytest.raises(ValueError, match="kv_cache has 6 entries"):
        run.impl.forward(hid, list(run.kv)[:6], st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[1] = torch.zeros(run.nb, CBS, 1, d.D, dtype=torch.bfloat16)  # plain rows on the fp8 plan
    with pytest.raises(ValueError, match="swa_kv"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[0] = torch.zeros(run.nb, CBS, 1, 640, dtype=torch.bfloat16)  # 640 wide, wrong dtype
    with pytest.raises(ValueError, match="compress_kv"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[5] = torch.zeros(run.nb, CBS, 1, dtype=torch.float16)  # the A2 scale dtype
    with pytest.raises(ValueError, match="indexer_scale"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[4] = torch.zeros(run.nb, CBS, 1, d.Di, dtype=torch.int8)  # the A2 k dtype
    with pytest.raises(ValueError, match="indexer_k"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[6] = torch.zeros(run.nb, CBS, 1, d.Di, dtype=torch.uint8)  # full view without the scale bytes
    with pytest.raises(ValueError, match="indexer_full"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    bad = list(run.kv)
    bad[6] = torch.zeros(run.nb, CBS, 1, d.Di + 4, dtype=torch.float32)  # not a byte view
    with pytest.raises(ValueError, match="indexer_full"):
        run.impl.forward(hid, bad, st, md["swa"], out, **kw)
    # a group built under another plan (the A2 plan's block/offset slots) would have its slots misread
    other = aar.dsa.GroupBuilder(run.sb, kind="swa", cache_block_size=CBS, device_kind="a2", max_blocks_per_req=200,
                                 num_blocks=run.nb)
    st2 = run.sb.build(torch.tensor([0, 9], dtype=torch.int32), torch.tensor([9], dtype=torch.int32))
    md2 = {k: run.gb[k].build(st2, run.tables[k][[0]].contiguous()) for k in run.kinds}
    md2["swa"] = other.build(st2, run.tables["swa"][[0]].contiguous())
    with pytest.raises(ValueError, match="metadata.swa has BLOCK_OFFSET slots but the layer's plan"):
        run.impl.forward(hid, run.kv, st2, md2["swa"], out, **run.group_kw(md2, st2))
    untouched()
    assert torch.equal(out, torch.zeros_like(out))
