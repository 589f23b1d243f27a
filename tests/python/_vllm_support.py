"""Helpers shared by the vLLM adapter tests."""

import contextlib
import sys
import types

# vLLM's layer modules import vllm._custom_ops, which keeps the ImportError of its missing vllm._C with its
# traceback. Imported first inside a test, that traceback would hold the test's frames (its builders, layers and
# metadata) until the process ends, and nanobind reports them as leaked at exit. Imported here, at collection,
# it holds only the collection's frames.
try:
    import vllm.model_executor.layers.attention.attention  # noqa: F401
    import vllm.model_executor.layers.attention.mla_attention  # noqa: F401
except ImportError:  # the vLLM tests skip themselves
    pass


def kv_cache_utils():
    """vLLM's vllm.v1.core.kv_cache_utils (the KV-cache grouping and config code of its engine). It imports
    vllm.v1.request, which imports the structured-output backends, whose module bodies name llguidance and
    xgrammar types in class annotations; neither package is installed here (vLLM is installed without its
    dependencies), so while the module is imported a stand-in module answers those names. Nothing of them is
    called; the stand-ins leave sys.modules afterwards."""
    import importlib.util

    missing = [n for n in ("llguidance", "xgrammar") if n not in sys.modules and importlib.util.find_spec(n) is None]

    def stub(name):
        m = types.ModuleType(name)

        def attr(a):
            if a.startswith("__"):
                raise AttributeError(a)
            return type(a, (), {})

        m.__getattr__ = attr
        return m

    try:
        for n in missing:
            sys.modules[n] = stub(n)
        from vllm.v1.core import kv_cache_utils
    finally:
        for n in missing:
            sys.modules.pop(n, None)
    return kv_cache_utils


# --- vLLM objects the adapter tests build the same way in several files

def common_metadata(qsl, seq_lens, bt, slots):
    """vLLM's CommonAttentionMetadata of a batch (cumulative query ends, KV lengths, block table, slot mapping)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q_lens = (qsl[1:] - qsl[:-1]).tolist()
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq_lens, num_reqs=len(q_lens),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(q_lens), max_seq_len=int(seq_lens.max()),
        block_table_tensor=bt, slot_mapping=slots, _seq_lens_cpu=seq_lens)


@contextlib.contextmanager
def vllm_registration():
    """register(family=...) changes vLLM's process state (the CUSTOM slot, the SparseAttnIndexer replacement):
    both as they were on exit, the replacement removed while the block runs."""
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES

    saved = dict(_ATTN_OVERRIDES)
    had = op_registry_oot.pop("SparseAttnIndexer", None)
    try:
        yield
    finally:
        _ATTN_OVERRIDES.clear()
        _ATTN_OVERRIDES.update(saved)
        op_registry_oot.pop("SparseAttnIndexer", None)
        if had is not None:
            op_registry_oot["SparseAttnIndexer"] = had


def mla_dims(cfg):
    """(heads on this rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank)."""
    hf = cfg.model_config.hf_text_config
    return (cfg.model_config.get_num_attention_heads(cfg.parallel_config), hf.kv_lora_rank, hf.qk_nope_head_dim,
            hf.qk_rope_head_dim, hf.v_head_dim, hf.q_lora_rank)


def mla_impl(cfg, kv_b_proj, **over):
    """The adapter's MLA impl with the arguments vLLM's MLAAttention gives it (``over`` replaces some)."""
    from vllm.v1.attention.backend import AttentionType

    from ascend_attn_rt.vllm import AscendAttnRtMlaBackend

    N, L, P, R, V, Q = mla_dims(cfg)
    kw = dict(num_heads=N, head_size=L + R, scale=(P + R) ** -0.5, num_kv_heads=1, alibi_slopes=None,
              sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
              kv_sharing_target_layer_name=None, q_lora_rank=Q, kv_lora_rank=L, qk_nope_head_dim=P,
              qk_rope_head_dim=R, qk_head_dim=P + R, v_head_dim=V, kv_b_proj=kv_b_proj)
    kw.update(over)
    return AscendAttnRtMlaBackend.get_impl_cls()(**kw)


def mla_layer(impl, cfg, kv_b_proj, name=None, kv_cache=None):
    """The attributes of vLLM's MLAAttention that its forward_impl reads, with W_UK_T / W_UV made the way its
    process_weights_after_loading makes them; vLLM's own forward_impl and _v_up_proj then run on it (building the
    real layer needs vLLM's distributed state and a device platform). With ``name``, also what its forward reads
    (direct call, the layer name, ``kv_cache``) and that forward bound: it takes the metadata and slot mapping of
    ``name`` from the forward context."""
    import torch
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    N, L, P, R, V, _ = mla_dims(cfg)
    w = kv_b_proj.weight.T.view(L, N, P + V)
    w_uk, w_uv = w.split([P, V], dim=-1)
    layer = types.SimpleNamespace(
        impl=impl, num_heads=N, kv_lora_rank=L, qk_nope_head_dim=P, qk_rope_head_dim=R, v_head_dim=V,
        kv_cache_dtype="auto", use_pcp=False, q_pad_num_heads=getattr(impl, "q_pad_num_heads", None),
        is_aiter_triton_fp4_bmm_enabled=False, is_aiter_triton_fp8_bmm_enabled=False, prefill_backend=None,
        dcp_a2a=False, dcp_q_replicate=False, W_UK_T=w_uk.permute(1, 2, 0), W_UV=w_uv.transpose(0, 1),
        _k_scale=torch.ones(()), _vllm_config=cfg)
    layer._v_up_proj = types.MethodType(MLAAttention._v_up_proj, layer)
    layer.forward_impl = types.MethodType(MLAAttention.forward_impl, layer)
    if name is not None:
        layer.calculate_kv_scales, layer.use_direct_call, layer.layer_name = False, True, name
        layer.kv_cache = kv_cache
        layer.forward = types.MethodType(MLAAttention.forward, layer)
    return layer


def attention_layer(impl, backend, name, kv_cache, num_heads, num_kv_heads, head_size):
    """The attributes vLLM's Attention.forward and unified_attention_with_output read, with that forward bound (the
    real layer needs vLLM's distributed state and a device platform); register it in the config's
    ``compilation_config.static_forward_context`` under ``name`` for the forward context to find it."""
    from vllm.model_executor.layers.attention.attention import Attention

    layer = types.SimpleNamespace(
        calculate_kv_scales=False, query_quant=None, num_heads=num_heads, head_size=head_size, head_size_v=head_size,
        num_kv_heads=num_kv_heads, use_direct_call=True, attn_backend=backend, kv_sharing_target_layer_name=None,
        layer_name=name, impl=impl, kv_cache=kv_cache)
    layer.forward = types.MethodType(Attention.forward, layer)
    return layer


# --- vLLM's graph wrapper (docs/design/vllm_sparse.md §6.1)

def graph_wrapper_cls():
    """The static graph wrapper class vLLM resolves through its platform (the adapter's after
    install_graph_wrapper())."""
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import resolve_obj_by_qualname

    return resolve_obj_by_qualname(current_platform.get_static_graph_wrapper_cls())


def log_graph_calls(monkeypatch) -> list:
    """Logs the adapter's graph updates ``("update", n)`` and the wrapper's segment calls ``(mode, kind)`` in order
    (patched through ``monkeypatch``, undone with it)."""
    from ascend_attn_rt.vllm import graph as vgraph

    log = []
    update, run = vgraph.update, vgraph._Tape.run

    def logged_update(n, md):
        log.append(("update", n))
        return update(n, md)

    def logged_run(self, kind, *a, **k):
        log.append((self.mode, kind))
        return run(self, kind, *a, **k)

    monkeypatch.setattr(vgraph, "update", logged_update)
    monkeypatch.setattr(vgraph._Tape, "run", logged_run)
    return log
