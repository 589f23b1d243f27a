"""Pieces shared by the DSA layer tests (test_dsa.py, test_dsa_a5.py, test_dsa_sfmla.py): a layer's metadata
routing by compress ratio (spec 6.4), reading a request's rows back out of a paged cache, and a layer run on any
of the three attention-KV plans (LayerRun)."""

from __future__ import annotations

import torch

import ascend_attn_rt as aar
import _dsa_reference as ref

_GROUP_ARGS = ("attention", "compressor_state", "indexer_cache", "indexer_state")


def group_kw(ratio: int, md: dict, step) -> dict:
    """The forward's group arguments of a layer of `ratio` (spec 6.4) from the step's {cache kind: metadata}
    dict, routed by aar.dsa.route_layer (compressed layers read their compressed-KV and compressor-state
    groups, C4 layers also the indexer's; the others are None)."""
    g = aar.dsa.route_layer(ratio, step, md)
    return {k: g[k] for k in _GROUP_ARGS}


def slot_rows(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """Rows 0..n-1 of one request in a paged cache (its logical block table, physical rows per page)."""
    rows = cache.shape[1]
    return torch.stack([cache[table[c // rows], c % rows, 0] for c in range(n)]) if n else cache[:0, 0, 0]


# The three attention-KV plans of spec 7.2 as the facade spells them: (device_kind, cache_dtype).
PLANS = {"a2": ("a2", None), "a5": ("a5", None), "a5_bf16": ("a5", "bfloat16")}


def cache_kinds(ratio: int) -> list:
    """The KV-cache groups a layer of `ratio` reads (spec 6.4)."""
    kinds = ["swa"]
    if ratio > 1:
        kinds += ["c4_kv", "c4_attn_state"] if ratio == 4 else ["c128_kv", "c128_state"]
    if ratio == 4:
        kinds += ["c4_indexer_k", "c4_indexer_state"]
    return kinds


class LayerRun:
    """One DSA layer on any of the three plans ("a2", "a5" fp8 rows, "a5_bf16" SparseFlashMla) with its caches and
    builders, and requests with fixed token streams: request b owns blocks [1 + b * max_blocks, ...) of every group,
    block 0 stays unused (graph-padding rows' zeroed tables point there).

    Caches: plain rows (a2, a5_bf16) are in the weights' dtype (float32 for reference runs); "a5" has the 640-byte
    MXFP8 rows. The indexer is int8 + fp16 scales on a2 and fp8 + fp32 scales in one raw page with the full byte
    view on both A5 plans (spec 6.2).
    A bf16 checkpoint (no wo_a_scale) runs the grouped-bmm o_proj on every plan."""

    def __init__(self, d, plan, dtype, nreq, *, k=0, seed=0, max_blocks=200, w=None, x=None, cbs=32, maxpos=1024,
                 dspark=0, rope=None):
        self.d, self.plan, self.dtype = d, plan, dtype
        self.device_kind, self.cache_dtype = PLANS[plan]
        g = torch.Generator().manual_seed(seed)
        self.w = w if w is not None else ref.make_dsa_weights(d, dtype, g)
        # rope: the layer's (cos, sin) tables when they are not the reference's (a model's own RoPE)
        self.cos, self.sin = rope if rope is not None else ref.rope_tables(maxpos, d.R)
        self.x = x if x is not None else [torch.randn(400, d.hidden, generator=g, dtype=torch.float64).to(dtype)
                                          for _ in range(nreq)]
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin,
                                      num_speculative_tokens=k)
        self.kinds = cache_kinds(d.ratio)
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables, self.rows = {}, {}, {}
        pk = dict(device_kind=self.device_kind, cache_dtype=self.cache_dtype, model_dtype="bfloat16")
        for kd in self.kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=cbs, max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb, window=d.W, num_heads_q=d.N, index_topk=d.K,
                                               index_n_heads=d.n_idx, index_head_dim=d.Di,
                                               dspark_num_spec=dspark if kd == "swa" else 0, **pk)
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
            self.rows[kd] = aar.dsa.cache_spec(kd, cbs, **pk)["storage_block_size"]
        fp8 = plan == "a5"
        kv_width, kv_dt = (640, torch.float8_e4m3fn) if fp8 else (d.D, dtype)
        r = d.ratio
        self.swa = torch.zeros(self.nb, self.rows["swa"], 1, kv_width, dtype=kv_dt)
        self.cmp = self.state = self.istate = self.ik = self.isc = self.ifull = self.raw = None
        if r > 1:
            ck, sk = ("c4_kv", "c4_attn_state") if r == 4 else ("c128_kv", "c128_state")
            self.cmp = torch.zeros(self.nb, self.rows[ck], 1, kv_width, dtype=kv_dt)
            self.state = torch.zeros(self.nb, self.rows[sk], 2 * d.coff * d.D, dtype=torch.float32)
        if r == 4:
            rows = self.rows["c4_indexer_k"]
            self.istate = torch.zeros(self.nb, self.rows["c4_indexer_state"], 4 * d.Di, dtype=torch.float32)
            if plan == "a2":
                self.ik = torch.zeros(self.nb, rows, 1, d.Di, dtype=torch.int8)
                self.isc = torch.zeros(self.nb, rows, 1, dtype=torch.float16)
            else:
                # spec 6.2 indexer page: [k rows x Di fp8][scale rows x fp32]; the full byte view (rows, Di + 4)
                # from the page base is indexer_compress_epilog_v2's write handle (layout 2)
                page = rows * (d.Di + 4)
                self.raw = torch.zeros(self.nb * page, dtype=torch.uint8)
                self.ifull = self.raw.as_strided((self.nb, rows, 1, d.Di + 4), (page, d.Di + 4, d.Di + 4, 1))
                self.ik = self.raw.as_strided((self.nb, rows, 1, d.Di), (page, d.Di, d.Di, 1)).view(torch.float8_e4m3fn)
                self.isc = self.raw.view(torch.float32).as_strided((self.nb, rows, 1), (page // 4, 1, 1),
                                                                   rows * d.Di // 4)
        self.kv = aar.dsa.compose_kv_cache(compress_kv=self.cmp, swa_kv=self.swa, state=self.state,
                                           indexer_state=self.istate, indexer_k=self.ik, indexer_scale=self.isc,
                                           indexer_full=self.ifull, **pk)
        self.impl = self.make_impl()
        self.S = [0] * nreq

    def caches(self):
        """Every cache tensor this run owns (the indexer's raw page buffer instead of its views)."""
        ts = [self.swa, self.cmp, self.state, self.istate]
        ts += [self.raw] if self.raw is not None else [self.ik, self.isc]
        return [t for t in ts if t is not None]

    def make_impl(self, **kw):
        d = self.d
        return aar.dsa.Impl(self.w, hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R,
                                 q_lora_rank=d.q_lora, window=d.W, compress_ratio=d.ratio, index_n_heads=d.n_idx,
                                 index_head_dim=d.Di, index_topk=d.K, eps=d.eps, o_groups=d.G, o_lora_rank=d.o_lora,
                                 device_kind=self.device_kind, cache_dtype=self.cache_dtype, model_dtype="bfloat16",
                                 **kw)

    def build(self, reqs, qlens, pad=0):
        S = [self.S[b] + q for b, q in zip(reqs, qlens)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        st = self.sb.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32),
                           num_input_tokens=qsl[-1] + pad)
        md = {kd: self.gb[kd].build(st, self.tables[kd][reqs].contiguous()) for kd in self.kinds}
        return st, md, S, qsl

    def step(self, reqs, qlens, pad=0, impl=None):
        st, md, S, qsl = self.build(reqs, qlens, pad)
        self.last_md = md
        hid = torch.cat([self.x[b][S[i] - qlens[i]: S[i]] for i, b in enumerate(reqs)]
                        + [torch.zeros(pad, self.d.hidden, dtype=self.dtype)])
        out = torch.full_like(hid, float("nan"))
        (impl or self.impl).forward(hid, self.kv, st, md["swa"], out, **group_kw(self.d.ratio, md, st))
        for i, b in enumerate(reqs):
            self.S[b] = S[i]
        return out, qsl, S

    def slot_rows(self, cache, kd, b, n):
        return slot_rows(cache, self.tables[kd][b], n)
