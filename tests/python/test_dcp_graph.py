"""Graph capture of DCP decode (cp/gqa_dcp.h, mla/impl.h; docs/design/cp.md §4 "Graph mode", docs/design/mla.md §6.2)
over real gloo groups of 2 ranks.

A decode bucket is captured once (KV write, query gather, the local paged call, exchange +
merge); each step then builds its metadata padded to the bucket, updates the graph and
replays it, the collectives running inside the replayed calls. Every replay is compared with
an eager DCP forward of the same step on a twin cache (same rank, same batch, unpadded) and
with the float64 reference over the whole sequence, over steps whose batch size and lengths
change; the captured addresses (queries, outputs, LSEs, block tables, slot mapping) never move.
"""

import math

import pytest
import torch

from _cp_harness import run_ranks
from test_gqa_dcp import D, _close, _ref

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

BUCKET = 8


def _gqa_case(rank, W, configs):
    import ascend_attn_rt as aar

    torch.set_num_threads(1)
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    results = []
    for (B, I, H, Hkv, dtype_name, spec) in configs:
        dtype = getattr(torch, dtype_name)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        G = H // Hkv
        gen = torch.Generator().manual_seed(99 + B + I + H + spec)
        nreq, max_len = BUCKET, 72
        per_req = -(-max_len // (B * W))
        num_blocks = nreq * per_req + 1
        bt = (torch.randperm(num_blocks - 1, generator=gen)[: nreq * per_req] + 1).view(nreq, per_req).to(torch.int32)
        caches = {m: (torch.zeros(num_blocks, B, Hkv, D, dtype=dtype), torch.zeros(num_blocks, B, Hkv, D, dtype=dtype))
                  for m in ("graph", "eager")}
        mk = dict(max_num_reqs=nreq, max_num_tokens=160, max_blocks_per_req=per_req, block_size=B,
                  num_blocks=num_blocks, dcp_world=W, dcp_rank=rank, interleave=I, num_speculative_tokens=spec)
        b_graph, b_eager = aar.DcpMetadataBuilder(**mk), aar.DcpMetadataBuilder(**mk)
        layer_graph = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=Hkv)
        layer_eager = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=Hkv)
        hist = [(torch.zeros(0, Hkv, D, dtype=torch.float64), torch.zeros(0, Hkv, D, dtype=torch.float64))
                for _ in range(nreq)]

        def inputs(T):
            q_all = torch.randn(T, W * H, D, generator=gen, dtype=torch.float64)
            k = torch.randn(T, Hkv, D, generator=gen, dtype=torch.float64)
            v = torch.randn(T, Hkv, D, generator=gen, dtype=torch.float64)
            q = q_all[:, rank * H:(rank + 1) * H].to(dtype).contiguous()
            return q, k.to(dtype), v.to(dtype)

        def record(reqs, qlens, q, k, v, out):
            qsl = [0]
            for r, n in zip(reqs, qlens):
                rows = slice(qsl[-1], qsl[-1] + n)
                Kh = torch.cat([hist[r][0], k[rows].double()])
                Vh = torch.cat([hist[r][1], v[rows].double()])
                hist[r] = (Kh, Vh)
                pos = list(range(Kh.shape[0] - n, Kh.shape[0]))
                if out is not None:
                    got = out[rows].double()
                    assert not torch.isnan(got).any()
                    _close(got, _ref(q[rows].double(), (Kh, Vh), pos, G), tol, f"request {r} (seq {Kh.shape[0]})")
                qsl.append(qsl[-1] + n)

        # History: fresh prefills of every request (eager, on both caches).
        plens = [1, 2, 5, 9, 17, 23, 33, 40][:nreq]
        q, k, v = inputs(sum(plens))
        qsl = torch.tensor([0] + list(torch.tensor(plens).cumsum(0)), dtype=torch.int32)
        for m, b, lay in (("graph", b_graph, layer_graph), ("eager", b_eager, layer_eager)):
            md = b.build(qsl, torch.tensor(plens, dtype=torch.int32), bt, is_prefilling=torch.ones(nreq, dtype=torch.bool))
            lay.forward(q, k, v, *caches[m], md, torch.empty(sum(plens), H, D, dtype=dtype))
        record(range(nreq), plens, q, k, v, None)

        # Capture one decode bucket on static buffers.
        qs, ks, vs = (torch.zeros(BUCKET, H, D, dtype=dtype), torch.zeros(BUCKET, Hkv, D, dtype=dtype),
                      torch.zeros(BUCKET, Hkv, D, dtype=dtype))
        out_s = torch.zeros(BUCKET, H, D, dtype=dtype)
        g = aar.GraphParams("recording")
        dlen = 1 + spec
        ncap = BUCKET // dlen
        md = b_graph.build(torch.arange(ncap + 1, dtype=torch.int32) * dlen,
                           torch.tensor([h[0].shape[0] + dlen for h in hist[:ncap]], dtype=torch.int32),
                           bt[:ncap].contiguous(), num_input_tokens=BUCKET)
        assert md.decode_kernel_rows == BUCKET
        calls_before = comm.calls
        with g.capture(BUCKET):
            layer_graph.forward(qs, ks, vs, *caches["graph"], md, out_s)
        assert comm.calls == calls_before  # the recording capture runs nothing
        kinds = [c[0] for c in g.calls(BUCKET)]
        assert kinds == ["kv_write", "prepare", "fia", "prepare"], kinds
        addrs = g.call_addresses(BUCKET)

        # Decode steps with changing batches and lengths, each padded to the bucket.
        steps = [[0, 1, 2], list(range(ncap)), [1, 3], [0, 2, 3], [2]]
        for reqs in steps:
            reqs = [r for r in reqs if r < ncap]
            qlens = [dlen] * len(reqs)
            T = sum(qlens)
            q, k, v = inputs(T)
            qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
            seq = torch.tensor([hist[r][0].shape[0] + dlen for r in reqs], dtype=torch.int32)
            tab = bt[reqs].contiguous()
            md_g = b_graph.build(qsl, seq, tab, num_input_tokens=BUCKET)
            md_e = b_eager.build(qsl, seq, tab)
            qs.zero_(), ks.zero_(), vs.zero_()
            qs[:T], ks[:T], vs[:T] = q, k, v
            out_s.fill_(float("nan"))
            g.update(BUCKET, md_g)
            before = comm.calls
            g.replay(BUCKET)
            assert comm.calls - before == (2 if W > 1 else 0)  # the query gather and the partials' a2a
            out_e = torch.full((T, H, D), float("nan"), dtype=dtype)
            layer_eager.forward(q, k, v, *caches["eager"], md_e, out_e)
            # Replay == eager (the same kernels on the same rows; padding rows change nothing).
            _close(out_s[:T].double(), out_e.double(), 1e-6 if dtype == torch.float32 else 1e-2, "replay vs eager")
            assert not torch.isnan(out_s).any()  # padding rows merge to 0, never NaN
            record(reqs, qlens, q, k, v, out_s[:T])
            assert g.call_addresses(BUCKET) == addrs
        # A step with a prefill cannot update the bucket, even when its decode rows fill it:
        # the replay would run the decode rows only and skip the prefill.
        r0, r1 = 0, min(1, nreq - 1)
        mixed = b_graph.build(torch.tensor([0, dlen, dlen + 3], dtype=torch.int32),
                              torch.tensor([hist[r0][0].shape[0] + dlen, hist[r1][0].shape[0] + 3], dtype=torch.int32),
                              bt[[r0, r1]].contiguous(), is_prefilling=torch.tensor([False, True]))
        assert mixed.num_prefills == 1
        with pytest.raises(ValueError, match="cannot update a captured bucket"):
            g.update(BUCKET, mixed)
        assert torch.equal(caches["graph"][0], caches["eager"][0])
        assert torch.equal(caches["graph"][1], caches["eager"][1])
        results.append(len(steps))
    return results


GQA_CONFIGS = [
    (16, 1, 4, 1, "float32", 0),    # one KV head per rank
    (16, 2, 2, 2, "float32", 0),    # Hkv = 2: the KV-head-major regroup
    (16, 16, 4, 2, "bfloat16", 0),  # I = B
    (16, 1, 2, 1, "float32", 1),    # speculative decode, 2 tokens per request
]


@pytest.mark.parametrize("world", [1, 2])
def test_gqa_dcp_decode_graph_replays_like_eager(world):
    assert run_ranks(world, _gqa_case, GQA_CONFIGS, deadline_s=120.0) == [[5] * len(GQA_CONFIGS)] * world


MLA_BUCKET = 4


def _mla_case(rank, W, I, dtype_name, spec=0):
    import ascend_attn_rt as aar
    from _mla_reference import rope_tables
    from test_mla_dcp import _local_index, _make_step, _owner, _reference

    mla = aar.mla
    torch.set_num_threads(1)
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    dtype = getattr(torch, dtype_name)
    bs, MB, NB = 16, 8, 40
    # Each step is a _make_step of its own lengths; one seed, so one set of weights for all.
    steps = [[2, 17, 40, 33], [3, 18], [41, 34, 5], [2], [19, 42, 6, 35]]  # [2]: shorter than the group
    qn = 1 + spec  # tokens per decode request (speculative decode: the bucket holds MLA_BUCKET requests)
    steps = [[n + spec for n in seq] for seq in steps]  # a history of at least one token: decodes
    NT = MLA_BUCKET * qn
    st0 = _make_step(W, seq_lens=steps[0], q_lens=[qn] * 4, I=I, dtype=dtype)
    d = st0["d"]
    cos, sin = rope_tables(64, d.R)
    mk = dict(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=MB, block_size=bs, num_blocks=NB,
              cos_table=cos.to(dtype), sin_table=sin.to(dtype), dcp_world_size=W, dcp_rank=rank,
              cp_kv_cache_interleave_size=I, num_speculative_tokens=spec)
    b_graph = mla.MetadataBuilder(graph_decode_padding=True, **mk)
    b_eager = mla.MetadataBuilder(**mk)
    kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
              qk_rope_head_dim=d.R, v_head_dim=d.V, scale=1.0 / math.sqrt(d.P + d.R), dcp_comm=comm, **st0["ws"])
    layer_graph, layer_eager = mla.Impl(**kw), mla.Impl(**kw)
    nope_g, rope_g = torch.zeros(NB, bs, 1, d.L, dtype=dtype), torch.zeros(NB, bs, 1, d.R, dtype=dtype)
    hidden_s, out_s = torch.zeros(NT, d.hidden, dtype=dtype), torch.zeros(NT, d.hidden, dtype=dtype)

    def table_of(st):
        t = torch.zeros(st["B"], MB, dtype=torch.int32)
        t[:, :st["table"].shape[1]] = st["table"]
        return t

    md = b_graph.build(torch.tensor([0, qn], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                       table_of(st0)[:1].contiguous(), num_input_tokens=NT)
    # One decode row per token under DCP speculative decode (docs/design/cp.md §3.3), one per request otherwise.
    rows = NT if spec else MLA_BUCKET
    assert md.decode_num_kernel_reqs == rows and md.decode_seq_lens_list[qn:] == [0] * (rows - qn)
    g = aar.GraphParams("recording")
    with g.capture(NT):
        layer_graph.forward(hidden_s, nope_g, rope_g, md, out_s)
    kinds = [c[0] for c in g.calls(NT)]
    assert kinds == ["prepare", "fia", "prepare"], kinds
    addrs = g.call_addresses(NT)
    tol = 2e-4 if dtype == torch.float32 else 3e-2  # test_mla_dcp's _tol
    for seq in steps:
        B = len(seq)
        st = _make_step(W, seq_lens=seq, q_lens=[qn] * B, I=I, dtype=dtype)
        assert st["nb"] <= NB and st["table"].shape[1] <= MB
        # This rank's context rows (positions < seq - 1) in both caches; garbage elsewhere.
        gcache = torch.Generator().manual_seed(5 + rank)
        nope_g.copy_(torch.randn(NB, bs, 1, d.L, generator=gcache).to(dtype))
        rope_g.copy_(torch.randn(NB, bs, 1, d.R, generator=gcache).to(dtype))
        for r in range(B):
            c, kr = st["rows"][r]
            for p in range(seq[r] - qn):
                if _owner(p, W, I) == rank:
                    li = _local_index(p, W, I)
                    blk, off = int(st["table"][r, li // bs]), li % bs
                    nope_g[blk, off, 0] = c[p].to(dtype)
                    rope_g[blk, off, 0] = kr[p].to(dtype)
        nope_e, rope_e = nope_g.clone(), rope_g.clone()
        hidden = torch.cat([st["xs"][r][seq[r] - qn:] for r in range(B)])
        qsl = torch.arange(B + 1, dtype=torch.int32) * qn
        tab = table_of(st)
        md_g = b_graph.build(qsl, torch.tensor(seq, dtype=torch.int32), tab, num_input_tokens=NT)
        md_e = b_eager.build(qsl, torch.tensor(seq, dtype=torch.int32), tab)
        hidden_s.zero_()
        hidden_s[:B * qn] = hidden
        out_s.fill_(float("nan"))
        g.update(NT, md_g)
        before = comm.calls
        g.replay(NT)
        assert comm.calls - before == 2  # the query gather and the partials' a2a
        out_e = torch.full_like(hidden, 7.0)
        layer_eager.forward(hidden, nope_e, rope_e, md_e, out_e)
        T = B * qn
        _close(out_s[:T].double(), out_e.double(), 1e-5 if dtype == torch.float32 else 1e-2, "replay vs eager")
        assert not torch.isnan(out_s).any() and float(out_s[T:].abs().sum()) == 0.0  # dummies attend nothing
        _close(out_s[:T].double(), _reference(st), tol, "replay vs the float64 reference")
        # The same rows written (the padded bucket's projections may round differently in the
        # last bits: a GEMM over 4 rows instead of B).
        ctol = 1e-5 if dtype == torch.float32 else 1e-2
        _close(nope_g.double(), nope_e.double(), ctol, "latent cache")
        _close(rope_g.double(), rope_e.double(), ctol, "rope cache")
        assert g.call_addresses(NT) == addrs
    return len(steps)


@pytest.mark.parametrize("I,dtype,spec", [(1, "float32", 0), (16, "float32", 0), (2, "bfloat16", 0),
                                          (1, "float32", 1), (2, "bfloat16", 2)])
def test_mla_dcp_decode_graph_replays_like_eager(I, dtype, spec):
    # spec > 0: speculative decode inside the capture (1 + spec tokens per request, per-token rows
    # with the interleave-aware causal lengths of docs/design/cp.md §3.3; a history of one token with I = 2
    # leaves rank 1 with no local key at or before the first queries' positions).
    assert run_ranks(2, _mla_case, I, dtype, spec, deadline_s=120.0) == [5, 5]
