"""The SFA context-parallel tests' common step (test_sfa_dcp.py, test_sfa_dsa_cp.py, test_sfa_dsa_dcp.py,
test_sfa_pcp.py;
docs/design/sparse_cp.md).

Every rank regenerates the same global step from one seed: weights (indexer included), every request's tokens,
the group's block table. Its caches follow the DCP placement written in _cp_harness (docs/design/cp.md §2.1):
the main cache (latent, rope) holds the context tokens the rank owns, the indexer cache every context token
(replicated, num_blocks * W blocks, docs/design/sparse_cp.md §2); under PCP (§11) W is the PCP group. With W = 1 that is the complete caches of plain
SFA and of DSA-CP (every rank keeps whole caches there). The float64 reference of the whole batch
(_sfa_reference) and the single-rank SFA backend's result (plain builder and layer in this process) are computed
once per step and shared by the tests.
"""

import math

import torch

import ascend_attn_rt as aar
from _cp_harness import local_index, local_len, owner, random_block_table
from _mla_reference import MlaDims, half_split, make_weights, project, rope_tables
from _sfa_reference import IdxDims, indexer_keys, indexer_topk_request, make_indexer_weights, sfa_attend_request

sfa = aar.sfa
F64 = torch.float64


# The steps of the context-parallel tests: requests shorter than the group (ranks without local keys or without
# tokens), contexts past K (a real selection), token counts not divisible by the group.
STEPS = {
    "decode": dict(seq_lens=[2, 3, 17, 40, 33], q_lens=[1, 1, 1, 1, 1]),
    # one request: every rank but rank 0 has an empty or padding-only token slice (DSA-CP)
    "single_decode": dict(seq_lens=[21], q_lens=[1]),
    "fresh_prefill": dict(seq_lens=[6, 13], q_lens=[6, 13]),
    "chunked_prefill": dict(seq_lens=[40, 30, 9], q_lens=[5, 4, 9]),
    "mixed": dict(seq_lens=[12, 20, 37, 9], q_lens=[1, 1, 7, 9]),
    # speculative decode: 3 tokens per request, causality from the indexer's selection
    "spec_decode": dict(seq_lens=[4, 5, 18, 41, 34], q_lens=[3, 3, 3, 3, 3], spec=2),
    # a decode-only step padded to a graph bucket
    "padded_decode": dict(seq_lens=[7, 26, 19], q_lens=[1, 1, 1], pad=2),
}


def make_step(W=1, *, seq_lens, q_lens, I=1, bs=16, dtype=torch.float32, seed=0, spec=0, K=8, pad=0):
    d = MlaDims()
    idx = IdxDims(K=K)
    g = torch.Generator().manual_seed(seed)
    ws = make_weights(d, dtype, g)
    iw = make_indexer_weights(d, idx, dtype, g)
    B = len(seq_lens)
    xs = [torch.randn(s, d.hidden, generator=g, dtype=F64).to(dtype) for s in seq_lens]
    # The group's block table: enough local blocks for rank 0 (the longest local sequence) and for the
    # replicated columns (ceil(S / bs) replicated blocks use ceil(that / W) local columns). W = 1: ceil(S / bs).
    per_req = [max(1, math.ceil(local_len(s, W, I, 0) / bs), math.ceil(math.ceil(s / bs) / W)) for s in seq_lens]
    table, nb = random_block_table(per_req, g)
    rows, keys = [], []
    for r in range(B):
        pos = torch.arange(seq_lens[r])
        _, _, c, k_rope = project(d, ws, xs[r], pos)
        rows.append((c, half_split(k_rope)))
        keys.append(indexer_keys(d, idx, iw, xs[r], pos))
    return dict(d=d, idx=idx, ws=ws, iw=iw, B=B, nb=nb, table=table, xs=xs, rows=rows, keys=keys,
                seq_lens=seq_lens, q_lens=q_lens, W=W, I=I, bs=bs, dtype=dtype, spec=spec, pad=pad)


def replicated_slot(table, r, p, W, bs):
    col = p // bs
    return (int(table[r, col // W]) * W + col % W) * bs + p % bs


def caches(st, rank, upto_context, fresh=False):
    """This rank's caches: garbage, then its own main rows and every indexer row of positions < context
    (upto_context) or of every position (the expected state after the step); `fresh`: the garbage only."""
    d, idx, bs, dtype, table, W, I = st["d"], st["idx"], st["bs"], st["dtype"], st["table"], st["W"], st["I"]
    cg = torch.Generator().manual_seed(100 + rank)
    nope = torch.randn(st["nb"], bs, 1, d.L, generator=cg).to(dtype)
    rope = torch.randn(st["nb"], bs, 1, d.R, generator=cg).to(dtype)
    idx_k = torch.randn(st["nb"] * W, bs, 1, idx.D, generator=cg).to(dtype)
    flat_idx = idx_k.view(-1, idx.D)
    for r in range(0 if fresh else st["B"]):
        end = st["seq_lens"][r] - st["q_lens"][r] if upto_context else st["seq_lens"][r]
        c, kr = st["rows"][r]
        for p in range(end):
            flat_idx[replicated_slot(table, r, p, W, bs)] = st["keys"][r][p].to(dtype)
            if owner(p, W, I) != rank:
                continue
            li = local_index(p, W, I)
            blk, off = int(table[r, li // bs]), li % bs
            nope[blk, off, 0] = c[p].to(dtype)
            rope[blk, off, 0] = kr[p].to(dtype)
    return nope, rope, idx_k


def weights(st, o_proj_world=1, rank=0):
    """The layer's weights: everything whole but, with o_proj_world > 1 (DSA-CP), o_proj's columns of this
    rank's heads (its row-parallel shard)."""
    ws = dict(st["ws"])
    if o_proj_world > 1:
        C = ws["o_proj"].shape[1] // o_proj_world
        ws["o_proj"] = ws["o_proj"][:, rank * C:(rank + 1) * C].contiguous()
    return ws


def make_impl(st, o_proj_world=1, rank=0, indexer=True, **kw):
    d, idx, iw = st["d"], st["idx"], st["iw"]
    extra = {}
    if indexer:
        extra = dict(index_n_head=idx.n_head, index_head_dim=idx.D, index_topk=idx.K, indexer_wq_b=iw["wq_b"],
                     indexer_wk=iw["wk"], indexer_weights_proj=iw["weights_proj"],
                     indexer_k_norm_weight=iw["k_norm_weight"], indexer_k_norm_bias=iw["k_norm_bias"],
                     indexer_k_norm_eps=idx.eps)
    return sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                    qk_rope_head_dim=d.R, v_head_dim=d.V, scale=1.0 / math.sqrt(d.P + d.R), **extra, **kw,
                    **weights(st, o_proj_world, rank))


def make_builder(st, **kw):
    d, dtype = st["d"], st["dtype"]
    cos, sin = rope_tables(max(st["seq_lens"]) + 4, d.R)
    return sfa.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=st["table"].shape[1],
                               block_size=st["bs"], num_blocks=st["nb"], cos_table=cos.to(dtype),
                               sin_table=sin.to(dtype), num_speculative_tokens=st["spec"], **kw)


def hidden(st):
    seq_lens, q_lens, xs = st["seq_lens"], st["q_lens"], st["xs"]
    h = torch.cat([xs[r][seq_lens[r] - q_lens[r]:] for r in range(st["B"])])
    if st["pad"]:
        h = torch.cat([h, torch.zeros(st["pad"], h.shape[1], dtype=h.dtype)])
    return h


def qsl(q_lens):
    return torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)


def build_args(st):
    return (qsl(st["q_lens"]), torch.tensor(st["seq_lens"], dtype=torch.int32), st["table"])


def calls(comm):
    """A step's collectives on `comm`: (all-gathers, all-to-alls, all-reduces)."""
    return tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))


_REFERENCES = {}


def reference(st):
    """(output, top-k rows) of the whole batch in float64, independent of any layout (computed once)."""
    d, idx, xs = st["d"], st["idx"], st["xs"]
    key = (tuple(st["seq_lens"]), tuple(st["q_lens"]), st["dtype"], idx.K)
    if key not in _REFERENCES:
        scale = 1.0 / math.sqrt(d.P + d.R)
        outs, tks = [], []
        for r in range(st["B"]):
            s, q = st["seq_lens"][r], st["q_lens"][r]
            tk, _ = indexer_topk_request(d, idx, st["ws"], st["iw"], xs[r][:s], q)
            outs.append(sfa_attend_request(d, st["ws"], xs[r][:s], q, scale, tk))
            tks.append(tk)
        _REFERENCES[key] = (torch.cat(outs), torch.cat(tks))
    return _REFERENCES[key]


_SINGLE = {}


def single_rank(spec):
    """(output, top-k rows of the real tokens) of the plain single-rank SFA backend on the step (computed once)."""
    key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in spec.items()))
    if key not in _SINGLE:
        st = make_step(1, **spec)
        nope, rope, idx_k = caches(st, 0, upto_context=True)
        h = hidden(st)
        md = make_builder(st).build(*build_args(st), num_input_tokens=h.shape[0])
        impl = make_impl(st)
        out = torch.zeros_like(h)
        impl.forward(h, [nope, rope, idx_k], md, out)
        n = sum(st["q_lens"])
        _SINGLE[key] = (out.double(), impl.last_topk[:n, 0].to(torch.int64))
    return _SINGLE[key]
