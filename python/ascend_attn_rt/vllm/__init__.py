"""vLLM v1 attention-backend adapter (issue 14 part 3): GQA and MLA (backend, builder, impl);
sparse MLA (DeepSeek-V3.2 / GLM-DSA) with its indexer in ``ascend_attn_rt.vllm.sparse``
(docs/design/vllm_sparse.md), re-exported here.

Select it in vLLM with ``--attention-backend CUSTOM`` after ``register(family=...)`` (one call
per model family), or use the classes directly.

The per-step work (vLLM's ``CommonAttentionMetadata`` -> runtime metadata) runs once
in ``AscendAttnRtMetadataBuilder.build``; ``AscendAttnRtImpl.forward`` only splits the
vLLM KV-cache tensor into its key/value views and calls the C++ ``forward``.

Decisions where vLLM is silent:
* the KV cache is vLLM's ``(2, num_blocks, block_size, num_kv_heads, head_size)``; the
  runtime writes the step's K/V through views of it (no copy);
* the runtime recomputes the slot mapping from the block table (the one vLLM passes is
  not used); cascade attention (``common_prefix_len > 0``), ``output_scale`` and
  ``output_block_scale`` are refused by name;
* ``cache_config.num_gpu_blocks`` must be known when the builder is made (vLLM sets it
  before it builds the attention metadata builders).

MLA (``AscendAttnRtMlaBackend``, ``AscendAttnRtMlaMetadataBuilder``, ``AscendAttnRtMlaImpl``):
* the KV cache is vLLM's MLA shape ``(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)``
  (what ``MLAAttentionSpec`` sizes its pages for); the runtime keeps the latent and the rope
  rows in two contiguous caches, so the impl views each layer's buffer as the two caches
  split kv_lora_rank : qk_rope_head_dim (``mla.LatentAttention.split_kv_cache``), as
  vllm-ascend's model runner does. A block's rows are therefore not one contiguous range of
  the buffer: KV connectors that copy vLLM's MLA blocks as byte ranges do not fit this layout;
* vLLM applies RoPE before attention (``MLAAttention`` gets the rotated ``q``/``k_pe``), so
  the runtime's RoPE rows are not needed: the builder is given zero cos/sin tables and the
  metadata's RoPE rows are zeros (nothing in the adapter reads them);
* the impl is the runtime's attention-only ``mla.LatentAttention``: vLLM's layer does the
  projections, the W_UK absorption of the decode query and W_UV on the decode output;
  ``do_kv_cache_update`` writes at vLLM's slot mapping (negative slots skipped);
  ``forward_mqa`` runs the latent decode and returns no LSE (under DCP the runtime has merged
  the partials already, see below; PCP is refused when the impl is made); ``forward_mha`` runs
  the prefill with its cached context chunks, reading ``kv_b_proj.weight`` at each call (a
  quantised kv_b_proj is refused).

Decode context parallel (GQA and MLA; ``ascend_attn_rt.vllm.dcp``, docs/design/vllm_sparse.md §7): with
``decode_context_parallel_size > 1`` the builders read vLLM's DCP group and
``cp_kv_cache_interleave_size`` and build this rank's metadata (``aar.DcpMetadataBuilder``, the MLA
builder's DCP mode); the impls hold an ``aar.cp.Comm`` over the group's ``device_group`` and do the
query gather and the LSE merge inside (``aar.DcpAttentionImpl``, ``mla.LatentAttention(dcp_comm=...)``).
Graph mode under DCP as without it (decode buckets: the collectives run inside each replay); prefill
context parallel is refused by name.
"""

from __future__ import annotations

from typing import ClassVar, Optional

import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MLAAttentionImpl,
)

from .. import _C as aar
from .dcp import dcp_comm, dcp_setup, num_speculative_tokens, refuse_pcp, take_over_dcp
from .graph import GraphBuilderMixin, in_wrapper_run, refuse_if_capturing, run_segment


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _latent_kv_cache_update(impl, kind: str, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype) -> None:
    """``do_kv_cache_update`` of the MLA and sparse MLA impls (``impl._attn.write_kv`` into ``impl._caches``): the
    runtime's write, or a segment of vLLM's graph wrapper run (docs/design/vllm_sparse.md §6.1)."""
    if kv_cache.numel() == 0:  # vLLM's profiling run
        return
    if kv_cache_dtype != impl.kv_cache_dtype:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} differs from the layer's {impl.kv_cache_dtype!r}")
    nope, rope = impl._caches(kv_cache)
    if not in_wrapper_run():
        impl._attn.write_kv(kv_c_normed, k_pe, slot_mapping.flatten(), nope, rope)
        return
    run_segment(f"{kind} do_kv_cache_update",
                lambda kv_c_normed, k_pe, slot_mapping: impl._attn.write_kv(kv_c_normed, k_pe, slot_mapping.flatten(),
                                                                            nope, rope),
                dict(kv_c_normed=kv_c_normed, k_pe=k_pe, slot_mapping=slot_mapping), fixed=(kv_cache,))


class AscendAttnRtBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return AscendAttnRtImpl

    @staticmethod
    def get_builder_cls():
        return AscendAttnRtMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes():
        return list(aar.Backend.supported_block_sizes())

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if cache_dtype_str not in AscendAttnRtBackend.supported_kv_cache_dtypes:
            raise ValueError(f"cache_dtype_str={cache_dtype_str!r} is not supported by ascend_attn_rt")
        return tuple(aar.Backend.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size))

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []  # any head size

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


def _build_inputs(common_prefix_len: int, m: CommonAttentionMetadata):
    """vLLM's per-step metadata as the runtime builders take it (host int32 lengths)."""
    if common_prefix_len:
        raise NotImplementedError(
            f"common_prefix_len={common_prefix_len}: cascade attention is not supported by ascend_attn_rt")
    n = m.num_reqs
    causal = m.causal
    if not isinstance(causal, bool):
        raise NotImplementedError("causal as a per-request tensor is not supported by ascend_attn_rt")
    qsl = m.query_start_loc_cpu[: n + 1].to(torch.int32)
    # vLLM's upper bound is exact outside async spec decode, which the runtime refuses anyway.
    seq_lens = m.seq_lens[:n].to("cpu", torch.int32)
    # vLLM pads a full-graph batch with empty requests (no tokens, KV length 0) after the real ones;
    # the runtime pads to num_input_tokens its own way (docs/design/vllm_sparse.md §6).
    while n > 0 and int(qsl[n]) == int(qsl[n - 1]) and int(seq_lens[n - 1]) == 0:
        n -= 1
    qsl, seq_lens = qsl[: n + 1], seq_lens[:n]
    bt = m.block_table_tensor[:n]
    if bt.dtype != torch.int32:
        bt = bt.to(torch.int32)
    return qsl, seq_lens, bt, causal


def _graph_padding(m: CommonAttentionMetadata, qsl, what: str) -> tuple[int, int]:
    """vLLM's full-graph padding of a step (docs/design/vllm_sparse.md §6): vLLM pads a FULL batch up to its
    capture size with empty requests (no tokens, KV length 0, block-table row 0) after the real ones and counts
    the padded tokens in num_actual_tokens. ``qsl``: the real requests' query ends (``_build_inputs``). Returns
    (padding requests, tokens each padding request stands for), (0, 0) without padding; refused by name when the
    padding tokens are not spread evenly over the padding requests (no runtime padding has that form)."""
    n = int(qsl.numel()) - 1
    pad_reqs = int(m.num_reqs) - n
    pad_tokens = int(m.num_actual_tokens) - int(qsl[n])
    if pad_reqs == 0 or pad_tokens == 0:
        return 0, 0
    if pad_tokens < 0 or pad_tokens % pad_reqs:
        raise NotImplementedError(f"a padded step of {n} requests with {pad_reqs} empty padding requests for "
                                  f"{pad_tokens} padding tokens (num_actual_tokens={m.num_actual_tokens}): "
                                  f"ascend_attn_rt's {what} spreads the padding tokens evenly over the padding "
                                  "requests")
    return pad_reqs, pad_tokens // pad_reqs


def _padded_inputs(common_prefix_len: int, m: CommonAttentionMetadata, what: str,
                   decode_threshold: Optional[int] = None):
    """The step's inputs with vLLM's full-graph padding as dummy requests (the DeepSeek-V4 and MLA builders): each
    padding request becomes a request of the padded tokens' share q (KV length S = q, block-table row 0 as vLLM
    gives it), so the runtime's captured layer sees every bucket row in a request (docs/design/dsa.md §6; MLA's
    mla.LatentAttention takes no graph decode padding). A dummy reads the first q rows of block 0 (vLLM's null
    block) and writes no KV row (DeepSeek-V4: docs/design/dsa.md §6; MLA: the impl writes at vLLM's slot mapping,
    -1 for padding tokens); its output rows are read by no caller. With ``decode_threshold`` the dummies must be
    decodes of that many tokens (vLLM's uniform decode query length; refused by name otherwise). Returns qsl,
    seq_lens, block table, causal and the real request count (-1: no padding)."""
    qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
    n = int(seq_lens.numel())
    pad_reqs, q = _graph_padding(m, qsl, what)
    if pad_reqs == 0:
        return qsl, seq_lens, bt, causal, -1
    _check_padding_query(pad_reqs, q, decode_threshold, what)
    base = int(qsl[n])
    qsl = torch.cat([qsl, torch.arange(1, pad_reqs + 1, dtype=torch.int32) * q + base])
    seq_lens = torch.cat([seq_lens, torch.full((pad_reqs,), q, dtype=torch.int32)])
    bt = m.block_table_tensor[: n + pad_reqs]
    if bt.dtype != torch.int32:
        bt = bt.to(torch.int32)
    return qsl, seq_lens, bt, causal, n


def _check_decode_padding(m: CommonAttentionMetadata, qsl, decode_threshold: int, what: str) -> None:
    """The SFA builder's graph decode padding (docs/design/sfa.md §3.4, MLA's enable-pad rule) pads a
    decode-only build up to num_input_tokens with dummy requests of decode_threshold tokens: vLLM's padding is
    taken when each of its padding requests stands for that many tokens (vLLM's uniform decode query length),
    refused by name otherwise."""
    pad_reqs, q = _graph_padding(m, qsl, what)
    _check_padding_query(pad_reqs, q, decode_threshold, what)


def _check_padding_query(pad_reqs: int, q: int, decode_threshold: Optional[int], what: str) -> None:
    if pad_reqs and decode_threshold is not None and q != decode_threshold:
        raise NotImplementedError(f"a padded step whose {pad_reqs} padding requests stand for {q} tokens each: "
                                  f"ascend_attn_rt's {what} pads decode graph buckets with requests of "
                                  f"decode_threshold={decode_threshold} tokens (1 + num_speculative_tokens)")


def _refuse_cp(vllm_config, what: str = "vLLM adapter") -> None:
    pc = vllm_config.parallel_config
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if getattr(pc, name, 1) > 1:
            raise NotImplementedError(f"{name}={getattr(pc, name)}: context parallel through ascend_attn_rt's "
                                      f"{what} is not supported")


def _is_prefilling(m: CommonAttentionMetadata, n: int):
    """vLLM's per-request prefilling flags for the runtime's DCP builders (the real requests' only)."""
    flags = m.is_prefilling
    return None if flags is None else flags[:n].to("cpu", torch.bool)


def _builder_sizes(kv_cache_spec, vllm_config, dcp_ok: bool = False) -> dict:
    """The builder capacities from vLLM's config; context parallel refused unless ``dcp_ok`` (then PCP only)."""
    sc, cc, mc = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.model_config
    if cc.num_gpu_blocks is None:
        raise ValueError("cache_config.num_gpu_blocks=None: the ascend_attn_rt builder needs the block count")
    if dcp_ok:
        refuse_pcp(vllm_config, "vLLM adapter")
    else:
        _refuse_cp(vllm_config)
    bs = kv_cache_spec.block_size
    return dict(max_num_reqs=sc.max_num_seqs, max_num_tokens=sc.max_num_batched_tokens,
                max_blocks_per_req=_cdiv(mc.max_model_len, bs), block_size=bs, num_blocks=cc.num_gpu_blocks,
                chunked_prefill_enabled=bool(sc.enable_chunked_prefill))


class AscendAttnRtMetadataBuilder(GraphBuilderMixin, AttentionMetadataBuilder):
    reorder_batch_threshold: int | None = 1
    _spec_graphs = True  # the GQA capture takes SpecDecoding buckets (docs/design/vllm_sparse.md §6)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        sizes = _builder_sizes(kv_cache_spec, vllm_config, dcp_ok=True)
        self._dcp = dcp_setup(vllm_config, "GQA builder")
        if self._dcp is None:
            self._builder = aar.MetadataBuilder(**sizes, device=str(device))
            self.reorder_batch_threshold = self._builder.reorder_batch_threshold
        else:
            # DCP (docs/design/vllm_sparse.md §7): this rank's build (local slots and KV lengths, one decode row
            # per token) from the global batch vLLM gives every rank.
            del sizes["chunked_prefill_enabled"]  # the DCP builder reads every prefill's cached context
            self._builder = aar.DcpMetadataBuilder(
                **sizes, dcp_world=self._dcp.world_size, dcp_rank=self._dcp.rank, interleave=self._dcp.interleave,
                num_speculative_tokens=num_speculative_tokens(vllm_config), device=str(device))
            self.reorder_batch_threshold = self._builder.decode_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False):
        m = common_attn_metadata
        qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
        if self._dcp is not None:
            if not causal:
                raise NotImplementedError("non-causal attention under decode context parallel is not supported by "
                                          "ascend_attn_rt")
            return self._builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                       is_prefilling=_is_prefilling(m, len(seq_lens)))
        return self._builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                   is_prefilling=m.is_prefilling, causal=causal)

    def _graph_build(self, m: CommonAttentionMetadata):
        qsl, seq_lens, bt, causal = _build_inputs(0, m)
        if self._dcp is not None:
            # The runtime's GQA DCP decode capture (docs/design/cp.md §4): KV write, query gather, the
            # shard's call refreshed per update, exchange + merge; padding rows get KV length 0.
            if not causal:
                raise NotImplementedError("non-causal attention under decode context parallel is not supported by "
                                          "ascend_attn_rt")
            return self._builder.build_for_graph_capture(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                                         state=aar.AttentionState.DecodeOnly)
        return self._builder.build_for_graph_capture(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                                     state=self._graph_state(), causal=causal)


class AscendAttnRtImpl(AttentionImpl):
    # Under DCP the runtime's DcpAttentionImpl gathers the query heads, attends the rank's shard and merges
    # the partials by LSE inside forward (docs/design/vllm_sparse.md §7): vLLM's check that a DCP impl
    # combines LSE partials (need_to_return_lse_for_decode, set in __init__) holds, and vLLM's Attention
    # layer merges nothing itself.
    supports_dcp: bool = True
    supports_pcp: bool = False
    # Speculative decodes under DCP with any interleave: one decode row per token (docs/design/cp.md §3.3).
    supports_mtp_with_cp_non_trivial_interleave_size: bool = True
    _UNQUANTISED = ("auto", "float16", "bfloat16")  # the cache dtypes the DCP layer takes

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None,
                 alibi_slopes=None, sliding_window: Optional[int] = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap: Optional[float] = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: Optional[str] = None, sinks: Optional[torch.Tensor] = None,
                 **kwargs) -> None:
        if kwargs:
            raise NotImplementedError(f"arguments not supported by ascend_attn_rt: {sorted(kwargs)}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        at = attn_type.value if isinstance(attn_type, AttentionType) else str(attn_type)
        if self.pcp_world_size > 1:
            raise NotImplementedError(f"prefill context parallel through the vLLM adapter (pcp_world_size="
                                      f"{self.pcp_world_size}) is not supported by ascend_attn_rt")
        if self.dcp_world_size > 1:
            # The runtime's GQA DCP layer (docs/design/cp.md §4): plain causal decoder attention over an
            # unquantised cache; everything else is refused by name.
            refused = {name: value for name, value, plain in (
                ("alibi_slopes", alibi_slopes, alibi_slopes is None), ("sliding_window", sliding_window,
                                                                       sliding_window is None),
                ("logits_soft_cap", logits_soft_cap, not logits_soft_cap), ("sinks", sinks, sinks is None),
                ("attn_type", at, at == AttentionType.DECODER.value),
                ("kv_cache_dtype", kv_cache_dtype, kv_cache_dtype in self._UNQUANTISED)) if not plain}
            if refused:
                raise NotImplementedError(f"arguments not supported by ascend_attn_rt under decode context parallel "
                                          f"(dcp_world_size={self.dcp_world_size}): {refused}")
            self.need_to_return_lse_for_decode = True
            self._impl = aar.DcpAttentionImpl(dcp_comm(self.dcp_world_size), num_heads, head_size, scale=self.scale,
                                              num_kv_heads=self.num_kv_heads,
                                              kv_sharing=kv_sharing_target_layer_name is not None)
            return
        self._impl = aar.AttentionImpl(
            num_heads, head_size, scale=self.scale, num_kv_heads=self.num_kv_heads,
            sliding_window=sliding_window, sinks=sinks,
            alibi_slopes=None if alibi_slopes is None else torch.as_tensor(alibi_slopes),
            logits_soft_cap=logits_soft_cap, kv_cache_dtype=kv_cache_dtype, attn_type=at,
            kv_sharing=kv_sharing_target_layer_name is not None)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("output_scale / output_block_scale (fused output quant) are not supported")
        if attn_metadata is None:  # vLLM's profiling run
            refuse_if_capturing("a forward without metadata (vLLM's profiling run)")
            return output.fill_(0)
        n, nkv, d = self.num_heads, self.num_kv_heads, self.head_size
        k_cache, v_cache = kv_cache[0], kv_cache[1]

        def call(query, key, value, output):
            self._impl.forward(query.view(-1, n, d), None if key is None else key.view(-1, nkv, d),
                               None if value is None else value.view(-1, nkv, d), k_cache, v_cache, attn_metadata,
                               output.view(-1, n, d))

        # One call of a graph segment under vLLM's graph wrapper (docs/design/vllm_sparse.md §6.1).
        if in_wrapper_run():
            run_segment("GQA forward", call, dict(query=query, key=key, value=value), dict(output=output),
                        fixed=(kv_cache,))
        else:
            call(query, key, value, output)
        return output


class AscendAttnRtMlaBackend(AttentionBackend):
    """The MLA backend's static facts (latent cache, block sizes, dtypes) for vLLM."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    # The int8 latent cache of FA-quant layers is not offered through vLLM's cache dtypes.
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = False  # vLLM's MLAAttention calls do_kv_cache_update

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return AscendAttnRtMlaImpl

    @staticmethod
    def get_builder_cls():
        return AscendAttnRtMlaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes():
        return list(aar.mla.Backend.supported_block_sizes())

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if cache_dtype_str not in AscendAttnRtMlaBackend.supported_kv_cache_dtypes:
            raise ValueError(f"cache_dtype_str={cache_dtype_str!r} is not supported by ascend_attn_rt")
        if num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: an MLA latent cache has one KV head")
        if block_size not in aar.mla.Backend.supported_block_sizes():
            raise ValueError(f"block_size={block_size} is not supported by ascend_attn_rt's MLA backend "
                             f"(supported: {list(aar.mla.Backend.supported_block_sizes())})")
        # vLLM's MLA shape; head_size = kv_lora_rank + qk_rope_head_dim (see the module docstring).
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


class AscendAttnRtMlaMetadataBuilder(GraphBuilderMixin, AttentionMetadataBuilder):
    """vLLM's CommonAttentionMetadata -> the runtime's mla.Metadata (one C++ build per step)."""

    reorder_batch_threshold: int | None = 1
    _spec_graphs = True  # the MLA capture takes speculative (TND) buckets (docs/design/vllm_sparse.md §6)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        mc = vllm_config.model_config
        rope_dim = getattr(mc.hf_text_config, "qk_rope_head_dim", None)
        if not mc.use_mla or rope_dim is None:
            raise ValueError(f"model {mc.model!r} is not an MLA model (use_mla={mc.use_mla}, "
                             f"qk_rope_head_dim={rope_dim})")
        sizes = _builder_sizes(kv_cache_spec, vllm_config, dcp_ok=True)
        # DCP (docs/design/vllm_sparse.md §7): this rank's build of the global batch.
        self._dcp = dcp_setup(vllm_config, "MLA builder")
        dcp = {} if self._dcp is None else dict(dcp_world_size=self._dcp.world_size, dcp_rank=self._dcp.rank,
                                                 cp_kv_cache_interleave_size=self._dcp.interleave)
        # vLLM rotates q and k_pe itself: zero tables (see the module docstring).
        table = torch.zeros(mc.max_model_len, rope_dim, dtype=kv_cache_spec.dtype)
        self._builder = aar.mla.MetadataBuilder(
            **sizes, cos_table=table, sin_table=table, max_model_len=mc.max_model_len,
            num_speculative_tokens=num_speculative_tokens(vllm_config), device=str(device), **dcp)
        self.reorder_batch_threshold = self._builder.decode_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False):
        m = common_attn_metadata
        # vLLM's full-graph padding requests as dummy decodes (docs/design/vllm_sparse.md §6).
        qsl, seq_lens, bt, causal, _ = _padded_inputs(common_prefix_len, m, "MLA builder",
                                                      self._builder.decode_threshold)
        if not causal:
            raise NotImplementedError("non-causal MLA attention is not supported by ascend_attn_rt")
        is_prefilling = m.is_prefilling if self._dcp is None else _is_prefilling(m, len(seq_lens))
        return self._builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                   is_prefilling=is_prefilling)

    def _graph_build(self, m: CommonAttentionMetadata):
        qsl, seq_lens, bt, causal = _build_inputs(0, m)
        return self._builder.build_for_graph_capture(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                                     state=self._graph_state())


class AscendAttnRtMlaImpl(MLAAttentionImpl):
    """vLLM's MLA impl interface over the runtime's attention-only mla.LatentAttention."""

    # DCP (docs/design/vllm_sparse.md §7): the runtime gathers the decode query over the DCP group and merges
    # the partials by LSE inside forward_mqa, so vLLM's MLAAttention.forward_impl, which does both when
    # impl.dcp_world_size > 1, is shown dcp_world_size = 1 (the group's size is runtime_dcp_world_size).
    supports_dcp: bool = True
    supports_pcp: bool = False
    can_return_lse_for_decode: bool = False
    supports_mtp_with_cp_non_trivial_interleave_size: bool = True

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, alibi_slopes,
                 sliding_window: Optional[int], kv_cache_dtype: str, logits_soft_cap: Optional[float],
                 attn_type: str, kv_sharing_target_layer_name: Optional[str], q_lora_rank: Optional[int],
                 kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int, qk_head_dim: int,
                 v_head_dim: int, kv_b_proj, indexer: object | None = None, q_pad_num_heads: Optional[int] = None,
                 **kwargs) -> None:
        refused = dict(kwargs)
        for name, value, default in (("alibi_slopes", alibi_slopes, None), ("sliding_window", sliding_window, None),
                                     ("logits_soft_cap", logits_soft_cap, None), ("indexer", indexer, None),
                                     ("kv_sharing_target_layer_name", kv_sharing_target_layer_name, None),
                                     ("q_pad_num_heads", q_pad_num_heads, None), ("num_kv_heads", num_kv_heads, 1)):
            if not (value is default or (not isinstance(value, torch.Tensor) and value == default)):
                refused[name] = value
        at = attn_type.value if isinstance(attn_type, AttentionType) else str(attn_type)
        if at != AttentionType.DECODER.value:
            refused["attn_type"] = at
        if refused:
            raise NotImplementedError(f"arguments not supported by ascend_attn_rt's MLA impl: {refused}")
        if kv_cache_dtype not in AscendAttnRtMlaBackend.supported_kv_cache_dtypes:
            raise NotImplementedError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported by ascend_attn_rt's MLA impl")
        if self.pcp_world_size > 1:
            raise NotImplementedError(f"prefill context parallel through the vLLM adapter (pcp_world_size="
                                      f"{self.pcp_world_size}) is not supported by ascend_attn_rt's MLA impl")
        if qk_head_dim != qk_nope_head_dim + qk_rope_head_dim or head_size != kv_lora_rank + qk_rope_head_dim:
            raise ValueError(f"qk_head_dim={qk_head_dim} / head_size={head_size} do not match qk_nope_head_dim="
                             f"{qk_nope_head_dim}, qk_rope_head_dim={qk_rope_head_dim}, kv_lora_rank={kv_lora_rank}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank, self.v_head_dim = kv_lora_rank, v_head_dim
        self.kv_b_proj = kv_b_proj
        comm = take_over_dcp(self)
        self._attn = aar.mla.LatentAttention(
            num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, scale=self.scale, dcp_comm=comm)
        self._split_src = self._split_key = self._split = None

    def _caches(self, kv_cache: torch.Tensor):
        # The two caches of one layer's buffer, made once per buffer and remade when the
        # tensor is another one or was moved in place (set_ / resize_).
        key = (kv_cache.data_ptr(), kv_cache.shape)
        if self._split_src is not kv_cache or self._split_key != key:
            self._split = aar.mla.LatentAttention.split_kv_cache(kv_cache, self.kv_lora_rank)
            self._split_src, self._split_key = kv_cache, key
        return self._split

    def _kv_b_proj_weight(self, dtype: torch.dtype) -> torch.Tensor:
        w = getattr(self.kv_b_proj, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dtype != dtype:
            raise NotImplementedError(
                f"kv_b_proj weight {None if w is None else w.dtype}: ascend_attn_rt's MLA prefill needs an "
                f"unquantised kv_b_proj in the activations' dtype {dtype}")
        return w

    def do_kv_cache_update(self, kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale) -> None:
        _latent_kv_cache_update(self, "MLA", kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        if self.runtime_dcp_world_size > 1 and getattr(layer, "dcp_q_replicate", False):
            raise NotImplementedError("dcp_q_replicate (a query projection replicated over the DCP group) is not "
                                      "supported by ascend_attn_rt's MLA impl: its DCP decode gathers the heads itself")
        if isinstance(q, tuple):
            ql_nope, q_pe = q
        else:
            ql_nope, q_pe = q.split([self.kv_lora_rank, q.shape[-1] - self.kv_lora_rank], dim=-1)
        nope, rope = self._caches(kv_c_and_k_pe_cache)
        out = torch.empty(ql_nope.shape, dtype=ql_nope.dtype, device=ql_nope.device)
        if not in_wrapper_run():
            self._attn.forward_decode(ql_nope, q_pe, nope, rope, attn_metadata, out)
        else:
            run_segment("MLA forward_mqa",
                        lambda ql_nope, q_pe, out: self._attn.forward_decode(ql_nope, q_pe, nope, rope, attn_metadata,
                                                                             out),
                        dict(ql_nope=ql_nope, q_pe=q_pe), dict(out=out), fixed=(kv_c_and_k_pe_cache,))
        return out, None

    def forward_mha(self, q, kv_c_normed, k_pe, kv_c_and_k_pe_cache, attn_metadata, k_scale, output,
                    output_scale=None) -> None:
        if output_scale is not None:
            raise NotImplementedError("output_scale (fused output quant) is not supported by ascend_attn_rt's MLA impl")
        nope, rope = self._caches(kv_c_and_k_pe_cache)
        self._attn.forward_prefill(q, kv_c_normed, k_pe, self._kv_b_proj_weight(q.dtype), nope, rope, attn_metadata,
                                   output)


_FAMILIES = {
    "gqa": "AscendAttnRtBackend",
    "mla": "AscendAttnRtMlaBackend",
    # Both architectures run vLLM's deepseek_v2 model code: one sparse MLA backend and one indexer op.
    "deepseek_v32": "AscendAttnRtSparseMlaBackend",
    "glm_moe_dsa": "AscendAttnRtSparseMlaBackend",
    # DeepseekV4ForCausalLM: vLLM's DSV4 attention-class selection wrapped (docs/design/vllm_dsa.md).
    "deepseek_v4": "AscendAttnRtDsaSwaBackend",
}


def register(mla: bool = False, family: Optional[str] = None) -> None:
    """Registers the runtime as vLLM's CUSTOM attention backend for one model family (one call per
    process; vLLM has one CUSTOM slot):

    * ``"gqa"`` (the default): AscendAttnRtBackend;
    * ``"mla"`` (or ``mla=True``; DeepSeek V2/V3): AscendAttnRtMlaBackend;
    * ``"deepseek_v32"`` (DeepseekV32ForCausalLM) or ``"glm_moe_dsa"`` (GlmMoeDsaForCausalLM):
      AscendAttnRtSparseMlaBackend, and vLLM's SparseAttnIndexer op replaced (``CustomOp.register_oot``)
      by the runtime's, whose indexer-cache layers use AscendAttnRtIndexerBackend
      (docs/design/vllm_sparse.md);
    * ``"deepseek_v4"`` (DeepseekV4ForCausalLM): vLLM's ``_select_dsv4_attn_cls`` wrapped to return
      AscendAttnRtDsaAttention (one dsa.Impl.forward per layer; SWA-only, C4 and C128 layers,
      docs/design/vllm_dsa.md), whose caches report the runtime's specs and use the AscendAttnRtDsa*Backend
      of their kind (Swa, C4Kv, C4AttnState, C4IndexerK, C4IndexerState, C128Kv, C128State).

    Then start vLLM with ``--attention-backend CUSTOM``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if family is None:
        family = "mla" if mla else "gqa"
    elif mla and family != "mla":
        raise ValueError(f"mla=True with family={family!r}: give one of them")
    if family not in _FAMILIES:
        raise ValueError(f"family={family!r} is not one of {sorted(_FAMILIES)}")
    if _FAMILIES[family] == "AscendAttnRtSparseMlaBackend":
        from vllm.model_executor.custom_op import CustomOp, op_registry_oot

        from .sparse import indexer_op_cls

        op = indexer_op_cls()
        current = op_registry_oot.get("SparseAttnIndexer")
        if current is None:
            CustomOp.register_oot(op, name="SparseAttnIndexer")
        elif current is not op:
            raise ValueError(f"SparseAttnIndexer is already replaced by {current.__module__}.{current.__name__}")
    if family == "deepseek_v4":
        from .dsa import install_attention_selection

        install_attention_selection()
    register_backend(AttentionBackendEnum.CUSTOM, f"ascend_attn_rt.vllm.{_FAMILIES[family]}")


from .sparse import (  # noqa: E402  (the sparse module imports this one's helpers)
    AscendAttnRtIndexerBackend,
    AscendAttnRtIndexerMetadataBuilder,
    AscendAttnRtSparseMlaBackend,
    AscendAttnRtSparseMlaImpl,
    AscendAttnRtSparseMlaMetadata,
    AscendAttnRtSparseMlaMetadataBuilder,
)
from .dsa import (  # noqa: E402,F401
    AscendAttnRtDsaC4AttnStateBackend,
    AscendAttnRtDsaC4IndexerKBackend,
    AscendAttnRtDsaC4IndexerStateBackend,
    AscendAttnRtDsaC4KvBackend,
    AscendAttnRtDsaC128KvBackend,
    AscendAttnRtDsaC128StateBackend,
    AscendAttnRtDsaMetadata,
    AscendAttnRtDsaSwaBackend,
    AscendAttnRtDsaSwaMetadataBuilder,
)
