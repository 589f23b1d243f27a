"""SFA DSA-CP token sharding (docs/design/sparse_cp.md §4, §7) over real gloo process groups of 2 and 4 local
processes.

Every rank regenerates the same global step from one seed and holds the whole model except o_proj, of which it
holds its row-parallel shard (columns [r C, (r+1) C) of the full (hidden, N V)). Its caches are complete (every
context token's latent, rope and indexer rows: DSA-CP keeps whole caches on every rank). It runs the SFA builder
with its place in the group and the layer with the group's cp.Comm, and checks, for the whole batch:
  * its output (the complete output, on every rank) against the float64 reference of _sfa_reference;
  * the top-k rows of its token shard against the reference selection (ties to the lower position);
  * its caches after the step: every new token's rows written (not only its shard's);
  * the collectives: decode steps all-gather the KV rows, all-to-all the head blocks and all-reduce the o_proj
    partials; prefill steps (full-weight o_proj) all-gather the KV rows, the o_proj shards and the outputs.
Token counts not divisible by the group, ranks whose shard is empty or only padding, graph padding and graph replay
are among the cases. A fault injected at every operator call of a prefill step (both ranks alike) leaves the
layer's o_proj the shard and the full-weight pool intact, and the next step is exact.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import cp_tol as _tol, run_ranks
from _sfa_cp_steps import build_args, caches, calls as _calls, hidden as _hidden, make_builder, make_impl
from _sfa_cp_steps import STEPS, make_step as _make_step, reference as _reference, weights

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sfa = aar.sfa
T_ = aar._C._testing


def _caches(st, upto_context, rank=0):
    # W = 1 in the step: complete caches (DSA-CP keeps them whole on every rank).
    return caches(st, rank, upto_context)


def _shard(st, W, rank):
    """The weights of rank `rank`: everything whole but o_proj's columns of this rank's heads."""
    return weights(st, W, rank)


def _impl(st, comm, W, rank, **kw):
    return make_impl(st, W, rank, dsa_cp_comm=comm, **kw)


def _builder(st, W, rank, **kw):
    return make_builder(st, dsa_cp_world_size=W, dsa_cp_rank=rank, **kw)


def _run_step(comm, rank, W, graph=False, full_o_proj=True, **spec):
    st = _make_step(**spec)
    nope, rope, idx_k = _caches(st, upto_context=True)
    hidden = _hidden(st)
    n_in = hidden.shape[0]
    builder = _builder(st, W, rank, graph_decode_padding=graph)
    impl = _impl(st, comm, W, rank, dsa_cp_full_o_proj_prefill=full_o_proj)
    args = build_args(st)
    out = torch.full_like(hidden, 7.0)
    if graph:
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
    facts = dict(calls=_calls(comm), start=md.local_start, end=md.local_end, tpr=md.tokens_per_rank,
                 pad=md.num_tokens_pad, state=str(md.attn_state), shard=torch.equal(impl.o_proj_weight,
                                                                                    _shard(st, W, rank)["o_proj"]))
    topk = impl.last_topk[:, 0].to(torch.int64)
    return (out.double().numpy(), topk.numpy(), nope.double().numpy(), rope.double().numpy(),
            idx_k.double().numpy(), facts)


roads = set()


def _check(W, results, spec, full_o_proj=True):
    st = _make_step(**spec)
    ref, ref_topk = _reference(st)
    tol = _tol(st["dtype"])
    n = ref.shape[0]
    want = [w.double() for w in _caches(st, upto_context=False)]
    starts = []
    for rank, (out, topk, nope, rope, idx_k, facts) in enumerate(results):
        out = torch.from_numpy(out)
        torch.testing.assert_close(out[:n], ref, **tol, msg=lambda m: f"rank {rank} output: {m}")
        if out.shape[0] > n:
            assert torch.all(out[n:] == 0), f"rank {rank}: padding rows must be 0"
        lo, hi = facts["start"], min(facts["end"], n)
        if st["dtype"] == torch.float32 and hi > lo:
            assert torch.equal(torch.from_numpy(topk)[: hi - lo], ref_topk[lo:hi]), (rank, topk, ref_topk[lo:hi])
        for name, got, w in zip(("latent", "rope", "indexer"), (nope, rope, idx_k), want):
            torch.testing.assert_close(torch.from_numpy(got), w, **tol, msg=lambda m: f"rank {rank} {name} cache: {m}")
        # decode road: KV gather, head all-to-all, o_proj all-reduce; prefill with the full o_proj: KV gather,
        # the shards' gather and the outputs' gather
        decode = facts["state"].rsplit(".", 1)[-1] in ("DecodeOnly", "SpecDecoding")
        want_calls = (1, 1, 1) if decode or not full_o_proj else (3, 0, 0)
        assert facts["calls"] == want_calls, (rank, spec, facts)
        assert facts["shard"], f"rank {rank}: the layer's o_proj is not its shard after the step"
        assert facts["pad"] == facts["tpr"] * W and facts["start"] == rank * facts["tpr"]
        starts.append((facts["start"], facts["end"]))
    roads.add("decode" if decode else "prefill")
    assert starts[0][0] == 0 and all(starts[i][1] <= starts[i + 1][0] or starts[i + 1][0] == starts[i + 1][1]
                                     for i in range(W - 1))


_STEPS = STEPS


def _case_steps(rank, world, names, dtype, graph, full_o_proj):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    return {n: _run_step(comm, rank, world, graph=graph, full_o_proj=full_o_proj, dtype=dtype, **_STEPS[n])
            for n in names}


def _run(world, names, dtype, graph=False, full_o_proj=True):
    res = run_ranks(world, _case_steps, names, dtype, graph, full_o_proj)
    for n in names:
        _check(world, [r[n] for r in res], dict(dtype=dtype, **_STEPS[n]), full_o_proj)


@pytest.mark.parametrize("world", [2, 4])
def test_sfa_dsa_cp_steps_fp32(world):
    roads.clear()
    _run(world, list(_STEPS), torch.float32)
    assert roads == {"decode", "prefill"}


def test_sfa_dsa_cp_prefills_on_the_decode_road_and_bf16():
    _run(2, ["mixed", "chunked_prefill"], torch.float32, full_o_proj=False)
    _run(2, ["decode", "mixed", "spec_decode"], torch.bfloat16)


def test_sfa_dsa_cp_decode_graph_replays_like_the_reference():
    _run(2, ["decode", "padded_decode", "single_decode"], torch.float32, graph=True)


def _case_faults(rank, world):
    """A fault at every operator call k of a prefill step (both ranks alike, so no rank is left waiting): the
    step raises, the layer's o_proj is its shard, the pool holds the gathered shards (once gathered), and a
    fault-free step afterwards is exact."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    st = _make_step(**_STEPS["mixed"])
    shard = _shard(st, world, rank)["o_proj"]
    full = st["ws"]["o_proj"]
    builder = _builder(st, world, rank)
    impl = _impl(st, comm, world, rank)
    args = build_args(st)
    hidden = _hidden(st)
    out = torch.zeros_like(hidden)
    caches = list(_caches(st, upto_context=True))
    md = builder.build(*args)
    T_.arm_fault(0)
    impl.forward(hidden, caches, md, out)
    n = T_.disarm_fault()
    raised, pool_ok = 0, True
    for k in range(1, n + 1):
        T_.arm_fault(k)
        try:
            impl.forward(hidden, caches, md, out)
        except RuntimeError as e:
            assert "fault injected" in str(e)
            raised += 1
        finally:
            T_.disarm_fault()
        assert torch.equal(impl.o_proj_weight, shard), f"k={k}: o_proj is not the shard after the fault"
        pool_ok &= torch.equal(impl.o_proj_full_pool, full)
    out.fill_(7.0)
    caches = list(_caches(st, upto_context=True))
    impl.forward(hidden, caches, md, out)
    return n, raised, pool_ok, out.double().numpy()


def test_sfa_dsa_cp_fault_inside_the_o_proj_switch_restores_the_shard():
    st = _make_step(**_STEPS["mixed"])
    ref, _ = _reference(st)
    for rank, (n, raised, pool_ok, out) in enumerate(run_ranks(2, _case_faults)):
        assert n > 3 and raised == n, (rank, n, raised)
        assert pool_ok, f"rank {rank}: the full-weight pool changed"
        torch.testing.assert_close(torch.from_numpy(out), ref, **_tol(torch.float32))


def test_sfa_dsa_cp_refusals_by_name():
    st = _make_step(**_STEPS["decode"])
    with pytest.raises(ValueError, match="dsa_cp_rank=2 is not a rank of a DSA-CP group of dsa_cp_world_size=2"):
        _builder(st, 2, 2)
    # with DCP (docs/design/sparse_cp.md §9): the groups' sizes and ranks must agree (test_sfa_dsa_dcp.py)
    with pytest.raises(NotImplementedError, match="dsa_cp_world_size=2, dsa_cp_rank=0 with dcp_world_size=4"):
        _builder(st, 2, 0, dcp_world_size=4)
    with pytest.raises(NotImplementedError, match="dsa_cp_world_size=2 with offload"):
        _builder(st, 2, 0, offload=sfa.BuilderOffloadConfig())
    assert sfa.resolve_cp_mode(True, 1) == sfa.CpMode.dsa_cp
    d = st["d"]
    with pytest.raises(ValueError, match="preprocess.dsa_cp is set but the layer has no dsa_cp_comm"):
        sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                 qk_rope_head_dim=d.R, v_head_dim=d.V, dsa_cp=True, **st["ws"])
    # metadata built for DSA-CP on a layer without it
    md = _builder(st, 2, 0).build(*build_args(st))
    layer = sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                     qk_rope_head_dim=d.R, v_head_dim=d.V, **st["ws"])
    nope, rope, _ = _caches(st, upto_context=True)
    before = (nope.clone(), rope.clone())
    h = _hidden(st)
    with pytest.raises(ValueError, match="metadata was built for DSA-CP rank 0 of 2 but the layer has no "
                                         "dsa_cp_comm"):
        layer.forward(h, [nope, rope], md, torch.zeros_like(h))
    assert torch.equal(before[0], nope) and torch.equal(before[1], rope)
