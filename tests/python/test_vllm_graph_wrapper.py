"""vLLM's own graph wrapper dispatch over the adapter (ascend_attn_rt.vllm.graph.AscendAttnRtGraphWrapper,
docs/design/vllm_sparse.md §6.1): install_graph_wrapper() makes vLLM's platform resolve the adapter's wrapper,
which is constructed as vLLM constructs its static graph wrapper and driven only by vLLM's forward context
(set_forward_context with CUDAGraphMode.FULL and a BatchDescriptor): the first FULL call of a decode bucket captures,
later ones run the adapter's update then the replay. The runnable is a small two-layer model whose attention is
vLLM's own layer code (Attention.forward -> unified_attention_with_output -> the adapter's impl; MLAAttention.forward
-> do_kv_cache_update + forward_impl -> forward_mqa) with projections around it, so a layer's attention input depends
on the previous layer's attention output. Every replayed step is checked against the same model run eagerly through
the wrapper (mode NONE, caches copied) and against a float64 model with explicit per-request masks. The sparse MLA
(DeepSeek-V3.2) and DeepSeek-V4 buckets run in fp32 and bf16 (replay equal to eager bit for bit), each also as a
speculative bucket (num_speculative_tokens = 1: vLLM's uniform batch of B requests of two tokens, UNIFORM_BATCH)."""

import copy
import sys
import types

import pytest
import torch

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.forward_context import BatchDescriptor, set_forward_context  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec  # noqa: E402

from ascend_attn_rt.vllm import AscendAttnRtBackend, AscendAttnRtMlaBackend  # noqa: E402
from ascend_attn_rt.vllm import graph as vgraph  # noqa: E402
from _mla_reference import latent_attention_reference  # noqa: E402
from _reference import assert_close, random_block_table  # noqa: E402
from test_vllm_backend import BS, _vllm_config  # noqa: E402
from _vllm_support import (attention_layer, graph_wrapper_cls as _wrapper_cls, log_graph_calls as _logged,  # noqa: E402
                           mla_dims as _mla_dims, mla_impl as _mla_impl, mla_layer, vllm_registration)
from test_vllm_graph import _cam, NpuDouble, CAPTURED_CALL, _sparse_graph_config, _updated_call  # noqa: E402
from test_vllm_dsa import registered, vllm_dist  # noqa: E402,F401  (fixtures of the DeepSeek-V4 test)

B = 4
WIDTH = 512 // BS
CPU = torch.device("cpu")
FULL, NONE = CUDAGraphMode.FULL, CUDAGraphMode.NONE
DESC = BatchDescriptor(num_tokens=B, num_reqs=B, uniform=True)
# Full steps, then steps vLLM pads up to the bucket (fewer real requests).
STEPS = [[5, 17, 33, 9], [40, 2, 11, 23], [30, 12, 7], [64, 3]]


@pytest.fixture
def installed():
    names = vgraph.install_graph_wrapper()
    try:
        yield names
    finally:
        vgraph.uninstall_graph_wrapper()
        vgraph.clear_graph_provider()


def _config(name):
    cfg = copy.copy(_vllm_config(name))
    cfg.cache_config = copy.copy(cfg.cache_config)
    cfg.cache_config.num_gpu_blocks = 2 + B * 5
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    return cfg


# --- the model: vLLM's attention layers with projections around them

class GqaModel(torch.nn.Module):
    def __init__(self, cfg, dtype, gen, hidden=48):
        super().__init__()
        mc = cfg.model_config
        self.N, self.NKV, self.D = mc.get_num_attention_heads(cfg.parallel_config), \
            mc.get_num_kv_heads(cfg.parallel_config), mc.get_head_size()
        self.H, self.dtype = hidden, dtype
        self.names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
        nb = cfg.cache_config.num_gpu_blocks
        N, NKV, D, H = self.N, self.NKV, self.D, hidden
        self.w = [dict(q=torch.randn(H, N * D, generator=gen) * H ** -0.5,
                       k=torch.randn(H, NKV * D, generator=gen) * H ** -0.5,
                       v=torch.randn(H, NKV * D, generator=gen) * H ** -0.5,
                       o=torch.randn(N * D, H, generator=gen) * (N * D) ** -0.5) for _ in self.names]
        self.layers = []
        for name in self.names:
            self.layers.append(attention_layer(AscendAttnRtBackend.get_impl_cls()(N, D, D ** -0.5, NKV),
                                               AscendAttnRtBackend, name,
                                               torch.randn(2, nb, BS, NKV, D, generator=gen).to(dtype), N, NKV, D))
        cfg.compilation_config.static_forward_context = {n: lay for n, lay in zip(self.names, self.layers)}

    def forward(self, hidden):
        for w, lay in zip(self.w, self.layers):
            h = hidden.to(self.dtype)
            o = lay.forward(h @ w["q"].to(self.dtype), h @ w["k"].to(self.dtype), h @ w["v"].to(self.dtype))
            hidden = hidden + o.float() @ w["o"]
        return hidden

    def caches(self):
        return [lay.kv_cache for lay in self.layers]

    def reference(self, hidden, caches, bt, seq):
        """float64: each real request's token at position s - 1 attends positions 0 .. s - 1 of its rows (the cache
        before the step, its own new K/V at s - 1), GQA head grouping."""
        N, NKV, D = self.N, self.NKV, self.D
        h = hidden[: len(seq)].double()
        for w, kv in zip(self.w, caches):
            q, k, v = ((h @ w[x].double()).view(len(seq), -1, D) for x in "qkv")
            outs = []
            for r, s in enumerate(seq):
                p = torch.arange(s - 1)
                blk, off = bt[r, p // BS].long(), p % BS
                kk = torch.cat([kv[0][blk, off].double(), k[r: r + 1]]).repeat_interleave(N // NKV, dim=1)
                vv = torch.cat([kv[1][blk, off].double(), v[r: r + 1]]).repeat_interleave(N // NKV, dim=1)
                a = torch.softmax(torch.einsum("hd,shd->hs", q[r], kk) * D ** -0.5, dim=-1)
                outs.append(torch.einsum("hs,shd->hd", a, vv).reshape(-1))
            h = h + torch.stack(outs) @ w["o"].double()
        return h


class MlaModel(torch.nn.Module):
    def __init__(self, cfg, gen, hidden=48):
        super().__init__()
        self.N, self.L, self.P, self.R, self.V, _ = _mla_dims(cfg)
        N, L, P, R, V, H = self.N, self.L, self.P, self.R, self.V, hidden
        self.H = H
        self.names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
        nb = cfg.cache_config.num_gpu_blocks
        self.w, self.layers = [], []
        for name in self.names:
            kv_b = torch.nn.Linear(L, N * (P + V), bias=False).requires_grad_(False)
            kv_b.weight.copy_(torch.randn(N * (P + V), L, generator=gen) * L ** -0.5)
            self.w.append(dict(q=torch.randn(H, N * (P + R), generator=gen) * H ** -0.5,
                               ckv=torch.randn(H, L + R, generator=gen) * H ** -0.5,
                               o=torch.randn(N * V, H, generator=gen) * (N * V) ** -0.5, kv_b=kv_b))
            # vLLM's MLAAttention attributes its forward and forward_impl read, its forward bound.
            self.layers.append(mla_layer(_mla_impl(cfg, kv_b), cfg, kv_b, name,
                                         torch.randn(nb, BS, L + R, generator=gen)))
        cfg.compilation_config.static_forward_context = {n: lay for n, lay in zip(self.names, self.layers)}

    def forward(self, hidden):
        T = hidden.shape[0]
        for w, lay in zip(self.w, self.layers):
            q = (hidden @ w["q"]).view(T, self.N, self.P + self.R)
            c, kpe = (hidden @ w["ckv"]).split([self.L, self.R], dim=-1)
            o = lay.forward(q, c, kpe.unsqueeze(1), output_shape=(T, self.N * self.V))
            hidden = hidden + o @ w["o"]
        return hidden

    def caches(self):
        return [lay.kv_cache for lay in self.layers]

    def reference(self, hidden, caches, bt, seq):
        """float64 un-absorbed MLA: each real request's token over its rows 0 .. s - 2 of the cache before the step
        and its own latent at s - 1 (explicit mask in latent_attention_reference)."""
        from ascend_attn_rt import _C as aar

        L, R = self.L, self.R
        h = hidden[: len(seq)].double()
        for w, kv in zip(self.w, caches):
            q = (h @ w["q"].double()).view(len(seq), self.N, self.P + R)
            c, kpe = (h @ w["ckv"].double()).split([L, R], dim=-1)
            outs = []
            # The adapter's views of vLLM's buffer: the latent and rope caches side by side (not [L | R] rows).
            nope, rope = aar.mla.LatentAttention.split_kv_cache(kv, L)
            for r, s in enumerate(seq):
                p = torch.arange(s - 1)
                blk, off = bt[r, p // BS].long(), p % BS
                ca = torch.cat([nope[blk, off].reshape(len(p), L).double(), c[r: r + 1]])
                ka = torch.cat([rope[blk, off].reshape(len(p), R).double(), kpe[r: r + 1]])
                o = latent_attention_reference(q[r: r + 1], ca, ka, w["kv_b"].weight.double(), 1,
                                               (self.P + R) ** -0.5, self.N, self.P, self.V)
                outs.append(o.reshape(-1))
            h = h + torch.stack(outs) @ w["o"].double()
        return h


def _setup(family, dtype=torch.float32, seed=3):
    gen = torch.Generator().manual_seed(seed)
    if family == "gqa":
        cfg = _config("vllm_tiny_gqa")
        model = GqaModel(cfg, dtype, gen)
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=model.NKV, head_size=model.D, dtype=dtype)
        builder = AscendAttnRtBackend.get_builder_cls()(spec, model.names, cfg, CPU)
    else:
        cfg = _config("vllm_tiny_mla")
        model = MlaModel(cfg, gen)
        spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=model.L + model.R, dtype=torch.float32,
                                cache_dtype_str="auto")
        builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, model.names, cfg, CPU)
    bt = random_block_table([64] * B, BS, cfg.cache_config.num_gpu_blocks, gen, width=WIDTH)
    return cfg, model, builder, bt, gen


def _run(model, cfg, wrapper, md, cam, hidden, mode, desc=DESC):
    slots = {n: cam.slot_mapping for n in model.names}  # vLLM's per-layer slot mapping (MLA's cache update reads it)
    with set_forward_context({n: md for n in model.names}, cfg, cudagraph_runtime_mode=mode, batch_descriptor=desc,
                             slot_mapping=slots):
        return wrapper(hidden)


# --- how vLLM finds the wrapper

def test_install_makes_vllm_resolve_the_adapters_wrapper(installed, monkeypatch):
    import vllm.compilation.cuda_graph as cg
    from vllm.compilation.cuda_graph import CUDAGraphOptions
    from vllm.platforms import current_platform

    cls = vgraph.AscendAttnRtGraphWrapper
    assert _wrapper_cls() is cls and issubclass(cls, cls._aar_base) and cls._aar_base.__name__ == "CUDAGraphWrapper"
    assert cg.CUDAGraphWrapper is cls  # what vLLM's GPU model runner imports for FULL graphs
    assert installed == [f"{type(current_platform).__name__}.get_static_graph_wrapper_cls",
                         "vllm.compilation.cuda_graph.CUDAGraphWrapper"]
    assert vgraph.install_graph_wrapper() == installed  # idempotent
    # vLLM's compile backend constructs the platform's wrapper with these keywords (PIECEWISE: refused by name).
    with pytest.raises(NotImplementedError, match="runtime_mode=PIECEWISE.*FULL_DECODE_ONLY"):
        cls(runnable=lambda x: x, vllm_config=_config("vllm_tiny_gqa"), runtime_mode=CUDAGraphMode.PIECEWISE,
            cudagraph_options=CUDAGraphOptions())
    vgraph.uninstall_graph_wrapper()
    assert cg.CUDAGraphWrapper is cls._aar_base
    assert current_platform.get_static_graph_wrapper_cls() != vgraph.WRAPPER_QUALNAME
    assert "get_static_graph_wrapper_cls" not in vars(current_platform)
    # A GPU model runner imported before the install gets its module name patched too.
    runner = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    runner.CUDAGraphWrapper = cls._aar_base
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", runner)
    assert vgraph.install_graph_wrapper()[-1] == "vllm.v1.worker.gpu_model_runner.CUDAGraphWrapper"
    assert runner.CUDAGraphWrapper is cls
    vgraph.uninstall_graph_wrapper()
    assert runner.CUDAGraphWrapper is cls._aar_base


# --- recording provider: capture, then update + segment replays inside an eager run of the model

@pytest.mark.parametrize("family,dtype", [("gqa", torch.float32), ("gqa", torch.float16), ("mla", torch.float32)],
                         ids=["gqa_fp32", "gqa_fp16", "mla_fp32"])
def test_full_decode_bucket_through_vllms_wrapper(installed, monkeypatch, family, dtype):
    vgraph.set_graph_provider("recording")
    cfg, model, builder, bt, gen = _setup(family, dtype)
    wrapper = _wrapper_cls()(model, cfg, FULL)
    log = _logged(monkeypatch)
    hidden_s = torch.zeros(B, model.H)  # vLLM's persistent input buffer
    kinds = ["GQA forward"] if family == "gqa" else ["MLA do_kv_cache_update", "MLA forward_mqa"]

    # vLLM's capture run: build_for_cudagraph_capture's metadata, FULL, the bucket's descriptor.
    cam = _cam([9] * B, bt)
    before = [c.clone() for c in model.caches()]
    _run(model, cfg, wrapper, builder.build_for_cudagraph_capture(cam), cam, hidden_s, FULL)
    assert log == [("capture", k) for k in kinds] * 2  # each adapter call captured, no update
    assert all(torch.equal(a, b) for a, b in zip(model.caches(), before))  # recorded, nothing ran
    assert list(wrapper.concrete_cudagraph_entries) == [DESC]

    for seq in STEPS:
        nreal = len(seq)
        cam = _cam(seq, bt, pad_to=B if nreal < B else None)
        md = builder.build(0, cam)
        h = torch.randn(B, model.H, generator=gen)
        # Eager: the same model through the wrapper with mode NONE (passes through), on copies of the caches.
        saved = [lay.kv_cache for lay in model.layers]
        for lay in model.layers:
            lay.kv_cache = lay.kv_cache.clone()
        pre = [lay.kv_cache.clone() for lay in model.layers]
        log.clear()
        expected = _run(model, cfg, wrapper, md, cam, h.clone(), NONE)
        assert log == []  # NONE: no update, no segment
        eager_caches = [lay.kv_cache for lay in model.layers]
        for lay, c in zip(model.layers, saved):
            lay.kv_cache = c
        # The wrapper's replay: vLLM copies the step's input into its buffer and calls the model under FULL.
        hidden_s.copy_(h)
        out = _run(model, cfg, wrapper, md, cam, hidden_s, FULL)
        assert log == [("update", B)] + [("replay", k) for k in kinds] * 2  # the update before every replay
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out[:nreal], expected[:nreal], atol=tol, rtol=tol)
        assert all(torch.equal(a, b) for a, b in zip(model.caches(), eager_caches))  # padding wrote nothing
        ref = model.reference(h, pre, bt, seq)
        torch.testing.assert_close(out[:nreal].double(), ref, atol=tol, rtol=tol)


def test_wrapper_dispatch_and_refusals(installed):
    vgraph.set_graph_provider("recording")
    cfg, model, builder, bt, gen = _setup("gqa")
    wrapper = _wrapper_cls()(model, cfg, FULL)
    cam = _cam([9] * B, bt)
    h = torch.randn(B, model.H, generator=gen)
    # Without a forward context (e.g. an encoder run) the runnable runs as it is (eager).
    with pytest.raises(AssertionError, match="Forward context is not set"):
        wrapper(h)  # vLLM's Attention layer needs one: the wrapper passed the call straight to the model
    # PIECEWISE in the forward context: not this FULL wrapper's mode, the runnable runs (vLLM's nesting rule).
    expected = _run(model, cfg, wrapper, builder.build(0, cam), cam, h, NONE)
    for lay in model.layers:
        lay.kv_cache = lay.kv_cache.clone()
    got = _run(model, cfg, wrapper, builder.build(0, cam), cam, h, CUDAGraphMode.PIECEWISE,
               BatchDescriptor(num_tokens=B))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not wrapper.concrete_cudagraph_entries and not vgraph.graph_params().buckets()
    # FULL for a batch that is not a uniform decode batch: refused by name (the adapter honours FULL_DECODE_ONLY).
    with pytest.raises(NotImplementedError, match="FULL graphs of uniform decode batches only"):
        _run(model, cfg, wrapper, builder.build(0, cam), cam, h, FULL, BatchDescriptor(num_tokens=B))
    # FULL without a graph provider.
    vgraph.clear_graph_provider()
    with pytest.raises(RuntimeError, match="no graph provider is set"):
        _run(model, cfg, wrapper, builder.build(0, cam), cam, h, FULL)
    vgraph.set_graph_provider("recording")
    hidden_s = torch.zeros(B, model.H)
    _run(model, cfg, wrapper, builder.build_for_cudagraph_capture(cam), cam, hidden_s, FULL)
    with pytest.raises(ValueError, match="its segments replay inside the wrapper's run"):
        vgraph.replay(B)
    with pytest.raises(ValueError, match="already captured by AscendAttnRtGraphWrapper"), vgraph.capture(B):
        pass
    # A second wrapped runnable cannot take the same bucket on this provider.
    with pytest.raises(ValueError, match="bucket 4 is already captured"):
        _run(model, cfg, _wrapper_cls()(model, cfg, FULL), builder.build_for_cudagraph_capture(cam), cam, hidden_s,
             FULL)
    # A step that does not fit the bucket is refused by the update, before any segment replays.
    bt5 = random_block_table([64] * 5, BS, cfg.cache_config.num_gpu_blocks, gen, width=WIDTH)
    before = [c.clone() for c in model.caches()]
    with pytest.raises(ValueError):
        _run(model, cfg, wrapper, builder.build(0, _cam([9] * 5, bt5)), _cam([9] * 5, bt5), hidden_s, FULL)
    assert all(torch.equal(a, b) for a, b in zip(model.caches(), before))
    # A replay with other caches than the captured ones is refused by name.
    model.layers[0].kv_cache = model.layers[0].kv_cache.clone()
    with pytest.raises(ValueError, match="KV cache is not the one captured"):
        _run(model, cfg, wrapper, builder.build(0, cam), cam, hidden_s, FULL)
    # clear_graphs drops the bucket; a provider change drops the segments too.
    wrapper.clear_graphs()
    assert not wrapper.concrete_cudagraph_entries and not vgraph._tapes


# --- torch_npu provider (a double of torch.npu): the whole model inside one device-graph capture

@pytest.mark.parametrize("family", ["gqa", "mla"])
def test_wrapper_on_torch_npu_provider_hook_order(installed, family):
    npu = NpuDouble()
    graphs = []

    def new_graph():
        graphs.append(types.SimpleNamespace(replay=lambda: npu.log.append(("replay",))))
        return graphs[-1]

    npu.NPUGraph = new_graph
    vgraph.set_graph_provider("torch_npu", npu=npu)
    cfg, model, builder, bt, gen = _setup(family)
    wrapper = _wrapper_cls()(model, cfg, FULL)
    hidden_s = torch.zeros(B, model.H)
    cam = _cam([9] * B, bt)
    _run(model, cfg, wrapper, builder.build_for_cudagraph_capture(cam), cam, hidden_s, FULL)
    # Each attention call in its task group on the capture stream: the capture ran inside the device capture.
    assert npu.log == CAPTURED_CALL * 2 and not npu.capturing and len(graphs) == 1
    calls = ["kv_write", "fia"] if family == "gqa" else ["prepare", "prepare", "fia_v2", "prepare"]
    assert [c[0] for c in vgraph.graph_params().calls(B)] == calls * 2
    for seq in STEPS:
        nreal = len(seq)
        cam = _cam(seq, bt, pad_to=B if nreal < B else None)
        npu.log.clear()
        entry_out = _run(model, cfg, wrapper, builder.build(0, cam), cam, hidden_s, FULL)
        # The update (wait for the previous replay, each call's task update on the update stream) before the replay.
        assert npu.log == [("synchronize", "compute")] + _updated_call(0) + _updated_call(1) + [("replay",)]
        assert [lst[2][:nreal] for lst in vgraph.graph_params().captured_lists(B)] == [seq, seq]
        assert entry_out is wrapper.concrete_cudagraph_entries[DESC].output  # the graph's static output
    # The device graph reads the captured input buffers: another input tensor is refused by name.
    with pytest.raises(ValueError, match="not at the captured addresses"):
        _run(model, cfg, wrapper, builder.build(0, cam), cam, hidden_s.clone(), FULL)


# --- sparse MLA (DeepSeek-V3.2): vLLM's Indexer.forward and MLAAttention (the real layer) in the runnable

class SparseModel(torch.nn.Module):
    """One sparse attention layer as vLLM runs it: the indexer (projections, LayerNorm, RoPE, fp8 quant, then the
    adapter's indexer op), then vLLM's MLAAttention (cache update, W_UK absorption, the adapter's forward_mqa, W_UV)."""

    def __init__(self, lay):
        super().__init__()
        self.lay = lay

    def forward(self, x, qc, q, c, kpe, pos):
        lay = self.lay
        lay.indexer.forward(x, qc, pos, lay.rotary)
        return lay.mla(q, c, kpe, output_shape=(q.shape[0], lay.N * lay.V))


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
Q_SPEC = 2  # speculative buckets: one draft token, vLLM's uniform decode query length 1 + num_speculative_tokens
# vLLM's descriptor of the speculative bucket (cudagraph_dispatcher: num_reqs = num_tokens // uniform query length).
DESC_SPEC = BatchDescriptor(num_tokens=B * Q_SPEC, num_reqs=B, uniform=True)


@DTYPES
def test_sparse_mla_bucket_through_vllms_wrapper(installed, monkeypatch, dtype):
    _sparse_wrapper_bucket(monkeypatch, dtype, 1, seed=31)


@DTYPES
def test_sparse_mla_speculative_bucket_through_vllms_wrapper(installed, monkeypatch, dtype):
    """num_speculative_tokens = 1: the builders declare UNIFORM_BATCH, the bucket is vLLM's uniform batch of B
    requests of two tokens (DESC_SPEC); full steps, then steps vLLM pads with empty requests."""
    _sparse_wrapper_bucket(monkeypatch, dtype, Q_SPEC, seed=33)


def _sparse_wrapper_bucket(monkeypatch, dtype, q, seed):
    """The sparse layer (vLLM's Indexer.forward and MLAAttention) through the wrapper, B requests of q tokens per
    bucket: capture from vLLM's capture batch, then per step the replay equal to the runnable run through the
    wrapper with mode NONE on copies of both caches (output and top-k bit for bit: the replay runs the same kernels
    on the same inputs), the padding writes nothing, and every real token equals float64 latent attention over the
    positions the replay selected (each inside the token's causal prefix; the tolerance of _reference.assert_close
    for the model dtype in bf16, as test_vllm_sparse)."""
    import test_vllm_sparse as ts
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import deepseek_v2
    from vllm.v1.attention.backend import AttentionCGSupport
    from ascend_attn_rt import _C as aar
    from test_vllm_graph import _spec_cam

    assert q in (1, Q_SPEC)
    T, desc, cam_of = B * q, (DESC if q == 1 else DESC_SPEC), (_cam if q == 1 else _spec_cam)
    monkeypatch.setattr(deepseek_v2, "per_token_group_quant_fp8", ts._quant_fp8_reference)
    with vllm_registration():
        cfg, nb = _sparse_graph_config("deepseek_v32", q - 1, dtype)
        cfg.compilation_config.static_forward_context = {}  # this test's layers register here
        gen = torch.Generator().manual_seed(seed)
        vgraph.set_graph_provider("recording")
        with set_current_vllm_config(cfg):
            lay = ts.Layer(cfg, dtype, nb, gen)
            mspec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=lay.L + lay.R, dtype=dtype)
            assert type(lay.builder).get_cudagraph_support(cfg, mspec) is (
                AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if q == 1 else AttentionCGSupport.UNIFORM_BATCH)
            log = _logged(monkeypatch)
            wrapper = _wrapper_cls()(SparseModel(lay), cfg, FULL)
            N, L, R = lay.N, lay.L, lay.R
            bt = random_block_table([64] * B, BS, nb, gen, width=WIDTH)
            # vLLM's static input buffers: activations in the model dtype, positions int64.
            static = [torch.zeros(T, lay.HID, dtype=dtype), torch.zeros(T, lay.Q, dtype=dtype),
                      torch.zeros(T, N, lay.P + R, dtype=dtype), torch.zeros(T, L, dtype=dtype),
                      torch.zeros(T, 1, R, dtype=dtype), torch.zeros(T, dtype=torch.int64)]

            def run(md, imd, cam, inputs, mode):
                with set_forward_context({lay.k_cache.prefix: imd, lay.attn_name: md}, cfg, cudagraph_runtime_mode=mode,
                                         batch_descriptor=desc, slot_mapping={lay.attn_name: cam.slot_mapping}):
                    return wrapper(*inputs)

            cam = cam_of([9] * B, bt)
            run(lay.builder.build_for_cudagraph_capture(cam), lay.ibuilder.build_for_cudagraph_capture(cam), cam,
                static, FULL)
            kinds = ["sparse indexer run", "sparse MLA do_kv_cache_update", "sparse MLA forward_mqa"]
            assert log == [("capture", k) for k in kinds]
            assert list(wrapper.concrete_cudagraph_entries) == [desc]
            for seq in STEPS:
                nreal = len(seq)
                nq = nreal * q
                cam = cam_of(seq, bt, pad_to=B if nreal < B else None)
                md, imd = lay.builder.build(0, cam), lay.ibuilder.build(0, cam)
                pos = torch.tensor([p for s in seq for p in range(s - q, s)] + [0] * (T - nq))
                rnd = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
                inputs = [rnd(T, lay.HID), rnd(T, lay.Q), rnd(T, N, lay.P + R), rnd(T, L), rnd(T, 1, R), pos]
                # Eager through the wrapper (NONE) on copies of both caches.
                kv, idx = lay.mla.kv_cache, lay.k_cache.kv_cache
                lay.mla.kv_cache, lay.k_cache.kv_cache = kv.clone(), idx.clone()
                log.clear()
                expected = run(md, imd, cam, inputs, NONE).clone()
                topk_eager = lay.buf[:nq].clone()
                eager_kv, eager_idx = lay.mla.kv_cache, lay.k_cache.kv_cache
                lay.mla.kv_cache, lay.k_cache.kv_cache = kv, idx
                assert log == []
                lay.buf.fill_(-7)
                for s_, x in zip(static, inputs):
                    s_.copy_(x)
                out = run(md, imd, cam, static, FULL)
                assert log == [("update", T)] + [("replay", k) for k in kinds]
                assert out.dtype == dtype
                assert torch.equal(lay.buf[:nq], topk_eager)
                assert torch.equal(kv, eager_kv) and torch.equal(idx, eager_idx)  # padding wrote nothing
                assert torch.equal(out[:nq], expected[:nq])
                # float64 over the positions the replay selected (each inside the token's prefix), the latent
                # rows read from the cache (the step's own rows: its inputs, as written by the replay).
                nope, rope = aar.mla.LatentAttention.split_kv_cache(kv, L)
                for r, s in enumerate(seq):
                    for j in range(q):
                        t = r * q + j
                        sel = [p for p in lay.buf[t].tolist() if p >= 0]
                        assert sel and max(sel) <= s - q + j
                        p = torch.tensor(sel)
                        blk, off = bt[r, p // BS].long(), p % BS
                        c_rows, k_rows = nope[blk, off].reshape(len(p), L), rope[blk, off].reshape(len(p), R)
                        last = int(bt[r, (s - q + j) // BS]), (s - q + j) % BS
                        assert torch.equal(nope[last].reshape(L), inputs[3][t])
                        want = latent_attention_reference(inputs[2][t: t + 1], c_rows, k_rows, lay.kv_b_proj.weight,
                                                          1, lay.impl.scale, N, lay.P, lay.V)
                        if dtype == torch.float32:
                            torch.testing.assert_close(out[t].view(1, N, lay.V).double(), want, atol=1e-5, rtol=1e-5)
                        else:
                            assert_close(out[t].view(1, N, lay.V), want, dtype, what=f"request {r} token {j}")


# --- DeepSeek-V4: vLLM's DeepseekV4Attention layers (the adapter's subclass) in the runnable

class V4Model(torch.nn.Module):
    """The three layers of test_vllm_dsa.CompressedModel (SWA-only, C128, C4; nine KV-cache groups through vLLM's own
    grouping and allocation) as one runnable: each layer's forward(positions, hidden_states), vLLM's layer code,
    over the step's hidden states (the float64 reference gives every layer the request's own inputs)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, positions, hidden):
        return torch.stack([layer(positions, hidden) for layer in self.m.layers])


@DTYPES
def test_deepseek_v4_bucket_through_vllms_wrapper(vllm_dist, registered, installed, monkeypatch, dtype):
    """Each V4 layer's runtime call (dsa.Impl.forward: the whole attention block) is one segment: captured from
    vLLM's capture batch, then full steps and vLLM-padded steps replay equal to the runnable run through the wrapper
    with mode NONE on a copy of the caches (the one KV-cache buffer every group's caches are views of), the float64
    reference of test_vllm_dsa (C4 with the runtime's top-k) and eager's top-k; the update comes before the three
    segment replays of every step. Then the refusals: a prefill step at the update, a weight changed while the bucket
    is held."""
    from test_vllm_dsa import _common_metadata as v4_cam
    from test_vllm_dsa_graph import _buffer, _metadata, _padded_cam

    m, wrapper, run, hidden_s, S, log = _v4_wrapper_bucket(monkeypatch, dtype, 1, seed=29)
    buf = _buffer(m)
    # A step with a prefill is refused by the update, before any segment replays (caches untouched).
    cams = [v4_cam([1, 3], [S[0] + 1, S[1] + 3], t[[0, 1]], g.kv_cache_spec.block_size)[0]
            for g, t in zip(m.groups, m.tables)]
    saved = buf.clone()
    log.clear()
    with pytest.raises(ValueError, match="a step with 1 prefill requests cannot update a decode graph bucket"):
        run(_metadata(m, cams), hidden_s, FULL)
    assert log == [("update", B)] and torch.equal(buf, saved)
    # A weight changed while the wrapper holds the bucket: the captured segment keeps the old layer, refused by
    # name; clear_graphs() releases the segments and the layer is remade.
    with torch.no_grad():
        m.layers[1].wo_b.weight.mul_(2)
    md = _metadata(m, [_padded_cam([S[0] + 1], t[[0]], g.kv_cache_spec.block_size) for g, t in zip(m.groups, m.tables)])
    with pytest.raises(NotImplementedError, match="model.layers.1.attn: the layer's weights or KV-cache group changed"):
        run(md, hidden_s, FULL)
    wrapper.clear_graphs()
    assert run(md, hidden_s.clone(), NONE).shape == (3, B, hidden_s.shape[1])


@DTYPES
def test_deepseek_v4_speculative_bucket_through_vllms_wrapper(vllm_dist, registered, installed, monkeypatch, dtype):
    """num_speculative_tokens = 1: every group builder declares UNIFORM_BATCH, the bucket is vLLM's uniform batch of
    B requests of two tokens (DESC_SPEC, captured from vLLM's capture batch of B two-token requests); full steps and
    vLLM-padded steps (empty requests) replay as in the one-token bucket, every real token against float64 (the C4
    layer with the runtime's top-k)."""
    _v4_wrapper_bucket(monkeypatch, dtype, Q_SPEC, seed=37)


def _v4_wrapper_bucket(monkeypatch, dtype, q, seed):
    """The three DeepSeek-V4 layers as one runnable through the wrapper, a bucket of B requests of q tokens: after
    a prefill context, the capture, then full and padded steps, each checked against eager (mode NONE through the
    wrapper, caches copied: bit for bit, top-k and caches included; the replay runs the same calls on the same
    inputs) and against float64 (test_vllm_dsa.assert_layer_close: the fp32 tolerance of _reference.assert_close,
    bf16 that of the runtime's own DSA layer test). Returns the model, the wrapper, the step runner, the static input
    buffer, the requests' lengths and the call log."""
    import ascend_attn_rt.vllm as aar_vllm
    from vllm.v1.attention.backend import AttentionCGSupport
    from test_vllm_dsa import CompressedModel, _common_metadata as v4_cam, assert_layer_close
    from test_vllm_dsa_graph import _buffer, _graph_config, _metadata, _padded_cam

    aar_vllm.register(family="deepseek_v4")
    T, desc = B * q, (DESC if q == 1 else DESC_SPEC)
    # Four requests' tables from the one block pool (about 320 blocks each, the C4 states' 4-token blocks most).
    m = CompressedModel(_graph_config(dtype, q - 1), monkeypatch, B, torch.Generator().manual_seed(seed),
                        num_blocks=1300)
    for g, b in zip(m.groups, m.builders):
        assert type(b).get_cudagraph_support(m.cfg, g.kv_cache_spec) is (
            AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if q == 1 else AttentionCGSupport.UNIFORM_BATCH)
    # The context, one eager prefill step: near a C128 boundary (127: the first replay completes a C128 row), C4 ones.
    S = [127, 61, 254, 30]
    m.step(list(range(B)), S, S)
    vgraph.set_graph_provider("recording")
    wrapper = _wrapper_cls()(V4Model(m), m.cfg, FULL)
    log = _logged(monkeypatch)
    hidden_s = torch.zeros(T, m.cfg.model_config.hf_config.hidden_size, dtype=dtype)  # vLLM's static input buffer
    pos = torch.zeros(T, dtype=torch.int64)  # not read: the runtime derives positions from the step

    def run(md, hidden, mode):
        with set_forward_context(md, m.cfg, cudagraph_runtime_mode=mode, batch_descriptor=desc):
            return wrapper(pos, hidden)

    # vLLM's capture batch (B real requests of q tokens, KV length q, the tables' rows as they are).
    cams = [v4_cam([q] * B, [q] * B, torch.zeros(B, t.shape[1], dtype=torch.int32), g.kv_cache_spec.block_size)[0]
            for g, t in zip(m.groups, m.tables)]
    md = {}
    for g, b, cam in zip(m.groups, m.builders, cams):
        x = b.build_for_cudagraph_capture(cam)
        md.update({name: x for name in g.layer_names})
    buf = _buffer(m)
    before = buf.clone()
    run(md, hidden_s, FULL)
    assert log == [("capture", "DeepSeek-V4 layer")] * 3 and torch.equal(buf, before)  # recorded, not run
    assert vgraph.graph_params().buckets() == []  # the bucket is the wrapper's segments
    assert list(wrapper.concrete_cudagraph_entries) == [desc]

    for reqs in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 0, 3], [1]):  # full steps, then vLLM-padded ones
        n, nq = len(reqs), len(reqs) * q
        seq = [S[r] + q for r in reqs]
        md = _metadata(m, [_padded_cam(seq, t[reqs], g.kv_cache_spec.block_size, q)
                           for g, t in zip(m.groups, m.tables)])
        h = torch.zeros(T, hidden_s.shape[1], dtype=dtype)
        h[:nq] = torch.cat([m.x[r][s - q: s] for r, s in zip(reqs, seq)])
        # Eager: the same runnable through the wrapper with mode NONE, on a copy of the caches.
        saved = buf.clone()
        log.clear()
        expected = run(md, h.clone(), NONE)
        assert log == []
        eager_topk, eager_buf = m.layers[2]._impl.last_topk[:nq].clone(), buf.clone()
        buf.copy_(saved)
        with torch.inference_mode():  # the runtime's buffer (an inference tensor): the replay must write it again
            m.layers[2]._impl.last_topk.fill_(-7)
        hidden_s.copy_(h)
        out = run(md, hidden_s, FULL)
        assert log == [("update", T)] + [("replay", "DeepSeek-V4 layer")] * 3  # the update before every replay
        assert out.dtype == dtype
        topk = m.layers[2]._impl.last_topk[:nq]
        assert torch.equal(topk, eager_topk)
        assert torch.equal(out[:, :nq], expected[:, :nq])
        assert torch.equal(buf, eager_buf)  # the caches as the eager step left them
        for i in range(3):
            for j, (r, s) in enumerate(zip(reqs, seq)):
                tk = topk[j * q: (j + 1) * q, 0].to(torch.int64) if i == 2 else None
                assert_layer_close(out[i, j * q: (j + 1) * q], m.reference(i, r, s, q, tk), dtype,
                                   what=f"layer {i} request {r} vs float64")
        for r, s in zip(reqs, seq):
            S[r] = s
    return m, wrapper, run, hidden_s, S, log
