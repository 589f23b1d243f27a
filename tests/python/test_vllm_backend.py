"""The vLLM v1 attention-backend adapter (ascend_attn_rt.vllm) on vLLM 0.27.1's own config and
metadata objects: real VllmConfig objects built from the local model configs in
tests/python/data (a Llama-like GQA model and a DeepSeek-V2-like MLA model), vLLM's
CommonAttentionMetadata for decode, prefill, chunked-prefill and mixed batches.
GQA outputs are checked against the float64 reference; the MLA metadata against the
slots, lengths and splits recomputed here; the MLA impl runs inside vLLM's own
MLAAttention.forward_impl (its W_UK absorption, decode/prefill split and W_UV) and is
checked against the float64 un-absorbed reference."""

import copy
import os
import types

import pytest
import torch

vllm_backend = pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec  # noqa: E402

from ascend_attn_rt.vllm import AscendAttnRtBackend, AscendAttnRtMlaBackend  # noqa: E402
from _reference import assert_close, make_batch, new_output, random_block_table  # noqa: E402
from _mla_reference import latent_attention_reference  # noqa: E402
from _vllm_support import (common_metadata as _common_metadata, mla_dims as _mla_dims,  # noqa: E402,F401
                           mla_impl as _mla_impl, mla_layer as _mla_layer)

DATA = os.path.join(os.path.dirname(__file__), "data")
BS = 16
MAX_LEN = 512
BATCHES = [
    pytest.param([17, 40, 5], [1, 1, 1], id="decode"),
    pytest.param([9, 30], [9, 30], id="prefill"),
    pytest.param([40, 70], [8, 20], id="chunked_prefill"),
    pytest.param([33, 12, 50], [1, 1, 14], id="mixed"),
]


def _vllm_config(model_dir):
    # What `vllm serve DIR --block-size 16 --max-model-len 512 --max-num-seqs 8` builds,
    # without a tokenizer (none is checked in) and on the CPU device.
    path = os.path.join(DATA, model_dir)
    mc = ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True, dtype="float16", max_model_len=MAX_LEN)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    return VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                      device_config=DeviceConfig(device="cpu"))


@pytest.fixture(scope="module")
def gqa_config():
    return _vllm_config("vllm_tiny_gqa")


@pytest.fixture(scope="module")
def mla_config():
    return _vllm_config("vllm_tiny_mla")


def test_real_configs(gqa_config, mla_config):
    g, m = gqa_config.model_config, mla_config.model_config
    assert g.architectures == ["LlamaForCausalLM"] and not g.use_mla
    assert m.architectures == ["DeepseekV2ForCausalLM"] and m.use_mla
    assert m.get_head_size() == 64 + 16  # kv_lora_rank + qk_rope_head_dim
    assert gqa_config.cache_config.block_size == BS and mla_config.scheduler_config.max_num_seqs == 8


@pytest.mark.parametrize("seq_lens,q_lens", BATCHES)
def test_gqa_builder_and_forward(gqa_config, seq_lens, q_lens):
    mc = gqa_config.model_config
    N = mc.get_num_attention_heads(gqa_config.parallel_config)
    NKV = mc.get_num_kv_heads(gqa_config.parallel_config)
    D = mc.get_head_size()
    gen = torch.Generator().manual_seed(7)
    b = make_batch(seq_lens, q_lens, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=mc.dtype,
                   block_size=BS, gen=gen, width=MAX_LEN // BS)
    gqa_config.cache_config.num_gpu_blocks = b.num_blocks  # set by vLLM after profiling
    spec = FullAttentionSpec(block_size=gqa_config.cache_config.block_size, num_kv_heads=NKV, head_size=D,
                             dtype=mc.dtype)
    builder = AscendAttnRtBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], gqa_config,
                                                    torch.device("cpu"))
    cam = _common_metadata(b.query_start_loc, b.seq_lens_t, b.block_table,
                           torch.tensor(b.new_slots, dtype=torch.int64))
    md = builder.build(0, cam)
    impl = AscendAttnRtBackend.get_impl_cls()(N, D, D ** -0.5, NKV)
    shape = AscendAttnRtBackend.get_kv_cache_shape(b.num_blocks, BS, NKV, D)
    kv_cache = torch.stack([b.key_cache, b.value_cache])
    assert tuple(kv_cache.shape) == shape
    out = new_output(b).view(b.q.shape[0], N * D)
    impl.forward(None, b.q.view(-1, N * D), b.k.view(-1, NKV * D), b.v.view(-1, NKV * D), kv_cache, md, out)
    n = b.num_actual_tokens
    assert_close(out.view(-1, N, D)[:n], b.reference(), mc.dtype)


@pytest.mark.parametrize("seq_lens,q_lens", BATCHES)
def test_mla_builder(mla_config, seq_lens, q_lens):
    mc = mla_config.model_config
    head = mc.get_head_size()
    nb = 64
    mla_config.cache_config.num_gpu_blocks = nb
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=head, dtype=mc.dtype, cache_dtype_str="auto")
    builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], mla_config,
                                                       torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    bt = random_block_table(seq_lens, BS, nb, gen, width=MAX_LEN // BS)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    slots = []
    for i, (s, q) in enumerate(zip(seq_lens, q_lens)):
        slots += [int(bt[i, p // BS]) * BS + p % BS for p in range(s - q, s)]
    md = builder.build(0, _common_metadata(qsl, sl, bt, torch.tensor(slots, dtype=torch.int64)))

    nd = sum(1 for q in q_lens if q == 1)  # the batches are in vLLM's reordered form: decodes first
    assert (md.num_decodes, md.num_prefills) == (nd, len(q_lens) - nd)
    assert md.num_decode_tokens == nd and md.num_prefill_tokens == sum(q_lens) - nd
    assert md.num_actual_tokens == sum(q_lens) and md.block_size == BS
    assert md.slot_mapping[: len(slots)].tolist() == slots
    assert md.decode_seq_lens_list == seq_lens[:nd]
    has_context = any(s > q for s, q in zip(seq_lens[nd:], q_lens[nd:]))
    assert (md.num_context_chunks > 0) == has_context
    if has_context:
        total_ctx = sum(s - q for s, q in zip(seq_lens[nd:], q_lens[nd:]))
        assert sum(md.context_seq_tot) == total_ctx
    shape = AscendAttnRtMlaBackend.get_kv_cache_shape(nb, BS, 1, head)
    assert shape == (nb, BS, head) and AscendAttnRtMlaBackend.is_mla()


MLA_BATCHES = [pytest.param(*p.values, 0, id=p.id) for p in BATCHES] + [
    pytest.param([20, 31, 9], [3, 2, 1], 2, id="spec_decode"),
    pytest.param([20, 31, 40], [3, 1, 12], 2, id="spec_decode_mixed"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("seq_lens,q_lens,spec", MLA_BATCHES)
def test_mla_impl_in_vllm_forward(mla_config, seq_lens, q_lens, spec, dtype):
    cfg = copy.copy(mla_config)
    if spec:
        # What vLLM's speculative config tells the builder (the draft model itself is not needed here).
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    N, L, P, R, V, _ = _mla_dims(cfg)
    nb = 64
    cfg.cache_config.num_gpu_blocks = nb
    kv_spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=dtype, cache_dtype_str="auto")
    builder = AscendAttnRtMlaBackend.get_builder_cls()(kv_spec, ["model.layers.0.self_attn.attn"], cfg,
                                                       torch.device("cpu"))
    assert builder.reorder_batch_threshold == 1 + spec
    gen = torch.Generator().manual_seed(11)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    bt = random_block_table(seq_lens, BS, nb, gen, width=MAX_LEN // BS)
    kv_cache = rnd(*AscendAttnRtMlaBackend.get_kv_cache_shape(nb, BS, 1, L + R))  # garbage where unused
    c = [rnd(s, L) for s in seq_lens]
    kpe = [rnd(s, R) for s in seq_lens]
    q = [rnd(ql, N, P + R) for ql in q_lens]
    kv_b_proj = torch.nn.Linear(L, N * (P + V), bias=False, dtype=dtype).requires_grad_(False)  # as vLLM's
    kv_b_proj.weight.copy_(rnd(N * (P + V), L, scale=L ** -0.5))
    impl = _mla_impl(cfg, kv_b_proj)
    # The context was written by earlier steps (through the impl, at vLLM's slots).
    ctx_slots, new_slots = [], []
    for i, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        row = [int(bt[i, p // BS]) * BS + p % BS for p in range(s)]
        ctx_slots += row[: s - ql]
        new_slots += row[s - ql:]
    ctx = lambda xs: torch.cat([x[: s - ql] for x, s, ql in zip(xs, seq_lens, q_lens)])  # noqa: E731
    new = lambda xs: torch.cat([x[s - ql:] for x, s, ql in zip(xs, seq_lens, q_lens)])  # noqa: E731
    impl.do_kv_cache_update(ctx(c), ctx(kpe).unsqueeze(1), kv_cache, torch.tensor(ctx_slots, dtype=torch.int64),
                            "auto", torch.ones(()))

    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    slots = torch.tensor(new_slots, dtype=torch.int64)
    md = builder.build(0, _common_metadata(qsl, sl, bt, slots))
    # MLAAttention.forward: the cache update, then forward_impl on the step's tokens.
    kv_c, k_pe = new(c), new(kpe).unsqueeze(1)
    impl.do_kv_cache_update(kv_c, k_pe, kv_cache, slots, "auto", torch.ones(()))
    out = torch.full((int(qsl[-1]), N * V), 7.0, dtype=dtype)
    layer = _mla_layer(impl, cfg, kv_b_proj)
    layer.forward_impl(torch.cat(q), kv_c, k_pe, kv_cache, md, output=out)

    ref = torch.cat([latent_attention_reference(q[r], c[r], kpe[r], kv_b_proj.weight.detach(), ql, impl.scale,
                                                N, P, V) for r, ql in enumerate(q_lens)])
    assert_close(out.view(-1, N, V), ref, dtype)
    assert md.num_decodes == sum(1 for x in q_lens if x <= builder.reorder_batch_threshold)
    assert (md.decode is None) == (md.num_decodes == 0) and (md.prefill is None) == (md.num_prefills == 0)


def test_no_binding_outlives_the_interpreter():
    """A process that ran the adapter's MLA layer through vLLM's forward_impl ends with none of the runtime's
    objects alive: nanobind names every instance, type and function still alive when its module is freed at exit.
    (Run in a child process, since the report comes at interpreter exit.)"""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    test = os.path.join(here, "test_vllm_backend.py") + "::test_mla_impl_in_vllm_forward[decode-fp32]"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          capture_output=True, text=True, timeout=300, cwd=here)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    assert "nanobind: leaked" not in proc.stderr, proc.stderr[-2000:]


def test_mla_impl_remakes_its_cache_views_when_the_buffer_moves(mla_config):
    N, L, P, R, V, _ = _mla_dims(mla_config)
    impl = _mla_impl(mla_config, torch.nn.Linear(L, N * (P + V), bias=False))
    kv = torch.zeros(4, BS, L + R)
    nope, _ = impl._caches(kv)
    assert impl._caches(kv)[0] is nope  # made once per buffer
    kv.set_(torch.zeros(6, BS, L + R))  # moved in place: same tensor object, other memory
    nope2, rope2 = impl._caches(kv)
    assert nope2.data_ptr() == kv.data_ptr() and nope2.shape[0] == 6 and rope2.shape == (6, BS, 1, R)
    impl.do_kv_cache_update(torch.ones(1, L), torch.ones(1, 1, R), kv, torch.tensor([5]), "auto", torch.ones(()))
    assert torch.equal(kv.view(-1)[5 * L:6 * L], torch.ones(L))


def test_mla_impl_refusals(mla_config):
    lin = torch.nn.Linear(64, 8 * 64, bias=False)
    with pytest.raises(NotImplementedError, match="sliding_window"):
        _mla_impl(mla_config, lin, sliding_window=128)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):
        _mla_impl(mla_config, lin, kv_cache_dtype="fp8")
    with pytest.raises(NotImplementedError, match="output_scale"):
        _mla_impl(mla_config, lin).forward_mha(None, None, None, None, None, None, None, output_scale=torch.ones(1))
    with pytest.raises(ValueError, match="block_size=24"):
        AscendAttnRtMlaBackend.get_kv_cache_shape(8, 24, 1, 80)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        AscendAttnRtMlaBackend.get_kv_cache_shape(8, 16, 2, 80)


def test_refusals():
    with pytest.raises(NotImplementedError, match="output_scale"):
        AscendAttnRtBackend.get_impl_cls()(8, 32, 1.0, 2).forward(
            None, None, None, None, None, None, None, output_scale=torch.ones(1))
    assert AscendAttnRtBackend.get_name() == "CUSTOM"


@pytest.mark.parametrize("mla", [False, True])
def test_register_installs_the_backend_vllm_resolves(mla):
    from vllm.v1.attention.backends.registry import _ATTN_OVERRIDES, AttentionBackendEnum
    from ascend_attn_rt import vllm as aar_vllm

    saved = dict(_ATTN_OVERRIDES)
    try:
        aar_vllm.register(mla=mla)
        cls = AttentionBackendEnum.CUSTOM.get_class()
        assert cls is (AscendAttnRtMlaBackend if mla else AscendAttnRtBackend)
        assert cls.get_impl_cls().__name__ == ("AscendAttnRtMlaImpl" if mla else "AscendAttnRtImpl")
    finally:
        _ATTN_OVERRIDES.clear()
        _ATTN_OVERRIDES.update(saved)
