"""Decode graphs of the vLLM DeepSeek-V4 adapter (docs/design/vllm_dsa.md §6) on vLLM 0.27.1's own layer code: the
three-layer model of test_vllm_dsa (layer 0 SWA-only, layer 1 C128, layer 2 C4; every cache through vLLM's own
KV-cache grouping and allocation, one builder per KV-cache group, nine groups of which three are SWA groups) under
cudagraph_mode=FULL_DECODE_ONLY.

A decode bucket of four one-token requests is captured as vLLM captures it: every group builder's
build_for_cudagraph_capture over vLLM's capture batch, then every layer's forward (AscendAttnRtDsaAttention.forward,
vLLM's layer) in a forward context of cudagraph_runtime_mode FULL inside ascend_attn_rt.vllm.graph.capture, on the
recording provider (nothing runs: the caches stay as they were). Then three steps of fewer real requests than the
bucket, padded as vLLM's runner pads a full-graph batch (empty requests, KV length 0, table row 0), go through
every builder's build, graph.update with vLLM's per-layer metadata dict and graph.replay; each step's outputs and
caches equal an eager run of the same requests without padding (the caches restored between the two), and every
real request's output the float64 reference (_dsa_reference.dsa_layer; C4 with the runtime's top-k, as
test_vllm_dsa). The dynamic inputs of a replay are the hidden states in the static buffer the capture saw (the
recording provider replays the runtime's calls: the whole attention block of each layer here).

Refusals: the declared cudagraph support read through vLLM, a FULL runtime-mode step with prefills and one
without a graph provider, a prefill step and a mis-sized step at update, an update without the SWA groups'
metadata or with only some of them, bad swa lists for aar.dsa.graph_update, a weight changed after the capture."""

import copy

import pytest
import torch

pytest.importorskip("vllm.v1.attention.backend", reason="vLLM 0.27.1 not importable")
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402

import ascend_attn_rt as aar  # noqa: E402
import ascend_attn_rt.vllm as aar_vllm  # noqa: E402
from ascend_attn_rt.vllm import graph as vgraph  # noqa: E402
from ascend_attn_rt.vllm.dsa import _BACKEND_OF  # noqa: E402
from test_vllm_dsa import (CompressedModel, _cmp_config, _common_metadata, registered, vllm_dist)  # noqa: E402,F401

B = 4  # the bucket: four one-token decodes
NREQ = 3
FULL = CUDAGraphMode.FULL


def _graph_config(dtype, spec=0):
    cfg = _cmp_config(dtype, spec)
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    return cfg


def _padded_cam(seq_lens, bt, bs, q=1):
    """vLLM's runner's padded full-graph batch of one group: the real uniform decodes of q tokens (q > 1: speculative,
    a bucket of B requests of q tokens), then empty requests (no tokens, KV length 0, block-table row 0, slot -1)
    up to the bucket's B requests, num_actual_tokens the bucket's B q tokens."""
    n = len(seq_lens)
    real, _ = _common_metadata([q] * n, seq_lens, bt, bs)
    qsl = torch.tensor(real.query_start_loc_cpu.tolist() + [n * q] * (B - n), dtype=torch.int32)
    sl = torch.tensor(list(seq_lens) + [0] * (B - n), dtype=torch.int32)
    rows = torch.zeros(B, bt.shape[1], dtype=torch.int32)
    rows[:n] = bt
    slots = torch.cat([real.slot_mapping, torch.full(((B - n) * q,), -1, dtype=torch.int64)])
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=sl, num_reqs=B, num_actual_tokens=B * q,
        max_query_len=q, max_seq_len=max(seq_lens), block_table_tensor=rows, slot_mapping=slots, _seq_lens_cpu=sl)


def _metadata(m, cams):
    md = {}
    for g, b, cam in zip(m.groups, m.builders, cams):
        x = b.build(0, cam)
        for name in g.layer_names:
            md[name] = x
    return md


def _buffer(m):
    """The one KV-cache buffer every group's caches are views of (vLLM's KVCacheTensor), as bytes."""
    storage = m.layers[0].swa_cache_layer.kv_cache.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _caches(m):
    return {f"{i}.{k}": c.kv_cache for i, layer in enumerate(m.layers) for k, c in layer._cache_layers().items()}


def _group_pages(m):
    """{cache name as _caches names it: the pages (block ids) its KV-cache group's table holds}."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    name_of = {id(mod): n for n, mod in get_layers_from_vllm_config(m.cfg, AttentionLayerBase).items()}
    table_of = {g.layer_names[0]: t for g, t in zip(m.groups, m.tables)}
    return {f"{i}.{k}": torch.unique(table_of[name_of[id(c)]].to(torch.int64))
            for i, layer in enumerate(m.layers) for k, c in layer._cache_layers().items()}


class Bucket:
    """The model of test_vllm_dsa with context written for NREQ requests, a decode bucket captured through the
    adapter."""

    def __init__(self, monkeypatch, dtype, prefill, npu=None, spec=0):
        self.m = m = CompressedModel(_graph_config(dtype, spec), monkeypatch, NREQ, torch.Generator().manual_seed(29))
        self.S = list(prefill)
        m.step(list(range(NREQ)), self.S, self.S)  # the context: one prefill step, eagerly
        self.store = (vgraph.set_graph_provider("recording") if npu is None
                      else vgraph.set_graph_provider("torch_npu", npu=npu))
        self.device_graph = None if npu is None else npu.NPUGraph()
        hf = m.cfg.model_config.hf_config
        self.hidden = torch.zeros(B, hf.hidden_size, dtype=dtype)  # vLLM's static input buffer
        # vLLM's capture batch (_dummy_run): B / q requests of q = 1 + spec tokens and KV length q, the tables' rows
        # as they are.
        q = 1 + spec
        cams = [_common_metadata([q] * (B // q), [q] * (B // q), torch.zeros(B // q, t.shape[1], dtype=torch.int32),
                                 g.kv_cache_spec.block_size)[0] for g, t in zip(m.groups, m.tables)]
        md = {}
        for g, b, cam in zip(m.groups, m.builders, cams):
            x = b.build_for_cudagraph_capture(cam)
            for name in g.layer_names:
                md[name] = x
        before = _buffer(m).clone()
        with vgraph.capture(B, device_graph=self.device_graph), \
                set_forward_context(md, m.cfg, cudagraph_runtime_mode=FULL):
            self.outs = [layer(torch.zeros(B, dtype=torch.int64), self.hidden) for layer in m.layers]
        if npu is None:
            assert torch.equal(_buffer(m), before), "the recording provider runs nothing at capture"
        assert len(self.store.calls(B)) == len(m.layers)  # one recorded call per layer

    def step(self, reqs):
        m, n = self.m, len(reqs)
        S = [self.S[r] + 1 for r in reqs]
        x = torch.cat([m.x[r][s - 1: s] for r, s in zip(reqs, S)])
        # Eager: the same requests without padding (what vLLM runs without graphs), then the caches restored.
        buf = _buffer(m)
        saved = buf.clone()
        eager, _ = m.step(reqs, S, [1] * n)
        eager_topk = m.layers[2]._impl.last_topk[:n].clone()
        eager_buf = buf.clone()
        buf.copy_(saved)
        # The graph step: vLLM's padded batch through every builder, the update, the replay.
        cams = [_padded_cam(S, t[reqs], g.kv_cache_spec.block_size) for g, t in zip(m.groups, m.tables)]
        md = _metadata(m, cams)
        self.hidden.zero_()
        self.hidden[:n] = x
        for o in self.outs:
            o.fill_(float("nan"))
        vgraph.update(B, md)
        vgraph.replay(B)
        for r, s in zip(reqs, S):
            self.S[r] = s
        return S, eager, eager_topk, eager_buf


def _check_step(bk, reqs, S, eager, eager_topk, eager_buf, dtype):
    m, n = bk.m, len(reqs)
    topk = m.layers[2]._impl.last_topk[:n]
    assert torch.equal(topk, eager_topk)
    at, rt = (2e-5, 1e-5) if dtype == torch.float32 else (3e-2, 3e-2)
    for i, (out, want) in enumerate(zip(bk.outs, eager)):
        assert torch.isfinite(out).all(), f"layer {i}: every bucket row written (padding rows too)"
        torch.testing.assert_close(out[:n], want, atol=at, rtol=rt, msg=lambda e: f"layer {i} replay vs eager: {e}")
        for j, (r, s) in enumerate(zip(reqs, S)):
            tk = topk[j: j + 1, 0].to(torch.int64) if i == 2 else None
            ref = m.reference(i, r, s, 1, tk)
            a = at * max(1.0, float(ref.abs().max())) if dtype != torch.float32 else at
            torch.testing.assert_close(out[j: j + 1].double(), ref, atol=a, rtol=rt,
                                       msg=lambda e: f"layer {i} request {r} vs the float64 reference: {e}")
    # The caches: as the eager step left them, except the null block 0 (the padding requests' compressor state).
    # Every view spans the whole buffer, whose pages the groups share out (each group's table draws its own); the
    # indexer's byte pages are compared bit for bit on the pages of its group, since the pages of the other groups
    # hold fp32 compressor states, whose last bits may differ between the eager step's row count and the bucket's
    # (the CPU GEMMs' rounding depends on the rows); every view is compared at the dtype's tolerance below.
    replayed = _buffer(m).clone()
    buf = _buffer(m)
    own = _group_pages(m)
    for name, c in _caches(m).items():
        got = c[1:].clone()
        buf.copy_(eager_buf)
        want = c[1:].clone()
        buf.copy_(replayed)
        if got.dtype == torch.uint8:
            pages = own[name] - 1
            assert torch.equal(got[pages], want[pages]), name
        else:
            # equal_nan: every view spans the one buffer, whose other caches' bytes (indexer pages) may read as NaN
            torch.testing.assert_close(got, want, atol=at, rtol=rt, equal_nan=True,
                                       msg=lambda e: f"cache {name}: {e}")


@pytest.fixture
def graph_store():
    try:
        yield
    finally:
        vgraph.clear_graph_provider()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_bucket_through_vllm_layers_replays_like_eager(vllm_dist, registered, monkeypatch, graph_store, dtype):
    aar_vllm.register(family="deepseek_v4")
    # Prefills near a C128 boundary (127: the first replay completes a C128 row) and a C4 boundary.
    bk = Bucket(monkeypatch, dtype, [127, 61, 254])
    for reqs in ([0, 1, 2], [2, 0], [1]):
        S, eager, topk, eager_buf = bk.step(reqs)
        _check_step(bk, reqs, S, eager, topk, eager_buf, dtype)


def test_graph_refusals(vllm_dist, registered, monkeypatch, graph_store):
    aar_vllm.register(family="deepseek_v4")
    bk = Bucket(monkeypatch, torch.float32, [20, 9, 30])
    m = bk.m
    # What every DeepSeek-V4 builder declares, read through vLLM.
    for g, b in zip(m.groups, m.builders):
        assert type(b).get_cudagraph_support(m.cfg, g.kv_cache_spec) is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert {type(b) for b in m.builders} == {be.get_builder_cls() for be in _BACKEND_OF.values()}
    # A step with a prefill under a FULL runtime mode, at the layer and at the update.
    cams = [_common_metadata([1, 4], [bk.S[0] + 1, bk.S[1] + 4], t[[0, 1]], g.kv_cache_spec.block_size)[0]
            for g, t in zip(m.groups, m.tables)]
    md = _metadata(m, cams)
    x = torch.zeros(5, m.cfg.model_config.hf_config.hidden_size)
    with set_forward_context(md, m.cfg, cudagraph_runtime_mode=FULL), \
            pytest.raises(NotImplementedError, match="cudagraph_runtime_mode=FULL with 1 prefill requests"):
        m.layers[0](torch.zeros(5, dtype=torch.int64), x)
    with pytest.raises(ValueError, match="a step with 1 prefill requests cannot update a decode graph bucket"):
        vgraph.update(B, md)
    # A decode step of more tokens than the bucket (five requests padded to none), the runtime's check.
    bt = [t[[0, 1, 2, 0, 1]] for t in m.tables]
    cams = [_common_metadata([1] * 5, [bk.S[r] + 1 for r in (0, 1, 2, 0, 1)], b, g.kv_cache_spec.block_size)[0]
            for g, b in zip(m.groups, bt)]
    md5 = _metadata(m, cams)
    with pytest.raises(ValueError, match="captured for 4 tokens of 4 requests"):
        vgraph.update(B, md5)
    # An update without the SWA groups' metadata (one group's entries only).
    cams = [_padded_cam([bk.S[0] + 1], t[[0]], g.kv_cache_spec.block_size) for g, t in zip(m.groups, m.tables)]
    md = _metadata(m, cams)
    with pytest.raises(ValueError, match="no metadata of the SWA group"):
        vgraph.update(B, {k: v for k, v in md.items() if v.kind == "c128_kv"})
    # Only the first SWA group's metadata: the layers captured in the other groups' slots name theirs (the runtime's
    # check); aar.dsa.graph_update's swa list checked by entry.
    with pytest.raises(ValueError, match="belongs to KV-cache group 1 but 1 group metadata were given"):
        vgraph.update(B, {k: v for k, v in md.items() if v.kind == "swa" and v.graph_group == 0})
    swa0 = next(v for v in md.values() if v.kind == "swa" and v.graph_group == 0)
    with pytest.raises(ValueError, match=r"swa\[1\] must be an aar.dsa.GroupMetadata"):
        aar.dsa.graph_update(vgraph.graph_params(), B, swa0.step, [swa0.group, 3])
    with pytest.raises(ValueError, match="swa must be an aar.dsa.GroupMetadata or a sequence"):
        aar.dsa.graph_update(vgraph.graph_params(), B, swa0.step, "swa")
    # A bucket that was not captured.
    with pytest.raises(ValueError, match="num_tokens=8"):
        vgraph.update(8, md)
    # FULL without a graph provider.
    vgraph.clear_graph_provider()
    with set_forward_context(md, m.cfg, cudagraph_runtime_mode=FULL), \
            pytest.raises(NotImplementedError, match="cudagraph_runtime_mode=FULL without a graph provider"):
        m.layers[1](torch.zeros(B, dtype=torch.int64), bk.hidden)
    # A weight changed after the capture, while the bucket is held: the captured layer would keep the old one.
    vgraph.set_graph_provider("recording")
    bk2 = Bucket(monkeypatch, torch.float32, [20, 9, 30])
    with torch.no_grad():
        bk2.m.layers[2].wo_b.weight.mul_(2)
    cams = [_padded_cam([bk2.S[0] + 1], t[[0]], g.kv_cache_spec.block_size) for g, t in zip(bk2.m.groups, bk2.m.tables)]
    with set_forward_context(_metadata(bk2.m, cams), bk2.m.cfg), \
            pytest.raises(NotImplementedError, match="changed after its graph capture"):
        bk2.m.layers[2](torch.zeros(B, dtype=torch.int64), bk2.hidden)


def test_decode_bucket_through_torch_npu_hooks(vllm_dist, registered, monkeypatch, graph_store):
    """The three layers captured inside a device-graph capture on the torch_npu provider (a double of torch.npu,
    test_vllm_graph.NpuDouble; not run on an NPU): each layer is one plain kernel sequence of the device graph (it
    reads only stable buffers), so the capture makes no task group and no event, and an update re-issues nothing:
    it checks the step against the bucket, waits for the previous replay and enters the update stream; every replay
    needs its update. A step of five requests is refused by the update with no task hook."""
    from test_vllm_graph import NpuDouble

    aar_vllm.register(family="deepseek_v4")
    npu = NpuDouble()
    bk = Bucket(monkeypatch, torch.float32, [20, 9, 30], npu=npu)
    m = bk.m
    assert npu.log == [] and [c[0] for c in bk.store.calls(B)] == ["prepare"] * len(m.layers)
    for reqs in ([0, 1, 2], [2]):
        S = [bk.S[r] + 1 for r in reqs]
        cams = [_padded_cam(S, t[reqs], g.kv_cache_spec.block_size) for g, t in zip(m.groups, m.tables)]
        vgraph.update(B, _metadata(m, cams))
        vgraph.replay(B, bk.device_graph)
        for r, s in zip(reqs, S):
            bk.S[r] = s
    assert npu.log == [("synchronize", "compute"), ("replay",)] * 2
    with pytest.raises(ValueError, match="before update"):
        vgraph.replay(B, bk.device_graph)
    npu.log.clear()
    bt = [t[[0, 1, 2, 0, 1]] for t in m.tables]
    cams = [_common_metadata([1] * 5, [bk.S[r] + 1 for r in (0, 1, 2, 0, 1)], b, g.kv_cache_spec.block_size)[0]
            for g, b in zip(m.groups, bt)]
    with pytest.raises(ValueError, match="captured for 4 tokens of 4 requests"):
        vgraph.update(B, _metadata(m, cams))
    assert npu.log == [("synchronize", "compute")]  # no task hook


def test_speculative_bucket_replays_like_eager(vllm_dist, registered, monkeypatch, graph_store):
    """num_speculative_tokens = 1: every group builder declares UNIFORM_BATCH and captures vLLM's uniform batch of two
    requests of two tokens (state SpecDecoding); steps filling the bucket replay equal to the eager step of the same
    requests, caches included, and (SWA-only and C128 layers) the float64 reference; the C4 layer's speculative decodes
are checked against float64 in test_vllm_dsa (with the runtime's top-k), here against eager."""
    aar_vllm.register(family="deepseek_v4")
    bk = Bucket(monkeypatch, torch.float32, [127, 61, 254], spec=1)
    m = bk.m
    for g, b in zip(m.groups, m.builders):
        assert type(b).get_cudagraph_support(m.cfg, g.kv_cache_spec) is AttentionCGSupport.UNIFORM_BATCH
    with pytest.raises(NotImplementedError, match="uniform decode batches of 2-token requests"):
        m.builders[0].build_for_cudagraph_capture(
            _common_metadata([1] * B, [1] * B, torch.zeros(B, m.tables[0].shape[1], dtype=torch.int32),
                             m.groups[0].kv_cache_spec.block_size)[0])
    for reqs in ([0, 1], [2, 0], [1, 2]):
        S = [bk.S[r] + 2 for r in reqs]
        x = torch.cat([m.x[r][s - 2: s] for r, s in zip(reqs, S)])
        buf = _buffer(m)
        saved = buf.clone()
        eager, _ = m.step(reqs, S, [2, 2])
        eager_buf = buf.clone()
        buf.copy_(saved)
        cams = [_common_metadata([2, 2], S, t[reqs], g.kv_cache_spec.block_size)[0] for g, t in zip(m.groups, m.tables)]
        md = _metadata(m, cams)
        bk.hidden.copy_(x)
        for o in bk.outs:
            o.fill_(float("nan"))
        vgraph.update(B, md)
        vgraph.replay(B)
        for r, s in zip(reqs, S):
            bk.S[r] = s
        for i, (out, want) in enumerate(zip(bk.outs, eager)):
            torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-5, msg=lambda e: f"layer {i}: {e}")
            if i < 2:  # SWA-only and C128: the float64 reference directly (C4's needs the top-k: via eager)
                for j, (r, s) in enumerate(zip(reqs, S)):
                    torch.testing.assert_close(out[2 * j: 2 * j + 2].double(), m.reference(i, r, s, 2), atol=2e-5,
                                               rtol=1e-5, msg=lambda e: f"layer {i} request {r} vs float64: {e}")
        replayed = buf.clone()
        for name, c in _caches(m).items():
            got = c[1:].clone()
            buf.copy_(eager_buf)
            want = c[1:].clone()
            buf.copy_(replayed)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, equal_nan=True, msg=lambda e: f"{name}: {e}")
