"""SFA prefill context parallel (docs/design/sparse_cp.md §11) over real gloo process groups of 2 and 4 local
processes.

Every rank regenerates the same global step from one seed (_sfa_cp_steps) and builds it; its hidden states are
its local rows (builder.local_token_index: the decodes, then its head and tail chunk of every prefill; a pad row
gets garbage). Its main cache (latent, rope) holds the context positions it owns under the DCP placement over the
PCP group (docs/design/cp.md §2.1), its indexer cache every context position (replicated, num_blocks * Wp blocks).
For every rank and step it checks:
  * each real row's output against the float64 reference of the whole batch and the single-rank SFA backend's
    output of the same token (gathered over the ranks by local_token_index, every token covered); pad rows 0;
  * the rank's own top-k rows against the single-rank selection (fp32) and the float64 one;
  * its caches after the step: its latent shard (the step's new rows it owns, nothing else) and the whole
    replicated indexer cache;
  * the collectives of a layer's step with a prefill: two all-gathers (rows, top-k) and one all-to-all (the
    merge); of a decode-only step (§11.2): one all-gather (the attention wire).
Refusals: builder and layer, by name, before any write and any collective.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import pcp_dcp_groups as _groups, run_ranks
from _cp_harness import cp_tol as _tol
from _mla_reference import MlaDims, make_weights
from _sfa_cp_steps import STEPS, build_args, caches, hidden as _hidden, make_builder, make_impl, make_step, qsl
from _sfa_cp_steps import reference, replicated_slot, single_rank

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sfa = aar.sfa

# Requests shorter than the group, fresh prefills whose lengths force pads (and chunks made of pads only),
# chunked prefill over cached context, a decode/prefill mix, a decode-only step.
_STEPS = {
    "decode": STEPS["decode"],
    "fresh_prefill": STEPS["fresh_prefill"],
    "chunked_prefill": STEPS["chunked_prefill"],
    "mixed": STEPS["mixed"],
    "tiny": dict(seq_lens=[1, 3, 2], q_lens=[1, 3, 2]),
    "spec_decode": STEPS["spec_decode"],
    # speculative decodes (3 tokens, replicated) before a prefill (split)
    "spec_mixed": dict(seq_lens=[9, 30, 17], q_lens=[3, 3, 11], spec=2),
    # a draft build (build_for_drafting, draft lane 1 of 2): one-token decodes of the drafter's batch,
    # one shorter than the group
    "draft_decode": dict(seq_lens=[10, 31, 18, 1], q_lens=[1, 1, 1, 1], spec=2),
}
# The steps built by a draft lane (name -> draft index).
_DRAFT = {"draft_decode": 1}
# A second layer without an indexer reads the first one's gathered selection (use_index_cache).
_REUSE = ("mixed", "decode")
# The decode-only steps (docs/design/sparse_cp.md §11.2: no gather of rows or top-k, one wire all-gather).
# (draft_decode is not: its fresh one-token request is a prefill under PCP's split.)
_DECODE_ONLY = ("decode", "spec_decode", "decode_after_prefill")
# Decode after prefill: the prefill writes every cache row the decode then reads (same builder and layer).
_TWO_PHASE = dict(seq_lens=[7, 14, 3], q_lens=[1, 1, 1])


def _builder(st, W, rank, wd=1, rd=0, **kw):
    if wd > 1:
        kw.update(dcp_world_size=wd, dcp_rank=rd)
    return make_builder(st, pcp_world_size=W, pcp_rank=rank, cp_kv_cache_interleave_size=st["I"], **kw)


def _calls(comm):
    return (comm.calls_of("all_gather"), comm.calls_of("all_to_all_single"), comm.calls_of("all_reduce"))


def _local_hidden(global_hidden, lti):
    """The rank's rows: its tokens, garbage on pad rows (their output must not depend on it)."""
    h = global_hidden[lti.clamp(min=0).long()].clone()
    pads = lti < 0
    if pads.any():
        g = torch.Generator().manual_seed(int(pads.sum()))
        h[pads] = torch.randn(int(pads.sum()), h.shape[1], generator=g).to(h.dtype)
    return h


def _forward(comm, impl, builder, args, global_hidden, kv, tb=None, dcp=None, draft=None):
    if draft is None:
        md = builder.build(*args)
        lti = builder.local_token_index
        assert md.pcp_local_token_index_list == lti.tolist()
    else:
        md = builder.build_for_drafting(*args, draft_index=draft)
        assert md.draft_index == draft
        lti = torch.tensor(md.pcp_local_token_index_list, dtype=torch.int32)
    h = _local_hidden(global_hidden, lti)
    out = torch.full_like(h, 7.0)
    comm.reset_counters()
    if dcp is not None:
        dcp.reset_counters()
    impl.forward(h, kv, md, out, tb)
    tl = md.num_local_tokens
    rank = md.pcp_rank
    # A step with a prefill keeps every rank's gathered rows (rank-major), a decode-only step its own rows
    # (docs/design/sparse_cp.md §11.2).
    lt = impl.last_topk if md.num_prefills == 0 else impl.last_topk[rank * tl:(rank + 1) * tl]
    assert lt.shape[0] == tl, (lt.shape, tl)
    topk = lt[:, 0].to(torch.int64)
    return out, lti, topk, _calls(comm), md, h


def _run_step(comm, rank, W, I, dtype, name, dcp=None):
    """One step on PCP rank `rank` of W (with dcp: DCP rank dcp.rank of dcp.size, KV rank rank * size + that)."""
    wd, rd = (dcp.size, dcp.rank) if dcp is not None else (1, 0)
    kv_rank = rank * wd + rd
    layer = dict(pcp_comm=comm, dcp_comm=dcp)
    if name == "decode_after_prefill":
        st = make_step(W * wd, I=I, dtype=dtype, **_TWO_PHASE)
        nope, rope, idx_k = caches(st, kv_rank, upto_context=True, fresh=True)
        builder, impl = _builder(st, W, rank, wd, rd), make_impl(st, **layer)
        prompt = [s - q for s, q in zip(st["seq_lens"], st["q_lens"])]
        h_prompt = torch.cat([st["xs"][r][:prompt[r]] for r in range(st["B"])])
        args = (qsl(prompt), torch.tensor(prompt, dtype=torch.int32), st["table"])
        _forward(comm, impl, builder, args, h_prompt, [nope, rope, idx_k], dcp=dcp)
        out, lti, topk, calls, md, _ = _forward(comm, impl, builder, build_args(st), _hidden(st), [nope, rope, idx_k],
                                                dcp=dcp)
    else:
        st = make_step(W * wd, I=I, dtype=dtype, **_STEPS[name])
        nope, rope, idx_k = caches(st, kv_rank, upto_context=True)
        reuse = name in _REUSE
        builder, impl = _builder(st, W, rank, wd, rd), make_impl(st, use_index_cache=reuse, **layer)
        tb = sfa.TopkBuffer(256, st["idx"].K) if reuse else None
        out, lti, topk, calls, md, h = _forward(comm, impl, builder, build_args(st), _hidden(st),
                                                [nope, rope, idx_k], tb, dcp=dcp, draft=_DRAFT.get(name))
    facts = {}
    dcp_calls = _calls(dcp) if dcp is not None else None
    if name in _REUSE:
        # A layer without an indexer (same weights): every gathered row's selection from the buffer, one
        # all-gather fewer, the same output.
        nope2, rope2, _ = caches(st, kv_rank, upto_context=True)
        reader = make_impl(st, indexer=False, **layer)
        out2 = torch.full_like(h, 7.0)
        comm.reset_counters()
        reader.forward(h, [nope2, rope2], md, out2, tb)
        facts = dict(reuse_calls=_calls(comm), reuse_source=reader.last_topk_source,
                     reuse_topk=torch.equal(reader.last_topk, impl.last_topk), reuse_out=torch.equal(out2, out),
                     reuse_caches=torch.equal(nope2, nope) and torch.equal(rope2, rope))
    return dict(out=out.double().numpy(), lti=lti.numpy(), topk=topk.numpy(), calls=calls,
                decode_only=md.num_prefills == 0,
                caches=[t.double().numpy() for t in (nope, rope, idx_k)], seq_local=md.dcp_seq_lens_list,
                world=(md.pcp_world_size, md.pcp_rank, md.dcp_world_size, md.dcp_rank), facts=facts,
                dcp_calls=dcp_calls)


def _spec(name):
    return _TWO_PHASE if name == "decode_after_prefill" else _STEPS[name]


def _check(W, I, dtype, name, results, wd=1):
    spec = _spec(name)
    st = make_step(W * wd, I=I, dtype=dtype, **spec)
    ref, ref_topk = reference(st)
    one, one_topk = single_rank(dict(I=I, dtype=dtype, **spec))
    tol = _tol(dtype)
    n = ref.shape[0]
    seen = torch.zeros(n, dtype=torch.int64)
    for kv_rank, r in enumerate(results):
        rank = kv_rank // wd
        assert r["world"] == (W, rank, W * wd, kv_rank)
        assert r["decode_only"] == (name in _DECODE_ONLY), (name, r["decode_only"])
        # A step with a prefill: rows and top-k all-gathered, partials all-to-all. Decode-only (§11.2): one
        # all-gather of the attention wire.
        assert r["calls"] == ((1, 0, 0) if r["decode_only"] else (2, 1, 0)), (name, rank, r["calls"])
        if wd > 1:
            assert r["dcp_calls"] == (1, 1, 0), (name, kv_rank, r["dcp_calls"])  # query heads, partials
        out, lti, topk = torch.from_numpy(r["out"]), torch.from_numpy(r["lti"]).long(), torch.from_numpy(r["topk"])
        real = lti >= 0
        idx = lti[real]
        seen.index_add_(0, idx, torch.ones_like(idx))
        torch.testing.assert_close(out[real], ref[idx], **tol, msg=lambda m: f"{name} rank {rank} vs float64: {m}")
        torch.testing.assert_close(out[real], one[idx], **tol,
                                   msg=lambda m: f"{name} rank {rank} vs single rank: {m}")
        assert torch.all(out[~real] == 0), f"{name} rank {rank}: pad rows must be o_proj(0) = 0"
        assert torch.all(topk[~real] == -1), f"{name} rank {rank}: a pad row selects nothing"
        if dtype == torch.float32:
            assert torch.equal(topk[real], one_topk[idx]), (name, rank)
            assert torch.equal(topk[real], ref_topk[idx]), (name, rank)
        f = r["facts"]
        if name in _REUSE:
            want_calls = (1, 0, 0) if r["decode_only"] else (1, 1, 0)
            assert f["reuse_calls"] == want_calls and f["reuse_source"] == "reused", (rank, f)
            assert f["reuse_topk"] and f["reuse_out"] and f["reuse_caches"], (rank, f)
        want = caches(st, kv_rank, upto_context=False)
        for cname, got, w in zip(("latent", "rope", "indexer"), r["caches"], want):
            torch.testing.assert_close(torch.from_numpy(got), w.double(), **tol,
                                       msg=lambda m: f"{name} rank {rank} {cname} cache: {m}")
    # every prefill token on one rank, every decode token on all of them
    assert torch.all(seen >= 1), (name, seen)


def _case(rank, world, I, dtype, names, wd):
    if wd == 1:
        comm, dcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0), None
    else:
        pg, dg = _groups(rank, world // wd, wd)
        comm, dcp = aar.cp.Comm(pg, timeout_s=20.0), aar.cp.Comm(dg, timeout_s=20.0)
    return {n: _run_step(comm, comm.rank, comm.size, I, dtype, n, dcp) for n in names}


def _run(world, I, dtype, names, wd=1):
    res = run_ranks(world, _case, I, dtype, names, wd)
    for n in names:
        _check(world // wd, I, dtype, n, [r[n] for r in res], wd)


_ALL = list(_STEPS) + ["decode_after_prefill"]


@pytest.mark.parametrize("world,I", [(2, 1), (2, 4)])
def test_sfa_pcp_steps_fp32(world, I):
    _run(world, I, torch.float32, _ALL)


@pytest.mark.parametrize("world,I,names", [(3, 1, ["mixed", "tiny"]), (4, 2, ["mixed", "tiny", "decode_after_prefill"])])
def test_sfa_pcp_3_and_4_ranks_fp32(world, I, names):
    _run(world, I, torch.float32, names)


def test_sfa_pcp2_x_dcp2_fp32():
    # KV over the 4 ranks (r = rp * 2 + rd), queries gathered over the heads in each DCP pair
    _run(4, 2, torch.float32, ["mixed", "spec_mixed", "decode_after_prefill"], wd=2)


def test_sfa_pcp_bf16():
    _run(2, 1, torch.bfloat16, ["mixed", "chunked_prefill"])


def _li_c8_caches(st, rank):
    """Garbage main caches and an LI C8 indexer cache (int8 keys, fp16 scales) with nothing written."""
    nope, rope, idx_k = caches(st, rank, upto_context=True, fresh=True)
    g = torch.Generator().manual_seed(200 + rank)
    iq = torch.randint(-100, 100, idx_k.shape, generator=g, dtype=torch.int8)
    sc = torch.rand(idx_k.shape[0], idx_k.shape[1], 1, 1, generator=g).to(torch.float16)
    return [nope, rope, iq, sc]


def _li_c8_phases(st, comm, rank, W):
    """The two phases (prompt prefill, then one decode) with LI C8; W = 1 is the single-rank backend."""
    kv = _li_c8_caches(st, rank)
    prompt = [s - q for s, q in zip(st["seq_lens"], st["q_lens"])]
    h_prompt = torch.cat([st["xs"][r][:prompt[r]] for r in range(st["B"])])
    phases = [((qsl(prompt), torch.tensor(prompt, dtype=torch.int32), st["table"]), h_prompt),
              (build_args(st), _hidden(st))]
    res = []
    if W == 1:
        builder, impl = make_builder(st), make_impl(st, li_c8=True)
        for args, h in phases:
            md = builder.build(*args)
            out = torch.zeros_like(h)
            impl.forward(h, kv, md, out)
            res.append((out.double(), torch.arange(h.shape[0]), impl.last_topk[:, 0].to(torch.int64)))
    else:
        builder, impl = _builder(st, W, rank), make_impl(st, pcp_comm=comm, li_c8=True)
        for args, h in phases:
            out, lti, topk, _, _, _ = _forward(comm, impl, builder, args, h, kv)
            res.append((out.double(), lti.long(), topk))
    return res, kv


def _case_li_c8(rank, world):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = make_step(world, **_TWO_PHASE)
    res, kv = _li_c8_phases(st, comm, rank, world)
    return [tuple(t.numpy() for t in r) for r in res], [t.numpy() for t in kv[2:]]


def test_sfa_pcp_li_c8_equals_the_single_rank_backend():
    """LI C8 under PCP: every rank quantises every gathered key (per token: the single-rank bytes) into its
    replicated indexer cache; prompt prefill then decode, against the single-rank LI C8 layer."""
    W = 2
    one, one_kv = _li_c8_phases(make_step(1, **_TWO_PHASE), None, 0, 1)
    st = make_step(W, **_TWO_PHASE)
    st1 = make_step(1, **_TWO_PHASE)
    bs = st["bs"]
    for rank, (phases, (iq, sc)) in enumerate(run_ranks(W, _case_li_c8)):
        for k, (out, lti, topk) in enumerate(phases):
            out, lti, topk = torch.from_numpy(out), torch.from_numpy(lti), torch.from_numpy(topk)
            ref_out, _, ref_topk = one[k]
            real = lti >= 0
            torch.testing.assert_close(out[real], ref_out[lti[real]], **_tol(torch.float32),
                                       msg=lambda m: f"phase {k} rank {rank}: {m}")
            assert torch.equal(topk[real], ref_topk[lti[real]]), (k, rank)
        # the replicated indexer cache holds the single-rank bytes of every position
        iq, sc = torch.from_numpy(iq).view(-1, iq.shape[-1]), torch.from_numpy(sc).view(-1)
        iq1, sc1 = one_kv[2].view(-1, iq.shape[-1]), one_kv[3].view(-1)
        for r, s in enumerate(st["seq_lens"]):
            for p in range(s):
                a = replicated_slot(st["table"], r, p, W, bs)
                b = int(st1["table"][r, p // bs]) * bs + p % bs
                assert torch.equal(iq[a], iq1[b]) and sc[a] == sc1[b], (rank, r, p)


def test_builder_pcp_rows_and_refusals():
    """Single process: the rows of §6.1's example, the DCP part planned over the PCP group, refusals by name."""
    st = make_step(2, seq_lens=[10, 5, 12], q_lens=[1, 5, 8])
    b = _builder(st, 2, 0)
    md = b.build(*build_args(st))
    assert b.local_token_index.tolist() == [0, 1, 2, -1, -1, 6, 7, 12, 13]
    assert md.num_local_tokens == 9 and (md.pcp_world_size, md.pcp_rank) == (2, 0)
    assert (md.dcp_world_size, md.dcp_rank) == (2, 0)  # the main cache's shard is over the PCP group
    assert md.pcp_indexer_cum_query_lens_list == [1, 3, 5, 7, 9]
    assert md.pcp_indexer_seq_lens_list == [10, 2, 0, 6, 12]
    assert md.seq_lens_list == [10, 5, 12]  # the global step
    with pytest.raises(NotImplementedError, match="num_input_tokens=16 with pcp_world_size=2"):
        b.build(*build_args(st), num_input_tokens=16)
    assert md.is_current  # the refused build wrote nothing
    with pytest.raises(NotImplementedError, match="SFA PCP captures decode-only buckets only; this step has 2 prefills"):
        b.build_for_graph_capture(*build_args(st))
    assert md.is_current
    with pytest.raises(ValueError, match="pcp_world_size \\* dcp_world_size = 32 exceeds 16"):
        _builder(st, 2, 0, dcp_world_size=16)
    refusals = [(dict(dsa_cp_world_size=2), "SFA PCP x DSA-CP"),
                (dict(offload=sfa.BuilderOffloadConfig()), "pcp_world_size=2 with offload")]
    for kw, msg in refusals:
        with pytest.raises(NotImplementedError, match=msg):
            _builder(st, 2, 0, **kw)
    with pytest.raises(ValueError, match="pcp_rank=2 is not a rank of a PCP group of pcp_world_size=2"):
        _builder(st, 2, 2)


def test_builder_pcp_graph_bucket_rows():
    """graph_decode_padding (docs/design/sparse_cp.md §11.1): a decode-only step padded to its bucket gives every
    rank the bucket's rows (the dummies' after the real decodes: no global token, an indexer request with KV
    length 0); a padded step with prefills is refused before any write."""
    st = make_step(2, seq_lens=[10, 5, 12], q_lens=[1, 1, 1])
    for rank in range(2):
        b = _builder(st, 2, rank, graph_decode_padding=True)
        md = b.build(*build_args(st), num_input_tokens=5)
        assert md.num_local_tokens == 5 and md.num_kernel_reqs == 5 and md.num_reqs == 3
        assert b.local_token_index.tolist() == [0, 1, 2, -1, -1]
        assert md.pcp_indexer_cum_query_lens_list == [1, 2, 3, 4, 5]
        assert md.pcp_indexer_seq_lens_list == [10, 5, 12, 0, 0]
        assert md.slot_mapping[3:].tolist() == [-1, -1] and md.indexer_slot_mapping[3:].tolist() == [-1, -1]
        slots = md.slot_mapping.clone()
        mixed = make_step(2, seq_lens=[10, 5, 12], q_lens=[1, 5, 8])
        with pytest.raises(ValueError, match="only a decode-only step is padded to a graph bucket here \\(this one "
                                             "has 2 prefills"):
            b.build(*build_args(mixed), num_input_tokens=16)
        assert md.is_current and torch.equal(md.slot_mapping, slots)
        # unpadded, the same builder keeps the eager split of a step with prefills
        assert b.build(*build_args(mixed)).num_local_tokens == 9
        # the device path's copies give the padded bucket's metadata too
        a = b.build(*build_args(st), num_input_tokens=5)
        c = _builder(st, 2, rank, graph_decode_padding=True, separate_device_buffers=True).build(
            *build_args(st), num_input_tokens=5)
        assert a.pcp_local_token_index_list == c.pcp_local_token_index_list
        assert a.pcp_indexer_seq_lens_list == c.pcp_indexer_seq_lens_list
        assert torch.equal(a.pcp_cos, c.pcp_cos) and torch.equal(a.indexer_slot_mapping, c.indexer_slot_mapping)


def test_builder_pcp_decode_rows_over_steps():
    """A decode-only step's PCP lists are not planned (docs/design/sparse_cp.md §11.2): its rows are the step's
    kernel tokens (-1 for a bucket's dummies) and the indexer's lists the kernel lists; the row lists are kept as
    the identity across steps. One builder through steps that grow, shrink, pad and plan again (a step with a
    prefill, a decode step with a zero-token request) gives every step the lists of a fresh builder and of their
    definition."""
    st = make_step(2, seq_lens=[10, 5, 12, 9, 7], q_lens=[1, 1, 1, 1, 1])
    full_q = qsl([1, 1, 1, 1, 1])

    def args(q_lens, seq_lens):
        return qsl(q_lens), torch.tensor(seq_lens, dtype=torch.int32), st["table"][: len(seq_lens)]

    steps = [([1, 5, 8], [10, 5, 12], 0), ([1, 1, 1], [10, 5, 12], 0), ([1, 1, 1, 1, 1], [10, 5, 12, 9, 7], 0),
             ([1, 1], [10, 5], 4), ([1, 1, 1], [10, 5, 12], 0), ([1, 0, 1], [10, 5, 12], 0), ([1, 1], [10, 5], 0),
             ([1, 1, 1, 1], [10, 5, 12, 9], 5), ([1, 1, 1, 1, 1], [10, 5, 12, 9, 7], 0)]
    assert full_q.tolist() == [0, 1, 2, 3, 4, 5]
    for rank in range(2):
        b = _builder(st, 2, rank, graph_decode_padding=True)
        for q_lens, seq_lens, t_in in steps:
            md = b.build(*args(q_lens, seq_lens), num_input_tokens=t_in)
            lists = (b.local_token_index.tolist(), md.pcp_local_token_index_list, md.pcp_indexer_cum_query_lens_list,
                     md.pcp_indexer_seq_lens_list, md.num_local_tokens)
            fresh = _builder(st, 2, rank, graph_decode_padding=True)
            f = fresh.build(*args(q_lens, seq_lens), num_input_tokens=t_in)
            assert lists == (fresh.local_token_index.tolist(), f.pcp_local_token_index_list,
                             f.pcp_indexer_cum_query_lens_list, f.pcp_indexer_seq_lens_list, f.num_local_tokens)
            real = sum(q_lens)
            if max(q_lens) == 1 and 0 not in q_lens:  # decode-only, every request with a token
                rows = list(range(real)) + [-1] * (max(t_in, real) - real)
                assert lists[0] == rows and lists[1] == rows and lists[4] == len(rows)
                assert lists[2] == md.cum_query_lens_list and lists[3] == md.seq_lens_list
                assert torch.equal(md.pcp_cos, md.cos)
            elif 0 in q_lens:  # the empty request has no indexer request
                assert lists[0] == [0, 1] and lists[2] == [1, 2] and lists[3] == [10, 12]


def test_builder_pcp_separate_device_buffers_match():
    """The device path's copies (separate_device_buffers, here on the CPU) give the metadata of the in-place path."""
    st = make_step(2, I=2, **STEPS["mixed"])
    for rank in range(2):
        a = _builder(st, 2, rank).build(*build_args(st))
        b = _builder(st, 2, rank, separate_device_buffers=True).build(*build_args(st))
        assert a.num_local_tokens == b.num_local_tokens
        assert a.pcp_local_token_index_list == b.pcp_local_token_index_list
        assert a.pcp_indexer_cum_query_lens_list == b.pcp_indexer_cum_query_lens_list
        assert torch.equal(a.pcp_cos, b.pcp_cos) and torch.equal(a.slot_mapping, b.slot_mapping)
        assert torch.equal(a.indexer_slot_mapping, b.indexer_slot_mapping)


def test_resolve_cp_mode_names_pcp():
    assert sfa.resolve_cp_mode(False, 1, 2) == sfa.CpMode.pcp
    assert sfa.resolve_cp_mode(False, 1) == sfa.CpMode.plain  # the two-argument call
    assert sfa.resolve_cp_mode(False, 2, 2) == sfa.CpMode.pcp_dcp
    with pytest.raises(NotImplementedError, match="pcp_size=4 with dsa_cp=True: SFA PCP x DSA-CP"):
        sfa.resolve_cp_mode(True, 1, 4)
    with pytest.raises(ValueError, match="pcp_size must be >= 1, got 0"):
        sfa.resolve_cp_mode(False, 1, 0)


def _case_bad_input(rank, world):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = make_step(world, **_STEPS["mixed"])
    nope, rope, idx_k = caches(st, rank, upto_context=True)
    before = [t.clone() for t in (nope, rope, idx_k)]
    b = _builder(st, world, rank)
    md = b.build(*build_args(st))
    h = _local_hidden(_hidden(st), b.local_token_index)
    out = torch.zeros_like(h)
    impl = make_impl(st, pcp_comm=comm)
    errors = []

    def expect(exc, fn):
        try:
            fn()
            errors.append(None)
        except exc as e:
            errors.append(str(e))

    kv = [nope, rope, idx_k]
    # the global rows instead of this rank's
    expect(ValueError, lambda: impl.forward(_hidden(st), kv, md, torch.zeros_like(_hidden(st))))
    # metadata of another rank
    other = _builder(st, world, (rank + 1) % world).build(*build_args(st))
    expect(ValueError, lambda: impl.forward(h, kv, other, out))
    # PCP metadata, a layer without pcp_comm
    expect(ValueError, lambda: make_impl(st).forward(h, kv, md, out))
    # the replicated indexer cache too small
    expect(ValueError, lambda: impl.forward(h, [nope, rope, idx_k[: st["nb"]]], md, out))
    # inside a graph capture
    g = aar.GraphParams("recording")

    def capture():
        with g.capture(h.shape[0]):
            impl.forward(h, kv, md, out)
    expect(NotImplementedError, capture)
    # construction: PCP x DSA-CP, SFA C8
    # a DCP comm the metadata was not built for
    expect(ValueError, lambda: make_impl(st, pcp_comm=comm, dcp_comm=comm).forward(h, kv, md, out))
    expect(NotImplementedError, lambda: make_impl(st, pcp_comm=comm, dsa_cp_comm=comm))
    d8 = MlaDims(H=2, L=512, R=64)
    w8 = make_weights(d8, torch.bfloat16, torch.Generator().manual_seed(3))
    expect(NotImplementedError, lambda: sfa.Impl(
        num_heads=d8.H, hidden_size=d8.hidden, q_lora_rank=d8.Q, kv_lora_rank=d8.L, qk_nope_head_dim=d8.P,
        qk_rope_head_dim=d8.R, v_head_dim=d8.V, sfa_c8=True, pcp_comm=comm, **w8))
    untouched = all(torch.equal(a, c) for a, c in zip(before, (nope, rope, idx_k)))
    # an empty step: no rows, no collective
    empty = b.build(torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), st["table"][:0])
    e = torch.zeros(0, h.shape[1], dtype=h.dtype)
    impl.forward(e, kv, empty, e.clone())
    errors.append("empty" if empty.num_local_tokens == 0 else None)
    return errors, untouched, comm.calls


def test_sfa_pcp_bad_input_is_refused_by_name_before_any_write():
    for rank, (errors, untouched, calls) in enumerate(run_ranks(2, _case_bad_input)):
        assert None not in errors, errors
        assert "this PCP rank's rows are num_local_tokens=" in errors[0]
        assert f"metadata was built for PCP rank {(rank + 1) % 2} of 2" in errors[1]
        assert "but the layer has no pcp_comm" in errors[2]
        assert "blocks, fewer than the metadata's" in errors[3]
        assert "SFA PCP capture of a step with prefills is not supported" in errors[4], errors[4]
        assert "dcp_comm has 2 ranks but the metadata was built without DCP" in errors[5]
        assert "SFA PCP x DSA-CP" in errors[6]
        assert "sfa_c8 with PCP" in errors[7]
        assert errors[8] == "empty"
        assert untouched, f"rank {rank}: a refused forward wrote a cache"
        assert calls == 0, "a refused forward issued a collective"
