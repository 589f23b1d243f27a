"""SFA's preprocess selection (docs/design/sfa.md §4.2) and its three paths: every row of the selection table with
its rejection rules, the per-call downgrades, and NATIVE / PROLOG_V3 / MLAPO giving the same results on SFA
layers (PROLOG_V3 with unquantised weights on a KV consumer, MLAPO on W8A8-static weights) -- the same top-k
(the fused paths hand the indexer q_c: query_norm_flag / enable_inner_out), the same cache rows, outputs
equal to the native path and to the float64 SFA reference run with the dequantised weights over the layer's
selection; graph capture of the fused paths; unimplemented configurations rejected by name."""

from __future__ import annotations

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, fill_context
from _quant_reference import quantize_mla_weights
from _sfa_reference import IdxDims, indexer_topk_request, sfa_attend_request
from test_sfa import Model, _qsl

sfa = aar.sfa
F64 = torch.float64
AS = aar.AttentionState
QTOL = dict(atol=4e-2, rtol=4e-2)


class QModel(Model):
    """test_sfa's model with W8A8 projections (the context rows and references use the dequantised weights)."""

    def __init__(self, seq_lens, quant="none", **kw):
        super().__init__(seq_lens, **kw)
        self.quant = quant
        if quant == "none":
            self.qkw, self.deq = dict(self.ws), self.ws
        else:
            self.qkw, self.deq = quantize_mla_weights(self.ws, quant, self.dtype)

    def fill(self, r, n):
        ws = self.ws
        self.ws = self.deq
        try:
            super().fill(r, n)
        finally:
            self.ws = ws

    def impl(self, indexer=True, **kw):
        d = self.d
        extra = {}
        if indexer:
            extra = dict(index_n_head=self.idx.n_head, index_head_dim=self.idx.D, index_topk=self.idx.K,
                         indexer_wq_b=self.iw["wq_b"], indexer_wk=self.iw["wk"],
                         indexer_weights_proj=self.iw["weights_proj"], indexer_k_norm_weight=self.iw["k_norm_weight"],
                         indexer_k_norm_bias=self.iw["k_norm_bias"], indexer_k_norm_eps=self.idx.eps,
                         glm_moe_dsa=not self.idx.neox)
        extra.update(kw)
        return sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                        qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, scale=self.scale, **extra,
                        **self.qkw)


# ------------------------------------------------------------------------------- the selection table

ROWS = [
    # (config, expected, substring of the reason)
    (dict(is_kv_consumer=True), "prolog_v3", "PROLOG_V3: KV consumer with a none"),
    (dict(is_kv_consumer=True, quant_type="w8a8_dynamic", enable_sparse_sfa_c8=True), "prolog_v3", "SFA C8"),
    # MXFP8: PROLOG_V3 would be upstream's (weight_quant_mode 3, undocumented in torch_npu 2.14.0): native here
    (dict(is_kv_consumer=True, quant_type="mxfp8"), "native", "PROLOG_V3 rejected: MXFP8 weights"),
    (dict(is_kv_consumer=True, quant_type="w8a8_dynamic"), "native", "NATIVE"),  # not a candidate without C8
    (dict(is_kv_consumer=True, enable_sparse_sfa_c8=True), "native", "unquantised fused_qkv_a_proj with SFA C8"),
    (dict(is_kv_consumer=True, is_kv_producer=True), "native", "KV producer"),
    (dict(is_kv_consumer=True, chunked_q_proj=True), "native", "q_proj is chunked"),
    (dict(is_kv_consumer=True, has_q_lora=False), "native", "no q-LoRA"),
    (dict(is_kv_consumer=True, dsa_cp=True), "native", "PROLOG_V3 rejected: DSA-CP"),
    (dict(), "native", "NATIVE"),  # not a KV consumer
    (dict(quant_type="w8a8_static", enable_mlapo=True), "mlapo", "MLAPO: W8A8-static"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, is_kv_consumer=True), "mlapo", "MLAPO"),
    (dict(quant_type="w8a8_static"), "native", "NATIVE"),  # enable_mlapo off
    (dict(quant_type="w8a8_dynamic", enable_mlapo=True), "native", "NATIVE"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, enable_sparse_sfa_c8=True), "native", "SFA C8 is enabled"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, dcp_size=2), "native", "DCP forces enable_mlapo=False"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, dsa_cp=True), "native", "MLAPO rejected: DSA-CP"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, has_q_lora=False), "native", "no q-LoRA"),
    (dict(is_kv_consumer=True, is_kv_producer=True, quant_type="mxfp8", enable_mlapo=True), "native", "KV producer"),
    (dict(is_kv_consumer=True, kv_offload=True), "native", "KV offload forces NATIVE"),
    (dict(quant_type="w8a8_static", enable_mlapo=True, kv_offload=True), "native", "KV offload"),
]


@pytest.mark.parametrize("cfg,kind,why", ROWS)
def test_selection_table(cfg, kind, why):
    got, reason = sfa.resolve_preprocess(**cfg)
    assert got == kind, (cfg, got, reason)
    assert why in reason, reason


def test_selection_rejects_bad_input_by_name():
    with pytest.raises(ValueError, match="dcp_size must be >= 1"):
        sfa.resolve_preprocess(dcp_size=0)
    with pytest.raises(ValueError, match="quant_type must be one of"):
        sfa.resolve_preprocess(quant_type="int4")


@pytest.mark.parametrize("resolved", ["native", "prolog_v3", "mlapo"])
@pytest.mark.parametrize("state", [AS.PrefillNoCache, AS.PrefillCacheHit, AS.DecodeOnly, AS.ChunkedPrefill,
                                   AS.SpecDecoding])
@pytest.mark.parametrize("tokens", [1, 1024, 1025])
def test_runtime_downgrade(resolved, state, tokens):
    got = sfa.runtime_preprocess(resolved, state, tokens)
    fused_state = state in (AS.DecodeOnly, AS.SpecDecoding)
    if resolved == "native" or not fused_state or (resolved == "mlapo" and tokens > 1024):
        assert got == "native"
    else:
        assert got == resolved


# ------------------------------------------------------------------------------- the paths on a layer


def _step(m, seq, q, spec=0, num_input_tokens=0, **bkw):
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    extra = dict(num_spec_tokens=torch.full((len(q),), spec, dtype=torch.int32)) if spec else {}
    md = m.builder(num_speculative_tokens=spec, **bkw).build(
        _qsl(q), torch.tensor(seq, dtype=torch.int32), m.table, num_input_tokens=num_input_tokens or sum(q), **extra)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    pad = md.num_input_tokens - hidden.shape[0]
    if pad > 0:
        hidden = torch.cat([hidden, torch.zeros(pad, m.d.hidden, dtype=m.dtype)])
    return md, hidden


def _forward(m, impl, md, hidden):
    caches = [t.clone() for t in m.caches()]
    out = torch.full_like(hidden, 7.0)
    impl.forward(hidden, caches, md, out)
    return out, caches, impl.last_topk.clone()


def _reference(m, seq, q, topk):
    """The float64 layer output with the dequantised weights over the given top-k rows."""
    rows, t0 = [], 0
    for r, (s, ql) in enumerate(zip(seq, q)):
        rows.append(sfa_attend_request(m.d, m.deq, m.xs[r][:s], ql, m.scale, topk[t0:t0 + ql, 0].to(torch.int64)))
        t0 += ql
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [0, 1])
def test_prolog_v3_equals_native(dtype, spec):
    seq, q = ([5, 20, 33, 9], [1, 1, 1, 1]) if spec == 0 else ([21, 14, 9], [2, 2, 2])
    m = QModel(seq, dtype=dtype)
    md, hidden = _step(m, seq, q, spec=spec)
    assert md.attn_state == (AS.DecodeOnly if spec == 0 else AS.SpecDecoding)
    native = m.impl()
    fused = m.impl(is_kv_consumer=True)
    assert native.preprocess == "native" and fused.preprocess == "prolog_v3"
    out_n, caches_n, topk_n = _forward(m, native, md, hidden)
    out_f, caches_f, topk_f = _forward(m, fused, md, hidden)
    assert fused.last_preprocess == "prolog_v3" and native.last_preprocess == "native"
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    if dtype == torch.float32:
        assert torch.equal(topk_f, topk_n)  # the indexer saw the same q_c (query_norm)
        t0 = 0
        for r, (s, ql) in enumerate(zip(seq, q)):
            ref_topk, _ = indexer_topk_request(m.d, m.idx, m.ws, m.iw, m.xs[r][:s], ql)
            assert torch.equal(topk_f[t0:t0 + ql, 0].to(torch.int64), ref_topk)
            t0 += ql
        torch.testing.assert_close(out_f, out_n, **tol)
    for a, b in zip(caches_f, caches_n):
        torch.testing.assert_close(a.to(F64), b.to(F64), **tol)
    torch.testing.assert_close(out_f[: sum(q)].to(F64), _reference(m, seq, q, topk_f), **tol)


def test_prolog_v3_layer_takes_the_native_path_on_prefill_steps():
    seq, q = [40, 7, 25, 30], [1, 7, 9, 1]
    m = QModel(seq)
    md, hidden = _step(m, seq, q)
    assert md.attn_state == AS.ChunkedPrefill
    fused = m.impl(is_kv_consumer=True)
    out, _, topk = _forward(m, fused, md, hidden)
    assert fused.preprocess == "prolog_v3" and fused.last_preprocess == "native"
    torch.testing.assert_close(out.to(F64), _reference(m, seq, q, topk), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [0, 1])
def test_mlapo_equals_native_w8a8(dtype, spec):
    seq, q = ([5, 20, 33, 9], [1, 1, 1, 1]) if spec == 0 else ([21, 14, 9], [2, 2, 2])
    m = QModel(seq, quant="w8a8_static", dtype=dtype)
    md, hidden = _step(m, seq, q, spec=spec)
    native = m.impl()
    fused = m.impl(enable_mlapo=True)
    assert native.preprocess == "native" and fused.preprocess == "mlapo"
    out_n, caches_n, topk_n = _forward(m, native, md, hidden)
    out_f, caches_f, topk_f = _forward(m, fused, md, hidden)
    assert fused.last_preprocess == "mlapo"
    # The same quantisation on both paths: the same selection (the indexer read MLAPO's inner_out q_c).
    if dtype == torch.float32:
        assert torch.equal(topk_f, topk_n)
        tol = dict(atol=1e-5, rtol=1e-5)
    else:
        tol = dict(atol=3e-2, rtol=3e-2)
    for a, b in zip(caches_f, caches_n):
        torch.testing.assert_close(a.to(F64), b.to(F64), **tol)
    if dtype == torch.float32:
        torch.testing.assert_close(out_f, out_n, **tol)
    torch.testing.assert_close(out_f[: sum(q)].to(F64), _reference(m, seq, q, topk_f),
                               **(QTOL if dtype == torch.float32 else dict(atol=8e-2, rtol=8e-2)))


def test_mlapo_downgrades_on_prefill_steps_and_above_1024_input_tokens():
    seq, q = [40, 7, 25, 30], [1, 7, 9, 1]
    m = QModel(seq, quant="w8a8_static")
    fused = m.impl(enable_mlapo=True)
    md, hidden = _step(m, seq, q)
    out, _, topk = _forward(m, fused, md, hidden)
    assert fused.last_preprocess == "native"
    torch.testing.assert_close(out.to(F64), _reference(m, seq, q, topk), **QTOL)
    # A decode-only step padded to 1025 input tokens: over MLAPO's limit; 1024: MLAPO.
    seq2, q2 = [12, 30], [1, 1]
    m2 = QModel(seq2, quant="w8a8_static")
    fused2 = m2.impl(enable_mlapo=True)
    for n, want in ((1025, "native"), (1024, "mlapo")):
        md, hidden = _step(m2, seq2, q2, num_input_tokens=n, max_num_tokens=1100)
        assert md.attn_state == AS.DecodeOnly and md.num_input_tokens == n
        out, _, topk = _forward(m2, fused2, md, hidden)
        assert fused2.last_preprocess == want
        torch.testing.assert_close(out[:2].to(F64), _reference(m2, seq2, q2, topk), **QTOL)
        assert torch.count_nonzero(out[2:]) == 0


def test_native_w8a8_dynamic_layer():
    # A W8A8-dynamic layer without SFA C8 resolves to NATIVE (its PROLOG_V3 needs C8) and runs the W8A8 linears.
    seq, q = [40, 7, 25, 30], [1, 7, 9, 1]
    m = QModel(seq, quant="w8a8_dynamic")
    impl = m.impl(is_kv_consumer=True)
    assert impl.preprocess == "native"
    md, hidden = _step(m, seq, q)
    out, _, topk = _forward(m, impl, md, hidden)
    torch.testing.assert_close(out.to(F64), _reference(m, seq, q, topk), **QTOL)


@pytest.mark.parametrize("kind", ["prolog_v3", "mlapo"])
def test_fused_paths_under_graph_capture(kind):
    bucket = 4
    seq = [9, 14, 20, 11]
    m = QModel(seq, quant="w8a8_static" if kind == "mlapo" else "none", spare_blocks=8)
    for r, s in enumerate(seq):
        m.fill(r, s - 1)
    builder = m.builder(graph_decode_padding=True)
    impl = m.impl(**(dict(enable_mlapo=True) if kind == "mlapo" else dict(is_kv_consumer=True)))
    eager = m.impl(**(dict(enable_mlapo=True) if kind == "mlapo" else dict(is_kv_consumer=True)))
    hidden = torch.zeros(bucket, m.d.hidden)
    out = torch.zeros(bucket, m.d.hidden)
    g = aar.GraphParams("recording")
    md = builder.build_for_graph_capture(_qsl([1] * bucket), torch.tensor(seq, dtype=torch.int32), m.table,
                                         num_input_tokens=bucket)
    with g.capture(bucket):
        impl.forward(hidden, m.caches(), md, out)
    for B in (4, 2):
        hs = torch.cat([m.xs[r][seq[r] - 1: seq[r]] for r in range(B)])
        md = builder.build(_qsl([1] * B), torch.tensor(seq[:B], dtype=torch.int32), m.table[:B],
                           num_input_tokens=bucket)
        hidden.zero_()
        hidden[:B] = hs
        caches_e = [t.clone() for t in m.caches()]
        out_e = torch.zeros_like(out)
        eager.forward(hidden.clone(), caches_e, md, out_e)
        g.replay(bucket)
        assert impl.last_preprocess == kind
        torch.testing.assert_close(out, out_e, atol=1e-5, rtol=1e-5)
        for a, b in zip(m.caches(), caches_e):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------- unsupported configurations


def test_unimplemented_configurations_are_rejected_by_name():
    m = QModel([9, 14], quant="w8a8_dynamic")
    with pytest.raises(TypeError):  # the layer's SFA C8 is sfa_c8 (test_sfa_c8): the selection follows it
        m.impl(is_kv_consumer=True, enable_sparse_sfa_c8=True)
    # DSA-CP is the dsa_cp_comm's group (test_sfa_dsa_cp): the switch without one names both
    with pytest.raises(ValueError, match="preprocess.dsa_cp is set but the layer has no dsa_cp_comm"):
        m.impl(dsa_cp=True)
    # DCP is the dcp_comm's group (test_sfa_dcp): a dcp_size without one names both
    with pytest.raises(ValueError, match="dcp_size=2 but the layer's dcp_comm has 1 rank"):
        m.impl(dcp_size=2)
    with pytest.raises(TypeError):  # KV offload is the layer's `offload` config (test_sfa_offload)
        m.impl(kv_offload=True)
    q = m.qkw["quant"]
    m.qkw["quant"] = aar.mla.QuantWeights("mxfp8", q.fused_qkv_a_proj, q.q_proj)
    with pytest.raises(ValueError, match="MXFP8 weights need bfloat16 or float16 activations"):
        m.impl(is_kv_consumer=True)  # int8 weights of an fp32 model under quant type mxfp8 (test_sfa_mxfp8 runs MXFP8)
    ms = QModel([9, 14], quant="w8a8_static")
    with pytest.raises(RuntimeError, match="mla_preprocess takes no epsilon"):
        ms.impl(enable_mlapo=True, kv_norm_eps=1e-5)
    with pytest.raises(NotImplementedError, match="MLAPO.*float16 activations"):
        QModel([9, 14], quant="w8a8_static", dtype=torch.float16).impl(enable_mlapo=True)
    QModel([9, 14], quant="w8a8_static", dtype=torch.float16).impl()  # native fp16 W8A8-static: built
    # No q-LoRA: the fused paths are rejected by the table (NATIVE), the layer runs natively.
    mn = QModel([9, 14], dims=MlaDims(Q=None))
    impl = mn.impl(is_kv_consumer=True)
    assert impl.preprocess == "native" and "no q-LoRA" in impl.preprocess_reason


def test_fused_paths_run_on_the_no_compute_provider():
    seq, q = [5, 20, 33, 9], [1, 1, 1, 1]
    for quant, kw, path in (("none", dict(is_kv_consumer=True), "prolog_v3"),
                            ("w8a8_static", dict(enable_mlapo=True), "mlapo"),
                            ("w8a8_dynamic", {}, "native")):
        m = QModel(seq, quant=quant)
        md, hidden = _step(m, seq, q)
        impl = m.impl(**kw)
        aar.set_provider("no_compute")
        try:
            caches = [t.clone() for t in m.caches()]
            impl.forward(hidden, caches, md, torch.zeros_like(hidden))
        finally:
            aar.set_provider("auto")
        assert impl.last_preprocess == path
        assert all(torch.equal(a, b) for a, b in zip(caches, m.caches()))
