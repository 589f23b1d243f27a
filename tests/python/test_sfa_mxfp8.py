"""MXFP8 (A5) SFA layers: the W8A8-MXFP8 fused_qkv_a_proj and q_proj on the native preprocess (the same
LatentCore linears as MLA: npu_dynamic_mx_quant + npu_quant_matmul's MX mode through their CPU twins) against a
float64 reference of the quantised computation (_quant_reference.mx_activations: weights and the activations a
quantised projection reads replaced by their MX-fp8 values), PROLOG_V3's fall-through to the native preprocess
for MXFP8 weights (its weight_quant_mode 3 is undocumented in torch_npu 2.14.0), and the checkpoint loader's
MXFP8 projections.

Tolerance (derived as in test_mla_mxfp8): against the quantised reference, the layer's bf16 roundings (the float
bf16 SFA layer on the dequantised weights is 1e-2 off the float64 reference here, output scale ~2.4) plus the e4m3
boundary crossings of c_q: the layer quantises its bf16-rounded c_q, the reference its float64 one rounded to
bf16, and they differ by about a bf16 step (2^-8 relative) against an e4m3 step of 2^-3, so about Q * 2^-5 = 2
elements per token land on the other side, each moving one q_proj input by an e4m3 step (~1e-2 on q, a few 1e-2
on the output; measured up to 4.2e-2): atol = rtol = 6e-2, as the bf16 W8A8 MLA paths.
The selection is the layer's own (the attention
over it is what is checked); with index_topk at least every request's length it is every visible position.
"""

from __future__ import annotations

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, fill_context
from _quant_reference import mx_activations, quantize_mla_weights_mx
from _sfa_reference import IdxDims, indexer_keys, selected_positions, sfa_attend_request
from test_sfa import Model, _qsl

sfa = aar.sfa
F64 = torch.float64
D = MlaDims(H=4, hidden=128, Q=64, L=64, P=32, R=16, V=32)
TOL = dict(atol=6e-2, rtol=6e-2)


class MxModel(Model):
    def __init__(self, seq_lens, *, K=8, dtype=torch.bfloat16, seed=0):
        super().__init__(seq_lens, dims=D, idx=IdxDims(n_head=4, D=32, K=K), dtype=dtype, seed=seed)
        self.kw, self.deq = quantize_mla_weights_mx(self.ws, dtype)
        self.act = mx_activations(dtype)

    def fill(self, r, n):
        if n == 0:
            return
        fill_context(self.d, self.deq, self.xs[r][:n], self.nope, self.rope, self.blocks[r], self.bs, act=self.act)
        k = indexer_keys(self.d, self.idx, self.iw, self.xs[r][:n], torch.arange(n))
        for p in range(n):
            self.idx_k[self.blocks[r][p // self.bs], p % self.bs, 0] = k[p].to(self.dtype)

    def impl(self, indexer=True, **kw):
        saved = self.ws
        self.ws = self.kw  # the quantised projections (quant=...) instead of q_a_proj / q_proj / kv_a_proj
        try:
            return super().impl(indexer=indexer, **kw)
        finally:
            self.ws = saved


def run_case(seq_lens, q_lens, *, K=8, dtype=torch.bfloat16, seed=0, **impl_kw):
    m = MxModel(seq_lens, K=K, dtype=dtype, seed=seed)
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        m.fill(r, s - q)
    md = m.builder().build(_qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - q:] for r, (s, q) in enumerate(zip(seq_lens, q_lens))])
    impl = m.impl(**impl_kw)
    out = torch.full_like(hidden, 7.0)
    impl.forward(hidden, m.caches(), md, out)
    topk = impl.last_topk[:, 0].to(torch.int64)
    t0 = 0
    for r, (s, q) in enumerate(zip(seq_lens, q_lens)):
        rows = topk[t0:t0 + q]
        for i in range(q):
            assert len(selected_positions(rows[i], s - q + i + 1)) == min(K, s - q + i + 1)
        want = sfa_attend_request(m.d, m.deq, m.xs[r][:s], q, m.scale, rows, act=m.act)
        torch.testing.assert_close(out[t0:t0 + q].to(F64), want, **TOL)
        t0 += q
    return m, impl, out


@pytest.mark.parametrize("K", [8, 64], ids=["topk_8", "every_position"])
def test_native_mxfp8_sfa_layer(K):
    # decodes, a prefill with context, a prefill without
    _, impl, _ = run_case([12, 30, 40, 9], [1, 1, 7, 9], K=K)
    assert impl.preprocess == "native"


def test_mxfp8_sfa_float16_decode():
    run_case([20, 33, 5], [1, 1, 1], dtype=torch.float16, seed=2)


def test_kv_consumer_mxfp8_falls_through_to_native():
    # resolve_preprocess's PROLOG_V3 row rejects MXFP8 by name and the layer preprocesses natively.
    _, impl, _ = run_case([12, 30], [1, 1], is_kv_consumer=True)
    assert impl.preprocess == "native"
    assert "PROLOG_V3 rejected: MXFP8 weights" in impl.preprocess_reason
    assert "weight_quant_mode 3" in impl.preprocess_reason
    kind, reason = sfa.resolve_preprocess(quant_type="mxfp8", is_kv_consumer=True)
    assert kind == "native" and "MXFP8 weights" in reason


def test_mxfp8_checkpoint_loads_into_a_layer():
    # ModelSlim's MXFP8 names: q_a_proj / kv_a_proj_with_mqa / q_b_proj as float8_e4m3fn weights with uint8
    # weight_scale (out, in / 32); the loader returns them as quant=QuantWeights("mxfp8", ...) with
    # fused_qkv_a_proj = q_a_proj | kv_a_proj_with_mqa, and the layer built from it computes like one built from
    # the same weights directly.
    seq, q = [12, 30], [1, 4]
    m = MxModel(seq, K=8, seed=4)
    f, qp = m.kw["quant"].fused_qkv_a_proj, m.kw["quant"].q_proj
    Q = D.Q
    prefix = "model.layers.2.self_attn."
    state = {prefix + "q_a_proj.weight": f.weight[:Q], prefix + "q_a_proj.weight_scale": f.weight_scale[:Q],
             prefix + "kv_a_proj_with_mqa.weight": f.weight[Q:],
             prefix + "kv_a_proj_with_mqa.weight_scale": f.weight_scale[Q:],
             prefix + "q_b_proj.weight": qp.weight, prefix + "q_b_proj.weight_scale": qp.weight_scale,
             prefix + "q_a_layernorm.weight": m.ws["q_a_layernorm"].float(),
             prefix + "kv_a_layernorm.weight": m.ws["kv_a_layernorm"], prefix + "kv_b_proj.weight": m.ws["kv_b_proj"],
             prefix + "o_proj.weight": m.ws["o_proj"], prefix + "indexer.wq_b.weight": m.iw["wq_b"],
             prefix + "indexer.wk.weight": m.iw["wk"], prefix + "indexer.weights_proj.weight": m.iw["weights_proj"],
             prefix + "indexer.k_norm.weight": m.iw["k_norm_weight"], prefix + "indexer.k_norm.bias": m.iw["k_norm_bias"]}
    dims = dict(num_heads=D.H, hidden_size=D.hidden, q_lora_rank=Q, kv_lora_rank=D.L, qk_nope_head_dim=D.P,
                qk_rope_head_dim=D.R, v_head_dim=D.V, index_n_head=m.idx.n_head, index_head_dim=m.idx.D)
    w = sfa.weights_from_checkpoint(state, prefix, **dims)
    assert w["quant"].quant_type == "mxfp8" and "q_a_proj" not in w and "q_proj" not in w
    assert torch.equal(w["quant"].fused_qkv_a_proj.weight.view(torch.uint8), f.weight.view(torch.uint8))
    assert torch.equal(w["quant"].fused_qkv_a_proj.weight_scale.view(torch.uint8), f.weight_scale)
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    md = m.builder().build(_qsl(q), torch.tensor(seq, dtype=torch.int32), m.table)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    outs = []
    for layer in (m.impl(), sfa.Impl(**{k: v for k, v in dims.items()}, index_topk=m.idx.K, scale=m.scale,
                                     indexer_k_norm_eps=m.idx.eps, glm_moe_dsa=not m.idx.neox, **w)):
        out = torch.zeros_like(hidden)
        layer.forward(hidden, [t.clone() for t in m.caches()], md, out)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    # one projection quantised, another not: named
    bad = dict(state)
    bad[prefix + "q_b_proj.weight"] = m.ws["q_proj"]
    with pytest.raises(ValueError, match=r"q_b_proj\.weight' is BFloat16 but q_a_proj\.weight is float8_e4m3fn"):
        sfa.weights_from_checkpoint(bad, prefix, **dims)
    with pytest.raises(ValueError, match=r"missing: 'model\.layers\.2\.self_attn\.q_a_proj\.weight_scale'"):
        sfa.weights_from_checkpoint({k: v for k, v in state.items() if not k.endswith("q_a_proj.weight_scale")},
                                    prefix, **dims)
