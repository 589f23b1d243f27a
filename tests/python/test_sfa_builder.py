"""The SFA metadata builder and backend facts (docs/design/sfa.md §2.1, §3.2, §2.2, §2.3, docs/design/sparse.md §8; the test_sfa_v1.py and
test_indexer.py rows of docs/design/sfa.md §8).

The builder is checked against a naive Python model of docs/design/sfa.md §3.1-§3.2 written one request at a time, over random
batches: decode-only, prefill, mixed in any order (SFA does not reorder), speculative, graph padding, staged and
host block tables, aliased and separate device buffers, one to four staging buffers, several RoPE dtypes and
block sizes. Then: stable addresses across builds, draft lanes distinct from the main one, bad input rejected by
name with the previous metadata intact, the graph-capture state rule, the cache tuple composition, the top-k
buffer and the indexer backend contract."""

import random

import pytest
import torch

import ascend_attn_rt as aar

sfa = aar.sfa
S = aar.AttentionState
R = 8  # RoPE dim of the test tables


def rope(max_pos, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    half_c, half_s = torch.randn(max_pos, R // 2, generator=g), torch.randn(max_pos, R // 2, generator=g)
    return torch.cat([half_c, half_c], 1).to(dtype), torch.cat([half_s, half_s], 1).to(dtype)


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def qsl_of(q_lens):
    out = [0]
    for q in q_lens:
        out.append(out[-1] + q)
    return out


def state_rule(q, seq, spec, speculative, chunked):
    """docs/design/gqa.md §2.1 (model runner v1) with the post-rule; MTP when speculative."""
    if not q:
        return S.DecodeOnly
    computed = [s - x for s, x in zip(seq, q)]
    if all(c == 0 for c in computed):
        st = S.PrefillNoCache
    elif all(x == 1 for x in q):
        st = S.SpecDecoding if speculative else S.DecodeOnly
    elif all(x - sp == 1 for x, sp in zip(q, spec)):
        st = S.SpecDecoding if speculative else S.ChunkedPrefill
    elif chunked:
        st = S.ChunkedPrefill
    else:
        st = S.PrefillCacheHit
    return st


def naive(qsl, seq, table, mb, bs, thr, t_in, pad, cos, sin, spec, speculative, chunked):
    """Every metadata field, from docs/design/sfa.md §3.1-§3.2 (and the graph padding rule), one request at a time."""
    B = len(seq)
    q = [qsl[i + 1] - qsl[i] for i in range(B)]
    cql, kv = list(qsl[1:]), list(seq)
    rows = [list(table[r]) + [0] * (mb - len(table[r])) for r in range(B)]
    slots, pos = [], []
    for r in range(B):
        for p in range(seq[r] - q[r], seq[r]):
            slots.append(table[r][p // bs] * bs + p % bs)
            pos.append(p)
    t_real = qsl[-1]
    slots += [-1] * (t_in - t_real)
    pos += [0] * (t_in - t_real)
    if pad and B and max(q) <= thr and t_in > t_real:
        for i in range((t_in - t_real) // thr):
            cql.append(t_real + (i + 1) * thr)
            kv.append(0)
            rows.append([0] * mb)
    nd = 0
    while nd < B and q[nd] <= thr:
        nd += 1
    if B and max(q) <= thr:
        nd = B
    return dict(cql=cql, kv=kv, rows=rows, slots=slots, cos=cos[pos], sin=sin[pos], bk=len(cql),
                state=state_rule(q, seq, spec or [0] * B, speculative, chunked), nd=nd, ndt=qsl[nd], np=B - nd,
                max_q=max(q, default=0), max_seq=max(seq, default=0))


def random_batch(rng, bs, mb, max_reqs, thr, kind):
    B = rng.randint(0 if kind == "any" else 1, max_reqs)
    q = []
    for _ in range(B):
        if kind == "decode":
            q.append(rng.randint(1, thr))
        elif kind == "prefill":
            q.append(rng.randint(thr + 1, 2 * bs + 3))
        else:
            q.append(rng.choice([1, rng.randint(1, thr), rng.randint(0, 3 * bs)]))
    seq = []
    cap = mb * bs
    for i in range(B):
        q[i] = min(q[i], cap)
        ctx = rng.choice([0, bs, 2 * bs - q[i] % bs, rng.randint(0, cap - q[i])])  # block boundaries
        seq.append(min(cap, max(0, ctx) + q[i]))
    return q, seq


def check(md, want, builder=None):
    assert md.num_kernel_reqs == want["bk"]
    assert md.cum_query_lens.tolist() == want["cql"] and md.cum_query_lens.dtype == torch.int32
    assert md.seq_lens.tolist() == want["kv"] and md.seq_lens.dtype == torch.int32
    assert md.cum_query_lens_list == want["cql"] and md.seq_lens_list == want["kv"]
    assert md.block_table.tolist() == want["rows"] and md.block_table.dtype == torch.int32
    assert md.slot_mapping.tolist() == want["slots"] and md.slot_mapping.dtype == torch.int64
    assert md.cos.dtype == want["cos"].dtype and torch.equal(md.cos, want["cos"])
    assert torch.equal(md.sin, want["sin"])
    assert md.attn_state == want["state"]
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (want["nd"], want["ndt"], want["np"])
    assert (md.max_query_len, md.max_seq_len) == (want["max_q"], want["max_seq"])
    assert md.is_current


@pytest.mark.parametrize("bs,thr,separate,dtype,staging", [
    (16, 1, False, torch.float32, 2), (32, 2, True, torch.float16, 1), (128, 1, False, torch.bfloat16, 2),
    (48, 4, True, torch.float32, 3), (16, 3, True, torch.bfloat16, 4)])
@pytest.mark.parametrize("pad", [False, True])
def test_builder_matches_naive_model(bs, thr, separate, dtype, staging, pad):
    rng = random.Random(hash((bs, thr, separate, pad)) & 0xFFFF)
    mb, max_reqs, nb = 5, 8, 8 * 5 + 3
    max_tokens = max_reqs * 3 * bs + 16
    cos, sin = rope(mb * bs, dtype, seed=bs)
    builder = sfa.MetadataBuilder(
        max_num_reqs=max_reqs, max_num_tokens=max_tokens, max_blocks_per_req=mb, block_size=bs, num_blocks=nb,
        cos_table=cos, sin_table=sin, num_speculative_tokens=thr - 1, separate_device_buffers=separate,
        graph_decode_padding=pad, staging_buffers=staging, chunked_prefill_enabled=bs != 48)
    assert builder.decode_threshold == thr and builder.num_drafts == thr - 1
    kinds = ["decode", "prefill", "mixed", "any"]
    for it in range(60):
        kind = kinds[it % 4]
        q, seq = random_batch(rng, bs, mb, max_reqs, thr, kind)
        B = len(seq)
        qsl = qsl_of(q)
        width = rng.choice([mb, mb - 1]) if it % 5 else mb
        table = torch.randint(0, nb, (B, width), dtype=torch.int32)
        need = [(s + bs - 1) // bs for s in seq]
        if any(n > width for n in need):
            width = mb
            table = torch.randint(0, nb, (B, mb), dtype=torch.int32)
        staged = it % 3 == 0 and width == mb
        if staged:
            builder.block_table_staging[:B].copy_(table)
            bt = builder.block_table_staging[:B]
        else:
            bt = table
        spec = [rng.randint(0, x) for x in q] if thr > 1 and it % 2 else None
        pad_room = (max_reqs - B) * thr
        t_in = qsl[-1] + rng.choice([0, 0, min(thr, pad_room), min(3 * thr, pad_room)])
        md = builder.build(i32(qsl), i32(seq), bt, num_input_tokens=t_in,
                           num_spec_tokens=None if spec is None else i32(spec))
        want = naive(qsl, seq, table.tolist(), mb, bs, thr, t_in, pad, cos, sin, spec, thr > 1, bs != 48)
        check(md, want)
        assert md.num_reqs == B and md.num_actual_tokens == qsl[-1] and md.num_input_tokens == t_in
        assert md.query_start_loc.tolist() == qsl
        assert md.block_size == bs and md.num_blocks == nb and md.speculative == (thr > 1)
        assert md.draft_index == -1 and md.generation == builder.generation


def test_empty_batch_and_padding_tokens_of_a_step_with_prefills():
    cos, sin = rope(64)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            cos_table=cos, sin_table=sin, graph_decode_padding=True)
    md = b.build(i32([0]), i32([]), torch.zeros(0, 4, dtype=torch.int32), num_input_tokens=3)
    assert md.attn_state == S.DecodeOnly and md.num_kernel_reqs == 0 and md.slot_mapping.tolist() == [-1] * 3
    assert torch.equal(md.cos, cos[[0, 0, 0]])
    # A prefill step is not padded with dummies: its padding tokens get slot -1 and position 0's rows.
    md = b.build(i32([0, 1, 4]), i32([5, 20]), i32([[1, 2, 0, 0], [3, 4, 0, 0]]), num_input_tokens=6)
    assert md.num_kernel_reqs == 2 and md.cum_query_lens.tolist() == [1, 4]
    assert md.slot_mapping.tolist() == [1 * 16 + 4, 4 * 16 + 1, 4 * 16 + 2, 4 * 16 + 3, -1, -1]
    assert torch.equal(md.cos, cos[[4, 17, 18, 19, 0, 0]])


def test_stable_addresses_across_builds():
    """Every tensor is a view of one packed device buffer; the length lists, block table and query_start_loc start
    at fixed addresses, the token views at an address that depends on the token count only (docs/design/sfa.md §3.2)."""
    cos, sin = rope(128)
    for separate in (False, True):
        b = sfa.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=8, block_size=16,
                                num_blocks=32, cos_table=cos, sin_table=sin, separate_device_buffers=separate,
                                graph_decode_padding=True)
        rng = random.Random(3)
        fixed, by_tokens, storages = {}, {}, set()
        for it in range(40):
            q, seq = random_batch(rng, 16, 8, 8, 1, ["decode", "mixed"][it % 2])
            qsl = qsl_of(q)
            if qsl[-1] > 64:
                continue
            md = b.build(i32(qsl), i32(seq), torch.randint(0, 32, (len(q), 8), dtype=torch.int32),
                         num_input_tokens=qsl[-1] + (2 if it % 2 == 0 and qsl[-1] + 2 <= 8 else 0))
            for name in ("cum_query_lens", "seq_lens", "block_table", "query_start_loc"):
                t = getattr(md, name)
                assert fixed.setdefault(name, t.data_ptr()) == t.data_ptr(), name
            for name in ("slot_mapping", "cos", "sin"):
                t = getattr(md, name)
                key = (name, md.num_input_tokens)
                assert by_tokens.setdefault(key, t.data_ptr()) == t.data_ptr(), key
            for name in ("cum_query_lens", "seq_lens", "block_table", "query_start_loc", "slot_mapping", "cos", "sin"):
                storages.add(getattr(md, name).untyped_storage().data_ptr())
        assert len(storages) == 1  # one packed buffer
        # The token views of a step sit right below the request part: one contiguous range per build.
        md = b.build(i32([0, 1, 2]), i32([3, 9]), i32([[1] * 8, [2] * 8]))
        elt = md.cos.element_size()
        assert md.slot_mapping.data_ptr() < md.cos.data_ptr() < md.sin.data_ptr() < md.query_start_loc.data_ptr()
        assert md.query_start_loc.data_ptr() - (md.sin.data_ptr() + md.sin.numel() * elt) < 64
        assert md.cum_query_lens.data_ptr() < md.seq_lens.data_ptr() < md.block_table.data_ptr()
        for t in (md.slot_mapping, md.cos, md.sin, md.query_start_loc, md.cum_query_lens, md.block_table):
            assert t.data_ptr() % 64 == md.block_table.data_ptr() % 64  # 64-byte aligned regions


def test_draft_lanes_are_distinct_and_stamped_apart():
    """docs/design/sfa.md §8 (test_sfa_v1.py): cum_query_lens / seq_lens are views of static buffers and the draft buffers are
    distinct; here every draft lane has its own buffers and stamp counter."""
    cos, sin = rope(128)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                            cos_table=cos, sin_table=sin, num_speculative_tokens=2)
    assert b.num_drafts == 2
    table = i32([[1, 2, 3, 4], [5, 6, 7, 8]])
    main = b.build(i32([0, 3, 6]), i32([10, 20]), table)
    drafts = [b.build_for_drafting(i32([0, 1, 2]), i32([11 + d, 21 + d]), table, d) for d in range(2)]
    assert main.is_current and all(d.is_current for d in drafts)
    assert [d.draft_index for d in drafts] == [0, 1] and main.draft_index == -1
    names = ("cum_query_lens", "seq_lens", "block_table", "slot_mapping", "cos", "sin", "query_start_loc")
    ptrs = [{getattr(m, n).data_ptr() for n in names} for m in [main] + drafts]
    stor = [getattr(m, "cum_query_lens").untyped_storage().data_ptr() for m in [main] + drafts]
    assert len(set(stor)) == 3
    assert not (ptrs[0] & ptrs[1]) and not (ptrs[0] & ptrs[2]) and not (ptrs[1] & ptrs[2])
    # Each keeps its own values.
    assert main.seq_lens_list == [10, 20] and main.cum_query_lens.tolist() == [3, 6]
    assert drafts[0].seq_lens_list == [11, 21] and drafts[1].seq_lens.tolist() == [12, 22]
    assert b.draft_metadata(1).seq_lens_list == [12, 22]
    # A lane's next build makes only that lane's metadata stale.
    again = b.build_for_drafting(i32([0, 1, 2]), i32([13, 23]), table, 0)
    assert not drafts[0].is_current and drafts[1].is_current and main.is_current and again.is_current
    with pytest.raises(ValueError, match="stale"):
        drafts[0].seq_lens_list
    assert b.generation == 1 and b.draft_generation(0) == 2 and b.draft_generation(1) == 1
    b.build(i32([0, 1]), i32([4]), table[:1])
    assert not main.is_current and again.is_current
    # A draft lane takes max_num_reqs * decode_threshold requests.
    big = b.build_for_drafting(i32(list(range(13))), i32([5] * 12), torch.ones(12, 4, dtype=torch.int32), 1)
    assert big.num_reqs == 12
    with pytest.raises(ValueError, match=r"num_reqs=13 .*draft lane's request capacity"):
        b.build_for_drafting(i32(list(range(14))), i32([5] * 13), torch.ones(13, 4, dtype=torch.int32), 1)
    with pytest.raises(ValueError, match=r"num_reqs=5 \(seq_lens entries\) exceeds the builder's max_num_reqs=4"):
        b.build(i32(list(range(6))), i32([5] * 5), torch.ones(5, 4, dtype=torch.int32))
    for d in (-1, 2):
        with pytest.raises(ValueError, match=rf"draft_index={d} is out of range \[0, num_drafts=2\)"):
            b.build_for_drafting(i32([0, 1]), i32([4]), table[:1], d)
    with pytest.raises(ValueError, match="draft_index=5"):
        b.draft_metadata(5)
    # num_drafts may be set apart from the speculative tokens.
    b0 = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                             cos_table=cos, sin_table=sin, num_drafts=1)
    assert b0.num_drafts == 1 and b0.decode_threshold == 1


def test_block_table_staging_is_zero_copy_on_the_cpu():
    cos, sin = rope(128)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                            cos_table=cos, sin_table=sin)
    st = b.block_table_staging
    assert st.shape == (4, 4) and st.dtype == torch.int32
    st[:2] = i32([[1, 2, 3, 4], [5, 6, 7, 8]])
    md = b.build(i32([0, 1, 2]), i32([40, 50]), st[:2])
    assert md.block_table.data_ptr() == st.data_ptr()  # the staged rows are the metadata's rows
    assert md.slot_mapping.tolist() == [3 * 16 + 7, 8 * 16 + 1]
    sep = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                              cos_table=cos, sin_table=sin, separate_device_buffers=True)
    st2 = sep.block_table_staging
    st2[:1] = i32([[9, 1, 2, 3]])
    md2 = sep.build(i32([0, 1]), i32([20]), st2[:1])
    assert md2.block_table.data_ptr() != st2.data_ptr()
    st2.fill_(0)  # the engine's own table: free once build returns
    assert md2.block_table.tolist() == [[9, 1, 2, 3]] and md2.slot_mapping.tolist() == [1 * 16 + 3]


def test_graph_padding():
    cos, sin = rope(128)
    b = sfa.MetadataBuilder(max_num_reqs=6, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                            cos_table=cos, sin_table=sin, num_speculative_tokens=1, graph_decode_padding=True)
    table = i32([[1, 2, 3, 4], [5, 6, 7, 8]])
    md = b.build(i32([0, 2, 3]), i32([10, 20]), table, num_input_tokens=7)
    assert md.num_reqs == 2 and md.num_kernel_reqs == 4
    assert md.cum_query_lens.tolist() == [2, 3, 5, 7] and md.seq_lens.tolist() == [10, 20, 0, 0]
    assert md.block_table.tolist()[2:] == [[0] * 4] * 2
    assert md.slot_mapping.tolist()[3:] == [-1] * 4 and torch.equal(md.cos[3:], cos[[0] * 4])
    prev = md.cum_query_lens.clone()
    with pytest.raises(ValueError, match="not a multiple of the decode length 2"):
        b.build(i32([0, 2, 3]), i32([10, 20]), table, num_input_tokens=6)
    with pytest.raises(ValueError, match=r"graph decode padding: 2 decodes \+ 5 dummy requests .* room for 6"):
        b.build(i32([0, 2, 3]), i32([10, 20]), table, num_input_tokens=13)
    assert md.is_current and torch.equal(md.cum_query_lens, prev)


def test_build_for_graph_capture_state_rule():
    cos, sin = rope(128)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                            cos_table=cos, sin_table=sin, graph_decode_padding=True)
    table = i32([[1, 2, 3, 4]] * 2)
    for st in (S.DecodeOnly, S.SpecDecoding):
        md = b.build_for_graph_capture(i32([0, 1, 2]), i32([3, 4]), table, num_input_tokens=4, state=st)
        assert md.attn_state == st and md.num_kernel_reqs == 4
    gen = b.generation
    for st in (S.PrefillNoCache, S.PrefillCacheHit, S.ChunkedPrefill):
        with pytest.raises(NotImplementedError, match=f"attention state {st.name} cannot be captured"):
            b.build_for_graph_capture(i32([0, 1, 2]), i32([3, 4]), table, state=st)
    assert b.generation == gen and md.is_current


def test_bad_input_is_rejected_by_name_and_the_previous_metadata_stays():
    cos, sin = rope(64)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            cos_table=cos, sin_table=sin)
    good = dict(query_start_loc=i32([0, 1, 4]), seq_lens=i32([5, 20]), block_table=i32([[1, 2, 0, 0], [3, 4, 5, 6]]))
    md = b.build(**good)
    before = {n: getattr(md, n).clone() for n in ("cum_query_lens", "seq_lens", "block_table", "slot_mapping", "cos",
                                                   "sin", "query_start_loc")}
    lists = (md.seq_lens_list, md.cum_query_lens_list)
    cases = [
        (dict(query_start_loc=i32([0, 4, 1])), "query_start_loc must be non-decreasing"),
        (dict(query_start_loc=i32([1, 2, 4])), r"query_start_loc\[0\]=1 must be 0"),
        (dict(query_start_loc=i32([0, 1])), "query_start_loc has 2 entries"),
        (dict(query_start_loc=good["query_start_loc"].long()), "query_start_loc must be Int"),
        (dict(seq_lens=i32([0, 20])), r"seq_lens\[0\]=0 is smaller than its query length 1"),
        (dict(seq_lens=i32([5, 65])), r"seq_lens\[1\]=65 needs 5 blocks but block_table_stride=4"),
        (dict(seq_lens=i32([5, 64]), block_table=i32([[1, 2, 0, 0], [3, 4, 5, 9]])),
         r"block_table\[1\]\[3\]=9 is out of range \[0, 8\)"),
        (dict(block_table=i32([[-1, 2, 0, 0], [3, 4, 5, 6]])), r"block_table\[0\]\[0\]=-1 is out of range"),
        (dict(block_table=i32([[1, 2, 0, 0]])), "block_table has 4 entries, fewer than"),
        (dict(block_table=torch.zeros(2, 5, dtype=torch.int32)), "more than the builder's max_blocks_per_req=4"),
        (dict(block_table=good["block_table"].t().contiguous().t()), "block_table must be contiguous"),
        (dict(block_table=good["block_table"].to("meta")), "block_table must be a host"),
        (dict(num_input_tokens=3), "num_input_tokens=3 is smaller than query_start_loc"),
        (dict(num_input_tokens=-2), "num_input_tokens=-2 is negative"),
        (dict(num_input_tokens=17), "num_tokens=17 .* exceeds the builder's max_num_tokens=16"),
        (dict(num_spec_tokens=i32([0, 4])), r"num_spec_tokens\[1\]=4 is out of range"),
        (dict(num_spec_tokens=i32([0])), "num_spec_tokens has 1 entries"),
        (dict(query_start_loc="nope"), "query_start_loc must be a torch.Tensor"),
    ]
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            b.build(**{**good, **change})
            pytest.fail(f"accepted: {msg}")
        assert md.is_current and b.generation == md.generation
        for n, t in before.items():
            assert torch.equal(getattr(md, n), t), (msg, n)
        assert (md.seq_lens_list, md.cum_query_lens_list) == lists
    # RoPE positions past the tables.
    short = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=16,
                                num_blocks=8, cos_table=cos[:10], sin_table=sin[:10])
    with pytest.raises(ValueError, match=r"seq_lens\[1\]=20 exceeds the RoPE table length 10"):
        short.build(**good)


def test_stale_metadata_lists_are_rejected():
    cos, sin = rope(64)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            cos_table=cos, sin_table=sin)
    t = i32([[1, 2, 3, 4]])
    old = b.build(i32([0, 1]), i32([5]), t)
    new = b.build(i32([0, 1]), i32([6]), t)
    assert not old.is_current and new.is_current and new.generation == old.generation + 1
    for name in ("seq_lens_list", "cum_query_lens_list"):
        with pytest.raises(ValueError, match="stale"):
            getattr(old, name)
    assert new.seq_lens_list == [6] and b.metadata.seq_lens_list == [6]


def test_builder_config_is_validated():
    cos, sin = rope(64)
    base = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=16, num_blocks=8, cos_table=cos,
                sin_table=sin)
    for change, msg in [
        (dict(block_size=8), "block_size 8 is not supported"), (dict(block_size=256), "block_size 256"),
        (dict(block_size=40), "block_size 40"), (dict(num_blocks=0), "num_blocks must be positive"),
        (dict(max_num_reqs=0), "max_num_reqs"), (dict(max_num_tokens=0), "max_num_tokens"),
        (dict(max_blocks_per_req=0), "max_blocks_per_req"),
        (dict(num_speculative_tokens=16), r"num_speculative_tokens must be in \[0, 15\]"),
        (dict(num_drafts=-1), "num_drafts"), (dict(staging_buffers=5), "staging_buffers"),
        (dict(cos_table=cos[:, :3], sin_table=sin[:, :3]), "cos_table must be a"),
        (dict(sin_table=sin[:8]), "must have the same shape"),
        (dict(sin_table=sin.double()), "must match"),
        (dict(cos_table=torch.zeros(8, 2, dtype=torch.float8_e4m3fn),
              sin_table=torch.zeros(8, 2, dtype=torch.float8_e4m3fn)),
         "cos_table rows are 2 bytes .*multiple of 4 bytes"),
    ]:
        with pytest.raises(ValueError, match=msg):
            sfa.MetadataBuilder(**{**base, **change})
    for bs in (16, 32, 48, 64, 80, 96, 112, 128):
        sfa.MetadataBuilder(**{**base, "block_size": bs})


# ----------------------------------------------------------------------------- backend facts (docs/design/sfa.md §2.1, §2.2, §2.3)


def test_backend_facts():
    B = sfa.Backend
    assert B.name() == "ASCEND_SFA" and B.supported_block_sizes() == [128] and B.graph_support() == "UNIFORM_BATCH"
    assert B.reorder_batch() is False
    assert B.is_builder_block_size(16) and B.is_builder_block_size(48) and not B.is_builder_block_size(8)
    assert B.kv_cache_shape(10, 128, 1, 656) == [10, 128, 1, 656]
    assert B.kv_cache_stride_order() == [0, 1, 2, 3] and B.kv_cache_stride_order(True) == [0, 1, 2, 3, 4]
    assert B.main_cache_shapes(10, 128) == [[10, 128, 1, 512], [10, 128, 1, 64]]
    assert B.main_cache_shapes(10, 128, sfa_c8=True) == [[10, 128, 1, 656]]
    assert B.main_cache_shapes(3, 16, True, kv_lora_rank=256, qk_rope_head_dim=32) == [[3, 16, 1, 256 + 64 + 8]]
    assert B.main_cache_dtypes(False, "a2", torch.bfloat16) == [torch.bfloat16, torch.bfloat16]
    assert B.main_cache_dtypes(True, "a3", torch.bfloat16) == [torch.int8]
    assert B.main_cache_dtypes(True, "a5", torch.bfloat16) == [torch.float8_e4m3fn]
    with pytest.raises(ValueError, match="block_size=100 is not supported"):
        B.kv_cache_shape(10, 100, 1, 512)
    with pytest.raises(ValueError, match="kv_lora_rank=100 must be a multiple of the SFA C8 tile 128"):
        B.main_cache_shapes(10, 128, True, kv_lora_rank=100)
    with pytest.raises(ValueError, match="model_dtype must be"):
        B.main_cache_dtypes(False, "a2", torch.int32)
    with pytest.raises(ValueError, match="device_kind"):
        B.main_cache_dtypes(False, "a9", torch.bfloat16)


def test_indexer_backend_contract():
    """docs/design/sfa.md §2.3 / test_indexer.py: a cache-only backend sharing the main group's block ids; its builder builds
    nothing (the forward reads the main group's metadata)."""
    I = sfa.IndexerBackend
    assert I.name() == "ASCEND_SFA_INDEXER" and I.supported_block_sizes() == [128]
    assert I.graph_support() == "UNIFORM_BATCH"
    assert I.kv_cache_shape(7, 128, 1, 128) == [7, 128, 1, 128] and I.kv_cache_stride_order() == [0, 1, 2, 3]
    assert I.cache_shapes(7, 128) == [[7, 128, 1, 128]]
    assert I.cache_shapes(7, 128, li_c8=True) == [[7, 128, 1, 128], [7, 128, 1, 1]]
    assert I.cache_shapes(7, 128, li_c8=True, repl=2) == [[14, 128, 1, 128], [14, 128, 1, 1]]
    assert I.cache_dtypes(False, "a2", torch.bfloat16) == [torch.bfloat16]
    assert I.cache_dtypes(True, "a2", torch.bfloat16) == [torch.int8, torch.float16]
    assert I.cache_dtypes(True, "a3", torch.float16) == [torch.int8, torch.float16]
    assert I.cache_dtypes(True, "a5", torch.bfloat16) == [torch.float8_e4m3fn, torch.float32]
    # Page bytes: repl * bs * (128 * sizeof(k) + scale_dim * sizeof(scale)).
    assert I.page_bytes(128, False, "a2", torch.bfloat16) == 128 * 128 * 2
    assert I.page_bytes(128, True, "a2", torch.bfloat16) == 128 * (128 + 2)
    assert I.page_bytes(128, True, "a5", torch.bfloat16, repl=4) == 4 * 128 * (128 + 4)
    assert I.page_bytes(128, False, "a5", torch.float16, repl=2) == 2 * 128 * 256
    ib = sfa.IndexerMetadataBuilder()
    assert sfa.IndexerMetadataBuilder.reorder_batch_threshold is None
    assert ib.build(0, "anything", fast_build=True) is None and ib.build_for_graph_capture() is None


def _main(nb=6, bs=16, c8=False, dtype=torch.bfloat16, fp8=False):
    if c8:
        return [torch.zeros(nb, bs, 1, 656, dtype=torch.float8_e4m3fn if fp8 else torch.int8)]
    return [torch.zeros(nb, bs, 1, 512, dtype=dtype), torch.zeros(nb, bs, 1, 64, dtype=dtype)]


def _indexer(nb=6, bs=16, c8=False, fp8=False, dtype=torch.bfloat16):
    if not c8:
        return [torch.zeros(nb, bs, 1, 128, dtype=dtype)]
    return [torch.zeros(nb, bs, 1, 128, dtype=torch.float8_e4m3fn if fp8 else torch.int8),
            torch.zeros(nb, bs, 1, 1, dtype=torch.float32 if fp8 else torch.float16)]


@pytest.mark.parametrize("sfa_c8,li_c8,n,k,s", [(False, False, 3, 2, None), (True, False, 2, 1, None),
                                                 (False, True, 4, 2, 3), (True, True, 3, 1, 2)])
@pytest.mark.parametrize("fp8", [False, True])
def test_compose_kv_cache_table(sfa_c8, li_c8, n, k, s, fp8):
    main, idx = _main(c8=sfa_c8, fp8=fp8), _indexer(c8=li_c8, fp8=fp8)
    caches, ki, si = sfa.compose_kv_cache(main, idx, sfa_c8=sfa_c8, li_c8=li_c8)
    assert isinstance(caches, tuple) and len(caches) == n and (ki, si) == (k, s)
    assert all(a is b for a, b in zip(caches, main + idx))  # the caller's tensors, not copies
    # LI C8 uses the cache indices after the main cache.
    assert caches[ki] is idx[0] and (si is None or caches[si] is idx[1])
    # A layer without an indexer gets the main tuple.
    alone, ki2, si2 = sfa.compose_kv_cache(tuple(main), None, sfa_c8=sfa_c8, li_c8=li_c8)
    assert len(alone) == len(main) and ki2 is None and si2 is None
    assert sfa.compose_kv_cache(main, [], sfa_c8=sfa_c8, li_c8=li_c8)[0] == tuple(main)


def test_compose_kv_cache_rejects_wrong_tuples_by_name():
    bad = [
        ((_main()[:1], None, False, False), "main_kv_cache has 1 tensors, expected 2"),
        ((_main() + _main(c8=True), None, False, False), "main_kv_cache has 3 tensors"),
        ((_main() * 3, None, False, False), "KV-offload 6-tuple"),
        ((_main(), None, True, False), r"main_kv_cache has 2 tensors, expected 1 \(the packed SFA C8 cache\)"),
        ((_main(c8=True), None, False, False), "main_kv_cache has 1 tensors, expected 2"),
        (([torch.zeros(6, 16, 1, 512, dtype=torch.int8), torch.zeros(6, 16, 1, 64, dtype=torch.int8)], None, False,
          False), r"main_kv_cache\[0\] \(k_nope\) must be float16, bfloat16 or float32 .*set sfa_c8"),
        (([torch.zeros(6, 16, 1, 512, dtype=torch.bfloat16), torch.zeros(6, 16, 1, 64, dtype=torch.float16)], None,
          False, False), r"main_kv_cache\[1\] \(k_pe\) dtype"),
        (([torch.zeros(6, 16, 1, 512), torch.zeros(5, 16, 1, 64)], None, False, False), "block geometry"),
        (([torch.zeros(6, 16, 512), torch.zeros(6, 16, 1, 64)], None, False, False),
         r"main_kv_cache\[0\] \(k_nope\) must be \(num_blocks, block_size, 1, width\)"),
        (([torch.zeros(6, 16, 1, 656, dtype=torch.bfloat16)], None, True, False),
         r"main_kv_cache\[0\] \(packed SFA C8 cache\) must be int8"),
        ((_main(), _indexer(c8=True), False, False), "indexer_kv_cache has 2 tensors, expected 1"),
        ((_main(), _indexer(), False, True), r"indexer_kv_cache has 1 tensors, expected 2 \(idx_k, idx_scale\)"),
        ((_main(), _indexer(c8=True)[:1] * 3, False, True), "indexer_kv_cache has 3 tensors"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.int8)], False, False),
         r"indexer_kv_cache\[0\] \(idx_k\) must be float16.*set li_c8"),
        ((_main(), _indexer(dtype=torch.bfloat16), False, True), "indexer_kv_cache has 1"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.bfloat16), torch.zeros(6, 16, 1, 1)], False, True),
         r"indexer_kv_cache\[0\] \(idx_k\) must be int8"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.int8), torch.zeros(6, 16, 1, 1)], False, True),
         r"indexer_kv_cache\[1\] \(idx_scale\) must be Half for Char keys"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.float8_e4m3fn),
                    torch.zeros(6, 16, 1, 1, dtype=torch.float16)], False, True), r"must be Float for Float8_e4m3fn"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.int8), torch.zeros(6, 16, 1, 2, dtype=torch.float16)],
          False, True), r"indexer_kv_cache\[1\] \(idx_scale\) must be \(num_blocks, block_size, 1, 1\)"),
        ((_main(), [torch.zeros(6, 32, 1, 128, dtype=torch.bfloat16)], False, False), "has block_size 32 but"),
        (([torch.zeros(6, 16, 1, 512), torch.zeros(6, 16, 1, 64, device="meta")], None, False, False),
         r"main_kv_cache\[1\] \(k_pe\) is on meta but main_kv_cache\[0\] is on cpu"),
        ((_main(), [torch.zeros(6, 16, 1, 128, dtype=torch.bfloat16, device="meta")], False, False),
         r"indexer_kv_cache\[0\] \(idx_k\) is on meta"),
        ((_main(), [torch.zeros(7, 16, 1, 128, dtype=torch.bfloat16)], False, False),
         "has 7 blocks, not a positive multiple of main_kv_cache\\[0\\]'s 6"),
    ]
    for (m, i, c8, li), msg in bad:
        with pytest.raises(ValueError, match=msg):
            sfa.compose_kv_cache(m, i, sfa_c8=c8, li_c8=li)
    # DCP: the indexer cache replicated dcp times is fine.
    caches, k, s = sfa.compose_kv_cache(_main(), _indexer(nb=12), sfa_c8=False, li_c8=False)
    assert k == 2 and caches[2].shape[0] == 12
    with pytest.raises(TypeError):
        sfa.compose_kv_cache([torch.zeros(1), 3], None)


def test_topk_buffer():
    tb = sfa.TopkBuffer(16, 8)
    assert (tb.max_num_tokens, tb.index_topk) == (16, 8)
    assert tb.buffer.shape == (16, 8) and tb.buffer.dtype == torch.int32 and bool((tb.buffer == -1).all())
    v = tb.view(5)
    assert v.shape == (5, 1, 8) and v.data_ptr() == tb.buffer.data_ptr()
    assert tb.view(5).data_ptr() == v.data_ptr() and tb.view(0).shape == (0, 1, 8) and tb.view(16).shape[0] == 16
    sel = torch.arange(24, dtype=torch.int32).view(3, 1, 8)
    out = tb.store(sel)
    assert out.shape == (3, 1, 8) and out.data_ptr() == tb.buffer.data_ptr() and torch.equal(out, sel)
    tb.store(sel.view(3, 8) + 100)  # (T, K) works too
    assert torch.equal(tb.view(3).squeeze(1), sel.view(3, 8) + 100) and bool((tb.buffer[3:] == -1).all())
    # A layer without an indexer reads the last indexer layer's selection.
    assert torch.equal(tb.view(3), (sel + 100))
    for call, msg in [
        (lambda: tb.view(17), r"num_tokens=17 is out of range \[0, max_num_tokens=16\]"),
        (lambda: tb.view(-1), "num_tokens=-1"),
        (lambda: tb.store(sel.long()), "topk must be int32"),
        (lambda: tb.store(torch.zeros(3, 1, 7, dtype=torch.int32)), r"topk must be \(num_tokens, 1, 8\)"),
        (lambda: tb.store(torch.zeros(3, 2, 8, dtype=torch.int32)), r"topk must be \(num_tokens, 1, 8\)"),
        (lambda: tb.store(torch.zeros(17, 8, dtype=torch.int32)), "topk has 17 rows, more than max_num_tokens=16"),
        (lambda: tb.store(torch.zeros(3, 8, dtype=torch.int32, device="meta")), "topk is on meta"),
        (lambda: sfa.TopkBuffer(0, 8), "max_num_tokens must be positive"),
        (lambda: sfa.TopkBuffer(8, 0), "index_topk must be positive"),
    ]:
        before = tb.buffer.clone()
        with pytest.raises(ValueError, match=msg):
            call()
        assert torch.equal(tb.buffer, before)


def test_build_valid_topk_mask():
    topk = i32([[[0, 2, 3, -1]], [[0, 1, -1, 7]]])  # (T, 1, K)
    m = aar.plan.build_valid_topk_mask(topk, i32([3, 0]))
    assert m.dtype == torch.bool and m.shape == topk.shape
    assert m.tolist() == [[[True, True, False, False]], [[False, False, False, False]]]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        t = torch.randint(-3, 40, (5, 7), generator=g, dtype=torch.int32)
        thr = torch.randint(0, 40, (5,), generator=g, dtype=torch.int32)
        assert torch.equal(aar.plan.build_valid_topk_mask(t, thr), (t >= 0) & (t < thr[:, None]))
    for args, msg in [
        ((topk, i32([3])), "thresholds_per_row has 1 entries"),
        ((topk, i32([3, -1])), r"thresholds_per_row\[1\]=-1 is negative"),
        ((topk.long(), i32([3, 0])), "topk must be Int"),
        ((topk, i32([3, 0]).long()), "thresholds must be Int"),
        ((topk.to("meta"), i32([3, 0])), "topk must be a host"),
        ((torch.zeros(2, 0, dtype=torch.int32), i32([3, 0])), "K"),
        ((torch.tensor(3, dtype=torch.int32), i32([3])), "at least one dimension"),
    ]:
        with pytest.raises(ValueError, match=msg):
            aar.plan.build_valid_topk_mask(*args)


def test_counts_and_the_backend_contract():
    # core::StepCounts in SFA's metadata (num_prefill_tokens completes the split's counts); the "sfa"
    # facts, the indexer cache group being part of that backend.
    cos, sin = rope(64)
    b = sfa.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16,
                            cos_table=cos, sin_table=sin, num_speculative_tokens=1, graph_decode_padding=True)
    table = torch.arange(16, dtype=torch.int32).view(4, 4)
    md = b.build(i32([0, 2, 3, 8]), i32([10, 7, 20]), table[:3])
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills, md.num_prefill_tokens) == (2, 3, 1, 5)
    assert (md.num_reqs, md.num_kernel_reqs, md.max_query_len, md.max_seq_len) == (3, 3, 5, 20)
    md = b.build(i32([0, 2, 4]), i32([10, 7]), table[:2], num_input_tokens=8)  # two dummies of 2 tokens
    assert (md.num_reqs, md.num_kernel_reqs, md.num_actual_tokens, md.num_prefill_tokens) == (2, 4, 4, 0)
    facts = aar.backend_facts("sfa")
    assert facts["name"] == "ASCEND_SFA" and facts["block_sizes"] == [128] and facts["draft_lanes"]
    assert facts["capturable"] == ["DecodeOnly", "SpecDecoding"]
    assert facts["kv_caches"] == ["nope_cache", "rope_cache", "indexer_k_cache"]
    assert [f["id"] for f in aar.backends()].count("sfa") == 1
    assert sfa.IndexerMetadataBuilder().build_for_drafting(i32([0, 1]), i32([4]), table[:1], 0) is None
