"""DSA (DeepSeek-V4) DSA-CP token sharding (docs/design/sparse_cp.md §4, §10) over real gloo process groups of 2
and 4 local processes.

Every rank regenerates the same requests from one seed and holds the whole layer except its o_proj, of which it
holds its row-parallel shard (wo_a's groups [r G/W, (r+1) G/W) and wo_b's matching columns). Next to its DSA-CP layer
it runs the single-rank DSA backend (the plain layer with the full weights) on its own copies of the same caches and
the same steps, and checks, step by step:
  * its output (the complete output, on every rank) against the single-rank layer's, and on rank 0 against the
    float64 reference of _dsa_reference (through test_dsa.check_step, with the single-rank selection);
  * the top-k rows of its token slice against the single-rank selection's rows of the same tokens (fp32);
  * its caches (SWA, compressed, compressor states, indexer) after each step: equal to the single-rank layer's, so
    every token's rows are written on every rank, not only its slice's;
  * the collectives: decode steps all-to-all the head blocks and all-reduce the o_proj partials; steps with prefills
    (full-weight o_proj) all-gather wo_a, wo_b and the outputs; with the switch off they take the decode road;
  * the layer's o_proj is its shards after every step.
Ratios 1, 4 and 128; prefills, mixed steps, decodes, speculative decodes, graph-padding rows; token counts not
divisible by the group and ranks whose slice is empty or only padding. A fault injected at every operator call of a
prefill step (both ranks alike) leaves wo_a and wo_b the shards and the pools intact, and the next step is exact.
"""

import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _cp_harness import run_ranks
from _dsa_harness import PLANS, allocate_caches, build_step, group_kw
from test_dsa import check_step

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

T_ = aar._C._testing
CBS = 32
MAXPOS = 1024
KSPEC = 2  # the runs' num_speculative_tokens (decode_threshold 3)


def dims(ratio, plan="a2"):
    # G = 4 groups: divisible by the 2- and 4-rank groups (each rank's shard holds whole groups). The A5 fp8 rows
    # fix D = 512, R = 64 (test_dsa_a5.py's dims, 2 heads and groups: the 2-rank group).
    if plan != "a2":
        return ref.DsaDims(hidden=64, N=2, D=512, R=64, q_lora=32, W=8, ratio=ratio, n_idx=4, Di=64, K=8, G=2,
                           o_lora=16)
    return ref.DsaDims(hidden=64, N=4, D=64, R=16, q_lora=32, W=8, ratio=ratio, n_idx=4, Di=32, K=8, G=4, o_lora=16)


def shard(w, d, world, rank):
    """The weights of rank `rank` of a DSA-CP group of `world`: everything whole but o_proj (wo_a's groups of this
    rank, wo_b's columns of those groups)."""
    ws = dict(w)
    g = d.G // world
    ws["wo_a"] = w["wo_a"][rank * g:(rank + 1) * g].contiguous()
    ws["wo_b"] = w["wo_b"][:, rank * g * d.o_lora:(rank + 1) * g * d.o_lora].contiguous()
    return ws


class Run:
    """One DSA layer (DSA-CP when comm is given) with its caches and builders; requests with fixed token streams
    (request b owns blocks [1 + b * max_blocks, ...) of every group)."""

    def __init__(self, d, dtype, nreq, *, world=1, rank=0, comm=None, seed=0, max_blocks=24, full_o_proj=True,
                 k=KSPEC, plan="a2", sb_extra=None, impl_extra=None, weights_of=None):
        # sb_extra / impl_extra: more StepBuilder / Impl keywords (test_dsa_dcp.py's DCP options, which replace
        # num_heads / o_groups there); weights_of(w): the layer's weights from the full ones.
        self.d, self.dtype = d, dtype
        device_kind, cache_dtype = PLANS[plan]
        pk = dict(device_kind=device_kind, cache_dtype=cache_dtype, model_dtype="bfloat16")
        g = torch.Generator().manual_seed(seed)
        self.w = ref.make_dsa_weights(d, dtype, g)
        self.cos, self.sin = ref.rope_tables(MAXPOS, d.R)
        self.x = [torch.randn(400, d.hidden, generator=g, dtype=torch.float64).to(dtype) for _ in range(nreq)]
        # world > 1: the builders shard the steps; the layer is DSA-CP only with its comm
        cp = dict(dsa_cp_world_size=world, dsa_cp_rank=rank) if world > 1 else {}
        self.sb = aar.dsa.StepBuilder(max_num_reqs=8, max_num_tokens=512, cos_table=self.cos, sin_table=self.sin,
                                      compress_cos_table=self.cos, compress_sin_table=self.sin,
                                      num_speculative_tokens=k, head_dim=d.D, window=d.W, num_heads_q=d.N,
                                      index_topk=d.K, index_n_heads=d.n_idx, index_head_dim=d.Di, **cp,
                                      **(sb_extra or {}))
        self.kinds = aar.dsa.layer_cache_kinds(d.ratio)
        self.nb = nreq * max_blocks + 1
        self.gb, self.tables = {}, {}
        for kd in self.kinds:
            self.gb[kd] = aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=CBS, max_blocks_per_req=max_blocks,
                                               num_blocks=self.nb, **pk)
            self.tables[kd] = torch.tensor([[1 + b * max_blocks + j for j in range(max_blocks)] for b in range(nreq)],
                                           dtype=torch.int32)
        c = allocate_caches(self.gb, dtype)
        self.swa, self.cmp, self.state, self.istate = c["swa"], c["compress_kv"], c["state"], c["indexer_state"]
        self.ik, self.isc = c["indexer_k"], c["indexer_scale"]
        self.ifull, self.raw = c["indexer_full"], c["indexer_raw"]
        self.kv = aar.dsa.compose_kv_cache(compress_kv=self.cmp, swa_kv=self.swa, state=self.state,
                                           indexer_state=self.istate, indexer_k=self.ik, indexer_scale=self.isc,
                                           indexer_full=self.ifull, **pk)
        weights = shard(self.w, d, world, rank) if comm is not None else self.w
        if weights_of is not None:
            weights = weights_of(self.w)
        kw = dict(dsa_cp_comm=comm, dsa_cp_full_o_proj_prefill=full_o_proj) if comm is not None else {}
        kw = dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora,
                  compress_ratio=d.ratio, index_n_heads=d.n_idx, index_head_dim=d.Di, index_topk=d.K, eps=d.eps,
                  o_groups=d.G, o_lora_rank=d.o_lora, **pk, **kw)
        kw.update(impl_extra or {})
        self.make_impl = lambda **extra: aar.dsa.Impl(weights, **kw, **extra)
        self.impl = self.make_impl()
        self.S = [0] * nreq

    def caches(self):
        idx = (self.raw,) if self.raw is not None else (self.ik, self.isc)
        return [t for t in (self.swa, self.cmp, self.state, self.istate) + idx if t is not None]

    def build(self, reqs, qlens, pad=0):
        return build_step(self, reqs, qlens, pad)

    def build_padded(self, reqs, B, q, capture=False):
        """A decode bucket of B requests x q tokens: the real requests, then dummies of q tokens (S = q; their
        zeroed table rows read block 0, their KV slots are skip slots), every bucket row in a request."""
        n = len(reqs)
        S = [self.S[b] + q for b in reqs] + [q] * (B - n)
        qsl = [i * q for i in range(B + 1)]
        args = (torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32))
        kw = dict(num_reqs_actual=n, num_input_tokens=B * q)
        if capture:
            state = aar.AttentionState.SpecDecoding if q > 1 else aar.AttentionState.DecodeOnly
            st = self.sb.build_for_graph_capture(*args, state=state, **kw)
        else:
            st = self.sb.build(*args, **kw)
        rows = list(reqs) + [reqs[0]] * (B - n)
        md = {kd: self.gb[kd].build(st, self.tables[kd][rows].contiguous()) for kd in self.kinds}
        return st, md, S[:n], qsl[: n + 1]

    def hidden(self, reqs, qlens, S, pad):
        return torch.cat([self.x[b][S[i] - qlens[i]: S[i]] for i, b in enumerate(reqs)]
                         + [torch.zeros(pad, self.d.hidden, dtype=self.dtype)])

    def step(self, reqs, qlens, pad=0):
        st, md, S, qsl = self.build(reqs, qlens, pad)
        hid = self.hidden(reqs, qlens, S, pad)
        out = torch.full_like(hid, float("nan"))
        self.impl.forward(hid, self.kv, st, md["swa"], out, **group_kw(self.d.ratio, md, st))
        for i, b in enumerate(reqs):
            self.S[b] = S[i]
        return st, out, qsl, S

    def index_cache_pair(self, reqs, qlens):
        """One step of the IndexCache pair (self.store: use_index_cache, self.skip: skip_topk, C4 layers)
        on the same caches as they were before the step: (store's output, skip's output, store's
        selection, step metadata)."""
        st, md, S, qsl = self.build(reqs, qlens)
        hid = self.hidden(reqs, qlens, S, 0)
        snap = [t.clone() for t in self.caches()]
        a, b = torch.full_like(hid, float("nan")), torch.full_like(hid, float("nan"))
        kw = group_kw(4, md, st)
        self.store.forward(hid, self.kv, st, md["swa"], a, topk_buffer=self.topk, **kw)
        sel = self.store.last_topk.clone()
        for t, v in zip(self.caches(), snap):
            t.copy_(v)
        self.skip.forward(hid, self.kv, st, md["swa"], b, topk_buffer=self.topk, **kw)
        for i, q in enumerate(reqs):
            self.S[q] = S[i]
        return a, b, sel, st


def same_bytes(a, b):
    """Bit equality (the fp8 rows' scale and rope bytes read as fp8 may be NaN patterns, which torch.equal
    would call different)."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _calls(comm):
    return tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))


# (reqs, qlens, pad): prefills, a mixed step, decodes, graph padding, speculative decodes, a one-token step (every
# rank but rank 0 has an empty or padding-only slice), odd token counts.
STEPS = {
    1: [([0, 1, 2], [13, 5, 4], 0), ([0, 1, 2], [1, 1, 6], 0), ([0, 1, 2], [1, 1, 1], 0),
        ([0, 1, 2], [1, 1, 1], 2), ([0, 1, 2], [3, 3, 3], 0), ([1], [1], 0)],
    4: [([0, 1, 2], [23, 10, 5], 0), ([0, 1, 2], [1, 1, 14], 0), ([0, 1, 2], [1, 1, 1], 0),
        ([0, 1, 2], [3, 3, 3], 0), ([0, 1, 2], [1, 1, 1], 2), ([2], [1], 0)],
    128: [([0, 1], [133, 9], 0), ([0, 1], [1, 125], 0), ([0, 1], [1, 1], 0), ([0, 1], [3, 3], 0), ([0], [1], 0)],
}


def _case_steps(rank, world, cases):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    report = []
    for ratio, dtype, full_o_proj, steps, k, plan in cases:
        d = dims(ratio, plan)
        nreq = max(max(r) for r, _, _ in steps) + 1
        cp = Run(d, dtype, nreq, world=world, rank=rank, comm=comm, full_o_proj=full_o_proj, k=k, plan=plan)
        one = Run(d, dtype, nreq, k=k, plan=plan)
        shards = shard(cp.w, d, world, rank)
        tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        for reqs, qlens, pad in steps:
            comm.reset_counters()
            st, out, qsl, S = cp.step(reqs, qlens, pad)
            calls = _calls(comm)
            _, want, _, _ = one.step(reqs, qlens, pad)
            where = f"rank {rank} ratio {ratio} {dtype} step {reqs} {qlens} pad {pad}"
            n = qsl[-1]
            scale = max(1.0, want[:n].abs().max().item())
            torch.testing.assert_close(out[:n], want[:n], atol=tol["atol"] * scale, rtol=tol["rtol"],
                                       msg=lambda m: f"{where}: output vs the single-rank layer: {m}")
            assert torch.equal(out[n:], torch.zeros_like(out[n:])), where
            for a, b in zip(cp.caches(), one.caches()):
                assert same_bytes(a, b), f"{where}: a cache differs from the single-rank layer's"
            lo, hi = st.local_start, st.local_end
            assert st.num_tokens_pad == st.tokens_per_rank * world and lo == rank * st.tokens_per_rank, where
            if ratio == 4:
                assert cp.impl.last_topk.shape[0] == hi - lo, where
                if dtype == torch.float32:
                    assert torch.equal(cp.impl.last_topk, one.impl.last_topk[lo:hi]), where
            if rank == 0 and plan == "a2":  # (the A5 plans' quantisation: against the single-rank layer only)
                tk = one.impl.last_topk if ratio == 4 else None
                check_step(one, reqs, qlens, out, qsl, S, tk)
            decode = st.attn_state in (aar.AttentionState.DecodeOnly, aar.AttentionState.SpecDecoding)
            want_calls = (0, 1, 1) if decode or not full_o_proj else (3, 0, 0)
            assert calls == want_calls, (where, calls, str(st.attn_state))
            assert torch.equal(cp.impl.wo_a, shards["wo_a"]) and torch.equal(cp.impl.wo_b, shards["wo_b"]), where
            report.append((ratio, str(st.attn_state).rsplit(".", 1)[-1], hi - lo, st.tokens_per_rank))
    return report


def _run(world, cases):
    reports = run_ranks(world, _case_steps, cases, deadline_s=150.0)
    return reports


def test_dsa_cp_two_ranks_every_ratio_and_road():
    # ratio 128 without speculative tokens (its decodes are DecodeOnly steps, its 3-token step a prefill)
    cases = [(r, torch.float32, True, STEPS[r], 0 if r == 128 else KSPEC, "a2") for r in (1, 4, 128)]
    cases.append((4, torch.float32, False, STEPS[4][:2], KSPEC, "a2"))  # prefills on the decode road
    cases.append((4, torch.bfloat16, True, STEPS[4][:4], KSPEC, "a2"))
    # the A5 plans (fp8 rows; bf16 rows with SparseFlashMla), a compressed layer with the indexer
    cases.append((4, torch.bfloat16, True, STEPS[4][:3], KSPEC, "a5"))
    cases.append((4, torch.bfloat16, True, STEPS[4][:3], KSPEC, "a5_bf16"))
    reports = _run(2, cases)
    states = {s for rep in reports for _, s, _, _ in rep}
    assert {"DecodeOnly", "SpecDecoding", "PrefillNoCache", "ChunkedPrefill"} <= states, states
    # a rank with an empty slice (the one-token steps)
    assert any(n == 0 for _, _, n, _ in reports[1])


def test_dsa_cp_four_ranks():
    reports = _run(4, [(4, torch.float32, True, STEPS[4][:3] + STEPS[4][-1:], KSPEC, "a2")])
    assert any(n == 0 for rep in reports for _, _, n, _ in rep)


def _case_faults(rank, world):
    """A fault at every operator call k of a prefill step (both ranks alike: both slices hold tokens, so they run
    the same calls): the step raises, wo_a / wo_b are the shards, the pools hold the full weights (once gathered),
    and a fault-free step afterwards is exact."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    d = dims(4)
    cp = Run(d, torch.float32, 2, world=world, rank=rank, comm=comm)
    one = Run(d, torch.float32, 2)
    cp.step([0, 1], [20, 9])
    one.step([0, 1], [20, 9])
    shards = shard(cp.w, d, world, rank)
    reqs, qlens = [0, 1], [1, 12]
    st, md, S, qsl = cp.build(reqs, qlens)
    hid = cp.hidden(reqs, qlens, S, 0)
    out = torch.zeros_like(hid)
    snap = [t.clone() for t in cp.caches()]
    kw = group_kw(d.ratio, md, st)
    T_.arm_fault(0)
    cp.impl.forward(hid, cp.kv, st, md["swa"], out, **kw)
    n = T_.disarm_fault()
    raised, pool_ok = 0, True
    for k in range(1, n + 1):
        T_.arm_fault(k)
        try:
            cp.impl.forward(hid, cp.kv, st, md["swa"], out, **kw)
        except RuntimeError as e:
            assert "fault injected" in str(e)
            raised += 1
        finally:
            T_.disarm_fault()
        assert torch.equal(cp.impl.wo_a, shards["wo_a"]) and torch.equal(cp.impl.wo_b, shards["wo_b"]), k
        pool_ok &= torch.equal(cp.impl.o_proj_full_pool(0), cp.w["wo_a"])
        pool_ok &= torch.equal(cp.impl.o_proj_full_pool(1), cp.w["wo_b"])
    for a, b in zip(cp.caches(), snap):
        a.copy_(b)
    out.fill_(7.0)
    cp.impl.forward(hid, cp.kv, st, md["swa"], out, **kw)
    _, want, _, _ = one.step(reqs, qlens)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
    return n, raised, pool_ok


def test_dsa_cp_fault_inside_the_o_proj_switch_restores_both_shards():
    for rank, (n, raised, pool_ok) in enumerate(run_ranks(2, _case_faults)):
        assert n > 10 and raised == n, (rank, n, raised)
        assert pool_ok, f"rank {rank}: a full-weight pool changed"


def _case_refusals(rank, world):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    d = dims(4)
    cp = Run(d, torch.float32, 1, world=world, rank=rank, comm=comm)
    plain = Run(d, torch.float32, 1)
    msgs = {}

    def catch(key, fn):
        try:
            fn()
        except (ValueError, NotImplementedError) as e:
            msgs[key] = (type(e).__name__, str(e))

    base = dict(hidden_size=d.hidden, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora, compress_ratio=4,
                index_n_heads=d.n_idx, index_head_dim=d.Di, index_topk=d.K, eps=d.eps, o_lora_rank=d.o_lora,
                dsa_cp_comm=comm)
    sh = shard(cp.w, d, world, rank)
    catch("heads", lambda: aar.dsa.Impl(sh, num_heads=3, o_groups=d.G, **base))
    catch("mx", lambda: aar.dsa.Impl(dict(sh, wo_a_scale=torch.zeros(1, dtype=torch.uint8)), num_heads=d.N,
                                     o_groups=d.G, **base))
    catch("full_wo_a", lambda: aar.dsa.Impl(cp.w, num_heads=d.N, o_groups=d.G, **base))
    # a DSA-CP layer given metadata built without DSA-CP (before any write)
    st, md, S, qsl = plain.build([0], [5])
    hid = plain.hidden([0], [5], S, 0)
    snap = [t.clone() for t in cp.caches()]
    catch("plain_md", lambda: cp.impl.forward(hid, cp.kv, st, md["swa"], torch.zeros_like(hid),
                                              **group_kw(4, md, st)))
    untouched = all(torch.equal(a, b) for a, b in zip(snap, cp.caches()))
    return msgs, untouched


def test_dsa_cp_refusals_by_name():
    for msgs, untouched in run_ranks(2, _case_refusals):
        assert untouched
        assert msgs["heads"][0] == "ValueError" and "dsa_cp_comm has 2 ranks, which must divide num_heads=3" in \
            msgs["heads"][1]
        assert msgs["mx"][0] == "NotImplementedError" and "MX-fp8 o_proj (weight wo_a_scale) under DSA-CP" in \
            msgs["mx"][1]
        assert msgs["full_wo_a"][0] == "ValueError" and "weight wo_a must have shape [2, 64, 16]" in \
            msgs["full_wo_a"][1]
        assert "the layer's dsa_cp_comm has 2 ranks but the metadata was built without DSA-CP" in \
            msgs["plain_md"][1]


def test_dsa_cp_builder_metadata_and_refusals():
    d = dims(4)
    cos, sin = ref.rope_tables(MAXPOS, d.R)
    kw = dict(max_num_reqs=8, max_num_tokens=64, cos_table=cos, sin_table=sin, compress_cos_table=cos,
              compress_sin_table=sin, head_dim=d.D, window=d.W, num_heads_q=d.N, index_topk=d.K,
              index_n_heads=d.n_idx, index_head_dim=d.Di)
    # docs/design/sparse_cp.md §4's worked example: qsl [0, 3, 5], S [3, 5], W = 2
    qsl, S = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32)
    want = {0: ([0, 3, 3], [3, 0], 0, 3), 1: ([0, 0, 2], [0, 5], 3, 5)}
    for rank in (0, 1):
        sb = aar.dsa.StepBuilder(dsa_cp_world_size=2, dsa_cp_rank=rank, **kw)
        st = sb.build(qsl, S)
        lq, ls, lo, hi = want[rank]
        assert (st.num_tokens_pad, st.tokens_per_rank, st.local_start, st.local_end) == (6, 3, lo, hi)
        assert st.local_query_start_loc_list == lq and st.local_seq_lens_list == ls
        assert st.local_query_start_loc.tolist() == lq and st.local_seq_lens.tolist() == ls
        assert st.local_cu_seqlens_kv.tolist() == [0, ls[0], ls[0] + ls[1]]
        # the slice's RoPE rows: the step's, then position 0's in the padding; -sin of them
        rows = [st.positions_list[i] if i < 5 else 0 for i in range(lo, lo + 3)]
        assert torch.equal(st.local_cos, cos[rows]) and torch.equal(st.local_sin, sin[rows])
        assert torch.equal(st.local_neg_sin, -sin[rows]) and torch.equal(st.local_compress_cos, cos[rows])
        # the groups' blobs take the local lengths (the twins' blob: [18] cu_seqlens_q's last entry, [19] sum(S))
        g = aar.dsa.GroupBuilder(sb, kind="c4_kv", cache_block_size=CBS, max_blocks_per_req=4, num_blocks=9)
        gm = g.build(st, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32))
        assert gm.sas_metadata[18].item() == hi - lo and gm.sas_metadata[19].item() == sum(ls)
        assert gm.seq_lens.tolist() == [3, 5]  # the compressors' lengths stay the step's
    plain = aar.dsa.StepBuilder(**kw).build(qsl, S)
    assert plain.dsa_cp_world_size == 1 and plain.local_query_start_loc is None
    with pytest.raises(ValueError, match="dsa_cp_rank=2 is not a rank of a DSA-CP group of dsa_cp_world_size=2"):
        aar.dsa.StepBuilder(dsa_cp_world_size=2, dsa_cp_rank=2, **kw)
    with pytest.raises(NotImplementedError, match="dsa_cp_world_size=2 with dspark_num_spec=2"):
        aar.dsa.StepBuilder(dsa_cp_world_size=2, dspark_num_spec=2, **kw)
    sb = aar.dsa.StepBuilder(dsa_cp_world_size=2, num_speculative_tokens=1, **kw)
    with pytest.raises(NotImplementedError, match="build_for_drafting with dsa_cp_world_size=2"):
        sb.build_for_drafting(qsl, S, 0)
    # DSA-CP metadata on a layer without a dsa_cp_comm: named before any write
    run = Run(d, torch.float32, 1, world=2)
    st, md, S, qsl = run.build([0], [5])
    hid = run.hidden([0], [5], S, 0)
    snap = [t.clone() for t in run.caches()]
    with pytest.raises(ValueError, match="metadata was built for DSA-CP rank 0 of 2 but the layer has no dsa_cp_comm"):
        run.impl.forward(hid, run.kv, st, md["swa"], torch.zeros_like(hid), **group_kw(4, md, st))
    assert all(torch.equal(a, b) for a, b in zip(snap, run.caches()))


def _case_graph(rank, world):
    """Decode buckets captured under DSA-CP (the recording provider: nothing runs, no collective) and replayed
    with other requests, graph padding included: replay == the single-rank layer run eagerly on the same padded
    steps, the caches likewise, the decode road's collectives inside each replay. The A5 + BF16 plan's replayed KV
    writes take every row of the bucket (docs/design/dsa.md §6)."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    done = []
    for ratio, q, B, plan in ((1, 1, 4, "a2"), (4, 1, 5, "a2"), (4, 3, 3, "a2"), (128, 1, 3, "a2"),
                              (4, 1, 5, "a5_bf16")):
        d = dims(ratio)
        k = q - 1
        cp = Run(d, torch.float32, 3, world=world, rank=rank, comm=comm, k=k, plan=plan)
        one = Run(d, torch.float32, 3, k=k, plan=plan)
        first = [140, 9, 30] if ratio == 128 else [20, 9, 30]
        for r in (cp, one):
            r.step([0, 1, 2], first)
        n = B * q
        hidden = torch.zeros(n, d.hidden)
        out = torch.zeros(n, d.hidden)
        g = aar.GraphParams("recording")
        st, md, _, _ = cp.build_padded([0, 1, 2], B, q, capture=True)
        snap = [t.clone() for t in cp.caches()]
        comm.reset_counters()
        with g.capture(n):
            cp.impl.forward(hidden, cp.kv, st, md["swa"], out, **group_kw(ratio, md, st))
        assert comm.calls == 0 and all(same_bytes(a, b) for a, b in zip(snap, cp.caches()))
        for reqs in ([0, 1, 2], [2, 0], [1]):
            st, md, S, qsl = cp.build_padded(reqs, B, q)
            hidden.zero_()
            hidden[: len(reqs) * q] = torch.cat([cp.x[b][S[i] - q: S[i]] for i, b in enumerate(reqs)])
            out.fill_(float("nan"))
            aar.dsa.graph_update(g, n, st, md["swa"])
            comm.reset_counters()
            g.replay(n)
            assert _calls(comm) == (0, 1, 1), _calls(comm)
            for i, b in enumerate(reqs):
                cp.S[b] = S[i]
            st1, md1, _, _ = one.build_padded(reqs, B, q)
            want = torch.full_like(out, float("nan"))
            one.impl.forward(hidden, one.kv, st1, md1["swa"], want, **group_kw(ratio, md1, st1))
            for i, b in enumerate(reqs):
                one.S[b] = S[i]
            m = len(reqs) * q
            torch.testing.assert_close(out[:m], want[:m], atol=2e-5, rtol=2e-5)
            for a, b in zip(cp.caches(), one.caches()):
                assert same_bytes(a, b), (ratio, q, reqs, plan)
        done.append((ratio, q, plan))
    return done


def test_dsa_cp_decode_graph_replays_like_the_single_rank_layer():
    for done in run_ranks(2, _case_graph, deadline_s=120.0):
        assert done == [(1, 1, "a2"), (4, 1, "a2"), (4, 3, "a2"), (128, 1, "a2"), (4, 1, "a5_bf16")]


def _case_index_cache(rank, world):
    """IndexCache under DSA-CP: a use_index_cache C4 layer stores its slice's selection in the TopkBuffer (the
    slice's rows, as every layer of a step sees the same slice), a skip_topk layer attends over it: both outputs
    equal the single-rank pair's, the stored rows the single-rank selection's rows of the slice."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    d = dims(4)
    runs = {}
    for name, kw in (("cp", dict(world=world, rank=rank, comm=comm)), ("one", {})):
        r = Run(d, torch.float32, 3, **kw)
        r.step([0, 1, 2], [23, 10, 5])
        r.topk = aar.sfa.TopkBuffer(64, d.K)
        r.store, r.skip = r.make_impl(use_index_cache=True), r.make_impl(skip_topk=True)
        runs[name] = r
    out = {}
    for reqs, qlens in (([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [3, 3, 3]), ([0, 1, 2], [1, 1, 9])):
        for name, r in runs.items():
            out[name] = r.index_cache_pair(reqs, qlens)
        a, b, sel, st = out["cp"]
        a1, b1, sel1, _ = out["one"]
        n = sum(qlens)
        torch.testing.assert_close(a[:n], a1[:n], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(b[:n], b1[:n], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(b[:n], a[:n], atol=2e-5, rtol=2e-5)
        lo, hi = st.local_start, st.local_end
        assert torch.equal(sel, sel1[lo:hi]) and torch.equal(runs["cp"].topk.buffer[: hi - lo], sel[:, 0])
    return True


def test_dsa_cp_index_cache_layers():
    assert run_ranks(2, _case_index_cache) == [True, True]
