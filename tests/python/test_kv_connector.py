"""KV-connector hooks (kv_connector.h) on every backend, through the vLLM-style adapter: a recording
connector sees wait_for_layer_load -> on_kv_cache_written -> save_kv_layer once per eager forward, with
the layer's name, its cache tensors (the very tensors given to forward) and the forward's metadata
object; outputs equal a run without a connector (and the float64 reference where checked); a throwing
connector surfaces as RuntimeError naming the hook and the layer, with the cache state the contract
states; and the attention-buffer registry."""

import threading

import pytest
import torch

import ascend_attn_rt as aar
from ascend_attn_rt.kv_connector import VllmConnectorAdapter, attach, detach
from _harness import check_cache_unchanged, check_cache_written, check_output, make_builder, make_impl
from _reference import SENTINEL, make_batch, new_output


class Recorder:
    """A vLLM-shaped worker connector that records its calls; `fail` names a hook to raise in."""

    def __init__(self, fail=None, notify=True):
        self.calls, self.fail = [], fail
        if notify:
            self.on_kv_cache_written = self._written

    def _maybe_fail(self, hook):
        if self.fail == hook:
            raise ConnectionError(f"transfer of {hook} broke")

    def wait_for_layer_load(self, layer_name):
        self.calls.append(("wait_for_layer_load", layer_name))
        self._maybe_fail("wait_for_layer_load")

    def _written(self, layer_name, wrote_cache):
        self.calls.append(("on_kv_cache_written", layer_name, wrote_cache))
        self._maybe_fail("on_kv_cache_written")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        self.calls.append(("save_kv_layer", layer_name, kv_layer, attn_metadata))
        self._maybe_fail("save_kv_layer")


def check_calls(rec, name, caches, md, wrote=True, forwards=1):
    assert [c[0] for c in rec.calls] == ["wait_for_layer_load", "on_kv_cache_written", "save_kv_layer"] * forwards
    for i in range(forwards):
        w, n, s = rec.calls[3 * i: 3 * i + 3]
        assert w == ("wait_for_layer_load", name)
        assert n == ("on_kv_cache_written", name, wrote)
        assert s[1] == name and s[3] is md
        kv = s[2]
        assert isinstance(kv, tuple) and len(kv) == len(caches)
        for got, want in zip(kv, caches):
            assert got.data_ptr() == want.data_ptr() and got.shape == want.shape


# ------------------------------------------------------------------------------------------------ GQA


def gqa_case(gen, seq=(37, 5, 60), q=(1, 1, 9), **kw):
    b = make_batch(list(seq), list(q), num_heads=4, num_kv_heads=2, head_size=32, dtype=torch.float32, block_size=16,
                   gen=gen, **kw)
    md = make_builder(b).build(b.query_start_loc, b.seq_lens_t, b.block_table, num_input_tokens=b.num_input_tokens)
    return b, md


def run_gqa(b, md, impl, pass_kv=True):
    from types import SimpleNamespace
    r = SimpleNamespace(md=md, impl=impl, kc_before=b.key_cache.clone(), vc_before=b.value_cache.clone(),
                        out=new_output(b))
    r.ret = impl.forward(b.q, b.k if pass_kv else None, b.v if pass_kv else None, b.key_cache, b.value_cache, md,
                         r.out)
    return r


def test_gqa_order_arguments_and_output(gen):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder()
    attach(rec, {"model.layers.0.self_attn.attn": impl})
    assert impl.kv_layer_name() == "model.layers.0.self_attn.attn"
    assert isinstance(impl.kv_connector(), VllmConnectorAdapter)
    r = run_gqa(b, md, impl)
    check_output(b, r)
    check_cache_written(b, r)
    check_calls(rec, "model.layers.0.self_attn.attn", [b.key_cache, b.value_cache], md)
    # a second forward: three more calls; detach: none
    impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, new_output(b))
    check_calls(rec, "model.layers.0.self_attn.attn", [b.key_cache, b.value_cache], md, forwards=2)
    detach({"model.layers.0.self_attn.attn": impl})
    impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, new_output(b))
    assert len(rec.calls) == 6 and impl.kv_connector() is None


def test_gqa_layer_without_cache_write_still_waits_and_saves(gen):
    # KV-sharing layer / key=None: reads the cache, writes nothing; vLLM still calls its hooks
    b, md = gqa_case(gen, write_new_tokens=True)
    impl = make_impl(b)
    rec = Recorder()
    impl.set_kv_connector(VllmConnectorAdapter(rec), "shared")
    r = run_gqa(b, md, impl, pass_kv=False)
    check_output(b, r)
    check_cache_unchanged(b, r)
    check_calls(rec, "shared", [b.key_cache, b.value_cache], md, wrote=False)


def test_vllm_connector_without_notify_method(gen):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder(notify=False)
    attach(rec, {"l0": impl})
    run_gqa(b, md, impl)
    assert [c[0] for c in rec.calls] == ["wait_for_layer_load", "save_kv_layer"]


def test_profiling_run_calls_no_hook(gen):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder()
    attach(rec, {"l0": impl})
    out = new_output(b)
    impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, None, out)
    assert rec.calls == [] and bool((out == 0).all())


def test_bad_input_calls_no_hook(gen):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder()
    attach(rec, {"l0": impl})
    with pytest.raises(ValueError):
        impl.forward(b.q[:, :2], b.k, b.v, b.key_cache, b.value_cache, md, new_output(b))
    assert rec.calls == []


def test_throwing_wait_leaves_cache_and_output_untouched(gen):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder(fail="wait_for_layer_load")
    attach(rec, {"model.layers.3.attn": impl})
    with pytest.raises(RuntimeError, match=r"wait_for_layer_load\(layer 'model.layers.3.attn'\) failed.*"
                                           r"transfer of wait_for_layer_load broke"):
        r = run_gqa(b, md, impl)
    kc, vc = b.key_cache.clone(), b.value_cache.clone()
    out = new_output(b)
    with pytest.raises(RuntimeError):
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
    assert torch.equal(kc, b.key_cache) and torch.equal(vc, b.value_cache)
    assert bool((out == SENTINEL).all())
    assert [c[0] for c in rec.calls] == ["wait_for_layer_load"] * 2


@pytest.mark.parametrize("hook", ["on_kv_cache_written", "save_kv_layer"])
def test_throwing_after_the_write_keeps_the_forward_results(gen, hook):
    b, md = gqa_case(gen)
    impl = make_impl(b)
    rec = Recorder(fail=hook)
    attach(rec, {"layer7": impl})
    from types import SimpleNamespace
    r = SimpleNamespace(md=md, impl=impl, kc_before=b.key_cache.clone(), vc_before=b.value_cache.clone(),
                        out=new_output(b))
    with pytest.raises(RuntimeError, match=rf"KV connector hook {hook}\(layer 'layer7'\) failed"):
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, r.out)
    r.ret = r.out
    check_cache_written(b, r)
    check_output(b, r)
    want = ["wait_for_layer_load", "on_kv_cache_written"] + (["save_kv_layer"] if hook == "save_kv_layer" else [])
    assert [c[0] for c in rec.calls] == want


def test_set_kv_connector_rejects_objects_without_the_api(gen):
    b, _ = gqa_case(gen)
    impl = make_impl(b)
    with pytest.raises(ValueError, match="connector must have a wait_for_layer_load method"):
        impl.set_kv_connector(object(), "l0")
    with pytest.raises(TypeError, match="save_kv_layer"):
        VllmConnectorAdapter(type("C", (), {"wait_for_layer_load": lambda self, n: None})())


def test_graph_capture_with_a_connector_is_refused(gen):
    b, md = gqa_case(gen, seq=(37, 5), q=(1, 1))
    impl = make_impl(b)
    attach(Recorder(), {"l0": impl})
    g = aar.GraphParams("recording")
    kc = b.key_cache.clone()
    with pytest.raises(NotImplementedError, match="KV connector hooks inside a graph capture \\(layer 'l0'\\)"):
        with g.capture(md.num_input_tokens):
            impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, new_output(b))
    assert torch.equal(kc, b.key_cache)


# ------------------------------------------------------------------------------------------------ C8, FA3


def test_c8_hooks(gen):
    import test_c8 as c8t
    b = c8t.make_c8_batch([37, 5, 60], [1, 1, 9], gen=gen)
    md = c8t.make_builder(b).build(b.qsl, b.seq_lens_t, b.block_table, num_input_tokens=b.num_input_tokens)
    outs = []
    for rec in (None, Recorder()):
        impl = c8t.make_impl(b)
        if rec is not None:
            attach(rec, {"c8": impl})
        kc, vc = b.key_cache.clone(), b.value_cache.clone()
        out = torch.full(b.q.shape, SENTINEL, dtype=b.q.dtype)
        impl.forward(b.q, b.k, b.v, kc, vc, md, out)
        outs.append((out, kc, vc))
    check_calls(rec, "c8", [outs[1][1], outs[1][2]], md)
    for x, y in zip(*outs):
        assert torch.equal(x, y)


def test_fa3_hooks(gen):
    import test_fa3 as f
    b = make_batch([37, 140, 60], [1, 1, 9], num_heads=f.N, num_kv_heads=f.NKV, head_size=f.D, dtype=torch.float32,
                   block_size=f.BS, gen=gen)
    md = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=f.BS,
                             num_blocks=b.num_blocks).build(b.query_start_loc, b.seq_lens_t, b.block_table)
    impl = aar.FA3AttentionImpl(f.N, f.D, num_kv_heads=f.NKV)
    rec = Recorder()
    attach(rec, {"fa3": impl})
    from types import SimpleNamespace
    r = SimpleNamespace(md=md, impl=impl, kc_before=b.key_cache.clone(), vc_before=b.value_cache.clone(),
                        out=new_output(b))
    r.ret = impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, r.out)
    check_output(b, r)
    check_cache_written(b, r)
    check_calls(rec, "fa3", [b.key_cache, b.value_cache], md)


# ------------------------------------------------------------------------------------------------ MLA, SFA, DSA


def test_mla_hooks_decode_and_mixed():
    import test_mla_decode_workspace as mw
    from _mla_reference import MlaDims
    calls = {}

    def after_step(i, layers):
        for j, layer in enumerate(layers):
            rec = layer.impl.kv_connector().connector
            calls.setdefault(j, []).extend(rec.calls)
            rec.calls.clear()

    recs = []
    orig = mw.Layer.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        rec = Recorder()
        recs.append(rec)
        attach(rec, {f"mla.{len(recs) - 1}": self.impl})

    mw.Layer.__init__ = init
    try:
        layers = mw.run_steps(MlaDims(), torch.float32, False, [[0, 1], [0, 1, 2]], after_step=after_step)
    finally:
        mw.Layer.__init__ = orig
    for j, layer in enumerate(layers):
        got = calls[j]
        assert [c[0] for c in got] == ["wait_for_layer_load", "on_kv_cache_written", "save_kv_layer"] * 2
        assert all(c[1] == f"mla.{j}" for c in got)
        kv = got[2][2]
        assert kv[0].data_ptr() == layer.nope.data_ptr() and kv[1].data_ptr() == layer.rope.data_ptr()
        assert isinstance(got[2][3], aar.mla.Metadata)


def test_sfa_hooks_indexer_and_reusing_layer():
    import test_sfa as st
    seq, ql = [40, 9], [1, 9]
    m = st.Model(seq)
    for r, (s, q) in enumerate(zip(seq, ql)):
        m.fill(r, s - q)
    md = m.builder().build(st._qsl(ql), torch.tensor(seq, dtype=torch.int32), m.table, num_input_tokens=sum(ql))
    hidden = torch.cat([m.xs[r][s - q:] for r, (s, q) in enumerate(zip(seq, ql))])
    base = m.impl()
    ref = torch.full_like(hidden, 7.0)
    nope0, rope0, k0 = m.nope.clone(), m.rope.clone(), m.idx_k.clone()
    base.forward(hidden, m.caches(), md, ref)
    m.nope.copy_(nope0), m.rope.copy_(rope0), m.idx_k.copy_(k0)
    impl = m.impl()
    rec = Recorder()
    attach(rec, {"sfa.0": impl})
    out = torch.full_like(hidden, 7.0)
    caches = m.caches()
    impl.forward(hidden, caches, md, out)
    assert torch.equal(out, ref)
    check_calls(rec, "sfa.0", caches, md)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_dsa_hooks_every_layer_kind(ratio):
    import test_dsa as td
    from _dsa_harness import LayerRun
    d = td.dims(ratio)
    run = LayerRun(d, "a2", torch.float32, 2)
    base = LayerRun(d, "a2", torch.float32, 2)
    rec = Recorder()
    attach(rec, {f"dsa.c{ratio}": run.impl})
    for reqs, ql in (([0, 1], [9, 5]), ([0, 1], [1, 1])):
        out, _, _ = run.step(reqs, ql)
        ref, _, _ = base.step(reqs, ql)
        assert torch.equal(out, ref)
    assert [c[0] for c in rec.calls] == ["wait_for_layer_load", "on_kv_cache_written", "save_kv_layer"] * 2
    save = rec.calls[-1]
    assert save[1] == f"dsa.c{ratio}" and isinstance(save[3], aar.dsa.StepMetadata)
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    assert [ptr(t) for t in save[2]] == [ptr(t) for t in run.kv]


# ------------------------------------------------------------------------------------------------ buffers


def test_attention_buffer_registry_same_storage_and_conflicts():
    name = "test.kv_connector.buf"
    a = aar.get_or_register_attention_buffer(name, [4, 8], torch.float16, "cpu", zero_init=True)
    b = aar.get_or_register_attention_buffer(name, [4, 8], torch.float16, "cpu")
    assert a.data_ptr() == b.data_ptr() and bool((a == 0).all()) and name in aar.attention_buffer_names()
    with pytest.raises(ValueError, match=r"'test.kv_connector.buf'.*registered with shape \[4, 8\], dtype Half.*"
                                         r"requested with shape \[4, 9\], dtype Half"):
        aar.get_or_register_attention_buffer(name, [4, 9], torch.float16, "cpu")
    with pytest.raises(ValueError, match="requested with shape \\[4, 8\\], dtype Float"):
        aar.get_or_register_attention_buffer(name, [4, 8], torch.float32, "cpu")
    with pytest.raises(ValueError, match="negative size"):
        aar.get_or_register_attention_buffer("test.neg", [4, -1], torch.float32, "cpu")
    with pytest.raises(ValueError, match="dtype must be a torch.dtype"):
        aar.get_or_register_attention_buffer("test.dt", [4], "float32", "cpu")
    assert aar.release_attention_buffer(name) and not aar.release_attention_buffer(name)
    c = aar.get_or_register_attention_buffer(name, [4, 9], torch.float16, "cpu")
    assert c.shape == (4, 9) and a.data_ptr() != 0  # a keeps its storage after the release
    aar.release_attention_buffer(name)


def test_attention_buffer_registry_threads_agree():
    name = "test.kv_connector.threads"
    ptrs, errs = [], []

    def worker():
        try:
            for _ in range(50):
                ptrs.append(aar.get_or_register_attention_buffer(name, [1024], torch.float32, "cpu").data_ptr())
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs and len(set(ptrs)) == 1 and len(ptrs) == 200
    aar.release_attention_buffer(name)


def test_mla_decode_workspace_lives_in_the_registry():
    import gc

    import test_mla_decode_workspace as mw
    from _mla_reference import MlaDims
    gc.collect()
    before = set(aar.attention_buffer_names())
    # a shape no other test uses (6 heads), so the workspace is this test's own
    layers = mw.run_steps(MlaDims(H=6), torch.float32, False, [[0], [0, 1, 2]])
    names = sorted(set(aar.attention_buffer_names()) - before)
    assert names and all(n.startswith("mla.decode_workspace/") for n in names)
    kinds = {n.split("/")[-2] for n in names}
    assert kinds == {"kv_raw", "qa", "qc", "q", "qn", "qr", "attn", "y"}
    # grown from 1 to 3 tokens: only the last capacity stays registered
    assert {n.split("/")[-1] for n in names} == {"cap3"}
    del layers
    gc.collect()
    assert not set(aar.attention_buffer_names()) - before
