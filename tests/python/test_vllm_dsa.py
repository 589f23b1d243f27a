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

The compressed layers (C128, C4) run as a three-layer model (tests/python/data/vllm_tiny_v4_compressed) whose caches
go through vLLM's own KV-cache grouping and config (see CompressedModel), against the same reference and against the
runtime's own aar.dsa.Impl stepped on the same tokens.

vLLM's DeepseekV4Attention constructor needs vLLM's distributed state (its parallel linear layers) and makes
torch.cuda.Event objects (not constructible on a CPU-only torch): the test starts a one-rank gloo group on
127.0.0.1 and stands in a no-op event class while the layer is made."""

import contextlib
import copy
import dataclasses
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
from ascend_attn_rt.vllm import (AscendAttnRtDsaC128KvBackend, AscendAttnRtDsaC128StateBackend,  # noqa: E402
                                 AscendAttnRtDsaC4AttnStateBackend, AscendAttnRtDsaC4IndexerKBackend,
                                 AscendAttnRtDsaC4IndexerStateBackend, AscendAttnRtDsaC4KvBackend,
                                 AscendAttnRtDsaMetadata, AscendAttnRtDsaSwaBackend)
import ascend_attn_rt.vllm.dsa as aar_dsa  # noqa: E402
from ascend_attn_rt.vllm.dsa import attention_cls  # noqa: E402
import _dsa_reference as ref  # noqa: E402
from _dsa_harness import LayerRun  # noqa: E402
from _reference import assert_close  # noqa: E402
from _vllm_support import kv_cache_utils as _kv_cache_utils  # noqa: E402

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
    from vllm.platforms import current_platform

    monkeypatch.setattr(torch.cuda, "Event", _Event)
    if not current_platform.device_type:
        # vLLM's DeepseekCompressor allocates its ape on current_platform.device_type, empty on the
        # unspecified platform a CPU-only install resolves to.
        monkeypatch.setattr(current_platform, "device_type", "cpu")
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


def _dims(cfg, ratio=1) -> ref.DsaDims:
    hf = cfg.model_config.hf_config
    return ref.DsaDims(hidden=hf.hidden_size, N=hf.num_attention_heads, D=hf.head_dim, R=hf.qk_rope_head_dim,
                       q_lora=hf.q_lora_rank, W=hf.sliding_window, ratio=ratio, n_idx=hf.index_n_heads,
                       Di=hf.index_head_dim, K=hf.index_topk, G=hf.o_groups, o_lora=hf.o_lora_rank,
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


def _common_metadata(q_lens, seq_lens, bt, bs=BS):
    """vLLM's CommonAttentionMetadata of one KV-cache group (its block table and block size; the slot mapping
    as vLLM computes it for raw tokens, which the runtime's builders do not read: they make their own)."""
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    pos = [torch.arange(s - q, s) for s, q in zip(seq_lens, q_lens)]
    slots = torch.cat([bt[i, p // bs].long() * bs + p % bs for i, p in enumerate(pos)])
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

    # A ratio DeepSeek-V4 does not have, at the layer and at every builder.
    with pytest.raises(NotImplementedError, match="compress_ratio=16 is not a DeepSeek-V4 ratio"):
        _make_layer(with_ratios([0, 16]), monkeypatch, prefix="model.layers.1.attn")
    run_spec = _make_layer(cfg, monkeypatch).swa_cache_layer.get_kv_cache_spec(cfg)
    builder_cls = AscendAttnRtDsaSwaBackend.get_builder_cls()
    for backend in (AscendAttnRtDsaSwaBackend, AscendAttnRtDsaC128KvBackend, AscendAttnRtDsaC4IndexerKBackend):
        with pytest.raises(NotImplementedError, match="compress_ratio=16"):
            backend.get_builder_cls()(run_spec, ["a"], with_ratios([16, 128]), torch.device("cpu"))
    # A group whose spec does not have the runtime's block size for its kind (a spec vLLM changed).
    with pytest.raises(ValueError, match="block_size=64.*c128_kv group takes 8192-token blocks"):
        AscendAttnRtDsaC128KvBackend.get_builder_cls()(run_spec, ["a"], cfg, torch.device("cpu"))
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
    # The caches' shapes: the runtime's rows per page (or the group's block size), one head, plain rows.
    with pytest.raises(ValueError, match="block_size=128"):
        AscendAttnRtDsaSwaBackend.get_kv_cache_shape(8, 128, 1, 64)
    assert AscendAttnRtDsaC128KvBackend.get_kv_cache_shape(8, 64, 1, 128) == (8, 64, 128)
    assert AscendAttnRtDsaC128KvBackend.get_kv_cache_shape(8, 8192, 1, 128) == (8, 64, 128)
    assert AscendAttnRtDsaC128StateBackend.get_kv_cache_shape(8, 16, 1, 256) == (8, 16, 256)
    with pytest.raises(ValueError, match="block_size=2"):  # vLLM's own C128 geometry (256-token blocks)
        AscendAttnRtDsaC128KvBackend.get_kv_cache_shape(8, 2, 1, 128)
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


# ---------------------------------------------------------------------------------------------------------------
# Compressed layers (docs/design/vllm_dsa.md §3): a three-layer model (layer 0 SWA-only, layer 1 C128, layer 2
# C4) from tests/python/data/vllm_tiny_v4_compressed, its caches through vLLM's own allocator code (the layers'
# specs as vLLM's runner collects them, vLLM's grouping, its KV-cache config, its raw allocation and reshape), one
# builder per KV-cache group, every layer's forward in one forward context.

DATA_CMP = os.path.join(os.path.dirname(__file__), "data", "vllm_tiny_v4_compressed")
RATIOS = (1, 128, 4)
# Per request 3 x 8 SWA + 1 C128 + 32 C128-state + 2 C4 KV + 2 indexer-key + 2 x 128 C4-state blocks (full
# tables: the test does not free blocks that fall out of a window), three requests, and the null block.
NB_CMP = 1000


def _cmp_config(dtype, spec=0):
    """A fresh config per model (vLLM registers the layers in its compilation config by name)."""
    mc = ModelConfig(model=DATA_CMP, tokenizer=DATA_CMP, skip_tokenizer_init=True, dtype=dtype,
                     max_model_len=MAX_LEN, enforce_eager=True)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    cfg = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                     device_config=DeviceConfig(device="cpu"))
    cfg.attention_config.backend = AttentionBackendEnum.CUSTOM
    # vLLM turns its hybrid KV-cache manager off on platforms that do not declare it (the unspecified platform
    # here); CUDA and the Ascend platform keep it, and the adapter's compressed layers need it.
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = False
    if spec:  # what the builders read of vLLM's SpeculativeConfig (a real one needs a draft model)
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    return cfg


def _load_compressed(layer, w: dict) -> None:
    """The reference's compressor (and C4 indexer) weights as vLLM's loader lays them out (wkv and wgate fused,
    ape fp32)."""
    def compressor(c, pre):
        c.fused_wkv_wgate.weight.copy_(torch.cat([w[pre + "wkv"], w[pre + "wgate"]]))
        c.norm.weight.copy_(w[pre + "norm"])
        c.ape.copy_(w[pre + "ape"])

    with torch.no_grad():
        compressor(layer.compressor, "cmp_")
        if layer.indexer is not None:
            compressor(layer.indexer.compressor, "idx_cmp_")
            layer.indexer.wq_b.weight.copy_(w["idx_wq_b"])
            layer.indexer.weights_proj.weight.copy_(w["idx_weights_proj"])


def _vllm_kv_caches(kv_config, backends, cache_dtype):
    """The cache tensors vLLM's model runner makes from a KV-cache config (vllm/v1/worker/gpu/attn_utils.py:
    _allocate_kv_cache, _reshape_kv_cache, _reshape_attention_kv_cache; kernel block sizes as
    vllm/v1/worker/utils.py select_common_block_size picks them), restated because those modules import vLLM's
    structured-output packages, which this environment does not install: one zeroed int8 buffer per
    KVCacheTensor shared by its layers; per group the backend's shape for (num_blocks, the compressed group's rows
    per page or the kernel block size, heads, head size), laid out by its stride order, the padded page as the
    block stride."""
    from math import prod

    raw = {}
    for t in kv_config.kv_cache_tensors:
        assert t.block_stride == 0  # not vLLM's packed DeepSeek-V4 layout
        buf = torch.zeros(t.size, dtype=torch.int8)
        for name in t.shared_by:
            raw[name] = buf
    caches = {}
    for g, backend in zip(kv_config.kv_cache_groups, backends):
        spec = g.kv_cache_spec
        kernel = spec.block_size  # select_common_block_size's first case: the backend takes the group's size
        assert kernel in backend.get_supported_kernel_block_sizes()
        shape_bs = spec.storage_block_size if spec.storage_block_size != spec.block_size else kernel
        for name in g.layer_names:
            buf = raw[name]
            nb = buf.numel() // spec.page_size_bytes
            shape = backend.get_kv_cache_shape(nb, shape_bs, spec.num_kv_heads, spec.head_size,
                                               cache_dtype_str="auto")
            order = backend.get_kv_cache_stride_order()
            perm = tuple(shape[i] for i in order)
            inv = [order.index(i) for i in range(len(order))]
            if spec.page_size_padded is not None:
                strides = list(torch.empty(perm, device="meta").stride())
                strides[inv[0]] = spec.page_size_bytes // spec.dtype.itemsize
                view = torch.as_strided(buf.view(spec.dtype), perm, strides)
            else:
                assert prod(perm) * spec.dtype.itemsize == buf.numel()
                view = buf.view(spec.dtype).view(perm)
            caches[name] = view.permute(*inv)
    return caches, raw


class CompressedModel:
    """Layers 0 (SWA only), 1 (C128) and 2 (C4) as vLLM makes them, their caches as vLLM allocates them from the
    layers' specs, one builder per KV-cache group, per-group block tables drawn from the one block pool."""

    def __init__(self, cfg, monkeypatch, nreq, gen, num_blocks=NB_CMP):
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        kvu = _kv_cache_utils()
        self.cfg, self.dtype = cfg, cfg.model_config.dtype
        hf = cfg.model_config.hf_config
        self.layers = [_make_layer(cfg, monkeypatch, prefix=f"model.layers.{i}.attn") for i in range(3)]
        assert all(type(x) is attention_cls() for x in self.layers)
        assert tuple(x.compress_ratio for x in self.layers) == RATIOS
        self.d = [_dims(cfg, r) for r in RATIOS]
        self.w = [ref.make_dsa_weights(d, self.dtype, gen) for d in self.d]
        for layer, d, w in zip(self.layers, self.d, self.w):
            _load(layer, d, w)
            if d.ratio > 1:
                _load_compressed(layer, w)
        # What vLLM's runner does at start-up: every attention-layer module's spec, grouped, a KV-cache config,
        # raw buffers and the backends' views.
        mods = get_layers_from_vllm_config(cfg, AttentionLayerBase)
        specs = {n: s for n, m in mods.items() if (s := m.get_kv_cache_spec(cfg)) is not None}
        self.groups = kvu.get_kv_cache_groups(cfg, specs)
        page = self.groups[0].kv_cache_spec.page_size_bytes
        self.kv_config = kvu.get_kv_cache_config_from_groups(cfg, self.groups, num_blocks * page)
        nb = self.kv_config.num_blocks
        cfg.cache_config.num_gpu_blocks = nb
        self.backends = [mods[g.layer_names[0]].get_attn_backend() for g in self.groups]
        # vLLM's general hybrid grouping (equal pages): one group per cache of the pattern, the runtime's block
        # sizes, one page size, one KVCacheTensor shared by every group's layer.
        L = "model.layers."
        want = {f"{L}0.attn.swa_cache": (64, AscendAttnRtDsaSwaBackend),
                f"{L}1.attn.swa_cache": (64, AscendAttnRtDsaSwaBackend),
                f"{L}2.attn.swa_cache": (64, AscendAttnRtDsaSwaBackend),
                f"{L}1.attn": (8192, AscendAttnRtDsaC128KvBackend),
                f"{L}1.attn.compressor.state_cache": (16, AscendAttnRtDsaC128StateBackend),
                f"{L}2.attn": (256, AscendAttnRtDsaC4KvBackend),
                f"{L}2.attn.compressor.state_cache": (4, AscendAttnRtDsaC4AttnStateBackend),
                f"{L}2.attn.indexer.k_cache": (256, AscendAttnRtDsaC4IndexerKBackend),
                f"{L}2.attn.indexer.compressor.state_cache": (4, AscendAttnRtDsaC4IndexerStateBackend)}
        got = {}
        for g, b in zip(self.groups, self.backends):
            assert len(g.layer_names) == 1
            got[g.layer_names[0]] = (g.kv_cache_spec.block_size, b)
        assert got == want
        assert len({g.kv_cache_spec.page_size_bytes for g in self.groups}) == 1
        assert [sorted(t.shared_by) for t in self.kv_config.kv_cache_tensors] == [sorted(want)]
        caches, raw = _vllm_kv_caches(self.kv_config, self.backends, cfg.cache_config.cache_dtype)
        for name, cache in caches.items():
            mods[name].kv_cache = cache
        # Garbage wherever nothing was written: the one shared buffer filled with normal values of the model dtype
        # (finite as every view reads them: fp32 states over bf16 pairs have a bf16 as their high half).
        for buf in {id(b): b for b in raw.values()}.values():
            v = buf.view(self.dtype)
            v.copy_(torch.randn(v.shape, generator=gen, dtype=torch.float32).to(self.dtype))
        self.builders = [b.get_builder_cls()(g.kv_cache_spec, g.layer_names, cfg, torch.device("cpu"))
                         for g, b in zip(self.groups, self.backends)]
        # Per group and request a block table over distinct blocks of the one pool (block 0 is vLLM's null block).
        ids = (torch.randperm(nb - 1, generator=gen) + 1).to(torch.int32).tolist()
        self.tables = []
        for g in self.groups:
            width = -(-MAX_LEN // g.kv_cache_spec.block_size)
            self.tables.append(torch.tensor([[ids.pop() for _ in range(width)] for _ in range(nreq)],
                                            dtype=torch.int32))
        self.x = [torch.randn(MAX_LEN, hf.hidden_size, generator=gen, dtype=F64).to(self.dtype) for _ in range(nreq)]
        swa_rope = ref.rope_tables(MAX_LEN, hf.qk_rope_head_dim, base=hf.rope_theta)
        cmp_rope = ref.rope_tables(MAX_LEN, hf.qk_rope_head_dim, base=hf.compress_rope_theta)
        self.rope = [swa_rope if r == 1 else cmp_rope for r in RATIOS]

    def build(self, reqs, seq_lens, q_lens):
        md = {}
        for g, b, t in zip(self.groups, self.builders, self.tables):
            bs = g.kv_cache_spec.block_size
            cam, pos = _common_metadata(q_lens, seq_lens, t[reqs], bs)
            m = b.build(0, cam)
            for name in g.layer_names:
                md[name] = m
        return md, pos

    def step(self, reqs, seq_lens, q_lens):
        md, pos = self.build(reqs, seq_lens, q_lens)
        hidden = torch.cat([self.x[r][s - q: s] for r, s, q in zip(reqs, seq_lens, q_lens)])
        with set_forward_context(md, self.cfg):
            return [layer(pos, hidden) for layer in self.layers], md

    def reference(self, i, r, s, q, topk=None):
        return ref.dsa_layer(self.d[i], self.w[i], self.x[r][:s], q, *self.rope[i], topk=topk)


def assert_layer_close(got, want, dtype, what):
    """A DeepSeek-V4 layer's output against its float64 reference: fp32 at _reference.assert_close's tolerance;
    bf16 at the tolerance of the runtime's own DSA layer test (test_dsa.py tol, every ratio: head dim 128 here, the
    compressors' rows rounded to bf16 before they are attended), atol 3e-2 scaled by the reference's largest
    magnitude (at least 1), rtol 3e-2."""
    if dtype == torch.bfloat16:
        at = 3e-2 * max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got.double(), want, atol=at, rtol=3e-2, msg=lambda e: f"{what}: {e}")
    else:
        assert_close(got, want, dtype, what=what)


CMP_BATCHES = [
    # decode: the first two requests complete a C128 row in this step (S = 128, 256), all three a C4 row
    pytest.param([128, 256, 300], [1, 1, 1], 0, id="decode"),
    pytest.param([130, 300], [130, 300], 0, id="prefill"),
    pytest.param([200, 384], [100, 200], 0, id="chunked_prefill"),
    pytest.param([256, 140, 400], [1, 1, 150], 0, id="mixed"),
    pytest.param([129, 256, 20], [3, 2, 1], 2, id="spec_decode"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_lens,q_lens,spec", CMP_BATCHES)
def test_compressed_model_in_vllm_forward(vllm_dist, registered, monkeypatch, dtype, seq_lens, q_lens, spec):
    aar_vllm.register(family="deepseek_v4")
    m = CompressedModel(_cmp_config(dtype, spec), monkeypatch, len(seq_lens), torch.Generator().manual_seed(128))
    assert all(b.reorder_batch_threshold == 1 + spec for b in m.builders)
    reqs = list(range(len(seq_lens)))
    ctx = [(r, s - q) for r, s, q in zip(reqs, seq_lens, q_lens) if s > q]
    # The context, written by earlier prefill steps through the same layers (one step while it fits the
    # scheduler's token budget).
    ctx_steps = [ctx] if sum(c for _, c in ctx) <= MAX_LEN else [[x] for x in ctx]
    for st in ctx_steps:
        if st:
            m.step([r for r, _ in st], [c for _, c in st], [c for _, c in st])
    outs, md = m.step(reqs, seq_lens, q_lens)
    steps = {id(x.step) for x in md.values()}
    assert len(steps) == 1, "every group's metadata reads the one step build"
    topk = m.layers[2]._impl.last_topk  # the C4 layer's selection (int8 indexer) for the reference's attention
    # The runtime's own compressed layers (aar.dsa.Impl with its own builders and caches from its cache specs)
    # stepped on the same tokens with the adapter's RoPE tables (vLLM's, at compress_rope_theta): the same numbers.
    for i in (1, 2):
        own = LayerRun(m.d[i], "a2", dtype, len(seq_lens), w=m.w[i], x=m.x, cbs=64, max_blocks=128, k=spec,
                       rope=aar_dsa._rope_tables(m.cfg, 128))
        for st in ctx_steps:
            if st:
                own.step([r for r, _ in st], [c for _, c in st])
        own_out = own.step(reqs, q_lens)[0]
        assert torch.equal(outs[i], own_out), (i, float((outs[i].double() - own_out.double()).abs().max()))
        if i == 2:
            assert torch.equal(topk[: sum(q_lens)], own.impl.last_topk[: sum(q_lens)])
    for i, out in enumerate(outs):
        assert out.shape == (sum(q_lens), m.d[i].hidden) and out.dtype == dtype
        t = 0
        for r, s, q in zip(reqs, seq_lens, q_lens):
            tk = topk[t: t + q, 0].to(torch.int64) if RATIOS[i] == 4 else None
            want = m.reference(i, r, s, q, tk)
            # (bf16: the runtime's own layer, whose outputs the compressed ones equal bit for bit above)
            assert_layer_close(out[t: t + q], want, dtype, what=f"layer {i} output of request {r}")
            t += q


def test_compressed_layer_specs_and_refusals(vllm_dist, registered, monkeypatch):
    """C128 and C4 layers made through vLLM's selection report the runtime's caches (one page size) with the
    runtime's backends; without vLLM's hybrid KV-cache manager their specs and builders refuse, and C4 layers
    with an MXFP4 indexer cache; metadata of another kind under a cache's name is refused by name."""
    aar_vllm.register(family="deepseek_v4")
    cfg = _cmp_config(torch.bfloat16)
    layer = _make_layer(cfg, monkeypatch, prefix="model.layers.1.attn")
    c4 = _make_layer(cfg, monkeypatch, prefix="model.layers.2.attn")
    assert type(layer) is _v4_module()._select_dsv4_attn_cls(cfg) is attention_cls()
    hf = cfg.model_config.hf_config
    kv, st = layer.get_kv_cache_spec(cfg), layer.compressor.state_cache.get_kv_cache_spec(cfg)
    swa = layer.swa_cache_layer.get_kv_cache_spec(cfg)
    assert (kv.block_size, kv.storage_block_size, kv.compress_ratio, kv.dtype) == (8192, 64, 128, torch.bfloat16)
    assert (st.block_size, st.head_size, st.dtype, st.sliding_window) == (16, 2 * hf.head_dim, torch.float32, 128)
    page = 64 * hf.head_dim * 2
    assert kv.page_size_bytes == st.page_size_bytes == swa.page_size_bytes == page
    assert layer.get_attn_backend() is AscendAttnRtDsaC128KvBackend
    assert layer.compressor.state_cache.get_attn_backend() is AscendAttnRtDsaC128StateBackend
    ik = c4.indexer.k_cache.get_kv_cache_spec(cfg)
    ist = c4.indexer.compressor.state_cache.get_kv_cache_spec(cfg)
    ast = c4.compressor.state_cache.get_kv_cache_spec(cfg)
    # The indexer page: 64 rows of int8 keys + fp16 scales, padded to the model's page (the tier-1 pad of §4).
    assert (ik.block_size, ik.storage_block_size, ik.head_size, ik.dtype) == (256, 64, hf.index_head_dim + 2,
                                                                             torch.uint8)
    assert ik.real_page_size_bytes == 64 * (hf.index_head_dim + 2) and ik.page_size_bytes == page
    assert (ast.block_size, ast.sliding_window, ist.block_size, ist.sliding_window) == (4, 8, 4, 8)
    assert ist.indexes_kv_by_block_stride and not ast.indexes_kv_by_block_stride  # never merged (§3.2)
    assert c4.get_kv_cache_spec(cfg).block_size == 256 and c4.get_attn_backend() is AscendAttnRtDsaC4KvBackend
    # Without the hybrid manager vLLM would give every group one block size.
    off = copy.copy(cfg)
    off.scheduler_config = copy.copy(cfg.scheduler_config)
    off.scheduler_config.disable_hybrid_kv_cache_manager = True
    off.cache_config = copy.copy(cfg.cache_config)
    off.cache_config.num_gpu_blocks = 8
    for make in (lambda: layer.get_kv_cache_spec(off), lambda: layer.compressor.state_cache.get_kv_cache_spec(off),
                 lambda: c4.indexer.k_cache.get_kv_cache_spec(off),
                 lambda: AscendAttnRtDsaC128KvBackend.get_builder_cls()(kv, ["a"], off, torch.device("cpu"))):
        with pytest.raises(NotImplementedError, match="disable_hybrid_kv_cache_manager=True"):
            make()
    fp4 = copy.copy(cfg)
    fp4.attention_config = copy.copy(cfg.attention_config)
    fp4.attention_config.use_fp4_indexer_cache = True
    fp4.cache_config = off.cache_config
    with pytest.raises(NotImplementedError, match="use_fp4_indexer_cache=True"):
        AscendAttnRtDsaC4IndexerKBackend.get_builder_cls()(ik, ["a"], fp4, torch.device("cpu"))
    # The C128 layer's own cache name carrying the SWA group's metadata.
    cfg.cache_config.num_gpu_blocks = 8
    b = AscendAttnRtDsaSwaBackend.get_builder_cls()(swa, ["a"], cfg, torch.device("cpu"))
    cam, pos = _common_metadata([3], [3], torch.ones(1, MAX_LEN // BS, dtype=torch.int32))
    md = b.build(0, cam)
    x = torch.zeros(3, hf.hidden_size, dtype=torch.bfloat16)
    with set_forward_context({layer.swa_cache_layer.prefix: md, layer.prefix: md}, cfg), \
            pytest.raises(ValueError, match="of swa: the c128_kv cache must use AscendAttnRtDsaC128KvBackend"):
        layer(pos, x)
