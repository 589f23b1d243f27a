"""vLLM adapter for DeepSeek-V4 (DeepseekV4ForCausalLM) over the runtime's DSA layer (docs/design/vllm_dsa.md).

vLLM 0.27.1 picks the DeepSeek-V4 attention class with ``_select_dsv4_attn_cls`` (its CUDA model module, which
is also the one every non-ROCm, non-XPU platform imports). ``register(family="deepseek_v4")`` wraps that function:
with ``--attention-backend CUSTOM`` it returns ``AscendAttnRtDsaAttention``, a subclass of vLLM's
``DeepseekV4Attention`` whose ``forward`` is one ``dsa.Impl.forward`` (projections, RoPE, the SWA cache write,
the compressors, the indexer and its top-k, the shared-KV attention with sinks, inverse RoPE, the grouped
o_proj), with vLLM's own parameters as the weights.

Every cache of a layer is one of the runtime's KV-cache groups, reported to vLLM's allocator with the runtime's
geometry at cache_block_size 64 (docs/design/vllm_dsa.md §3): the SWA cache (vLLM's ``DeepseekV4SWACache``,
64-token blocks); the compressed KV (the attention layer's own spec: C4 256 raw tokens, C128 8192, 64 rows per
block); the compressor states (C4 4 positions, C128 16 per block); on C4 layers the indexer page (64 int8 key
rows + their fp16 scales). All pages are padded to one size, so vLLM's hybrid KV-cache manager gives each cache
its own group and block table. Each group's builder runs the runtime's ``dsa.GroupBuilder`` of its kind over
vLLM's block table of that group; the step builder (``dsa.StepBuilder``) is shared by the groups of one vLLM
config and runs once per step.

Served: SWA-only, C4 and C128 layers, eager and decode graphs (``cudagraph_mode=FULL_DECODE_ONLY``: every builder
declares uniform single-token decode, or the uniform batch with speculative tokens, ``build_for_cudagraph_capture`` builds
the runtime's capture step, the layer's
``forward`` inside ``ascend_attn_rt.vllm.graph.capture`` records the runtime's layer, ``graph.update`` / ``replay``
refresh and re-issue it; docs/design/vllm_dsa.md §6; under vLLM's graph wrapper on the recording provider the
layer's runtime call is one segment, §6.1), single rank, A2/A3 plan (plain rows in the model dtype, int8
indexer), vLLM's hybrid KV-cache manager on. Refused by name when the layer or a builder is made: other ratios,
fp8 KV caches, the MXFP4 indexer cache, tensor / context parallelism, graph modes other than FULL_DECODE_ONLY and
torch.compile, a quantised checkpoint, the hybrid KV-cache manager off with compressed layers; per step: cascade
attention, non-causal batches, ``llama_4_scaling``, a FULL cudagraph runtime mode without a graph provider or with
prefills.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder, CommonAttentionMetadata

from .. import _C as aar
from . import _build_inputs, _cdiv, _padded_inputs, _refuse_cp
from .graph import GraphBuilderMixin, capturing_store, graph_params, in_wrapper_run, run_segment

# The runtime's cache_block_size (docs/design/dsa.md §2.2) for every group: vLLM fixes the SWA page at 64 tokens
# (DeepseekV4SWACache), and the runtime's geometry row of 64 then fixes the others (C128 KV 8192 raw tokens = 64
# rows per block, C128 state 16 positions per block on A2/A3).
_CACHE_BLOCK_SIZE = 64
_SWA_BLOCK_SIZE = 64
_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")
# The cache kinds the adapter serves (aar.dsa.layer_cache_kinds of ratios 1 and 128).
_RATIOS = (1, 4, 128)
_ROW_KINDS = ("swa", "c4_kv", "c128_kv")  # rows in the model dtype
_STATE_KINDS = ("c4_attn_state", "c4_indexer_state", "c128_state")  # fp32 [kv | score] per raw position


def _reason(ratio: int) -> str:
    return f"compress_ratio={ratio} is not a DeepSeek-V4 ratio (1, 4 or 128)"


def _model_dtype_name(dtype: torch.dtype) -> str:
    # The A2/A3 plan keys on the model dtype only for its int8 indexer scales (not used by SWA / C128 layers);
    # float32 weights and caches run as CPU reference runs under the bf16 plan (docs/design/dsa.md §5.1).
    return "float16" if dtype == torch.float16 else "bfloat16"


def _layer_ratios(hf) -> set:
    return {max(1, int(r)) for r in (getattr(hf, "compress_ratios", None) or [1])}


def _refuse_unsupported(vllm_config, what: str) -> None:
    from .sparse import _refuse_graphs

    _refuse_cp(vllm_config, what)
    _refuse_graphs(vllm_config, what, compiled=True)
    tp = vllm_config.parallel_config.tensor_parallel_size
    if tp != 1:
        raise NotImplementedError(f"tensor_parallel_size={tp}: ascend_attn_rt's {what} runs the whole layer on "
                                  "one rank (no head or o_proj sharding)")
    cache_dtype = vllm_config.cache_config.cache_dtype
    if cache_dtype not in _KV_CACHE_DTYPES:
        raise NotImplementedError(f"kv_cache_dtype={cache_dtype!r} is not supported by ascend_attn_rt's {what} "
                                  f"(the A2/A3 plan keeps plain rows in the model dtype; use one of "
                                  f"{list(_KV_CACHE_DTYPES)})")


def _geometry(kind: str, hf=None) -> dict:
    """The runtime's spec of a cache kind at _CACHE_BLOCK_SIZE on the A2/A3 plan (block sizes, rows per page,
    head size); for the model's dims when hf is given."""
    dims = {} if hf is None else dict(head_dim=hf.head_dim, rope_dim=hf.qk_rope_head_dim,
                                      index_head_dim=getattr(hf, "index_head_dim", 128))
    return aar.dsa.cache_spec(kind, _CACHE_BLOCK_SIZE, device_kind="a2", **dims)


def _kind_dtype(kind: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype vLLM allocates a kind's cache in: attention rows in the model dtype, states fp32, the indexer
    page as bytes (int8 keys then fp16 scales, viewed by the layer, _indexer_views)."""
    if kind in _ROW_KINDS:
        return model_dtype
    if kind in _STATE_KINDS:
        return torch.float32
    if kind == "c4_indexer_k":
        return torch.uint8
    raise NotImplementedError(f"cache kind {kind!r} is not served by ascend_attn_rt's vLLM adapter")


def _head_size(kind: str, hf) -> int:
    """Elements of _kind_dtype per row: the runtime's head size, or for the indexer page the bytes of one key row
    plus its scale (the page is [keys of every row | scales of every row], the same bytes per row on average)."""
    g = _geometry(kind, hf)
    if kind != "c4_indexer_k":
        return g["head_size"]
    return g["page_bytes"] // g["storage_block_size"]


def _page_bytes(kind: str, vllm_config) -> int:
    hf = vllm_config.model_config.hf_config
    g = _geometry(kind, hf)
    dtype = _kind_dtype(kind, vllm_config.model_config.dtype)
    return g["storage_block_size"] * g["num_kv_heads"] * _head_size(kind, hf) * dtype.itemsize


def _padded_page_bytes(vllm_config) -> int:
    """One page size for every group of the model (docs/design/vllm_dsa.md §3): the largest of its caches' pages
    (the runtime's tier-2 pad; DeepSeek-V4's dims in bf16 give 65536 for all three kinds)."""
    for r in sorted(_layer_ratios(vllm_config.model_config.hf_config) - set(_RATIOS)):
        raise NotImplementedError(_reason(r))
    kinds = {k for r in _layer_ratios(vllm_config.model_config.hf_config) for k in aar.dsa.layer_cache_kinds(r)}
    return max(_page_bytes(k, vllm_config) for k in kinds)


def _refuse_without_hybrid_manager(vllm_config) -> None:
    """Compressed layers need vLLM's hybrid KV-cache manager: without it vLLM turns every sliding-window spec into
    a full-attention one of one block size, which is not the runtime's geometry (docs/design/vllm_dsa.md §3.2)."""
    if (_layer_ratios(vllm_config.model_config.hf_config) - {1}
            and vllm_config.scheduler_config.disable_hybrid_kv_cache_manager):
        raise NotImplementedError(
            "scheduler_config.disable_hybrid_kv_cache_manager=True: ascend_attn_rt's DeepSeek-V4 adapter serves "
            "compressed layers only with vLLM's hybrid KV-cache manager (each cache group keeps the runtime's own "
            "block size: 64 SWA, 256 C4 KV and indexer keys, 4 C4 states, 8192 C128 KV, 16 C128 state)")


def _refuse_fp4_indexer(vllm_config) -> None:
    if 4 in _layer_ratios(vllm_config.model_config.hf_config) and \
            getattr(vllm_config.attention_config, "use_fp4_indexer_cache", False):
        raise NotImplementedError("attention_config.use_fp4_indexer_cache=True: the A2/A3 plan's C4 indexer cache "
                                  "is int8 keys with fp16 scales (no MXFP4)")


def _spec_padding(kind: str, vllm_config) -> int | None:
    page, padded = _page_bytes(kind, vllm_config), _padded_page_bytes(vllm_config)
    return None if padded == page else padded


def _swa_spec(vllm_config, window: int):
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    hf = vllm_config.model_config.hf_config
    return SlidingWindowMLASpec(
        block_size=_SWA_BLOCK_SIZE, num_kv_heads=1, head_size=hf.head_dim, dtype=vllm_config.model_config.dtype,
        sliding_window=window, cache_dtype_str=vllm_config.cache_config.cache_dtype, model_version="deepseek_v4",
        page_size_padded=_spec_padding("swa", vllm_config))


def _compressed_spec(kind: str, vllm_config):
    """The KV-cache spec of a compressed cache (C4 / C128 KV, C4 indexer keys): MLAAttentionSpec with the ratio, block
    size = rows per page x ratio."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    _refuse_without_hybrid_manager(vllm_config)
    hf = vllm_config.model_config.hf_config
    g = _geometry(kind, hf)
    return MLAAttentionSpec(
        block_size=g["block_size"], num_kv_heads=1, head_size=_head_size(kind, hf),
        dtype=_kind_dtype(kind, vllm_config.model_config.dtype), compress_ratio=g["compress_ratio"],
        cache_dtype_str=vllm_config.cache_config.cache_dtype if kind in _ROW_KINDS else None,
        model_version="deepseek_v4", page_size_padded=_spec_padding(kind, vllm_config))


def _state_spec(kind: str, vllm_config):
    """The KV-cache spec of a compressor state (window coff x ratio positions, fp32)."""
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    _refuse_without_hybrid_manager(vllm_config)
    g = _geometry(kind, vllm_config.model_config.hf_config)
    ratio = 128 if kind == "c128_state" else 4
    # No model_version / cache_dtype_str, as vLLM's own state specs: an SWA spec of the same window (DeepSeek-V4's
    # W = 128 = the C128 state's window) must not merge with one into a group. vLLM's merge of sliding-window
    # specs compares neither block size nor head size: the two C4 states (head 4 D and 4 Di, window 8) are kept
    # apart by the block-stride flag on the indexer's (true of every adapter cache: the runtime reads pages by
    # the block stride).
    return SlidingWindowMLASpec(
        block_size=g["block_size"], num_kv_heads=1, head_size=g["head_size"], dtype=torch.float32,
        sliding_window=g["coff"] * ratio, page_size_padded=_spec_padding(kind, vllm_config),
        indexes_kv_by_block_stride=kind == "c4_indexer_state")


def _rope_tables(vllm_config, ratio: int = 1):
    """The RoPE tables of layers of `ratio` as the runtime takes them, (max_model_len, R) each with every angle
    repeated twice (interleaved pairs), from vLLM's own DeepSeek-V4 rotary embedding (rope_theta for ratio 1,
    compress_rope_theta for compressed layers; vLLM's scaling type). vLLM's cos_sin_cache is [cos | sin], R / 2
    each."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.common.rope import build_deepseek_v4_rope

    hf = vllm_config.model_config.hf_config
    with set_current_vllm_config(vllm_config):  # the rotary embedding is a CustomOp, made under a config
        rope = build_deepseek_v4_rope(hf, head_dim=hf.head_dim, rope_head_dim=hf.qk_rope_head_dim,
                                      max_position_embeddings=hf.max_position_embeddings, compress_ratio=ratio)
    # The module's cos_sin_cache is in the default dtype it was made under (bf16 for a bf16 model's default
    # RoPE): the table is recomputed in fp32 by the module's own method, the values vLLM's fp32 caches hold.
    cache = rope._compute_cos_sin_cache()[: vllm_config.model_config.max_model_len].float()
    half = cache.shape[-1] // 2
    return (cache[:, :half].repeat_interleave(2, -1).contiguous(),
            cache[:, half:].repeat_interleave(2, -1).contiguous())


class _SharedStep:
    """The runtime's StepBuilder of one vLLM config, shared by every group builder of that config: the first
    group builder of a step builds the step, the others reuse it (same lengths, still the builder's latest)."""

    def __init__(self, vllm_config, device):
        sc, mc = vllm_config.scheduler_config, vllm_config.model_config
        hf = mc.hf_config
        spec = getattr(vllm_config, "speculative_config", None)
        num_spec = 0 if spec is None else int(spec.num_speculative_tokens or 0)
        cos, sin = _rope_tables(vllm_config, 1)
        kw = {}
        if _layer_ratios(hf) - {1}:
            kw["compress_cos_table"], kw["compress_sin_table"] = _rope_tables(vllm_config, 128)
        if 4 in _layer_ratios(hf):
            kw.update(index_topk=hf.index_topk, index_n_heads=hf.index_n_heads, index_head_dim=hf.index_head_dim)
        self.builder = aar.dsa.StepBuilder(
            max_num_reqs=sc.max_num_seqs, max_num_tokens=sc.max_num_batched_tokens, cos_table=cos, sin_table=sin,
            num_speculative_tokens=num_spec, chunked_prefill_enabled=bool(sc.enable_chunked_prefill),
            device=str(device), head_dim=hf.head_dim, window=hf.sliding_window, num_heads_q=hf.num_attention_heads,
            **kw)
        self._key = None
        self._step = None
        self._generation = None
        # Graph mode: the SWA group builders of this config in the order vLLM made them (vLLM's KV-cache group
        # order); a layer's captured call belongs to its SWA group's index (docs/design/vllm_dsa.md §6).
        self.num_swa_groups = 0

    def step(self, qsl: torch.Tensor, seq_lens: torch.Tensor, num_input_tokens: int, num_reqs_actual: int = -1,
             capture_state=None):
        capture = capture_state is not None
        key = (num_input_tokens, num_reqs_actual, capture_state, tuple(qsl.tolist()), tuple(seq_lens.tolist()))
        if self._step is None or key != self._key or self.builder.generation != self._generation:
            self._step = None  # a rejected build leaves nothing to reuse
            if capture:
                self._step = self.builder.build_for_graph_capture(
                    qsl, seq_lens, num_reqs_actual=num_reqs_actual, num_input_tokens=num_input_tokens,
                    state=capture_state)
            else:
                self._step = self.builder.build(qsl, seq_lens, num_reqs_actual=num_reqs_actual,
                                                num_input_tokens=num_input_tokens)
            self._key, self._generation = key, self.builder.generation
        return self._step


_SHARED_STEPS: dict = {}


def _shared_step(vllm_config, device) -> _SharedStep:
    k = id(vllm_config)
    entry = _SHARED_STEPS.get(k)
    if entry is None or entry[0]() is not vllm_config:
        entry = (weakref.ref(vllm_config), _SharedStep(vllm_config, device))
        _SHARED_STEPS[k] = entry
        weakref.finalize(vllm_config, _SHARED_STEPS.pop, k, None)
    return entry[1]


@dataclass
class AscendAttnRtDsaMetadata:
    """One KV-cache group's metadata of a step (the runtime's GroupMetadata of `kind`) with the step's shared
    metadata, plus the counts vLLM reads."""

    step: object
    group: object
    kind: str
    num_actual_tokens: int
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    # SWA groups: the group's index among the config's SWA groups (the captured layers' kv_cache_group and the
    # position of its metadata in the graph update, docs/design/vllm_dsa.md §6); -1 for the other kinds.
    graph_group: int = -1

    @property
    def swa(self):
        if self.kind != "swa":
            raise AttributeError(f"swa: this is the {self.kind} group's metadata")
        return self.group


def graph_update_args(mds: list):
    """What ``aar.dsa.graph_update`` takes for a step's DeepSeek-V4 metadata (vLLM's per-layer entries of every
    group, docs/design/vllm_dsa.md §6): the one step build they read and the SWA groups' metadata in the order of
    their graph index (a captured layer is checked against the SWA group it reads). Refused by name: metadata of
    several step builds, a missing SWA group, a step with prefills."""
    step = mds[0].step
    swa = {}
    for md in mds:
        if md.step is not step:
            raise ValueError("DeepSeek-V4 metadata of several step builds in one graph update: every group's "
                             "metadata of a step reads one dsa.StepBuilder build")
        if md.kind == "swa":
            prev = swa.setdefault(md.graph_group, md)
            if prev is not md and prev.group is not md.group:
                raise ValueError(f"two SWA metadata with graph index {md.graph_group} in one graph update")
    if step.num_prefills:
        raise ValueError(f"a step with {step.num_prefills} prefill requests cannot update a decode graph bucket "
                         "(ascend_attn_rt's DeepSeek-V4 adapter captures decode-only steps)")
    missing = [k for k in range(max(swa, default=-1) + 1) if k not in swa]
    if not swa or missing:
        raise ValueError(f"the graph update has no metadata of the SWA group(s) {missing or [0]}: give vLLM's "
                         "per-layer metadata dict of the step")
    return step, [swa[k].group for k in range(len(swa))]


class _DsaGroupMetadataBuilder(GraphBuilderMixin, AttentionMetadataBuilder):
    """vLLM's CommonAttentionMetadata of one KV-cache group -> the shared dsa.StepBuilder.build (once per step)
    + this group's dsa.GroupBuilder.build over the group's block table. Graph mode (GraphBuilderMixin): the declared
    uniform single-token decode and build_for_cudagraph_capture (the step builder's build_for_graph_capture)."""

    _KIND: ClassVar[str] = ""
    reorder_batch_threshold: int | None = 1
    _spec_graphs = True  # the DSA capture takes SpecDecoding buckets (docs/design/vllm_dsa.md §6)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        _refuse_unsupported(vllm_config, "DeepSeek-V4 adapter")
        cc, mc = vllm_config.cache_config, vllm_config.model_config
        for r in sorted(_layer_ratios(mc.hf_config) - set(_RATIOS)):
            raise NotImplementedError(_reason(r))
        _refuse_fp4_indexer(vllm_config)
        _refuse_without_hybrid_manager(vllm_config)
        if cc.num_gpu_blocks is None:
            raise ValueError("cache_config.num_gpu_blocks=None: the ascend_attn_rt builder needs the block count")
        bs = _geometry(self._KIND)["block_size"]
        if kv_cache_spec.block_size != bs:
            raise ValueError(f"kv_cache_spec.block_size={kv_cache_spec.block_size}: ascend_attn_rt's DeepSeek-V4 "
                             f"{self._KIND} group takes {bs}-token blocks (docs/design/vllm_dsa.md §3)")
        self._shared = _shared_step(vllm_config, device)
        self._group = aar.dsa.GroupBuilder(self._shared.builder, kind=self._KIND, cache_block_size=_CACHE_BLOCK_SIZE,
                                           max_blocks_per_req=_cdiv(mc.max_model_len, bs),
                                           num_blocks=cc.num_gpu_blocks, device_kind="a2",
                                           model_dtype=_model_dtype_name(mc.dtype))
        self.reorder_batch_threshold = self._shared.builder.decode_threshold
        self._graph_group = -1
        if self._KIND == "swa":
            self._graph_group = self._shared.num_swa_groups
            self._shared.num_swa_groups += 1

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendAttnRtDsaMetadata:
        m = common_attn_metadata
        qsl, seq_lens, bt, causal, n_real = _padded_inputs(common_prefix_len, m, "DeepSeek-V4 adapter")
        if not causal:
            raise NotImplementedError("causal=False: non-causal DeepSeek-V4 attention is not supported by "
                                      "ascend_attn_rt's vLLM adapter")
        st = self._shared.step(qsl, seq_lens, m.num_actual_tokens, num_reqs_actual=n_real)
        return self._metadata(st, bt, m)

    def _graph_build(self, m: CommonAttentionMetadata) -> AscendAttnRtDsaMetadata:
        # vLLM's capture batch: uniform decodes of 1 (+ k speculative) tokens, every request real
        # (check_uniform_decode).
        qsl, seq_lens, bt, causal = _build_inputs(0, m)
        if not causal:
            raise NotImplementedError("causal=False: non-causal DeepSeek-V4 attention is not supported by "
                                      "ascend_attn_rt's vLLM adapter")
        st = self._shared.step(qsl, seq_lens, m.num_actual_tokens, capture_state=self._graph_state())
        return self._metadata(st, bt, m)

    def _metadata(self, st, bt, m) -> AscendAttnRtDsaMetadata:
        g = self._group.build(st, bt)
        return AscendAttnRtDsaMetadata(step=st, group=g, kind=self._KIND, num_actual_tokens=m.num_actual_tokens,
                                       num_reqs=m.num_reqs, num_decodes=st.num_decodes,
                                       num_decode_tokens=st.num_decode_tokens, num_prefills=st.num_prefills,
                                       num_prefill_tokens=st.num_prefill_tokens, graph_group=self._graph_group)


class AscendAttnRtDsaSwaMetadataBuilder(_DsaGroupMetadataBuilder):
    """The SWA group of DeepSeek-V4 layers (vLLM's DeepseekV4SWACache)."""

    _KIND = "swa"


class AscendAttnRtDsaC128KvMetadataBuilder(_DsaGroupMetadataBuilder):
    """The compressed-KV group of C128 layers (the attention layer's own cache)."""

    _KIND = "c128_kv"


class AscendAttnRtDsaC128StateMetadataBuilder(_DsaGroupMetadataBuilder):
    """The compressor-state group of C128 layers (vLLM's CompressorStateCache of the layer's compressor)."""

    _KIND = "c128_state"


class AscendAttnRtDsaC4KvMetadataBuilder(_DsaGroupMetadataBuilder):
    """The compressed-KV group of C4 layers (the attention layer's own cache)."""

    _KIND = "c4_kv"


class AscendAttnRtDsaC4AttnStateMetadataBuilder(_DsaGroupMetadataBuilder):
    """The main compressor's state group of C4 layers."""

    _KIND = "c4_attn_state"


class AscendAttnRtDsaC4IndexerKMetadataBuilder(_DsaGroupMetadataBuilder):
    """The indexer-key group of C4 layers (vLLM's DeepseekV4IndexerCache of the layer's indexer)."""

    _KIND = "c4_indexer_k"


class AscendAttnRtDsaC4IndexerStateMetadataBuilder(_DsaGroupMetadataBuilder):
    """The indexer compressor's state group of C4 layers."""

    _KIND = "c4_indexer_state"


class _DsaCacheBackend(AttentionBackend):
    """A DeepSeek-V4 cache of kind _KIND with the runtime's geometry; its builder runs that kind's GroupBuilder."""

    _KIND: ClassVar[str] = ""
    _BUILDER: ClassVar[type] = _DsaGroupMetadataBuilder
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @classmethod
    def get_impl_cls(cls):
        raise NotImplementedError(f"the DeepSeek-V4 {cls._KIND} cache has no attention impl "
                                  "(AscendAttnRtDsaAttention.forward reads it)")

    @classmethod
    def get_builder_cls(cls):
        return cls._BUILDER

    @classmethod
    def get_supported_kernel_block_sizes(cls):
        return [_geometry(cls._KIND)["block_size"]]

    @classmethod
    def get_kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        """(num_blocks, rows per page, head_size). vLLM's reshape passes a compressed group's rows per page (its
        storage_block_size) as block_size, an uncompressed group's kernel block size; its layout probe
        (get_kv_cache_block_dim) passes the kernel block size of either: both are taken."""
        if cache_dtype_str not in _KV_CACHE_DTYPES:
            raise ValueError(f"cache_dtype_str={cache_dtype_str!r} is not supported by ascend_attn_rt's DeepSeek-V4 "
                             f"{cls._KIND} cache")
        if num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: the DeepSeek-V4 {cls._KIND} cache has one KV head")
        g = _geometry(cls._KIND)
        rows = g["storage_block_size"]
        if block_size not in (rows, g["block_size"]):
            raise ValueError(f"block_size={block_size}: ascend_attn_rt's DeepSeek-V4 {cls._KIND} cache takes "
                             f"{g['block_size']}-token blocks of {rows} rows")
        return (num_blocks, rows, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (0, 1, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []


class AscendAttnRtDsaSwaBackend(_DsaCacheBackend):
    """The SWA cache of a DeepSeek-V4 layer: (num_blocks, 64, head_dim) plain rows in the model dtype."""

    _KIND = "swa"
    _BUILDER = AscendAttnRtDsaSwaMetadataBuilder


class AscendAttnRtDsaC128KvBackend(_DsaCacheBackend):
    """The compressed KV of a C128 layer: (num_blocks, 64, head_dim) rows in the model dtype, 8192 raw tokens per
    block."""

    _KIND = "c128_kv"
    _BUILDER = AscendAttnRtDsaC128KvMetadataBuilder


class AscendAttnRtDsaC128StateBackend(_DsaCacheBackend):
    """The compressor state of a C128 layer: (num_blocks, 16, 2 head_dim) fp32 [kv | score] per raw position."""

    _KIND = "c128_state"
    _BUILDER = AscendAttnRtDsaC128StateMetadataBuilder


class AscendAttnRtDsaC4KvBackend(_DsaCacheBackend):
    """The compressed KV of a C4 layer: (num_blocks, 64, head_dim) rows in the model dtype, 256 raw tokens per
    block."""

    _KIND = "c4_kv"
    _BUILDER = AscendAttnRtDsaC4KvMetadataBuilder


class AscendAttnRtDsaC4AttnStateBackend(_DsaCacheBackend):
    """The main compressor state of a C4 layer: (num_blocks, 4, 4 head_dim) fp32 (overlap 2)."""

    _KIND = "c4_attn_state"
    _BUILDER = AscendAttnRtDsaC4AttnStateMetadataBuilder


class AscendAttnRtDsaC4IndexerKBackend(_DsaCacheBackend):
    """The indexer keys of a C4 layer: (num_blocks, 64, index_head_dim + 2) bytes per page, laid out as the
    runtime's page [64 int8 key rows | 64 fp16 scales] (the layer views them)."""

    _KIND = "c4_indexer_k"
    _BUILDER = AscendAttnRtDsaC4IndexerKMetadataBuilder


class AscendAttnRtDsaC4IndexerStateBackend(_DsaCacheBackend):
    """The indexer compressor state of a C4 layer: (num_blocks, 4, 4 index_head_dim) fp32."""

    _KIND = "c4_indexer_state"
    _BUILDER = AscendAttnRtDsaC4IndexerStateMetadataBuilder


def _weights_from_layer(layer) -> dict:
    """The runtime's weight dict from vLLM's parameters, through dsa.weights_from_checkpoint (DeepSeek's names):
    views of vLLM's tensors except wo_a, which that reader re-lays out per group once."""
    w = layer.fused_wqa_wkv.weight
    linears = ["fused_wqa_wkv", "wq_b", "wo_a", "wo_b"]
    if layer.compressor is not None:
        linears.append("compressor.fused_wkv_wgate")
    if layer.indexer is not None:
        linears += ["indexer.wq_b", "indexer.weights_proj", "indexer.compressor.fused_wkv_wgate"]
    for name in linears:
        p = layer.get_submodule(name).weight
        if p.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise NotImplementedError(f"{name}.weight dtype {p.dtype}: a quantised DeepSeek-V4 checkpoint is not "
                                      "supported by ascend_attn_rt's vLLM adapter")
    sink = layer.attn_sink[: layer.n_local_heads]
    state = {"wq_a.weight": w[: layer.q_lora_rank], "wkv.weight": w[layer.q_lora_rank:],
             "q_norm.weight": layer.q_norm.weight, "wq_b.weight": layer.wq_b.weight,
             "kv_norm.weight": layer.kv_norm.weight, "attn_sink": sink, "wo_a.weight": layer.wo_a.weight,
             "wo_b.weight": layer.wo_b.weight}
    def compressor(c, name):
        fused = c.fused_wkv_wgate.weight  # [wkv | wgate] rows, coff D each (vLLM's MergedColumnParallelLinear)
        n = c.coff * c.head_dim
        state.update({f"{name}.wkv.weight": fused[:n], f"{name}.wgate.weight": fused[n:],
                      f"{name}.norm.weight": c.norm.weight, f"{name}.ape": c.ape})

    if layer.compressor is not None:
        compressor(layer.compressor, "compressor")
    cfg = dict(hidden_size=layer.hidden_size, num_heads=layer.n_heads, head_dim=layer.head_dim,
               q_lora_rank=layer.q_lora_rank, compress_ratio=layer.compress_ratio, o_groups=layer.n_groups,
               o_lora_rank=layer.o_lora_rank)
    if layer.indexer is not None:
        ix = layer.indexer
        compressor(ix.compressor, "indexer.compressor")
        state.update({"indexer.wq_b.weight": ix.wq_b.weight, "indexer.weights_proj.weight": ix.weights_proj.weight})
        cfg.update(index_n_heads=ix.n_head, index_head_dim=ix.head_dim)
    return aar.dsa.weights_from_checkpoint(state, "", **cfg)


# Impl.forward's group argument of each cache kind (docs/design/dsa.md §3.3).
_ROUTE_SLOT = {"c4_kv": "attention", "c128_kv": "attention", "c4_attn_state": "compressor_state",
               "c128_state": "compressor_state", "c4_indexer_k": "indexer_cache", "c4_indexer_state": "indexer_state"}


def _indexer_views(page: torch.Tensor, index_head_dim: int):
    """The runtime's indexer key and scale views over vLLM's indexer cache (num_blocks, rows, Di + 2) bytes (any
    page stride): per page `rows` int8 key rows of Di bytes, then `rows` fp16 scales (docs/design/dsa.md §2.2),
    shapes (num_blocks, rows, 1, Di) and (num_blocks, rows, 1)."""
    nb, rows, width = page.shape
    if page.dtype != torch.uint8 or width != index_head_dim + 2 or page.stride(2) != 1 or page.stride(1) != width:
        raise ValueError(f"the C4 indexer cache must be vLLM's (num_blocks, rows, {index_head_dim + 2}) uint8 pages "
                         f"with contiguous rows, got {tuple(page.shape)} {page.dtype} strides {page.stride()}")
    stride, off = page.stride(0), page.storage_offset()
    if stride % 2 or off % 2:
        raise ValueError(f"the C4 indexer cache's page stride {stride} / offset {off} must be even (fp16 scales)")
    k = page.view(torch.int8).as_strided((nb, rows, 1, index_head_dim), (stride, index_head_dim, index_head_dim, 1),
                                         off)
    scale = page.view(torch.float16).as_strided((nb, rows, 1), (stride // 2, 1, 1),
                                                (off + rows * index_head_dim) // 2)
    return k, scale


def _make_attention_cls():
    from vllm.forward_context import get_forward_context
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    class AscendAttnRtDsaAttention(DeepseekV4Attention):
        """vLLM's DeepseekV4Attention whose forward is one dsa.Impl.forward (SWA-only and C128 layers)."""

        backend_cls = AscendAttnRtDsaSwaBackend
        use_fp8_ds_mla_layout = False

        @classmethod
        def get_padded_num_q_heads(cls, num_heads: int) -> int:
            return num_heads  # the runtime's operators take the real head count

        def __init__(self, vllm_config, prefix: str, topk_indices_buffer=None, aux_stream_list=None,
                     eager_scratch_pool=None) -> None:
            from vllm.model_executor.models.utils import extract_layer_index

            hf = vllm_config.model_config.hf_config
            layer_id = extract_layer_index(prefix)
            ratio = max(1, int(hf.compress_ratios[layer_id])) if layer_id < hf.num_hidden_layers else 1
            if ratio not in _RATIOS:
                raise NotImplementedError(f"{prefix}: " + _reason(ratio))
            _refuse_unsupported(vllm_config, "DeepSeek-V4 adapter")
            if ratio == 4:
                _refuse_fp4_indexer(vllm_config)
            if vllm_config.quant_config is not None:
                raise NotImplementedError(f"quantization={vllm_config.quant_config.get_name()!r}: a quantised "
                                          "DeepSeek-V4 checkpoint is not supported by ascend_attn_rt's vLLM adapter")
            super().__init__(vllm_config, prefix, topk_indices_buffer, aux_stream_list, eager_scratch_pool)
            # Every cache layer of this layer gets the runtime's spec (geometry, page size, dtype: plain rows in the
            # model dtype where vLLM's resolution gives bf16 for "auto") and the runtime's backend of its kind.
            swa = self.swa_cache_layer
            dtype = vllm_config.model_config.dtype
            swa.dtype = dtype
            window = swa.window_size
            swa.get_kv_cache_spec = lambda cfg: _swa_spec(cfg, window)
            swa.get_attn_backend = lambda: AscendAttnRtDsaSwaBackend
            self._kinds = aar.dsa.layer_cache_kinds(self.compress_ratio)
            for kind, cache in self._cache_layers().items():
                if kind in _STATE_KINDS:
                    cache.get_kv_cache_spec = lambda cfg, k=kind: _state_spec(k, cfg)
                elif kind == "c4_indexer_k":
                    cache.get_kv_cache_spec = lambda cfg, k=kind: _compressed_spec(k, cfg)
                if kind not in ("swa", "c4_kv", "c128_kv"):
                    cache.get_attn_backend = lambda k=kind: _BACKEND_OF[k]
            self._model_dtype = _model_dtype_name(dtype)
            self._impl = None
            self._impl_key = None
            self._kv_key = self._kv = None
            # Graph mode (docs/design/vllm_dsa.md §6): the index of the SWA group the layer reads (its Impl's
            # kv_cache_group, from the metadata), and the graph store its Impl was captured in.
            self._kv_cache_group = 0
            self._captured_store = None

        def _cache_layers(self) -> dict:
            """{cache kind: the vLLM layer holding it} in the runtime's order for the layer's ratio
            (aar.dsa.layer_cache_kinds): the SWA cache layer, the layer itself (compressed KV), the compressor's
            state cache, the indexer's key cache and its compressor's state cache."""
            layers = {"swa": self.swa_cache_layer}
            if self.compressor is not None:
                layers["c4_kv" if self.compress_ratio == 4 else "c128_kv"] = self
                layers["c4_attn_state" if self.compress_ratio == 4 else "c128_state"] = self.compressor.state_cache
            if self.indexer is not None:
                layers["c4_indexer_k"] = self.indexer.k_cache
                layers["c4_indexer_state"] = self.indexer.compressor.state_cache
            return {k: layers[k] for k in self._kinds}

        def get_kv_cache_spec(self, vllm_config):
            # SWA-only layers: the SWA cache layer is the only cache. Compressed layers: the compressed KV (C4:
            # 256 raw tokens, C128: 8192, 64 rows per block either way).
            if self.compress_ratio == 1:
                return None
            return _compressed_spec("c4_kv" if self.compress_ratio == 4 else "c128_kv", vllm_config)

        def get_attn_backend(self):
            return _BACKEND_OF[{1: "swa", 4: "c4_kv", 128: "c128_kv"}[self.compress_ratio]]

        def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
            """vLLM's hook after (re)loading weights: the runtime's layer is remade from the loaded parameters
            (the per-group wo_a re-layout is a copy, so an in-place reload must reach it)."""
            self._impl = None
            self._layer_impl()

        def _params(self):
            ps = [self.fused_wqa_wkv.weight, self.q_norm.weight, self.wq_b.weight, self.kv_norm.weight,
                  self.attn_sink, self.wo_a.weight, self.wo_b.weight]
            for c in (self.compressor, None if self.indexer is None else self.indexer.compressor):
                if c is not None:
                    ps += [c.fused_wkv_wgate.weight, c.norm.weight, c.ape]
            if self.indexer is not None:
                ps += [self.indexer.wq_b.weight, self.indexer.weights_proj.weight]
            return ps

        def _layer_impl(self):
            # Made by process_weights_after_loading or at the first forward, and remade when a weight tensor is
            # replaced or written in place through autograd-visible ops (its version counter moves), or when the
            # layer's SWA group index (graph mode) is first known.
            key = (self._kv_cache_group,) + tuple((p.data_ptr(), p._version) for p in self._params())
            if self._impl is None or key != self._impl_key:
                store = self._captured_store
                if self._impl is not None and store is not None and store.buckets():
                    # The captured call holds the old Impl (its weights, its group): replaying it would attend
                    # with what the layer no longer has.
                    raise NotImplementedError(
                        f"{self.prefix}: the layer's weights or KV-cache group changed after its graph capture "
                        f"(buckets {store.buckets()} still hold the old layer): release them "
                        "(ascend_attn_rt.vllm.graph.set_graph_provider or clear_graph_provider) and capture again")
                kw = {}
                if self.indexer is not None:
                    kw = dict(index_n_heads=self.indexer.n_head, index_head_dim=self.indexer.head_dim,
                              index_topk=self.indexer.topk_tokens)
                self._impl = aar.dsa.Impl(
                    _weights_from_layer(self), hidden_size=self.hidden_size, num_heads=self.n_heads,
                    head_dim=self.head_dim, rope_dim=self.rope_head_dim, q_lora_rank=self.q_lora_rank,
                    window=self.window_size, compress_ratio=self.compress_ratio, eps=self.eps,
                    o_groups=self.n_groups, o_lora_rank=self.o_lora_rank, device_kind="a2",
                    model_dtype=self._model_dtype, kv_cache_group=self._kv_cache_group, **kw)
                self._impl_key = key
                self._captured_store = None
            return self._impl

        def _kv_tuple(self):
            # vLLM's (num_blocks, rows, head_dim) attention caches as the runtime's (num_blocks, rows, 1, head_dim)
            # views, the indexer page as its key and scale views (no copies); the compressor states as they are.
            caches = {k: layer.kv_cache for k, layer in self._cache_layers().items()}
            key = tuple((id(c), c.data_ptr()) for c in caches.values())
            if key != self._kv_key:
                kw = {}
                for k, c in caches.items():
                    if k in ("c4_kv", "c128_kv"):
                        kw["compress_kv"] = c.unsqueeze(2)
                    elif k in ("c4_attn_state", "c128_state"):
                        kw["state"] = c
                    elif k == "c4_indexer_state":
                        kw["indexer_state"] = c
                    elif k == "c4_indexer_k":
                        kw["indexer_k"], kw["indexer_scale"] = _indexer_views(c, self.indexer.head_dim)
                self._kv = aar.dsa.compose_kv_cache(swa_kv=caches["swa"].unsqueeze(2), model_dtype=self._model_dtype,
                                                    **kw)
                self._kv_key = key
            return self._kv

        def _metadata(self, md: dict, name: str, kind: str) -> AscendAttnRtDsaMetadata:
            meta = md.get(name)
            if not isinstance(meta, AscendAttnRtDsaMetadata) or meta.kind != kind:
                raise ValueError(f"metadata of {name!r} is {type(meta).__name__}"
                                 f"{'' if not isinstance(meta, AscendAttnRtDsaMetadata) else ' of ' + meta.kind}: "
                                 f"the {kind} cache must use {_BACKEND_OF[kind].__name__}")
            return meta

        def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                    llama_4_scaling: torch.Tensor | None = None) -> torch.Tensor:
            # positions are not read: the runtime derives each token's position from the step (seq_lens,
            # query_start_loc), which is how vLLM makes them.
            if llama_4_scaling is not None:
                raise NotImplementedError("llama_4_scaling is not supported by ascend_attn_rt's DeepSeek-V4 layer")
            out = torch.empty_like(hidden_states)
            ctx = get_forward_context()
            md = ctx.attn_metadata
            if isinstance(md, list):
                md = md[0]
            if not isinstance(md, dict):  # vLLM's profiling run
                self._layer_impl()
                return out.zero_()
            meta = {k: self._metadata(md, layer.prefix, k) for k, layer in self._cache_layers().items()}
            swa = meta["swa"]
            mode = getattr(ctx, "cudagraph_runtime_mode", None)
            if mode is not None and getattr(mode, "name", str(mode)) == "FULL":
                # vLLM's full graphs are of decode batches only (FULL_DECODE_ONLY, docs/design/vllm_dsa.md §6).
                if graph_params() is None:
                    raise NotImplementedError("cudagraph_runtime_mode=FULL without a graph provider: call "
                                              "ascend_attn_rt.vllm.graph.set_graph_provider first")
                if swa.num_prefills:
                    raise NotImplementedError(
                        f"cudagraph_runtime_mode=FULL with {swa.num_prefills} prefill requests "
                        f"({swa.num_prefill_tokens} tokens): ascend_attn_rt's DeepSeek-V4 adapter captures and "
                        "replays decode-only steps (FULL_DECODE_ONLY)")
            if swa.graph_group < 0:
                raise ValueError(f"metadata of {self.swa_cache_layer.prefix!r} has no SWA group index")
            self._kv_cache_group = swa.graph_group
            impl = self._layer_impl()
            groups = {}
            for k, m in meta.items():
                if k != "swa":
                    groups[_ROUTE_SLOT[k]] = m.group
            kv = self._kv_tuple()

            def call(hidden_states, out):
                impl.forward(hidden_states, kv, swa.step, swa.group, out, **groups)
                store = capturing_store()
                if store is not None:  # the recorded call holds this Impl (_layer_impl's check)
                    self._captured_store = store

            if not in_wrapper_run():
                call(hidden_states, out)
                return out
            # The layer's one runtime call; under vLLM's graph wrapper on the recording provider a segment of its
            # own: the hidden states copied into its static input, the output copied from its static output, the
            # caches fixed (docs/design/vllm_dsa.md §6.1, vllm_sparse.md §6.1).
            run_segment("DeepSeek-V4 layer", call, dict(hidden_states=hidden_states), dict(out=out),
                        fixed=tuple(layer.kv_cache for layer in self._cache_layers().values()))
            return out

        def forward_mqa(self, q, kv, positions, output) -> None:
            raise NotImplementedError("forward_mqa: AscendAttnRtDsaAttention.forward runs the whole layer")

        def _o_proj(self, o, positions):
            raise NotImplementedError("_o_proj: AscendAttnRtDsaAttention.forward runs the whole layer")

    return AscendAttnRtDsaAttention


_BACKEND_OF = {"swa": AscendAttnRtDsaSwaBackend, "c128_kv": AscendAttnRtDsaC128KvBackend,
               "c128_state": AscendAttnRtDsaC128StateBackend, "c4_kv": AscendAttnRtDsaC4KvBackend,
               "c4_attn_state": AscendAttnRtDsaC4AttnStateBackend, "c4_indexer_k": AscendAttnRtDsaC4IndexerKBackend,
               "c4_indexer_state": AscendAttnRtDsaC4IndexerStateBackend}


_ATTENTION_CLS = None


def attention_cls():
    """The DeepseekV4Attention subclass (made on first use: it subclasses vLLM's class)."""
    global _ATTENTION_CLS
    if _ATTENTION_CLS is None:
        _ATTENTION_CLS = _make_attention_cls()
    return _ATTENTION_CLS


def install_attention_selection() -> None:
    """Wraps vLLM's _select_dsv4_attn_cls: with --attention-backend CUSTOM it returns AscendAttnRtDsaAttention,
    otherwise vLLM's choice. Idempotent."""
    import vllm.models.deepseek_v4 as v4

    mod = sys.modules[v4.DeepseekV4ForCausalLM.__module__]
    original = getattr(mod, "_select_dsv4_attn_cls", None)
    if original is None:
        raise NotImplementedError(f"{mod.__name__} has no _select_dsv4_attn_cls (vLLM's ROCm / XPU DeepSeek-V4 "
                                  "model): ascend_attn_rt's DeepSeek-V4 adapter replaces that selection only")
    if getattr(original, "_ascend_attn_rt", False):
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    def _select_dsv4_attn_cls(vllm_config):
        if vllm_config.attention_config.backend == AttentionBackendEnum.CUSTOM:
            return attention_cls()
        return original(vllm_config)

    _select_dsv4_attn_cls._ascend_attn_rt = True
    _select_dsv4_attn_cls._original = original
    mod._select_dsv4_attn_cls = _select_dsv4_attn_cls
