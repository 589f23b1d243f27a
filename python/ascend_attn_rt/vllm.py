"""vLLM v1 attention-backend adapter (issue 14 part 3): GQA (backend, builder, impl) and
the MLA backend facts and metadata builder (the MLA impl is not adapted yet, see below).

Select it in vLLM with ``--attention-backend CUSTOM`` after registering
``AscendAttnRtBackend`` (see ``register()``), or use the classes directly.

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

MLA (``AscendAttnRtMlaBackend``, ``AscendAttnRtMlaMetadataBuilder``):
* the KV cache is vLLM's MLA shape ``(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)``
  (what ``MLAAttentionSpec`` sizes its pages for); the runtime keeps the latent and the rope
  rows in two contiguous caches, so the impl will view each layer's buffer as the two
  caches split kv_lora_rank : qk_rope_head_dim, as vllm-ascend's model runner does;
* vLLM applies RoPE before attention (``MLAAttention`` gets the rotated ``q``/``k_pe``), so
  the runtime's RoPE rows are not needed: the builder is given zero cos/sin tables and the
  metadata's RoPE rows are zeros (nothing in the adapter reads them);
* the impl is missing: vLLM's ``MLAAttentionImpl`` (``forward_mqa`` on the absorbed query,
  ``forward_mha`` on the projected query and latent, ``do_kv_cache_update``) takes the
  attention after the projections, while the runtime's ``mla.Impl.forward`` takes the hidden
  states and does the projections itself; the attention-only entry points it needs are not
  in the C++ API yet, so ``get_impl_cls`` raises ``NotImplementedError`` naming them.
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
)

from . import _C as aar


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    bt = m.block_table_tensor[:n]
    if bt.dtype != torch.int32:
        bt = bt.to(torch.int32)
    return qsl, seq_lens, bt, causal


def _builder_sizes(kv_cache_spec, vllm_config) -> dict:
    sc, cc, mc = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.model_config
    if cc.num_gpu_blocks is None:
        raise ValueError("cache_config.num_gpu_blocks=None: the ascend_attn_rt builder needs the block count")
    bs = kv_cache_spec.block_size
    return dict(max_num_reqs=sc.max_num_seqs, max_num_tokens=sc.max_num_batched_tokens,
                max_blocks_per_req=_cdiv(mc.max_model_len, bs), block_size=bs, num_blocks=cc.num_gpu_blocks,
                chunked_prefill_enabled=bool(sc.enable_chunked_prefill))


class AscendAttnRtMetadataBuilder(AttentionMetadataBuilder):
    reorder_batch_threshold: int | None = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._builder = aar.MetadataBuilder(**_builder_sizes(kv_cache_spec, vllm_config), device=str(device))
        self.reorder_batch_threshold = self._builder.reorder_batch_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False):
        m = common_attn_metadata
        qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
        return self._builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                   is_prefilling=m.is_prefilling, causal=causal)


class AscendAttnRtImpl(AttentionImpl):
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
            return output.fill_(0)
        out = output.view(-1, self.num_heads, self.head_size)
        self._impl.forward(query.view(-1, self.num_heads, self.head_size),
                           None if key is None else key.view(-1, self.num_kv_heads, self.head_size),
                           None if value is None else value.view(-1, self.num_kv_heads, self.head_size),
                           kv_cache[0], kv_cache[1], attn_metadata, out)
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
        raise NotImplementedError(
            "ascend_attn_rt's MLA impl for vLLM (forward_mqa / forward_mha / do_kv_cache_update on the projected "
            "query and latent) is not implemented: aar.mla.Impl.forward takes the hidden states and has no "
            "attention-only entry point yet")

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


class AscendAttnRtMlaMetadataBuilder(AttentionMetadataBuilder):
    """vLLM's CommonAttentionMetadata -> the runtime's mla.Metadata (one C++ build per step)."""

    reorder_batch_threshold: int | None = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        mc = vllm_config.model_config
        rope_dim = getattr(mc.hf_text_config, "qk_rope_head_dim", None)
        if not mc.use_mla or rope_dim is None:
            raise ValueError(f"model {mc.model!r} is not an MLA model (use_mla={mc.use_mla}, "
                             f"qk_rope_head_dim={rope_dim})")
        spec = getattr(vllm_config, "speculative_config", None)
        num_spec = 0 if spec is None else int(spec.num_speculative_tokens or 0)
        # vLLM rotates q and k_pe itself: zero tables (see the module docstring).
        table = torch.zeros(mc.max_model_len, rope_dim, dtype=kv_cache_spec.dtype)
        self._builder = aar.mla.MetadataBuilder(
            **_builder_sizes(kv_cache_spec, vllm_config), cos_table=table, sin_table=table,
            max_model_len=mc.max_model_len, num_speculative_tokens=num_spec, device=str(device))
        self.reorder_batch_threshold = self._builder.decode_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False):
        m = common_attn_metadata
        qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
        if not causal:
            raise NotImplementedError("non-causal MLA attention is not supported by ascend_attn_rt")
        return self._builder.build(qsl, seq_lens, bt, num_input_tokens=m.num_actual_tokens,
                                   is_prefilling=m.is_prefilling)


def register() -> None:
    """Registers AscendAttnRtBackend as vLLM's CUSTOM attention backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, "ascend_attn_rt.vllm.AscendAttnRtBackend")
