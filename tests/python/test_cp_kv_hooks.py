"""KV-connector hooks (kv_connector.h) on the context-parallel layers, over real gloo groups of
2 ranks: aar.DcpAttentionImpl (GQA DCP) and aar.cp.PcpAttentionImpl (legacy sharded and MRV2
replicated PCP). A recording connector on every rank sees wait_for_layer_load ->
on_kv_cache_written -> save_kv_layer once per eager forward, with the layer's name, the very
cache tensors given to forward and the forward's metadata object; the output and the caches
equal a run without a connector; inside a graph capture a forward with a connector is refused
on every rank alike (no collective issued, the capture dropped)."""

import pytest
import torch

from _cp_harness import run_ranks

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

D = 16


class Recorder:
    def __init__(self):
        self.calls = []

    def wait_for_layer_load(self, layer_name):
        self.calls.append(("wait_for_layer_load", layer_name))

    def on_kv_cache_written(self, layer_name, wrote_cache):
        self.calls.append(("on_kv_cache_written", layer_name, wrote_cache))

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        self.calls.append(("save_kv_layer", layer_name, kv_layer, attn_metadata))


def _check_calls(rec, name, caches, mds, wrote):
    assert [c[0] for c in rec.calls] == ["wait_for_layer_load", "on_kv_cache_written", "save_kv_layer"] * len(mds)
    for i, md in enumerate(mds):
        w, n, s = rec.calls[3 * i: 3 * i + 3]
        assert w == ("wait_for_layer_load", name)
        assert n == ("on_kv_cache_written", name, wrote[i])
        assert s[1] == name and s[3] is md
        assert len(s[2]) == len(caches)
        for got, want in zip(s[2], caches):
            assert got.data_ptr() == want.data_ptr() and got.shape == want.shape


def _dcp_case(rank, W):
    import ascend_attn_rt as aar
    from ascend_attn_rt.kv_connector import attach

    torch.set_num_threads(1)
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    H, Hkv, B = 2, 1, 16
    gen = torch.Generator().manual_seed(3)
    bt = torch.arange(1, 7, dtype=torch.int32).view(2, 3)
    kw = dict(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=3, block_size=B, num_blocks=8, dcp_world=W,
              dcp_rank=rank)
    builders = [aar.DcpMetadataBuilder(**kw), aar.DcpMetadataBuilder(**kw)]
    layers = [aar.DcpAttentionImpl(comm, H, D, num_kv_heads=Hkv) for _ in range(2)]
    caches = [(torch.zeros(8, B, Hkv, D), torch.zeros(8, B, Hkv, D)) for _ in range(2)]
    rec = Recorder()
    name = "model.layers.0.self_attn.attn"
    attach(rec, {name: layers[0]})
    steps = [(torch.tensor([0, 9, 14], dtype=torch.int32), torch.tensor([9, 5], dtype=torch.int32), [1, 1]),
             (torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([10, 6], dtype=torch.int32), [0, 0])]
    mds = []
    for qsl, seq, pref in steps:
        T = int(qsl[-1])
        q, k, v = torch.randn(T, H, D, generator=gen), torch.randn(T, Hkv, D, generator=gen), torch.randn(
            T, Hkv, D, generator=gen)
        outs = []
        for i in range(2):  # with the connector, then the twin without
            md = builders[i].build(qsl, seq, bt, is_prefilling=torch.tensor(pref, dtype=torch.bool))
            if i == 0:
                mds.append(md)
            out = torch.empty(T, H, D)
            layers[i].forward(q, k, v, *caches[i], md, out)
            outs.append(out)
        assert torch.equal(outs[0], outs[1])
        assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    # A KV-sharing layer (no write of its own) still gets all three hooks, wrote = False.
    sharing = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=Hkv, kv_sharing=True)
    attach(rec, {name: sharing})
    md = builders[0].build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([11], dtype=torch.int32),
                           bt[:1].contiguous())
    sharing.forward(torch.randn(1, H, D), torch.randn(1, Hkv, D), torch.randn(1, Hkv, D), *caches[0], md,
                    torch.empty(1, H, D))
    mds.append(md)
    _check_calls(rec, name, caches[0], mds, [True, True, False])
    # Graph capture with a connector: refused, the capture dropped, no collective issued.
    g = aar.GraphParams("recording")
    md = builders[0].build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([12], dtype=torch.int32),
                           bt[:1].contiguous(), num_input_tokens=4)
    before = comm.calls
    with pytest.raises(NotImplementedError, match="KV connector hooks inside a graph capture"):
        with g.capture(4):
            layers[0].forward(torch.zeros(4, H, D), torch.zeros(4, Hkv, D), torch.zeros(4, Hkv, D), *caches[0], md,
                              torch.zeros(4, H, D))
    assert not g.has(4) and comm.calls == before
    return len(rec.calls)


def test_dcp_layer_calls_the_connector_hooks():
    assert run_ranks(2, _dcp_case) == [9, 9]


def _pcp_case(rank, W, mode):
    import ascend_attn_rt as aar
    from ascend_attn_rt.kv_connector import attach

    torch.set_num_threads(1)
    pcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0)
    H, Hkv, BS = 4, 2, 16
    kw = dict(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=2, block_size=BS, num_blocks=8, pcp_size=W,
              pcp_rank=rank, kv_mode=mode)
    builders = [aar.cp.PcpMetadataBuilder(**kw), aar.cp.PcpMetadataBuilder(**kw)]
    layers = [aar.cp.PcpAttentionImpl(H, D, pcp=pcp, num_kv_heads=Hkv) for _ in range(2)]
    caches = [(torch.zeros(8, BS, Hkv, D), torch.zeros(8, BS, Hkv, D)) for _ in range(2)]
    rec = Recorder()
    name = "model.layers.3.self_attn.attn"
    attach(rec, {name: layers[0]})
    qsl, seq = torch.tensor([0, 7, 12], dtype=torch.int32), torch.tensor([7, 5], dtype=torch.int32)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    outs, mds = [], []
    for i in range(2):
        md = builders[i].build(qsl, seq, bt)
        n = md.num_local_tokens
        g2 = torch.Generator().manual_seed(4)
        q, k, v = torch.randn(n, H, D, generator=g2), torch.randn(n, Hkv, D, generator=g2), torch.randn(
            n, Hkv, D, generator=g2)
        out = torch.empty(n, H, D)
        layers[i].forward(q, k, v, *caches[i], md, out)
        outs.append(out)
        mds.append(md)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    _check_calls(rec, name, caches[0], mds[:1], [True])
    return len(rec.calls)


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_pcp_layer_calls_the_connector_hooks(mode):
    assert run_ranks(2, _pcp_case, mode) == [3, 3]
