"""Pieces shared by the DSA layer tests (test_dsa.py, test_dsa_a5.py, test_dsa_sfmla.py): a layer's metadata
routing by compress ratio (docs/design/dsa.md §3.3), its caches allocated from the runtime's cache specs, reading a request's rows
back out of a paged cache, and a layer run on any of the three attention-KV plans (LayerRun)."""

from __future__ import annotations

import torch

import ascend_attn_rt as aar
import _dsa_reference as ref

_GROUP_ARGS = ("attention", "compressor_state", "indexer_cache", "indexer_state")


def group_kw(ratio: int, md: dict, step) -> dict:
    """The forward's group arguments of a layer of `ratio` (docs/design/dsa.md §3.3) from the step's {cache kind: metadata}
    dict, routed by aar.dsa.route_layer (compressed layers read their compressed-KV and compressor-state
    groups, C4 layers also the indexer's; the others are None)."""
    g = aar.dsa.route_layer(ratio, step, md)
    return {k: getattr(g, k) for k in _GROUP_ARGS}


def slot_rows(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """Rows 0..n-1 of one request in a paged cache (its logical block table, physical rows per page)."""
    rows = cache.shape[1]
    return torch.stack([cache[table[c // rows], c % rows, 0] for c in range(n)]) if n else cache[:0, 0, 0]


# The three attention-KV plans of docs/design/dsa.md §4.2 as the facade spells them: (device_kind, cache_dtype).
PLANS = {"a2": ("a2", None), "a5": ("a5", None), "a5_bf16": ("a5", "bfloat16")}


def cache_kinds(ratio: int) -> list:
    """The KV-cache groups a layer of `ratio` reads (docs/design/dsa.md §3.3), from the runtime."""
    return aar.dsa.layer_cache_kinds(ratio)


TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "int8": torch.int8,
                "float8_e4m3fn": torch.float8_e4m3fn}


def _as_view(raw: torch.Tensor, v: dict) -> torch.Tensor:
    """The view a cache_spec entry describes (dtype, shape, stride, storage_offset) over a raw byte buffer."""
    return raw.view(TORCH_DTYPES[v["dtype"]]).as_strided(v["shape"], v["stride"], v["storage_offset"])


def allocate_caches(groups: dict, kv_dtype) -> dict:
    """Every group's cache as the runtime describes it (GroupBuilder.cache_spec: the step's model dims, the
    group's plan and num_blocks), zero-filled; no shape is written here. The SWA and compressed KV caches with plain
    rows are in kv_dtype (the weights' dtype: float32 for reference runs), the fp8 plan's 640-byte rows, the states
    and the indexer in the dtypes cache_spec gives. An indexer K cache with a full byte view (A5) is one raw buffer of
    num_blocks padded pages viewed as k rows, scales and full rows, the runtime's layout.
    Returns {"swa", "compress_kv", "state", "indexer_state", "indexer_k", "indexer_scale", "indexer_full",
    "indexer_raw"} (None where the groups have no such cache)."""
    out = dict.fromkeys(("swa", "compress_kv", "state", "indexer_state", "indexer_k", "indexer_scale",
                         "indexer_full", "indexer_raw"))
    for kd, gb in groups.items():
        sp = gb.cache_spec
        if kd == "c4_indexer_k":
            if "full_view" in sp:
                raw = torch.zeros(sp["num_blocks"] * sp["padded_page_bytes"], dtype=torch.uint8)
                out["indexer_raw"] = raw
                out["indexer_k"] = _as_view(raw, sp["view"])
                out["indexer_scale"] = _as_view(raw, sp["scale_view"])
                fv = sp["full_view"]
                out["indexer_full"] = raw.as_strided(fv["shape"], fv["stride"], fv["storage_offset"])
            else:
                out["indexer_k"] = torch.zeros(sp["shape"], dtype=TORCH_DTYPES[sp["dtype"]])
                out["indexer_scale"] = torch.zeros(sp["scale_shape"], dtype=TORCH_DTYPES[sp["scale_dtype"]])
            continue
        plain = sp["dtype"] in ("bfloat16", "float16")
        dtype = kv_dtype if plain and kd in ("swa", "c4_kv", "c128_kv") else TORCH_DTYPES[sp["dtype"]]
        slot = {"swa": "swa", "c4_kv": "compress_kv", "c128_kv": "compress_kv", "c4_attn_state": "state",
                "c128_state": "state", "c4_indexer_state": "indexer_state"}[kd]
        out[slot] = torch.zeros(sp["shape"], dtype=dtype)
    return out


def build_step(run, reqs, qlens, pad=0):
    """A step of `run` (a harness with a StepBuilder `sb`, GroupBuilders `gb`, per-kind block `tables`, `kinds`
    and the requests' lengths `S`): requests `reqs` with `qlens` new tokens each, `pad` padding tokens.
    Returns (step metadata, {kind: group metadata}, the new lengths, query_start_loc)."""
    S = [run.S[b] + q for b, q in zip(reqs, qlens)]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    st = run.sb.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32),
                      num_input_tokens=qsl[-1] + pad)
    md = {kd: run.gb[kd].build(st, run.tables[kd][reqs].contiguous()) for kd in run.kinds}
    return st, md, S, qsl


class LayerRun:
    """One DSA layer on any of the three plans ("a2", "a5" fp8 rows, "a5_bf16" SparseFlashMla) with its caches and
    builders, and requests with fixed token streams: request b owns blocks [1 + b * max_blocks, ...) of every group,
    block 0 stays unused (graph-padding rows' zeroed tables point there).

    Caches: plain rows (a2, a5_bf16) are in the weights' dtype (float32 for reference runs); "a5" has the 640-byte
    MXFP8 rows. The indexer is int8 + fp16 scales on a2 and fp8 + fp32 scales in one raw page with the full byte
    view on both A5 plans (docs/design/dsa.md §2.2).
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
        # The model's settings, once (the groups read them from the step builder).
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin,
                                      num_speculative_tokens=k, head_dim=d.D, window=d.W, num_heads_q=d.N,
                                      index_topk=d.K, index_n_heads=d.n_idx, index_head_dim=d.Di,
                                      dspark_num_spec=dspark)
        self.kinds = cache_kinds(d.ratio)
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables, self.rows = {}, {}, {}
        pk = dict(device_kind=self.device_kind, cache_dtype=self.cache_dtype, model_dtype="bfloat16")
        for kd in self.kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=cbs, max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb, **pk)
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
            self.rows[kd] = self.gb[kd].storage_block_size
        c = allocate_caches(self.gb, dtype)
        self.swa, self.cmp, self.state, self.istate = c["swa"], c["compress_kv"], c["state"], c["indexer_state"]
        self.ik, self.isc, self.ifull, self.raw = c["indexer_k"], c["indexer_scale"], c["indexer_full"], c["indexer_raw"]
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
        # No window: the layer takes the builders' (the StepBuilder's, the one source).
        return aar.dsa.Impl(self.w, hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R,
                                 q_lora_rank=d.q_lora, compress_ratio=d.ratio, index_n_heads=d.n_idx,
                                 index_head_dim=d.Di, index_topk=d.K, eps=d.eps, o_groups=d.G, o_lora_rank=d.o_lora,
                                 device_kind=self.device_kind, cache_dtype=self.cache_dtype, model_dtype="bfloat16",
                                 **kw)

    def build(self, reqs, qlens, pad=0):
        return build_step(self, reqs, qlens, pad)

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
