"""SFA DSA-CP x DCP (docs/design/sparse_cp.md §9) over real gloo process groups of 2 and 4 local processes.

The step's tokens are sharded over the group (DSA-CP, §4) and the main KV cache over the same group (DCP, the
indexer cache replicated, §2). Every rank regenerates the same global step from one seed (_sfa_cp_steps); it holds
every head's q_proj / kv_b_proj and its o_proj shard, a main cache with only the context tokens it owns and an
indexer cache with every context token. It runs the SFA builder with both parts and the layer with both comms and
checks, for the whole batch:
  * its output (the complete output, on every rank) against the float64 reference of _sfa_reference and the
    single-rank SFA backend;
  * the top-k rows of EVERY token (gathered over the group) against the reference and single-rank selection;
  * its caches after the step: its own new latent rows at their DCP-local slots, every new indexer row at its
    replicated slot;
  * the collectives of a step: decode road 2 all-gathers (rows with the query, top-k), 2 all-to-alls (partials,
    head blocks), 1 all-reduce; prefill road (full o_proj) 4 all-gathers and 1 all-to-all; a layer without an
    indexer (reading the TopkBuffer the first layer filled with every token's rows) one all-gather fewer.
Decode buckets are captured and replayed (equal to eager), two Comm objects over one group work like one, and the
refusals come before any write and any collective.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import cp_tol, local_len, run_ranks
from _mla_reference import MlaDims, make_weights
from _sfa_cp_steps import STEPS, build_args, caches, calls, hidden, make_builder, make_impl, make_step, reference
from _sfa_cp_steps import single_rank, weights

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sfa = aar.sfa


def _builder(st, W, rank, **kw):
    return make_builder(st, dsa_cp_world_size=W, dsa_cp_rank=rank, dcp_world_size=W, dcp_rank=rank,
                        cp_kv_cache_interleave_size=st["I"], **kw)


def _run_job(comm, rank, W, job):
    """One step on this rank (job: step name, I, dtype, graph, full_o_proj, reuse, two_comms)."""
    spec = dict(STEPS[job["name"]], I=job["I"], dtype=job["dtype"])
    st = make_step(W, **spec)
    nope, rope, idx_k = caches(st, rank, upto_context=True)
    h = hidden(st)
    n_in = h.shape[0]
    graph, reuse = job["graph"], job["reuse"]
    dcp_comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0) if job["two_comms"] else comm
    builder = _builder(st, W, rank, graph_decode_padding=graph)
    layer = dict(dsa_cp_comm=comm, dcp_comm=dcp_comm, dsa_cp_full_o_proj_prefill=job["full_o_proj"])
    impl = make_impl(st, W, rank, use_index_cache=reuse, **layer)
    tb = sfa.TopkBuffer(64, st["idx"].K) if reuse else None
    out = torch.full_like(h, 7.0)
    facts = {}
    if graph:
        # A decode bucket (SpecDecoding with its draft tokens counted) captured on the recording provider
        # (nothing runs), rebuilt and replayed: the collectives run inside the replayed call.
        S = aar.AttentionState
        state = S.SpecDecoding if st["spec"] else S.DecodeOnly
        extra = dict(num_spec_tokens=torch.full((st["B"],), st["spec"], dtype=torch.int32)) if st["spec"] else {}
        g = aar.GraphParams("recording")
        buf = torch.zeros_like(h)
        md = builder.build_for_graph_capture(*build_args(st), num_input_tokens=n_in, state=state)
        comm.reset_counters()
        with g.capture(n_in):
            impl.forward(buf, [nope, rope, idx_k], md, out, tb)
        assert comm.calls == 0, "the recording capture runs nothing"
        md = builder.build(*build_args(st), num_input_tokens=n_in, **extra)
        assert md.attn_state == state
        buf.copy_(h)
        g.replay(n_in)
        replay_calls = calls(comm)
        # the same step eagerly, on fresh caches: bitwise the replay's output
        eager = torch.full_like(h, 7.0)
        e_caches = list(caches(st, rank, upto_context=True))
        md = builder.build(*build_args(st), num_input_tokens=n_in, **extra)
        impl.forward(h, e_caches, md, eager, tb)
        facts["eager_equal"] = torch.equal(eager, out)
        facts["calls"] = replay_calls
    else:
        md = builder.build(*build_args(st), num_input_tokens=n_in)
        comm.reset_counters()
        dcp_comm.reset_counters()
        impl.forward(h, [nope, rope, idx_k], md, out, tb)
        facts["calls"] = calls(comm)
        facts["dcp_comm_calls"] = dcp_comm.calls if job["two_comms"] else 0
    facts.update(start=md.local_start, end=md.local_end, tpr=md.tokens_per_rank, pad=md.num_tokens_pad,
                 state=str(md.attn_state), local=md.dcp_seq_lens_list, dcp=(md.dcp_world_size, md.dcp_rank),
                 shard=torch.equal(impl.o_proj_weight, weights(st, W, rank)["o_proj"]))
    topk = impl.last_topk[:, 0].to(torch.int64)
    if reuse:
        # A layer without an indexer: every token's rows from the buffer, no gather of its own.
        nope2, rope2, _ = caches(st, rank, upto_context=True)
        reader = make_impl(st, W, rank, indexer=False, **layer)
        out2 = torch.full_like(h, 7.0)
        comm.reset_counters()
        reader.forward(h, [nope2, rope2], md, out2, tb)
        facts.update(reuse_calls=calls(comm), reuse_source=reader.last_topk_source,
                     reuse_topk=torch.equal(reader.last_topk, impl.last_topk), reuse_out=out2.double().numpy())
    return (out.double().numpy(), topk.numpy(), nope.double().numpy(), rope.double().numpy(),
            idx_k.double().numpy(), facts)


def _case_jobs(rank, world, jobs, mismatch):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    res = [_run_job(comm, rank, world, job) for job in jobs]
    refused = None
    if mismatch:
        # A DCP group that is not the DSA-CP group (2 of the 4 ranks): refused at construction, by name.
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        half = aar.cp.Comm(groups[rank // 2], timeout_s=20.0)
        st = make_step(world, I=1, **STEPS["decode"])
        try:
            make_impl(st, world, rank, dsa_cp_comm=comm, dcp_comm=half)
        except NotImplementedError as e:
            refused = str(e)
    return res, refused


def _job(name, I, dtype=torch.float32, graph=False, full_o_proj=True, reuse=False, two_comms=False):
    return dict(name=name, I=I, dtype=dtype, graph=graph, full_o_proj=full_o_proj, reuse=reuse,
                two_comms=two_comms)


def _check(W, job, results):
    spec = dict(STEPS[job["name"]], I=job["I"], dtype=job["dtype"])
    st = make_step(W, **spec)
    ref, ref_topk = reference(st)
    one, one_topk = single_rank(spec)
    fp32 = st["dtype"] == torch.float32
    tol = cp_tol(st["dtype"])
    tight = dict(atol=1e-5, rtol=1e-5) if fp32 else dict(atol=1e-2, rtol=1e-2)
    n = ref.shape[0]
    decode = None
    for rank, (out, topk, nope, rope, idx_k, facts) in enumerate(results):
        what = f"rank {rank} {job}"
        out = torch.from_numpy(out)
        torch.testing.assert_close(out[:n], ref, **tol, msg=lambda m: f"{what} output vs float64: {m}")
        torch.testing.assert_close(out[:n], one[:n], **tight, msg=lambda m: f"{what} output vs single rank: {m}")
        if out.shape[0] > n:
            assert torch.all(out[n:] == 0), f"{what}: padding rows must be 0"
        topk = torch.from_numpy(topk)
        if fp32:
            assert torch.equal(topk[:n], ref_topk), (what, topk[:n], ref_topk)
        assert torch.equal(topk[:n], one_topk), (what, topk[:n], one_topk)
        want = caches(st, rank, upto_context=False)
        for name, got, w in zip(("latent", "rope", "indexer"), (nope, rope, idx_k), want):
            torch.testing.assert_close(torch.from_numpy(got), w.double(), **tol, msg=lambda m: f"{what} {name}: {m}")
        decode = facts["state"].rsplit(".", 1)[-1] in ("DecodeOnly", "SpecDecoding")
        want_calls = (2, 2, 1) if decode or not job["full_o_proj"] else (4, 1, 0)
        assert facts["calls"] == want_calls, (what, facts["calls"])
        assert facts.get("dcp_comm_calls", 0) == 0, "every collective goes through dsa_cp_comm"
        if job["graph"]:
            assert facts["eager_equal"], f"{what}: the replay differs from the eager step"
        if job["reuse"]:
            torch.testing.assert_close(torch.from_numpy(facts["reuse_out"])[:n], ref, **tol,
                                       msg=lambda m: f"{what} layer without an indexer: {m}")
            assert facts["reuse_source"] == "reused" and facts["reuse_topk"], what
            assert facts["reuse_calls"] == (want_calls[0] - 1,) + want_calls[1:], (what, facts["reuse_calls"])
        assert facts["shard"], f"{what}: the layer's o_proj is not its shard after the step"
        assert facts["dcp"] == (W, rank)
        assert facts["local"][:st["B"]] == [local_len(s, W, st["I"], rank) for s in st["seq_lens"]]
        assert facts["pad"] == facts["tpr"] * W and facts["start"] == rank * facts["tpr"]
    return "decode" if decode else "prefill"


def _run(world, jobs, mismatch=False):
    res = run_ranks(world, _case_jobs, jobs, mismatch)
    roads = {_check(world, job, [r[0][i] for r in res]) for i, job in enumerate(jobs)}
    return roads, [r[1] for r in res]


@pytest.mark.parametrize("world,I", [(2, 1), (4, 2)])
def test_sfa_dsa_dcp_steps_fp32(world, I):
    jobs = [_job(n, I, reuse=True) for n in STEPS] + [_job("padded_decode", I, graph=True)]
    roads, refused = _run(world, jobs, mismatch=world == 4)
    assert roads == {"decode", "prefill"}
    if world == 4:
        for rank, msg in enumerate(refused):
            assert msg is not None and f"dsa_cp_comm rank {rank} of 4 and dcp_comm rank {rank % 2} of 2" in msg, msg


def test_sfa_dsa_dcp_bf16_decode_road_graph_and_two_comms():
    bf16 = torch.bfloat16
    jobs = [_job(n, 4, dtype=bf16) for n in ("decode", "mixed", "spec_decode")]
    jobs += [_job(n, 2, full_o_proj=False) for n in ("mixed", "chunked_prefill")]
    jobs += [_job(n, 2, graph=True) for n in ("decode", "padded_decode", "single_decode", "spec_decode")]
    jobs += [_job("mixed", 1, two_comms=True), _job("decode", 16, two_comms=True)]
    _run(2, jobs)


def _case_refusals(rank, world):
    """Refusals with the group's comms, each before any write and any collective."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = make_step(world, I=2, **STEPS["mixed"])
    nope, rope, idx_k = caches(st, rank, upto_context=True)
    before = [t.clone() for t in (nope, rope, idx_k)]
    h = hidden(st)
    md = _builder(st, world, rank).build(*build_args(st))
    out = torch.zeros_like(h)
    errors = []

    def refused(exc, fn):
        try:
            fn()
        except exc as e:
            errors.append(str(e))
        else:
            errors.append(None)

    # the metadata has both parts: a layer with one of the two comms
    only_dsa = make_impl(st, world, rank, dsa_cp_comm=comm)
    refused(ValueError, lambda: only_dsa.forward(h, [nope, rope, idx_k], md, out))
    only_dcp = make_impl(st, dcp_comm=comm)
    refused(ValueError, lambda: only_dcp.forward(h, [nope, rope, idx_k], md, out))
    # the indexer cache is replicated: num_blocks * W blocks
    both = make_impl(st, world, rank, dsa_cp_comm=comm, dcp_comm=comm)
    refused(ValueError, lambda: both.forward(h, [nope, rope, idx_k[: st["nb"]]], md, out))
    # SFA C8, LI C8, KV offload
    d8 = MlaDims(H=2, L=512, R=64)  # the packed C8 rows' geometry
    w8 = make_weights(d8, torch.bfloat16, torch.Generator().manual_seed(3))
    w8["o_proj"] = w8["o_proj"][:, : w8["o_proj"].shape[1] // world].contiguous()
    refused(NotImplementedError, lambda: sfa.Impl(
        num_heads=d8.H, hidden_size=d8.hidden, q_lora_rank=d8.Q, kv_lora_rank=d8.L, qk_nope_head_dim=d8.P,
        qk_rope_head_dim=d8.R, v_head_dim=d8.V, sfa_c8=True, dsa_cp_comm=comm, dcp_comm=comm, **w8))
    refused(NotImplementedError, lambda: make_impl(st, world, rank, li_c8=True, dsa_cp_comm=comm, dcp_comm=comm))
    sb = make_step(world, I=2, dtype=torch.bfloat16, **STEPS["decode"])
    d = sb["d"]
    pool = sfa.HostKvPool.create(num_layers=1, budget_bytes=4 * sfa.HostKvPool.block_bytes(1, sb["bs"], d.L, d.R),
                                 block_size=sb["bs"], kv_lora_rank=d.L, qk_rope_head_dim=d.R)
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64)
    refused(NotImplementedError, lambda: make_impl(sb, world, rank, offload=cfg, dsa_cp_comm=comm, dcp_comm=comm))
    untouched = all(torch.equal(a, b) for a, b in zip(before, (nope, rope, idx_k)))
    return errors, untouched, comm.calls


def test_sfa_dsa_dcp_refusals_before_any_write_and_collective():
    for rank, (errors, untouched, n_calls) in enumerate(run_ranks(2, _case_refusals)):
        assert len(errors) == 6 and None not in errors, errors
        assert f"metadata was built for DCP rank {rank} of 2 but the layer has no dcp_comm" in errors[0]
        assert f"metadata was built for DSA-CP rank {rank} of 2 but the layer has no dsa_cp_comm" in errors[1]
        assert "blocks, fewer than the metadata's" in errors[2] and "replicated" in errors[2]
        for msg, name in zip(errors[3:], ("sfa_c8", "li_c8", "offload")):
            assert f"{name} with DSA-CP x DCP" in msg, msg
        assert untouched, f"rank {rank}: a rejected forward wrote a cache"
        assert n_calls == 0, "a rejected forward issued a collective"


def test_sfa_dsa_dcp_builder_composes_both_parts_and_refuses_other_groups():
    """Single process: the DSA-CP x DCP build holds the DCP part (local slots and lengths, replicated views) and
    the DSA-CP part planned on the global lengths (docs/design/sparse_cp.md §4's formulas written here); groups of
    other sizes or ranks are refused by name."""
    W, I = 2, 2
    st = make_step(W, I=I, **STEPS["mixed"])
    seq, q = st["seq_lens"], st["q_lens"]
    qsl = [0]
    for n in q:
        qsl.append(qsl[-1] + n)
    T = qsl[-1]
    tpr = -(-T // W)
    for rank in range(W):
        md = _builder(st, W, rank).build(*build_args(st))
        dcp_only = make_builder(st, dcp_world_size=W, dcp_rank=rank, cp_kv_cache_interleave_size=I)
        ref = dcp_only.build(*build_args(st))
        assert md.slot_mapping.tolist() == ref.slot_mapping.tolist()
        assert md.indexer_slot_mapping.tolist() == ref.indexer_slot_mapping.tolist()
        assert torch.equal(md.indexer_block_table, ref.indexer_block_table)
        assert md.dcp_seq_lens_list == [local_len(s, W, I, rank) for s in seq]
        assert md.seq_lens_list == seq  # the global lengths
        start, end = rank * tpr, min((rank + 1) * tpr, T)
        assert (md.tokens_per_rank, md.local_start, md.local_end) == (tpr, start, max(start, end))
        cum, kv = [], []
        for b in range(len(seq)):
            le = max(qsl[b], min(qsl[b + 1], end))
            n = max(0, le - max(qsl[b], start))
            cum.append((cum[-1] if cum else 0) + n)
            kv.append(max(seq[b] - (qsl[b + 1] - le), 0) if n > 0 else 0)
        assert md.local_cum_query_lens_list == cum and md.local_seq_lens_list == kv, (rank, cum, kv)
    for kw, text in ((dict(dsa_cp_world_size=2, dsa_cp_rank=0, dcp_world_size=4, dcp_rank=0), "dcp_world_size=4"),
                     (dict(dsa_cp_world_size=2, dsa_cp_rank=1, dcp_world_size=2, dcp_rank=0), "dsa_cp_rank=1")):
        with pytest.raises(NotImplementedError, match=text + ".*the DCP group to be the DSA-CP group"):
            make_builder(st, **kw)
    assert sfa.resolve_cp_mode(True, 2) == sfa.CpMode.dsa_cp_dcp
