"""MLA decode context parallel (docs/design/mla.md §6, docs/design/cp.md §2.1 / §2.2 / §4 / §7 / §8 / §9) over real gloo
process groups of 2 and 4 local processes.

Every rank regenerates the same global step from one seed (weights, every request's tokens),
keeps a private KV cache holding only the context tokens it owns (placement written here from
the formulas of docs/design/cp.md: owner(x) = (x // I) % W, local index (x // (W I)) I + x % I, through the
shared block table), runs the DCP builder and layer, and compares its output for the whole batch
with the single-process float64 reference of _mla_reference.py over the whole sequence. The new
tokens' cache rows must land on their owner only.
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import random_block_table, run_ranks
from _cp_harness import cp_tol as _tol, local_index as _local_index, local_len as _local_len, owner as _owner
from _mla_reference import MlaDims, attend_request, make_weights, project, half_split, rope_tables

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

mla = aar.mla


def _make_step(W, *, seq_lens, q_lens, I, bs=16, dtype=torch.float32, workspace=0, seed=0, dims=None, spec=0,
               prefilling=None, pd=False, draft=-1):
    """The global step every rank (and the parent) regenerates from the seed.

    prefilling: the is_prefilling flags to build with (None: derived); pd: a builder with the P/D
    recompute scheduler; draft = d >= 0: a draft step, built from the base lengths seq - d - 1."""
    d = dims or MlaDims()
    g = torch.Generator().manual_seed(seed)
    ws = make_weights(d, dtype, g)
    B = len(seq_lens)
    # The tokens first: they (and the reference) must not depend on the DCP layout below.
    xs = [torch.randn(s, d.hidden, generator=g, dtype=torch.float64).to(dtype) for s in seq_lens]
    # Block-table columns a request needs under DCP: rank 0 holds the most tokens.
    per_req = [max(1, math.ceil(_local_len(s, W, I, 0) / bs)) for s in seq_lens]
    table, nb = random_block_table(per_req, g)
    # Every token's cache row (float64): c_kv and the half-split RoPE'd k_rope.
    rows = []
    for r in range(B):
        _, _, c, k_rope = project(d, ws, xs[r], torch.arange(seq_lens[r]))
        rows.append((c, half_split(k_rope)))
    return dict(d=d, ws=ws, B=B, nb=nb, table=table, xs=xs, rows=rows, seq_lens=seq_lens, q_lens=q_lens, I=I,
                bs=bs, dtype=dtype, workspace=workspace, spec=spec, prefilling=prefilling, pd=pd, draft=draft)


def _caches(st, W, rank, upto_context):
    """This rank's caches: garbage, then its own rows of positions < context (upto_context) or of
    every position (the expected state after the step's KV write, garbage kept elsewhere)."""
    d, bs, dtype, table, I = st["d"], st["bs"], st["dtype"], st["table"], st["I"]
    cg = torch.Generator().manual_seed(100 + rank)
    nope = torch.randn(st["nb"], bs, 1, d.L, generator=cg).to(dtype)
    rope = torch.randn(st["nb"], bs, 1, d.R, generator=cg).to(dtype)
    for r in range(st["B"]):
        end = st["seq_lens"][r] - st["q_lens"][r] if upto_context else st["seq_lens"][r]
        c, kr = st["rows"][r]
        for p in range(end):
            if _owner(p, W, I) != rank:
                continue
            li = _local_index(p, W, I)
            blk, off = int(table[r, li // bs]), li % bs
            nope[blk, off, 0] = c[p].to(dtype)
            rope[blk, off, 0] = kr[p].to(dtype)
    return nope, rope


def _run_step(comm, rank, W, **spec):
    """One DCP step on this rank: its output, caches after the step and metadata facts."""
    st = _make_step(W, **spec)
    d, dtype, bs, seq_lens, q_lens, xs = st["d"], st["dtype"], st["bs"], st["seq_lens"], st["q_lens"], st["xs"]
    nope, rope = _caches(st, W, rank, upto_context=True)
    hidden = torch.cat([xs[r][seq_lens[r] - q_lens[r]:] for r in range(st["B"])])
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    cos, sin = rope_tables(max(seq_lens) + 4, d.R)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=st["table"].shape[1],
                                  block_size=bs, num_blocks=st["nb"], cos_table=cos.to(dtype),
                                  sin_table=sin.to(dtype), workspace_tokens=st["workspace"], dcp_world_size=W,
                                  dcp_rank=rank, cp_kv_cache_interleave_size=st["I"],
                                  num_speculative_tokens=st["spec"], pd_recompute_scheduler=st["pd"])
    given = seq_lens if st["draft"] < 0 else [s - st["draft"] - 1 for s in seq_lens]
    flags = {} if st["prefilling"] is None else dict(is_prefilling=torch.tensor(st["prefilling"], dtype=torch.bool))
    md = builder.build(qsl, torch.tensor(given, dtype=torch.int32), st["table"], draft_step=st["draft"], **flags)
    impl = mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                    qk_rope_head_dim=d.R, v_head_dim=d.V, scale=1.0 / math.sqrt(d.P + d.R), dcp_comm=comm,
                    **st["ws"])
    out = torch.full_like(hidden, 7.0)
    comm.reset_counters()
    impl.forward(hidden, nope, rope, md, out)
    facts = dict(num_decodes=md.num_decodes, num_prefills=md.num_prefills, chunks=md.num_context_chunks,
                 kernel_rows=md.decode_num_kernel_reqs if md.num_decodes else 0,
                 calls=(comm.calls_of("all_gather"), comm.calls_of("all_to_all_single")),
                 local=md.decode_seq_lens_list if md.num_decodes else [], draft_step=md.draft_step)
    # As float64 numpy arrays (exact for fp32 / bf16): they pickle by value, while torch tensors would
    # travel as shared-memory handles that die with the rank process.
    return out.double().numpy(), nope.double().numpy(), rope.double().numpy(), facts


_REFERENCES = {}


def _reference(st):
    """The float64 reference of a step; it depends on the seed, dims, dtype and lengths, not on the
    DCP layout, so it is computed once per step and dtype."""
    d, xs = st["d"], st["xs"]
    key = (tuple(st["seq_lens"]), tuple(st["q_lens"]), st["dtype"], repr(d))
    if key not in _REFERENCES:
        scale = 1.0 / math.sqrt(d.P + d.R)
        _REFERENCES[key] = torch.cat([attend_request(d, st["ws"], xs[r], st["q_lens"][r], scale)
                                      for r in range(st["B"])])
    return _REFERENCES[key]


def _check(W, results, spec):
    """Every rank's output against the float64 reference over the whole sequence (computed once,
    here), and its caches: its own new tokens written at their local slots, nothing else touched."""
    st = _make_step(W, **spec)
    ref = _reference(st)
    tol = _tol(st["dtype"])
    for rank, (out, nope, rope, _) in enumerate(results):
        torch.testing.assert_close(torch.from_numpy(out), ref, **tol, msg=lambda m: f"rank {rank} output: {m}")
        want_nope, want_rope = _caches(st, W, rank, upto_context=False)
        torch.testing.assert_close(torch.from_numpy(nope), want_nope.double(), **tol,
                                   msg=lambda m: f"rank {rank} latent cache: {m}")
        torch.testing.assert_close(torch.from_numpy(rope), want_rope.double(), **tol,
                                   msg=lambda m: f"rank {rank} rope cache: {m}")
    return [r[3] for r in results]


# Each case runs inside one spawned group (spawning is the cost); bs 16.
_STEPS = {
    # requests shorter than the group (ranks without local tokens), lengths around multiples of W*I
    "decode": dict(seq_lens=[2, 3, 17, 40, 33], q_lens=[1, 1, 1, 1, 1]),
    # a one-token fresh prompt is still prefilling: under DCP a prefill (docs/design/mla.md §3.3), so the step is
    # all prefill (the split's first request is one)
    "one_token_prompt": dict(seq_lens=[1, 5], q_lens=[1, 1], workspace=128),
    # several context chunks (workspace 64 tokens, 2 prefills with context)
    "chunked_prefill": dict(seq_lens=[70, 30, 9], q_lens=[5, 4, 9], workspace=128),
    "mixed": dict(seq_lens=[12, 20, 40, 9], q_lens=[1, 1, 7, 9], workspace=128),
    # a short context: with I = 16 only rank 0 holds any of it
    "short_context": dict(seq_lens=[9, 6], q_lens=[3, 6], workspace=128),
    "fresh_prefill": dict(seq_lens=[6, 9], q_lens=[6, 9]),
    # speculative decode (3 tokens per request, the interleave-aware causal mask of docs/design/cp.md §3.3):
    # histories of 1 and 2 tokens leave ranks with no local key at or before a query's
    # position (upstream's quirk, corrected: such a row attends nothing on that rank)
    "spec_decode": dict(seq_lens=[4, 5, 18, 41, 34], q_lens=[3, 3, 3, 3, 3], spec=2),
    # the P/D recompute scheduler (docs/design/cp.md §3.1 / §3.2): the second request is still flagged as
    # prefilling (its last prompt token recomputed on the decode node) and runs as a decode
    "pd_recompute": dict(seq_lens=[12, 20, 9], q_lens=[1, 1, 9], prefilling=[0, 1, 1], pd=True, workspace=128),
    # a draft-model step (docs/design/cp.md §3.1 draft_cp_seq_len): built from base lengths with draft_step 1,
    # the prefilling flags ignored; a 3-token request leaves ranks with nothing local at W = 4
    "draft": dict(seq_lens=[12, 20, 3, 33], q_lens=[1, 1, 1, 1], prefilling=[1, 1, 1, 1], draft=1),
}


def _case_steps(rank, world, names, I, dtype, extra):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    return {n: _run_step(comm, rank, world, I=I, dtype=dtype, **{**_STEPS[n], **extra}) for n in names}


def _run(world, names, I, dtype, **extra):
    res = run_ranks(world, _case_steps, names, I, dtype, extra)
    facts = {n: _check(world, [r[n] for r in res], dict(I=I, dtype=dtype, **{**_STEPS[n], **extra}))
             for n in names}
    return [{n: facts[n][rank] for n in names} for rank in range(world)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("I", [1, 2, 16])
def test_dcp_steps_fp32(world, I):
    for rank, per in enumerate(_run(world, list(_STEPS), I, torch.float32)):
        dec = per["decode"]
        assert dec["num_decodes"] == 5
        # this rank's local KV lengths (cp_seq_len), the new token included
        assert dec["local"] == [_local_len(s, world, I, rank) for s in _STEPS["decode"]["seq_lens"]]
        assert dec["calls"] == (1, 1)  # the query gather and the partials' all-to-all
        ch = per["chunked_prefill"]
        assert ch["num_prefills"] == 3 and ch["chunks"] >= 2
        assert ch["calls"] == (ch["chunks"], 0)  # one KV all-gather per chunk, no output exchange
        mx = per["mixed"]
        assert mx["calls"] == (1 + mx["chunks"], 1)
        assert per["fresh_prefill"]["calls"] == (0, 0)  # fresh prefills issue no collective
        assert per["one_token_prompt"]["num_prefills"] == 2
        sp = per["spec_decode"]
        assert sp["num_decodes"] == 5 and sp["kernel_rows"] == 15  # one decode row per token
        assert sp["calls"] == (1, 1)
        pd = per["pd_recompute"]
        assert (pd["num_decodes"], pd["num_prefills"], pd["calls"]) == (2, 1, (1, 1))
        dr = per["draft"]
        assert dr["num_decodes"] == 4 and dr["draft_step"] == 1 and dr["calls"] == (1, 1)
        assert dr["local"] == [_local_len(s, world, I, rank) for s in _STEPS["draft"]["seq_lens"]]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("I", [1, 2, 128])
def test_dcp_steps_block_128(world, I):
    # The kernel block size 128 (docs/design/cp.md §9), I in {1, 2, B}, requests shorter than the group
    # and, with I = 128, whole blocks of context on rank 0 only; chunked context with the upstream
    # workspace rule (the chunk is rounded to B * W).
    per = _run(world, ["decode", "spec_decode", "mixed", "short_context"], I, torch.float32, bs=128, workspace=0)
    for rank, facts in enumerate(per):
        assert facts["decode"]["local"] == [_local_len(s, world, I, rank) for s in _STEPS["decode"]["seq_lens"]]
        assert facts["spec_decode"]["calls"] == (1, 1)


@pytest.mark.parametrize("world", [2, 4])
def test_dcp_steps_bf16(world):
    _run(world, ["decode", "mixed"], 16, torch.bfloat16)


def _case_metadata(rank, world):
    """The DCP context-chunk metadata (docs/design/mla.md §6.1) against its definition, and the errors."""
    W, I, bs = world, 1, 16
    cos, sin = rope_tables(2048, 16)
    b = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=64, block_size=bs,
                            num_blocks=64, cos_table=cos.float(), sin_table=sin.float(), workspace_tokens=1024,
                            dcp_world_size=W, dcp_rank=rank, cp_kv_cache_interleave_size=I)
    ctx = [1000, 0, 300]
    q = [4, 4, 4]
    seq = [c + x for c, x in zip(ctx, q)]
    qsl = torch.tensor([0, 4, 8, 12], dtype=torch.int32)
    md = b.build(qsl, torch.tensor(seq, dtype=torch.int32), torch.zeros(3, 64, dtype=torch.int32))
    # chunk = floor(1024 / 2 / (bs*W)) * bs*W (B*W rounding, see mla_plan.h)
    chunk = (1024 // 2) // (bs * W) * (bs * W)
    C = math.ceil(1000 / chunk)
    assert md.num_context_chunks == C and md.context_chunk_size == chunk
    cl = chunk // W
    assert md.context_local_chunk_size == cl
    pad_ctx = [math.ceil(c / (I * W)) * I for c in ctx]
    plen = [[max(0, min(p, (c + 1) * cl) - c * cl) for p in pad_ctx] for c in range(C)]
    assert md.context_padded_chunk_seq_lens.tolist() == plen
    assert md.context_starts.tolist() == [[c * cl] * 3 for c in range(C)]
    assert md.context_local_seq_tot == [sum(r) for r in plen]
    glob = [[max(0, min(x, (c + 1) * chunk) - c * chunk) for x in ctx] for c in range(C)]
    assert md.context_seq_tot == [sum(r) for r in glob]  # global
    # The reorg rows: request by request, rank-major, the real rows of each rank's padded part.
    idx = md.context_reorg_index.tolist()
    offs = md.context_reorg_offsets
    for c in range(C):
        want, src = [], 0
        toks = sum(plen[c])
        for bi, x in enumerate(ctx):
            for k in range(W):
                n = min(max(0, _local_len(x, W, I, k) - c * cl), plen[c][bi])
                want += [k * toks + src + i for i in range(n)]
            src += plen[c][bi]
        assert idx[offs[c]:offs[c + 1]] == want
    # Local slots: -1 for the tokens other ranks own.
    slots = md.slot_mapping.tolist()
    for r in range(3):
        for t in range(4):
            p = ctx[r] + t
            tok = 4 * r + t
            assert (slots[tok] >= 0) == (_owner(p, W, I) == rank)
    errors = []
    for kw in (dict(dcp_rank=W), dict(cp_kv_cache_interleave_size=3), dict(num_speculative_tokens=1),
               dict(graph_decode_padding=True)):
        args = dict(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=64, block_size=bs, num_blocks=64,
                    cos_table=cos.float(), sin_table=sin.float(), dcp_world_size=W, dcp_rank=rank,
                    cp_kv_cache_interleave_size=I)
        args.update(kw)
        try:
            mla.MetadataBuilder(**args)
            errors.append(None)
        except (ValueError, NotImplementedError) as e:
            errors.append((type(e).__name__, str(e)))
    return errors


def test_dcp_metadata_and_errors():
    res = run_ranks(2, _case_metadata)
    for errs in res:
        assert errs[0][0] == "ValueError" and "dcp_rank" in errs[0][1]
        assert errs[1][0] == "ValueError" and "cp_kv_cache_interleave_size" in errs[1][1]
        assert errs[2] is None  # speculative decode works with DCP (per-token decode rows)
        assert errs[3] is None  # graph decode padding works with DCP (test_dcp_graph.py)


def _case_mismatch(rank, world):
    """A DCP metadata needs a layer with the DCP group (and vice versa), rejected before any write."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    d = MlaDims()
    g = torch.Generator().manual_seed(0)
    ws = make_weights(d, torch.float32, g)
    cos, sin = rope_tables(64, d.R)
    b = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=16, num_blocks=4,
                            cos_table=cos.float(), sin_table=sin.float(), dcp_world_size=world, dcp_rank=rank)
    md = b.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                 torch.zeros(1, 2, dtype=torch.int32))
    kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
              qk_rope_head_dim=d.R, v_head_dim=d.V, **ws)
    nope, rope = torch.randn(4, 16, 1, d.L), torch.randn(4, 16, 1, d.R)
    n0, r0 = nope.clone(), rope.clone()
    msgs = []
    for impl in (mla.Impl(**kw), ):
        try:
            impl.forward(torch.randn(1, d.hidden), nope, rope, md, torch.empty(1, d.hidden))
        except ValueError as e:
            msgs.append(str(e))
    b1 = mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=16, num_blocks=4,
                             cos_table=cos.float(), sin_table=sin.float())
    md1 = b1.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                   torch.zeros(1, 2, dtype=torch.int32))
    try:
        mla.Impl(dcp_comm=comm, **kw).forward(torch.randn(1, d.hidden), nope, rope, md1, torch.empty(1, d.hidden))
    except ValueError as e:
        msgs.append(str(e))
    try:
        mla.Impl(dcp_comm=comm, enable_kv_nz=True, **kw)
    except NotImplementedError as e:
        msgs.append(str(e))
    assert torch.equal(nope, n0) and torch.equal(rope, r0)
    return msgs


def test_dcp_layer_and_metadata_must_agree():
    for msgs in run_ranks(2, _case_mismatch):
        assert len(msgs) == 3
        assert "no dcp_comm" in msgs[0]
        assert "without DCP" in msgs[1]
        assert "enable_kv_nz" in msgs[2]
