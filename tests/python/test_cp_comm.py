"""The context-parallel collective interface (cp.Comm, include/ascend_attn_rt/comm/comm.h)
over real gloo process groups of 2 and 4 local processes (docs/design/cp.md §8, §9), and the
LSE-merge operator npu_attention_update (docs/design/cp.md §7) against a float64 log-sum-exp reference.

Each collective is checked against its definition: every rank regenerates every other
rank's input from the shared seed and computes the expected result itself.
"""

import math
import os
import time

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


# ----------------------------------------------------------------------------- helpers (run in the ranks)

def _input(rank, shape, dtype, seed=0):
    """Rank `rank`'s input: integer-valued, so sums are exact in every dtype used here."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def _world_group():
    return dist.group.WORLD


# ----------------------------------------------------------------------------- cases

def _case_collectives(rank, world):
    comm = aar.cp.Comm(_world_group(), timeout_s=10.0)
    return [_collectives(comm, rank, world, dtype) for dtype in (torch.float64, torch.float32, torch.bfloat16)]


def _collectives(comm, rank, world, dtype):
    comm.reset_counters()
    assert (comm.rank, comm.size) == (rank, world)
    shape = (3, 4, 8)
    ins = [_input(r, shape, dtype, seed=1) for r in range(world)]
    mine = ins[rank]
    n = 0
    for dim in (0, 1, 2, -1):
        got = comm.all_gather(mine, dim)
        n += 1
        assert torch.equal(got, torch.cat(ins, dim)), f"all_gather dim={dim}"
        out = torch.full(got.shape, 99, dtype=dtype)
        same = comm.all_gather(mine, dim, out=out)
        n += 1
        assert same.data_ptr() == out.data_ptr() and torch.equal(out, torch.cat(ins, dim))
    # A non-contiguous input (a transposed view) is read through one copy.
    got = comm.all_gather(mine.transpose(0, 2), 1)
    n += 1
    assert torch.equal(got, torch.cat([x.transpose(0, 2) for x in ins], 1))

    # all_to_all_single, equal splits over dim 0: block i of the result is block `rank` of rank i.
    a_shape = (world * 2, 3, 5)
    a_ins = [_input(r, a_shape, dtype, seed=2) for r in range(world)]
    expect = torch.cat([a_ins[i].chunk(world, 0)[rank] for i in range(world)], 0)
    assert torch.equal(comm.all_to_all_single(a_ins[rank]), expect)
    out = torch.zeros(a_shape, dtype=dtype)
    comm.all_to_all_single(a_ins[rank], out=out)
    n += 2
    assert torch.equal(out, expect)
    # The docs/design/cp.md §7.2 wire layout: [Wd*H, D+1, T] fp32 partials, one block of H heads per rank.
    H, D, T = 2, 8, 3
    wire = [_input(r, (world * H, D + 1, T), torch.float32, seed=3) for r in range(world)]
    got = comm.all_to_all_single(wire[rank])
    n += 1
    for i in range(world):
        assert torch.equal(got[i * H:(i + 1) * H], wire[i][rank * H:(rank + 1) * H])

    # reduce_scatter: block `rank` along dim of the sum over ranks.
    r_shape = (world * 2, world * 3, 4)
    r_ins = [_input(r, r_shape, dtype, seed=4) for r in range(world)]
    total = torch.stack([x.double() for x in r_ins]).sum(0)
    for dim in (0, 1, -2):
        got = comm.reduce_scatter(r_ins[rank], dim)
        n += 1
        assert got.dtype == dtype
        assert torch.equal(got.double(), total.chunk(world, dim)[rank]), f"reduce_scatter dim={dim}"
    out = torch.empty(r_shape[0], r_shape[1] // world, r_shape[2], dtype=dtype)
    comm.reduce_scatter(r_ins[rank], 1, out=out)
    n += 1
    assert torch.equal(out.double(), total.chunk(world, 1)[rank])
    assert comm.calls == n
    return n


def _case_async(rank, world):
    comm = aar.cp.Comm(_world_group(), timeout_s=10.0, log=True)
    q = [_input(r, (4, 2, 8), torch.float32, seed=5) for r in range(world)]
    p = [_input(r, (world * 2, 9, 3), torch.float32, seed=6) for r in range(world)]
    s = [_input(r, (2, world * 4), torch.float64, seed=7) for r in range(world)]
    # Upstream overlaps the query gather and the partials' all-to-all: issue all, wait later, out of order.
    w_gather = comm.all_gather(q[rank], 1, async_op=True)
    w_a2a = comm.all_to_all_single(p[rank], async_op=True)
    w_rs = comm.reduce_scatter(s[rank], 1, async_op=True)
    assert isinstance(w_gather, aar.cp.CommWork) and not w_gather.waited
    rs = w_rs.wait()
    a2a = w_a2a.wait()
    gathered = w_gather.wait()
    assert w_gather.waited and w_gather.is_completed()
    assert torch.equal(gathered, torch.cat(q, 1))
    assert torch.equal(a2a, torch.cat([p[i].chunk(world, 0)[rank] for i in range(world)], 0))
    assert torch.equal(rs, torch.stack(s).sum(0).chunk(world, 1)[rank])
    # wait() again returns the same output; .output is it too.
    assert w_gather.wait().data_ptr() == gathered.data_ptr() == w_gather.output.data_ptr()
    # A handle dropped without wait() is waited on by its destructor (the peers still see the op).
    comm.all_gather(q[rank], 0, async_op=True)
    del gathered
    assert comm.calls == 4
    assert [e[5] for e in comm.log] == [True, True, True, True]
    _gil_regression(rank, world)
    return comm.log, _case_log(rank, world)


def _gil_regression(rank, world):
    # Temporaries as inputs, sync and async calls back to back, handles dropped: gloo's worker then
    # frees the last reference of a tensor whose Python object is gone, which takes the GIL, while
    # holding the queue mutex the next launch needs. This deadlocked while the binding launched
    # async collectives with the GIL held.
    comm = aar.cp.Comm(_world_group(), timeout_s=10.0)
    for i in range(40):
        comm.all_to_all_single(torch.full((world * 3, 5), float(i)))
        got = comm.all_to_all_single(torch.full((world * 3, 5), float(i)), async_op=True).wait()
        assert torch.equal(got, torch.full((world * 3, 5), float(i)))
        comm.all_gather(torch.zeros(2, 3), 1, async_op=True)  # dropped: its destructor waits
    assert comm.calls == 120


def _case_log(rank, world):
    comm = aar.cp.Comm(_world_group(), timeout_s=10.0, log=True)
    assert comm.collective_ns == 0
    t0 = time.perf_counter_ns()
    comm.all_gather(torch.zeros(2, 3, 8, dtype=torch.bfloat16), 1)
    if rank != 0:
        time.sleep(0.1)  # rank 0's next call waits for this one
    comm.all_to_all_single(torch.zeros(world * 3, 9, 2))
    comm.all_to_all_single(torch.zeros(world * 3, 9, 2), async_op=True).wait()
    comm.reduce_scatter(torch.zeros(world, 4, dtype=torch.float64), 0)
    wall = time.perf_counter_ns() - t0
    # The synchronous calls' time (docs/design/cp.md §8.1: counted in cheap ticks, converted when read): inside
    # the wall time around them (1 us for the conversion's rounding), and on rank 0 at least most of the 100 ms its
    # all_to_all waits for the sleeping peers: a wrong tick rate fails one bound or the other.
    spent = comm.collective_ns
    assert spent <= wall + 1000, (spent, wall)
    if rank == 0:
        assert spent >= 40_000_000, (spent, wall)
    counts = {op: comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "reduce_scatter")}
    assert counts == {"all_gather": 1, "all_to_all_single": 2, "reduce_scatter": 1}
    assert comm.calls == 4
    log = comm.log
    comm.reset_counters()
    assert comm.calls == 0 and comm.log == [] and comm.collective_ns == 0
    return counts, log


def _case_subgroups(rank, world):
    # docs/design/cp.md §9: every rank creates every group, in the same order (DCP pairs over 4 ranks).
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    other = groups[1 - rank // 2]
    comm = aar.cp.Comm(mine, timeout_s=10.0, log=True)
    assert comm.size == 2 and comm.rank == rank % 2
    assert comm.group_name == mine.group_name
    x = torch.full((2, 8), float(rank))
    got = comm.all_gather(x, 0)
    base = (rank // 2) * 2
    assert torch.equal(got, torch.cat([torch.full((2, 8), float(base)), torch.full((2, 8), float(base + 1))]))
    # The C++ engine's path: the same group by its registered name.
    by_name = aar.cp.Comm.from_group_name(mine.group_name, timeout_s=10.0)
    assert (by_name.rank, by_name.size) == (comm.rank, comm.size)
    assert torch.equal(by_name.all_gather(x, 0), got)
    # A rank outside a group gets a placeholder, not a group: refused by name.
    with pytest.raises(ValueError, match="ProcessGroup"):
        aar.cp.Comm(other)
    with pytest.raises(ValueError, match="ProcessGroup"):
        aar.cp.Comm(object())
    with pytest.raises(ValueError, match="no process group is registered under group_name 'nope'"):
        aar.cp.Comm.from_group_name("nope")
    with pytest.raises(ValueError, match="timeout_s"):
        aar.cp.Comm(mine, timeout_s=0.0)
    return comm.log


def _case_bad_args(rank, world):
    comm = aar.cp.Comm(_world_group(), timeout_s=10.0, log=True)
    t = torch.ones(3, 4)
    out = torch.full((3, 4 * world), 7.0)
    bad = [
        (lambda: comm.all_gather(t, 2), "dim=2 is out of range"),
        (lambda: comm.all_gather(t, -3), "dim=-3 is out of range"),
        (lambda: comm.all_gather(torch.tensor(1.0), 0), "0-d"),
        (lambda: comm.all_gather(t, 1, out=torch.empty(3, 4)), "out must have shape"),
        (lambda: comm.all_gather(t, 1, out=out.double()), "out must have the input's dtype"),
        (lambda: comm.all_gather(t, 0, out=torch.empty(4, 3 * world).t()), "out must be contiguous"),
        (lambda: comm.all_to_all_single(torch.ones(world * 2 + 1, 3)), "must be divisible by the group size"),
        (lambda: comm.all_to_all_single(torch.ones(world, 3), out=torch.ones(world, 4)), "out must have shape"),
        (lambda: comm.reduce_scatter(torch.ones(world, 3), 1), "dim 1 of the input \\(3\\) must be divisible"),
    ]
    if world > 1:
        bad.append((lambda: comm.reduce_scatter(torch.ones(world, 3), 0, out=torch.ones(world, 3)),
                    "out must have shape"))
    for call, msg in bad:
        with pytest.raises(ValueError, match=msg):
            call()
    with pytest.raises(ValueError, match="op must be"):
        comm.calls_of("broadcast")
    # Rejected before anything was sent or written: nothing counted, out untouched.
    assert comm.calls == 0 and comm.log == []
    assert torch.equal(out, torch.full((3, 4 * world), 7.0))
    # The group still works afterwards (no rank issued half a collective).
    assert torch.equal(comm.all_gather(torch.full((1,), float(rank)), 0), torch.arange(world, dtype=torch.float32))
    return comm.calls


def _case_peer_exits(rank, world, timeout_s):
    comm = aar.cp.Comm(_world_group(), timeout_s=timeout_s)
    comm.all_gather(torch.ones(2), 0)   # everyone is connected
    if rank == world - 1:
        os._exit(0)                     # a crashed peer
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"cp::Comm all_gather on group '0' \(rank \d of \d\) failed"):
        comm.all_gather(torch.ones(2), 0)
    return time.monotonic() - t0


def _case_peer_hangs(rank, world, timeout_s):
    comm = aar.cp.Comm(_world_group(), timeout_s=timeout_s)
    comm.all_to_all_single(torch.ones(world))
    if rank == world - 1:
        time.sleep(timeout_s + 3.0)     # a peer that never calls
        return None
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"cp::Comm all_to_all_single on group '0' .* failed"):
        comm.all_to_all_single(torch.ones(world))
    return time.monotonic() - t0


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("world", [2, 4])
def test_collectives_match_their_definitions(world):
    # float64, float32 and bfloat16 in one spawn (process start-up dominates the time).
    counts = run_ranks(world, _case_collectives)
    assert all(c == counts[0] for c in counts)


@pytest.mark.parametrize("world", [2, 4])
def test_async_handles_counter_and_log_equal_across_ranks(world):
    both = run_ranks(world, _case_async)
    logs = [b[0] for b in both]
    assert all(log == logs[0] for log in logs)
    res = [b[1] for b in both]
    counts, log = res[0]
    assert all(r == res[0] for r in res)
    assert log == [
        ("0", "all_gather", [2, 3, 8], "BFloat16", 1, False),
        ("0", "all_to_all_single", [world * 3, 9, 2], "Float", 0, False),
        ("0", "all_to_all_single", [world * 3, 9, 2], "Float", 0, True),
        ("0", "reduce_scatter", [world, 4], "Double", 0, False),
    ]


def test_subgroups_and_group_conversion():
    logs = run_ranks(4, _case_subgroups)
    # Each pair's log names its own group; within a pair the logs are equal.
    assert logs[0] == logs[1] and logs[2] == logs[3]
    assert logs[0][0][0] != logs[2][0][0]


def test_bad_arguments_rejected_before_any_collective():
    assert run_ranks(2, _case_bad_args) == [1, 1]


@pytest.mark.parametrize("world", [4])
def test_peer_exit_is_an_error_not_a_hang(world):
    timeout_s = 5.0
    elapsed = run_ranks(world, _case_peer_exits, timeout_s, deadline_s=40.0, expect_dead=(world - 1,))
    for t in elapsed[:-1]:
        assert t < timeout_s + 2.0


def test_peer_that_never_calls_times_out():
    timeout_s = 1.5
    elapsed = run_ranks(2, _case_peer_hangs, timeout_s, deadline_s=40.0)
    assert timeout_s - 0.2 <= elapsed[0] < timeout_s + 3.0


# ----------------------------------------------------------------------------- npu_attention_update

def _lse_merge_f64(lses, outs):
    """float64 log-sum-exp merge (docs/design/cp.md §7.1) with empty partitions (-inf, +inf or NaN LSE) dropped;
    a row with no partition left gives 0 / -inf."""
    L = torch.stack([x.double() for x in lses])          # (N, M)
    O = torch.stack([x.double() for x in outs])          # (N, M, D)
    empty = ~torch.isfinite(L)
    L = L.masked_fill(empty, float("-inf"))
    m = L.max(0).values
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = safe + torch.log(torch.exp(L - safe).sum(0))   # -inf where every partition is empty
    w = torch.exp(L - lse).masked_fill(empty, 0.0).nan_to_num(0.0)
    out = (w.unsqueeze(-1) * O.masked_fill(empty.unsqueeze(-1), 0.0)).sum(0)
    return out, lse


_MERGE = {
    "twin": lambda lses, outs, t: torch.ops.ascend_cpu.npu_attention_update(lses, outs, t),
    "wrapper": lambda lses, outs, t: aar._C._testing.attention_update(lses, outs, t, "cpu"),
}


@pytest.mark.parametrize("via", list(_MERGE))
def test_attention_update_upstream_example(via):
    # docs/design/cp.md §9: outputs [1,3] and [5,7] with LSE [0, ln 3] merge to [4,6] with LSE ln 4
    # (the op needs D a multiple of 8: the pair is repeated four times).
    outs = [torch.tensor([[1.0, 3.0] * 4]), torch.tensor([[5.0, 7.0] * 4])]
    lses = [torch.tensor([0.0]), torch.tensor([math.log(3.0)])]
    out, lse = _MERGE[via](lses, outs, 1)
    torch.testing.assert_close(out, torch.tensor([[4.0, 6.0] * 4]))
    torch.testing.assert_close(lse, torch.tensor([math.log(4.0)]))


def _attend_f64(q, k, v, scale):
    s = torch.einsum("thd,khd->htk", q, k) * scale
    lse = torch.logsumexp(s, -1)                         # (H, T)
    out = torch.einsum("htk,khd->thd", torch.softmax(s, -1), v)
    return out, lse.transpose(0, 1)                      # (T, H, D), (T, H)


@pytest.mark.parametrize("via", list(_MERGE))
def test_attention_update_three_shards_equal_unsharded_attention(via):
    # docs/design/cp.md §9 (test_attention_cp_precision): Q [5,3,8], K/V [12,3,8] in 3 contiguous shards.
    g = torch.Generator().manual_seed(3)
    T, H, D, S = 5, 3, 8, 12
    q, k, v = (torch.randn(n, H, D, generator=g, dtype=torch.float64) for n in (T, S, S))
    scale = 1 / math.sqrt(D)
    ref, ref_lse = _attend_f64(q, k, v, scale)
    parts = [_attend_f64(q, k[a:b], v[a:b], scale) for a, b in ((0, 4), (4, 9), (9, 12))]
    # The op's layout: rows t*H + h.
    outs = [o.reshape(T * H, D).float() for o, _ in parts]
    lses = [l.reshape(T * H).float() for _, l in parts]
    out, lse = _MERGE[via](lses, outs, 1)
    torch.testing.assert_close(out.double().view(T, H, D), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double().view(T, H), ref_lse, atol=1e-5, rtol=1e-5)
    # The float64 reference merge is exact to 1e-10 (docs/design/cp.md §9's tolerance).
    m64, l64 = _lse_merge_f64([l.reshape(T * H) for _, l in parts], [o.reshape(T * H, D) for o, _ in parts])
    torch.testing.assert_close(m64.view(T, H, D), ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(l64.view(T, H), ref_lse, atol=1e-10, rtol=1e-10)
    # Permutation invariance of the partition order.
    out_p, lse_p = _MERGE[via](lses[::-1], outs[::-1], 1)
    torch.testing.assert_close(out_p, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse_p, lse, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("via", list(_MERGE))
def test_attention_update_empty_partitions_never_nan(via):
    g = torch.Generator().manual_seed(11)
    M, D, N = 10, 16, 5
    lses = [torch.randn(M, generator=g) * 3 for _ in range(N)]
    outs = [torch.randn(M, D, generator=g) for _ in range(N)]
    lses[1][:] = float("-inf")                   # a rank with no local KV
    outs[1][:] = float("nan")                    # whatever it holds must not leak
    lses[2][4] = float("inf")                    # FlashAttention-style empty row: treated as -inf
    outs[2][4] = float("inf")
    lses[3][5] = float("nan")
    outs[3][5] = float("nan")
    for l in lses:
        l[7] = float("-inf")                     # a row empty everywhere
    out, lse = _MERGE[via](lses, outs, 1)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref, ref_lse = _lse_merge_f64(lses, outs)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    assert torch.all(out[7] == 0) and lse[7].item() == float("-inf")
    fin = torch.isfinite(ref_lse)
    assert int(fin.sum()) == M - 1
    torch.testing.assert_close(lse.double()[fin], ref_lse[fin], atol=1e-5, rtol=1e-5)
    # All partitions empty in every row: 0 / -inf.
    out0, lse0 = _MERGE[via]([torch.full((M,), float("-inf"))] * 2, outs[:2], 1)
    assert torch.all(out0 == 0) and torch.all(lse0 == float("-inf"))
    # update_type 0: the merged output only (lse_out empty).
    o0, l0 = _MERGE[via](lses, outs, 0)
    torch.testing.assert_close(o0, out)
    assert l0.numel() == 0 and l0.dtype == torch.float32


@pytest.mark.parametrize("via", list(_MERGE))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_update_half_outputs(via, dtype):
    g = torch.Generator().manual_seed(2)
    M, D, N = 24, 64, 16                         # 16 partitions: the op's maximum
    lses = [torch.randn(M, generator=g) for _ in range(N)]
    outs = [torch.randn(M, D, generator=g).to(dtype) for _ in range(N)]
    out, lse = _MERGE[via](lses, outs, 1)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref, ref_lse = _lse_merge_f64(lses, outs)
    torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


_PROVIDERS = {
    "twin": lambda lses, outs, t: torch.ops.ascend_cpu.npu_attention_update(lses, outs, t),
    "no_compute": lambda lses, outs, t: torch.ops.ascend_noop.npu_attention_update(lses, outs, t),
    "wrapper_cpu": lambda lses, outs, t: aar._C._testing.attention_update(lses, outs, t, "cpu"),
    "wrapper_no_compute": lambda lses, outs, t: aar._C._testing.attention_update(lses, outs, t, "no_compute"),
    # The wrapper refuses before reaching the provider: the NPU path (absent here) refuses the same calls.
    "wrapper_npu": lambda lses, outs, t: aar._C._testing.attention_update(lses, outs, t, "npu"),
}


def _parts(n, m=4, d=8, dtype=torch.float32):
    return [torch.zeros(m) for _ in range(n)], [torch.zeros(m, d, dtype=dtype) for _ in range(n)]


@pytest.mark.parametrize("via", list(_PROVIDERS))
def test_attention_update_limits_refused_by_name(via):
    call = _PROVIDERS[via]
    l17, o17 = _parts(17)
    cases = [
        ((l17, o17, 0), ValueError, "1..16 partial results, got 17"),
        ((*_parts(2, d=4), 0), ValueError, "D=4 must be a multiple of 8 in \\[8, 512\\]"),
        ((*_parts(2, d=12), 0), ValueError, "D=12 must be a multiple of 8"),
        ((*_parts(2, d=520), 0), ValueError, "D=520 must be a multiple of 8"),
        # aar::NotSupported: NotImplementedError through our bindings, RuntimeError through torch.ops.
        ((*_parts(2), 2), NotImplementedError if via.startswith("wrapper") else RuntimeError,
         "not supported: update_type=2"),
        (([torch.zeros(4, dtype=torch.float64)] * 2, _parts(2)[1], 0), ValueError, "lse\\[0\\] must be float32"),
        (([torch.zeros(4), torch.zeros(5)], _parts(2)[1], 0), ValueError, "lse\\[1\\] must be float32 \\(M=4\\)"),
        ((_parts(2)[0], _parts(3)[1], 0), ValueError, "local_out has 3 entries but lse has 2"),
        ((_parts(2)[0], [torch.zeros(4, 8), torch.zeros(4, 16)], 0), ValueError, "local_out\\[1\\] must be"),
        ((_parts(2)[0], [torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.half)], 0), ValueError,
         "local_out\\[1\\] must be .* of dtype Float"),
        ((*_parts(2, dtype=torch.float64), 0), ValueError, "float32, float16 or bfloat16"),
        (([torch.zeros(4, 1)] * 2, _parts(2)[1], 0), ValueError, "lse\\[0\\] must be a 1-d"),
    ]
    if via.startswith("wrapper"):
        cases.append((([], [], 0), ValueError, "1..16 partial results, got 0"))
    else:
        # By name with no tensor at all the dispatcher has no device to pick a kernel by: its own refusal.
        cases.append((([], [], 0), NotImplementedError, "no tensor arguments"))
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call(*args)
    if via in ("twin", "no_compute", "wrapper_cpu", "wrapper_no_compute"):
        # The limits themselves are accepted: 16 partitions, D = 8 and 512, M = 0.
        for n, d, m in ((16, 8, 3), (1, 512, 2), (2, 64, 0)):
            out, lse = call(*_parts(n, m=m, d=d), 1)
            assert out.shape == (m, d) and lse.shape == (m,)
