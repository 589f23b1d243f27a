"""MXFP8 (A5) MLA layers: the W8A8-MXFP8 fused_qkv_a_proj and q_proj on the native preprocess
(npu_dynamic_mx_quant + npu_quant_matmul's MX mode, through their CPU twins) against a float64 reference of
the quantised computation, and the fused preprocesses refused by name with their reason.

The reference (_mla_reference with _quant_reference.mx_activations) is written from the definitions, not from
the runtime: the weights MX-quantised per output row and 32 inputs (OCP rule, e4m3 elements, e8m0 scales; the
dequantised weights are exact in bf16 / fp16), the activations a quantised projection reads (the hidden states,
and c_q before q_proj) replaced by their MX-fp8 values, everything else float64.

Tolerances (derived):
* against the reference of the quantised computation: the layer's own bf16 / fp16 roundings (y, c_q, q, the
  latent query, the cache rows, the bf16 prefill attention, o_proj) plus the elements of c_q that land on the
  other side of an e4m3 rounding boundary (the layer quantises its bf16 c_q, the reference its float64 one
  rounded to bf16: they differ by about a bf16 step, 2^-8 relative, against the e4m3 step of 2^-3, so about
  Q * 2^-5 = 2 elements per token; each moves one q_proj input by an e4m3 step, ~1e-2 on q). The float bf16 layer on the same
  (dequantised) weights is itself 6e-2 off the float64 reference at these dims (output scale ~3.5), the fp16
  one ~5e-3: atol = rtol = 6e-2 (bf16, as test_mla_quant's bf16 W8A8 paths), 1e-2 (fp16).
* against the float64 reference without activation quantisation: the MX error itself. Each activation element
  is off by at most half an e4m3 step (2^-4 relative) or, for a block maximum the OCP rule saturates to 448 *
  2^e, by at most 12.5%; sums over 32+ such random errors come to a few percent of the projection's scale. The
  test asserts that this error is below 0.15 of the output's scale and, in fp16 (whose own rounding is small),
  several times larger than the error against the quantised reference (so the reference models what the layer
  computes).
"""

from __future__ import annotations

import math

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, attend_request, fill_context, make_weights, rope_tables
from _quant_reference import mx_activations, quantize_mla_weights_mx

mla = aar.mla
F64 = torch.float64
# Every quantised linear's input size a multiple of 32 (hidden 128, Q 64).
D = MlaDims(H=4, hidden=128, Q=64, L=64, P=32, R=16, V=32)
TOL = {torch.bfloat16: dict(atol=6e-2, rtol=6e-2), torch.float16: dict(atol=1e-2, rtol=1e-2)}


class Case:
    def __init__(self, seq_lens, q_lens, *, dtype=torch.bfloat16, bs=16, workspace=16, seed=0, dims=D):
        d = self.d = dims
        g = torch.Generator().manual_seed(seed)
        ws = make_weights(d, dtype, g)
        self.ws = ws
        self.kw, self.deq = quantize_mla_weights_mx(ws, dtype)
        self.act = mx_activations(dtype)
        B = len(seq_lens)
        per_req = [math.ceil(s / bs) for s in seq_lens]
        nb = sum(per_req) + 3
        perm = torch.randperm(nb, generator=g).tolist()
        self.table = torch.zeros(B, max(per_req), dtype=torch.int32)
        blocks, k = [], 0
        for r, n in enumerate(per_req):
            blocks.append(perm[k:k + n])
            self.table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
            k += n
        self.nope = torch.randn(nb, bs, 1, d.L, generator=g).to(dtype)
        self.rope = torch.randn(nb, bs, 1, d.R, generator=g).to(dtype)
        self.xs = [torch.randn(s, d.hidden, generator=g, dtype=F64).to(dtype) for s in seq_lens]
        # The context rows as an MXFP8 layer writes them (its quantised kv_a projection).
        for r in range(B):
            fill_context(d, self.deq, self.xs[r][: seq_lens[r] - q_lens[r]], self.nope, self.rope, blocks[r], bs,
                         act=self.act)
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
        cos, sin = rope_tables(max(seq_lens) + 4, d.R)
        self.builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=self.table.shape[1],
                                           block_size=bs, num_blocks=nb, cos_table=cos.to(dtype),
                                           sin_table=sin.to(dtype), workspace_tokens=workspace)
        self.md = self.builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), self.table)
        self.scale = 1.0 / math.sqrt(d.P + d.R)
        self.base = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                         qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, scale=self.scale, **self.kw)
        self.hidden = torch.cat([self.xs[r][seq_lens[r] - q_lens[r]:] for r in range(B)])
        self.ref = torch.cat([attend_request(d, self.deq, self.xs[r], q_lens[r], self.scale, act=self.act)
                              for r in range(B)])
        self.ref_unquantised_act = torch.cat([attend_request(d, self.deq, self.xs[r], q_lens[r], self.scale)
                                              for r in range(B)])

    def run(self, **extra):
        impl = mla.Impl(**self.base, **extra)
        nope, rope = self.nope.clone(), self.rope.clone()
        out = torch.full_like(self.hidden, 7.0)
        impl.forward(self.hidden, nope, rope, self.md, out)
        return impl, out, nope, rope


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_mxfp8_layer_matches_the_quantised_reference(dtype):
    # Two decodes, a prefill with context in two chunks, a prefill without context.
    c = Case([12, 20, 40, 9], [1, 1, 7, 9], dtype=dtype)
    assert c.md.num_context_chunks >= 2
    impl, out, *_ = c.run()
    assert impl.last_decode_path == "native" and impl.fused_decode_path == "none"
    torch.testing.assert_close(out.to(F64), c.ref, **TOL[dtype])
    # The activation quantisation is what the reference models: without it the error is several times larger.
    scale = c.ref.abs().max()
    err_q = (out.to(F64) - c.ref).abs().max() / scale
    err_u = (out.to(F64) - c.ref_unquantised_act).abs().max() / scale
    assert err_u < 0.15, err_u
    if dtype == torch.float16:  # bf16's own rounding (see TOL) is of the MX error's size; fp16's is not
        assert err_u > 3 * err_q, (err_q, err_u)


def test_mxfp8_decode_only_and_speculative():
    c = Case([5, 17, 33], [2, 2, 2], seed=3, workspace=64)
    _, out, *_ = c.run()
    torch.testing.assert_close(out.to(F64), c.ref, **TOL[torch.bfloat16])


def test_mxfp8_writes_the_cache_rows_of_the_quantised_projection():
    # The new tokens' latent rows against the reference's (the quantised kv_a projection, RMSNorm'd): bf16 of
    # the rows plus the rare e4m3 boundary flip of an input element.
    seq, q = [9, 14], [1, 3]
    c = Case(seq, q, seed=5)
    _, _, nope, rope = c.run()
    probe = [t.clone() for t in (c.nope, c.rope)]
    for r, (s, ql) in enumerate(zip(seq, q)):
        fill_context(c.d, c.deq, c.xs[r][:s], probe[0], probe[1],
                     [int(b) for b in c.table[r]], 16, act=c.act)
    torch.testing.assert_close(nope.to(F64), probe[0].to(F64), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(rope.to(F64), probe[1].to(F64), atol=2e-2, rtol=2e-2)


def test_mxfp8_quantisation_errors_are_measurable_against_float_weights():
    # The MXFP8 layer differs from the float layer on the same (unquantised) weights by the MX error, i.e. the
    # quantised path really runs.
    c = Case([12, 20], [1, 4], seed=7)
    _, out, *_ = c.run()
    kw = {k: v for k, v in c.base.items() if k != "quant"}
    for k in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa"):
        kw[k] = c.ws[k]
    f = mla.Impl(**kw)
    fout = torch.zeros_like(c.hidden)
    f.forward(c.hidden, c.nope.clone(), c.rope.clone(), c.md, fout)
    assert (fout.to(F64) - out.to(F64)).abs().max() > 1e-3


def _mx_kw(dtype=torch.bfloat16, dims=D):
    ws = make_weights(dims, dtype, torch.Generator().manual_seed(1))
    kw, _ = quantize_mla_weights_mx(ws, dtype)
    return dict(num_heads=dims.H, hidden_size=dims.hidden, q_lora_rank=dims.Q, kv_lora_rank=dims.L,
                qk_nope_head_dim=dims.P, qk_rope_head_dim=dims.R, v_head_dim=dims.V, **kw)


def test_fused_preprocesses_with_mxfp8_are_refused_with_their_reason():
    kw = _mx_kw()
    for extra, name in ((dict(enable_mlapo=True), "enable_mlapo"), (dict(enable_prolog=True), "enable_prolog"),
                        (dict(fa_quant_kv_scale=0.02, enable_kv_nz=True), "FA-quant")):
        with pytest.raises(NotImplementedError, match=name + r".*MXFP8.*weight_quant_mode 3.*torch_npu 2\.14\.0"):
            mla.Impl(**kw, **extra)


def test_bad_mxfp8_weights_are_rejected_by_name():
    kw = _mx_kw()
    f, q = kw["quant"].fused_qkv_a_proj, kw["quant"].q_proj

    def with_q(lin):
        return {**kw, "quant": mla.QuantWeights("mxfp8", f, lin)}

    with pytest.raises(ValueError, match=r"q_proj.weight must be float8_e4m3fn"):
        mla.Impl(**with_q(mla.QuantLinear(q.weight.view(torch.int8), q.weight_scale)))
    with pytest.raises(ValueError, match=r"q_proj.weight_scale must have shape \[192, 2\]"):
        mla.Impl(**with_q(mla.QuantLinear(q.weight, q.weight_scale[:, :1])))
    with pytest.raises(ValueError, match=r"q_proj.weight_scale must be the e8m0 scale bytes"):
        mla.Impl(**with_q(mla.QuantLinear(q.weight, q.weight_scale.to(torch.float32))))
    with pytest.raises(ValueError, match=r"belong to W8A8-static linears; an MXFP8 one"):
        mla.Impl(**with_q(mla.QuantLinear(q.weight, q.weight_scale, input_scale=torch.ones(1),
                                          input_offset=torch.zeros(1, dtype=torch.int8),
                                          quant_bias=torch.zeros(128, dtype=torch.int32))))
    # e8m0 bytes as float8_e8m0fnu are the same thing
    mla.Impl(**with_q(mla.QuantLinear(q.weight, q.weight_scale.view(torch.float8_e8m0fnu))))
    # q_lora_rank 48: q_proj's input is not a multiple of 32
    d48 = MlaDims(H=4, hidden=128, Q=48, L=64, P=32, R=16, V=32)
    kw48 = _mx_kw(dims=d48)
    with pytest.raises(ValueError, match=r"q_proj: an MXFP8 linear's input size must be a multiple of 32 .*, got 48"):
        mla.Impl(**kw48)
    # float32 activations: the MX operators take bf16 / fp16
    kw32 = _mx_kw()
    for k in ("kv_a_layernorm", "kv_b_proj", "o_proj", "q_a_layernorm"):
        kw32[k] = kw32[k].float()
    with pytest.raises(ValueError, match="MXFP8 weights need bfloat16 or float16 activations"):
        mla.Impl(**kw32)


def test_mxfp8_reload_weights_in_place():
    # New MXFP8 weights copied into the layer's tensors (the transposed fp8 view and the e8m0 pairs recomputed in
    # place): the layer then computes like a fresh one.
    c = Case([5, 17, 33], [1, 1, 1])
    impl = mla.Impl(**c.base)
    c2 = Case([5, 17, 33], [1, 1, 1], seed=1)
    impl.reload_weights(**{k: c2.base[k] for k in ("q_a_layernorm", "kv_a_layernorm", "kv_b_proj", "o_proj",
                                                    "quant")})
    out = torch.zeros_like(c2.hidden)
    impl.forward(c2.hidden, c2.nope.clone(), c2.rope.clone(), c2.md, out)
    _, fresh, *_ = c2.run()
    assert torch.equal(out, fresh)
