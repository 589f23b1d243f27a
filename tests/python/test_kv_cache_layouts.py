"""KV caches the caller owns, in every memory layout a user may hand over (issue 9, part 1; the
swap_blocks bullet of part 4).

The kernels read a cache's memory exactly as the backend declares it: Backend.kv_cache_shape laid
out in Backend.kv_cache_stride_order() (the identity), so a layer takes a cache that is contiguous,
at any storage offset (a block slice cache[a:b], one half or one layer of a stacked allocation).
Every other layout (permuted, head or column slices, padded block strides, as_strided with other
strides, expanded) is rejected with a ValueError that names the argument and gives its strides,
before anything is written. So each case below either gives the float64 reference's output, with
the new tokens written into the caller's memory and nowhere else, or is rejected and leaves every
byte as it was; never silently wrong. Caches bound by a layer are rebound when the same tensor
object is moved to other memory (set_, resize_, as_strided_) or a new tensor appears at a freed
one's address. swap_blocks / copy_blocks go through torch indexing, which honours strides: any
non-overlapping layout works, and everything is validated before the first copy.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import ascend_attn_rt as aar
from _harness import make_builder as gqa_builder
from _reference import assert_close, make_batch, new_output
from test_c8 import make_builder as c8_builder
from test_c8 import make_c8_batch, make_impl as c8_impl, ref_quant
from test_c8 import reference as c8_reference
from test_mla import _tol as mla_tol
from test_mla import setup_case as mla_case

S = aar.AttentionState
mla = aar.mla


# ----------------------------------------------------------------------------- layouts


def contiguous_strides(shape):
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= max(n, 1)
    return tuple(reversed(out))


def garbage(shape, dtype, gen):
    if dtype == torch.int8:
        return torch.randint(-128, 128, tuple(shape), generator=gen, dtype=torch.int8)
    return (torch.randn(*shape, generator=gen) * 50).to(dtype)


def relayout(cache, kind, gen):
    """The logical content of `cache` in another memory layout. Returns (view, base, make): `view`
    is what the layer is given, `base` a contiguous tensor owning every byte `view` may touch
    (garbage elsewhere), and make(t) applies the same view to a tensor shaped like `base`."""
    shape, dt = list(cache.shape), cache.dtype
    nb, rest = shape[0], shape[1:]
    per = math.prod(rest)
    strides = contiguous_strides(shape)
    if kind == "contiguous":
        make = lambda t: t  # noqa: E731
        base_shape = shape
    elif kind == "block_slice":  # cache[a:b] of a bigger allocation: contiguous at an offset
        make = lambda t: t[2:2 + nb]  # noqa: E731
        base_shape = [nb + 3] + rest
    elif kind == "stacked":  # the value half of vLLM's (2, nb, ...) allocation
        make = lambda t: t[1]  # noqa: E731
        base_shape = [2] + shape
    elif kind == "as_strided_contiguous":
        make = lambda t: t.as_strided(shape, strides, 5)  # noqa: E731
        base_shape = [math.prod(shape) + 7]
    elif kind == "size1_permuted":  # swaps the size-1 head dimension (MLA): the same memory order
        make = lambda t: t.transpose(1, 2)  # noqa: E731
        base_shape = [shape[0], shape[2], shape[1]] + shape[3:]
    elif kind == "permuted":  # blocks are not the outermost dimension in memory
        make = lambda t: t.transpose(0, 1)  # noqa: E731
        base_shape = [shape[1], shape[0]] + shape[2:]
    elif kind == "hnd":  # the issue: (nb, Nkv, bs, D) memory passed as (nb, bs, Nkv, D)
        make = lambda t: t.permute(0, 2, 1, 3)  # noqa: E731
        base_shape = [shape[0], shape[2], shape[1], shape[3]]
    elif kind == "inner_slice":  # heads (ND) / block rows (NZ) of a wider tensor
        make = lambda t: t[..., : shape[-2], :]  # noqa: E731
        base_shape = shape[:-2] + [shape[-2] + 1, shape[-1]]
    elif kind == "column_slice":
        make = lambda t: t[..., : shape[-1]]  # noqa: E731
        base_shape = shape[:-1] + [shape[-1] + 8]
    elif kind == "padded_blocks":  # blocks 16 elements apart more than their size
        make = lambda t: t.as_strided(shape, (per + 16,) + strides[1:])  # noqa: E731
        base_shape = [nb * (per + 16)]
    elif kind == "as_strided_overlap":  # consecutive blocks share half their memory
        make = lambda t: t.as_strided(shape, (per // 2,) + strides[1:])  # noqa: E731
        base_shape = [math.prod(shape)]
    elif kind == "expanded":  # one block seen nb times
        make = lambda t: t.expand(shape)  # noqa: E731
        base_shape = [1] + rest
    else:
        raise AssertionError(kind)
    base = garbage(base_shape, dt, gen)
    view = make(base)
    assert list(view.shape) == shape
    if kind not in ("as_strided_overlap", "expanded"):
        view.copy_(cache)
    assert view.is_contiguous() == (kind in ACCEPTED), kind
    return view, base, make


ACCEPTED = ["contiguous", "block_slice", "stacked", "as_strided_contiguous", "size1_permuted"]
REJECTED = ["permuted", "inner_slice", "column_slice", "padded_blocks", "as_strided_overlap", "expanded"]


def byte_snapshot(ts):
    return [t.clone() for t in ts]


def assert_bytes_equal(before, after):
    for b, a in zip(before, after):
        assert torch.equal(b.view(torch.uint8), a.view(torch.uint8)), "a rejected call changed a cache"


def assert_rejected(call, name, bad, bases):
    """`call` raises ValueError naming `name` with the bad tensor's strides; `bases` unchanged."""
    before = byte_snapshot(bases)
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert name in msg, msg
    assert f"strides {list(bad.stride())}" in msg, msg
    assert_bytes_equal(before, bases)
    return msg


def expected_base(base0, make, logical):
    """base0 with the view's elements replaced by `logical`: what the caller's memory must hold."""
    e = base0.clone()
    make(e).copy_(logical)
    return e


def vllm_allocate(backend, shape, dtype, num_layers=None):
    """vLLM's recipe (gpu_model_runner / kv_cache_utils): allocate the logical shape permuted by
    get_kv_cache_stride_order, then permute back with the inverse order."""
    logical = ([num_layers] if num_layers else []) + list(shape)
    order = list(backend.kv_cache_stride_order(include_num_layers_dimension=num_layers is not None))
    assert sorted(order) == list(range(len(logical)))
    inv = [order.index(i) for i in range(len(order))]
    return torch.zeros([logical[i] for i in order], dtype=dtype).permute(*inv)


# ----------------------------------------------------------------------------- backend facts


@pytest.mark.parametrize(
    "backend,shape",
    [
        (aar.Backend, aar.Backend.kv_cache_shape(4, 16, 2, 16)),
        (aar.FA3Backend, aar.FA3Backend.kv_cache_shape(4, 128, 2, 64)),
        (aar.C8Backend, aar.C8Backend.kv_cache_shape(4, 32, 2, 64)),
        (mla.Backend, mla.Backend.kv_cache_shape(4, 16, 1, 64)),
    ],
)
def test_kv_cache_stride_order_is_the_identity(backend, shape):
    # Every kernel here reads a layer's cache as row-major kv_cache_shape memory; with the layers
    # dimension, layers are outermost so each layer's cache stays contiguous.
    assert tuple(backend.kv_cache_stride_order()) == tuple(range(len(shape)))
    assert tuple(backend.kv_cache_stride_order(False)) == tuple(range(len(shape)))
    assert tuple(backend.kv_cache_stride_order(include_num_layers_dimension=True)) == tuple(range(len(shape) + 1))
    kv = vllm_allocate(backend, shape, torch.float32, num_layers=3)
    assert kv[1][0].is_contiguous() and kv[2][1].is_contiguous()


# ----------------------------------------------------------------------------- GQA

N, NKV, D, BS = 4, 2, 16, 16

GQA_STEPS = {
    # FIA over the paged cache through the layer's (nb, bs, Nkv*D) views
    "chunked_prefill": ([37, 5, 20], [3, 1, 20], S.ChunkedPrefill),
    # one token per request (paged attention or FIA per docs/design/gqa.md §2.6)
    "decode": ([37, 5, 20], [1, 1, 1], S.DecodeOnly),
    # dense attention over the new tokens; the cache is still written
    "prefill_no_cache": ([5, 17], [5, 17], S.PrefillNoCache),
}


def gqa_batch(step, gen, dtype=torch.float32, **kw):
    seq, q, state = GQA_STEPS[step]
    return make_batch(seq, q, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=dtype, block_size=BS, gen=gen,
                      **kw), state


def gqa_forward(impl, builder, b, state, kc, vc):
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, attn_state=state)
    out = new_output(b)
    impl.forward(b.q, b.k, b.v, kc, vc, md, out)
    return out


def written(cache, slots, new):
    """The logical cache after writing `new` at `slots` (independent of the runtime)."""
    e = cache.clone()
    nb, bs = e.shape[:2]
    e.view(nb * bs, *e.shape[2:])[torch.tensor(slots, dtype=torch.long)] = new
    return e


@pytest.mark.parametrize("step", list(GQA_STEPS))
@pytest.mark.parametrize("kind", [k for k in ACCEPTED if k != "size1_permuted"])
def test_gqa_accepted_layouts_are_read_and_written_in_place(kind, step, gen):
    b, state = gqa_batch(step, gen)
    kc, kbase, kmake = relayout(b.key_cache, kind, gen)
    vc, vbase, vmake = relayout(b.value_cache, kind, gen)
    kb0, vb0 = kbase.clone(), vbase.clone()
    out = gqa_forward(aar.AttentionImpl(N, D, num_kv_heads=NKV), gqa_builder(b), b, state, kc, vc)
    n = b.num_actual_tokens
    assert_close(out[:n], b.reference(), b.dtype)
    # The new tokens landed in the caller's memory, at their slots, and nowhere else.
    assert torch.equal(kbase, expected_base(kb0, kmake, written(b.key_cache, b.new_slots, b.k[:n])))
    assert torch.equal(vbase, expected_base(vb0, vmake, written(b.value_cache, b.new_slots, b.v[:n])))


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
@pytest.mark.parametrize("kind", REJECTED + ["hnd"])
def test_gqa_rejected_layouts_write_nothing(kind, which, gen):
    b, state = gqa_batch("chunked_prefill", gen)
    bad, bad_base, _ = relayout(getattr(b, which), kind, gen)
    good, good_base, _ = relayout(b.value_cache if which == "key_cache" else b.key_cache, "contiguous", gen)
    kc, vc = (bad, good) if which == "key_cache" else (good, bad)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    msg = assert_rejected(lambda: gqa_forward(impl, gqa_builder(b), b, state, kc, vc), which, bad,
                          [bad_base, good_base])
    assert "kv_cache_stride_order" in msg and f"shape {list(bad.shape)}" in msg


def test_issue_reproduction_hnd_caches_are_rejected_before_any_write():
    # Issue 9.1 verbatim: 4 heads / 2 KV heads, D 16, block size 16, caches allocated (nb, Nkv, bs, D)
    # and passed as .permute(0, 2, 1, 3); a 5-token prefill then one decode. It used to write the cache
    # and read a reshape copy (decode off by 1.46); now both calls are rejected and nothing is written.
    g = torch.Generator().manual_seed(0)
    nb = 8
    kc = torch.zeros(nb, NKV, BS, D).permute(0, 2, 1, 3)
    vc = torch.zeros(nb, NKV, BS, D).permute(0, 2, 1, 3)
    builder = aar.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=BS,
                                  num_blocks=nb)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    bt = torch.tensor([[3, 0, 0, 0]], dtype=torch.int32)
    q, k, v = torch.randn(6, N, D, generator=g), torch.randn(6, NKV, D, generator=g), torch.randn(6, NKV, D, generator=g)
    md = builder.build(torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5], dtype=torch.int32), bt)
    with pytest.raises(ValueError, match=r"key_cache must be contiguous .* strides \[512, 16, 256, 1\]"):
        impl.forward(q[:5], k[:5], v[:5], kc, vc, md, torch.zeros(5, N, D))
    md = builder.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([6], dtype=torch.int32), bt)
    with pytest.raises(ValueError, match=r"key_cache must be contiguous"):
        impl.forward(q[5:], k[5:], v[5:], kc, vc, md, torch.zeros(1, N, D))
    assert torch.count_nonzero(kc) == 0 and torch.count_nonzero(vc) == 0


@pytest.mark.parametrize("num_layers", [None, 3])
def test_issue_steps_through_a_vllm_allocated_cache_are_exact(num_layers):
    # The same steps with the cache allocated by vLLM's recipe from kv_cache_shape and
    # kv_cache_stride_order (one layer, or layer 1 of a 3-layer allocation): exact attention.
    g = torch.Generator().manual_seed(0)
    nb = 8
    kv = vllm_allocate(aar.Backend, aar.Backend.kv_cache_shape(nb, BS, NKV, D), torch.float32, num_layers)
    if num_layers:
        kv = kv[1]
    kc, vc = kv[0], kv[1]
    builder = aar.MetadataBuilder(max_num_reqs=4, max_num_tokens=64, max_blocks_per_req=4, block_size=BS,
                                  num_blocks=nb)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    bt = torch.tensor([[3, 0, 0, 0]], dtype=torch.int32)
    q, k, v = torch.randn(6, N, D, generator=g), torch.randn(6, NKV, D, generator=g), torch.randn(6, NKV, D, generator=g)
    md = builder.build(torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5], dtype=torch.int32), bt)
    impl.forward(q[:5], k[:5], v[:5], kc, vc, md, torch.zeros(5, N, D))
    md = builder.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([6], dtype=torch.int32), bt)
    out = torch.zeros(1, N, D)
    impl.forward(q[5:], k[5:], v[5:], kc, vc, md, out)
    kk, vv = k.double().repeat_interleave(N // NKV, 1), v.double().repeat_interleave(N // NKV, 1)
    p = torch.softmax(torch.einsum("hd,khd->hk", q[5].double(), kk) / math.sqrt(D), -1)
    ref = torch.einsum("hk,khd->hd", p, vv)
    assert (out[0].double() - ref).abs().max() < 1e-5
    assert torch.equal(kc[3, :6], k) and torch.equal(vc[3, :6], v)


# ----------------------------------------------------------------------------- FA3

FA3_N, FA3_D, FA3_BS = 8, 64, 128


def fa3_batch(gen):
    return make_batch([19, 140, 300, 13], [1, 1, 6, 13], num_heads=FA3_N, num_kv_heads=NKV, head_size=FA3_D,
                      dtype=torch.float32, block_size=FA3_BS, gen=gen)


def fa3_forward(impl, b, kc, vc):
    builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=FA3_BS,
                                  num_blocks=b.num_blocks)
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, attn_state=S.ChunkedPrefill)
    out = new_output(b)
    impl.forward(b.q, b.k, b.v, kc, vc, md, out)
    return out


@pytest.mark.parametrize("kind", ["block_slice", "stacked", "as_strided_contiguous"])
def test_fa3_accepted_layouts(kind, gen):
    b = fa3_batch(gen)
    kc, kbase, kmake = relayout(b.key_cache, kind, gen)
    vc, vbase, vmake = relayout(b.value_cache, kind, gen)
    kb0, vb0 = kbase.clone(), vbase.clone()
    out = fa3_forward(aar.FA3AttentionImpl(FA3_N, FA3_D, num_kv_heads=NKV), b, kc, vc)
    n = b.num_actual_tokens
    assert_close(out[:n], b.reference(), b.dtype)
    assert torch.equal(kbase, expected_base(kb0, kmake, written(b.key_cache, b.new_slots, b.k[:n])))
    assert torch.equal(vbase, expected_base(vb0, vmake, written(b.value_cache, b.new_slots, b.v[:n])))


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
@pytest.mark.parametrize("kind", ["hnd", "permuted", "inner_slice", "column_slice", "padded_blocks"])
def test_fa3_rejected_layouts(kind, which, gen):
    b = fa3_batch(gen)
    bad, bad_base, _ = relayout(getattr(b, which), kind, gen)
    good, good_base, _ = relayout(b.value_cache if which == "key_cache" else b.key_cache, "contiguous", gen)
    kc, vc = (bad, good) if which == "key_cache" else (good, bad)
    impl = aar.FA3AttentionImpl(FA3_N, FA3_D, num_kv_heads=NKV)
    assert_rejected(lambda: fa3_forward(impl, b, kc, vc), which, bad, [bad_base, good_base])


# ----------------------------------------------------------------------------- C8 (int8 NZ)

C8_STEPS = {
    "decode": ([40, 70], [1, 1], S.DecodeOnly),  # the int8 BNSD decode over the NZ cache
    "chunked": ([40, 70, 33], [1, 1, 6], S.ChunkedPrefill),  # + a prefill over dequantised context
}


def c8_run(impl, b, state, kc, vc):
    md = c8_builder(b).build(b.qsl, b.seq_lens_t, b.block_table, attn_state=state)
    out = torch.full(b.q.shape, 7.0)
    impl.forward(b.q, b.k, b.v, kc, vc, md, out)
    return out, md


def c8_written(b, cache, new, sc, off):
    e = cache.clone()
    qn = ref_quant(new[: b.n_act], sc, off)
    for t, s in enumerate(b.slots):
        e[s // b.block_size, :, :, s % b.block_size, :] = qn[t].reshape(b.num_kv_heads, b.head_size // 32, 32)
    return e


@pytest.mark.parametrize("step", list(C8_STEPS))
@pytest.mark.parametrize("kind", ["contiguous", "block_slice", "stacked", "as_strided_contiguous"])
def test_c8_accepted_layouts(kind, step, gen):
    seq, q, state = C8_STEPS[step]
    b = make_c8_batch(seq, q, gen=gen)
    kc, kbase, kmake = relayout(b.key_cache, kind, gen)
    vc, vbase, vmake = relayout(b.value_cache, kind, gen)
    kb0, vb0 = kbase.clone(), vbase.clone()
    out, md = c8_run(c8_impl(b), b, state, kc, vc)
    assert_close(out[: b.n_act], c8_reference(b, decode_rows_int8=md.num_decodes), b.dtype)
    assert torch.equal(kbase, expected_base(kb0, kmake, c8_written(b, b.key_cache, b.k, b.ks, b.ko)))
    assert torch.equal(vbase, expected_base(vb0, vmake, c8_written(b, b.value_cache, b.v, b.vs, b.vo)))


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
@pytest.mark.parametrize("kind", REJECTED)
def test_c8_rejected_nz_layouts(kind, which, gen):
    b = make_c8_batch([40, 70, 33], [1, 1, 6], gen=gen)
    bad, bad_base, _ = relayout(getattr(b, which), kind, gen)
    good, good_base, _ = relayout(b.value_cache if which == "key_cache" else b.key_cache, "contiguous", gen)
    kc, vc = (bad, good) if which == "key_cache" else (good, bad)
    assert_rejected(lambda: c8_run(c8_impl(b), b, S.ChunkedPrefill, kc, vc), which, bad, [bad_base, good_base])


def test_c8_rejected_token_major_and_declared_nd_views(gen):
    b = make_c8_batch([40, 70], [1, 1], gen=gen)
    nb, nkv, d1, bs, w = b.key_cache.shape
    # token-major (nb, bs, Nkv, D/32, 32) memory permuted into the NZ shape
    tm = b.key_cache.permute(0, 3, 1, 2, 4).contiguous()
    bad = tm.permute(0, 2, 3, 1, 4)
    assert torch.equal(bad, b.key_cache)  # same logical NZ content, wrong memory order
    assert_rejected(lambda: c8_run(c8_impl(b), b, S.DecodeOnly, bad, b.value_cache), "key_cache", bad,
                    [tm, b.key_cache, b.value_cache])
    # the declared ND shape (nb, bs, Nkv, D) must be a view of contiguous NZ bytes, not a permutation
    nd = torch.zeros(nb, nkv, bs, d1 * w, dtype=torch.int8).permute(0, 2, 1, 3)
    assert_rejected(lambda: c8_run(c8_impl(b), b, S.DecodeOnly, b.key_cache, nd), "value_cache", nd,
                    [nd, b.key_cache, b.value_cache])


def test_c8_vllm_allocated_cache(gen):
    b = make_c8_batch([40, 70], [1, 1], gen=gen)
    nb, nkv, d1, bs, _ = b.key_cache.shape
    kv = vllm_allocate(aar.C8Backend, aar.C8Backend.kv_cache_shape(nb, bs, nkv, d1 * 32), torch.int8, num_layers=2)
    kv[1][0].copy_(b.key_cache)
    kv[1][1].copy_(b.value_cache)
    out, md = c8_run(c8_impl(b), b, S.DecodeOnly, kv[1][0], kv[1][1])
    assert_close(out[: b.n_act], c8_reference(b, decode_rows_int8=2), b.dtype)
    assert torch.equal(kv[1][0], c8_written(b, b.key_cache, b.k, b.ks, b.ko))
    assert torch.count_nonzero(kv[0]) == 0


# ----------------------------------------------------------------------------- MLA

MLA_STEPS = {
    "decode": ([7, 19], [1, 1], {}),  # absorbed decode through the layer's (nb, 1, bs, D) views
    "mixed": ([12, 20, 40, 9], [1, 1, 7, 9], dict(workspace=32)),  # + prefill gathering the context
}


def mla_control(step, nz=False):
    """The step on plain contiguous caches: the caches every layout must end up holding."""
    seq, q, kw = MLA_STEPS[step]
    c = mla_case(seq, q, nz=nz, **kw)
    nope, rope = (mla.Backend.to_nz(c.nope), mla.Backend.to_nz(c.rope)) if nz else (c.nope, c.rope)
    out = torch.full_like(c.hidden, 7.0)
    c.impl.forward(c.hidden, nope, rope, c.md, out)
    torch.testing.assert_close(out.double(), c.ref, **mla_tol(torch.float32))
    return nope, rope


@pytest.mark.parametrize("step", list(MLA_STEPS))
@pytest.mark.parametrize("kind", ACCEPTED)
def test_mla_accepted_nd_layouts(kind, step, gen):
    seq, q, kw = MLA_STEPS[step]
    c = mla_case(seq, q, **kw)
    nope, nbase, nmake = relayout(c.nope, kind, gen)
    rope, rbase, rmake = relayout(c.rope, kind, gen)
    nb0, rb0 = nbase.clone(), rbase.clone()
    out = torch.full_like(c.hidden, 7.0)
    c.impl.forward(c.hidden, nope, rope, c.md, out)
    torch.testing.assert_close(out.double(), c.ref, **mla_tol(torch.float32))
    want_nope, want_rope = mla_control(step)
    assert torch.equal(nbase, expected_base(nb0, nmake, want_nope))
    assert torch.equal(rbase, expected_base(rb0, rmake, want_rope))


@pytest.mark.parametrize("which", ["nope_cache", "rope_cache"])
@pytest.mark.parametrize("kind", REJECTED)
def test_mla_rejected_nd_layouts(kind, which, gen):
    seq, q, kw = MLA_STEPS["mixed"]
    c = mla_case(seq, q, **kw)
    src = c.nope if which == "nope_cache" else c.rope
    bad, bad_base, _ = relayout(src, kind, gen)
    nope, rope = (bad, c.rope) if which == "nope_cache" else (c.nope, bad)
    out = torch.full_like(c.hidden, 7.0)
    assert_rejected(lambda: c.impl.forward(c.hidden, nope, rope, c.md, out), which, bad,
                    [bad_base, c.nope, c.rope])


@pytest.mark.parametrize("kind", ["contiguous", "block_slice", "stacked", "as_strided_contiguous", "size1_permuted",
                                  "inner_slice", "column_slice", "expanded", "nd_order"])
def test_mla_nz_layouts(kind, gen):
    seq, q, kw = MLA_STEPS["decode"]
    c = mla_case(seq, q, nz=True, **kw)
    nz_nope, nz_rope = mla.Backend.to_nz(c.nope), mla.Backend.to_nz(c.rope)
    out = torch.full_like(c.hidden, 7.0)
    if kind == "nd_order":
        # ND-ordered memory viewed in the NZ shape (what from_nz undoes): the right elements, wrong bytes
        nb, _, d1, bs, w = nz_nope.shape
        base = c.nope.view(nb, bs, d1, w).clone()
        bad = base.permute(0, 2, 1, 3).unsqueeze(1)
        assert torch.equal(bad, nz_nope)
        assert_rejected(lambda: c.impl.forward(c.hidden, bad, nz_rope, c.md, out), "nope_cache", bad,
                        [base, nz_rope])
        return
    nope, nbase, nmake = relayout(nz_nope, kind, gen)
    rope, rbase, rmake = relayout(nz_rope, kind, gen)
    if kind not in ACCEPTED:
        assert_rejected(lambda: c.impl.forward(c.hidden, nope, rope, c.md, out), "nope_cache", nope, [nbase, rbase])
        return
    nb0, rb0 = nbase.clone(), rbase.clone()
    c.impl.forward(c.hidden, nope, rope, c.md, out)
    torch.testing.assert_close(out.double(), c.ref, **mla_tol(torch.float32))
    want_nope, want_rope = mla_control("decode", nz=True)
    assert torch.equal(nbase, expected_base(nb0, nmake, want_nope))
    assert torch.equal(rbase, expected_base(rb0, rmake, want_rope))


@pytest.mark.parametrize("num_layers", [None, 2])
def test_mla_vllm_allocated_caches(num_layers):
    seq, q, kw = MLA_STEPS["decode"]
    c = mla_case(seq, q, **kw)
    nb, bs = c.nope.shape[:2]
    caches = []
    for shape, src in zip(mla.Backend.kv_cache_shapes(nb, bs, c.d.L, c.d.R), (c.nope, c.rope)):
        t = vllm_allocate(mla.Backend, shape, torch.float32, num_layers)
        t = t[1] if num_layers else t
        t.copy_(src)
        caches.append(t)
    out = torch.full_like(c.hidden, 7.0)
    c.impl.forward(c.hidden, caches[0], caches[1], c.md, out)
    torch.testing.assert_close(out.double(), c.ref, **mla_tol(torch.float32))
    want_nope, want_rope = mla_control("decode")
    assert torch.equal(caches[0], want_nope) and torch.equal(caches[1], want_rope)


# ----------------------------------------------------------------------------- stale views


def trash_(t, gen):
    t.copy_(garbage(t.shape, t.dtype, gen))


def move_(cache, how, gen):
    """Moves the content of `cache` (the same tensor object) to other memory in place and trashes the
    memory it described, so a view made from the old binding reads garbage."""
    old = cache.detach()  # the old memory, as laid out before the move
    if how == "set_":
        new = cache.clone()
        cache.set_(new.untyped_storage(), new.storage_offset(), new.shape, new.stride())
    elif how == "as_strided_":
        # `cache` is the first half of a double-sized allocation (see stale_cache): move to the second
        nb = cache.shape[0]
        per = cache[0].numel()
        second = cache.as_strided(cache.shape, cache.stride(), cache.storage_offset() + nb * per)
        second.copy_(cache)
        cache.as_strided_(cache.shape, cache.stride(), cache.storage_offset() + nb * per)
    else:
        raise AssertionError(how)
    trash_(old, gen)


def stale_cache(src):
    """`src`'s content in the first half of a double-sized allocation (room for as_strided_)."""
    base = torch.zeros((2 * src.shape[0],) + tuple(src.shape[1:]), dtype=src.dtype)
    cache = base[: src.shape[0]]
    cache.copy_(src)
    return cache


@pytest.mark.parametrize("how", ["set_", "as_strided_"])
@pytest.mark.parametrize("backend", ["gqa", "fa3"])
def test_moved_caches_are_rebound(backend, how, gen):
    if backend == "gqa":
        b, state = gqa_batch("chunked_prefill", gen)
        impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
        run = lambda kc, vc: gqa_forward(impl, gqa_builder(b), b, state, kc, vc)  # noqa: E731
    else:
        b = fa3_batch(gen)
        impl = aar.FA3AttentionImpl(FA3_N, FA3_D, num_kv_heads=NKV)
        run = lambda kc, vc: fa3_forward(impl, b, kc, vc)  # noqa: E731
    n = b.num_actual_tokens
    kc, vc = stale_cache(b.key_cache), stale_cache(b.value_cache)
    assert_close(run(kc, vc)[:n], b.reference(), b.dtype)
    move_(kc, how, gen)
    move_(vc, how, gen)
    # Same step again (it rewrites the same slots with the same values): only the new memory counts.
    assert_close(run(kc, vc)[:n], b.reference(), b.dtype)
    assert torch.equal(kc, written(b.key_cache, b.new_slots, b.k[:n]))
    assert torch.equal(vc, written(b.value_cache, b.new_slots, b.v[:n]))


def test_resized_gqa_cache_is_rebound(gen):
    # resize_ reallocates the storage and changes the block count: the step after it reads blocks
    # that only exist in the resized cache.
    b, state = gqa_batch("chunked_prefill", gen)
    nb, n = b.num_blocks, b.num_actual_tokens
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    kc, vc = b.key_cache.clone(), b.value_cache.clone()
    assert_close(gqa_forward(impl, gqa_builder(b), b, state, kc, vc)[:n], b.reference(), b.dtype)
    for c in (kc, vc):
        c.resize_((2 * nb,) + tuple(c.shape[1:]))
        c[nb:].copy_(c[:nb])
        trash_(c[:nb], gen)
    b.block_table += nb
    b.new_slots = [s + nb * BS for s in b.new_slots]
    out = gqa_forward(impl, gqa_builder(b, num_blocks=2 * nb), b, state, kc, vc)
    assert_close(out[:n], b.reference(), b.dtype)
    assert torch.equal(kc[nb:], written(b.key_cache, [s - nb * BS for s in b.new_slots], b.k[:n]))


@pytest.mark.parametrize("form", ["nz", "declared_nd"])
def test_c8_moved_caches_are_rebound(form, gen):
    b = make_c8_batch([40, 70, 33], [1, 1, 6], gen=gen)
    impl = c8_impl(b)
    ref = c8_reference(b, decode_rows_int8=2)
    kc, vc = stale_cache(b.key_cache), stale_cache(b.value_cache)
    as_form = (lambda t: t.view(t.shape[0], t.shape[3], t.shape[1], -1)) if form == "declared_nd" else (lambda t: t)
    k_in, v_in = as_form(kc), as_form(vc)
    assert_close(c8_run(impl, b, S.ChunkedPrefill, k_in, v_in)[0][: b.n_act], ref, b.dtype)
    move_(k_in, "set_", gen)
    move_(v_in, "set_", gen)
    assert_close(c8_run(impl, b, S.ChunkedPrefill, k_in, v_in)[0][: b.n_act], ref, b.dtype)
    nb, nkv, d1, bs, w = b.key_cache.shape
    assert torch.equal(k_in.view(nb, nkv, d1, bs, w), c8_written(b, b.key_cache, b.k, b.ks, b.ko))


def test_c8_new_cache_at_a_freed_cache_address(gen):
    # The declared ND form is a new tensor (a view) over the NZ bytes; the layer used to keep only its
    # own NZ view of it, so once the caller dropped it, a new tensor could be allocated at the same
    # address and be taken for the bound cache. The layer now holds the bound tensor.
    b = make_c8_batch([40, 70], [1, 1], gen=gen)
    nb, nkv, d1, bs, w = b.key_cache.shape
    impl = c8_impl(b)
    ref = c8_reference(b, decode_rows_int8=2)
    nd = lambda t: t.view(nb, bs, nkv, d1 * w)  # noqa: E731
    kbuf, vbuf = b.key_cache.clone(), b.value_cache.clone()  # the first binding's memory
    kbuf2, vbuf2 = b.key_cache.clone(), b.value_cache.clone()  # the new caches' memory
    k1, v1 = nd(kbuf), nd(vbuf)
    assert_close(c8_run(impl, b, S.DecodeOnly, k1, v1)[0][: b.n_act], ref, b.dtype)
    addr = (k1._cdata, v1._cdata)  # the TensorImpl addresses
    del k1, v1
    # New tensors over new memory until one lands at a freed address (glibc reuses freed chunks).
    cands = [(nd(kbuf2), nd(vbuf2)) for _ in range(256)]
    k2 = next((k for k, _ in cands if k._cdata == addr[0]), cands[0][0])
    v2 = next((v for _, v in cands if v._cdata == addr[1]), cands[0][1])
    trash_(kbuf, gen)
    trash_(vbuf, gen)
    reused = [t._cdata for pair in cands for t in pair if t._cdata in addr]
    assert not reused, "a bound cache was freed while bound: its address was reused"
    assert_close(c8_run(impl, b, S.DecodeOnly, k2, v2)[0][: b.n_act], ref, b.dtype)
    assert torch.equal(kbuf2, c8_written(b, b.key_cache, b.k, b.ks, b.ko))
    assert torch.equal(vbuf2, c8_written(b, b.value_cache, b.v, b.vs, b.vo))


@pytest.mark.parametrize("how", ["set_", "as_strided_"])
def test_mla_moved_caches_are_rebound(how, gen):
    seq, q, kw = MLA_STEPS["decode"]
    c = mla_case(seq, q, **kw)
    nope, rope = stale_cache(c.nope), stale_cache(c.rope)
    for step in range(2):
        if step == 1:
            move_(nope, how, gen)
            move_(rope, how, gen)
        # The same decode again after the move (it rewrites the same rows): only the new memory counts.
        out = torch.full_like(c.hidden, 7.0)
        c.impl.forward(c.hidden, nope, rope, c.md, out)
        torch.testing.assert_close(out.double(), c.ref, **mla_tol(torch.float32))
    want_nope, want_rope = mla_control("decode")
    assert torch.equal(nope, want_nope) and torch.equal(rope, want_rope)


# ----------------------------------------------------------------------------- swap / copy blocks


def block_caches(gen, nb=6, shape=(4, 2, 8), dtype=torch.float32):
    return [garbage((nb,) + shape, dtype, gen) for _ in range(4)]


SWAP_PAIRS = torch.tensor([[0, 5], [3, 1], [4, 4], [1, 0]])


def swap_expected(sk, sv, dk, dv, pairs):
    ek, ev = dk.clone(), dv.clone()
    for s, d in pairs.tolist():
        ek[d], ev[d] = sk[s], sv[s]
    return ek, ev


@pytest.mark.parametrize("kind", ["hnd", "permuted", "block_slice", "inner_slice", "column_slice", "padded_blocks",
                                  "as_strided_contiguous"])
def test_swap_and_copy_blocks_take_any_non_overlapping_layout(kind, gen):
    logical = block_caches(gen)
    views = [relayout(t, kind, gen) for t in logical]
    sk, sv, dk, dv = (v for v, _, _ in views)
    ek, ev = swap_expected(*logical, SWAP_PAIRS)
    bases0 = [base.clone() for _, base, _ in views]
    aar.Backend.swap_blocks(sk, sv, dk, dv, SWAP_PAIRS)
    assert torch.equal(dk, ek) and torch.equal(dv, ev)
    assert torch.equal(sk, logical[0]) and torch.equal(sv, logical[1])
    for (_, base, make), b0, want in zip(views, bases0, [logical[0], logical[1], ek, ev]):
        assert torch.equal(base, expected_base(b0, make, want))  # nothing outside the views
    # copy_blocks within each layer
    pairs = torch.tensor([[0, 1], [1, 2], [4, 5]])
    before = [t.clone() for t in (sk, sv, dk, dv)]
    aar.Backend.copy_blocks([(sk, sv), (dk, dv)], pairs)
    for t, t0 in zip((sk, sv, dk, dv), before):
        e = t0.clone()
        for s, d in pairs.tolist():
            e[d] = t0[s]
        assert torch.equal(t, e)


ARGS = ["src_key_cache", "src_value_cache", "dst_key_cache", "dst_value_cache"]


@pytest.mark.parametrize("arg", ARGS)
@pytest.mark.parametrize("kind", ["expanded", "as_strided_overlap"])
def test_swap_blocks_rejects_overlapping_caches(kind, arg, gen):
    caches = block_caches(gen)
    i = ARGS.index(arg)
    bad, base, _ = relayout(caches[i], kind, gen)
    caches[i] = bad
    owners = [base if j == i else t for j, t in enumerate(caches)]
    msg = assert_rejected(lambda: aar.Backend.swap_blocks(*caches, SWAP_PAIRS), arg, bad, owners)
    assert "overlapping" in msg


@pytest.mark.parametrize(
    "bad_value,match",
    [
        (lambda v: torch.zeros(6, 4, 2, 9), r"dst_value_cache has block shape \[4, 2, 9\]"),
        (lambda v: v.double(), r"dst_value_cache dtype Double differs from src_value_cache dtype Float"),
        (lambda v: torch.zeros(5, 4, 2, 8), r"dst_value_cache has 5 blocks but dst_key_cache has 6"),
        (lambda v: v.to("meta"), r"dst_value_cache is on meta but dst_key_cache is on cpu"),
    ],
)
def test_swap_blocks_validates_the_value_caches_before_the_key_copy(bad_value, match, gen):
    # Issue 9.4: only the key blocks were checked; a mismatched value cache let the key copy land,
    # then the value copy threw. Now nothing is written.
    sk, sv, dk, dv = block_caches(gen)
    dv = bad_value(dv)
    dk0 = dk.clone()
    with pytest.raises(ValueError, match=match):
        aar.Backend.swap_blocks(sk, sv, dk, dv, SWAP_PAIRS)
    assert torch.equal(dk0.view(torch.uint8), dk.view(torch.uint8)), "the key copy landed"


def test_swap_blocks_validates_the_source_value_cache(gen):
    sk, sv, dk, dv = block_caches(gen)
    dk0, dv0 = dk.clone(), dv.clone()
    with pytest.raises(ValueError, match=r"src_value_cache has 3 blocks but src_key_cache has 6"):
        aar.Backend.swap_blocks(sk, sv[:3], dk, dv, SWAP_PAIRS)
    with pytest.raises(ValueError, match=r"dst_value_cache has block shape \[4, 2, 8\] .* src_value_cache has \[4, 2, 7\]"):
        aar.Backend.swap_blocks(sk, sv[..., :7], dk, dv, SWAP_PAIRS)
    assert torch.equal(dk, dk0) and torch.equal(dv, dv0)


def test_copy_blocks_validates_every_layer_first(gen):
    k0, v0, k1, v1 = block_caches(gen)
    bad, base, _ = relayout(v1, "expanded", gen)
    before = [t.clone() for t in (k0, v0, k1, base)]
    with pytest.raises(ValueError, match=r"kv_caches\[1\] value cache may have overlapping elements .* strides \[0, "):
        aar.Backend.copy_blocks([(k0, v0), (k1, bad)], torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"kv_caches\[1\] value cache has 3 blocks but kv_caches\[1\] key cache has 6"):
        aar.Backend.copy_blocks([(k0, v0), (k1, v1[:3])], torch.tensor([[0, 1]]))
    assert_bytes_equal(before, (k0, v0, k1, base))
