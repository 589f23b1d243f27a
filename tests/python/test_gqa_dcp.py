"""GQA decode context parallel (cp/gqa_dcp.h, docs/design/cp.md §3, §5, §9) over real gloo groups.

Every rank runs the same batches with the same global K/V (one seed), holds its own
query heads and its own KV shard; each rank's output is compared with a float64
attention over the whole sequence, computed in the test from the global K/V history
(causal by position; the context prefix fully visible). Steps per configuration:
fresh prefills (no collective may be issued), a mixed batch (decodes, one with fewer
tokens than the group, a chunked prefill over cached context, a fresh prefill), a
speculative decode (4 tokens per request, the interleave-aware mask), a plain decode.
All configurations run inside one spawned group per world size (spawning is the cost).
"""

import math

import pytest
import torch

from _cp_harness import run_ranks

D = 16


def _ref(q, hist, pos, G):
    # q (n, H, D) float64 for tokens at positions pos (n) of one request whose
    # keys/values so far are hist = (K (L, Hkv, D), V); local head h uses KV head h // G.
    K, V = hist
    H = q.shape[1]
    kv = torch.arange(H) // G
    k = K[:, kv]  # (L, H, D)
    v = V[:, kv]
    s = torch.einsum("nhd,lhd->hnl", q, k) / math.sqrt(D)
    L = K.shape[0]
    mask = torch.arange(L)[None, :] > torch.tensor(pos)[:, None]
    s = s.masked_fill(mask[None], -math.inf)
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, dim=-1), v)


def _close(got, ref, tol, what):
    # Not torch.testing.assert_close: with a process group up it imports the
    # DTensor stack (~10 s per rank on this machine).
    err = (got - ref).abs() - tol * ref.abs()
    assert float(err.max()) <= tol, f"{what}: max excess error {float(err.max())} (tol {tol})"


class _World:
    """The global state of one configuration: K/V histories, block table."""

    def __init__(self, rank, W, comm, B, I, H, Hkv, dtype, nreq, max_len):
        import ascend_attn_rt as aar

        self.aar, self.rank, self.W, self.comm = aar, rank, W, comm
        self.B, self.I, self.H, self.Hkv, self.dtype = B, I, H, Hkv, dtype
        self.gen = torch.Generator().manual_seed(1234 + B + I + H + Hkv)
        per_req = -(-max_len // (B * W))
        self.stride = per_req
        self.num_blocks = nreq * per_req + 1
        # distinct block ids, shuffled, identical on every rank (one table)
        ids = torch.randperm(self.num_blocks - 1, generator=self.gen)[: nreq * per_req] + 1
        self.bt = ids.view(nreq, per_req).to(torch.int32)
        self.kc = torch.zeros(self.num_blocks, B, Hkv, D, dtype=dtype)
        self.vc = torch.zeros_like(self.kc)
        self.hist = [(torch.zeros(0, Hkv, D, dtype=torch.float64), torch.zeros(0, Hkv, D, dtype=torch.float64))
                     for _ in range(nreq)]
        self.layer = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=Hkv)
        self.builders = {}
        self.tol = 1e-5 if dtype == torch.float32 else 2e-2

    def builder(self, spec, pd=False):
        if (spec, pd) not in self.builders:
            self.builders[(spec, pd)] = self.aar.DcpMetadataBuilder(
                max_num_reqs=8, max_num_tokens=1024, max_blocks_per_req=self.stride, block_size=self.B,
                num_blocks=self.num_blocks, dcp_world=self.W, dcp_rank=self.rank, interleave=self.I,
                num_speculative_tokens=spec, pd_recompute_scheduler=pd)
        return self.builders[(spec, pd)]

    def step(self, reqs, qlens, prefilling, spec=0, expect_collectives=None, pd=False, draft=-1):
        """One forward of requests `reqs` (decode-first) with qlens new tokens each.

        pd: through a builder with the P/D recompute scheduler. draft = d >= 0: a draft step,
        built from base lengths (history - d: the new token sits at base + d)."""
        W, H, Hkv, G = self.W, self.H, self.Hkv, self.H // self.Hkv
        T = sum(qlens)
        # global inputs, identical on all ranks
        q_all = torch.randn(T, W * H, D, generator=self.gen, dtype=torch.float64)
        k = torch.randn(T, Hkv, D, generator=self.gen, dtype=torch.float64)
        v = torch.randn(T, Hkv, D, generator=self.gen, dtype=torch.float64)
        q = q_all[:, self.rank * H:(self.rank + 1) * H].to(self.dtype).contiguous()
        kd, vd = k.to(self.dtype), v.to(self.dtype)
        seq, qsl = [], [0]
        for r, n in zip(reqs, qlens):
            seq.append(self.hist[r][0].shape[0] + n)
            qsl.append(qsl[-1] + n)
        given = seq if draft < 0 else [L - draft - 1 for L in seq]
        md = self.builder(spec, pd).build(torch.tensor(qsl, dtype=torch.int32),
                                          torch.tensor(given, dtype=torch.int32), self.bt[list(reqs)].contiguous(),
                                          is_prefilling=torch.tensor(prefilling, dtype=torch.bool), draft_step=draft)
        if draft >= 0:
            # upstream's draft_cp_seq_len: local_len(base + d + 1, rank), by brute force
            W, I = self.W, self.I
            assert md.draft_step == draft and md.num_decodes == len(reqs)
            assert md.decode_kv_lens == [sum((x // I) % W == self.rank for x in range(L)) for L in seq]
        out = torch.full((T, H, D), float("nan"), dtype=self.dtype)
        before = self.comm.calls
        self.layer.forward(q, kd, vd, self.kc, self.vc, md, out)
        issued = self.comm.calls - before
        if expect_collectives is not None:
            assert issued == expect_collectives, (issued, expect_collectives)
        # reference over the whole sequence, this rank's heads
        qr = q.double()
        for i, (r, n) in enumerate(zip(reqs, qlens)):
            rows = slice(qsl[i], qsl[i + 1])
            Kh = torch.cat([self.hist[r][0], kd[rows].double()])
            Vh = torch.cat([self.hist[r][1], vd[rows].double()])
            self.hist[r] = (Kh, Vh)
            pos = list(range(Kh.shape[0] - n, Kh.shape[0]))
            ref = _ref(qr[rows], (Kh, Vh), pos, G)
            got = out[rows].double()
            assert not torch.isnan(got).any(), f"NaN in request {r}"
            _close(got, ref, self.tol, f"request {r} (q={n}, seq={Kh.shape[0]})")
        return md, issued

    def check_shard(self):
        # the cache holds exactly this rank's tokens: local sequence through the table
        W, I, B = self.W, self.I, self.B
        for r, (K, _) in enumerate(self.hist):
            L = K.shape[0]
            own = [x for x in range(L) if (x // I) % W == self.rank]
            for li, x in enumerate(own):
                blk = int(self.bt[r, li // B])
                _close(self.kc[blk, li % B].double(), K[x].to(self.dtype).double(), 0.0, f"cache of {r}@{x}")


def _case_matrix(rank, W, configs):
    import torch.distributed as dist

    import ascend_attn_rt as aar

    torch.set_num_threads(1)  # ranks share two cores: no intra-op pools fighting
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=30.0)
    done = []
    for (B, I, H, Hkv, dtype_name) in configs:
        dtype = getattr(torch, dtype_name)
        w = _World(rank, W, comm, B, I, H, Hkv, dtype, nreq=5, max_len=B + 80)
        # 1. fresh prefills: no collective at all
        _, n = w.step([0, 1, 2, 3], [1, 3, 37, B + 9], [1, 1, 1, 1], expect_collectives=0)
        # 2. mixed: decodes (req 0 has 2 tokens: shorter than a 4-group), a chunked
        #    prefill over cached context (req 2), a fresh prefill (req 4)
        exp = 0 if W == 1 else 4  # decode gather + a2a, context gather + a2a
        w.step([0, 1, 2, 4], [1, 1, 7, 5], [0, 0, 1, 1], expect_collectives=exp)
        # 3. speculative decode, 4 tokens per request (interleave-aware causal mask)
        w.step([0, 1, 3], [4, 4, 4], [0, 0, 0], spec=3, expect_collectives=0 if W == 1 else 2)
        # 4. plain decode of everything, then a chunked prefill whose context is
        #    short (ranks without local context still exchange)
        w.step([0, 1, 2, 3, 4], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0])
        w.step([4], [6], [1])
        # 5. the P/D recompute scheduler (docs/design/cp.md §3.1 / §3.2): a one-token request still flagged
        #    as prefilling (its last prompt token recomputed) runs as a decode
        dec = 0 if W == 1 else 2
        md, _ = w.step([0, 1], [1, 1], [0, 1], pd=True, expect_collectives=dec)
        assert md.num_decodes == 2 and md.num_prefills == 0
        # 6. draft-model steps d = 0, 1 over base lengths (docs/design/cp.md §3.1 draft_cp_seq_len), the
        #    prefilling flags ignored
        for d in (0, 1):
            w.step([0, 2, 3], [1, 1, 1], [1, 1, 1], draft=d, expect_collectives=dec)
        w.check_shard()
        done.append((B, I, H, Hkv, dtype_name))
    if W > 1:
        _bad_inputs(rank, W, comm)
    return len(done)


def _bad_inputs(rank, W, comm):
    # Rejections are rank-independent and leave the cache untouched.
    import ascend_attn_rt as aar

    w = _World(rank, W, comm, 16, 1, 2, 1, torch.float32, nreq=2, max_len=64)
    b = w.builder(0)
    qsl, seq = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
    bad = w.bt[:1].clone()
    bad[0, 0] = 10_000  # a block id the kernels would read (context), out of range
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]=10000"):
        b.build(qsl, seq, bad)
    with pytest.raises(ValueError, match=r"draft step \(draft_step=0\) has one query token per request"):
        b.build(qsl, seq, w.bt[:1].contiguous(), draft_step=0)
    with pytest.raises(ValueError, match="draft_step=16 is out of range"):
        b.build(torch.tensor([0, 1], dtype=torch.int32), seq, w.bt[:1].contiguous(), draft_step=16)
    md = b.build(qsl, seq, w.bt[:1].contiguous(), is_prefilling=torch.tensor([True]))
    other = aar.DcpMetadataBuilder(max_num_reqs=2, max_num_tokens=8, max_blocks_per_req=w.stride, block_size=16,
                                   num_blocks=w.num_blocks, dcp_world=W, dcp_rank=(rank + 1) % W)
    md_other = other.build(qsl, seq, w.bt[:1].contiguous(), is_prefilling=torch.tensor([True]))
    q, k = torch.randn(3, 2, D), torch.randn(3, 1, D)
    snap = w.kc.clone()
    with pytest.raises(ValueError, match="built for DCP rank"):
        w.layer.forward(q, k, k, w.kc, w.vc, md_other, torch.empty(3, 2, D))
    with pytest.raises(ValueError, match="query must have shape"):
        w.layer.forward(torch.randn(3, 3, D), k, k, w.kc, w.vc, md, torch.empty(3, 3, D))
    assert torch.equal(w.kc, snap)
    with pytest.raises(ValueError, match="interleave_size=3 must divide block_size=16"):
        aar.DcpMetadataBuilder(max_num_reqs=2, max_num_tokens=8, max_blocks_per_req=2, block_size=16,
                               num_blocks=8, dcp_world=W, dcp_rank=rank, interleave=3)
    # The same calls still work afterwards (no rank left inside a collective).
    out = torch.empty(3, 2, D)
    w.layer.forward(q, k, k, w.kc, w.vc, md, out)


CONFIGS = [
    (16, 1, 4, 1, "float32"),     # GQA, one KV head per rank (upstream's layout)
    (16, 2, 2, 2, "float32"),     # MHA
    (16, 16, 4, 2, "bfloat16"),   # GQA with Hkv = 2, I = B
    (128, 1, 2, 1, "bfloat16"),
    (128, 128, 2, 2, "float32"),  # MHA, I = B = 128
]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_gqa_dcp_matches_float64_reference(world):
    assert run_ranks(world, _case_matrix, CONFIGS, deadline_s=150.0) == [len(CONFIGS)] * world


# ----------------------------------------------------------------------------- the step core and the contract


def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


def _dcp_builder(**kw):
    import ascend_attn_rt as aar

    return aar.DcpMetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=16,
                                  num_blocks=32, dcp_world=2, dcp_rank=1, **kw)


_BT = _i32([[1, 2], [3, 4], [5, 6], [7, 8]])


def test_dcp_metadata_counts_have_the_step_core_meaning():
    b = _dcp_builder(num_speculative_tokens=1)
    # Decodes of 1 and 2 tokens, a chunk of 5 over 20 cached tokens, a fresh prefill of 3.
    md = b.build(_i32([0, 1, 3, 8, 11]), _i32([10, 12, 25, 3]), _BT,
                 is_prefilling=torch.tensor([False, False, True, True]))
    assert (md.num_reqs, md.num_kernel_reqs) == (4, 4)
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills, md.num_prefill_tokens) == (2, 3, 2, 8)
    assert md.num_actual_tokens == md.num_input_tokens == 11
    assert (md.max_query_len, md.max_seq_len) == (5, 25)
    # A decode-only step padded to a bucket of 8: its 5 padding rows are the kernels' dummies.
    md = b.build(_i32([0, 1, 2, 3]), _i32([4, 9, 30]), _BT[:3].contiguous(), num_input_tokens=8)
    assert (md.num_reqs, md.decode_kernel_rows, md.num_kernel_reqs) == (3, 8, 8)
    assert (md.num_actual_tokens, md.num_input_tokens, md.num_prefill_tokens) == (3, 8, 0)


def test_dcp_backend_contract():
    import ascend_attn_rt as aar

    S = aar.AttentionState
    f = aar.backend_facts("gqa_dcp")
    assert f["capturable"] == ["DecodeOnly", "SpecDecoding"] and f["context_parallel"]
    assert f["kv_caches"] == ["key_cache", "value_cache"] and "gqa_dcp" in [x["id"] for x in aar.backends()]
    b = _dcp_builder()
    qsl, base, bt = _i32([0, 1, 2]), _i32([7, 20]), _BT[:2].contiguous()
    md = b.build(qsl, base, bt)
    # Refused by name before anything is built: the previous metadata stays current.
    for state in (S.PrefillNoCache, S.PrefillCacheHit, S.ChunkedPrefill):
        refusal = f"attention state {state.name} cannot be captured by the gqa_dcp backend \\(only DecodeOnly, SpecDecoding\\)"
        with pytest.raises(NotImplementedError, match=refusal):
            b.build_for_graph_capture(qsl, base, bt, num_input_tokens=4, state=state)
    assert md.is_current
    g = b.build_for_graph_capture(qsl, base, bt, num_input_tokens=4)
    assert g.attn_state == S.DecodeOnly and g.decode_kernel_rows == 4 and not md.is_current
    assert b.build(qsl, base, bt).attn_state == S.ChunkedPrefill
    # Drafting is build() over the draft step's own lengths: draft 1 of base lengths b is a step of b + 2,
    # the same decode rows as a draft_step=1 build over the base lengths.
    lens = b.build_for_drafting(qsl, base + 2, bt, 1).decode_kv_lens
    assert b.build(qsl, base, bt, draft_step=1).decode_kv_lens == lens
    assert b.build_for_drafting(qsl, base, bt, 1, draft_step=1).decode_kv_lens == lens
    with pytest.raises(ValueError, match=r"draft_step=0 \(a draft step over base lengths\) differs from draft_index=1"):
        b.build_for_drafting(qsl, base, bt, 1, draft_step=0)
    with pytest.raises(ValueError, match="draft_index must be >= 0, got -1"):
        b.build_for_drafting(qsl, base, bt, -1)


def _case_profiling_run(rank, W):
    import torch.distributed as dist

    import ascend_attn_rt as aar

    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    layer = aar.DcpAttentionImpl(comm, 2, D, num_kv_heads=1)
    kc = torch.zeros(8, 16, 1, D)
    q, k = torch.randn(3, 2, D), torch.randn(3, 1, D)
    out = torch.full((3, 2, D), float("nan"))
    assert layer.forward(q, k, k, kc, kc, None, out) is out
    assert comm.calls == 0 and bool((out == 0).all()) and not bool(kc.any())
    g = aar.GraphParams("recording")
    with pytest.raises(NotImplementedError, match="a DCP forward without metadata"):
        with g.capture(3):
            layer.forward(q, k, k, kc, kc, None, out)
    return comm.calls


def test_dcp_forward_without_metadata_is_a_profiling_run():
    # Every rank runs it alike and issues no collective: a rank waiting in one would hang the test.
    assert run_ranks(2, _case_profiling_run, deadline_s=60.0) == [0, 0]
