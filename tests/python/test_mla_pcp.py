"""MLA prefill context parallel (docs/design/cp.md §11, §6.1, §6.3, §6.4, §8) over real gloo process
groups: PCP 2 (2 ranks) and PCP 2 x DCP 2 (4 ranks).

Every rank regenerates the same global step from one seed (weights, every request's tokens), keeps a
private KV cache holding only the context tokens it owns under the PCP x DCP sharding (placement written
here from the formulas of docs/design/cp.md §2.1 with W = Wp Wd, r = rp Wd + rd, through the shared block
table), builds its metadata from the GLOBAL batch, feeds its local rows (MetadataBuilder.local_token_index;
padding rows get garbage), and runs the layer. The parent compares every real row with the single-process
float64 reference of _mla_reference.py over the whole sequence, checks each rank's caches (the step's
tokens written at their owner's slots, nothing else touched), counts the collectives per step against
docs/design/cp.md §8 and compares the PCP collective logs across ranks.

Layout (docs/design/cp.md §1.1 with TP = DCP): global rank = rp * Wd + rd; DCP groups are consecutive
ranks, PCP groups stride Wd.
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import pcp_dcp_groups as _groups, random_block_table, run_ranks
from _cp_harness import local_index as _local_index, local_len as _local_len, owner as _owner
from _mla_reference import MlaDims, attend_request, half_split, make_weights, project, rope_tables

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

mla = aar.mla
BS = 16


# The steps (decodes first; a 1-token request with history is a decode, a fresh one a prefill). Each
# runs in both groups; a workspace of 64 W tokens (chunks are multiples of B W) makes several context chunks.
_STEPS = {
    # fresh prefills: 13 is not a multiple of 2 Wp, 3 and 1 are shorter than the 2 Wp chunks (ranks
    # whose chunks are all padding), 16 is exact
    "prefill": dict(seq_lens=[13, 3, 1, 16], q_lens=[13, 3, 1, 16]),
    # prefills over cached context (several chunks; a 2-token context is on fewer ranks than the
    # group) and a fresh one
    "chunked_prefill": dict(seq_lens=[70, 30, 5, 9], q_lens=[5, 4, 3, 9]),
    # decodes (one whose KV is shorter than the group), a chunked prefill, a fresh prefill
    "mixed": dict(seq_lens=[12, 3, 40, 9], q_lens=[1, 1, 7, 9]),
    # decode-only, requests shorter than the group and around multiples of W I
    "decode": dict(seq_lens=[2, 3, 17, 40, 33], q_lens=[1, 1, 1, 1, 1]),
    # speculative decode (num_speculative_tokens=1: decodes of 1 or 2 tokens, one decode row per
    # token, a 2-token decode over a 1-token context) beside a fresh prefill
    "spec_decode": dict(seq_lens=[12, 3, 40, 33, 9], q_lens=[2, 2, 1, 2, 9], builder=dict(num_speculative_tokens=1)),
    # decode-only speculative step
    "spec_decode_only": dict(seq_lens=[5, 17, 2], q_lens=[2, 2, 2], builder=dict(num_speculative_tokens=1)),
}


def _make_step(W, I, name, dtype, seed=0, seq_lens=None, q_lens=None):
    d = MlaDims()
    if name is not None:
        seq_lens, q_lens = _STEPS[name]["seq_lens"], _STEPS[name]["q_lens"]
    g = torch.Generator().manual_seed(seed)
    ws = make_weights(d, dtype, g)
    B = len(seq_lens)
    xs = [torch.randn(s, d.hidden, generator=g, dtype=torch.float64).to(dtype) for s in seq_lens]
    # Block-table columns under the PCP x DCP sharding: KV rank 0 holds the most tokens.
    per_req = [max(1, math.ceil(_local_len(s, W, I, 0) / BS)) for s in seq_lens]
    table, nb = random_block_table(per_req, g)
    rows = []
    for r in range(B):
        _, _, c, k_rope = project(d, ws, xs[r], torch.arange(seq_lens[r]))
        rows.append((c, half_split(k_rope)))
    return dict(d=d, ws=ws, B=B, nb=nb, table=table, xs=xs, rows=rows, seq_lens=seq_lens, q_lens=q_lens, I=I,
                dtype=dtype)


def _caches(st, W, kv_rank, upto_context):
    """The caches of KV rank kv_rank: garbage, then its own rows of the positions before the step
    (upto_context) or of every position (the expected state after the step)."""
    d, dtype, table, I = st["d"], st["dtype"], st["table"], st["I"]
    cg = torch.Generator().manual_seed(100 + kv_rank)
    nope = torch.randn(st["nb"], BS, 1, d.L, generator=cg).to(dtype)
    rope = torch.randn(st["nb"], BS, 1, d.R, generator=cg).to(dtype)
    for r in range(st["B"]):
        end = st["seq_lens"][r] - st["q_lens"][r] if upto_context else st["seq_lens"][r]
        c, kr = st["rows"][r]
        for p in range(end):
            if _owner(p, W, I) != kv_rank:
                continue
            li = _local_index(p, W, I)
            blk, off = int(table[r, li // BS]), li % BS
            nope[blk, off, 0] = c[p].to(dtype)
            rope[blk, off, 0] = kr[p].to(dtype)
    return nope, rope


def _builder(st, wp, rp, wd, rd, **kw):
    d, dtype = st["d"], st["dtype"]
    cos, sin = rope_tables(max(st["seq_lens"]) + 4, d.R)
    return mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=st["table"].shape[1],
                               block_size=BS, num_blocks=st["nb"], cos_table=cos.to(dtype), sin_table=sin.to(dtype),
                               workspace_tokens=64 * wp * wd, dcp_world_size=wd, dcp_rank=rd, pcp_world_size=wp,
                               pcp_rank=rp, cp_kv_cache_interleave_size=st["I"], **kw)


def _impl(st, pcp, dcp):
    d = st["d"]
    return mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                    qk_rope_head_dim=d.R, v_head_dim=d.V, scale=1.0 / math.sqrt(d.P + d.R), dcp_comm=dcp,
                    pcp_comm=pcp, **st["ws"])


def _run_step(pcp, dcp, rank, wp, wd, name, I, dtype):
    """One step on this rank: its real output rows (global token -> row), caches and facts."""
    rp, rd = rank // wd, rank % wd
    W, r_kv = wp * wd, rp * wd + rd
    st = _make_step(W, I, name, dtype)
    d, xs, seq_lens, q_lens = st["d"], st["xs"], st["seq_lens"], st["q_lens"]
    nope, rope = _caches(st, W, r_kv, upto_context=True)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    builder = _builder(st, wp, rp, wd, rd, **_STEPS[name].get("builder", {}))
    md = builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), st["table"])
    idx = builder.local_token_index.long()
    n = md.num_local_tokens
    assert idx.numel() == n and md.pcp_world_size == wp and md.pcp_rank == rp
    real = idx >= 0
    glob = torch.cat([xs[r][seq_lens[r] - q_lens[r]:] for r in range(st["B"])])
    # Padding rows carry garbage: it must never reach a real row or a cache.
    hidden = (torch.randn(n, d.hidden, generator=torch.Generator().manual_seed(50 + rank)) * 5).to(dtype)
    hidden[real] = glob[idx[real]]
    out = torch.full_like(hidden, float("nan"))
    impl = _impl(st, pcp, dcp)
    pcp.reset_counters()
    if dcp is not None:
        dcp.reset_counters()
    impl.forward(hidden, nope, rope, md, out)
    calls = (pcp.calls_of("all_gather"), pcp.calls_of("all_to_all_single"),
             dcp.calls_of("all_gather") if dcp else 0, dcp.calls_of("all_to_all_single") if dcp else 0)
    log = [(op, tuple(shape), dt, dim) for (_, op, shape, dt, dim, _) in pcp.log]
    # docs/design/cp.md §6.3: the decode region of the padded-global slot mapping keeps rank 0's copy of
    # each decode token (every Wp-th entry, the token's slot) and -1 elsewhere.
    td = md.num_decode_tokens
    padded = md.pcp_padded_slot_mapping.tolist()
    slots = md.slot_mapping.tolist()
    strided = all(padded[k] == (slots[k // wp] if k % wp == 0 else -1) for k in range(wp * td))
    prefill_rows_unwritten = all(s == -1 for s in slots[td:])
    facts = dict(num_decodes=md.num_decodes, num_prefills=md.num_prefills, chunks=md.num_context_chunks,
                 calls=calls, strided=strided, prefill_rows_unwritten=prefill_rows_unwritten,
                 local=md.decode_seq_lens_list if md.num_decodes else [], num_local=n)
    rows = {int(t): out[k].double().numpy() for k, t in enumerate(idx.tolist()) if t >= 0}
    return rows, nope.double().numpy(), rope.double().numpy(), facts, log


def _case_steps(rank, world, wp, wd, configs):
    pcp_group, dcp_group = _groups(rank, wp, wd)
    pcp = aar.cp.Comm(pcp_group, timeout_s=20.0, log=True)
    dcp = aar.cp.Comm(dcp_group, timeout_s=20.0) if wd > 1 else None
    res = {}
    for (I, dtype, names) in configs:
        for name in names:
            res[(I, str(dtype), name)] = _run_step(pcp, dcp, rank, wp, wd, name, I, dtype)
    return res


_REFERENCES = {}


def _reference(st):
    d, xs = st["d"], st["xs"]
    key = (tuple(st["seq_lens"]), tuple(st["q_lens"]), st["dtype"])
    if key not in _REFERENCES:
        scale = 1.0 / math.sqrt(d.P + d.R)
        _REFERENCES[key] = torch.cat([attend_request(d, st["ws"], xs[r], st["q_lens"][r], scale)
                                      for r in range(st["B"])])
    return _REFERENCES[key]


def _expected_calls(name, facts, wp, wd):
    """(pcp all_gather, pcp all_to_all, dcp all_gather, dcp all_to_all) of one layer (docs/design/cp.md §8)."""
    nd, np_, ch = facts["num_decodes"], facts["num_prefills"], facts["chunks"]
    pcp_ag = int(nd > 0) + int(np_ > 0) + ch
    dcp = (int(nd > 0) + ch, int(nd > 0)) if wd > 1 else (0, 0)
    return (pcp_ag, 0) + dcp


def _run(wp, wd, configs):
    world = wp * wd
    res = run_ranks(world, _case_steps, wp, wd, configs, deadline_s=120.0)
    W = world
    for (I, dtype, names) in configs:
        tol = dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        for name in names:
            key = (I, str(dtype), name)
            st = _make_step(W, I, name, dtype)
            ref = _reference(st)
            total = sum(st["q_lens"])
            nd = res[0][key][3]["num_decodes"]
            td = sum(st["q_lens"][:nd])
            for rd in range(wd):
                # Over the PCP ranks of one DCP index: decodes on every rank, each prefill token on one.
                cover = [0] * total
                for rp in range(wp):
                    for t in res[rp * wd + rd][key][0]:
                        cover[t] += 1
                assert cover == [wp] * td + [1] * (total - td), (key, rd, cover)
            for rank in range(world):
                rows, nope, rope, facts, log = res[rank][key]
                for t, got in rows.items():
                    torch.testing.assert_close(torch.from_numpy(got), ref[t], **tol,
                                               msg=lambda m: f"{key} rank {rank} token {t}: {m}")
                rp, rd = rank // wd, rank % wd
                want_nope, want_rope = _caches(st, W, rp * wd + rd, upto_context=False)
                torch.testing.assert_close(torch.from_numpy(nope), want_nope.double(), **tol,
                                           msg=lambda m: f"{key} rank {rank} latent cache: {m}")
                torch.testing.assert_close(torch.from_numpy(rope), want_rope.double(), **tol,
                                           msg=lambda m: f"{key} rank {rank} rope cache: {m}")
                assert facts["calls"] == _expected_calls(name, facts, wp, wd), (key, rank, facts["calls"])
                assert facts["strided"] and facts["prefill_rows_unwritten"], (key, rank)
                if facts["num_decodes"]:
                    # The decodes' local KV lengths on the PCP x DCP shard (their new token included).
                    # With speculative decode one row per token: token j of a q-token decode sees s - q + j + 1.
                    sq = zip(st["seq_lens"][:facts["num_decodes"]], st["q_lens"][:facts["num_decodes"]])
                    spec = "builder" in _STEPS[name]
                    want = [_local_len(s - q + j + 1, W, I, rp * wd + rd) for s, q in sq
                            for j in (range(q) if spec else [q - 1])]
                    assert facts["local"] == want, (key, rank)
                # Every rank of a PCP group issued the same PCP collectives (shapes included).
                assert log == res[rd][key][4], (key, rank)
    return res


_ALL = list(_STEPS)


def test_pcp2():
    # I = 1 and I = B (whole blocks per rank), fp32, and a bf16 mixed step.
    res = _run(2, 1, [(1, torch.float32, _ALL), (BS, torch.float32, ["chunked_prefill", "mixed"]),
                      (1, torch.bfloat16, ["mixed"])])
    facts = res[0][(1, str(torch.float32), "chunked_prefill")][3]
    assert facts["chunks"] >= 2 and facts["num_prefills"] == 4


def test_pcp2_dcp2():
    res = _run(2, 2, [(1, torch.float32, _ALL), (2, torch.float32, ["chunked_prefill", "decode"]),
                      (BS, torch.float32, ["mixed"]), (2, torch.bfloat16, ["chunked_prefill"])])
    assert res[0][(1, str(torch.float32), "mixed")][3]["num_decodes"] == 2


# ----------------------------------------------------------------------------- graph capture (decode buckets)

# Decode-only batches replayed in one captured bucket of BUCKET requests (smaller ones padded with dummies;
# [2]: a request shorter than the group).
_GRAPH_STEPS = [[2, 17, 40, 33], [3, 18], [41, 34, 5], [2]]
BUCKET = 4


def _graph_case(rank, world, wp, wd, I, dtype_name, spec):
    """docs/design/cp.md §11.4: a decode bucket captured once (preprocess and cache write, the shard's latent call,
    DCP merge + PCP gather + merge + W_UV + o_proj), then every step built padded to the bucket, updated and
    replayed; each replay equals an eager PCP forward of the same step (unpadded, on a twin cache) and the float64
    reference; the dummies' rows are zero and the captured addresses never move."""
    torch.set_num_threads(1)
    rp, rd = rank // wd, rank % wd
    W, r_kv = wp * wd, rp * wd + rd
    pcp_group, dcp_group = _groups(rank, wp, wd)
    pcp = aar.cp.Comm(pcp_group, timeout_s=20.0)
    dcp = aar.cp.Comm(dcp_group, timeout_s=20.0) if wd > 1 else None
    dtype = getattr(torch, dtype_name)
    qn = 1 + spec  # tokens per decode request
    NT, MB, NB = BUCKET * qn, 8, 40
    steps = [[n + spec for n in seq] for seq in _GRAPH_STEPS]  # a history of at least one token: decodes
    st0 = _make_step(W, I, None, dtype, seq_lens=steps[0], q_lens=[qn] * len(steps[0]))
    d = st0["d"]
    cos, sin = rope_tables(64, d.R)
    mk = dict(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=MB, block_size=BS, num_blocks=NB,
              cos_table=cos.to(dtype), sin_table=sin.to(dtype), workspace_tokens=64 * W, dcp_world_size=wd,
              dcp_rank=rd, pcp_world_size=wp, pcp_rank=rp, cp_kv_cache_interleave_size=I,
              num_speculative_tokens=spec)
    b_graph = mla.MetadataBuilder(graph_decode_padding=True, **mk)
    b_eager = mla.MetadataBuilder(**mk)
    layer_graph, layer_eager, layer_pad = _impl(st0, pcp, dcp), _impl(st0, pcp, dcp), _impl(st0, pcp, dcp)
    nope_g, rope_g = torch.zeros(NB, BS, 1, d.L, dtype=dtype), torch.zeros(NB, BS, 1, d.R, dtype=dtype)
    hidden_s, out_s = torch.zeros(NT, d.hidden, dtype=dtype), torch.zeros(NT, d.hidden, dtype=dtype)

    def table_of(st):
        t = torch.zeros(st["B"], MB, dtype=torch.int32)
        t[:, :st["table"].shape[1]] = st["table"]
        return t

    md = b_graph.build_for_graph_capture(_i32([0, qn]), _i32([9]), table_of(st0)[:1].contiguous(),
                                         num_input_tokens=NT)
    assert md.num_local_tokens == NT and md.num_decodes == 1
    g = aar.GraphParams("recording")
    with g.capture(NT):
        layer_graph.forward(hidden_s, nope_g, rope_g, md, out_s)
    kinds = [c[0] for c in g.calls(NT)]
    assert kinds == ["prepare", "fia", "prepare"], kinds
    addrs = g.call_addresses(NT)
    tol = dict(atol=2e-4, rtol=2e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    ctol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for seq in steps:
        B = len(seq)
        st = _make_step(W, I, None, dtype, seq_lens=seq, q_lens=[qn] * B)
        assert st["nb"] <= NB and st["table"].shape[1] <= MB
        ctx_nope, ctx_rope = _caches(st, W, r_kv, upto_context=True)
        want_nope, want_rope = _caches(st, W, r_kv, upto_context=False)
        nope_g.zero_()
        rope_g.zero_()
        nope_g[:st["nb"]] = ctx_nope
        rope_g[:st["nb"]] = ctx_rope
        nope_e, rope_e = nope_g.clone(), rope_g.clone()
        hidden = torch.cat([st["xs"][r][seq[r] - qn:] for r in range(B)])
        qsl = torch.arange(B + 1, dtype=torch.int32) * qn
        tab = table_of(st)
        md_g = b_graph.build(qsl, _i32(seq), tab, num_input_tokens=NT)
        md_e = b_eager.build(qsl, _i32(seq), tab)
        assert md_g.num_local_tokens == NT and md_e.num_local_tokens == B * qn
        hidden_s.zero_()
        hidden_s[:B * qn] = hidden
        out_s.fill_(float("nan"))
        g.update(NT, md_g)
        pcp.reset_counters()
        if dcp is not None:
            dcp.reset_counters()
        g.replay(NT)
        calls = (pcp.calls_of("all_gather"), pcp.calls_of("all_to_all_single"),
                 dcp.calls_of("all_gather") if dcp else 0, dcp.calls_of("all_to_all_single") if dcp else 0)
        assert calls == _expected_calls("decode", dict(num_decodes=B, num_prefills=0, chunks=0), wp, wd), calls
        out_e = torch.full_like(hidden, 7.0)
        layer_eager.forward(hidden, nope_e, rope_e, md_e, out_e)
        T = B * qn
        torch.testing.assert_close(out_s[:T].double(), out_e.double(), **ctol)
        assert not torch.isnan(out_s).any() and float(out_s[T:].abs().sum()) == 0.0  # dummies attend nothing
        torch.testing.assert_close(out_s[:T].double(), _reference(st), **tol)
        # The step's rows at their owner's slots, nothing else (the dummies write nothing).
        torch.testing.assert_close(nope_g[:st["nb"]].double(), want_nope.double(), **ctol)
        torch.testing.assert_close(rope_g[:st["nb"]].double(), want_rope.double(), **ctol)
        assert float(nope_g[st["nb"]:].abs().sum()) == 0.0
        torch.testing.assert_close(nope_e[:st["nb"]].double(), want_nope.double(), **ctol)
        assert g.call_addresses(NT) == addrs
        # The padded metadata run eagerly (no capture) gives the replay's rows.
        nope_p, rope_p = _caches(st, W, r_kv, upto_context=True)
        nope_pad = torch.zeros_like(nope_g)
        rope_pad = torch.zeros_like(rope_g)
        nope_pad[:st["nb"]], rope_pad[:st["nb"]] = nope_p, rope_p
        out_p = torch.full_like(out_s, 7.0)
        layer_pad.forward(hidden_s, nope_pad, rope_pad, md_g, out_p)
        torch.testing.assert_close(out_p, out_s, **ctol)
        torch.testing.assert_close(nope_pad.double(), nope_g.double(), **ctol)
    # A step with prefills is eager only: inside a capture it is refused by name.
    st = _make_step(W, I, "mixed", dtype)
    qsl = torch.tensor([0] + list(torch.tensor(st["q_lens"]).cumsum(0)), dtype=torch.int32)
    md_p = b_graph.build(qsl, _i32(st["seq_lens"]), table_of(st))
    refused = ""
    try:
        with g.capture(2 * NT):
            x = torch.zeros(md_p.num_local_tokens, d.hidden, dtype=dtype)
            layer_graph.forward(x, nope_g, rope_g, md_p, torch.zeros_like(x))
    except NotImplementedError as e:
        refused = str(e)
    return len(steps), refused


@pytest.mark.parametrize("wp,wd,I,dtype,spec", [(2, 1, 1, "float32", 0), (2, 1, BS, "bfloat16", 0),
                                                (2, 1, 1, "float32", 1), (2, 2, 2, "float32", 1)])
def test_pcp_decode_graph_replays_like_eager(wp, wd, I, dtype, spec):
    # spec > 0: speculative decode inside the capture (one decode row per token).
    res = run_ranks(wp * wd, _graph_case, wp, wd, I, dtype, spec, deadline_s=120.0)
    for n, refused in res:
        assert n == len(_GRAPH_STEPS)
        assert "PCP capture of prefill steps is not supported" in refused, refused


def test_pcp_padding_refuses_steps_with_prefills():
    st = _make_step(2, 1, "mixed", torch.float32)
    b = _builder(st, 2, 0, 1, 0, graph_decode_padding=True)
    qsl = torch.tensor([0] + list(torch.tensor(st["q_lens"]).cumsum(0)), dtype=torch.int32)
    md = b.build(qsl, _i32(st["seq_lens"]), st["table"])
    before = md.slot_mapping.clone()
    with pytest.raises(ValueError, match="only a decode-only step is padded to a graph bucket"):
        b.build(qsl, _i32(st["seq_lens"]), st["table"], num_input_tokens=int(qsl[-1]) + 4)
    assert md.is_current and torch.equal(md.slot_mapping, before)
    b_eager = _builder(st, 2, 0, 1, 0)
    with pytest.raises(ValueError, match="without graph_decode_padding pads no step"):
        b_eager.build(qsl, _i32(st["seq_lens"]), st["table"], num_input_tokens=int(qsl[-1]) + 4)
    with pytest.raises(NotImplementedError, match="without graph_decode_padding"):
        b_eager.build_for_graph_capture(_i32([0, 1]), _i32([5]), st["table"][:1])


# ----------------------------------------------------------------------------- metadata (one process)

def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


def test_pcp_metadata_head_tail_lists():
    # docs/design/cp.md §6.4's example: Wp = 2, one prefill of 8 tokens (c = 2), one decode before it.
    st = _make_step(2, 1, "decode", torch.float32)
    lists = {}
    for rp in range(2):
        b = _builder(st, 2, rp, 1, 0)
        md = b.build(_i32([0, 1, 9]), _i32([5, 8]), st["table"][:2])
        assert (md.num_reqs, md.num_decodes, md.num_prefills, md.num_actual_tokens) == (2, 1, 1, 9)
        assert (md.num_local_tokens, md.num_local_prefill_tokens) == (5, 4)
        assert md.prefill_actual_seq_lengths_q == [4] and md.prefill_max_query_len == 4
        lists[rp] = {k: getattr(md, "pcp_" + k).tolist() for k in
                     ("q_head_idx", "q_tail_idx", "kv_head_nomask_idx", "kv_head_mask_idx", "kv_tail_nomask_idx",
                      "kv_tail_mask_idx", "q_full_idx")}
        lists[rp]["ends"] = (md.pcp_mask_seq_ends, md.pcp_head_nomask_kv_ends, md.pcp_tail_nomask_kv_ends)
        assert b.local_token_index.tolist() == [0] + ([1, 2, 7, 8] if rp == 0 else [3, 4, 5, 6])
        # restored = gathered[restore]: rank 0's rows then rank 1's, back to positions 0..7
        assert md.pcp_prefill_restore_idx.tolist() == [0, 1, 4, 5, 6, 7, 2, 3]
    assert lists[0]["q_head_idx"] == [0, 1] and lists[0]["q_tail_idx"] == [2, 3]
    assert lists[0]["kv_head_nomask_idx"] == [] and lists[0]["kv_head_mask_idx"] == [0, 1]
    assert lists[0]["kv_tail_nomask_idx"] == list(range(6)) and lists[0]["kv_tail_mask_idx"] == [6, 7]
    assert lists[1]["kv_head_nomask_idx"] == [0, 1] and lists[1]["kv_head_mask_idx"] == [2, 3]
    assert lists[1]["kv_tail_nomask_idx"] == list(range(4)) and lists[1]["kv_tail_mask_idx"] == [4, 5]
    assert lists[0]["q_full_idx"] == [0, 1, 2, 3]
    assert lists[0]["ends"] == ([2], [0], [6]) and lists[1]["ends"] == ([2], [2], [4])


def test_pcp_builder_config_and_build_errors():
    st = _make_step(2, 1, "decode", torch.float32)
    with pytest.raises(ValueError, match="pcp_rank=2"):
        _builder(st, 2, 2, 1, 0)
    with pytest.raises(NotImplementedError, match="disable_padded_drafter_batch with pcp_world_size=2"):
        _builder(st, 2, 0, 1, 0, num_speculative_tokens=1, disable_padded_drafter_batch=True)
    with pytest.raises(ValueError, match="exceeds the 16 partials"):
        _builder(st, 16, 0, 2, 0)
    b = _builder(st, 2, 1, 1, 0)
    qsl, seq, bt = _i32([0, 1, 9]), _i32([5, 8]), st["table"][:2]
    md = b.build(qsl, seq, bt)
    before = md.pcp_padded_slot_mapping.clone(), md.slot_mapping.clone()
    with pytest.raises(ValueError, match="num_input_tokens=16"):
        b.build(qsl, seq, bt, num_input_tokens=16)
    with pytest.raises(ValueError, match="smaller than"):
        b.build(qsl, _i32([5, 7]), bt)
    assert md.is_current
    assert torch.equal(md.pcp_padded_slot_mapping, before[0]) and torch.equal(md.slot_mapping, before[1])


# ----------------------------------------------------------------------------- bad input (2 ranks)

def _case_bad_input(rank, world):
    pcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = _make_step(2, 1, "mixed", torch.float32)
    d = st["d"]
    seq_lens, q_lens = st["seq_lens"], st["q_lens"]
    qsl = _i32([0] + list(torch.tensor(q_lens).cumsum(0)))
    md = _builder(st, 2, rank, 1, 0).build(qsl, _i32(seq_lens), st["table"])
    other = _builder(st, 2, 1 - rank, 1, 0).build(qsl, _i32(seq_lens), st["table"])
    plain = _builder(st, 1, 0, 1, 0).build(_i32([0, 1]), _i32([5]), st["table"][:1])  # no PCP
    n = md.num_local_tokens
    nope, rope = _caches(st, 2, rank, upto_context=True)
    n0, r0 = nope.clone(), rope.clone()
    x = torch.randn(n, d.hidden)
    out = torch.zeros(n, d.hidden)
    impl = _impl(st, pcp, None)
    msgs = []
    bad = [
        (lambda: impl.forward(x[:-1], nope, rope, md, out[:-1]), ValueError, "pcp.num_local_tokens"),
        (lambda: impl.forward(x, nope, rope, other, out), ValueError, "pcp_comm is rank"),
        (lambda: _impl(st, None, None).forward(x, nope, rope, md, out), ValueError, "no pcp_comm"),
        (lambda: impl.forward(x.double(), nope, rope, md, out.double()), ValueError, "dtype"),
        (lambda: impl.forward(x, nope[:, :8], rope, md, out), ValueError, "nope_cache"),
        (lambda: impl.forward(x, nope, rope, plain, out), ValueError, "without PCP"),
        (lambda: mla.LatentAttention(num_heads=d.H, kv_lora_rank=d.L, qk_nope_head_dim=d.P, qk_rope_head_dim=d.R,
                                     v_head_dim=d.V).forward_prefill(
            torch.randn(md.num_prefill_tokens, d.H, d.P + d.R), torch.randn(md.num_prefill_tokens, d.L),
            torch.randn(md.num_prefill_tokens, d.R), st["ws"]["kv_b_proj"], nope, rope, md,
            torch.zeros(md.num_prefill_tokens, d.H * d.V)), NotImplementedError, "built for PCP"),
        (lambda: mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                          qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, enable_kv_nz=True,
                          pcp_comm=pcp, **st["ws"]), NotImplementedError, "enable_kv_nz with PCP"),
    ]
    for call, exc, what in bad:
        with pytest.raises(exc, match=what):
            call()
        msgs.append(what)
    g = aar.GraphParams("recording")
    with pytest.raises(NotImplementedError, match="an MLA PCP forward"):
        with g.capture(n):
            impl.forward(x, nope, rope, md, out)
    state = (pcp.calls, torch.equal(nope, n0), torch.equal(rope, r0), bool(out.any()))
    assert state == (0, True, True, False), state
    impl.forward(x, nope, rope, md, out)  # the good call still works on every rank
    return pcp.calls, len(msgs)


def test_forward_rejects_bad_input_before_any_collective_or_write():
    res = run_ranks(2, _case_bad_input, deadline_s=60.0)
    # The good call: the decode partials, the prefill KV and one context chunk, each one PCP all-gather.
    assert res[0] == res[1] == (3, 8)
