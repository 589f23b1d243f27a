"""Graph mode through the vLLM adapter (ascend_attn_rt.vllm.graph, docs/design/vllm_sparse.md §5) on vLLM
0.27.1's config, metadata and builder API: the cudagraph support each builder declares (read through vLLM's
get_cudagraph_support), build_for_cudagraph_capture, and a decode bucket captured through the adapter's entry
points vLLM's layers call (GQA impl.forward; MLA do_kv_cache_update + forward_mqa; the sparse indexer op's run,
do_kv_cache_update + forward_mqa), then per step: vLLM's build, the adapter's update and the recording
provider's replay, equal to an eager run of the same step on copies of the caches (GQA also against a float64
reference with an explicit mask). The recording provider replays only the runtime's recorded calls, so the
activations vLLM's layer code would compute around them live in static buffers the test fills."""

import contextlib
import copy
import types

import pytest
import torch

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import CUDAGraphMode, set_current_vllm_config  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec  # noqa: E402

import ascend_attn_rt.vllm as aar_vllm  # noqa: E402
from ascend_attn_rt.vllm import graph as vgraph  # noqa: E402
from ascend_attn_rt.vllm import (AscendAttnRtBackend, AscendAttnRtIndexerBackend, AscendAttnRtMlaBackend,  # noqa: E402
                                 AscendAttnRtSparseMlaBackend)
from _reference import random_block_table  # noqa: E402
from test_vllm_backend import BS, MAX_LEN, _vllm_config  # noqa: E402
from _vllm_support import (common_metadata as _common_metadata, mla_dims as _mla_dims,  # noqa: E402
                           mla_impl as _mla_impl, vllm_registration)

B = 4  # the bucket: four one-token decodes
WIDTH = MAX_LEN // BS
CPU = torch.device("cpu")


@pytest.fixture
def store():
    g = vgraph.set_graph_provider("recording")
    try:
        yield g
    finally:
        vgraph.clear_graph_provider()


def _cam(seq_lens, bt, pad_to=None):
    """vLLM's CommonAttentionMetadata of one-token decodes; with pad_to, padded as vLLM's runner pads a
    full-graph batch: empty requests (no tokens, KV length 0, block-table row 0), num_actual_tokens the
    padded count, slot -1."""
    n = len(seq_lens)
    total = pad_to or n
    qsl = torch.tensor(list(range(n + 1)) + [n] * (total - n), dtype=torch.int32)
    sl = torch.tensor(list(seq_lens) + [0] * (total - n), dtype=torch.int32)
    rows = torch.zeros(total, bt.shape[1], dtype=torch.int32)
    rows[:n] = bt[:n]
    slots = [int(bt[i, (s - 1) // BS]) * BS + (s - 1) % BS for i, s in enumerate(seq_lens)] + [-1] * (total - n)
    cam = _common_metadata(qsl, sl, rows, torch.tensor(slots, dtype=torch.int64))
    if pad_to:
        cam.num_actual_tokens = total
        cam.max_query_len = 1
    return cam


STEPS = [[5, 17, 33, 9], [40, 2, 11, 23], [64, 63, 2, 30]]


# --- what the builders declare, and the refusals

@pytest.mark.parametrize("backend,spec_kind", [(AscendAttnRtBackend, "gqa"), (AscendAttnRtMlaBackend, "mla"),
                                               (AscendAttnRtSparseMlaBackend, "mla"),
                                               (AscendAttnRtIndexerBackend, "mla")])
def test_cudagraph_support_read_through_vllm(backend, spec_kind):
    cfg = _vllm_config("vllm_tiny_gqa" if spec_kind == "gqa" else "vllm_tiny_mla")
    spec = (FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float16)
            if spec_kind == "gqa" else MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=80,
                                                        dtype=torch.float16))
    builder_cls = backend.get_builder_cls()
    assert builder_cls.get_cudagraph_support(cfg, spec) is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert builder_cls.build_for_cudagraph_capture is vgraph.GraphBuilderMixin.build_for_cudagraph_capture


def test_graph_provider_and_capture_build_refusals():
    with pytest.raises(NotImplementedError, match="graph provider 'hooks'.*give provider 'torch_npu'"):
        vgraph.set_graph_provider("hooks")
    with pytest.raises(ValueError, match="provider='noop'"):
        vgraph.set_graph_provider("noop")
    with pytest.raises(ValueError, match="update_stream: arguments of the 'torch_npu' graph provider"):
        vgraph.set_graph_provider("recording", update_stream="s")
    if not (hasattr(torch, "npu") and hasattr(torch.npu, "graph_task_update_begin")):
        with pytest.raises(RuntimeError, match="torch_npu is not loaded"):
            vgraph.set_graph_provider("torch_npu")
    with pytest.raises(ValueError, match=r"lacks \['graph_task_update_begin'"):
        vgraph.set_graph_provider("torch_npu", npu=types.SimpleNamespace(
            **{k: None for k in ("ExternalEvent", "graph_task_group_begin", "graph_task_group_end",
                                 "graph_task_update_end", "current_stream", "stream", "graph", "Stream")}))
    assert vgraph.graph_params() is None  # a refused provider set nothing
    cfg = _vllm_config("vllm_tiny_gqa")
    cfg.cache_config.num_gpu_blocks = 64
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float16)
    builder = AscendAttnRtBackend.get_builder_cls()(spec, ["l0"], cfg, CPU)
    bt = random_block_table([9] * B, BS, 64, torch.Generator().manual_seed(1), width=WIDTH)
    vgraph.clear_graph_provider()
    with pytest.raises(RuntimeError, match="no graph provider is set"):
        builder.build_for_cudagraph_capture(_cam([9] * B, bt))
    vgraph.set_graph_provider("recording")
    try:
        mixed = _common_metadata(torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([9, 9], dtype=torch.int32),
                                 bt[:2].contiguous(), torch.arange(4))
        with pytest.raises(NotImplementedError, match="uniform single-token decode"):
            builder.build_for_cudagraph_capture(mixed)
        impl = AscendAttnRtBackend.get_impl_cls()(8, 32, 0.2, 2)
        with pytest.raises(NotImplementedError, match="profiling run"), vgraph.capture(B):
            impl.forward(None, None, None, None, None, None, torch.zeros(B, 8 * 32))
        assert not vgraph.graph_params().has(B)  # the failed capture dropped its bucket
    finally:
        vgraph.clear_graph_provider()


# --- GQA

def _gqa_reference(q, kc, vc, bt, seq_lens, scale):
    """float64 decode attention: each request's one query over its seq_len cached rows (explicit mask:
    positions < seq_len), GQA head grouping."""
    N, NKV = q.shape[1], kc.shape[2]
    outs = []
    for r, s in enumerate(seq_lens):
        p = torch.arange(s)
        k = kc[bt[r, p // BS].long(), p % BS].double().repeat_interleave(N // NKV, dim=1)  # (s, N, D)
        v = vc[bt[r, p // BS].long(), p % BS].double().repeat_interleave(N // NKV, dim=1)
        w = torch.softmax(torch.einsum("hd,shd->hs", q[r].double(), k) * scale, dim=-1)
        outs.append(torch.einsum("hs,shd->hd", w, v))
    return torch.stack(outs)


def _gqa_bucket(cfg, dtype, q, steps, seed):
    """Two GQA layers' impl.forward captured over static buffers (vLLM's persistent buffers) in a bucket of B requests
    of q tokens (q > 1: speculative, UNIFORM_BATCH), then per step (full, or padded by vLLM when fewer than B
    requests: num_input_tokens) vLLM's build, update and replay: the outputs equal an eager run of the same step on
    copies of the caches, the caches equal eager's, and every real token equals the float64 reference (explicit
    causal mask: token j of a request at position s - q + j sees positions <= its own)."""
    mc = cfg.model_config
    N, NKV, D = mc.get_num_attention_heads(cfg.parallel_config), mc.get_num_kv_heads(cfg.parallel_config), \
        mc.get_head_size()
    nb = cfg.cache_config.num_gpu_blocks
    gen = torch.Generator().manual_seed(seed)
    T, cam_of = B * q, (_cam if q == 1 else _spec_cam)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=dtype)
    names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    builder = AscendAttnRtBackend.get_builder_cls()(spec, names, cfg, CPU)
    impls = [AscendAttnRtBackend.get_impl_cls()(N, D, D ** -0.5, NKV) for _ in names]
    caches = [torch.randn(2, nb, BS, NKV, D, generator=gen).to(dtype) for _ in names]
    bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
    q_s = [torch.zeros(T, N * D, dtype=dtype) for _ in names]
    k_s = [torch.zeros(T, NKV * D, dtype=dtype) for _ in names]
    v_s = [torch.zeros(T, NKV * D, dtype=dtype) for _ in names]
    out_s = [torch.zeros(T, N * D, dtype=dtype) for _ in names]
    if q > 1:
        with pytest.raises(NotImplementedError, match=f"uniform decode batches of {q}-token requests"):
            builder.build_for_cudagraph_capture(_cam([9] * B, bt))  # one-token requests: not this config's bucket
    md = builder.build_for_cudagraph_capture(cam_of([9] * B, bt))
    with vgraph.capture(T):
        for i, impl in enumerate(impls):
            impl.forward(None, q_s[i], k_s[i], v_s[i], caches[i], md, out_s[i])
    assert [c[0] for c in vgraph.graph_params().calls(T)] == ["kv_write", "fia"] * 2
    assert all(float(o.abs().sum()) == 0 for o in out_s)  # recorded, not run
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for seq in steps:
        nq = len(seq) * q
        md = builder.build(0, cam_of(seq, bt, pad_to=B if len(seq) < B else None))
        qs = [torch.randn(T, N * D, generator=gen).to(dtype) for _ in names]
        ks = [torch.randn(T, NKV * D, generator=gen).to(dtype) for _ in names]
        vs = [torch.randn(T, NKV * D, generator=gen).to(dtype) for _ in names]
        expected, eager_caches = [], []
        for i, impl in enumerate(impls):
            kv = caches[i].clone()
            out = torch.full((T, N * D), 7.0, dtype=dtype)
            impl.forward(None, qs[i], ks[i], vs[i], kv, md, out)
            expected.append(out)
            eager_caches.append(kv)
            q_s[i].copy_(qs[i]), k_s[i].copy_(ks[i]), v_s[i].copy_(vs[i])
        vgraph.update(T, {name: md for name in names})
        vgraph.replay(T)
        for i in range(len(names)):
            torch.testing.assert_close(out_s[i][:nq], expected[i][:nq], atol=1e-5, rtol=1e-5)
            assert torch.equal(caches[i], eager_caches[i])
            qv, ov = qs[i].view(B, q, N, D), out_s[i].view(B, q, N, D)
            for j in range(q):
                ref = _gqa_reference(qv[:len(seq), j], caches[i][0], caches[i][1], bt, [s - q + j + 1 for s in seq],
                                     D ** -0.5)
                torch.testing.assert_close(ov[:len(seq), j].double(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gqa_decode_bucket_replays_like_eager(store, dtype):
    cfg = _vllm_config("vllm_tiny_gqa")
    cfg.cache_config.num_gpu_blocks = 2 + B * 5
    _gqa_bucket(cfg, dtype, 1, STEPS + [[30, 12, 7]], seed=3)  # the last one padded by vLLM


# --- MLA

def _mla_bucket(cfg, q, steps, seed):
    """Two MLA layers' do_kv_cache_update + forward_mqa captured over static buffers in a bucket of B requests of q
    tokens, then per step (full, or padded by vLLM: each padding request a q-token dummy decode over block-table row
    0, vLLM's null block) vLLM's build, update and replay: the outputs equal the eager layer's on copies of the
    caches, the caches equal eager's (the padding tokens' slot -1 writes nothing), and every real token equals
    float64 latent attention over its causal prefix."""
    N, L, P, R, V, _ = _mla_dims(cfg)
    nb = cfg.cache_config.num_gpu_blocks
    gen = torch.Generator().manual_seed(seed)
    T, cam_of = B * q, (_cam if q == 1 else _spec_cam)
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32,
                            cache_dtype_str="auto")
    builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], cfg, CPU)
    assert builder.reorder_batch_threshold == q
    impls = [_mla_impl(cfg, torch.nn.Linear(L, N * (P + V), bias=False)) for _ in range(2)]
    caches = [torch.randn(nb, BS, L + R, generator=gen) for _ in impls]
    bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
    qn_s, qr_s = torch.zeros(T, N, L), torch.zeros(T, N, R)
    c_s, kpe_s, slots_s = torch.zeros(T, L), torch.zeros(T, 1, R), torch.zeros(T, dtype=torch.int64)
    md = builder.build_for_cudagraph_capture(cam_of([9] * B, bt))
    outs = []
    with vgraph.capture(T):
        for impl, kv in zip(impls, caches):
            impl.do_kv_cache_update(c_s, kpe_s, kv, slots_s, "auto", torch.ones(()))
            outs.append(impl.forward_mqa((qn_s, qr_s), kv, md, None)[0])
    assert [c[0] for c in vgraph.graph_params().calls(T)] == ["prepare", "prepare", "fia_v2", "prepare"] * 2
    for seq in steps:
        nq = len(seq) * q
        cam = cam_of(seq, bt, pad_to=B if len(seq) < B else None)
        md = builder.build(0, cam)
        assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (B, T, 0)  # padding: dummy decodes
        qn, qr, c, kpe = (torch.randn(T, N, L, generator=gen), torch.randn(T, N, R, generator=gen),
                          torch.randn(T, L, generator=gen), torch.randn(T, 1, R, generator=gen))
        expected, eager_caches = [], []
        for impl, kv in zip(impls, caches):
            kv2 = kv.clone()
            impl.do_kv_cache_update(c, kpe, kv2, cam.slot_mapping, "auto", torch.ones(()))
            expected.append(impl.forward_mqa((qn, qr), kv2, md, None)[0].clone())
            eager_caches.append(kv2)
        for buf, src in ((qn_s, qn), (qr_s, qr), (c_s, c), (kpe_s, kpe), (slots_s, cam.slot_mapping)):
            buf.copy_(src)
        vgraph.update(T, md)
        vgraph.replay(T)
        for i, impl in enumerate(impls):
            torch.testing.assert_close(outs[i][:nq], expected[i][:nq], atol=1e-5, rtol=1e-5)
            assert torch.equal(caches[i], eager_caches[i])
            for r, s in enumerate(seq):
                for j in range(q):
                    t = r * q + j
                    ref = _latent_reference(qn[t], qr[t], impl._caches(caches[i]), bt, r, range(s - q + j + 1),
                                            impl.scale)
                    torch.testing.assert_close(outs[i][t].double(), ref, atol=1e-5, rtol=1e-5)


def test_mla_decode_bucket_replays_like_eager(store):
    cfg = copy.copy(_vllm_config("vllm_tiny_mla"))
    cfg.cache_config.num_gpu_blocks = 2 + B * 5
    # Full steps, then vLLM-padded ones (three, two and one real requests in the bucket of four).
    _mla_bucket(cfg, 1, STEPS + [[9, 9, 9], [40, 2], [17]], seed=5)


def test_mla_graph_update_refuses_uneven_padding(store):
    # vLLM's padding requests must each stand for decode_threshold tokens (the runtime's dummy decodes).
    cfg = copy.copy(_vllm_config("vllm_tiny_mla"))
    N, L, P, R, V, _ = _mla_dims(cfg)
    nb = 2 + B * 5
    cfg.cache_config.num_gpu_blocks = nb
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32,
                            cache_dtype_str="auto")
    builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["l0"], cfg, CPU)
    bt = random_block_table([64] * B, BS, nb, torch.Generator().manual_seed(2), width=WIDTH)
    cam = _cam([9, 9], bt, pad_to=B)
    cam.num_actual_tokens = B + 1  # two padding requests for three padding tokens
    with pytest.raises(NotImplementedError, match="spreads the padding tokens evenly"):
        builder.build(0, cam)
    cam.num_actual_tokens = 2 + 2 * 2  # two padding requests of two tokens each, decode_threshold 1
    with pytest.raises(NotImplementedError, match="decode_threshold=1"):
        builder.build(0, cam)


# --- sparse MLA + indexer

def _sparse_graph_config(family, spec=0, dtype=torch.float32):
    """register(family=...) (inside vllm_registration), then the sparse family's config (test_vllm_sparse) of the
    model dtype under FULL_DECODE_ONLY with the bucket's block pool; returns it and the pool size."""
    import test_vllm_sparse as ts

    aar_vllm.register(family=family)
    cfg = ts._config(family, dtype)
    if spec:
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    nb = 2 + B * 5
    cfg.cache_config.num_gpu_blocks = nb
    return cfg, nb


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_mla_decode_bucket_replays_like_eager(store, monkeypatch, family):
    import test_vllm_sparse as ts

    with vllm_registration():
        cfg, nb = _sparse_graph_config(family)
        gen = torch.Generator().manual_seed(9)
        with set_current_vllm_config(cfg):
            lay = ts.Layer(cfg, torch.float32, nb, gen)
            # Full steps, then padded ones (fewer real decodes, vLLM's empty padding requests up to the bucket).
            bt = _sparse_bucket(lay, gen, nb, 1, STEPS + [[9, 30, 17], [40, 2], [12]])
            # What cannot be padded: padding tokens not spread evenly over the padding requests.
            cam = _cam([9, 9], bt, pad_to=B)
            cam.num_actual_tokens = B + 1
            with pytest.raises(NotImplementedError, match="spreads the padding tokens evenly"):
                lay.builder.build(0, cam)


def _sparse_bucket(lay, gen, nb, q, steps):
    """A decode bucket of B requests of q tokens (q > 1: speculative, UNIFORM_BATCH) through the sparse indexer op's
    run, do_kv_cache_update and forward_mqa over static buffers; per step (full, then padded by vLLM when fewer than
    B requests: the padding requests as the SFA builder's q-token dummy decodes): update + replay equal to an eager
    run on copies of both caches (top-k included), the padding writes nothing to either cache, and every real token
    equals float64 latent attention over the positions the replay selected (each inside the token's causal prefix).
    Returns the block table."""
    N, L, R, n, D = lay.N, lay.L, lay.R, lay.n, lay.D
    T, cam_of = B * q, (_cam if q == 1 else _spec_cam)
    bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
    iq_s, ik_s, w_s = torch.zeros(T, n, D), torch.zeros(T, D), torch.zeros(T, n)
    qn_s, qr_s = torch.zeros(T, N, L), torch.zeros(T, N, R)
    c_s, kpe_s, slots_s = torch.zeros(T, L), torch.zeros(T, 1, R), torch.zeros(T, dtype=torch.int64)
    cam = cam_of([9] * B, bt)
    md, imd = lay.builder.build_for_cudagraph_capture(cam), lay.ibuilder.build_for_cudagraph_capture(cam)
    with vgraph.capture(T):
        lay.op.run(iq_s, ik_s, w_s, lay.idx_cache, imd)
        lay.impl.do_kv_cache_update(c_s, kpe_s, lay.kv_cache, slots_s, "auto", torch.ones(()))
        out = lay.impl.forward_mqa((qn_s, qr_s), lay.kv_cache, md, None)[0]
    assert [c[0] for c in vgraph.graph_params().calls(T)] == ["prepare"] * 3
    for seq in steps:
        nq = len(seq) * q
        cam = cam_of(seq, bt, pad_to=B if len(seq) < B else None)
        md, imd = lay.builder.build(0, cam), lay.ibuilder.build(0, cam)
        # the runtime's graph decode padding: the real decodes, B kernel requests
        assert (md.num_decodes, md.num_decode_tokens, md.sfa.num_reqs, md.sfa.num_kernel_reqs) == (len(seq), nq,
                                                                                                   len(seq), B)
        iq, ik, w = torch.randn(T, n, D, generator=gen), torch.randn(T, D, generator=gen), \
            torch.rand(T, n, generator=gen)
        qn, qr, c, kpe = (torch.randn(T, N, L, generator=gen), torch.randn(T, N, R, generator=gen),
                          torch.randn(T, L, generator=gen), torch.randn(T, 1, R, generator=gen))
        idx2, kv2 = lay.idx_cache.clone(), lay.kv_cache.clone()
        lay.op.run(iq, ik, w, idx2, imd)
        topk_eager = lay.buf[:nq].clone()
        lay.impl.do_kv_cache_update(c, kpe, kv2, cam.slot_mapping, "auto", torch.ones(()))
        expected = lay.impl.forward_mqa((qn, qr), kv2, md, None)[0].clone()
        lay.buf.fill_(-7)
        for buf, src in ((iq_s, iq), (ik_s, ik), (w_s, w), (qn_s, qn), (qr_s, qr), (c_s, c), (kpe_s, kpe),
                         (slots_s, cam.slot_mapping)):
            buf.copy_(src)
        vgraph.update(T, {"a": md, "b": imd})  # nothing to refresh (prepare calls only): the step is checked
        vgraph.replay(T)
        assert torch.equal(lay.buf[:nq], topk_eager)
        assert torch.equal(lay.idx_cache, idx2) and torch.equal(lay.kv_cache, kv2)
        torch.testing.assert_close(out[:nq], expected[:nq], atol=1e-5, rtol=1e-5)
        for r, s in enumerate(seq):
            for j in range(q):
                t = r * q + j
                sel = [int(p) for p in lay.buf[t] if p >= 0]
                assert sel and max(sel) <= s - q + j
                ref = _latent_reference(qn[t], qr[t], lay.impl._caches(lay.kv_cache), bt, r, sel, lay.impl.scale)
                torch.testing.assert_close(out[t].double(), ref, atol=1e-5, rtol=1e-5)
    return bt


def test_sparse_builder_takes_vllms_is_prefilling():
    # vLLM's model runner always sets is_prefilling; the SFA builder without KV offload splits by query length
    # only, so the flags are dropped when they do not change the split and refused by name when they would.
    import test_vllm_sparse as ts

    cfg = ts._config("deepseek_v32", torch.float32)
    hf = cfg.model_config.hf_text_config
    nb = 24
    cfg.cache_config.num_gpu_blocks = nb
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                            dtype=torch.float32, cache_dtype_str="auto")
    builder = AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["a"], cfg, CPU)
    bt = random_block_table([40] * 3, BS, nb, torch.Generator().manual_seed(4), width=WIDTH)
    qsl, sl = torch.tensor([0, 1, 2, 10], dtype=torch.int32), torch.tensor([20, 30, 40], dtype=torch.int32)
    cam = _common_metadata(qsl, sl, bt, torch.arange(10))
    cam.is_prefilling = torch.tensor([False, False, True])  # the prefill has a prefill-sized query
    md = builder.build(0, cam)
    assert (md.num_decodes, md.num_prefills, md.num_prefill_tokens) == (2, 1, 8)
    cam.is_prefilling = torch.tensor([False, True, True])  # a one-token extend flagged as a prefill
    with pytest.raises(NotImplementedError, match=r"is_prefilling marks requests \[1\]"):
        builder.build(0, cam)


# --- the torch_npu provider, on a double of torch.npu (docs/design/vllm_sparse.md §6; not run on an NPU here)

class _Stream:
    def __init__(self, npu, name):
        self.npu, self.name = npu, name

    def synchronize(self):
        self.npu.log.append(("synchronize", self.name))


class _Event:
    def __init__(self, npu):
        self.npu = npu

    def wait(self, s):
        self.npu.log.append(("event_wait", s.name))

    def reset(self, s):
        self.npu.log.append(("event_reset", s.name))

    def record(self, s):
        self.npu.log.append(("event_record", s.name))


class _NpuGraph:
    def __init__(self, npu):
        self.npu = npu

    def replay(self):
        self.npu.log.append(("replay",))


class NpuDouble:
    """A stand-in for torch.npu's graph API that logs every call with the stream it names (and, for a task update,
    the stream current while the operator is re-issued). It cannot capture or replay CPU kernels: on it the
    runtime's hooks provider launches every call at capture (the CPU twins run) and re-issues each attention call
    at update (the CPU twin runs with the refreshed arguments); a device replay is only logged."""

    def __init__(self):
        self.log = []
        self.compute = _Stream(self, "compute")
        self._current = self.compute
        self.capturing = False
        self.handles = []

    def ExternalEvent(self):  # noqa: N802 - torch.npu's name
        return _Event(self)

    def Stream(self):  # noqa: N802
        return _Stream(self, "update")

    def NPUGraph(self):  # noqa: N802
        return _NpuGraph(self)

    def current_stream(self):
        return self._current

    def is_current_stream_capturing(self):
        return self.capturing

    @contextlib.contextmanager
    def stream(self, s):
        prev, self._current = self._current, s
        try:
            yield
        finally:
            self._current = prev

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        prev, self._current = self._current, stream or _Stream(self, "capture")
        self.capturing = True
        try:
            yield
        finally:
            self._current, self.capturing = prev, False

    def graph_task_group_begin(self, s):
        self.log.append(("group_begin", s.name))

    def graph_task_group_end(self, s):
        self.log.append(("group_end", s.name))
        self.handles.append(object())
        return self.handles[-1]

    def graph_task_update_begin(self, s, handle):
        self.log.append(("update_begin", s.name, self.handles.index(handle), self._current.name))

    def graph_task_update_end(self, s):
        self.log.append(("update_end", s.name))


CAPTURED_CALL = [("event_wait", "capture"), ("event_reset", "capture"), ("group_begin", "capture"),
                 ("group_end", "capture")]


def _updated_call(i):
    return [("update_begin", "update", i, "update"), ("update_end", "update"), ("event_record", "update")]


@pytest.fixture
def npu():
    double = NpuDouble()
    try:
        yield double
    finally:
        vgraph.clear_graph_provider()


def test_torch_npu_provider_refusals(npu):
    g = vgraph.set_graph_provider("torch_npu", npu=npu)
    assert vgraph.graph_provider() == "torch_npu" and g.provider == "hooks"
    with pytest.raises(RuntimeError, match="outside a device-graph capture"), vgraph.capture(B):
        pass
    assert not g.has(B)
    with vgraph.capture(B, device_graph=npu.NPUGraph()):
        pass  # an empty bucket
    with pytest.raises(ValueError, match="replays the device graph: pass device_graph="):
        vgraph.replay(B)
    with pytest.raises(ValueError, match="replay of bucket 4 before update"):
        vgraph.replay(B, npu.NPUGraph())
    vgraph.set_graph_provider("recording")
    with pytest.raises(ValueError, match="device_graph: the 'recording' graph provider"), \
            vgraph.capture(B, device_graph=npu.NPUGraph()):
        pass


def test_gqa_bucket_through_torch_npu_hooks(npu):
    """vLLM's GQA impl.forward captured inside a device-graph capture on the torch_npu provider: each layer's KV write
    is a plain kernel of the graph (no hook), its attention call one task group with its event on the capture stream.
    Per step the update waits for the previous replay, then re-issues each attention call on the update stream
    between the task-update hooks (with the handle of its own task group) and records its event there; the replay
    follows. The double runs the re-issue (the CPU twin, refreshed arguments) into the layer's output: with the
    step's KV rows in the cache (the graph's KV write, emulated with the eager run's cache), that output equals the
    eager step and the float64 reference."""
    dtype = torch.float32
    cfg = _vllm_config("vllm_tiny_gqa")
    mc = cfg.model_config
    N, NKV, D = mc.get_num_attention_heads(cfg.parallel_config), mc.get_num_kv_heads(cfg.parallel_config), \
        mc.get_head_size()
    nb = 2 + B * 5
    cfg.cache_config.num_gpu_blocks = nb
    gen = torch.Generator().manual_seed(13)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=NKV, head_size=D, dtype=dtype)
    names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    vgraph.set_graph_provider("torch_npu", npu=npu)
    builder = AscendAttnRtBackend.get_builder_cls()(spec, names, cfg, CPU)
    impls = [AscendAttnRtBackend.get_impl_cls()(N, D, D ** -0.5, NKV) for _ in names]
    caches = [torch.randn(2, nb, BS, NKV, D, generator=gen).to(dtype) for _ in names]
    bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
    q_s = [torch.zeros(B, N * D, dtype=dtype) for _ in names]
    kv_s = [torch.zeros(B, NKV * D, dtype=dtype) for _ in names]
    out_s = [torch.zeros(B, N * D, dtype=dtype) for _ in names]
    graph = npu.NPUGraph()
    md = builder.build_for_cudagraph_capture(_cam([9] * B, bt))
    with vgraph.capture(B, device_graph=graph):
        for i, impl in enumerate(impls):
            impl.forward(None, q_s[i], kv_s[i], kv_s[i], caches[i], md, out_s[i])
    assert npu.log == CAPTURED_CALL * 2
    assert [c[0] for c in vgraph.graph_params().calls(B)] == ["kv_write", "fia"] * 2

    for seq in STEPS + [[30, 12, 7]]:
        nreal = len(seq)
        md = builder.build(0, _cam(seq, bt, pad_to=B if nreal < B else None))
        qs = [torch.randn(B, N * D, generator=gen).to(dtype) for _ in names]
        kvs = [torch.randn(B, NKV * D, generator=gen).to(dtype) for _ in names]
        expected = []
        for i, impl in enumerate(impls):
            kv = caches[i].clone()
            out = torch.full((B, N * D), 7.0, dtype=dtype)
            impl.forward(None, qs[i], kvs[i], kvs[i], kv, md, out)
            expected.append(out)
            caches[i].copy_(kv)  # what the device graph's KV write would leave (checked on the recording provider)
            q_s[i].copy_(qs[i])
        npu.log.clear()
        vgraph.update(B, {n: md for n in names})
        assert npu.log == [("synchronize", "compute")] + _updated_call(0) + _updated_call(1)
        lists = vgraph.graph_params().captured_lists(B)
        assert [lst[2][:nreal] for lst in lists] == [seq, seq]
        vgraph.replay(B, graph)
        assert npu.log[-1] == ("replay",)
        for i in range(len(names)):
            torch.testing.assert_close(out_s[i][:nreal], expected[i][:nreal], atol=1e-5, rtol=1e-5)
            ref = _gqa_reference(qs[i].view(B, N, D)[:nreal], caches[i][0], caches[i][1], bt, seq, D ** -0.5)
            torch.testing.assert_close(out_s[i].view(B, N, D)[:nreal].double(), ref, atol=1e-5, rtol=1e-5)
    # A step that does not fit is refused before any task hook (after the harmless wait for the previous replay).
    npu.log.clear()
    md5 = builder.build(0, _cam([9] * 5, random_block_table([64] * 5, BS, nb, gen, width=WIDTH)))
    with pytest.raises(ValueError):
        vgraph.update(B, md5)
    assert npu.log == [("synchronize", "compute")]
    with pytest.raises(ValueError, match="before update"):
        vgraph.replay(B, graph)


def test_mla_bucket_through_torch_npu_hooks(npu):
    """The MLA impl's do_kv_cache_update and forward_mqa on the torch_npu provider: the cache write and the query /
    output moves are plain kernels of the device graph, the latent attention one task group; per step its re-issue
    on the update stream carries the step's KV lengths (the double cannot run the graph's prepare kernels, so the
    refreshed arguments are what is checked)."""
    cfg = copy.copy(_vllm_config("vllm_tiny_mla"))
    N, L, P, R, V, _ = _mla_dims(cfg)
    nb = 2 + B * 5
    cfg.cache_config.num_gpu_blocks = nb
    gen = torch.Generator().manual_seed(15)
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32,
                            cache_dtype_str="auto")
    vgraph.set_graph_provider("torch_npu", npu=npu)
    builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], cfg, CPU)
    impls = [_mla_impl(cfg, torch.nn.Linear(L, N * (P + V), bias=False)) for _ in range(2)]
    caches = [torch.randn(nb, BS, L + R, generator=gen) for _ in impls]
    bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
    qn_s, qr_s = torch.zeros(B, N, L), torch.zeros(B, N, R)
    c_s, kpe_s, slots_s = torch.zeros(B, L), torch.zeros(B, 1, R), torch.zeros(B, dtype=torch.int64)
    graph = npu.NPUGraph()
    md = builder.build_for_cudagraph_capture(_cam([9] * B, bt))
    with vgraph.capture(B, device_graph=graph):
        for impl, kv in zip(impls, caches):
            impl.do_kv_cache_update(c_s, kpe_s, kv, slots_s, "auto", torch.ones(()))
            impl.forward_mqa((qn_s, qr_s), kv, md, None)
    assert npu.log == CAPTURED_CALL * 2
    assert [c[0] for c in vgraph.graph_params().calls(B)] == ["prepare", "prepare", "fia_v2", "prepare"] * 2
    for seq in STEPS:
        md = builder.build(0, _cam(seq, bt))
        npu.log.clear()
        vgraph.update(B, md)
        assert npu.log == [("synchronize", "compute")] + _updated_call(0) + _updated_call(1)
        assert [lst[2] for lst in vgraph.graph_params().captured_lists(B)] == [seq, seq]
        vgraph.replay(B, graph)
    # A padded step (vLLM's empty padding request as a one-token dummy decode): the re-issue carries the real
    # KV lengths then the dummy's 1.
    npu.log.clear()
    vgraph.update(B, builder.build(0, _cam([9, 30, 17], bt, pad_to=B)))
    assert npu.log == [("synchronize", "compute")] + _updated_call(0) + _updated_call(1)
    assert [lst[2] for lst in vgraph.graph_params().captured_lists(B)] == [[9, 30, 17, 1]] * 2
    vgraph.replay(B, graph)
    npu.log.clear()
    with pytest.raises(ValueError):  # a step of more requests than the bucket's rows
        vgraph.update(B, builder.build(0, _cam([9] * 5, random_block_table([64] * 5, BS, nb, gen, width=WIDTH))))
    assert npu.log == [("synchronize", "compute")]  # no task hook


@pytest.mark.parametrize("family", ["deepseek_v32"])
def test_sparse_bucket_through_torch_npu_hooks(npu, family):
    """The sparse indexer op and sparse MLA impl on the torch_npu provider: every call is a plain kernel of the
    device graph (nothing read from host lists), so the capture makes no task group and an update re-issues
    nothing: it checks the step fills the bucket, waits for the previous replay and enters the update stream."""
    import test_vllm_sparse as ts

    with vllm_registration():
        cfg, nb = _sparse_graph_config(family)
        gen = torch.Generator().manual_seed(19)
        vgraph.set_graph_provider("torch_npu", npu=npu)
        with set_current_vllm_config(cfg):
            lay = ts.Layer(cfg, torch.float32, nb, gen)
            N, L, R, n, D = lay.N, lay.L, lay.R, lay.n, lay.D
            bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
            cam = _cam([9] * B, bt)
            md, imd = lay.builder.build_for_cudagraph_capture(cam), lay.ibuilder.build_for_cudagraph_capture(cam)
            graph = npu.NPUGraph()
            with vgraph.capture(B, device_graph=graph):
                lay.op.run(torch.zeros(B, n, D), torch.zeros(B, D), torch.zeros(B, n), lay.idx_cache, imd)
                lay.impl.do_kv_cache_update(torch.zeros(B, L), torch.zeros(B, 1, R), lay.kv_cache,
                                            torch.zeros(B, dtype=torch.int64), "auto", torch.ones(()))
                lay.impl.forward_mqa((torch.zeros(B, N, L), torch.zeros(B, N, R)), lay.kv_cache, md, None)
            assert npu.log == []
            assert [c[0] for c in vgraph.graph_params().calls(B)] == ["prepare"] * 3
            for seq in STEPS:
                cam = _cam(seq, bt)
                vgraph.update(B, {"a": lay.builder.build(0, cam), "b": lay.ibuilder.build(0, cam)})
                vgraph.replay(B, graph)
            assert npu.log == [("synchronize", "compute"), ("replay",)] * len(STEPS)
            npu.log.clear()
            cam = _cam([9, 9, 9], bt, pad_to=B)  # a padded step fills the bucket (the padding as dummy decodes)
            vgraph.update(B, {"a": lay.builder.build(0, cam), "b": lay.ibuilder.build(0, cam)})
            assert npu.log == [("synchronize", "compute")]
            vgraph.replay(B, graph)
            npu.log.clear()
            cam = _cam([9] * 5, random_block_table([64] * 5, BS, nb, gen, width=WIDTH))
            with pytest.raises(ValueError, match="takes decode-only steps of 4 kernel tokens"):
                vgraph.update(B, {"a": lay.builder.build(0, cam), "b": lay.ibuilder.build(0, cam)})
            assert npu.log == []


# --- speculative decode buckets (UNIFORM_BATCH): requests of 1 + num_speculative_tokens tokens

SPEC = 1
Q = 1 + SPEC
BQ = 8  # the bucket: four requests of two tokens


def _spec_config(name):
    cfg = copy.copy(_vllm_config(name))
    cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=SPEC)  # what the builders read of it
    cfg.cache_config = copy.copy(cfg.cache_config)
    cfg.cache_config.num_gpu_blocks = 2 + B * 5
    return cfg


def _spec_cam(seq_lens, bt, pad_to=None):
    """vLLM's uniform decode batch: each request's Q newest tokens (positions seq_len - Q .. seq_len - 1); with
    pad_to, padded as vLLM pads a full-graph batch (empty requests of KV length 0 and block-table row 0,
    num_actual_tokens pad_to * Q, the padding tokens' slots -1)."""
    n = len(seq_lens)
    total = pad_to or n
    qsl = torch.tensor(list(range(0, Q * n + 1, Q)) + [Q * n] * (total - n), dtype=torch.int32)
    slots = [int(bt[i, p // BS]) * BS + p % BS for i, s in enumerate(seq_lens) for p in range(s - Q, s)]
    rows = torch.zeros(total, bt.shape[1], dtype=torch.int32)
    rows[:n] = bt[:n]
    cam = _common_metadata(qsl, torch.tensor(list(seq_lens) + [0] * (total - n), dtype=torch.int32), rows,
                           torch.tensor(slots + [-1] * Q * (total - n), dtype=torch.int64))
    if pad_to:
        cam.num_actual_tokens = Q * total
        cam.max_query_len = Q
    return cam


def _latent_reference(qn, qr, caches, bt, r, positions, scale):
    """float64 latent attention of one query token (qn (N, L), qr (N, R)) over the given positions of request r's
    rows of the latent and rope caches (the adapter's views of vLLM's buffer, ``impl._caches``; explicit mask: only
    those positions), output (N, L)."""
    p = torch.as_tensor(positions, dtype=torch.int64)
    blocks, offs = bt[r, p // BS].long(), p % BS
    c, kpe = caches[0][blocks, offs].reshape(len(p), -1).double(), caches[1][blocks, offs].reshape(len(p), -1).double()
    w = torch.softmax((qn.double() @ c.T + qr.double() @ kpe.T) * scale, dim=-1)
    return w @ c


@pytest.mark.parametrize("backend,name", [(AscendAttnRtBackend, "vllm_tiny_gqa"), (AscendAttnRtMlaBackend,
                                                                                   "vllm_tiny_mla"),
                                          (AscendAttnRtSparseMlaBackend, "vllm_tiny_mla"),
                                          (AscendAttnRtIndexerBackend, "vllm_tiny_mla")])
def test_speculative_tokens_declare_uniform_batch(backend, name):
    cfg = _spec_config(name)
    spec = (FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float16) if "gqa" in name
            else MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=80, dtype=torch.float16))
    assert backend.get_builder_cls().get_cudagraph_support(cfg, spec) is AttentionCGSupport.UNIFORM_BATCH
    # vLLM's resolution with uniform_decode_query_len = 1 + num_speculative_tokens: FULL_DECODE_ONLY is kept for
    # UNIFORM_BATCH; the single-token level would make vLLM give up full decode graphs (here: PIECEWISE).
    for support in (AttentionCGSupport.UNIFORM_BATCH, AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE):
        cc = copy.deepcopy(cfg.compilation_config)
        cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = [2, 4, 8], 8
        mode = cc.resolve_cudagraph_mode_and_sizes(support, backend.__name__, Q, use_v2_model_runner=False,
                                                   tensor_parallel_size=1, kv_cache_config=None, max_num_reqs=8,
                                                   is_profiling=False)
        assert (mode == CUDAGraphMode.FULL_DECODE_ONLY) == (support is AttentionCGSupport.UNIFORM_BATCH), (support, mode)


def test_gqa_speculative_bucket_replays_like_eager(store):
    _gqa_bucket(_spec_config("vllm_tiny_gqa"), torch.float32, Q, STEPS, seed=23)


def test_mla_speculative_bucket_replays_like_eager(store):
    _mla_bucket(_spec_config("vllm_tiny_mla"), Q, STEPS + [[30, 12, 7]], seed=25)  # the last one padded by vLLM


def test_sparse_speculative_bucket_replays_like_eager(store):
    import test_vllm_sparse as ts

    with vllm_registration():
        cfg, nb = _sparse_graph_config("deepseek_v32", SPEC)
        gen = torch.Generator().manual_seed(27)
        with set_current_vllm_config(cfg):
            lay = ts.Layer(cfg, torch.float32, nb, gen)
            spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=lay.L + lay.R, dtype=torch.float32)
            assert type(lay.builder).get_cudagraph_support(cfg, spec) is AttentionCGSupport.UNIFORM_BATCH
            _sparse_bucket(lay, gen, nb, Q, STEPS + [[30, 12, 7]])  # the last padded by vLLM
