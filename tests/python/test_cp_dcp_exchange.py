"""The shared DCP exchange (comm/dcp_exchange.h, docs/design/cp.md §4, §7.2, §8) over real gloo groups:
the query-head gather and the partial all-to-all + LSE merge against an unsharded
float64 attention; gathers into a given `out` reuse the Comm's staging."""

import math

import pytest
import torch

from _cp_harness import run_ranks


def _close(got, ref, tol):
    # Not torch.testing.assert_close: with a process group up it imports the
    # DTensor stack (~10 s per rank on this machine).
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = float(((got.double() - ref.double()).abs() - tol * ref.double().abs()).max())
    assert err <= tol, f"max excess error {err} (tol {tol})"


def _attend(q, k, v, scale):
    # q (T, N, D), k/v (S, N, D) float64 -> out (T, N, D), lse (T, N); S may be 0.
    s = torch.einsum("tnd,snd->nts", q, k) * scale
    if k.shape[0] == 0:
        return torch.zeros_like(q), torch.full(q.shape[:2], -math.inf, dtype=q.dtype)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    return torch.einsum("nts,snd->tnd", p, v), lse.transpose(0, 1)


def _case_exchange(rank, world):
    import torch.distributed as dist

    import ascend_attn_rt as aar

    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    T, H, D = 5, 2, 16
    g = torch.Generator().manual_seed(7)
    q_all = torch.randn(T, world * H, D, generator=g, dtype=torch.float64)
    # Key shards of different sizes, one empty (a rank with no local tokens).
    sizes = [0 if r == world - 1 else 3 + 2 * r for r in range(world)]
    ks = [torch.randn(n, world * H, D, generator=g, dtype=torch.float64) for n in sizes]
    vs = [torch.randn(n, world * H, D, generator=g, dtype=torch.float64) for n in sizes]
    scale = 1 / math.sqrt(D)
    mine = q_all[:, rank * H:(rank + 1) * H].float().contiguous()
    out_buf = torch.empty(T, world * H, D)
    gathered = aar.cp.gather_query_heads(comm, mine, out_buf)
    assert gathered.data_ptr() == out_buf.data_ptr()
    _close(gathered, q_all.float(), 0.0)
    # This rank's partial for every gathered head over its own shard.
    po, pl = _attend(gathered.double(), ks[rank], vs[rank], scale)
    out = torch.empty(T, H, D)
    lse = torch.empty(T, H, 1)
    aar.cp.combine_partials(comm, po.float(), pl.float().unsqueeze(-1), out, lse)
    ref_o, ref_l = _attend(q_all, torch.cat(ks), torch.cat(vs), scale)
    sl = slice(rank * H, (rank + 1) * H)
    _close(out, ref_o[:, sl], 1e-5)
    _close(lse.squeeze(-1), ref_l[:, sl], 1e-5)
    # bf16 partial outputs travel as fp32 on the wire.
    out16 = torch.empty(T, H, D, dtype=torch.bfloat16)
    aar.cp.combine_partials(comm, po.to(torch.bfloat16), pl.float().unsqueeze(-1), out16)
    _close(out16, ref_o[:, sl], 1e-2)
    calls = comm.calls_of("all_to_all_single")
    for _ in range(3):
        aar.cp.gather_query_heads(comm, mine, out_buf)
    return calls, comm.calls_of("all_gather")


@pytest.mark.parametrize("world", [2, 4])
def test_dcp_exchange_equals_unsharded_attention(world):
    res = run_ranks(world, _case_exchange)
    assert res == [(2, 4)] * world


def _case_single(rank, world):
    import torch.distributed as dist

    import ascend_attn_rt as aar

    comm = aar.cp.Comm(dist.group.WORLD)
    q = torch.randn(3, 2, 8)
    _close(aar.cp.gather_query_heads(comm, q), q, 0.0)
    out = torch.empty(3, 2, 8)
    po = torch.randn(3, 2, 8)
    aar.cp.combine_partials(comm, po, torch.zeros(3, 2, 1), out)
    _close(out, po, 0.0)
    return comm.calls


def test_dcp_exchange_world_one_issues_no_collective():
    assert run_ranks(1, _case_single) == [0]
