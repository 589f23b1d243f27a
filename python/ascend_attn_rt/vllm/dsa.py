"""vLLM adapter for DeepSeek-V4 (DeepseekV4ForCausalLM) over the runtime's DSA layer (docs/design/vllm_dsa.md).

vLLM 0.27.1 picks the DeepSeek-V4 attention class with ``_select_dsv4_attn_cls`` (its CUDA model module, which
is also the one every non-ROCm, non-XPU platform imports). ``register(family="deepseek_v4")`` wraps that function:
with ``--attention-backend CUSTOM`` it returns ``AscendAttnRtDsaAttention``, a subclass of vLLM's
``DeepseekV4Attention`` whose ``forward`` is one ``dsa.Impl.forward`` (projections, RoPE, the SWA cache write,
the shared-KV attention with sinks, inverse RoPE, the grouped o_proj), with vLLM's own parameters as the weights.

The layer's SWA cache (vLLM's ``DeepseekV4SWACache``, block size 64, its own KV-cache group) is re-pointed to
``AscendAttnRtDsaSwaBackend``, whose builder runs the runtime's step builder and the SWA group builder once per
step (``dsa.StepBuilder.build``, ``dsa.GroupBuilder.build``).

Served: SWA-only layers (compress ratio 1), eager, single rank, A2/A3 plan (plain rows in the model dtype).
Refused by name when the layer is made: C4 / C128 compressed layers (docs/design/vllm_dsa.md §3 says why),
fp8 KV caches, tensor / context parallelism, graph capture and torch.compile, a quantised checkpoint; per step:
cascade attention, non-causal batches, ``llama_4_scaling``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import AttentionBackend, AttentionMetadataBuilder, CommonAttentionMetadata

from .. import _C as aar
from . import _build_inputs, _cdiv, _refuse_cp

# vLLM's DeepseekV4SWACache block size (fixed there: the SWA page shares its size with the C4 page).
_SWA_BLOCK_SIZE = 64
_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")

# Why the compressed layers are not served through vLLM (docs/design/vllm_dsa.md §3).
_COMPRESSED_REASONS = {
    4: ("C4 layers are not supported by ascend_attn_rt's vLLM adapter: vLLM keeps the C4 indexer keys as fp8 "
        "rows with an fp32 scale (132 bytes; the runtime's A2/A3 indexer cache is int8 with fp16 scales) and the "
        "compressor states in fp32 sliding-window caches whose pages are sized to share vLLM's KV page (the runtime "
        "pads its pages to its own two tiers), and runs the compressor and indexer as modules with metadata builders "
        "of their own; mapping those groups onto the runtime's C4 group builders is not built"),
    128: ("C128 layers are not supported by ascend_attn_rt's vLLM adapter: vLLM's C128 KV cache has "
          "cache_config.block_size raw tokens per block (256 by default: 2 compressed rows per page) while the "
          "runtime's C128 group takes 4096 / 8192 / 16384-token blocks, and its fp32 compressor state cache is "
          "laid out for vLLM's kernels and page sharing, not the runtime's state group"),
}


def _model_dtype_name(dtype: torch.dtype) -> str:
    # The A2/A3 plan keys on the model dtype only for its int8 indexer scales (not used by SWA layers);
    # float32 weights and caches run as CPU reference runs under the bf16 plan (docs/design/dsa.md §5.1).
    return "float16" if dtype == torch.float16 else "bfloat16"


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


def _rope_tables(vllm_config):
    """The SWA layers' RoPE tables as the runtime takes them, (max_model_len, R) each with every angle repeated
    twice (interleaved pairs), from vLLM's own DeepSeek-V4 rotary embedding for ratio 1 (the layers' parameters:
    rope_theta, scaling type). vLLM's cos_sin_cache is [cos | sin], R / 2 each."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.common.rope import build_deepseek_v4_rope

    hf = vllm_config.model_config.hf_config
    with set_current_vllm_config(vllm_config):  # the rotary embedding is a CustomOp, made under a config
        rope = build_deepseek_v4_rope(hf, head_dim=hf.head_dim, rope_head_dim=hf.qk_rope_head_dim,
                                      max_position_embeddings=hf.max_position_embeddings, compress_ratio=1)
    # The module's cos_sin_cache is in the default dtype it was made under (bf16 for a bf16 model's default
    # RoPE): the table is recomputed in fp32 by the module's own method, the values vLLM's fp32 caches hold.
    cache = rope._compute_cos_sin_cache()[: vllm_config.model_config.max_model_len].float()
    half = cache.shape[-1] // 2
    return (cache[:, :half].repeat_interleave(2, -1).contiguous(),
            cache[:, half:].repeat_interleave(2, -1).contiguous())


@dataclass
class AscendAttnRtDsaMetadata:
    """The runtime's step and SWA group metadata of a step, plus the counts vLLM reads."""

    step: object
    swa: object
    num_actual_tokens: int
    num_reqs: int
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int


class AscendAttnRtDsaSwaMetadataBuilder(AttentionMetadataBuilder):
    """vLLM's CommonAttentionMetadata of the SWA group -> dsa.StepBuilder.build + the SWA dsa.GroupBuilder.build."""

    reorder_batch_threshold: int | None = 1

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        _refuse_unsupported(vllm_config, "DeepSeek-V4 adapter")
        sc, cc, mc = vllm_config.scheduler_config, vllm_config.cache_config, vllm_config.model_config
        hf = mc.hf_config
        ratios = {max(1, int(r)) for r in (getattr(hf, "compress_ratios", None) or [1])}
        for r in sorted(ratios - {1}):
            raise NotImplementedError(_COMPRESSED_REASONS.get(r, f"compress_ratio={r} is not a DeepSeek-V4 ratio"))
        if cc.num_gpu_blocks is None:
            raise ValueError("cache_config.num_gpu_blocks=None: the ascend_attn_rt builder needs the block count")
        spec = getattr(vllm_config, "speculative_config", None)
        num_spec = 0 if spec is None else int(spec.num_speculative_tokens or 0)
        cos, sin = _rope_tables(vllm_config)
        bs = kv_cache_spec.block_size
        self._step = aar.dsa.StepBuilder(
            max_num_reqs=sc.max_num_seqs, max_num_tokens=sc.max_num_batched_tokens, cos_table=cos, sin_table=sin,
            num_speculative_tokens=num_spec, chunked_prefill_enabled=bool(sc.enable_chunked_prefill),
            device=str(device), head_dim=hf.head_dim, window=hf.sliding_window, num_heads_q=hf.num_attention_heads)
        self._swa = aar.dsa.GroupBuilder(self._step, kind="swa", cache_block_size=bs,
                                         max_blocks_per_req=_cdiv(mc.max_model_len, bs), num_blocks=cc.num_gpu_blocks,
                                         device_kind="a2", model_dtype=_model_dtype_name(mc.dtype))
        self.reorder_batch_threshold = self._step.decode_threshold

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> AscendAttnRtDsaMetadata:
        m = common_attn_metadata
        qsl, seq_lens, bt, causal = _build_inputs(common_prefix_len, m)
        if not causal:
            raise NotImplementedError("causal=False: non-causal DeepSeek-V4 attention is not supported by "
                                      "ascend_attn_rt's vLLM adapter")
        st = self._step.build(qsl, seq_lens, num_input_tokens=m.num_actual_tokens)
        swa = self._swa.build(st, bt)
        return AscendAttnRtDsaMetadata(step=st, swa=swa, num_actual_tokens=m.num_actual_tokens, num_reqs=m.num_reqs,
                                       num_decodes=st.num_decodes, num_decode_tokens=st.num_decode_tokens,
                                       num_prefills=st.num_prefills, num_prefill_tokens=st.num_prefill_tokens)


class AscendAttnRtDsaSwaBackend(AttentionBackend):
    """The SWA cache of a DeepSeek-V4 layer: (num_blocks, 64, head_dim) plain rows in the model dtype."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(_KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("the DeepSeek-V4 SWA cache has no attention impl (AscendAttnRtDsaAttention.forward "
                                  "reads it)")

    @staticmethod
    def get_builder_cls():
        return AscendAttnRtDsaSwaMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [_SWA_BLOCK_SIZE]

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        if cache_dtype_str not in _KV_CACHE_DTYPES:
            raise ValueError(f"cache_dtype_str={cache_dtype_str!r} is not supported by ascend_attn_rt's DeepSeek-V4 "
                             "SWA cache")
        if num_kv_heads != 1:
            raise ValueError(f"num_kv_heads={num_kv_heads}: the DeepSeek-V4 SWA cache has one KV head")
        if block_size != _SWA_BLOCK_SIZE:
            raise ValueError(f"block_size={block_size}: ascend_attn_rt's DeepSeek-V4 SWA cache takes vLLM's "
                             f"{_SWA_BLOCK_SIZE}-token SWA blocks")
        return (num_blocks, block_size, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
        return (0, 1, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return []


def _weights_from_layer(layer) -> dict:
    """The runtime's weight dict from vLLM's parameters, through dsa.weights_from_checkpoint (DeepSeek's names):
    views of vLLM's tensors except wo_a, which that reader re-lays out per group once."""
    w = layer.fused_wqa_wkv.weight
    for name in ("fused_wqa_wkv", "wq_b", "wo_a", "wo_b"):
        p = getattr(layer, name).weight
        if p.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise NotImplementedError(f"{name}.weight dtype {p.dtype}: a quantised DeepSeek-V4 checkpoint is not "
                                      "supported by ascend_attn_rt's vLLM adapter")
    sink = layer.attn_sink[: layer.n_local_heads]
    state = {"wq_a.weight": w[: layer.q_lora_rank], "wkv.weight": w[layer.q_lora_rank:],
             "q_norm.weight": layer.q_norm.weight, "wq_b.weight": layer.wq_b.weight,
             "kv_norm.weight": layer.kv_norm.weight, "attn_sink": sink, "wo_a.weight": layer.wo_a.weight,
             "wo_b.weight": layer.wo_b.weight}
    cfg = dict(hidden_size=layer.hidden_size, num_heads=layer.n_heads, head_dim=layer.head_dim,
               q_lora_rank=layer.q_lora_rank, compress_ratio=1, o_groups=layer.n_groups,
               o_lora_rank=layer.o_lora_rank)
    return aar.dsa.weights_from_checkpoint(state, "", **cfg)


def _make_attention_cls():
    from vllm.forward_context import get_forward_context
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    class AscendAttnRtDsaAttention(DeepseekV4Attention):
        """vLLM's DeepseekV4Attention whose forward is one dsa.Impl.forward (SWA-only layers)."""

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
            if ratio != 1:
                raise NotImplementedError(f"{prefix}: compress_ratio={ratio}. "
                                          + _COMPRESSED_REASONS.get(ratio, "not a DeepSeek-V4 ratio"))
            _refuse_unsupported(vllm_config, "DeepSeek-V4 adapter")
            if vllm_config.quant_config is not None:
                raise NotImplementedError(f"quantization={vllm_config.quant_config.get_name()!r}: a quantised "
                                          "DeepSeek-V4 checkpoint is not supported by ascend_attn_rt's vLLM adapter")
            super().__init__(vllm_config, prefix, topk_indices_buffer, aux_stream_list, eager_scratch_pool)
            # The SWA cache layer: plain rows in the model dtype (vLLM's resolution gives bf16 for "auto"),
            # the runtime's backend and builder.
            from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

            swa = self.swa_cache_layer
            dtype = vllm_config.model_config.dtype
            swa.dtype = dtype
            cache_dtype_str = swa.cache_config.cache_dtype
            swa.get_kv_cache_spec = lambda cfg: SlidingWindowMLASpec(
                block_size=swa.block_size, num_kv_heads=1, head_size=swa.head_dim, dtype=dtype,
                sliding_window=swa.window_size, cache_dtype_str=cache_dtype_str, model_version="deepseek_v4")
            swa.get_attn_backend = lambda: AscendAttnRtDsaSwaBackend
            self._model_dtype = _model_dtype_name(dtype)
            self._impl = None
            self._impl_key = None
            self._kv_src = self._kv = None

        def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
            """vLLM's hook after (re)loading weights: the runtime's layer is remade from the loaded parameters
            (the per-group wo_a re-layout is a copy, so an in-place reload must reach it)."""
            self._impl = None
            self._layer_impl()

        def _layer_impl(self):
            # Made by process_weights_after_loading or at the first forward, and remade when a weight tensor is
            # replaced or written in place through autograd-visible ops (its version counter moves).
            params = (self.fused_wqa_wkv.weight, self.q_norm.weight, self.wq_b.weight, self.kv_norm.weight,
                      self.attn_sink, self.wo_a.weight, self.wo_b.weight)
            key = tuple((p.data_ptr(), p._version) for p in params)
            if self._impl is None or key != self._impl_key:
                self._impl = aar.dsa.Impl(
                    _weights_from_layer(self), hidden_size=self.hidden_size, num_heads=self.n_heads,
                    head_dim=self.head_dim, rope_dim=self.rope_head_dim, q_lora_rank=self.q_lora_rank,
                    window=self.window_size, compress_ratio=1, eps=self.eps, o_groups=self.n_groups,
                    o_lora_rank=self.o_lora_rank, device_kind="a2", model_dtype=self._model_dtype)
                self._impl_key = key
            return self._impl

        def _kv_tuple(self, cache: torch.Tensor):
            # vLLM's (num_blocks, 64, head_dim) SWA cache as the runtime's (num_blocks, 64, 1, head_dim) view.
            if self._kv_src is not cache or self._kv[1].data_ptr() != cache.data_ptr():
                self._kv = aar.dsa.compose_kv_cache(swa_kv=cache.unsqueeze(2), model_dtype=self._model_dtype)
                self._kv_src = cache
            return self._kv

        def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                    llama_4_scaling: torch.Tensor | None = None) -> torch.Tensor:
            # positions are not read: the runtime derives each token's position from the step (seq_lens,
            # query_start_loc), which is how vLLM makes them.
            if llama_4_scaling is not None:
                raise NotImplementedError("llama_4_scaling is not supported by ascend_attn_rt's DeepSeek-V4 layer")
            out = torch.empty_like(hidden_states)
            impl = self._layer_impl()
            md = get_forward_context().attn_metadata
            if isinstance(md, list):
                md = md[0]
            if not isinstance(md, dict):  # vLLM's profiling run
                return out.zero_()
            meta = md.get(self.swa_cache_layer.prefix)
            if not isinstance(meta, AscendAttnRtDsaMetadata):
                raise ValueError(f"metadata of {self.swa_cache_layer.prefix!r} is {type(meta).__name__}: the SWA "
                                 "cache layer must use AscendAttnRtDsaSwaBackend")
            impl.forward(hidden_states, self._kv_tuple(self.swa_cache_layer.kv_cache), meta.step, meta.swa, out)
            return out

        def forward_mqa(self, q, kv, positions, output) -> None:
            raise NotImplementedError("forward_mqa: AscendAttnRtDsaAttention.forward runs the whole layer")

        def _o_proj(self, o, positions):
            raise NotImplementedError("_o_proj: AscendAttnRtDsaAttention.forward runs the whole layer")

    return AscendAttnRtDsaAttention


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
