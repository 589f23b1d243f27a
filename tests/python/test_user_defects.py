"""Defects a user hit (issue 26), each with the test that failed before its fix:

- item 2: a shared workspace (MLA decode, SFA indexer, DSA, DCP) used by two threads at once is refused by name
  (eager forwards and CPU graph replays), instead of silently corrupting outputs and caches;
- item 4: a NaN or infinite softmax scale or norm epsilon is refused at construction by every layer;
- item 10: the C8 and head-size-512 prefills over cached context work with a default MetadataBuilder (the
  dense context is computed on demand, once per build), instead of failing at the first chunked step.
(Items 1, 7 and 8's pool parts are in test_sfa_offload.py.)"""

import threading
import time

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import run_ranks
from _harness import check_output, run_forward
from _mla_reference import MlaDims, make_weights, rope_tables
from _reference import make_batch

mla = aar.mla
S = aar.AttentionState
NAN, INF = float("nan"), float("inf")


# ---------------------------------------------------------------- item 4: scale and epsilon

@pytest.mark.parametrize("bad", [NAN, INF, -INF, -0.5])
def test_gqa_family_layers_refuse_a_bad_scale(bad):
    with pytest.raises(ValueError, match=r"scale must be finite and >= 0"):
        aar.AttentionImpl(4, 32, scale=bad)
    with pytest.raises(ValueError, match=r"scale must be finite and >= 0"):
        aar.FA3AttentionImpl(4, 128, scale=bad)
    raw = dict(k_scale=torch.full((64,), 0.5), k_offset=torch.zeros(64), v_scale=torch.full((64,), 0.5),
               v_offset=torch.zeros(64))
    with pytest.raises(ValueError, match=r"scale must be finite and >= 0"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, scale=bad, **raw)


def _cp_layers_with(rank, world, bad):
    import torch.distributed as dist

    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    msgs = []
    for make in (lambda: aar.DcpAttentionImpl(comm, 4, 32, num_kv_heads=1, scale=bad),
                 lambda: aar.cp.PcpAttentionImpl(4, 32, pcp=comm, num_kv_heads=1, scale=bad)):
        try:
            make()
            msgs.append(None)
        except ValueError as e:
            msgs.append(str(e))
    return msgs


def test_context_parallel_layers_refuse_a_nan_scale():
    msgs = run_ranks(1, _cp_layers_with, NAN)[0]
    assert all(m is not None and "scale must be finite" in m for m in msgs), msgs


def _mla_kw(**over):
    d = MlaDims()
    kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
              qk_rope_head_dim=d.R, v_head_dim=d.V, **make_weights(d, torch.float32, torch.Generator().manual_seed(0)))
    kw.update(over)
    return kw


@pytest.mark.parametrize("arg,match", [("scale", "scale must be finite"), ("q_norm_eps", "q_norm_eps must be finite"),
                                       ("kv_norm_eps", "kv_norm_eps must be finite")])
@pytest.mark.parametrize("bad", [NAN, INF])
def test_mla_and_sfa_layers_refuse_a_bad_scale_or_epsilon(arg, match, bad):
    with pytest.raises(ValueError, match=match):
        mla.Impl(**_mla_kw(**{arg: bad}))
    with pytest.raises(ValueError, match=match):
        aar.sfa.Impl(**_mla_kw(**{arg: bad}))
    if arg == "scale":
        d = MlaDims()
        with pytest.raises(ValueError, match=match):
            mla.LatentAttention(num_heads=d.H, kv_lora_rank=d.L, qk_nope_head_dim=d.P, qk_rope_head_dim=d.R,
                                v_head_dim=d.V, scale=bad)


def test_sfa_indexer_and_dsa_refuse_a_nan_epsilon():
    from _sfa_reference import IdxDims, make_indexer_weights

    d, idx = MlaDims(), IdxDims()
    iw = make_indexer_weights(d, idx, torch.float32, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="indexer.k_norm_eps must be finite"):
        aar.sfa.Impl(**_mla_kw(index_n_head=idx.n_head, index_head_dim=idx.D, index_topk=idx.K,
                                indexer_wq_b=iw["wq_b"], indexer_wk=iw["wk"], indexer_weights_proj=iw["weights_proj"],
                                indexer_k_norm_weight=iw["k_norm_weight"], indexer_k_norm_bias=iw["k_norm_bias"],
                                indexer_k_norm_eps=NAN))
    from _dsa_reference import DsaDims, make_dsa_weights

    dd = DsaDims()
    w = make_dsa_weights(dd, torch.bfloat16, torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="eps must be finite"):
        aar.dsa.Impl(w, hidden_size=dd.hidden, num_heads=dd.N, head_dim=dd.D, rope_dim=dd.R, q_lora_rank=dd.q_lora,
                     window=dd.W, compress_ratio=1, index_n_heads=dd.n_idx, index_head_dim=dd.Di, index_topk=dd.K,
                     eps=NAN, o_groups=dd.G, o_lora_rank=dd.o_lora)


# ---------------------------------------------------------------- item 10: the dense context by default

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_head_prefill_over_context_works_with_a_default_builder(gen, dtype):
    b = make_batch([19, 30, 12], [1, 6, 12], num_heads=2, num_kv_heads=1, head_size=512, dtype=dtype, block_size=16,
                   gen=gen)
    res = run_forward(b, state=S.ChunkedPrefill)
    assert res.impl.last_path == "large_head"
    check_output(b, res)
    assert res.md.dense_valid  # computed by the forward that needed it, once for the build


def test_c8_chunked_and_cache_hit_steps_work_with_a_default_builder(gen):
    from test_c8 import make_c8_batch, reference, run as run_c8

    for seq, q, state, n_int8 in (([19, 40, 30, 13], [1, 1, 6, 13], S.ChunkedPrefill, 2),
                                  ([20, 45, 33], [5, 17, 9], S.PrefillCacheHit, 0)):
        cb = make_c8_batch(seq, q, gen=gen)
        res = run_c8(cb, state=state)  # test_c8's builder: no dense_context argument
        assert not res.builder.metadata.dense_valid or res.md.dense_valid
        ref = reference(cb, decode_rows_int8=n_int8)
        torch.testing.assert_close(res.out[:cb.n_act].double(), ref.double(), atol=1e-5, rtol=1e-5)
        # The same step with the dense context computed by the build gives the same output, bit for bit.
        cb2 = make_c8_batch(seq, q, gen=torch.Generator().manual_seed(0))
        cb3 = make_c8_batch(seq, q, gen=torch.Generator().manual_seed(0))
        r2 = run_c8(cb2, state=state, builder_kw=dict(dense_context=True))
        r3 = run_c8(cb3, state=state)
        assert torch.equal(r2.out, r3.out)


def test_on_demand_dense_context_is_refused_inside_a_capture(gen):
    b = make_batch([19, 30], [1, 6], num_heads=2, num_kv_heads=1, head_size=512, dtype=torch.float32, block_size=16,
                   gen=gen)
    builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=16,
                                  num_blocks=b.num_blocks)
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, attn_state=S.ChunkedPrefill)
    impl = aar.AttentionImpl(2, 512, num_kv_heads=1)
    graph = aar.GraphParams("recording")
    out = torch.zeros_like(b.q)
    with pytest.raises((ValueError, NotImplementedError), match="dense_context=True"):
        with graph.capture(b.q.shape[0]):
            impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)


# ---------------------------------------------------------------- item 2: shared workspaces and threads

BUCKET = 4


class _Blocking:
    """A KV connector whose save hook (the forward's last hook, still inside the forward) waits for release."""

    def __init__(self):
        self.inside, self.release = threading.Event(), threading.Event()

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        self.inside.set()
        assert self.release.wait(60)


class _MlaEngine:
    """One MLA decode engine: its own builder, caches and layer (workspace_group `group`), optionally a graph
    with one captured bucket of BUCKET one-token decodes."""

    def __init__(self, group, graph=False, seed=7):
        d = self.d = MlaDims()
        g = torch.Generator().manual_seed(seed)
        self.kw = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                       qk_rope_head_dim=d.R, v_head_dim=d.V, scale=0.1, **make_weights(d, torch.float32, g))
        cos, sin = rope_tables(4 * 16 + 4, d.R)
        self.builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=16,
                                           num_blocks=BUCKET * 4 + 2, cos_table=cos, sin_table=sin)
        self.table = (torch.arange(BUCKET * 4, dtype=torch.int32) + 1).view(BUCKET, 4)
        self.qsl = torch.arange(BUCKET + 1, dtype=torch.int32)
        self.nope = torch.randn(BUCKET * 4 + 2, 16, 1, d.L, generator=g)
        self.rope = torch.randn(BUCKET * 4 + 2, 16, 1, d.R, generator=g)
        self.layer = mla.Impl(workspace_group=group, **self.kw)
        self.hidden = torch.zeros(BUCKET, d.hidden)
        self.out = torch.zeros(BUCKET, d.hidden)
        self.graph = None
        if graph:
            md = self.builder.build(self.qsl, torch.full((BUCKET,), 16, dtype=torch.int32), self.table)
            self.graph = aar.GraphParams("recording")
            with self.graph.capture(BUCKET):
                self.layer.forward(self.hidden, self.nope, self.rope, md, self.out)

    def md(self, seq):
        return self.builder.build(self.qsl, torch.tensor(seq, dtype=torch.int32), self.table)

    def eager(self, x, seq):
        """What a fresh layer (own workspace group) computes for this step on copies of the caches."""
        nope, rope, out = self.nope.clone(), self.rope.clone(), torch.zeros(BUCKET, self.d.hidden)
        mla.Impl(workspace_group=1000, **self.kw).forward(x, nope, rope, self.md(seq), out)
        return out

    def eager_run(self, steps):
        """The outputs of `steps` run eagerly, in order, by a fresh layer on copies of the caches."""
        nope, rope = self.nope.clone(), self.rope.clone()
        layer, outs = mla.Impl(workspace_group=1000, **self.kw), []
        for x, seq in steps:
            outs.append(torch.zeros(BUCKET, self.d.hidden))
            layer.forward(x, nope, rope, self.md(seq), outs[-1])
        return outs

    def replay(self, x, seq):
        self.hidden.copy_(x)
        self.graph.update(BUCKET, self.md(seq))
        self.graph.replay(BUCKET)
        return self.out.clone()


def test_a_replay_is_refused_while_another_thread_is_inside_the_shared_workspace():
    a, b, c = _MlaEngine(0), _MlaEngine(0, graph=True), _MlaEngine(5, graph=True)
    x, seq = torch.randn(BUCKET, a.d.hidden, generator=torch.Generator().manual_seed(3)), [5, 17, 33, 9]
    want_b, want_c = b.eager(x, seq), c.eager(x, seq)
    hook = _Blocking()
    a.layer.set_kv_connector(hook, "layer.0")
    md_a = a.md(seq)
    t = threading.Thread(target=lambda: a.layer.forward(x, a.nope, a.rope, md_a, a.out))
    t.start()
    try:
        assert hook.inside.wait(60)
        nope_b = b.nope.clone()
        # a's forward holds workspace group 0: b's replay (group 0) is refused before it runs anything ...
        with pytest.raises(ValueError, match="MLA decode workspace of workspace_group 0 is in use by another thread"):
            b.replay(x, seq)
        assert torch.equal(b.nope, nope_b)
        # ... an eager forward of group 0 too, and another group's replay runs.
        with pytest.raises(ValueError, match="workspace_group 0 is in use"):
            b.layer.forward(x, b.nope.clone(), b.rope.clone(), b.md(seq), torch.zeros_like(x))
        assert torch.equal(c.replay(x, seq), want_c)
    finally:
        hook.release.set()
        t.join(60)
    assert torch.equal(b.replay(x, seq), want_b)  # free again once a has left


def test_replays_on_two_threads_never_corrupt_each_other():
    # Two engines of one shape and the default workspace group replaying concurrently: every replay either
    # completes with exactly the eager result or is refused by name; nothing is corrupted silently.
    engines = [_MlaEngine(0, graph=True, seed=s) for s in (7, 8)]
    g = torch.Generator().manual_seed(4)
    steps = [(torch.randn(BUCKET, engines[0].d.hidden, generator=g), [5 + i, 17, 33 - i, 9]) for i in range(12)]
    wanted = [e.eager_run(steps) for e in engines]
    got, refused = [[], []], [0, 0]

    def run(i):
        e = engines[i]
        for k, (x, seq) in enumerate(steps):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    got[i].append((k, e.replay(x, seq)))
                    break
                except ValueError as err:  # refused before anything ran: retry the step
                    assert "in use by another thread" in str(err)
                    refused[i] += 1
                    time.sleep(0.001)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        assert [k for k, _ in got[i]] == list(range(len(steps)))
        for k, out in got[i]:
            assert torch.equal(out, wanted[i][k]), (i, k)
