"""The vLLM sparse MLA adapter (ascend_attn_rt.vllm.sparse, docs/design/vllm_sparse.md) on vLLM 0.27.1's own
config, metadata and layer code: real VllmConfig objects from the local DeepseekV32ForCausalLM and
GlmMoeDsaForCausalLM configs in tests/python/data, vLLM's CommonAttentionMetadata, vLLM's DeepseekV32IndexerCache
and SparseAttnIndexer (replaced through register(family=...)), vLLM's Indexer.forward (its projections, k_norm,
RoPE and fp8 query quantisation) on bare modules, and vLLM's MLAAttention layer itself (made with the sparse backend,
process_weights_after_loading, forward: the cache update at vLLM's slots, W_UK absorption, the sparse route, W_UV).

Per batch (decode, prefill, chunked prefill, mixed, speculative decode; fp32 and bf16; both architectures, which
differ in the indexer RoPE pairing): the context is written by an earlier step through the same code, then
  * the indexer keys in the cache against the float64 keys of _sfa_reference (LayerNorm, RoPE on the first R dims),
  * the top-k against a brute-force float64 top-k of the query and weights the op received and the cached keys
    (exact in fp32; within score tolerance in bf16), causal per token,
  * the attention output against the float64 un-absorbed MLA reference over the selected positions (the kernel's
    scan rule, _sfa_reference.selected_positions).
Selector resolution runs vLLM's get_attn_backend with --attention-backend CUSTOM on a device platform (vLLM's CUDA
platform class with a capability given: the CPU platform refuses MLA before looking at the backend)."""

import copy
import itertools
import os
import sys
import types

import pytest
import torch

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import (CacheConfig, CUDAGraphMode, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig, set_current_vllm_config)
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.custom_op import op_registry_oot  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import MLAAttention  # noqa: E402
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer  # noqa: E402
from vllm.model_executor.models import deepseek_v2  # noqa: E402
from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec  # noqa: E402

import ascend_attn_rt.vllm as aar_vllm  # noqa: E402
from ascend_attn_rt.vllm import (AscendAttnRtIndexerBackend, AscendAttnRtSparseMlaBackend,  # noqa: E402
                                 AscendAttnRtSparseMlaImpl)
from ascend_attn_rt.vllm.sparse import indexer_op_cls  # noqa: E402
from _reference import assert_close, random_block_table  # noqa: E402
from _mla_reference import latent_attention_reference  # noqa: E402
from _sfa_reference import indexer_rope, layer_norm, selected_positions, topk_rows  # noqa: E402
from _vllm_support import common_metadata as _common_metadata, kv_cache_utils, vllm_registration  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
BS = 16
MAX_LEN = 512
F64 = torch.float64
MODELS = {"deepseek_v32": "vllm_tiny_v32", "glm_moe_dsa": "vllm_tiny_glm"}
_names = itertools.count()


def _vllm_config(family, dtype):
    path = os.path.join(DATA, MODELS[family])
    # What `vllm serve DIR --enforce-eager --block-size 16 --max-model-len 512 --max-num-seqs 8` builds (no
    # tokenizer, CPU device).
    mc = ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True, dtype=dtype, max_model_len=MAX_LEN,
                     enforce_eager=True)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    return VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                      device_config=DeviceConfig(device="cpu"))


_CONFIGS = {}


def _config(family, dtype):
    if (family, dtype) not in _CONFIGS:
        _CONFIGS[family, dtype] = _vllm_config(family, dtype)
    return copy.copy(_CONFIGS[family, dtype])


@pytest.fixture
def registered():
    """register(family=...) installs global state in vLLM (the CUSTOM slot, the SparseAttnIndexer
    replacement): restored after each test."""
    with vllm_registration():
        yield


def _quant_fp8_reference(x, group, column_major_scales=False, use_ue8m0=False, **_):
    """per_token_group_quant_fp8 (a Triton kernel, not runnable on the CPU) in torch: per group of
    `group` values, scale = amax / 448 (rounded up to a power of two with ue8m0), x / scale as e4m3."""
    g = x.float().view(*x.shape[:-1], -1, group)
    s = (g.abs().amax(-1, keepdim=True) / 448.0).clamp_min(1e-10)
    if use_ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(x.shape), s.squeeze(-1)


def _qsl(q_lens):
    return torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)


class Layer:
    """One decoder layer's sparse attention as vLLM builds it: the shared top-k buffer, the indexer cache
    layer and the indexer op (through vLLM's own classes), vLLM's Indexer.forward and MLAAttention.forward_impl
    on bare modules, the caches and both builders."""

    def __init__(self, cfg, dtype, nb, gen):
        self.cfg, self.dtype, self.gen = cfg, dtype, gen
        hf = cfg.model_config.hf_text_config
        self.N = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        self.L, self.P, self.R, self.V = hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim, hf.v_head_dim
        self.Q, self.HID = hf.q_lora_rank, hf.hidden_size
        self.n, self.D, self.K = hf.index_n_heads, hf.index_head_dim, hf.index_topk
        self.neox = not getattr(hf, "indexer_rope_interleave", False)
        self.buf = torch.empty(MAX_LEN, self.K, dtype=torch.int32)
        prefix = f"model.layers.{next(_names)}.self_attn"
        # (made inside set_current_vllm_config, as vLLM makes its model)
        self.k_cache = deepseek_v2.DeepseekV32IndexerCache(
            head_dim=self.D + self.D // 128 * 4, dtype=torch.uint8, prefix=f"{prefix}.indexer.k_cache",
            cache_config=cfg.cache_config)
        self.op = SparseAttnIndexer(self.k_cache, 128, "ue8m0", self.K, self.D, MAX_LEN, MAX_LEN, self.buf)
        assert type(self.op) is indexer_op_cls()  # vLLM instantiated the registered replacement
        self.attn_name = f"{prefix}.attn"
        w = lambda o, i: (torch.randn(o, i, generator=gen, dtype=F64) / i ** 0.5).to(dtype)  # noqa: E731
        self.iw = {"wq_b": w(self.n * self.D, self.Q), "wk": w(self.D, self.HID), "weights_proj": w(self.n, self.HID),
                   "k_norm_weight": (1 + 0.1 * torch.randn(self.D, generator=gen, dtype=F64)).to(dtype),
                   "k_norm_bias": (0.1 * torch.randn(self.D, generator=gen, dtype=F64)).to(dtype)}
        self.kv_b_proj = torch.nn.Linear(self.L, self.N * (self.P + self.V), bias=False, dtype=dtype)
        self.kv_b_proj.requires_grad_(False).weight.copy_(w(self.N * (self.P + self.V), self.L))
        self.indexer = self._indexer()
        self.rope = get_rope(self.R, max_position=MAX_LEN, is_neox_style=self.neox,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=dtype)
        # The caches: shapes from the backends, the indexer's spec from the (re-pointed) cache layer.
        ispec = self.k_cache.get_kv_cache_spec(cfg)
        assert self.k_cache.get_attn_backend() is AscendAttnRtIndexerBackend
        assert (ispec.head_size, ispec.dtype, ispec.block_size) == (self.D, dtype, BS)
        self.idx_cache = self._rnd(*AscendAttnRtIndexerBackend.get_kv_cache_shape(nb, BS, 1, ispec.head_size))
        self.k_cache.kv_cache = self.idx_cache
        self.kv_cache = self._rnd(*AscendAttnRtSparseMlaBackend.get_kv_cache_shape(nb, BS, 1, self.L + self.R))
        mspec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=self.L + self.R, dtype=dtype,
                                 cache_dtype_str="auto")
        self.builder = AscendAttnRtSparseMlaBackend.get_builder_cls()(mspec, [self.attn_name], cfg, torch.device("cpu"))
        self.ibuilder = AscendAttnRtIndexerBackend.get_builder_cls()(ispec, [self.k_cache.prefix], cfg,
                                                                      torch.device("cpu"))
        self.kv_b_proj.quant_method = None  # what vLLM's unquantised linear layers carry
        self.mla = self._mla(self.attn_name, self.indexer)
        self.impl = self.mla.impl
        assert type(self.impl) is AscendAttnRtSparseMlaImpl and self.impl.topk_indices_buffer is self.buf
        assert self.mla.prefill_backend is None  # the impl has no dense prefill: every token goes sparse
        self.seen = []
        run = self.op.run
        self.op.run = lambda q, k, wts, cache, md: (self.seen.append((q.clone(), wts.clone())), run(q, k, wts, cache,
                                                                                                    md))[1]

    def _mla(self, name, indexer):
        """vLLM's sparse MLAAttention layer, as MultiHeadLatentAttentionWrapper makes it (the backend given
        as the selector returns it, test_selector_resolves_the_sparse_backends), weights processed."""
        layer = MLAAttention(num_heads=self.N, scale=(self.P + self.R) ** -0.5, qk_nope_head_dim=self.P,
                             qk_rope_head_dim=self.R, v_head_dim=self.V, q_lora_rank=self.Q, kv_lora_rank=self.L,
                             kv_b_proj=self.kv_b_proj, cache_config=self.cfg.cache_config, prefix=name,
                             attn_backend=AscendAttnRtSparseMlaBackend, use_sparse=True, indexer=indexer,
                             topk_indices_buffer=self.buf)
        layer.process_weights_after_loading(self.dtype)
        layer.kv_cache = self.kv_cache
        return layer

    def _rnd(self, *shape):
        return torch.randn(*shape, generator=self.gen, dtype=F64).to(self.dtype)

    def _indexer(self):
        """vLLM's Indexer.forward on the modules it reads (building the real module needs vLLM's
        distributed state for its linear layers)."""
        lin = lambda W: (lambda x: (x @ W.T, None))  # noqa: E731  (vLLM's linear layers return (out, bias))
        k_norm = torch.nn.LayerNorm(self.D, eps=1e-6, dtype=self.dtype).requires_grad_(False)
        k_norm.weight.copy_(self.iw["k_norm_weight"])
        k_norm.bias.copy_(self.iw["k_norm_bias"])
        ns = types.SimpleNamespace(
            wq_b=lin(self.iw["wq_b"]), wk_weights_proj=lin(torch.cat([self.iw["wk"], self.iw["weights_proj"]])),
            k_norm=k_norm, n_head=self.n, head_dim=self.D, rope_dim=self.R, is_inplace_rope=False,
            use_fused_indexer_q=False, quant_block_size=self.D, scale_fmt="ue8m0", softmax_scale=self.D ** -0.5,
            n_head_scale=self.n ** -0.5, indexer_op=self.op, topk_indices_buffer=self.buf, topk_tokens=self.K)
        ns.forward = types.MethodType(deepseek_v2.Indexer.forward, ns)
        return ns

    def rotary(self, positions, q, k):
        return self.rope.forward_native(positions, q, k)

    def step(self, reqs, seq_lens, q_lens, bt, xs, qcs, cs, kpes, qs=None):
        """One engine step over requests `reqs` (their last q_lens of seq_lens tokens): builds, the
        indexer, the latent cache update and (with qs) the attention. Returns the output or None."""
        qsl, sl = _qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32)
        rows = bt[reqs]
        pos = torch.cat([torch.arange(s - q, s) for s, q in zip(seq_lens, q_lens)])
        slots = torch.cat([rows[i, p // BS].long() * BS + p % BS
                           for i, p in enumerate(torch.arange(s - q, s) for s, q in zip(seq_lens, q_lens))])
        cam = _common_metadata(qsl, sl, rows, slots)
        md, imd = self.builder.build(0, cam), self.ibuilder.build(0, cam)
        new = lambda xs: torch.cat([xs[r][s - q:s] for r, s, q in zip(reqs, seq_lens, q_lens)])  # noqa: E731
        kv_c, k_pe = new(cs), new(kpes).unsqueeze(1)
        with set_forward_context({self.k_cache.prefix: imd, self.attn_name: md}, self.cfg,
                                 slot_mapping={self.attn_name: slots}):
            self.indexer.forward(new(xs), new(qcs), pos, self.rotary)
            if qs is None:  # an earlier step: only the cache writes matter here
                self.impl.do_kv_cache_update(kv_c, k_pe, self.kv_cache, slots, "auto", torch.ones(()))
                return None, md
            # MLAAttention.forward: do_kv_cache_update at vLLM's slots, then forward_impl.
            out = self.mla(torch.cat(qs), kv_c, k_pe, output_shape=(int(qsl[-1]), self.N * self.V))
            self.last = (torch.cat(qs), kv_c, k_pe, md)
        return out, md

    def skip_layer_output(self):
        """An IndexCache skip layer (no indexer: vLLM passes the shared buffer alone) over the same inputs."""
        layer = self._mla(f"{self.attn_name}.skip", None)
        assert layer.impl.topk_indices_buffer is self.buf
        q, kv_c, k_pe, md = self.last
        out = torch.full((q.shape[0], self.N * self.V), 7.0, dtype=self.dtype)
        layer.forward_impl(q, kv_c, k_pe, self.kv_cache, md, output=out)
        return out

    def cached_keys(self, bt, r, s):
        p = torch.arange(s)
        return self.idx_cache[bt[r, p // BS].long(), p % BS].to(F64)

    def reference_keys(self, x, s):
        kw = x[:s].to(F64) @ self.iw["wk"].to(F64).T
        k = layer_norm(kw, self.iw["k_norm_weight"].to(F64), self.iw["k_norm_bias"].to(F64), 1e-6)
        return indexer_rope(k, torch.arange(s), self.R, self.neox)


BATCHES = [
    pytest.param([17, 40, 5], [1, 1, 1], 0, id="decode"),
    pytest.param([9, 30], [9, 30], 0, id="prefill"),
    pytest.param([40, 70], [8, 20], 0, id="chunked_prefill"),
    pytest.param([33, 12, 50], [1, 1, 14], 0, id="mixed"),
    pytest.param([20, 31, 9], [3, 2, 1], 2, id="spec_decode"),
]


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seq_lens,q_lens,spec", BATCHES)
def test_sparse_mla_in_vllm_forward(registered, monkeypatch, family, dtype, seq_lens, q_lens, spec):
    monkeypatch.setattr(deepseek_v2, "per_token_group_quant_fp8", _quant_fp8_reference)
    aar_vllm.register(family=family)
    cfg = _config(family, dtype)
    if spec:
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    nb = 40
    cfg.cache_config.num_gpu_blocks = nb
    gen = torch.Generator().manual_seed(5)
    with set_current_vllm_config(cfg):
        _run_case(cfg, dtype, nb, gen, seq_lens, q_lens, spec)


def _run_case(cfg, dtype, nb, gen, seq_lens, q_lens, spec):
    lay = Layer(cfg, dtype, nb, gen)
    assert lay.builder.reorder_batch_threshold == 1 + spec
    bt = random_block_table(seq_lens, BS, nb, gen, width=MAX_LEN // BS)
    xs = [lay._rnd(s, lay.HID) for s in seq_lens]
    qcs = [lay._rnd(s, lay.Q) for s in seq_lens]
    cs = [lay._rnd(s, lay.L) for s in seq_lens]
    kpes = [lay._rnd(s, lay.R) for s in seq_lens]
    qs = [lay._rnd(q, lay.N, lay.P + lay.R) for q in q_lens]

    # The context, written by an earlier (prefill) step through the same code.
    ctx = [r for r, (s, q) in enumerate(zip(seq_lens, q_lens)) if s > q]
    if ctx:
        lay.step(ctx, [seq_lens[r] - q_lens[r] for r in ctx], [seq_lens[r] - q_lens[r] for r in ctx], bt, xs, qcs,
                 cs, kpes)
    out, md = lay.step(list(range(len(seq_lens))), seq_lens, q_lens, bt, xs, qcs, cs, kpes, qs)
    assert md.num_actual_tokens == sum(q_lens) and md.topk_tokens == lay.K

    assert torch.equal(lay.skip_layer_output(), out)
    q8, wts = lay.seen[-1]
    got = lay.buf[: sum(q_lens)].long()
    t0 = 0
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        keys = lay.cached_keys(bt, r, s)
        if dtype == torch.float32:
            assert_close(keys, lay.reference_keys(xs[r], s), dtype, what=f"indexer keys of request {r}")
        else:  # vLLM computes them in bf16 (projection, LayerNorm, RoPE each rounded): a few bf16 steps
            torch.testing.assert_close(keys, lay.reference_keys(xs[r], s), atol=5e-2, rtol=2e-2)
        for i in range(ql):
            t, vis = t0 + i, s - ql + i + 1
            # Brute force over what the op received (vLLM's fp8 query, the folded weights), as the kernel reads them.
            qv, w = q8[t].to(dtype).to(F64), wts[t].to(dtype).to(F64)
            score = (w[:, None] * torch.relu(qv @ keys.T)).sum(0)
            ref = topk_rows(score[None], [vis], lay.K)[0]
            row = got[t]
            if dtype == torch.float32:
                assert torch.equal(row, ref), (r, i, row, ref)
            else:
                sel = [p for p in row.tolist() if p >= 0]
                assert len(sel) == min(lay.K, vis) and len(set(sel)) == len(sel) and max(sel) < vis, (r, i, sel)
                rest = [p for p in range(vis) if p not in sel]
                if rest:
                    tol = 0.02 * float(score[:vis].abs().max())
                    assert min(float(score[p]) for p in sel) >= max(float(score[p]) for p in rest) - tol
            sel = selected_positions(row, s - ql + i + 1)
            want = latent_attention_reference(qs[r][i:i + 1], cs[r][sel], kpes[r][sel], lay.kv_b_proj.weight, 1,
                                              lay.impl.scale, lay.N, lay.P, lay.V)
            assert_close(out[t].view(1, lay.N, lay.V), want, dtype, what=f"output of request {r} token {i}")
        t0 += ql


@pytest.mark.parametrize("family", sorted(MODELS))
def test_selector_resolves_the_sparse_backends(registered, monkeypatch, family):
    """vLLM's own selector (get_attn_backend, as MLAAttention calls it for the architecture) with
    --attention-backend CUSTOM, on vLLM's CUDA platform logic (validate_configuration) with a device
    capability given; the indexer cache layer and op as vLLM's Indexer makes them."""
    import vllm.platforms as platforms

    # cuda.py imports vLLM's CUDA kernel library for its op registrations only (not built for the CPU).
    monkeypatch.setitem(sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention import selector

    cfg = _config(family, torch.bfloat16)
    mc = cfg.model_config
    assert mc.architectures == [{"deepseek_v32": "DeepseekV32ForCausalLM",
                                 "glm_moe_dsa": "GlmMoeDsaForCausalLM"}[family]]
    cfg.attention_config.backend = AttentionBackendEnum.CUSTOM
    cfg.cache_config = CacheConfig(block_size=128)  # the kernel block an engine allocates (sfa.md §2.1)
    aar_vllm.register(family=family)
    monkeypatch.setattr(platforms, "_current_platform", CudaPlatform())
    monkeypatch.setattr(CudaPlatform, "get_device_capability",
                        classmethod(lambda cls, device_id=0: DeviceCapability(9, 0)))
    selector._cached_get_attn_backend.cache_clear()
    try:
        with set_current_vllm_config(cfg):
            # What MLAAttention asks for this architecture (deepseek_v2: use_sparse = hasattr(config, "index_topk")).
            cls = selector.get_attn_backend(mc.get_head_size(), mc.dtype, cfg.cache_config.cache_dtype,
                                            use_mla=mc.use_mla, use_sparse=hasattr(mc.hf_config, "index_topk"),
                                            num_heads=4)
            assert cls is AscendAttnRtSparseMlaBackend and cls.is_sparse() and cls.is_mla()
            # Without use_sparse (a dense MLA layer) the selector refuses the sparse backend by reason.
            with pytest.raises(ValueError, match="non-sparse not supported"):
                selector.get_attn_backend(mc.get_head_size(), mc.dtype, "auto", use_mla=True, use_sparse=False)
            k_cache = deepseek_v2.DeepseekV32IndexerCache(head_dim=132, dtype=torch.uint8,
                                                          prefix=f"sel.{next(_names)}.k_cache",
                                                          cache_config=cfg.cache_config)
            op = SparseAttnIndexer(k_cache, 128, "ue8m0", 8, 32, MAX_LEN, MAX_LEN, torch.empty(4, 8, dtype=torch.int32))
        assert type(op) is indexer_op_cls() and k_cache.get_attn_backend() is AscendAttnRtIndexerBackend
    finally:
        selector._cached_get_attn_backend.cache_clear()


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_vllm_groups_the_indexer_cache_beside_the_latent_cache(registered, family):
    """vLLM's own KV-cache grouping (vllm.v1.core.kv_cache_utils.get_kv_cache_groups, what its engine runs at
    start-up) of one sparse layer's two cache layers as the adapter reports them: the latent cache
    (`MLAAttentionSpec`, L + R) and the indexer's key cache (its own layer, spec and backend, head size D). Both
    are full-attention specs of one block size, so vLLM makes ONE KV-cache group (one block table) holding the two
    layers with their own specs (docs/design/vllm_sparse.md §1): the runtime's indexer cache reads the main
    cache's block ids, which is what it is given."""
    kvu = kv_cache_utils()
    aar_vllm.register(family=family)
    cfg = _config(family, torch.float32)
    cfg.cache_config.num_gpu_blocks = 40
    with set_current_vllm_config(cfg):
        lay = Layer(cfg, torch.float32, 40, torch.Generator().manual_seed(3))
        mspec, ispec = lay.mla.get_kv_cache_spec(cfg), lay.k_cache.get_kv_cache_spec(cfg)
        groups = kvu.get_kv_cache_groups(cfg, {lay.attn_name: mspec, lay.k_cache.prefix: ispec})
    assert len(groups) == 1
    (g,) = groups
    assert sorted(g.layer_names) == sorted([lay.attn_name, lay.k_cache.prefix])
    specs = g.kv_cache_spec.kv_cache_specs  # vLLM's UniformTypeKVCacheSpecs: one spec per layer of the group
    assert specs[lay.attn_name].head_size == lay.L + lay.R and specs[lay.k_cache.prefix].head_size == lay.D
    assert specs[lay.attn_name].block_size == specs[lay.k_cache.prefix].block_size == BS
    assert lay.mla.get_attn_backend() is AscendAttnRtSparseMlaBackend
    assert lay.k_cache.get_attn_backend() is AscendAttnRtIndexerBackend


def test_register_families(registered):
    from ascend_attn_rt.vllm import AscendAttnRtBackend, AscendAttnRtMlaBackend

    for kw, cls in (({}, AscendAttnRtBackend), ({"mla": True}, AscendAttnRtMlaBackend),
                    ({"family": "mla"}, AscendAttnRtMlaBackend), ({"family": "gqa"}, AscendAttnRtBackend),
                    ({"family": "deepseek_v32"}, AscendAttnRtSparseMlaBackend),
                    ({"family": "glm_moe_dsa"}, AscendAttnRtSparseMlaBackend)):
        aar_vllm.register(**kw)
        assert AttentionBackendEnum.CUSTOM.get_class() is cls
    assert op_registry_oot["SparseAttnIndexer"] is indexer_op_cls()
    # (deepseek_v4 is a family too: tests/python/test_vllm_dsa.py, whose fixture restores the DSV4 selection)
    with pytest.raises(ValueError, match="family='deepseek_v5'"):
        aar_vllm.register(family="deepseek_v5")
    with pytest.raises(ValueError, match="mla=True with family='glm_moe_dsa'"):
        aar_vllm.register(mla=True, family="glm_moe_dsa")


def test_refusals(registered):
    cfg = _config("deepseek_v32", torch.bfloat16)
    cfg.cache_config.num_gpu_blocks = 8
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=80, dtype=torch.bfloat16, cache_dtype_str="auto")
    buf = torch.empty(4, 8, dtype=torch.int32)
    kw = dict(num_heads=4, head_size=80, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
              kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
              kv_sharing_target_layer_name=None, q_lora_rank=48, kv_lora_rank=64, qk_nope_head_dim=32,
              qk_rope_head_dim=16, qk_head_dim=48, v_head_dim=32, kv_b_proj=None, topk_indices_buffer=buf)
    impl_cls = AscendAttnRtSparseMlaBackend.get_impl_cls()
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8_ds_mla'"):
        impl_cls(**{**kw, "kv_cache_dtype": "fp8_ds_mla"})
    with pytest.raises(NotImplementedError, match="sliding_window"):
        impl_cls(**{**kw, "sliding_window": 64})
    with pytest.raises(ValueError, match="topk_indices_buffer=None"):
        impl_cls(**{**kw, "topk_indices_buffer": None})
    with pytest.raises(NotImplementedError, match="forward_mha"):
        impl_cls(**kw).forward_mha(None, None, None, None, None, None, None)
    with pytest.raises(ValueError, match="cache_dtype_str='fp8_ds_mla'"):
        AscendAttnRtSparseMlaBackend.get_kv_cache_shape(8, BS, 1, 80, "fp8_ds_mla")
    with pytest.raises(ValueError, match="block_size=24"):
        AscendAttnRtSparseMlaBackend.get_kv_cache_shape(8, 24, 1, 80)
    with pytest.raises(ValueError, match="block_size=24"):
        AscendAttnRtIndexerBackend.get_kv_cache_shape(8, 24, 1, 32)
    # Prefill context parallelism, at the builder and at the indexer op (DCP: tests/python/test_vllm_sparse_dcp.py);
    # PCP refused by name; DCP without a DCP group of its size.
    cp = copy.copy(cfg)
    cp.parallel_config = ParallelConfig(prefill_context_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(NotImplementedError, match="prefill_context_parallel_size=2"):
        AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["a"], cp, torch.device("cpu"))
    op_cls = indexer_op_cls()
    k_cache = types.SimpleNamespace(cache_config=cfg.cache_config, prefix="x")
    with set_current_vllm_config(cp), pytest.raises(NotImplementedError, match="prefill_context_parallel_size=2"):
        op_cls(k_cache, 128, "ue8m0", 8, 32, MAX_LEN, MAX_LEN, buf)
    dcp = copy.copy(cfg)
    dcp.parallel_config = ParallelConfig(decode_context_parallel_size=2, tensor_parallel_size=2)
    # Either vLLM's groups are not set up in this process, or an earlier test set them up with one rank.
    with pytest.raises((RuntimeError, ValueError),
                       match="vLLM's DCP group (is not initialised|has 1 ranks but decode_context_parallel_size=2)"):
        AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["a"], dcp, torch.device("cpu"))
    with set_current_vllm_config(cfg), pytest.raises(NotImplementedError, match="use_fp4_cache=True"):
        op_cls(k_cache, 128, "ue8m0", 8, 32, MAX_LEN, MAX_LEN, buf, use_fp4_cache=True)
    # Graphs and torch.compile (the op is Python the compiler would trace).
    for attr, value, match in (("mode", 3, "compilation_config.mode=3"),
                               ("cudagraph_mode", "FULL_AND_PIECEWISE", "cudagraph_mode=FULL_AND_PIECEWISE")):
        g = copy.copy(cfg)
        g.compilation_config = copy.copy(cfg.compilation_config)
        setattr(g.compilation_config, attr, getattr(CUDAGraphMode, value) if attr == "cudagraph_mode" else value)
        with set_current_vllm_config(g), pytest.raises(NotImplementedError, match=match):
            op_cls(k_cache, 128, "ue8m0", 8, 32, MAX_LEN, MAX_LEN, buf)
        if attr == "cudagraph_mode":
            with pytest.raises(NotImplementedError, match=match):
                AscendAttnRtIndexerBackend.get_builder_cls()(spec, ["a"], g, torch.device("cpu"))
    # The profiling run (no metadata dict) leaves the buffer alone; metadata of another backend is refused.
    with set_current_vllm_config(cfg):
        op = op_cls(types.SimpleNamespace(cache_config=cfg.cache_config, prefix="y"), 128, "ue8m0", 8, 32, MAX_LEN,
                    MAX_LEN, buf)
    buf.fill_(5)
    with set_forward_context(None, cfg):
        assert op(None, None, None, None) is buf and bool((buf == 5).all())
    with set_forward_context({"y": object()}, cfg), pytest.raises(ValueError, match="AscendAttnRtIndexerBackend"):
        op(None, None, None, None)
    # DeepSeek-V4's compressed indexer.
    v4 = copy.copy(cfg)
    v4.model_config = copy.copy(cfg.model_config)
    v4.model_config.hf_text_config = copy.copy(cfg.model_config.hf_text_config)
    v4.model_config.hf_text_config.compress_ratios = [1, 4]
    with pytest.raises(NotImplementedError, match="compress_ratios"):
        AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["a"], v4, torch.device("cpu"))
