"""Every public entry validates before it writes: bad input raises ValueError
whose message names the argument, and a rejected forward / KV write leaves the
cache bit-identical."""

import pytest
import torch

import ascend_attn_rt as aar
from _reference import make_batch

S = aar.AttentionState

N, NKV, D, BS, NB = 8, 2, 64, 16, 16
MAX_REQS, MAX_TOKENS, MAX_BLOCKS = 4, 16, 4


def _builder(**kw):
    cfg = dict(max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS, max_blocks_per_req=MAX_BLOCKS, block_size=BS,
               num_blocks=NB)
    cfg.update(kw)
    return aar.MetadataBuilder(**cfg)


def _good():
    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    seq = torch.tensor([10, 20, 30], dtype=torch.int32)
    bt = torch.tensor([[3, 0, 0, 0], [5, 7, 0, 0], [2, 9, 0, 0]], dtype=torch.int32)
    return qsl, seq, bt


def test_good_inputs_build():
    md = _builder().build(*_good())
    assert md.num_actual_tokens == 6


# ----------------------------------------------------------------------------- builder.build


def _bad_build_cases():
    cases = []

    def add(name, match, mutate, **build_kw):
        cases.append(pytest.param(mutate, match, build_kw, id=name))

    def set_qsl(v):
        return lambda qsl, seq, bt: (torch.tensor(v, dtype=torch.int32), seq, bt)

    def set_seq(v):
        return lambda qsl, seq, bt: (qsl, torch.tensor(v, dtype=torch.int32), bt)

    def set_bt(r, c, val):
        def f(qsl, seq, bt):
            bt = bt.clone()
            bt[r, c] = val
            return qsl, seq, bt
        return f

    add("qsl_non_monotonic", "query_start_loc", set_qsl([0, 2, 1, 6]))
    add("qsl_not_starting_at_zero", "query_start_loc", set_qsl([1, 2, 3, 6]))
    add("qsl_negative", "query_start_loc", set_qsl([0, -1, 2, 6]))
    add("seq_lens_negative", "seq_lens", set_seq([10, -1, 30]))
    add("seq_len_less_than_query_len", "seq_lens", set_seq([10, 20, 3]))
    add("seq_lens_wrong_length", "seq_lens", set_seq([10, 20]))
    add("block_id_too_large", "block_table", set_bt(2, 1, NB))
    add("block_id_way_too_large", "block_table", set_bt(0, 0, 1 << 20))
    add("block_id_negative", "block_table", set_bt(0, 0, -1))
    add("block_id_negative_second_column", "block_table", set_bt(1, 1, -5))
    add("seq_needs_more_columns_than_table", "block_table|seq_lens", set_seq([10, 20, 80]))
    add("block_table_too_few_rows", "block_table", lambda qsl, seq, bt: (qsl, seq, bt[:2].clone()))
    add("block_table_too_wide", "block_table",
        lambda qsl, seq, bt: (qsl, seq, torch.zeros(3, MAX_BLOCKS + 1, dtype=torch.int32).index_copy_(
            1, torch.arange(4), bt)))
    add("block_table_1d", "block_table", lambda qsl, seq, bt: (qsl, seq, bt.flatten().clone()))
    add("seq_lens_int64", "seq_lens", lambda qsl, seq, bt: (qsl, seq.to(torch.int64), bt))
    add("qsl_int64", "query_start_loc", lambda qsl, seq, bt: (qsl.to(torch.int64), seq, bt))
    add("block_table_float", "block_table", lambda qsl, seq, bt: (qsl, seq, bt.to(torch.float32)))
    add("qsl_2d", "query_start_loc", lambda qsl, seq, bt: (qsl[None].clone(), seq, bt))
    add("qsl_meta_device", "query_start_loc", lambda qsl, seq, bt: (qsl.to("meta"), seq, bt))
    add("too_many_requests", "max_num_reqs|num_reqs|query_start_loc|seq_lens",
        lambda qsl, seq, bt: (torch.arange(6, dtype=torch.int32), torch.full((5,), 3, dtype=torch.int32),
                              torch.arange(1, 6, dtype=torch.int32)[:, None].repeat(1, 2).contiguous()))
    add("too_many_requests_by_two", "max_num_reqs|num_reqs|query_start_loc|seq_lens",
        lambda qsl, seq, bt: (torch.arange(7, dtype=torch.int32), torch.full((6,), 3, dtype=torch.int32),
                              torch.arange(1, 7, dtype=torch.int32)[:, None].repeat(1, 2).contiguous()))
    add("too_many_tokens", "max_num_tokens|num_tokens|query_start_loc",
        lambda qsl, seq, bt: (torch.tensor([0, 1, 2, MAX_TOKENS + 1], dtype=torch.int32),
                              torch.tensor([10, 20, MAX_TOKENS + 1], dtype=torch.int32),
                              torch.tensor([[3, 0, 0, 0], [5, 7, 0, 0], [2, 9, 4, 0]], dtype=torch.int32)))
    add("num_input_tokens_below_actual", "num_input_tokens", lambda *a: a, num_input_tokens=5)
    add("num_input_tokens_above_max", "num_input_tokens|max_num_tokens", lambda *a: a,
        num_input_tokens=MAX_TOKENS + 1)
    add("num_input_tokens_negative", "num_input_tokens", lambda *a: a, num_input_tokens=-1)
    add("num_spec_tokens_wrong_length", "num_spec_tokens", lambda *a: a,
        num_spec_tokens=torch.tensor([0, 0], dtype=torch.int32))
    add("num_spec_tokens_more_than_scheduled", "num_spec_tokens", lambda *a: a,
        num_spec_tokens=torch.tensor([0, 2, 0], dtype=torch.int32))
    return cases


@pytest.mark.parametrize("mutate,match,build_kw", _bad_build_cases())
def test_build_rejects(mutate, match, build_kw):
    b = _builder()
    args = mutate(*_good())
    with pytest.raises(ValueError, match=match):
        b.build(*args, **build_kw)
    # The builder stays usable after a rejected build.
    md = b.build(*_good())
    assert md.seq_lens_list[:3] == [10, 20, 30]


def test_rejected_build_keeps_previous_metadata_usable():
    # A failed build must not have half-written the staging buffers: rebuilding works and
    # the slot mapping is the one of the good inputs.
    b = _builder()
    md = b.build(*_good())
    slots = md.slot_mapping[:6].clone()
    qsl, seq, bt = _good()
    bt_bad = bt.clone()
    bt_bad[2, 1] = NB + 3
    with pytest.raises(ValueError, match="block_table"):
        b.build(qsl, seq, bt_bad)
    md = b.build(*_good())
    assert torch.equal(md.slot_mapping[:6], slots)


# ----------------------------------------------------------------------------- builder / impl construction


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(block_size=24), "block_size"),
        (dict(block_size=0), "block_size"),
        (dict(num_speculative_tokens=16), "num_speculative_tokens"),
        (dict(num_speculative_tokens=-1), "num_speculative_tokens"),
        (dict(spec_method="eagle9"), "spec_method"),
        (dict(max_num_reqs=0), "max_num_reqs"),
        (dict(max_num_tokens=0), "max_num_tokens"),
        (dict(max_blocks_per_req=0), "max_blocks_per_req"),
        (dict(num_blocks=0), "num_blocks"),
    ],
)
def test_builder_construction_rejects(kw, match):
    with pytest.raises(ValueError, match=match):
        _builder(**kw)


@pytest.mark.parametrize(
    "args,kw,match",
    [
        ((8, 64), dict(num_kv_heads=3), "num_kv_heads|num_heads"),
        ((8, 64), dict(num_kv_heads=16), "num_kv_heads|num_heads"),
        ((0, 64), dict(), "num_heads"),
        ((8, 0), dict(), "head_size"),
        ((8, 64), dict(num_kv_heads=2, sinks=torch.zeros(9)), "sinks"),
        ((8, 64), dict(num_kv_heads=2, sinks=torch.zeros(2, 4)), "sinks"),
        ((8, 64), dict(attn_type="bogus"), "attn_type"),
        ((8, 64), dict(device_kind="z9"), "device_kind"),
        ((8, 64), dict(sliding_window=-4), "sliding_window"),
    ],
)
def test_impl_construction_rejects(args, kw, match):
    with pytest.raises(ValueError, match=match):
        aar.AttentionImpl(*args, **kw)


# ----------------------------------------------------------------------------- forward (KV write must not happen)


@pytest.fixture
def fwd():
    """A valid mixed batch + metadata; each test corrupts one argument."""
    g = torch.Generator().manual_seed(5)
    batch = make_batch([19, 40, 30], [1, 1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                       block_size=BS, gen=g, num_blocks=NB)
    b = _builder()
    md = b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table, attn_state=S.ChunkedPrefill)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    args = dict(query=batch.q, key=batch.k, value=batch.v, key_cache=batch.key_cache,
                value_cache=batch.value_cache, md=md, output=torch.zeros_like(batch.q))
    return batch, b, impl, args


def _call(impl, a):
    return impl.forward(a["query"], a["key"], a["value"], a["key_cache"], a["value_cache"], a["md"], a["output"])


def _bad_forward_cases():
    T = 8

    def p(name, match, fn):
        return pytest.param(fn, match, id=name)

    return [
        p("query_head_dim", "query", lambda a: a.update(query=torch.randn(T, N, D + 1))),
        p("query_num_heads", "query", lambda a: a.update(query=torch.randn(T, N + 1, D))),
        p("query_too_few_rows", "query", lambda a: a.update(query=a["query"][:5].clone())),
        p("query_2d", "query", lambda a: a.update(query=a["query"].reshape(T, N * D))),
        p("query_dtype_vs_cache", "query|key",
          lambda a: a.update(query=a["query"].to(torch.bfloat16), output=a["output"].to(torch.bfloat16))),
        p("query_fp32_vs_bf16_cache", "query|key_cache|value_cache|key",
          lambda a: a.update(key_cache=a["key_cache"].to(torch.bfloat16),
                             value_cache=a["value_cache"].to(torch.bfloat16),
                             key=a["key"].to(torch.bfloat16), value=a["value"].to(torch.bfloat16))),
        p("query_meta_device", "query", lambda a: a.update(query=torch.empty(T, N, D, device="meta"))),
        p("key_heads", "key", lambda a: a.update(key=torch.randn(T, NKV + 1, D))),
        p("key_head_dim", "key", lambda a: a.update(key=torch.randn(T, NKV, D - 1))),
        p("key_too_few_rows", "key", lambda a: a.update(key=a["key"][:4].clone())),
        p("key_dtype", "key", lambda a: a.update(key=a["key"].to(torch.float16))),
        p("value_shape", "value", lambda a: a.update(value=torch.randn(T, NKV, D + 2))),
        p("value_dtype", "value", lambda a: a.update(value=a["value"].to(torch.float64))),
        p("value_missing", "value", lambda a: a.update(value=None)),
        p("key_missing", "key", lambda a: a.update(key=None)),
        p("key_cache_block_size", "key_cache",
          lambda a: a.update(key_cache=torch.zeros(NB * 2, BS // 2, NKV, D),
                             value_cache=torch.zeros(NB * 2, BS // 2, NKV, D))),
        p("key_cache_heads", "key_cache",
          lambda a: a.update(key_cache=torch.zeros(NB, BS, NKV + 1, D), value_cache=torch.zeros(NB, BS, NKV + 1, D))),
        p("key_cache_3d", "key_cache", lambda a: a.update(key_cache=a["key_cache"].reshape(NB, BS, NKV * D))),
        p("value_cache_shape_differs", "value_cache",
          lambda a: a.update(value_cache=torch.zeros(NB, BS, NKV, D + 1))),
        p("cache_fewer_blocks_than_block_ids", "key_cache|value_cache|block",
          lambda a: a.update(key_cache=torch.zeros(4, BS, NKV, D), value_cache=torch.zeros(4, BS, NKV, D))),
        p("output_shape", "output", lambda a: a.update(output=torch.zeros(T, N, D + 1))),
        p("output_too_few_rows", "output", lambda a: a.update(output=torch.zeros(5, N, D))),
        p("output_dtype", "output", lambda a: a.update(output=torch.zeros(T, N, D, dtype=torch.float16))),
    ]


@pytest.mark.parametrize("corrupt,match", _bad_forward_cases())
def test_forward_rejects_without_writing(fwd, corrupt, match):
    batch, _, impl, args = fwd
    corrupt(args)
    kc = [t.clone() for t in (args["key_cache"], args["value_cache"], batch.key_cache, batch.value_cache)]
    with pytest.raises(ValueError, match=match):
        _call(impl, args)
    after = (args["key_cache"], args["value_cache"], batch.key_cache, batch.value_cache)
    for before, now in zip(kc, after):
        assert torch.equal(before, now), "cache modified by a rejected forward"


def test_forward_after_rejection_still_works(fwd):
    from _reference import assert_close

    batch, _, impl, args = fwd
    bad = dict(args, key=torch.randn(8, NKV + 1, D))
    with pytest.raises(ValueError):
        _call(impl, bad)
    out = _call(impl, args)
    assert_close(out[:8], batch.reference(), torch.float32)


# ----------------------------------------------------------------------------- block swaps / copies


def _caches(nb=6, fill_seed=0):
    g = torch.Generator().manual_seed(fill_seed)
    return [torch.randn(nb, 4, 2, 8, generator=g) for _ in range(4)]


@pytest.mark.parametrize(
    "pairs,match",
    [
        ([[0, 1], [6, 2]], "src_to_dst"),
        ([[0, 1], [2, -1]], "src_to_dst"),
        ([[0, 1, 2]], "src_to_dst"),
    ],
)
def test_swap_blocks_rejects(pairs, match):
    sk, sv, dk, dv = _caches()
    before = [t.clone() for t in (sk, sv, dk, dv)]
    with pytest.raises(ValueError, match=match):
        aar.Backend.swap_blocks(sk, sv, dk, dv, torch.tensor(pairs, dtype=torch.int64))
    for b, a in zip(before, (sk, sv, dk, dv)):
        assert torch.equal(b, a)


def test_swap_blocks_rejects_shape_mismatch():
    sk, sv, dk, dv = _caches()
    dk2 = torch.zeros(6, 4, 2, 9)
    with pytest.raises(ValueError, match="dst_k|dst_key|key|shape"):
        aar.Backend.swap_blocks(sk, sv, dk2, dv, torch.tensor([[0, 1]]))


@pytest.mark.parametrize("pairs", [[[0, 1], [7, 2]], [[-2, 1]], [[0, 6]]])
def test_copy_blocks_rejects(pairs):
    k, v, k2, v2 = _caches()
    before = [t.clone() for t in (k, v, k2, v2)]
    with pytest.raises(ValueError, match="src_to_dsts"):
        aar.Backend.copy_blocks([(k, v), (k2, v2)], torch.tensor(pairs, dtype=torch.int64))
    for b, a in zip(before, (k, v, k2, v2)):
        assert torch.equal(b, a)


# ----------------------------------------------------------------------------- plan helpers


def test_split_rejects_non_monotonic():
    with pytest.raises(ValueError, match="query_start_loc"):
        aar.plan.split_decodes_and_prefills(torch.tensor([0, 3, 2], dtype=torch.int32), 3, 3)


def test_select_state_rejects_negative():
    with pytest.raises(ValueError):
        aar.plan.select_attention_state(torch.tensor([-1, 0], dtype=torch.int32),
                                        torch.tensor([1, 1], dtype=torch.int32))


def test_select_state_rejects_length_mismatch():
    with pytest.raises(ValueError):
        aar.plan.select_attention_state(torch.tensor([0, 0, 3], dtype=torch.int32),
                                        torch.tensor([1, 1], dtype=torch.int32))
