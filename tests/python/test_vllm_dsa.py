"""The vLLM DeepSeek-V4 adapter (ascend_attn_rt.vllm.dsa, docs/design/vllm_dsa.md) on vLLM 0.27.1's own config and
layer code: a real VllmConfig from the local DeepseekV4ForCausalLM config in tests/python/data/vllm_tiny_v4 (SWA-only
layers), vLLM's attention-class selection (_select_dsv4_attn_cls, wrapped by register(family="deepseek_v4")), the
DeepseekV4Attention subclass made by vLLM's constructor (its parameters, its DeepseekV4SWACache layer), vLLM's
CommonAttentionMetadata into the adapter's builder, and the layer's forward(positions, hidden_states) in a forward
context.

Per batch (decode, prefill, chunked prefill, mixed, speculative; fp32 and bf16) the context is written by an earlier step through
the same layer, then the step's output is checked against the float64 reference of _dsa_reference (dsa_layer:
prolog, window attention with sinks, inverse RoPE, grouped o_proj), with the reference's own RoPE tables at vLLM's
rope_theta (independent of how the adapter reads vLLM's cos_sin_cache).

vLLM's DeepseekV4Attention constructor needs vLLM's distributed state (its parallel linear layers) and makes
torch.cuda.Event objects (not constructible on a CPU-only torch): the test starts a one-rank gloo group on
127.0.0.1 and stands in a no-op event class while the layer is made."""

import contextlib
import copy
import itertools
import os
import socket
import sys
import types

import pytest
import torch

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import (CacheConfig, CUDAGraphMode, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig, set_current_vllm_config)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402
from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES, AttentionBackendEnum  # noqa: E402

import ascend_attn_rt.vllm as aar_vllm  # noqa: E402
from ascend_attn_rt.vllm import AscendAttnRtDsaMetadata, AscendAttnRtDsaSwaBackend  # noqa: E402
from ascend_attn_rt.vllm.dsa import attention_cls  # noqa: E402
import _dsa_reference as ref  # noqa: E402
from _reference import assert_close  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "vllm_tiny_v4")
MAX_LEN = 512
BS = 64  # vLLM's DeepseekV4SWACache block size
NB = 40
F64 = torch.float64
_names = itertools.count()


def _vllm_config(dtype):
    # What `vllm serve DIR --enforce-eager --max-model-len 512 --max-num-seqs 8 --attention-backend CUSTOM` builds
    # (no tokenizer, CPU device).
    mc = ModelConfig(model=DATA, tokenizer=DATA, skip_tokenizer_init=True, dtype=dtype, max_model_len=MAX_LEN,
                     enforce_eager=True)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    cfg = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                     device_config=DeviceConfig(device="cpu"))
    cfg.cache_config.num_gpu_blocks = NB
    cfg.attention_config.backend = AttentionBackendEnum.CUSTOM
    return cfg


_CONFIGS = {}


def _config(dtype):
    if dtype not in _CONFIGS:
        _CONFIGS[dtype] = _vllm_config(dtype)
    return copy.copy(_CONFIGS[dtype])


def _v4_module():
    import vllm.models.deepseek_v4 as v4

    return sys.modules[v4.DeepseekV4ForCausalLM.__module__]


@pytest.fixture(scope="module")
def vllm_dist():
    """vLLM's distributed state for one rank (gloo on 127.0.0.1), made once per process."""
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        # vLLM's group set-up silences C-level stdout through sys.stdout.fileno(), which pytest's
        # --capture=sys (the sanitizer run) replaces by a stream without one: hand it the real stdout.
        with set_current_vllm_config(_config(torch.float32)), contextlib.redirect_stdout(sys.__stdout__):
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method=f"tcp://127.0.0.1:{port}")
            ps.initialize_model_parallel(1, 1)
    yield


@pytest.fixture
def registered():
    """register(family="deepseek_v4") changes vLLM's CUSTOM slot and wraps the DSV4 selection: both restored."""
    saved = dict(_ATTN_OVERRIDES)
    mod = _v4_module()
    select = mod._select_dsv4_attn_cls
    try:
        yield
    finally:
        _ATTN_OVERRIDES.clear()
        _ATTN_OVERRIDES.update(saved)
        mod._select_dsv4_attn_cls = select


class _Event:
    """torch.cuda.Event stand-in while vLLM's layer is made (a CPU-only torch cannot construct one)."""

    def __init__(self, *args, **kwargs):
        pass


def _make_layer(cfg, monkeypatch, prefix=None):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    from vllm.utils.torch_utils import set_default_torch_dtype

    prefix = prefix or f"model.layers.0.attn{next(_names)}"
    # vLLM's set_default_torch_dtype restores the old default only when its body returns: a refused layer
    # (the refusal tests) would leave the model dtype as torch's default for every later test.
    saved = torch.get_default_dtype()
    try:
        with set_current_vllm_config(cfg), set_default_torch_dtype(cfg.model_config.dtype):
            cls = _v4_module()._select_dsv4_attn_cls(cfg)
            return cls(cfg, prefix=prefix, topk_indices_buffer=torch.empty(MAX_LEN, 8, dtype=torch.int32))
    finally:
        torch.set_default_dtype(saved)


def _dims(cfg) -> ref.DsaDims:
    hf = cfg.model_config.hf_config
    return ref.DsaDims(hidden=hf.hidden_size, N=hf.num_attention_heads, D=hf.head_dim, R=hf.qk_rope_head_dim,
                       q_lora=hf.q_lora_rank, W=hf.sliding_window, ratio=1, G=hf.o_groups, o_lora=hf.o_lora_rank,
                       eps=hf.rms_norm_eps)


def _load(layer, d: ref.DsaDims, w: dict) -> None:
    """The reference's weights into vLLM's parameters (what vLLM's loader fills: wq_a and wkv fused, wo_a as one
    (G o_lora, N D / G) linear)."""
    with torch.no_grad():
        layer.fused_wqa_wkv.weight.copy_(torch.cat([w["wq_a"], w["wkv"]]))
        layer.q_norm.weight.copy_(w["q_norm"])
        layer.wq_b.weight.copy_(w["wq_b"])
        layer.kv_norm.weight.copy_(w["kv_norm"])
        layer.attn_sink.copy_(w["attn_sink"])
        layer.wo_a.weight.copy_(w["wo_a"].permute(0, 2, 1).reshape(d.G * d.o_lora, d.N * d.D // d.G))
        layer.wo_b.weight.copy_(w["wo_b"])


def _common_metadata(q_lens, seq_lens, bt):
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    pos = [torch.arange(s - q, s) for s, q in zip(seq_lens, q_lens)]
    slots = torch.cat([bt[i, p // BS].long() * BS + p % BS for i, p in enumerate(pos)])
    cam = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=len(q_lens),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(q_lens), max_seq_len=int(sl.max()),
        block_table_tensor=bt.contiguous(), slot_mapping=slots, _seq_lens_cpu=sl)
    return cam, torch.cat(pos)


class Run:
    """One SWA layer as vLLM makes it, its SWA cache and the adapter's builder, and requests with fixed tokens."""

    def __init__(self, cfg, monkeypatch, nreq, gen):
        self.cfg, self.dtype = cfg, cfg.model_config.dtype
        self.d = _dims(cfg)
        self.layer = _make_layer(cfg, monkeypatch)
        assert type(self.layer) is attention_cls()
        self.w = ref.make_dsa_weights(self.d, self.dtype, gen)
        _load(self.layer, self.d, self.w)
        swa = self.layer.swa_cache_layer
        spec = swa.get_kv_cache_spec(cfg)
        assert swa.get_attn_backend() is AscendAttnRtDsaSwaBackend
        assert (spec.block_size, spec.head_size, spec.dtype) == (BS, self.d.D, self.dtype)
        shape = AscendAttnRtDsaSwaBackend.get_kv_cache_shape(NB, spec.block_size, 1, spec.head_size)
        swa.kv_cache = torch.randn(*shape, generator=gen, dtype=F64).to(self.dtype)  # garbage where unwritten
        self.builder = AscendAttnRtDsaSwaBackend.get_builder_cls()(spec, [swa.prefix], cfg, torch.device("cpu"))
        # Distinct blocks per request, shuffled, block 0 unused.
        ids = (torch.randperm(NB - 1, generator=gen)[: nreq * (MAX_LEN // BS)] + 1).to(torch.int32)
        self.bt = ids.view(nreq, MAX_LEN // BS)
        self.x = [torch.randn(MAX_LEN, self.d.hidden, generator=gen, dtype=F64).to(self.dtype) for _ in range(nreq)]
        hf = cfg.model_config.hf_config
        self.cos, self.sin = ref.rope_tables(MAX_LEN, self.d.R, base=hf.rope_theta)

    def step(self, reqs, seq_lens, q_lens):
        cam, pos = _common_metadata(q_lens, seq_lens, self.bt[reqs])
        md = self.builder.build(0, cam)
        assert isinstance(md, AscendAttnRtDsaMetadata)
        hidden = torch.cat([self.x[r][s - q: s] for r, s, q in zip(reqs, seq_lens, q_lens)])
        with set_forward_context({self.layer.swa_cache_layer.prefix: md}, self.cfg):
            return self.layer(pos, hidden), md

    def reference(self, r, s, q):
        return ref.dsa_layer(self.d, self.w, self.x[r][:s], q, self.cos, self.sin)


BATCHES = [
    pytest.param([17, 40, 5], [1, 1, 1], 0, id="decode"),
    pytest.param([9, 30], [9, 30], 0, id="prefill"),
    pytest.param([40, 70], [8, 20], 0, id="chunked_prefill"),
    pytest.param([33, 12, 150], [1, 1, 14], 0, id="mixed"),
    # 2 speculative tokens: extends of up to 3 tokens are decodes (the runtime's threshold 1 + k).
    pytest.param([20, 31, 9], [3, 2, 1], 2, id="spec_decode"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_lens,q_lens,spec", BATCHES)
def test_dsa_layer_in_vllm_forward(vllm_dist, registered, monkeypatch, dtype, seq_lens, q_lens, spec):
    aar_vllm.register(family="deepseek_v4")
    cfg = _config(dtype)
    if spec:  # what the builder reads of vLLM's SpeculativeConfig (a real one needs a draft model)
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    run = Run(cfg, monkeypatch, len(seq_lens), torch.Generator().manual_seed(29))
    assert run.builder.reorder_batch_threshold == 1 + spec
    reqs = list(range(len(seq_lens)))
    ctx = [(r, s - q) for r, s, q in zip(reqs, seq_lens, q_lens) if s > q]
    if ctx:  # the context, written by an earlier (prefill) step through the same layer
        run.step([r for r, _ in ctx], [c for _, c in ctx], [c for _, c in ctx])
    out, md = run.step(reqs, seq_lens, q_lens)
    assert out.shape == (sum(q_lens), run.d.hidden) and out.dtype == dtype
    assert md.num_decodes == sum(1 for q in q_lens if q <= 1 + spec)
    t = 0
    for r, s, q in zip(reqs, seq_lens, q_lens):
        assert_close(out[t: t + q], run.reference(r, s, q), dtype, what=f"output of request {r}")
        t += q
    # vLLM's profiling run (no metadata dict): zeros, nothing read.
    with set_forward_context(None, run.cfg):
        assert bool((run.layer(torch.arange(3), run.x[0][:3]) == 0).all())


def test_selection_resolves_the_dsa_attention(vllm_dist, registered, monkeypatch):
    """DeepseekV4ForCausalLM through vLLM's model registry, then its module's attention-class selection:
    --attention-backend CUSTOM after register(family="deepseek_v4") gives the runtime's layer, whose SWA cache layer
    resolves to the runtime's backend and whose CUSTOM slot is that backend; other backends keep vLLM's choice."""
    from vllm.model_executor.models.registry import ModelRegistry

    cfg = _config(torch.bfloat16)
    mc = cfg.model_config
    assert mc.architectures == ["DeepseekV4ForCausalLM"]
    model_cls, arch = ModelRegistry.resolve_model_cls(mc.architectures, mc)
    assert arch == "DeepseekV4ForCausalLM" and model_cls.__module__ == _v4_module().__name__
    original = _v4_module()._select_dsv4_attn_cls
    aar_vllm.register(family="deepseek_v4")
    aar_vllm.register(family="deepseek_v4")  # idempotent: wrapped once
    select = sys.modules[model_cls.__module__]._select_dsv4_attn_cls
    assert select._original is original
    assert select(cfg) is attention_cls() and AttentionBackendEnum.CUSTOM.get_class() is AscendAttnRtDsaSwaBackend
    other = copy.copy(cfg)
    other.attention_config = copy.copy(cfg.attention_config)
    other.attention_config.backend = AttentionBackendEnum.FLASHMLA_SPARSE
    assert select(other) is original(other) and select(other) is not attention_cls()
    layer = _make_layer(cfg, monkeypatch)
    assert layer.swa_cache_layer.get_attn_backend() is AscendAttnRtDsaSwaBackend
    assert layer.get_kv_cache_spec(cfg) is None  # SWA-only: the SWA cache layer is the layer's only cache


def test_refusals(vllm_dist, registered, monkeypatch):
    aar_vllm.register(family="deepseek_v4")
    cfg = _config(torch.bfloat16)

    def with_ratios(ratios):
        c = copy.copy(cfg)
        c.model_config = copy.copy(cfg.model_config)
        c.model_config.hf_config = copy.copy(cfg.model_config.hf_config)
        c.model_config.hf_config.compress_ratios = ratios
        return c

    # Compressed layers, by name and reason, at the layer and at the builder.
    with pytest.raises(NotImplementedError, match="compress_ratio=4.*C4 layers.*indexer keys"):
        _make_layer(with_ratios([4, 0]), monkeypatch, prefix="model.layers.0.attn")
    with pytest.raises(NotImplementedError, match="compress_ratio=128.*C128 layers.*4096"):
        _make_layer(with_ratios([0, 128]), monkeypatch, prefix="model.layers.1.attn")
    run_spec = _make_layer(cfg, monkeypatch).swa_cache_layer.get_kv_cache_spec(cfg)
    builder_cls = AscendAttnRtDsaSwaBackend.get_builder_cls()
    with pytest.raises(NotImplementedError, match="C128 layers"):
        builder_cls(run_spec, ["a"], with_ratios([0, 128]), torch.device("cpu"))
    # fp8 caches, graphs, torch.compile, context parallelism.
    fp8 = copy.copy(cfg)
    fp8.cache_config = copy.copy(cfg.cache_config)
    fp8.cache_config.cache_dtype = "fp8"
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):
        _make_layer(fp8, monkeypatch)
    for attr, value, match in (("mode", 3, "compilation_config.mode=3"),
                               ("cudagraph_mode", CUDAGraphMode.FULL_AND_PIECEWISE,
                                "cudagraph_mode=FULL_AND_PIECEWISE")):
        g = copy.copy(cfg)
        g.compilation_config = copy.copy(cfg.compilation_config)
        setattr(g.compilation_config, attr, value)
        with pytest.raises(NotImplementedError, match=match):
            builder_cls(run_spec, ["a"], g, torch.device("cpu"))
    cp = copy.copy(cfg)
    cp.parallel_config = ParallelConfig(decode_context_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(NotImplementedError, match="decode_context_parallel_size=2"):
        builder_cls(run_spec, ["a"], cp, torch.device("cpu"))
    # The SWA cache's shape: vLLM's 64-token blocks, one head, plain rows.
    with pytest.raises(ValueError, match="block_size=128"):
        AscendAttnRtDsaSwaBackend.get_kv_cache_shape(8, 128, 1, 64)
    with pytest.raises(ValueError, match="cache_dtype_str='fp8_ds_mla'"):
        AscendAttnRtDsaSwaBackend.get_kv_cache_shape(8, BS, 1, 64, "fp8_ds_mla")
    # Per call: llama_4_scaling; metadata of another backend under the SWA cache's name.
    layer = _make_layer(cfg, monkeypatch)
    x = torch.zeros(2, cfg.model_config.hf_config.hidden_size, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="llama_4_scaling"):
        layer(torch.arange(2), x, torch.ones(2))
    with set_forward_context({layer.swa_cache_layer.prefix: object()}, cfg), \
            pytest.raises(ValueError, match="AscendAttnRtDsaSwaBackend"):
        layer(torch.arange(2), x)


def test_weights_reloaded_in_place(vllm_dist, registered, monkeypatch):
    """vLLM's process_weights_after_loading remakes the runtime's layer: new weights copied into the same
    parameters (through .data, as vLLM's loaders write them) are what the next step computes with, the
    re-laid-out wo_a included; a weight written through an autograd-visible in-place op is seen without the hook."""
    aar_vllm.register(family="deepseek_v4")
    gen = torch.Generator().manual_seed(7)
    run = Run(_config(torch.float32), monkeypatch, 1, gen)
    run.layer.process_weights_after_loading(torch.float32)
    run.step([0], [20], [20])
    w2 = ref.make_dsa_weights(run.d, torch.float32, gen)
    run.w = w2
    with torch.no_grad():  # vLLM's loaders write param.data (no version bump)
        run.layer.fused_wqa_wkv.weight.data.copy_(torch.cat([w2["wq_a"], w2["wkv"]]))
        run.layer.q_norm.weight.data.copy_(w2["q_norm"])
        run.layer.wq_b.weight.data.copy_(w2["wq_b"])
        run.layer.kv_norm.weight.data.copy_(w2["kv_norm"])
        run.layer.attn_sink.data.copy_(w2["attn_sink"])
        run.layer.wo_a.weight.data.copy_(
            w2["wo_a"].permute(0, 2, 1).reshape(run.d.G * run.d.o_lora, run.d.N * run.d.D // run.d.G))
        run.layer.wo_b.weight.data.copy_(w2["wo_b"])
    run.layer.process_weights_after_loading(torch.float32)
    # The whole context again under the new weights (the cached rows of the old ones are rewritten).
    out, _ = run.step([0], [21], [21])
    assert_close(out, run.reference(0, 21, 21), torch.float32, what="output after the reload")
    # An in-place write that bumps the version counter is seen at the next forward without the hook.
    with torch.no_grad():
        run.layer.wo_b.weight.mul_(2)
    run.w = dict(w2, wo_b=w2["wo_b"] * 2)
    out, _ = run.step([0], [22], [22])
    assert_close(out, run.reference(0, 22, 22), torch.float32, what="output after an in-place wo_b update")
