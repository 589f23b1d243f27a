"""SFA decode context parallel with the replicated indexer (docs/design/sparse_cp.md §2, §3, §5) over real gloo
process groups of 2 and 4 local processes.

Every rank regenerates the same global step from one seed (weights, every request's tokens). Its private main
cache (latent, rope) holds only the context tokens it owns (placement written in _sfa_cp_steps / _cp_harness
from docs/design/cp.md's formulas: owner(x) = (x // I) % W at local index (x // (W I)) I + x % I through the
group's block table); its indexer cache holds EVERY context token (replicated: num_blocks * W blocks, local block b of rank r is block
b * W + r). It runs the SFA builder and layer with the DCP group and compares, for the whole batch:
  * the top-k rows with the single-rank float64 selection of _sfa_reference (ties to the lower position),
  * the output with the float64 reference of the whole sequence (sparse attention over that selection),
  * its caches after the step: its own new latent rows at their local slots, every new indexer row at its
    replicated slot, nothing else touched,
  * the collectives of a layer's step: one query all-gather and one all-to-all.
LI C8 (quantised indexer cache): prompt prefill then the step, against the single-rank LI C8 layer (outputs, top-k
rows, the replicated int8 keys and fp16 scales byte-equal) and the float64 attention over its selection.
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import run_ranks
from _cp_harness import cp_tol as _tol, local_index as _local_index, local_len as _local_len, owner as _owner
from _mla_reference import MlaDims, make_weights
from _sfa_cp_steps import build_args, caches, hidden as _hidden, make_builder, make_impl, make_step as _make_step
from _sfa_cp_steps import STEPS, qsl, reference as _reference, replicated_slot as _replicated_slot
from _sfa_reference import sfa_attend_request

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sfa = aar.sfa


def _caches(st, W, rank, upto_context):
    assert st["W"] == W
    return caches(st, rank, upto_context)


def _impl(st, comm):
    return make_impl(st, dcp_comm=comm)


def _builder(st, W, rank, **kw):
    return make_builder(st, dcp_world_size=W, dcp_rank=rank, cp_kv_cache_interleave_size=st["I"], **kw)


def _run_step(comm, rank, W, graph=False, **spec):
    """One DCP step on this rank: its output, top-k rows, caches after the step and facts."""
    st = _make_step(W, **spec)
    nope, rope, idx_k = _caches(st, W, rank, upto_context=True)
    hidden = _hidden(st)
    n_in = hidden.shape[0]
    builder = _builder(st, W, rank, graph_decode_padding=graph)
    impl = _impl(st, comm)
    args = build_args(st)
    out = torch.full_like(hidden, 7.0)
    if graph:
        # Captured once on the recording provider (nothing runs), rebuilt and replayed: the collectives
        # run inside the replayed call, every rank replaying in the same order.
        g = aar.GraphParams("recording")
        buf = torch.zeros_like(hidden)
        md = builder.build_for_graph_capture(*args, num_input_tokens=n_in)
        comm.reset_counters()
        with g.capture(n_in):
            impl.forward(buf, [nope, rope, idx_k], md, out)
        assert comm.calls == 0, "the recording capture runs nothing"
        md = builder.build(*args, num_input_tokens=n_in)
        buf.copy_(hidden)
        g.replay(n_in)
    else:
        md = builder.build(*args, num_input_tokens=n_in)
        comm.reset_counters()
        impl.forward(hidden, [nope, rope, idx_k], md, out)
    facts = dict(calls=(comm.calls_of("all_gather"), comm.calls_of("all_to_all_single")),
                 local=md.dcp_seq_lens_list, world=md.dcp_world_size, rank=md.dcp_rank)
    topk = impl.last_topk[:, 0].to(torch.int64)
    return (out.double().numpy(), topk.numpy(), nope.double().numpy(), rope.double().numpy(),
            idx_k.double().numpy(), facts)


def _check(W, results, spec):
    st = _make_step(W, **spec)
    ref, ref_topk = _reference(st)
    tol = _tol(st["dtype"])
    n = ref.shape[0]
    for rank, (out, topk, nope, rope, idx_k, facts) in enumerate(results):
        out = torch.from_numpy(out)
        torch.testing.assert_close(out[:n], ref, **tol, msg=lambda m: f"rank {rank} output: {m}")
        if out.shape[0] > n:
            assert torch.all(out[n:] == 0), f"rank {rank}: padding rows must be o_proj(0) = 0"
        got_topk = torch.from_numpy(topk)[:n]
        if st["dtype"] == torch.float32:
            assert torch.equal(got_topk, ref_topk), (rank, got_topk, ref_topk)
        want = _caches(st, W, rank, upto_context=False)
        for name, got, w in zip(("latent", "rope", "indexer"), (nope, rope, idx_k), want):
            torch.testing.assert_close(torch.from_numpy(got), w.double(), **tol,
                                       msg=lambda m: f"rank {rank} {name} cache: {m}")
        assert facts["calls"] == (1, 1), (rank, facts["calls"])
        assert facts["world"] == W and facts["rank"] == rank
        assert facts["local"][:st["B"]] == [_local_len(s, W, st["I"], rank) for s in st["seq_lens"]]
    return [r[-1] for r in results]


_STEPS = {n: STEPS[n] for n in ("decode", "fresh_prefill", "chunked_prefill", "mixed", "spec_decode",
                                 "padded_decode")}


def _case_steps(rank, world, names, I, dtype, graph):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    return {n: _run_step(comm, rank, world, I=I, dtype=dtype, graph=graph, **_STEPS[n]) for n in names}


def _run(world, names, I, dtype, graph=False):
    res = run_ranks(world, _case_steps, names, I, dtype, graph)
    return {n: _check(world, [r[n] for r in res], dict(I=I, dtype=dtype, **_STEPS[n])) for n in names}


@pytest.mark.parametrize("world,I", [(2, 1), (2, 16), (4, 2)])
def test_sfa_dcp_steps_fp32(world, I):
    _run(world, list(_STEPS), I, torch.float32)


def test_sfa_dcp_steps_bf16():
    _run(2, ["decode", "mixed", "spec_decode"], 4, torch.bfloat16)


@pytest.mark.parametrize("world", [2, 4])
def test_sfa_dcp_decode_graph_replays_like_the_reference(world):
    # A decode bucket (padded, token count not divisible by the group) captured and replayed.
    _run(world, ["decode", "padded_decode"], 2, torch.float32, graph=True)


# LI C8 under DCP (docs/design/sfa.md §7, docs/design/sparse_cp.md §5): every rank quantises every step token's
# indexer key into its replicated indexer cache (int8 bytes, fp16 scales at the replicated slots) and runs the
# quantised indexer over the replicated view with the global lengths. Each case is the prompt prefill of every
# request's context (the requests that have one), then the step; (name, I, dtype).
_LI_C8_CASES = [("decode", 1, torch.float32), ("fresh_prefill", 16, torch.float32),
                ("chunked_prefill", 2, torch.float32), ("chunked_prefill", 4, torch.bfloat16)]


def _li_c8_kv(st, rank):
    """Garbage main caches and LI C8 indexer caches (int8 keys, fp16 scales; num_blocks * W blocks), nothing
    written."""
    nope, rope, idx_k = caches(st, rank, upto_context=True, fresh=True)
    g = torch.Generator().manual_seed(200 + rank)
    iq = torch.randint(-100, 100, idx_k.shape, generator=g, dtype=torch.int8)
    sc = torch.rand(idx_k.shape[0], idx_k.shape[1], 1, 1, generator=g).to(torch.float16)
    return [nope, rope, iq, sc]


def _li_c8_phases(st):
    """[(builder args, hidden, [(request, context length, tokens)])]: the prompt prefill, then the step."""
    prompt = [s - q for s, q in zip(st["seq_lens"], st["q_lens"])]
    keep = [r for r in range(st["B"]) if prompt[r] > 0]
    phases = []
    if keep:
        p = [prompt[r] for r in keep]
        args = (qsl(p), torch.tensor(p, dtype=torch.int32), st["table"][keep])
        h = torch.cat([st["xs"][r][:prompt[r]] for r in keep])
        phases.append((args, h, [(r, prompt[r], prompt[r]) for r in keep]))
    reqs = [(r, s, q) for r, (s, q) in enumerate(zip(st["seq_lens"], st["q_lens"]))]
    phases.append((build_args(st), _hidden(st), reqs))
    return phases


def _li_c8_run(st, rank, comm):
    """Both phases on one rank (comm None: the single-rank LI C8 layer): per phase the output, the top-k rows
    and the DCP collectives; then the caches."""
    kv = _li_c8_kv(st, rank)
    if comm is None:
        builder, impl = make_builder(st), make_impl(st, li_c8=True)
    else:
        builder, impl = _builder(st, st["W"], rank), make_impl(st, dcp_comm=comm, li_c8=True)
    res = []
    for args, h, _ in _li_c8_phases(st):
        md = builder.build(*args, num_input_tokens=h.shape[0])
        out = torch.full_like(h, 7.0)
        calls = None
        if comm is not None:
            comm.reset_counters()
        impl.forward(h, kv, md, out)
        if comm is not None:
            calls = (comm.calls_of("all_gather"), comm.calls_of("all_to_all_single"))
        res.append((out.double().numpy(), impl.last_topk[:h.shape[0], 0].to(torch.int64).numpy(), calls))
    return res, [t.numpy() if t.dtype != torch.bfloat16 else t.double().numpy() for t in kv]


def _li_c8_graph(rank, comm):
    """A padded LI C8 decode bucket after its prompt: captured on the recording provider, rebuilt and replayed,
    against the eager forward of the same step on copies of the caches (output and every cache equal)."""
    st = _make_step(comm.size, I=2, **_STEPS["padded_decode"])
    kv = _li_c8_kv(st, rank)
    builder = _builder(st, comm.size, rank, graph_decode_padding=True)
    impl = make_impl(st, dcp_comm=comm, li_c8=True)
    (args, h, _), _ = _li_c8_phases(st)
    impl.forward(h, kv, builder.build(*args), torch.zeros_like(h))
    h, args = _hidden(st), build_args(st)
    n = h.shape[0]
    kv_eager = [t.clone() for t in kv]
    eager = torch.full_like(h, 7.0)
    impl.forward(h, kv_eager, builder.build(*args, num_input_tokens=n), eager)
    g = aar.GraphParams("recording")
    buf, out = torch.zeros_like(h), torch.full_like(h, 7.0)
    md = builder.build_for_graph_capture(*args, num_input_tokens=n)
    comm.reset_counters()
    with g.capture(n):
        impl.forward(buf, kv, md, out)
    recorded = comm.calls
    builder.build(*args, num_input_tokens=n)
    buf.copy_(h)
    g.replay(n)
    return (recorded, torch.equal(out, eager), bool(torch.all(out[sum(st["q_lens"]):] == 0)),
            all(torch.equal(a, b) for a, b in zip(kv, kv_eager)))


def _case_li_c8(rank, world):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    runs = [_li_c8_run(_make_step(world, I=I, dtype=dt, **_STEPS[n]), rank, comm) for n, I, dt in _LI_C8_CASES]
    return runs, _li_c8_graph(rank, comm)


def test_sfa_dcp_li_c8_equals_the_single_rank_backend():
    """LI C8 under DCP 2 against the single-rank LI C8 layer (outputs, top-k rows, the indexer's int8 keys and
    fp16 scales byte-equal at the replicated slots, nothing else written) and against the float64 sparse
    attention over that selection; the main caches hold the rank's own rows. A padded decode bucket captured
    and replayed equals its eager forward."""
    W = 2
    results = run_ranks(W, _case_li_c8)
    for rank, (_, (recorded, same_out, pads_zero, same_caches)) in enumerate(results):
        assert recorded == 0, "the recording capture runs nothing"
        assert same_out and pads_zero and same_caches, (rank, same_out, pads_zero, same_caches)
    results = [r[0] for r in results]
    for c, (name, I, dtype) in enumerate(_LI_C8_CASES):
        spec = dict(I=I, dtype=dtype, **_STEPS[name])
        st, st1 = _make_step(W, **spec), _make_step(1, **spec)
        one, one_kv = _li_c8_run(st1, 0, None)
        phases = _li_c8_phases(st)
        tol = _tol(dtype)
        d, scale = st["d"], 1.0 / math.sqrt(st["d"].P + st["d"].R)
        for rank, (res, kv) in enumerate(r[c] for r in results):
            for k, ((out, topk, calls), (o1, t1, _), (_, _, reqs)) in enumerate(zip(res, one, phases)):
                at = f"{name} {dtype} phase {k} rank {rank}"
                out, topk, o1, t1 = (torch.from_numpy(t) for t in (out, topk, o1, t1))
                assert calls == (1, 1), (at, calls)
                assert torch.equal(topk, t1), at
                torch.testing.assert_close(out, o1, **tol, msg=lambda m: f"{at} vs single rank: {m}")
                # float64 sparse attention over the LI C8 selection
                ref, t0 = [], 0
                for r, s, q in reqs:
                    ref.append(sfa_attend_request(d, st["ws"], st["xs"][r][:s], q, scale, topk[t0:t0 + q]))
                    t0 += q
                torch.testing.assert_close(out, torch.cat(ref), **tol, msg=lambda m: f"{at} vs float64: {m}")
            nope, rope, iq, sc = (torch.from_numpy(t) for t in kv)
            want = _li_c8_kv(st, rank)
            for cname, got, w in zip(("latent", "rope"), (nope, rope), caches(st, rank, upto_context=False)):
                torch.testing.assert_close(got, w.double() if dtype == torch.bfloat16 else w, **tol,
                                           msg=lambda m: f"{name} rank {rank} {cname} cache: {m}")
            # the replicated indexer cache: the single-rank bytes and scales of every position, the rest untouched
            Di = iq.shape[-1]
            wq, ws_ = want[2].view(-1, Di), want[3].view(-1)
            q1, s1 = torch.from_numpy(one_kv[2]).view(-1, Di), torch.from_numpy(one_kv[3]).view(-1)
            for r, s in enumerate(st["seq_lens"]):
                for p in range(s):
                    a = _replicated_slot(st["table"], r, p, W, st["bs"])
                    b = int(st1["table"][r, p // st["bs"]]) * st["bs"] + p % st["bs"]
                    wq[a], ws_[a] = q1[b], s1[b]
            assert torch.equal(iq.view(-1, Di), wq), f"{name} rank {rank}: indexer int8 keys"
            assert torch.equal(sc.view(-1), ws_), f"{name} rank {rank}: indexer scales"


def _case_bad_input(rank, world):
    """Rejections under DCP, each before anything is written (caches compared with their copies)."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = _make_step(world, I=2, **_STEPS["mixed"])
    nope, rope, idx_k = _caches(st, world, rank, upto_context=True)
    before = [t.clone() for t in (nope, rope, idx_k)]
    hidden = _hidden(st)
    args = build_args(st)
    md = _builder(st, world, rank).build(*args)
    impl = _impl(st, comm)
    out = torch.zeros_like(hidden)
    errors = []
    # the indexer cache is replicated: num_blocks * W blocks
    try:
        impl.forward(hidden, [nope, rope, idx_k[: st["nb"]]], md, out)
    except ValueError as e:
        errors.append(str(e))
    # metadata of another rank
    other = _builder(st, world, (rank + 1) % world).build(*args)
    try:
        impl.forward(hidden, [nope, rope, idx_k], other, out)
    except ValueError as e:
        errors.append(str(e))
    # LI C8: the scale cache is replicated like the keys (num_blocks * W blocks)
    kv8 = _li_c8_kv(st, rank)
    before8 = [t.clone() for t in kv8]
    impl8 = make_impl(st, dcp_comm=comm, li_c8=True)
    try:
        impl8.forward(hidden, kv8[:3] + [kv8[3][: st["nb"]]], md, out)
    except ValueError as e:
        errors.append(str(e))
    untouched8 = all(torch.equal(a, b) for a, b in zip(before8, kv8))
    # SFA C8 with DCP is refused at construction
    d8 = MlaDims(H=2, L=512, R=64)  # the packed C8 rows' geometry
    w8 = make_weights(d8, torch.bfloat16, torch.Generator().manual_seed(3))
    try:
        sfa.Impl(num_heads=d8.H, hidden_size=d8.hidden, q_lora_rank=d8.Q, kv_lora_rank=d8.L, qk_nope_head_dim=d8.P,
                 qk_rope_head_dim=d8.R, v_head_dim=d8.V, sfa_c8=True, dcp_comm=comm, **w8)
    except NotImplementedError as e:
        errors.append(str(e))
    # KV offload with DCP is refused at construction
    sb = _make_step(world, I=2, dtype=torch.bfloat16, **_STEPS["decode"])
    db = sb["d"]
    pool = sfa.HostKvPool.create(num_layers=1, budget_bytes=4 * sfa.HostKvPool.block_bytes(1, sb["bs"], db.L, db.R),
                                 block_size=sb["bs"], kv_lora_rank=db.L, qk_rope_head_dim=db.R)
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64)
    try:
        make_impl(sb, offload=cfg, dcp_comm=comm)
    except ValueError as e:
        errors.append(str(e))
    untouched = untouched8 and all(torch.equal(a, b) for a, b in zip(before, (nope, rope, idx_k)))
    return errors, untouched, comm.calls


def test_sfa_dcp_bad_input_is_rejected_by_name_before_any_write():
    for rank, (errors, untouched, calls) in enumerate(run_ranks(2, _case_bad_input)):
        assert len(errors) == 5, errors
        assert "blocks, fewer than the metadata's" in errors[0] and "replicated" in errors[0]
        assert f"metadata was built for DCP rank {(rank + 1) % 2} of 2" in errors[1]
        assert errors[2].startswith("kv_cache[3] (indexer scale) has") and "replicated" in errors[2], errors[2]
        assert "sfa_c8 with DCP" in errors[3]
        assert errors[4].startswith("offload with DCP (dcp_comm of 2 ranks)"), errors[4]
        assert untouched, f"rank {rank}: a rejected forward wrote a cache"
        assert calls == 0, "a rejected forward issued a collective"


def test_resolve_cp_mode_names_the_four_modes():
    assert sfa.resolve_cp_mode(False, 1) == sfa.CpMode.plain
    assert sfa.resolve_cp_mode(False, 4) == sfa.CpMode.dcp
    assert sfa.resolve_cp_mode(True, 1) == sfa.CpMode.dsa_cp
    assert sfa.resolve_cp_mode(True, 2) == sfa.CpMode.dsa_cp_dcp  # docs/design/sparse_cp.md §9
    with pytest.raises(ValueError, match="dcp_size must be >= 1, got 0"):
        sfa.resolve_cp_mode(False, 0)


def _remap_definition(row, W, rank, I):
    kept = [_local_index(x, W, I) for x in row if x >= 0 and _owner(x, W, I) == rank]
    return kept + [-1] * (len(row) - len(kept))


@pytest.mark.parametrize("W,I", [(2, 1), (2, 2), (3, 4), (4, 16)])
def test_topk_remap_device_and_host_forms_equal_the_definition(W, I):
    g = torch.Generator().manual_seed(W * 100 + I)
    T, K = 9, 12
    rows = []
    for t in range(T):
        S = int(torch.randint(1, 200, (1,), generator=g))
        sel = torch.randperm(S, generator=g)[:K].tolist()
        sel += [-1] * (K - len(sel))
        if t % 3 == 0 and K > 2:
            sel[K // 2] = -1  # an invalid entry in the middle
        rows.append(sel)
    topk = torch.tensor(rows, dtype=torch.int32).view(T, 1, K)
    for rank in range(W):
        want = torch.tensor([_remap_definition(r, W, rank, I) for r in rows], dtype=torch.int32).view(T, 1, K)
        assert torch.equal(sfa.remap_topk_to_dcp_rank(topk, world=W, rank=rank, interleave=I), want)
        assert torch.equal(sfa.remap_sparse_indices(topk, world=W, rank=rank, interleave=I), want)
    assert sfa.remap_topk_to_dcp_rank(topk, world=1, rank=0).data_ptr() == topk.data_ptr()
    with pytest.raises(ValueError, match="dcp rank 2 of world size 2"):
        sfa.remap_topk_to_dcp_rank(topk, world=2, rank=2)
    with pytest.raises(ValueError, match="topk must be an int32 tensor"):
        sfa.remap_topk_to_dcp_rank(topk.long(), world=2, rank=0)


@pytest.mark.parametrize("W,I", [(2, 1), (4, 4)])
def test_builder_dcp_views_follow_the_layout(W, I):
    """Single process: the DCP build's local slots and lengths and the replicated indexer views, from the
    layout's formulas written here; graph padding rows; a rejected build writes nothing."""
    st = _make_step(W, I=I, **_STEPS["mixed"])
    bs, table, seq, q = st["bs"], st["table"], st["seq_lens"], st["q_lens"]
    for rank in range(W):
        md = _builder(st, W, rank).build(qsl(q), torch.tensor(seq, dtype=torch.int32), table)
        assert (md.dcp_world_size, md.dcp_rank, md.dcp_interleave) == (W, rank, I)
        assert md.dcp_seq_lens_list == [_local_len(s, W, I, rank) for s in seq]
        assert md.seq_lens_list == seq  # the indexer's global lengths
        slots, islots = [], []
        for r, (s, n) in enumerate(zip(seq, q)):
            for p in range(s - n, s):
                li = _local_index(p, W, I)
                slots.append(int(table[r, li // bs]) * bs + li % bs if _owner(p, W, I) == rank else -1)
                islots.append(_replicated_slot(table, r, p, W, bs))
        assert md.slot_mapping.tolist() == slots
        assert md.indexer_slot_mapping.tolist() == islots
        rep = md.indexer_block_table
        assert rep.shape == (len(seq), table.shape[1] * W)
        for r, s in enumerate(seq):
            for j in range(rep.shape[1]):
                want = int(table[r, j // W]) * W + j % W if j < math.ceil(s / bs) else 0
                assert int(rep[r, j]) == want, (r, j)
    # graph padding of a decode-only step: dummy rows have local length 0 and zero replicated rows
    b = _builder(st, W, 0, graph_decode_padding=True)
    md = b.build(qsl([1, 1]), torch.tensor([9, 30], dtype=torch.int32), table[:2], num_input_tokens=4)
    assert md.num_kernel_reqs == 4 and md.dcp_seq_lens_list[2:] == [0, 0]
    assert torch.count_nonzero(md.indexer_block_table[2:]) == 0
    assert md.indexer_slot_mapping.tolist()[2:] == [-1, -1]
    # rejected configurations and builds, by name
    with pytest.raises(ValueError, match="dcp_rank=2 is not a rank of a DCP group of dcp_world_size=2"):
        _builder(_make_step(2, I=1, **_STEPS["decode"]), 2, 2)
    with pytest.raises(ValueError, match="cp_kv_cache_interleave_size=3 must be positive and divide block_size=16"):
        _builder(_make_step(2, I=3, **_STEPS["decode"]), 2, 0)
    b = _builder(st, W, 0)
    good = b.build(qsl(q), torch.tensor(seq, dtype=torch.int32), table)
    gen = good.generation
    bad = table.clone()
    bad[0, 0] = st["nb"] + 5
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]=%d" % (st["nb"] + 5)):
        b.build(qsl(q), torch.tensor(seq, dtype=torch.int32), bad)
    assert b.generation == gen and good.is_current
