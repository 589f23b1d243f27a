"""FA3-style backend (docs/design/gqa.md §6) against the float64 explicit-mask reference.

Upstream's flash_attn_with_kvcache entry has four slicing quirks (docs/design/gqa.md §6); each
case below names the quirk it would catch:
  * prefill block table sliced by decode *tokens* ([ndt:]) instead of requests ([nd:]):
    caught by batches with multi-token (speculative) decodes, where ndt != nd;
  * prefill cu_seqlens not rebased to 0: caught by any batch with decodes and prefills
    (the prefill part's lengths would not end at its row count);
  * decodes non-causal: caught by multi-token decodes (a non-causal query sees later
    draft tokens);
  * the impl's scale not forwarded: caught by an explicit scale != 1/sqrt(D).
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _harness import S, check_cache_written, check_output
from _reference import DTYPES, SENTINEL, make_batch

N, NKV, D, BS = 8, 2, 64, 128


def _run(seq, q, *, gen, state=None, spec=0, scale=None, dtype=torch.float32, num_input_tokens=0, causal=True,
         pooling=False, attn_type="decoder"):
    b = make_batch(seq, q, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=dtype, block_size=BS, gen=gen,
                   num_input_tokens=num_input_tokens)
    kw = dict(max_num_reqs=8, max_num_tokens=max(64, b.q.shape[0]), max_blocks_per_req=4, block_size=BS,
              num_blocks=b.num_blocks, pooling=pooling)
    build_kw = dict(num_input_tokens=num_input_tokens, attn_state=state, causal=causal)
    if spec:
        kw.update(num_speculative_tokens=spec, spec_method="mtp")
        build_kw["num_spec_tokens"] = torch.full((len(q),), spec, dtype=torch.int32)
    builder = aar.MetadataBuilder(**kw)
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, **build_kw)
    impl = aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, attn_type=attn_type,
                                **({} if scale is None else dict(scale=scale)))
    kc0, vc0 = b.key_cache.clone(), b.value_cache.clone()
    out = torch.full(b.q.shape, SENTINEL, dtype=dtype)
    ret = impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)

    class R:
        pass

    r = R()
    r.md, r.impl, r.out, r.ret, r.kc_before, r.vc_before = md, impl, out, ret, kc0, vc0
    return b, r


CASES = {
    # name: (seq, q, state, spec, expected kernel calls)
    "decode_only": ([37, 5, 260, 33], [1, 1, 1, 1], S.DecodeOnly, 0, 1),
    "prefill_no_cache": ([5, 17, 9], [5, 17, 9], S.PrefillNoCache, 0, 1),
    "prefill_cache_hit": ([200, 45, 133], [5, 17, 9], S.PrefillCacheHit, 0, 1),
    # rebasing: decodes + prefills in one batch
    "chunked_mixed": ([19, 140, 300, 13], [1, 1, 6, 13], S.ChunkedPrefill, 0, 2),
    # non-causal decodes: multi-token speculative decodes only
    "spec_decodes": ([140, 23, 264], [4, 4, 4], None, 3, 1),
    # block table by tokens: ndt = 6 != nd = 2, and decodes need causality
    "spec_decodes_and_prefill": ([140, 300, 23, 264], [3, 3, 10, 7], S.ChunkedPrefill, 2, 2),
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_paths(name, dtype, gen):
    seq, q, state, spec, calls = CASES[name]
    b, r = _run(seq, q, gen=gen, state=state, spec=spec, dtype=DTYPES[dtype])
    assert r.impl.last_path == "fa3_paged"
    assert r.impl.last_num_calls == calls
    check_output(b, r)
    check_cache_written(b, r)


def test_spec_decode_split_is_by_requests(gen):
    _, r = _run([140, 300, 23, 264], [3, 3, 10, 7], gen=gen, state=S.ChunkedPrefill, spec=2)
    assert (r.md.num_decodes, r.md.num_decode_tokens, r.md.num_prefills) == (2, 6, 2)


@pytest.mark.parametrize("name", ["chunked_mixed", "spec_decodes_and_prefill", "decode_only"])
def test_scale_forwarded(name, gen):
    seq, q, state, spec, _ = CASES[name]
    b, r = _run(seq, q, gen=gen, state=state, spec=spec, scale=0.3)
    check_output(b, r, scale=0.3)


def test_padded_batch(gen):
    b, r = _run([19, 140, 30, 13], [1, 1, 6, 13], gen=gen, state=S.ChunkedPrefill, num_input_tokens=28)
    check_output(b, r)
    check_cache_written(b, r)


def test_same_as_gqa_path(gen):
    b, r = _run([19, 140, 300, 13], [1, 1, 6, 13], gen=gen, state=S.ChunkedPrefill)
    builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=BS,
                                  num_blocks=b.num_blocks)
    md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, attn_state=S.ChunkedPrefill)
    out = torch.zeros_like(r.out)
    aar.AttentionImpl(N, D, num_kv_heads=NKV).forward(b.q, None, None, b.key_cache, b.value_cache, md, out)
    n = b.num_actual_tokens
    assert torch.allclose(out[:n], r.out[:n], atol=1e-5)


def test_encoder_pooling(gen):
    b, r = _run([5, 17, 9], [5, 17, 9], gen=gen, causal=False, pooling=True, attn_type="encoder_only")
    assert r.impl.last_path == "encoder"
    check_output(b, r, causal=False)


def test_metadata_none_zero_fills(gen):
    impl = aar.FA3AttentionImpl(N, D, num_kv_heads=NKV)
    out = torch.full((3, N, D), SENTINEL)
    impl.forward(out.clone(), None, None, None, None, None, out)
    assert bool((out == 0).all()) and impl.last_path == "none"


def test_backend_facts():
    assert aar.FA3Backend.name() == "CUSTOM"
    assert aar.FA3Backend.supported_block_sizes() == [128]
    assert aar.FA3Backend.kv_cache_shape(10, 128, 4, 64) == [2, 10, 128, 4, 64]
    with pytest.raises(ValueError, match="block_size 64 is not supported by the FA3 backend"):
        aar.FA3Backend.kv_cache_shape(10, 64, 4, 64)


def test_rejections(gen):
    with pytest.raises(NotImplementedError, match="sliding_window=8 is not supported by the FA3 backend"):
        aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, sliding_window=8)
    with pytest.raises(NotImplementedError, match="FULL_DECODE_ONLY"):
        aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, enforce_eager=False, full_decode_only_graph=True)
    aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, enforce_eager=True, full_decode_only_graph=True)
    aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, enforce_eager=False)
    with pytest.raises(NotImplementedError, match="sinks"):
        aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, sinks=torch.zeros(N))
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, kv_cache_dtype="int8")
    # a block size other than 128, and no cache at all
    b = make_batch([19, 40], [1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32, block_size=32,
                   gen=gen)
    md = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=4, block_size=32,
                             num_blocks=b.num_blocks).build(b.query_start_loc, b.seq_lens_t, b.block_table)
    impl = aar.FA3AttentionImpl(N, D, num_kv_heads=NKV)
    out = torch.zeros(b.q.shape)
    kc0 = b.key_cache.clone()
    with pytest.raises(ValueError, match="block_size 128 only"):
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
    assert torch.equal(kc0, b.key_cache)
    with pytest.raises(ValueError, match="key_cache and value_cache are required"):
        impl.forward(b.q, b.k, b.v, None, None, md, out)
