"""Decode context parallel through the vLLM sparse MLA adapter (DeepSeek-V3.2 / GLM-DSA,
docs/design/vllm_sparse.md §8) on two ranks over gloo (127.0.0.1 file store, bounded timeouts:
_cp_harness.run_ranks).

Each rank sets up vLLM's own groups as vLLM's workers do (TP 2, DCP 2, gloo; test_vllm_dcp's set-up),
builds a real VllmConfig of the local DeepseekV32ForCausalLM / GlmMoeDsaForCausalLM config and runs vLLM's
own layer code with the adapter registered (register(family=...)): vLLM's DeepseekV32IndexerCache and
SparseAttnIndexer (the runtime's op, re-pointing the cache layer to the replicated key cache), vLLM's
Indexer.forward (projections, k_norm, RoPE, fp8 query quantisation) on bare modules, and vLLM's sparse
MLAAttention layer itself (the cache update at vLLM's DCP slots, W_UK absorption, forward_mqa, W_UV).
The impl takes vLLM's DCP group from get_dcp_group() itself.

Every rank regenerates the same global steps from one seed (every token's hidden state, q-LoRA latent,
KV latent and rope key; all heads' queries, of which it holds its TP shard) over fresh caches: prefills,
a mixed batch (decodes, a chunked prefill over cached context, a fresh prefill), a decode of every request
and 3-token steps (speculative decodes with 2 draft tokens, short extends without). Checked per step:
  * the top-k rows equal the single-rank adapter's (its own indexer op, builder and unreplicated cache, given
    the same query, key and weights the DCP op received), exactly;
  * in fp32, the cached keys against float64 keys (_sfa_reference: LayerNorm, RoPE) and the rows against a
    brute-force float64 top-k of the query and weights the op received (_sfa_reference.topk_rows);
  * the output of this rank's heads against the float64 un-absorbed MLA attention over the selected positions
    of the whole, unsplit sequence (the kernel's scan rule, _sfa_reference.selected_positions);
  * the latent cache holds exactly this rank's positions; the replicated indexer cache every position.
vLLM's slot mapping (a Triton kernel) is computed with its formula written out (test_vllm_dcp._vllm_slots) and
checked equal to the runtime builder's local slots; an IndexCache skip layer gives the same output.
DeepSeek-V3.2 in fp32 with interleave 1, GLM-DSA in bf16 with interleave 4 and 2 draft tokens. Then a decode bucket
captured through the adapter (the indexer op's run and forward_mqa over static buffers) and replayed over two
steps equals eager runs of the same steps, and the refusals (rank-local, no collective).
"""

import copy
import itertools
import os
import types

import pytest
import torch

from _cp_harness import local_index, owner, run_ranks

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from test_vllm_dcp import (BS, MAX_LEN, NB, VLLM_MODULES, W, WIDTH, _block_table, _common_metadata,  # noqa: E402
                           _release_vllm_groups, _shm_names)

DATA = os.path.join(os.path.dirname(__file__), "data")
F64 = torch.float64
MODELS = {"deepseek_v32": "vllm_tiny_v32", "glm_moe_dsa": "vllm_tiny_glm"}
NB1 = 64  # the single-rank adapter's cache (whole sequences, blocks of BS)
PRELOAD = VLLM_MODULES + ("vllm.model_executor.models.deepseek_v2", "vllm.model_executor.layers.sparse_attn_indexer",
                          "vllm.model_executor.layers.rotary_embedding", "vllm.forward_context")
_names = itertools.count()

# (requests, query lengths, is_prefilling) of each step, decode-first; lengths grow from empty caches.
STEPS = [
    ([0, 1, 2, 3], [5, 21, 37, 2], [True, True, True, True]),                  # fresh prefills
    ([0, 1, 2, 4], [1, 1, 9, 11], [False, False, True, True]),                 # mixed: decodes, chunk, fresh
    ([0, 1, 2, 3, 4], [1, 1, 1, 1, 1], [False, False, False, False, False]),   # decode
    ([0, 1, 3], [3, 3, 3], [False, False, False]),                             # speculative decode / short extends
]


def _vllm_config(family, dtype, interleave, dcp=W, spec=0, num_blocks=NB):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig

    path = os.path.join(DATA, MODELS[family])
    mc = ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True, dtype=dtype, max_model_len=MAX_LEN,
                     enforce_eager=True)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=MAX_LEN, max_model_len=MAX_LEN,
                         is_encoder_decoder=False, enable_chunked_prefill=True)
    pc = ParallelConfig(tensor_parallel_size=W, decode_context_parallel_size=dcp,
                        cp_kv_cache_interleave_size=interleave)
    cfg = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BS), scheduler_config=sc,
                     parallel_config=pc, device_config=DeviceConfig(device="cpu"))
    cfg.cache_config.num_gpu_blocks = num_blocks
    if spec:
        cfg.speculative_config = types.SimpleNamespace(num_speculative_tokens=spec)
    return cfg


def _init(rank, family):
    """vLLM's groups (test_vllm_dcp's set-up), the adapter registered, vLLM's fp8 group quantisation (a Triton
    kernel) replaced by test_vllm_sparse's torch version of it."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.models import deepseek_v2

    import ascend_attn_rt.vllm as aar_vllm
    from test_vllm_sparse import _quant_fp8_reference

    cfg = _vllm_config(family, torch.float32, 1)
    with set_current_vllm_config(cfg):
        ps.init_distributed_environment(world_size=W, rank=rank, local_rank=rank, backend="gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=W, decode_context_model_parallel_size=W)
    assert (ps.get_dcp_group().world_size, ps.get_dcp_group().rank_in_group) == (W, rank)
    deepseek_v2.per_token_group_quant_fp8 = _quant_fp8_reference
    aar_vllm.register(family=family)


def _rows_1(bt1, seq_lens, q_lens):
    """The single-rank adapter's slot mapping (whole sequences, blocks of BS)."""
    return torch.cat([bt1[r, p // BS].long() * BS + p % BS
                      for r, (s, q) in enumerate(zip(seq_lens, q_lens)) for p in [torch.arange(s - q, s)]])


class Layer:
    """One decoder layer's sparse attention as vLLM builds it under DCP (this rank's heads), and the single-rank
    adapter's indexer (op, builder, cache) beside it."""

    def __init__(self, rank, cfg, cfg1, dtype, gen):
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.rotary_embedding import get_rope
        from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
        from vllm.model_executor.models import deepseek_v2
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        from ascend_attn_rt.vllm import AscendAttnRtIndexerBackend, AscendAttnRtSparseMlaBackend
        from ascend_attn_rt.vllm.sparse import indexer_op_cls

        self.cfg, self.dtype, self.gen, self.rank = cfg, dtype, gen, rank
        hf = cfg.model_config.hf_text_config
        self.N = cfg.model_config.get_num_attention_heads(cfg.parallel_config)  # this rank's heads
        self.L, self.P, self.R, self.V = hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim, hf.v_head_dim
        self.Q, self.HID = hf.q_lora_rank, hf.hidden_size
        self.n, self.D, self.K = hf.index_n_heads, hf.index_head_dim, hf.index_topk
        self.neox = not getattr(hf, "indexer_rope_interleave", False)
        self.buf = torch.full((MAX_LEN, self.K), -7, dtype=torch.int32)
        self.buf1 = torch.full((MAX_LEN, self.K), -7, dtype=torch.int32)
        prefix = f"model.layers.{next(_names)}.self_attn"
        self.attn_name = f"{prefix}.attn"
        w = lambda o, i: (torch.randn(o, i, generator=gen, dtype=F64) / i ** 0.5).to(dtype)  # noqa: E731
        # The indexer's weights are replicated (the same on every rank); kv_b_proj is column-parallel: this
        # rank's shard of the model's.
        self.iw = {"wq_b": w(self.n * self.D, self.Q), "wk": w(self.D, self.HID), "weights_proj": w(self.n, self.HID),
                   "k_norm_weight": (1 + 0.1 * torch.randn(self.D, generator=gen, dtype=F64)).to(dtype),
                   "k_norm_bias": (0.1 * torch.randn(self.D, generator=gen, dtype=F64)).to(dtype)}
        rows = self.N * (self.P + self.V)
        full = w(W * rows, self.L)
        self.kv_b_proj = torch.nn.Linear(self.L, rows, bias=False, dtype=dtype).requires_grad_(False)
        self.kv_b_proj.weight.copy_(full[rank * rows:(rank + 1) * rows])
        self.kv_b_proj.quant_method = None
        with set_current_vllm_config(cfg):
            self.k_cache = deepseek_v2.DeepseekV32IndexerCache(
                head_dim=self.D + self.D // 128 * 4, dtype=torch.uint8, prefix=f"{prefix}.indexer.k_cache",
                cache_config=cfg.cache_config)
            self.op = SparseAttnIndexer(self.k_cache, 128, "ue8m0", self.K, self.D, MAX_LEN, MAX_LEN, self.buf)
        with set_current_vllm_config(cfg1):
            self.k_cache1 = deepseek_v2.DeepseekV32IndexerCache(
                head_dim=self.D + self.D // 128 * 4, dtype=torch.uint8, prefix=f"{prefix}.single.k_cache",
                cache_config=cfg1.cache_config)
            self.op1 = SparseAttnIndexer(self.k_cache1, 128, "ue8m0", self.K, self.D, MAX_LEN, MAX_LEN, self.buf1)
        assert type(self.op) is indexer_op_cls() and type(self.op1) is indexer_op_cls()
        # The replicated indexer cache: vLLM allocates W pages of keys per block (head_size W * D).
        ispec, ispec1 = self.k_cache.get_kv_cache_spec(cfg), self.k_cache1.get_kv_cache_spec(cfg1)
        assert self.k_cache.get_attn_backend() is AscendAttnRtIndexerBackend
        assert (ispec.head_size, ispec.dtype, ispec.block_size) == (W * self.D, dtype, BS)
        assert ispec.page_size_bytes == W * ispec1.page_size_bytes
        self.idx_cache = torch.zeros(*AscendAttnRtIndexerBackend.get_kv_cache_shape(NB, BS, 1, ispec.head_size),
                                     dtype=dtype)
        self.idx_cache1 = torch.zeros(*AscendAttnRtIndexerBackend.get_kv_cache_shape(NB1, BS, 1, self.D), dtype=dtype)
        self.k_cache.kv_cache = self.idx_cache
        # Garbage where nothing is written: another rank's positions stay unread.
        self.kv_cache = torch.randn(*AscendAttnRtSparseMlaBackend.get_kv_cache_shape(NB, BS, 1, self.L + self.R),
                                    generator=torch.Generator().manual_seed(70 + rank)).to(dtype)
        mspec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=self.L + self.R, dtype=dtype,
                                 cache_dtype_str="auto")
        dev = torch.device("cpu")
        self.mspec, self.ispec = mspec, ispec
        self.builder = AscendAttnRtSparseMlaBackend.get_builder_cls()(mspec, [self.attn_name], cfg, dev)
        self.ibuilder = AscendAttnRtIndexerBackend.get_builder_cls()(ispec, [self.k_cache.prefix], cfg, dev)
        self.ibuilder1 = AscendAttnRtIndexerBackend.get_builder_cls()(ispec1, [self.k_cache1.prefix], cfg1, dev)
        self.indexer = self._indexer()
        self.rope = get_rope(self.R, max_position=MAX_LEN, is_neox_style=self.neox,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=dtype)
        self.mla = self._mla(self.attn_name, self.indexer)
        self.impl = self.mla.impl
        # vLLM's layer is shown one rank: the runtime gathers and merges inside forward_mqa (§8).
        assert self.impl.runtime_dcp_world_size == W and self.impl.dcp_world_size == 1
        assert self.impl.need_to_return_lse_for_decode and self.impl.topk_indices_buffer is self.buf
        self.seen = []
        run = self.op.run
        self.op.run = lambda q, k, wts, cache, md: (self.seen.append((q.clone(), k.clone(), wts.clone())),
                                                    run(q, k, wts, cache, md))[1]

    def _mla(self, name, indexer):
        """vLLM's sparse MLAAttention layer (as test_vllm_sparse makes it), weights processed."""
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        from ascend_attn_rt.vllm import AscendAttnRtSparseMlaBackend

        layer = MLAAttention(num_heads=self.N, scale=(self.P + self.R) ** -0.5, qk_nope_head_dim=self.P,
                             qk_rope_head_dim=self.R, v_head_dim=self.V, q_lora_rank=self.Q, kv_lora_rank=self.L,
                             kv_b_proj=self.kv_b_proj, cache_config=self.cfg.cache_config, prefix=name,
                             attn_backend=AscendAttnRtSparseMlaBackend, use_sparse=True, indexer=indexer,
                             topk_indices_buffer=self.buf)
        layer.process_weights_after_loading(self.dtype)
        layer.kv_cache = self.kv_cache
        return layer

    def skip_layer_output(self, q, c, kpe, md):
        """An IndexCache skip layer (no indexer: vLLM hands it the shared buffer alone) over the same inputs."""
        layer = self._mla(f"{self.attn_name}.skip", None)
        assert layer.impl.topk_indices_buffer is self.buf and layer.impl.runtime_dcp_world_size == W
        out = torch.full((q.shape[0], self.N * self.V), 7.0, dtype=self.dtype)
        layer.forward_impl(q, c, kpe.unsqueeze(1), self.kv_cache, md, output=out)
        return out

    def _indexer(self):
        """vLLM's Indexer.forward on the modules it reads (test_vllm_sparse's stand-in for its linear layers)."""
        from vllm.model_executor.models import deepseek_v2

        lin = lambda Wt: (lambda x: (x @ Wt.T, None))  # noqa: E731
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

    def step(self, cam, slots, x, qc, c, kpe, q, pos):
        """One engine step: both builds, vLLM's Indexer.forward (the runtime's op), MLAAttention.forward."""
        from vllm.forward_context import set_forward_context

        md, imd = self.builder.build(0, cam), self.ibuilder.build(0, cam)
        T = int(cam.num_actual_tokens)
        with set_forward_context({self.k_cache.prefix: imd, self.attn_name: md}, self.cfg,
                                 slot_mapping={self.attn_name: slots}):
            self.indexer.forward(x, qc, pos, lambda p, a, b: self.rope.forward_native(p, a, b))
            out = self.mla(q, c, kpe.unsqueeze(1), output_shape=(T, self.N * self.V))
        return out, md, imd

    def single_rank_topk(self, cam1, q8, k, wts):
        """The single-rank adapter's op over the same inputs (its own builder and unreplicated cache)."""
        md1 = self.ibuilder1.build(0, cam1)
        self.op1.run(q8, k, wts, self.idx_cache1, md1)
        return self.buf1[: int(cam1.num_actual_tokens)]


def _cam1(seq, q_lens, bt1_rows):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    sl = torch.tensor(seq, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=len(seq), num_actual_tokens=int(qsl[-1]),
        max_query_len=max(q_lens), max_seq_len=max(seq), block_table_tensor=bt1_rows,
        slot_mapping=_rows_1(bt1_rows, seq, q_lens), _seq_lens_cpu=sl)


def _sparse_case(rank, family, dtype, interleave, spec, seed):
    from vllm.config import set_current_vllm_config

    cfg = _vllm_config(family, dtype, interleave, spec=spec)
    cfg1 = _vllm_config(family, dtype, interleave, dcp=1, spec=spec, num_blocks=NB1)
    with set_current_vllm_config(cfg):  # as vLLM makes and runs its model
        _sparse_steps(rank, family, dtype, interleave, spec, seed, cfg, cfg1)
    return 1


def _check_allocation(cfg, lay):
    """What vLLM allocates for the indexer spec: a tensor of num_blocks pages per layer (its KV-cache config for
    one group of full-attention specs of different page sizes), the indexer's page W times the single-rank one,
    which the op views as the runtime's replicated (num_blocks * W, block_size, D). The two specs are checked to be
    what vLLM's one-group rule takes (full attention, one block size); vLLM's grouping itself runs on the
    single-rank specs in test_vllm_sparse.py (test_vllm_groups_the_indexer_cache_beside_the_latent_cache)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from ascend_attn_rt.vllm import AscendAttnRtIndexerBackend

    assert all(isinstance(sp, FullAttentionSpec) and sp.block_size == BS and sp.sliding_window is None
               for sp in (lay.mspec, lay.ispec))
    item = torch.empty((), dtype=lay.dtype).element_size()
    assert lay.ispec.page_size_bytes == BS * W * lay.D * item
    assert lay.mspec.page_size_bytes == BS * (lay.L + lay.R) * item
    # vLLM's view of the layer's raw bytes (its model runner: the backend's shape), then the op's replicated view.
    raw = torch.zeros(NB * lay.ispec.page_size_bytes, dtype=torch.int8).view(lay.dtype)
    cache = raw.view(AscendAttnRtIndexerBackend.get_kv_cache_shape(NB, BS, 1, lay.ispec.head_size))
    rep = lay.op._replicated(cache)
    assert rep.shape == (NB * W, BS, lay.D) and rep.data_ptr() == raw.data_ptr()


def _sparse_steps(rank, family, dtype, interleave, spec, seed, cfg, cfg1):
    from _mla_reference import latent_attention_reference
    from _reference import assert_close
    from _sfa_reference import indexer_rope, layer_norm, selected_positions, topk_rows

    gen = torch.Generator().manual_seed(seed)
    lay = Layer(rank, cfg, cfg1, dtype, gen)
    assert lay.builder.reorder_batch_threshold == 1 + spec
    _check_allocation(cfg, lay)
    bt = _block_table(gen)                                                    # the DCP group's local blocks
    bt1 = (torch.randperm(NB1 - 1, generator=gen)[:5 * 8] + 1).view(5, 8).to(torch.int32)  # single rank's
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=F64).to(dtype)  # noqa: E731
    hist = {k: [torch.zeros(0, n, dtype=dtype) for _ in range(5)]
            for k, n in (("x", lay.HID), ("qc", lay.Q), ("c", lay.L), ("pe", lay.R))}
    for reqs, q_lens, prefilling in STEPS:
        T = sum(q_lens)
        new = {"x": rnd(T, lay.HID), "qc": rnd(T, lay.Q), "c": rnd(T, lay.L), "pe": rnd(T, lay.R)}
        q_all = rnd(T, W * lay.N, lay.P + lay.R)
        q = q_all[:, rank * lay.N:(rank + 1) * lay.N].contiguous()
        seq = [hist["x"][r].shape[0] + n for r, n in zip(reqs, q_lens)]
        pos = torch.cat([torch.arange(s - n, s) for s, n in zip(seq, q_lens)])
        cam, slots = _common_metadata(reqs, seq, q_lens, prefilling, bt, rank, interleave)
        out, md, imd = lay.step(cam, slots, new["x"], new["qc"], new["c"], new["pe"], q, pos)
        assert md.sfa.slot_mapping[:T].tolist() == slots.tolist()  # the runtime's local slots are vLLM's
        assert md.sfa.dcp_world_size == W and imd.sfa.dcp_rank == rank
        qsl = cam.query_start_loc_cpu.tolist()
        for i, r in enumerate(reqs):
            for k in hist:
                hist[k][r] = torch.cat([hist[k][r], new[k][qsl[i]:qsl[i + 1]]])
        # The top-k rows: the single-rank adapter's, exactly (the same query, key and weights).
        q8, k_rows, wts = lay.seen[-1]
        got = lay.buf[:T].clone()
        ref1 = lay.single_rank_topk(_cam1(seq, q_lens, bt1[reqs]), q8, k_rows, wts)
        assert torch.equal(got, ref1), f"{family} {dtype} I={interleave}: top-k differs from the single-rank adapter"
        for i, (r, n) in enumerate(zip(reqs, q_lens)):
            s = seq[i]
            p = torch.arange(s)
            # Every rank's replicated indexer cache holds every position's key (the replicated view, §2 of
            # sparse_cp.md: local block b -> blocks b W .. b W + W - 1), equal to the single-rank cache's.
            rep = lay.idx_cache.view(NB * W, BS, lay.D)
            rep_rows = rep[bt[r, p // (BS * W)].long() * W + (p // BS) % W, p % BS]
            assert torch.equal(rep_rows, lay.idx_cache1[bt1[r, p // BS].long(), p % BS]), f"indexer keys of {r}"
            if dtype == torch.float32:
                kref = indexer_rope(layer_norm(hist["x"][r].to(F64) @ lay.iw["wk"].to(F64).T,
                                               lay.iw["k_norm_weight"].to(F64), lay.iw["k_norm_bias"].to(F64), 1e-6),
                                    p, lay.R, lay.neox)
                assert_close(rep_rows, kref, dtype, what=f"indexer keys of request {r}")
            for j in range(n):
                t, vis = qsl[i] + j, s - n + j + 1
                if dtype == torch.float32:
                    score = (wts[t].to(F64)[:, None] * torch.relu(q8[t].to(F64) @ rep_rows.to(F64).T)).sum(0)
                    assert torch.equal(got[t].long(), topk_rows(score[None], [vis], lay.K)[0]), (r, j)
                sel = selected_positions(got[t], vis)
                want = latent_attention_reference(q[t:t + 1], hist["c"][r][sel], hist["pe"][r][sel],
                                                  lay.kv_b_proj.weight, 1, lay.impl.scale, lay.N, lay.P, lay.V)
                assert_close(out[t].view(1, lay.N, lay.V), want, dtype,
                             what=f"{family} {dtype} I={interleave} request {r} token {j} (seq {s})")
    # An IndexCache skip layer reads the rows the op stored (global positions): the same output, exactly.
    assert torch.equal(lay.skip_layer_output(q, new["c"], new["pe"], md), out)
    # vLLM's model-runner check of every attention layer under DCP (LSE merged; MTP with an interleave > 1).
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.worker import cp_utils

    assert lay.attn_name in cp_utils.get_layers_from_vllm_config(cfg, AttentionLayerBase)
    cp_utils.check_attention_cp_compatibility(cfg)
    # The latent cache holds exactly this rank's positions (the DCP shard), at their local indices.
    nope, _ = lay.impl._caches(lay.kv_cache)
    for r in range(5):
        for x in range(hist["c"][r].shape[0]):
            if owner(x, W, interleave) == rank:
                li = local_index(x, W, interleave)
                assert torch.equal(nope[int(bt[r, li // BS]), li % BS, 0], hist["c"][r][x]), (r, x)


def _graph_case(rank, family, interleave, seed):
    """A decode bucket captured through the adapter under DCP (the indexer op's run and forward_mqa over static
    buffers, as test_vllm_graph.py does: the recording provider replays the runtime's calls only), replayed over
    two steps: equal to eager runs of the same steps on copies of the caches."""
    from vllm.config import set_current_vllm_config

    cfg = _vllm_config(family, torch.float32, interleave)
    cfg1 = _vllm_config(family, torch.float32, interleave, dcp=1, num_blocks=NB1)
    with set_current_vllm_config(cfg):
        _graph_steps(rank, interleave, seed, cfg, cfg1)
    return 1


def _graph_steps(rank, interleave, seed, cfg, cfg1):
    from ascend_attn_rt.vllm import graph as vgraph

    dtype, B = torch.float32, 4
    gen = torch.Generator().manual_seed(seed)
    lay = Layer(rank, cfg, cfg1, dtype, gen)
    N, L, R, D, n = lay.N, lay.L, lay.R, lay.D, lay.n
    bt = _block_table(gen)
    seq = [17, 5, 30, 9]
    cam, slots = _common_metadata(list(range(B)), seq, seq, [True] * B, bt, rank, interleave)
    T = sum(seq)
    meta = lay.ibuilder.build(0, cam)
    lay.op.run(torch.randn(T, n, D, generator=gen), torch.randn(T, D, generator=gen), torch.rand(T, n, generator=gen),
               lay.idx_cache, meta)
    lay.impl.do_kv_cache_update(torch.randn(T, L, generator=gen), torch.randn(T, 1, R, generator=gen), lay.kv_cache,
                                slots, "auto", torch.ones(()))
    s = {"q": torch.zeros(B, n, D), "k": torch.zeros(B, D), "w": torch.zeros(B, n), "qn": torch.zeros(B, N, L),
         "qr": torch.zeros(B, N, R), "c": torch.zeros(B, L), "pe": torch.zeros(B, 1, R),
         "slots": torch.zeros(B, dtype=torch.int64)}
    vgraph.set_graph_provider("recording")
    try:
        seq = [x + 1 for x in seq]
        dcam = _common_metadata(list(range(B)), seq, [1] * B, [False] * B, bt, rank, interleave)[0]
        md = lay.builder.build_for_cudagraph_capture(dcam)
        with vgraph.capture(B):
            lay.op.run(s["q"], s["k"], s["w"], lay.idx_cache, md)
            lay.impl.do_kv_cache_update(s["c"], s["pe"], lay.kv_cache, s["slots"], "auto", torch.ones(()))
            out_s = lay.impl.forward_mqa((s["qn"], s["qr"]), lay.kv_cache, md, None)[0]
        for _ in range(2):
            dcam, slots = _common_metadata(list(range(B)), seq, [1] * B, [False] * B, bt, rank, interleave)
            md = lay.builder.build(0, dcam)
            new = {"q": torch.randn(B, n, D, generator=gen), "k": torch.randn(B, D, generator=gen),
                   "w": torch.rand(B, n, generator=gen), "qn": torch.randn(B, N, L, generator=gen),
                   "qr": torch.randn(B, N, R, generator=gen), "c": torch.randn(B, L, generator=gen),
                   "pe": torch.randn(B, 1, R, generator=gen), "slots": slots}
            idx2, kv2 = lay.idx_cache.clone(), lay.kv_cache.clone()
            lay.op.run(new["q"], new["k"], new["w"], idx2, md)
            lay.impl.do_kv_cache_update(new["c"], new["pe"], kv2, slots, "auto", torch.ones(()))
            expected_topk = lay.buf[:B].clone()
            expected = lay.impl.forward_mqa((new["qn"], new["qr"]), kv2, md, None)[0].clone()
            lay.buf.fill_(-7)
            for k in s:
                s[k].copy_(new[k])
            vgraph.update(B, md)
            vgraph.replay(B)
            assert torch.equal(lay.buf[:B], expected_topk)
            assert torch.allclose(out_s, expected, atol=1e-6, rtol=1e-6)
            assert torch.equal(lay.kv_cache, kv2) and torch.equal(lay.idx_cache, idx2)
            seq = [x + 1 for x in seq]
    finally:
        vgraph.clear_graph_provider()


def _refusals(rank, family):
    """Rank-local refusals (no collective is issued)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    import ascend_attn_rt as aar
    from ascend_attn_rt.vllm import AscendAttnRtSparseMlaBackend
    from ascend_attn_rt.vllm.sparse import indexer_op_cls

    cfg = _vllm_config(family, torch.float32, 1)
    hf = cfg.model_config.hf_text_config
    L, R = hf.kv_lora_rank, hf.qk_rope_head_dim
    N = cfg.model_config.get_num_attention_heads(cfg.parallel_config)
    spec = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=L + R, dtype=torch.float32, cache_dtype_str="auto")
    buf = torch.zeros(MAX_LEN, hf.index_topk, dtype=torch.int32)
    # Prefill context parallel: builder and op.
    pcp = copy.copy(cfg)
    pcp.parallel_config = copy.copy(cfg.parallel_config)
    pcp.parallel_config.prefill_context_parallel_size = 2
    with pytest.raises(NotImplementedError, match="prefill_context_parallel_size=2"):
        AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["l"], pcp, torch.device("cpu"))
    k_cache = types.SimpleNamespace(cache_config=cfg.cache_config, prefix="r.k_cache")
    with set_current_vllm_config(pcp), pytest.raises(NotImplementedError, match="prefill_context_parallel_size=2"):
        indexer_op_cls()(k_cache, 128, "ue8m0", hf.index_topk, hf.index_head_dim, MAX_LEN, MAX_LEN, buf)
    # A DCP size that is not the group's.
    w4 = copy.copy(cfg)
    w4.parallel_config = copy.copy(cfg.parallel_config)
    w4.parallel_config.decode_context_parallel_size = 4
    with pytest.raises(ValueError, match="DCP group has 2 ranks but decode_context_parallel_size=4"):
        AscendAttnRtSparseMlaBackend.get_builder_cls()(spec, ["l"], w4, torch.device("cpu"))
    # The indexer cache must be vLLM's replicated page (W * index_head_dim): a single-rank-sized one is refused.
    with set_current_vllm_config(cfg):
        op = indexer_op_cls()(types.SimpleNamespace(cache_config=cfg.cache_config, prefix="r2.k_cache"), 128, "ue8m0",
                              hf.index_topk, hf.index_head_dim, MAX_LEN, MAX_LEN, buf)
    with pytest.raises(ValueError, match="under DCP"):
        op._replicated(torch.zeros(NB, BS, hf.index_head_dim))
    # vLLM's replicated DCP query, and metadata of the other DCP rank (the comm check, before anything runs).
    kw = dict(num_heads=N, head_size=L + R, scale=0.1, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
              kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
              kv_sharing_target_layer_name=None, q_lora_rank=hf.q_lora_rank, kv_lora_rank=L,
              qk_nope_head_dim=hf.qk_nope_head_dim, qk_rope_head_dim=R, qk_head_dim=hf.qk_nope_head_dim + R,
              v_head_dim=hf.v_head_dim, kv_b_proj=None, topk_indices_buffer=buf)
    impl = AscendAttnRtSparseMlaBackend.get_impl_cls()(**kw)
    with pytest.raises(NotImplementedError, match="dcp_q_replicate"):
        impl.forward_mqa((None, None), None, None, types.SimpleNamespace(dcp_q_replicate=True))
    zeros = torch.zeros(MAX_LEN, R)
    other = aar.sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=WIDTH, block_size=BS,
                                    num_blocks=NB, cos_table=zeros, sin_table=zeros, dcp_world_size=W,
                                    dcp_rank=1 - rank)
    md = other.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
                     _block_table(torch.Generator().manual_seed(1))[:1].contiguous())
    meta = types.SimpleNamespace(sfa=md)
    kv = torch.zeros(NB, BS, L + R)
    with pytest.raises(ValueError, match=f"built for DCP rank {1 - rank} of 2 but the layer's dcp_comm is rank {rank}"):
        impl.forward_mqa((torch.zeros(1, N, L), torch.zeros(1, N, R)), kv, meta, None)
    # The pieces refuse PCP metadata by name (sfa.Impl runs PCP).
    pcp_b = aar.sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=WIDTH, block_size=BS,
                                    num_blocks=NB, cos_table=zeros, sin_table=zeros, pcp_world_size=2, pcp_rank=0)
    pmd = pcp_b.build(torch.tensor([0, 4], dtype=torch.int32), torch.tensor([4], dtype=torch.int32),
                      _block_table(torch.Generator().manual_seed(1))[:1].contiguous())
    with pytest.raises(NotImplementedError, match="pcp_world_size=2"):
        aar.sfa.SparseAttention(scale=0.1).run(torch.zeros(4, N, L), torch.zeros(4, N, R),
                                               torch.zeros(4, 8, dtype=torch.int32), torch.zeros(NB, BS, 1, L),
                                               torch.zeros(NB, BS, 1, R), pmd)
    assert not kv.any()
    return 1


def _case(rank, world):
    torch.set_num_threads(1)  # the ranks share two cores
    shm_before = _shm_names()
    _init(rank, "deepseek_v32")
    try:
        n = _sparse_case(rank, "deepseek_v32", torch.float32, 1, 0, seed=1)
        # GLM-MoE-DSA (its indexer RoPE pairing, torch_npu's indexer library): the same backend and op.
        import ascend_attn_rt.vllm as aar_vllm

        aar_vllm.register(family="glm_moe_dsa")
        n += _sparse_case(rank, "glm_moe_dsa", torch.bfloat16, 4, 2, seed=2)
        n += _graph_case(rank, "deepseek_v32", 4, seed=3)
        n += _refusals(rank, "deepseek_v32")
        return n
    finally:
        _release_vllm_groups(rank, shm_before)


def test_vllm_sparse_dcp_matches_float64_and_the_single_rank_topk():
    assert run_ranks(W, _case, deadline_s=120.0, preload=PRELOAD) == [4] * W
