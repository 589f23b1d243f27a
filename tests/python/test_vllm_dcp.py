"""Decode context parallel through the vLLM adapter (docs/design/vllm_sparse.md §7), GQA and MLA, on two
ranks over gloo (127.0.0.1 file store, bounded timeouts: _cp_harness.run_ranks).

Each rank sets up vLLM's own process groups the way vLLM's workers do
(``init_distributed_environment`` + ``initialize_model_parallel(tensor_model_parallel_size=2,
decode_context_model_parallel_size=2)``, backend gloo), builds real VllmConfig objects from the local
model configs in tests/python/data (TP 2, DCP 2, ``cp_kv_cache_interleave_size``), and runs the
adapter's builders and impls as vLLM does: GQA through ``impl.forward``, MLA inside vLLM's own
``MLAAttention.forward_impl`` (its W_UK absorption, decode/prefill split, W_UV). The impls take vLLM's
DCP group from ``get_dcp_group()`` themselves.

Every rank regenerates the same global steps from one seed (all heads' queries, every token's K/V or
latent), holds its TP shard of the heads (rank r: heads [r H, (r+1) H), vLLM's column-parallel
order) and its own DCP shard of the KV cache, written by the adapter at the step's slots; vLLM's
per-step slot mapping and ``dcp_local_seq_lens`` are computed here the way vLLM's model runner does
(the slot formula of vLLM's Triton kernel written out: no Triton on CPU; ``get_dcp_local_seq_lens``
called). Outputs are compared with float64 attention over the whole, unsplit sequence, this rank's
heads, explicit causal masks. Steps: fresh prefills, a mixed batch (decodes, a chunked prefill over
cached context, a fresh prefill), a decode of every request, 3-token steps (speculative decodes with
2 speculative tokens, short extends without). Graph mode (_graph_bucket): a decode bucket captured through the
adapter (GQA through vLLM's Attention layer, MLA's entry points; interleave 4, 8, 1 and 4) and replayed over full
steps and steps that vLLM's padding requests fill to the bucket: the real rows equal eager runs of the same steps and
float64 attention over the whole sequence, and the caches hold only the real requests' new rows. The same padded
steps through vLLM's graph wrapper (AscendAttnRtGraphWrapper, driven by the forward context; MLA through vLLM's
MLAAttention.forward) run in test_vllm_dcp_padded_decode_through_vllms_graph_wrapper. Configurations: GQA (4 query heads per
KV head on each rank) and MHA per rank (one query head, one KV head), MLA; fp32 and bf16;
interleave 1 and > 1.
"""

import math
import os
import types

import pytest
import torch

from _cp_harness import local_index, local_len, owner, run_ranks
from _vllm_support import mla_impl as _mla_impl, mla_layer as _mla_layer

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

DATA = os.path.join(os.path.dirname(__file__), "data")
BS = 16
MAX_LEN = 256
W = 2
WIDTH = -(-MAX_LEN // (BS * W))  # vLLM's block-table width under DCP: virtual blocks of BS * W positions
NB = 1 + 5 * WIDTH  # block 0 unused, distinct blocks for five requests
VLLM_MODULES = ("vllm.config", "vllm.distributed.parallel_state", "vllm.v1.attention.backend",
                "vllm.v1.kv_cache_interface", "vllm.model_executor.layers.attention.mla_attention",
                "ascend_attn_rt.vllm")

# (seq_lens after the step, query lengths, is_prefilling) of the requests of each step, decode-first.
STEPS = [
    ([0, 1, 2, 3], [5, 21, 37, 2], [True, True, True, True]),                    # fresh prefills
    ([0, 1, 2, 4], [1, 1, 9, 11], [False, False, True, True]),                   # mixed: decodes, chunk, fresh
    ([0, 1, 2, 3, 4], [1, 1, 1, 1, 1], [False, False, False, False, False]),     # decode
    # 3 tokens each: with 2 speculative tokens a speculative decode (one row per token, the
    # interleave-aware causal mask, docs/design/cp.md §3.3), without a short extend (a prefill over context)
    ([0, 1, 3], [3, 3, 3], [False, False, False]),
]


def _close(got, ref, dtype, what):
    # against the float64 reference: |got - ref| <= tol + tol |ref|, tol 1e-5 in fp32, 1e-2 in bf16 (the house tolerances)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    err = float(((got.double() - ref).abs() - tol * ref.abs()).max())
    assert err <= tol, f"{what}: max excess error {err} (tol {tol})"


def _vllm_config(model_dir, interleave, overrides=None, spec=0):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    path = os.path.join(DATA, model_dir)
    mc = ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True, dtype="float16", max_model_len=MAX_LEN,
                     hf_overrides=overrides or {})
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    pc = ParallelConfig(tensor_parallel_size=W, decode_context_parallel_size=W,
                        cp_kv_cache_interleave_size=interleave)
    cfg = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                     parallel_config=pc, device_config=DeviceConfig(device="cpu"))
    cfg.cache_config.num_gpu_blocks = NB  # set by vLLM after profiling
    if spec:
        # What vLLM's speculative config tells the builders (the draft model itself is not needed here).
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    return cfg


def _init_vllm_groups(rank, cfg):
    """vLLM's worker set-up of its groups (over the gloo world the harness made)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with set_current_vllm_config(cfg):
        ps.init_distributed_environment(world_size=W, rank=rank, local_rank=rank, backend="gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=W, decode_context_model_parallel_size=W)
    g = ps.get_dcp_group()
    assert (g.world_size, g.rank_in_group) == (W, rank)


def _shm_names():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _release_vllm_groups(rank, shm_before):
    """vLLM's groups destroyed before the rank leaves: the harness ends a rank with os._exit, which skips the
    finalisers, so the TP group's shared-memory broadcast ring would stay in /dev/shm until the resource tracker
    removes it at the end of the whole run (with a "leaked shared_memory objects" warning). Rank 0 made the ring;
    once the groups are gone, nothing it made is left in /dev/shm."""
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    if rank == 0:
        left = sorted(n for n in _shm_names() - shm_before if n.startswith("psm_"))
        assert not left, f"shared memory left by vLLM's groups: {left}"


def _vllm_slots(bt_rows, seq_lens, q_lens, rank, interleave):
    """vLLM's per-token slot mapping under DCP (its _compute_slot_mapping_kernel): the rank's local slot of
    each new token's position in its virtual block, -1 where another rank owns it."""
    vbs = BS * W
    out = []
    for row, s, q in zip(bt_rows, seq_lens, q_lens):
        for p in range(s - q, s):
            vb, off = divmod(p, vbs)
            if (off // interleave) % W != rank:
                out.append(-1)
                continue
            local = (off // (W * interleave)) * interleave + off % interleave
            out.append(int(row[vb + local // BS]) * BS + local % BS)  # one kernel block per KV block
    return torch.tensor(out, dtype=torch.int64)


def _common_metadata(reqs, seq_lens, q_lens, prefilling, bt, rank, interleave):
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.utils import get_dcp_local_seq_lens

    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    rows = bt[list(reqs)].contiguous()
    slots = _vllm_slots(rows, seq_lens, q_lens, rank, interleave)
    local = get_dcp_local_seq_lens(sl, W, rank, interleave)
    # The formula of docs/design/cp.md §2.2 agrees with vLLM's.
    assert local.tolist() == [local_len(s, W, interleave, rank) for s in seq_lens]
    cam = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=len(reqs), num_actual_tokens=int(qsl[-1]),
        max_query_len=max(q_lens), max_seq_len=max(seq_lens), block_table_tensor=rows, slot_mapping=slots,
        _seq_lens_cpu=sl, is_prefilling=torch.tensor(prefilling), dcp_local_seq_lens=local,
        dcp_local_seq_lens_cpu=local)
    return cam, slots


def _num_decodes(q_lens, prefilling, threshold):
    # The split under DCP (docs/design/cp.md §3.2): a decode is short and no longer prefilling its prompt.
    return sum(1 for n, p in zip(q_lens, prefilling) if n <= threshold and not p)


def _block_table(gen):
    # One table for every rank (vLLM's scheduler gives the DCP ranks the same block ids).
    ids = torch.randperm(NB - 1, generator=gen)[: 5 * WIDTH] + 1
    return ids.view(5, WIDTH).to(torch.int32)


def _check_shard(cache_rows, hist, bt, rank, interleave, dtype, what):
    """The rank's cache holds exactly its own tokens (cache_rows(block, offset) -> row)."""
    for r, rows in enumerate(hist):
        for x in range(rows.shape[0]):
            if owner(x, W, interleave) != rank:
                continue
            li = local_index(x, W, interleave)
            got = cache_rows(int(bt[r, li // BS]), li % BS)
            assert torch.equal(got, rows[x].to(dtype)), f"{what}: cache row of request {r} position {x}"


# ----------------------------------------------------------------------------------------------- GQA


def _gqa_ref(q, K, V, n):
    # q (n, H, D) float64, the request's last n positions; K/V (L, 1, D): one KV head for every query head.
    L = K.shape[0]
    s = torch.einsum("nhd,ld->hnl", q, K[:, 0]) / math.sqrt(q.shape[-1])
    pos = torch.arange(L - n, L)[:, None]
    s = s.masked_fill(torch.arange(L)[None, :] > pos, -math.inf)
    return torch.einsum("hnl,ld->nhd", torch.softmax(s, -1), V[:, 0])


def _gqa_case(rank, cfg, dtype, interleave, seed):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from ascend_attn_rt.vllm import AscendAttnRtBackend

    mc = cfg.model_config
    pc = cfg.parallel_config
    H, Hkv, D = mc.get_num_attention_heads(pc), mc.get_num_kv_heads(pc), mc.get_head_size()
    Ht = H * W
    assert Hkv == 1  # vLLM's GQA DCP rule: TP > total KV heads, so one KV head per rank
    gen = torch.Generator().manual_seed(seed)
    bt = _block_table(gen)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=Hkv, head_size=D, dtype=dtype)
    builder = AscendAttnRtBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], cfg, torch.device("cpu"))
    impl = AscendAttnRtBackend.get_impl_cls()(H, D, D ** -0.5, Hkv)
    assert impl.dcp_world_size == W and impl.need_to_return_lse_for_decode
    kv = torch.randn(*AscendAttnRtBackend.get_kv_cache_shape(NB, BS, Hkv, D), generator=torch.Generator().manual_seed(
        90 + rank)).to(dtype)  # garbage where nothing is written
    hist = [(torch.zeros(0, 1, D, dtype=torch.float64), torch.zeros(0, 1, D, dtype=torch.float64)) for _ in range(5)]
    for reqs, q_lens, prefilling in STEPS:
        T = sum(q_lens)
        q_all = torch.randn(T, Ht, D, generator=gen, dtype=torch.float64)
        k = torch.randn(T, 1, D, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(T, 1, D, generator=gen, dtype=torch.float64).to(dtype)
        q = q_all[:, rank * H:(rank + 1) * H].to(dtype).contiguous()
        seq = [hist[r][0].shape[0] + n for r, n in zip(reqs, q_lens)]
        cam, slots = _common_metadata(reqs, seq, q_lens, prefilling, bt, rank, interleave)
        md = builder.build(0, cam)
        assert md.slot_mapping[:T].tolist() == slots.tolist()  # the runtime's local slots are vLLM's
        assert md.num_decodes == _num_decodes(q_lens, prefilling, builder.reorder_batch_threshold)
        out = torch.full((T, H * D), float("nan"), dtype=dtype)
        impl.forward(None, q.view(T, H * D), k.view(T, D), v.view(T, D), kv, md, out)
        qsl = cam.query_start_loc_cpu.tolist()
        for i, (r, n) in enumerate(zip(reqs, q_lens)):
            rows = slice(qsl[i], qsl[i + 1])
            hist[r] = (torch.cat([hist[r][0], k[rows].double()]), torch.cat([hist[r][1], v[rows].double()]))
            ref = _gqa_ref(q[rows].double(), hist[r][0], hist[r][1], n)
            _close(out[rows].view(n, H, D), ref, dtype, f"GQA H={H} {dtype} I={interleave} request {r} (q={n}, "
                   f"seq={seq[i]})")
    _check_shard(lambda b, o: kv[0, b, o], [h[0] for h in hist], bt, rank, interleave, dtype, "GQA key cache")
    return len(STEPS)


# ----------------------------------------------------------------------------------------------- MLA


def _mla_case(rank, cfg, dtype, interleave, seed):
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from _mla_reference import latent_attention_reference
    from ascend_attn_rt.vllm import AscendAttnRtMlaBackend

    hf = cfg.model_config.hf_text_config
    H = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
    L, P, R, V = hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim, hf.v_head_dim
    gen = torch.Generator().manual_seed(seed)
    bt = _block_table(gen)
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=dtype, cache_dtype_str="auto")
    builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], cfg,
                                                       torch.device("cpu"))
    # The model's kv_b_proj (all heads) and this rank's column-parallel shard of it.
    w_full = (torch.randn(W * H * (P + V), L, generator=gen, dtype=torch.float64) * L ** -0.5).to(dtype)
    kv_b_proj = torch.nn.Linear(L, H * (P + V), bias=False, dtype=dtype).requires_grad_(False)
    kv_b_proj.weight.copy_(w_full[rank * H * (P + V):(rank + 1) * H * (P + V)])
    impl = _mla_impl(cfg, kv_b_proj)
    # vLLM's layer is shown one rank: the runtime gathers and merges inside forward_mqa (§7).
    assert impl.runtime_dcp_world_size == W and impl.dcp_world_size == 1 and impl.need_to_return_lse_for_decode
    layer = _mla_layer(impl, cfg, kv_b_proj)
    kv_cache = torch.randn(*AscendAttnRtMlaBackend.get_kv_cache_shape(NB, BS, 1, L + R),
                           generator=torch.Generator().manual_seed(70 + rank)).to(dtype)
    c_hist = [torch.zeros(0, L, dtype=dtype) for _ in range(5)]
    pe_hist = [torch.zeros(0, R, dtype=dtype) for _ in range(5)]
    for reqs, q_lens, prefilling in STEPS:
        T = sum(q_lens)
        q_all = (torch.randn(T, W * H, P + R, generator=gen, dtype=torch.float64)).to(dtype)
        c = torch.randn(T, L, generator=gen, dtype=torch.float64).to(dtype)
        pe = torch.randn(T, R, generator=gen, dtype=torch.float64).to(dtype)
        q = q_all[:, rank * H:(rank + 1) * H].contiguous()
        seq = [c_hist[r].shape[0] + n for r, n in zip(reqs, q_lens)]
        cam, slots = _common_metadata(reqs, seq, q_lens, prefilling, bt, rank, interleave)
        md = builder.build(0, cam)
        assert md.slot_mapping[:T].tolist() == slots.tolist()
        assert md.num_decodes == _num_decodes(q_lens, prefilling, builder.reorder_batch_threshold)
        # MLAAttention.forward: the cache update at vLLM's (local) slots, then forward_impl on the step.
        impl.do_kv_cache_update(c, pe.unsqueeze(1), kv_cache, slots, "auto", torch.ones(()))
        out = torch.full((T, H * V), 7.0, dtype=dtype)
        layer.forward_impl(q, c, pe.unsqueeze(1), kv_cache, md, output=out)
        qsl = cam.query_start_loc_cpu.tolist()
        for i, (r, n) in enumerate(zip(reqs, q_lens)):
            rows = slice(qsl[i], qsl[i + 1])
            c_hist[r] = torch.cat([c_hist[r], c[rows]])
            pe_hist[r] = torch.cat([pe_hist[r], pe[rows]])
            ref = latent_attention_reference(q[rows], c_hist[r], pe_hist[r], kv_b_proj.weight, n, impl.scale, H, P, V)
            _close(out[rows].view(n, H, V), ref, dtype, f"MLA {dtype} I={interleave} request {r} (q={n}, seq={seq[i]})")
    nope, _ = impl._caches(kv_cache)
    _check_shard(lambda b, o: nope[b, o, 0], c_hist, bt, rank, interleave, dtype, "MLA latent cache")
    return len(STEPS)


# ----------------------------------------------------------------------------------------------- graph mode

B = 4  # the decode bucket


def _decode_cam(seq, bt, rank, interleave):
    n = len(seq)
    return _common_metadata(list(range(n)), seq, [1] * n, [False] * n, bt, rank, interleave)


def _padded(cam, total):
    """vLLM's padding of a full-graph batch: empty requests (no tokens, KV length 0, block-table row 0, slot
    -1) up to `total`, num_actual_tokens the padded count."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    n = cam.num_reqs
    if n == total:
        return cam
    qsl = torch.cat([cam.query_start_loc_cpu, cam.query_start_loc_cpu[-1:].repeat(total - n)])
    sl = torch.cat([cam.seq_lens, torch.zeros(total - n, dtype=torch.int32)])
    rows = torch.zeros(total, cam.block_table_tensor.shape[1], dtype=torch.int32)
    rows[:n] = cam.block_table_tensor
    pad = torch.full((total - int(cam.query_start_loc_cpu[-1]),), -1, dtype=torch.int64)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=total, num_actual_tokens=total,
        max_query_len=1, max_seq_len=cam.max_seq_len, block_table_tensor=rows,
        slot_mapping=torch.cat([cam.slot_mapping, pad]), _seq_lens_cpu=sl,
        is_prefilling=torch.cat([cam.is_prefilling, torch.zeros(total - n, dtype=torch.bool)]))


class _GqaGraph:
    """One GQA layer under DCP as vLLM's Attention runs it (Attention.forward -> unified_attention_with_output -> the
    adapter's impl.forward, the KV write included): the runnable of both drivers."""

    kinds = ["GQA forward"]
    calls = ["kv_write", "prepare", "fia", "prepare"]

    def __init__(self, rank, cfg, interleave, gen, driver):
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        from ascend_attn_rt.vllm import AscendAttnRtBackend
        from _vllm_support import attention_layer

        mc = cfg.model_config
        self.H, self.D = H, D = mc.get_num_attention_heads(cfg.parallel_config), mc.get_head_size()
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=D, dtype=torch.float32)
        self.builder = AscendAttnRtBackend.get_builder_cls()(spec, ["l0"], cfg, torch.device("cpu"))
        self.layer = attention_layer(AscendAttnRtBackend.get_impl_cls()(H, D, D ** -0.5, 1), AscendAttnRtBackend,
                                     "l0", torch.zeros(*AscendAttnRtBackend.get_kv_cache_shape(NB, BS, 1, D)), H, 1, D)
        cfg.compilation_config.static_forward_context = {"l0": self.layer}

    def draw(self, gen, n):
        return [torch.randn(n, self.H * self.D, generator=gen), torch.randn(n, self.D, generator=gen),
                torch.randn(n, self.D, generator=gen)]

    def prefill(self, md, slots, inputs):
        self.forward(*inputs, md=md)

    def history(self, inputs, lo, hi):
        return [x[lo:hi].double().unsqueeze(1) for x in inputs[1:]]

    def forward(self, q, k, v, md=None):
        if md is not None:  # eagerly, outside a forward context (the context prefill)
            out = torch.empty(q.shape[0], self.H * self.D)
            self.layer.impl.forward(self.layer, q, k, v, self.layer.kv_cache, md, out)
            return out
        return self.layer.forward(q, k, v)

    def reference(self, inputs, r, hist):
        return _gqa_ref(inputs[0][r].view(1, self.H, self.D).double(), hist[0], hist[1], 1).reshape(-1)


class _MlaGraph:
    """One MLA layer under DCP. Driver "wrapper": vLLM's MLAAttention.forward (its cache update at the forward
    context's slot mapping, forward_impl: W_UK absorption, the adapter's forward_mqa, W_UV), whose tensor work runs
    eagerly between the wrapper's segments. Driver "adapter": the adapter's entry points that layer calls
    (do_kv_cache_update, forward_mqa; the recording provider replays only the runtime's calls), over static
    buffers."""

    def __init__(self, rank, cfg, interleave, gen, driver):
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        from ascend_attn_rt.vllm import AscendAttnRtMlaBackend
        from _vllm_support import mla_impl, mla_layer

        hf = cfg.model_config.hf_text_config
        self.H = H = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
        self.L, self.P, self.R, self.V = L, P, R, V = (hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim,
                                                       hf.v_head_dim)
        self.full = driver == "wrapper"
        self.kinds = ["MLA do_kv_cache_update", "MLA forward_mqa"]
        self.calls = ["prepare", "prepare", "fia", "prepare"]
        spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32,
                                cache_dtype_str="auto")
        self.builder = AscendAttnRtMlaBackend.get_builder_cls()(spec, ["l0"], cfg, torch.device("cpu"))
        self.kv_b = torch.nn.Linear(L, H * (P + V), bias=False).requires_grad_(False)
        self.kv_b.weight.copy_(torch.randn(H * (P + V), L, generator=gen) * L ** -0.5)
        self.layer = mla_layer(mla_impl(cfg, self.kv_b), cfg, self.kv_b, "l0",
                               torch.zeros(*AscendAttnRtMlaBackend.get_kv_cache_shape(NB, BS, 1, L + R)))

    def draw(self, gen, n):
        H, L, R = self.H, self.L, self.R
        q = ([torch.randn(n, H, self.P + R, generator=gen)] if self.full
             else [torch.randn(n, H, L, generator=gen), torch.randn(n, H, R, generator=gen)])
        return q + [torch.randn(n, L, generator=gen), torch.randn(n, 1, R, generator=gen)]

    def prefill(self, md, slots, inputs):
        self.layer.impl.do_kv_cache_update(inputs[-2], inputs[-1], self.layer.kv_cache, slots, "auto", torch.ones(()))

    def history(self, inputs, lo, hi):
        return [inputs[-2][lo:hi].double(), inputs[-1][lo:hi, 0].double()]

    def forward(self, *inputs):
        from vllm.forward_context import get_forward_context

        lay = self.layer
        if self.full:
            q, c, pe = inputs
            return lay.forward(q, c, pe, output_shape=(q.shape[0], self.H * self.V))
        qn, qr, c, pe = inputs
        ctx = get_forward_context()
        lay.impl.do_kv_cache_update(c, pe, lay.kv_cache, ctx.slot_mapping["l0"], "auto", torch.ones(()))
        return lay.impl.forward_mqa((qn, qr), lay.kv_cache, ctx.attn_metadata["l0"], None)[0]

    def reference(self, inputs, r, hist):
        from _mla_reference import latent_attention_reference

        c, pe = hist
        scale = self.layer.impl.scale
        if self.full:  # float64 un-absorbed MLA over every position of the request
            return latent_attention_reference(inputs[0][r: r + 1].double(), c, pe, self.kv_b.weight.double(), 1,
                                              scale, self.H, self.P, self.V).reshape(-1)
        w = torch.softmax((inputs[0][r].double() @ c.T + inputs[1][r].double() @ pe.T) * scale, -1)
        return (w @ c).reshape(-1)  # float64 latent attention over every position


def _graph_bucket(rank, family, cfg, interleave, seed, nreals, driver):
    """A FULL decode bucket of B requests under DCP, captured and replayed over steps of `nreals` real requests,
    vLLM's padding requests filling the rest (the builders make them one-token dummy decodes over block-table row 0,
    each rank its local lengths of them; docs/design/vllm_sparse.md §6). Driver "adapter": the family's runnable
    inside ascend_attn_rt.vllm.graph.capture, then update + replay per step; driver "wrapper": vLLM's graph wrapper
    resolved through its platform after install_graph_wrapper(), driven only by the forward context (FULL, the
    bucket's BatchDescriptor; docs/design/vllm_sparse.md §6.1). Per step: the real rows equal the runnable run eagerly
    on copies of the cache (through the wrapper with mode NONE for the wrapper) and float64 attention of this rank's
    heads over the whole, unsplit sequence; the cache equals both that eager run's and an eager run of the real
    requests alone (the padding tokens' slot -1 writes nothing on either rank)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context

    from ascend_attn_rt.vllm import graph as vgraph
    from _vllm_support import graph_wrapper_cls, log_graph_calls

    gen = torch.Generator().manual_seed(seed)  # the same draws on every rank: the global step
    fam = {"gqa": _GqaGraph, "mla": _MlaGraph}[family](rank, cfg, interleave, gen, driver)
    lay, builder = fam.layer, fam.builder
    bt = _block_table(gen)
    seq = [17, 5, 30, 9]
    cam, slots = _common_metadata(list(range(B)), seq, seq, [True] * B, bt, rank, interleave)
    x0 = fam.draw(gen, sum(seq))
    fam.prefill(builder.build(0, cam), slots, x0)  # the context, eagerly
    ends = torch.tensor([0] + seq).cumsum(0).tolist()
    hist = [fam.history(x0, ends[r], ends[r + 1]) for r in range(B)]
    statics = [torch.zeros(B, *x.shape[1:]) for x in x0]
    slots_s = torch.zeros(B, dtype=torch.int64)
    full, none = CUDAGraphMode.FULL, CUDAGraphMode.NONE
    desc = BatchDescriptor(num_tokens=B, num_reqs=B, uniform=True)

    def context(md, slot_mapping, mode=none):
        return set_forward_context({"l0": md}, cfg, cudagraph_runtime_mode=mode, batch_descriptor=desc,
                                   slot_mapping={"l0": slot_mapping})

    patch = pytest.MonkeyPatch()
    vgraph.set_graph_provider("recording")
    try:
        log = log_graph_calls(patch)
        cap_cam, cap_slots = _decode_cam([s + 1 for s in seq], bt, rank, interleave)
        md = builder.build_for_cudagraph_capture(cap_cam)
        if driver == "adapter":
            slots_s.copy_(cap_slots)
            with vgraph.capture(B), context(md, slots_s):
                out_s = fam.forward(*statics)
            # What the runtime recorded (GQA: its KV write first; the DCP decode's calls)
            assert [c[0] for c in vgraph.graph_params().calls(B)] == fam.calls
        else:
            vgraph.install_graph_wrapper()
            wrapper = graph_wrapper_cls()(fam.forward, cfg, full)
            with context(md, cap_slots, full):
                wrapper(*statics)
            assert log == [("capture", k) for k in fam.kinds]
        for nreal in nreals:
            seq[:nreal] = [s + 1 for s in seq[:nreal]]
            real, real_slots = _decode_cam(seq[:nreal], bt, rank, interleave)
            cam = _padded(real, B)
            md = builder.build(0, cam)
            # MLA: the padding requests as the runtime's dummy decodes; GQA: the real decodes (padding tokens unread)
            assert (md.num_decodes, md.num_prefills) == (B if family == "mla" else nreal, 0)
            x = fam.draw(gen, B)
            kv = lay.kv_cache
            # Eager on a copy of the cache: the padded step (through the wrapper with mode NONE for the wrapper).
            lay.kv_cache = kv2 = kv.clone()
            log.clear()
            with context(md, cam.slot_mapping):
                expected = (fam.forward(*x) if driver == "adapter" else wrapper(*x)).clone()
            assert log == []
            lay.kv_cache, kv3 = kv, kv.clone()
            for s_, t in zip(statics, x):
                s_.copy_(t)
            if driver == "adapter":
                slots_s.copy_(cam.slot_mapping)
                vgraph.update(B, {"l0": md})
                vgraph.replay(B)
                out = out_s
            else:
                with context(md, cam.slot_mapping, full):
                    out = wrapper(*statics)
                assert log == [("update", B)] + [("replay", k) for k in fam.kinds]  # the update before the replay
            what = f"{family} {driver} bucket I={interleave} ({nreal} real of {B})"
            # Eager of the real requests alone on another copy (built after the replay: a build makes the step's
            # metadata stale).
            lay.kv_cache = kv3
            with context(builder.build(0, real), real_slots):
                fam.forward(*(t[:nreal] for t in x))
            lay.kv_cache = kv
            torch.testing.assert_close(out[:nreal], expected[:nreal], atol=1e-6, rtol=1e-6, msg=lambda e: f"{what}: {e}")
            assert torch.equal(kv, kv2) and torch.equal(kv, kv3), what  # only the real requests' rows were written
            for r in range(nreal):
                hist[r] = [torch.cat([h, n]) for h, n in zip(hist[r], fam.history(x, r, r + 1))]
                _close(out[r].reshape(-1), fam.reference(x, r, hist[r]), torch.float32, f"{what} request {r}")
    finally:
        vgraph.uninstall_graph_wrapper()
        vgraph.clear_graph_provider()
        patch.undo()
    return 1


# ----------------------------------------------------------------------------------------------- refusals


def _refusals(rank, gqa_cfg, mla_cfg):
    """Rank-local refusals (no collective is issued): PCP, what the DCP layers do not take, vLLM's replicated
    DCP query, a DCP size that is not the group's, metadata of another DCP rank; the graph support declared
    under DCP."""
    import copy

    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    import ascend_attn_rt as aar
    from ascend_attn_rt.vllm import AscendAttnRtBackend, AscendAttnRtMlaBackend

    gspec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=32, dtype=torch.float32)
    gb = AscendAttnRtBackend.get_builder_cls()
    assert gb.get_cudagraph_support(gqa_cfg, gspec) == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    pcp = copy.copy(gqa_cfg)
    pcp.parallel_config = copy.copy(gqa_cfg.parallel_config)
    pcp.parallel_config.prefill_context_parallel_size = 2
    with pytest.raises(NotImplementedError, match="prefill_context_parallel_size=2"):
        gb(gspec, ["l"], pcp, torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="sliding_window"):
        AscendAttnRtBackend.get_impl_cls()(4, 32, 0.1, 1, sliding_window=64)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        AscendAttnRtBackend.get_impl_cls()(4, 32, 0.1, 1, kv_cache_dtype="fp8")
    hf = mla_cfg.model_config.hf_text_config
    mspec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                             dtype=torch.float32, cache_dtype_str="auto")
    assert AscendAttnRtMlaBackend.get_builder_cls().get_cudagraph_support(mla_cfg, mspec) == \
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    N = mla_cfg.model_config.get_num_attention_heads(mla_cfg.parallel_config)
    lin = torch.nn.Linear(hf.kv_lora_rank, N * (hf.qk_nope_head_dim + hf.v_head_dim), bias=False)
    impl = _mla_impl(mla_cfg, lin)
    layer = types.SimpleNamespace(dcp_q_replicate=True)
    with pytest.raises(NotImplementedError, match="dcp_q_replicate"):
        impl.forward_mqa((None, None), None, None, layer)
    # A config whose DCP size is not the group's.
    w4 = copy.copy(mla_cfg)
    w4.parallel_config = copy.copy(mla_cfg.parallel_config)
    w4.parallel_config.decode_context_parallel_size = 4
    with pytest.raises(ValueError, match="DCP group has 2 ranks but decode_context_parallel_size=4"):
        AscendAttnRtMlaBackend.get_builder_cls()(mspec, ["l"], w4, torch.device("cpu"))
    # Metadata of the other DCP rank: refused by the layer's comm check before anything is gathered or written.
    L, R = hf.kv_lora_rank, hf.qk_rope_head_dim
    zeros = torch.zeros(MAX_LEN, R)
    other = aar.mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=WIDTH, block_size=BS,
                                    num_blocks=NB, cos_table=zeros, sin_table=zeros, dcp_world_size=W,
                                    dcp_rank=1 - rank)
    bt = _block_table(torch.Generator().manual_seed(1))[:1].contiguous()
    md = other.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32), bt)
    kv = torch.zeros(NB, BS, L + R)
    with pytest.raises(ValueError, match=f"built for DCP rank {1 - rank} of 2 but the layer's dcp_comm is rank {rank}"):
        impl.forward_mqa((torch.zeros(1, N, L), torch.zeros(1, N, R)), kv, md, None)
    assert not kv.any()
    return 1


# ----------------------------------------------------------------------------------------------- the run


def _case(rank, world):
    torch.set_num_threads(1)  # the ranks share two cores
    gqa = _vllm_config("vllm_tiny_gqa", 1, {"num_key_value_heads": 1})  # 4 query heads per KV head per rank
    mha = _vllm_config("vllm_tiny_gqa", 4, {"num_attention_heads": 2, "num_key_value_heads": 1}, spec=2)  # MHA per rank
    mla = _vllm_config("vllm_tiny_mla", 1)
    mla_i = _vllm_config("vllm_tiny_mla", 8, spec=2)
    shm_before = _shm_names()
    _init_vllm_groups(rank, gqa)
    try:
        n = 0
        n += _gqa_case(rank, gqa, torch.float32, 1, seed=1)
        n += _gqa_case(rank, mha, torch.bfloat16, 4, seed=2)
        n += _mla_case(rank, mla, torch.float32, 1, seed=3)
        n += _mla_case(rank, mla_i, torch.bfloat16, 8, seed=4)
        n += _graph_bucket(rank, "gqa", mha, 4, seed=5, nreals=(B, B, B - 1, 2), driver="adapter")
        n += _graph_bucket(rank, "mla", mla_i, 8, seed=6, nreals=(B, B), driver="adapter")
        n += _graph_bucket(rank, "mla", mla, 1, seed=7, nreals=(3, 2, 1, B), driver="adapter")
        n += _graph_bucket(rank, "mla", _vllm_config("vllm_tiny_mla", 4), 4, seed=8, nreals=(3, 2, 1, B),
                           driver="adapter")
        n += _refusals(rank, gqa, mla)
        return n
    finally:
        _release_vllm_groups(rank, shm_before)


def test_vllm_dcp_gqa_and_mla_match_float64_over_the_whole_sequence():
    assert run_ranks(W, _case, deadline_s=120.0, preload=VLLM_MODULES) == [4 * len(STEPS) + 5] * W


def _wrapper_case(rank, world):
    torch.set_num_threads(1)  # the ranks share two cores
    mha = _vllm_config("vllm_tiny_gqa", 4, {"num_attention_heads": 2, "num_key_value_heads": 1})
    mla = _vllm_config("vllm_tiny_mla", 4)
    shm_before = _shm_names()
    _init_vllm_groups(rank, mha)
    try:
        return (_graph_bucket(rank, "gqa", mha, 4, seed=11, nreals=(B, 3, 2), driver="wrapper")
                + _graph_bucket(rank, "mla", mla, 4, seed=12, nreals=(3, 2, 1, B), driver="wrapper"))
    finally:
        _release_vllm_groups(rank, shm_before)


def test_vllm_dcp_padded_decode_through_vllms_graph_wrapper():
    """The padded FULL decode steps of _graph_bucket driven through AscendAttnRtGraphWrapper on both ranks (recording
    provider): GQA through vLLM's Attention layer, MLA through vLLM's MLAAttention.forward (docs/design/vllm_sparse.md
    §6.1, §7)."""
    assert run_ranks(W, _wrapper_case, deadline_s=90.0, preload=VLLM_MODULES) == [2] * W
