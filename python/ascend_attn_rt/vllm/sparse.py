"""vLLM adapter for DeepSeek-V3.2 / GLM-DSA sparse MLA (docs/design/vllm_sparse.md).

Three pieces, each behind the vLLM object that calls it:

* ``AscendAttnRtSparseAttnIndexer`` replaces vLLM's ``SparseAttnIndexer`` custom op (through
  ``CustomOp.register_oot``): vLLM's ``Indexer`` module computes the indexer query, key and head
  weights and calls it; one C++ call (``sfa.IndexerStep.run``) writes the key rows into the indexer
  cache at the step's slots and runs the runtime's lightning indexer, storing the per-token top-k
  (request-local positions, ``-1`` padded) into the model's shared ``topk_indices_buffer``.
* ``AscendAttnRtIndexerBackend`` (+ ``AscendAttnRtIndexerMetadataBuilder``) is the backend of the
  indexer-cache layers: the cache is unquantised keys ``(num_blocks, block_size, index_head_dim)``
  in the model dtype (the op re-points the layer's KV-cache spec and backend to these when it is
  made), the metadata the runtime's ``sfa.Metadata`` of the step.
* ``AscendAttnRtSparseMlaBackend`` (+ builder, ``AscendAttnRtSparseMlaImpl``) is the sparse MLA
  attention: vLLM's ``MLAAttention.forward_impl`` sends every token to ``forward_mqa`` (absorbed
  query), one C++ call (``sfa.SparseAttention.run``): the runtime's sparse flash attention over the
  top-k rows the indexer stored; the latent cache is vLLM's ``(num_blocks, block_size, kv_lora_rank +
  qk_rope_head_dim)``. The per-layer host work (argument checks, the cache write, the operator calls
  through the runtime's provider) is C++ (docs/design/sfa.md §4.5).

Decode context parallel (docs/design/vllm_sparse.md §8): under ``decode_context_parallel_size > 1`` both
builders build the runtime's SFA DCP metadata from vLLM's DCP group (local slots and lengths, the replicated
indexer views); the indexer cache is replicated (the page of its KV-cache spec is ``W`` pages of keys, viewed as the
runtime's ``num_blocks * W`` blocks) and the op needs no collective; the impl's ``sfa.SparseAttention`` holds
an ``aar.cp.Comm`` over the group and gathers the query, remaps the top-k, attends the shard and merges by LSE
inside ``forward_mqa`` (vLLM's layer is shown ``dcp_world_size = 1``, as the MLA impl does).

Refused by name when the objects are made: prefill context parallelism (PCP), quantised KV caches
(fp8 / fp8_ds_mla), DeepSeek-V4 (compressed indexer), graph modes other than FULL_DECODE_ONLY
(cudagraph_mode), and for the op torch.compile (it runs eagerly); per step: non-causal attention, a
FULL cudagraph runtime mode without a graph provider (docs/design/vllm_sparse.md §4, §6 for graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MLAAttentionImpl,
)

from .. import _C as aar
from . import _build_inputs, _builder_sizes, _check_decode_padding, _latent_kv_cache_update
from .dcp import dcp_setup, take_over_dcp
from .graph import GraphBuilderMixin, graph_params, in_wrapper_run, run_segment

_KV_CACHE_DTYPES = ["auto", "float16", "bfloat16"]


def _refuse_graphs(vllm_config, what: str, compiled: bool) -> None:
    """Graph modes other than full graphs of decodes (piecewise graphs need torch.compile of the
    model, which the indexer op refuses), and (for code vLLM's compiler would trace: the indexer op)
    torch.compile."""
    cc = vllm_config.compilation_config
    mode = getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode))
    if mode not in ("NONE", "FULL_DECODE_ONLY"):
        raise NotImplementedError(f"compilation_config.cudagraph_mode={mode}: graph capture is not supported by "
                                  f"ascend_attn_rt's {what} (use FULL_DECODE_ONLY, or enforce_eager=True)")
    if compiled and int(cc.mode) != 0:
        raise NotImplementedError(f"compilation_config.mode={int(cc.mode)}: the {what} runs eagerly, outside "
                                  "torch.compile (use enforce_eager=True)")


def _sparse_builder(kv_cache_spec, vllm_config, device):
    mc = vllm_config.model_config
    hf = mc.hf_text_config
    if getattr(hf, "index_topk", None) is None:
        raise ValueError(f"model {mc.model!r} has no index_topk: not a sparse (DeepSeek-V3.2 / GLM-DSA) model")
    if getattr(hf, "compress_ratios", None):
        raise NotImplementedError("compress_ratios (DeepSeek-V4 compressed indexer) is not supported by "
                                  "ascend_attn_rt's sparse MLA adapter")
    _refuse_graphs(vllm_config, "sparse MLA adapter", compiled=False)
    spec = getattr(vllm_config, "speculative_config", None)
    num_spec = 0 if spec is None else int(spec.num_speculative_tokens or 0)
    sizes = _builder_sizes(kv_cache_spec, vllm_config, dcp_ok=True)  # PCP refused by name
    # DCP (docs/design/vllm_sparse.md §8): this rank's build of the global batch (local slots and KV lengths
    # for the latent cache, the replicated indexer views, the global lengths for the indexer).
    dcp = dcp_setup(vllm_config, "sparse MLA builder")
    cp = {} if dcp is None else dict(dcp_world_size=dcp.world_size, dcp_rank=dcp.rank,
                                     cp_kv_cache_interleave_size=dcp.interleave)
    # vLLM rotates q, k_pe and the indexer's q/k itself: zero RoPE tables (nothing reads them).
    table = torch.zeros(mc.max_model_len, int(hf.qk_rope_head_dim), dtype=mc.dtype)
    # graph_decode_padding: vLLM's full-graph padding requests become the runtime's dummy decodes
    # (docs/design/vllm_sparse.md §6); a decode-only build is padded only when vLLM padded the step.
    return aar.sfa.MetadataBuilder(**sizes, cos_table=table, sin_table=table, num_speculative_tokens=num_spec,
                                   graph_decode_padding=True, device=str(device), **cp)


@dataclass
class AscendAttnRtSparseMlaMetadata:
    """The runtime's sfa.Metadata of a step plus the counts vLLM's MLAAttention.forward_impl reads."""

    sfa: object
    num_actual_tokens: int
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    prefill_max_seq_len: int
    topk_tokens: int


def _is_prefilling(m: CommonAttentionMetadata, qsl, threshold: int, dcp: bool = False):
    """vLLM's is_prefilling (always given by its model runner) as the SFA builder takes it. The
    builder without KV offload splits by query length only and refuses the flags: they are dropped
    when the split is the same (no request flagged prefilling has a decode-sized query), refused by
    name otherwise. Under DCP they are dropped: every token, decode or prefill, takes the same road
    (query gather, remap, shard attention, merge; docs/design/vllm_sparse.md §8), so the split is
    informational there (vLLM's forward_impl sends every token of the sparse impl to forward_mqa)."""
    flags = m.is_prefilling
    if flags is None or dcp:
        return None
    n = qsl.numel() - 1
    q_lens = (qsl[1:] - qsl[:-1]).tolist()
    short = [i for i, f in enumerate(flags[:n].tolist()) if f and q_lens[i] <= threshold]
    if short:
        raise NotImplementedError(f"is_prefilling marks requests {short} with decode-sized queries (short extends) as "
                                  "prefills: ascend_attn_rt's SFA builder without KV offload splits by query length "
                                  "only")
    return None


def _build(builder, topk: int, common_prefix_len: int, m: CommonAttentionMetadata,
           graph_state=None, dcp: bool = False) -> AscendAttnRtSparseMlaMetadata:
    qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
    if not causal:
        raise NotImplementedError("causal=False: non-causal sparse MLA is not supported by ascend_attn_rt")
    _check_decode_padding(m, qsl, builder.decode_threshold, "sparse MLA builder")
    if graph_state is not None:
        md = builder.build_for_graph_capture(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                             state=graph_state)
    else:
        md = builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                           is_prefilling=_is_prefilling(m, qsl, builder.decode_threshold, dcp))
    nd = md.num_decodes
    return AscendAttnRtSparseMlaMetadata(
        sfa=md, num_actual_tokens=m.num_actual_tokens, num_reqs=m.num_reqs, num_decodes=nd,
        num_decode_tokens=md.num_decode_tokens, num_prefills=md.num_prefills, num_prefill_tokens=md.num_prefill_tokens,
        prefill_max_seq_len=int(seq_lens[nd:].max()) if md.num_prefills else 0, topk_tokens=topk)


class _SparseBuilderBase(GraphBuilderMixin, AttentionMetadataBuilder):
    reorder_batch_threshold: int | None = 1
    _spec_graphs = True  # the SFA capture takes SpecDecoding buckets (docs/design/vllm_sparse.md §6)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._builder = _sparse_builder(kv_cache_spec, vllm_config, device)
        self._dcp = dcp_setup(vllm_config, "sparse MLA builder") is not None
        self._topk = int(vllm_config.model_config.hf_text_config.index_topk)
        self.reorder_batch_threshold = self._builder.decode_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendAttnRtSparseMlaMetadata:
        return _build(self._builder, self._topk, common_prefix_len, common_attn_metadata, dcp=self._dcp)

    def _graph_build(self, m: CommonAttentionMetadata) -> AscendAttnRtSparseMlaMetadata:
        return _build(self._builder, self._topk, 0, m, graph_state=self._graph_state())


class AscendAttnRtSparseMlaMetadataBuilder(_SparseBuilderBase):
    """vLLM's CommonAttentionMetadata -> the runtime's sfa.Metadata (one C++ build per step)."""


class AscendAttnRtIndexerMetadataBuilder(_SparseBuilderBase):
    """The indexer group's builder: the same sfa.Metadata from the same CommonAttentionMetadata
    (vLLM hands the indexer op its own group's metadata, keyed by the indexer cache's name)."""


class AscendAttnRtSparseMlaBackend(AttentionBackend):
    """Sparse MLA (DeepSeek-V3.2 / GLM-DSA): the latent cache, block sizes, dtypes for vLLM."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = _KV_CACHE_DTYPES
    forward_includes_kv_cache_update: bool = False  # vLLM's MLAAttention calls do_kv_cache_update

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return AscendAttnRtSparseMlaImpl

    @staticmethod
    def get_builder_cls():
        return AscendAttnRtSparseMlaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes():
        return list(aar.sfa.Backend.supported_block_sizes())

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if cache_dtype_str not in _KV_CACHE_DTYPES:
            raise ValueError(f"cache_dtype_str={cache_dtype_str!r} is not supported by ascend_attn_rt's sparse MLA")
        if num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: an MLA latent cache has one KV head")
        if not aar.sfa.Backend.is_builder_block_size(block_size):
            raise ValueError(f"block_size={block_size} is not supported by ascend_attn_rt's sparse MLA "
                             f"(allocate {list(aar.sfa.Backend.supported_block_sizes())})")
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (0, 1, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any kv_lora_rank + qk_rope_head_dim

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True


class AscendAttnRtIndexerBackend(AttentionBackend):
    """The indexer-cache layers' backend: unquantised keys (num_blocks, block_size, index_head_dim)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_ATTN_RT_INDEXER"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the indexer cache has no attention impl (the indexer op reads it)")

    @staticmethod
    def get_builder_cls():
        return AscendAttnRtIndexerMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes():
        return list(aar.sfa.Backend.supported_block_sizes())

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: the indexer cache has one key head")
        if not aar.sfa.Backend.is_builder_block_size(block_size):
            raise ValueError(f"block_size={block_size} is not supported by ascend_attn_rt's indexer cache")
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (0, 1, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []


class AscendAttnRtSparseMlaImpl(MLAAttentionImpl):
    """vLLM's sparse MLA impl interface: every token through forward_mqa (sparse attention over the
    top-k rows the indexer op stored)."""

    is_sparse: bool = True
    supports_dense_mha_prefill: bool = False  # vLLM's forward_impl then sends every token to forward_mqa
    masked_mha_available: bool = False
    supports_quant_query_input: bool = False
    # DCP (docs/design/vllm_sparse.md §8): the runtime gathers the query over the DCP group and merges the
    # partials by LSE inside forward_mqa, so vLLM's MLAAttention.forward_impl is shown dcp_world_size = 1
    # (the group's size is runtime_dcp_world_size), as the MLA impl does.
    supports_dcp: bool = True
    supports_pcp: bool = False
    can_return_lse_for_decode: bool = False
    # Every token takes the same road (one top-k row per token, the remap, the merge): any interleave.
    supports_mtp_with_cp_non_trivial_interleave_size: bool = True

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, alibi_slopes,
                 sliding_window: Optional[int], kv_cache_dtype: str, logits_soft_cap: Optional[float],
                 attn_type: str, kv_sharing_target_layer_name: Optional[str], q_lora_rank: Optional[int],
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int, qk_head_dim: int,
                 v_head_dim: int, kv_b_proj, indexer: object | None = None,
                 topk_indices_buffer: Optional[torch.Tensor] = None, q_pad_num_heads: Optional[int] = None,
                 **kwargs) -> None:
        refused = dict(kwargs)
        for name, value, default in (("alibi_slopes", alibi_slopes, None), ("sliding_window", sliding_window, None),
                                     ("logits_soft_cap", logits_soft_cap, None),
                                     ("kv_sharing_target_layer_name", kv_sharing_target_layer_name, None),
                                     ("q_pad_num_heads", q_pad_num_heads, None), ("num_kv_heads", num_kv_heads, 1)):
            if not (value is default or (not isinstance(value, torch.Tensor) and value == default)):
                refused[name] = value
        at = attn_type.value if isinstance(attn_type, AttentionType) else str(attn_type)
        if at != AttentionType.DECODER.value:
            refused["attn_type"] = at
        if refused:
            raise NotImplementedError(f"arguments not supported by ascend_attn_rt's sparse MLA impl: {refused}")
        if kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise NotImplementedError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported by ascend_attn_rt's "
                                      "sparse MLA impl")
        if self.pcp_world_size > 1:
            raise NotImplementedError(f"prefill context parallel through the vLLM adapter (pcp_world_size="
                                      f"{self.pcp_world_size}) is not supported by ascend_attn_rt's sparse MLA impl")
        if head_size != kv_lora_rank + qk_rope_head_dim:
            raise ValueError(f"head_size={head_size} != kv_lora_rank={kv_lora_rank} + qk_rope_head_dim="
                             f"{qk_rope_head_dim}")
        buf = getattr(indexer, "topk_indices_buffer", None) if indexer is not None else topk_indices_buffer
        if buf is None:
            raise ValueError("topk_indices_buffer=None: the sparse MLA impl reads the indexer's top-k buffer")
        self.topk_indices_buffer = buf
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank, self.qk_rope_head_dim, self.v_head_dim = kv_lora_rank, qk_rope_head_dim, v_head_dim
        self.kv_b_proj = kv_b_proj
        comm = take_over_dcp(self)
        self._sparse = aar.sfa.SparseAttention(scale=self.scale, dcp_comm=comm)
        self._attn = aar.mla.LatentAttention(
            num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, scale=self.scale)
        self._split_src = self._split_key = self._split = None

    def _caches(self, kv_cache: torch.Tensor):
        key = (kv_cache.data_ptr(), kv_cache.shape)
        if self._split_src is not kv_cache or self._split_key != key:
            self._split = aar.mla.LatentAttention.split_kv_cache(kv_cache, self.kv_lora_rank)
            self._split_src, self._split_key = kv_cache, key
        return self._split

    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale) -> None:
        _latent_kv_cache_update(self, "sparse MLA", kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype)

    def forward_mha(self, *args, **kwargs) -> None:
        raise NotImplementedError("forward_mha: ascend_attn_rt's sparse MLA impl has no dense prefill "
                                  "(supports_dense_mha_prefill=False sends every token to forward_mqa)")

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata: AscendAttnRtSparseMlaMetadata, layer):
        if self.runtime_dcp_world_size > 1 and getattr(layer, "dcp_q_replicate", False):
            raise NotImplementedError("dcp_q_replicate (a query projection replicated over the DCP group) is not "
                                      "supported by ascend_attn_rt's sparse MLA impl: its DCP path gathers the heads "
                                      "itself")
        if isinstance(q, tuple):
            ql_nope, q_pe = q
        else:
            ql_nope, q_pe = q.split([self.kv_lora_rank, q.shape[-1] - self.kv_lora_rank], dim=-1)
        nope, rope = self._caches(kv_c_and_k_pe_cache)
        # The output is the runtime's (a static tensor of the segment under vLLM's graph wrapper, §6.1).
        if not in_wrapper_run():
            return self._sparse.run(ql_nope, q_pe, self.topk_indices_buffer, nope, rope, attn_metadata.sfa), None
        out = run_segment("sparse MLA forward_mqa",
                          lambda ql_nope, q_pe: self._sparse.run(ql_nope, q_pe, self.topk_indices_buffer, nope, rope,
                                                                 attn_metadata.sfa),
                          dict(ql_nope=ql_nope, q_pe=q_pe), fixed=(kv_c_and_k_pe_cache,))
        return out, None


def _make_indexer_op_cls():
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    class AscendAttnRtSparseAttnIndexer(SparseAttnIndexer):
        """vLLM's SparseAttnIndexer op over the runtime's indexer cache write and lightning indexer."""

        def __init__(self, k_cache, quant_block_size: int, scale_fmt: str, topk_tokens: int, head_dim: int,
                     max_model_len: int, max_total_seq_len: int, topk_indices_buffer: torch.Tensor,
                     skip_k_cache_insert: bool = False, use_fp4_cache: bool = False):
            torch.nn.Module.__init__(self)
            from vllm.config import get_current_vllm_config
            cfg = get_current_vllm_config()
            # DCP (docs/design/vllm_sparse.md §8): the indexer cache is replicated (every rank writes every key
            # and scores every position), so the op needs no collective; PCP is refused by name.
            dcp = dcp_setup(cfg, "indexer op")
            self.dcp_world_size = 1 if dcp is None else dcp.world_size
            _refuse_graphs(cfg, "indexer op", compiled=True)
            for name, value in (("skip_k_cache_insert", skip_k_cache_insert), ("use_fp4_cache", use_fp4_cache)):
                if value:
                    raise NotImplementedError(f"{name}=True is not supported by ascend_attn_rt's indexer")
            if topk_indices_buffer is None:
                raise ValueError("topk_indices_buffer=None: ascend_attn_rt's indexer stores its top-k there")
            self.k_cache, self.topk_tokens, self.head_dim = k_cache, int(topk_tokens), int(head_dim)
            self.topk_indices_buffer = topk_indices_buffer
            self.dense_mha_metadata_layer_name = ""
            # GLM-MoE-DSA takes torch_npu's indexer (docs/design/sfa.md §4.3); vLLM applies its RoPE pairing.
            glm = getattr(cfg.model_config.hf_text_config, "model_type", "") == "glm_moe_dsa"
            self._step = aar.sfa.IndexerStep(topk=self.topk_tokens, glm_moe_dsa=glm)
            self._forward_method = self.forward_native
            self._view_src = self._view_key = self._view = None
            # The indexer cache layer (vLLM's DeepseekV32IndexerCache) has no pluggable hook of its own:
            # re-point this layer's KV-cache spec and backend to the runtime's unquantised key cache. Under DCP
            # the cache is replicated: vLLM's block of a DCP rank holds its share of a virtual block of
            # block_size * W positions, the indexer needs all of them, so its page is W pages of keys
            # (head_size W * index_head_dim): vLLM's (num_blocks, block_size, W * D) is the runtime's
            # (num_blocks * W, block_size, D), local block b the replicated blocks b * W .. b * W + W - 1.
            dtype = cfg.model_config.dtype
            block_size = k_cache.cache_config.block_size
            width = self.head_dim * self.dcp_world_size
            k_cache.get_kv_cache_spec = lambda vllm_config: MLAAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=width, dtype=dtype)
            k_cache.get_attn_backend = lambda: AscendAttnRtIndexerBackend

        def forward_native(self, hidden_states, q_quant, k, weights):
            ctx = get_forward_context()
            md = ctx.attn_metadata
            if isinstance(md, list):
                md = md[0]
            if not isinstance(md, dict):  # vLLM's profiling run
                return self.topk_indices_buffer
            mode = getattr(ctx, "cudagraph_runtime_mode", None)
            if mode is not None and getattr(mode, "name", "") == "FULL" and graph_params() is None:
                raise NotImplementedError("cudagraph_runtime_mode=FULL without a graph provider: call "
                                          "ascend_attn_rt.vllm.graph.set_graph_provider first")
            meta = md.get(self.k_cache.prefix)
            if not isinstance(meta, AscendAttnRtSparseMlaMetadata):
                raise ValueError(f"metadata of {self.k_cache.prefix!r} is {type(meta).__name__}: the indexer cache "
                                 "layer must use AscendAttnRtIndexerBackend")
            return self.run(q_quant, k, weights, self.k_cache.kv_cache, meta)

        forward_cuda = forward_cpu = forward_oot = forward_hip = forward_xpu = forward_native

        def run(self, q, k, weights, kv_cache: torch.Tensor, metadata: AscendAttnRtSparseMlaMetadata):
            """Writes k at the step's slots, then the lightning indexer's top-k into topk_indices_buffer."""
            if isinstance(q, tuple):
                raise NotImplementedError("an FP4 (values, scales) indexer query is not supported by ascend_attn_rt")
            # One C++ call: checks, the key write at the step's slots, the indexer, the top-k rows.
            cache = self._replicated(kv_cache)
            if not in_wrapper_run():
                self._step.run(k, q, weights, cache, metadata.sfa, self.topk_indices_buffer)
                return self.topk_indices_buffer
            run_segment("sparse indexer run",
                        lambda k, q, weights: self._step.run(k, q, weights, cache, metadata.sfa,
                                                             self.topk_indices_buffer),
                        dict(k=k, q=q, weights=weights), fixed=(kv_cache,))
            return self.topk_indices_buffer

        def _replicated(self, kv_cache: torch.Tensor) -> torch.Tensor:
            """vLLM's (num_blocks, block_size, W * D) indexer cache as the runtime's replicated
            (num_blocks * W, block_size, D) (a view, made once per buffer); itself without DCP."""
            w = self.dcp_world_size
            if w == 1:
                return kv_cache
            key = (kv_cache.data_ptr(), kv_cache.shape)
            if self._view_src is not kv_cache or self._view_key != key:
                d = self.head_dim
                if kv_cache.dim() != 3 or kv_cache.shape[-1] != w * d or not kv_cache.is_contiguous():
                    raise ValueError(f"indexer cache {tuple(kv_cache.shape)} (strides {kv_cache.stride()}): under DCP "
                                     f"(dcp_world_size={w}) ascend_attn_rt's indexer takes vLLM's contiguous "
                                     f"(num_blocks, block_size, {w} * index_head_dim={w * d})")
                self._view = kv_cache.view(kv_cache.shape[0] * w, kv_cache.shape[1], d)
                self._view_src, self._view_key = kv_cache, key
            return self._view

    return AscendAttnRtSparseAttnIndexer


_INDEXER_OP_CLS = None


def indexer_op_cls():
    """The SparseAttnIndexer replacement class (made on first use: it subclasses vLLM's op)."""
    global _INDEXER_OP_CLS
    if _INDEXER_OP_CLS is None:
        _INDEXER_OP_CLS = _make_indexer_op_cls()
    return _INDEXER_OP_CLS
