# The DSA metadata builders (aar.dsa.StepBuilder / GroupBuilder, dsa/builder.h):
# every field against brute-force references written here from 
# docs/design/dsa.md §2.2 (geometry rule), §3.1, §3.4, §3.5, §1.2 (compressed rows).
import random

import pytest
import torch

import ascend_attn_rt as aar

KINDS = ["swa", "c4_kv", "c128_kv", "c4_indexer_k", "c4_attn_state", "c4_indexer_state", "c128_state"]
MAXPOS = 1 << 15


def tables(seed=0, R=64):
    g = torch.Generator().manual_seed(seed)
    mk = lambda: torch.randn(MAXPOS, R, generator=g).to(torch.bfloat16)
    return mk(), mk(), mk(), mk()


COS, SIN, CCOS, CSIN = tables()


def step_builder(max_reqs=16, max_tokens=512, k=0, **kw):
    return aar.dsa.StepBuilder(max_num_reqs=max_reqs, max_num_tokens=max_tokens, cos_table=COS, sin_table=SIN,
                               compress_cos_table=CCOS, compress_sin_table=CSIN, num_speculative_tokens=k, **kw)


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


# ------------------------------------------------------------ references
def ref_step(q, S, nra=None, T=None, thr=1):
    B = len(q)
    nra = B if nra is None else nra
    qsl = [0]
    for x in q:
        qsl.append(qsl[-1] + x)
    T = qsl[-1] if T is None else T
    sp = [S[b] - q[b] if b < nra else 0 for b in range(B)]
    pos = []
    for b in range(B):
        pos += [sp[b] + j for j in range(q[b])]
    pos += [0] * (T - qsl[-1])
    nd = 0  # the split counts the real requests (graph padding excluded)
    while nd < nra and q[nd] <= thr:
        nd += 1
    return dict(qsl=qsl, sp=sp, pos=pos, T=T, nd=nd, np=nra - nd, nra=nra)


def fmt(slot, bs, flat):
    if flat:
        return [slot if slot >= 0 else -1]
    return [slot // bs, slot % bs] if slot >= 0 else [-1, bs - 1]


def ref_group(q, S, table, ratio, sbs, flat, nra=None, T=None):
    """Rows a group emits (docs/design/dsa.md §1.2, §2.2 geometry rule), brute force."""
    B = len(q)
    nra = B if nra is None else nra
    T = sum(q) if T is None else T
    r = max(ratio, 1)
    nrows = T if r == 1 else min(T, T // r + B)
    idx, posn, req, slots = [], [], [], []
    for b in range(nra):
        ctx = S[b] - q[b]
        for p in range(ctx, S[b]):
            if (p + 1) % r == 0:  # row c = p // r completes at raw position p
                c = p // r
                idx.append(c)
                posn.append(c * r)
                req.append(b)
                slots += fmt(table[b][c // sbs] * sbs + c % sbs, sbs, flat)
    nvalid = len(idx)
    for _ in range(nrows - nvalid):
        idx.append(-1)
        posn.append(0)
        req.append(-1)
        slots += fmt(-1, sbs, flat)
    return dict(n=nrows, valid=nvalid, idx=idx, pos=posn, req=req, slots=slots)


def ref_dspark(q, S, table, bs, W, ns, T, nra=None):
    B = len(q)
    nra = B if nra is None else nra
    width = (W + ns + 127) // 128 * 128
    rows = []
    for b in range(B):
        prefix = S[b] - q[b]
        start = max(prefix - W, 0)
        vis = S[b] - start
        row = []
        for j in range(width):
            p = start + j
            row.append(table[b][p // bs] * bs + p % bs if (j < vis and b < nra) else -1)
        rows += [row] * q[b]
    rows += [[-1] * width] * (T - len(rows))
    return rows[:T], width


def make_table(B, cols, num_blocks, seed):
    rnd = random.Random(seed)
    ids = rnd.sample(range(num_blocks), B * cols)
    return [ids[b * cols:(b + 1) * cols] for b in range(B)]


def check_step(st, q, S, nra=None, T=None, thr=1):
    ref = ref_step(q, S, nra, T, thr)
    assert st.query_start_loc_list == ref["qsl"]
    assert st.query_start_loc.tolist() == ref["qsl"]
    assert st.seq_lens_list == list(S) and st.seq_lens.tolist() == list(S)
    assert st.start_pos_list == ref["sp"] and st.start_pos.tolist() == ref["sp"]
    assert st.positions_list == ref["pos"]
    cu = [0]
    for s in S:
        cu.append(cu[-1] + s)
    assert st.cu_seqlens_kv.tolist() == cu
    # The counts' one meaning (docs/design/core.md): num_reqs and the tokens, split and maxima of the real
    # requests; num_kernel_reqs / num_kernel_tokens / max_seqlen_q / kv over all B (padding included).
    nra, nd = ref["nra"], ref["nd"]
    assert (st.num_reqs, st.num_reqs_actual, st.num_kernel_reqs) == (nra, nra, len(q))
    assert st.num_input_tokens == ref["T"] and st.num_kernel_tokens == ref["qsl"][-1]
    assert st.num_actual_tokens == ref["qsl"][nra]
    assert (st.num_decodes, st.num_prefills) == (nd, ref["np"])
    assert st.num_decode_tokens == sum(q[:nd]) and st.num_prefill_tokens == sum(q[nd:nra])
    assert st.max_query_len == max(q[:nra], default=0) and st.max_seq_len == max(S[:nra], default=0)
    pos = torch.tensor(ref["pos"], dtype=torch.long)
    assert torch.equal(st.cos, COS[pos]) and torch.equal(st.sin, SIN[pos])
    assert torch.equal(st.compress_cos, CCOS[pos]) and torch.equal(st.compress_sin, CSIN[pos])
    assert st.max_seqlen_q == max(q, default=0) and st.max_seqlen_kv == max(S, default=0)
    return ref


def check_group(gm, st, q, S, table, ratio, sbs, flat, nra=None, T=None, device_kind="a2"):
    B = len(q)
    nra = B if nra is None else nra
    ref = ref_group(q, S, table, ratio, sbs, flat, nra, T)
    assert gm.num_compressed_tokens == ref["n"] and gm.num_valid_rows == ref["valid"]
    assert gm.row_index_list == ref["idx"] and gm.row_index.tolist() == ref["idx"]
    assert gm.row_position_list == ref["pos"] and gm.row_position.tolist() == ref["pos"]
    assert gm.row_request_list == ref["req"] and gm.row_request.tolist() == ref["req"]
    assert gm.slot_mapping_list == ref["slots"]
    assert gm.slot_mapping.flatten().tolist() == ref["slots"]
    assert gm.slot_mapping.dim() == (1 if flat else 2)
    cols = len(table[0]) if table else 0
    bt = [list(table[b]) if b < nra else [0] * cols for b in range(B)]
    assert gm.block_table.tolist() == bt and gm.block_table_list == sum(bt, [])
    assert gm.seq_lens.tolist() == list(S) and gm.start_pos.tolist() == st.start_pos_list
    assert (gm.num_reqs, gm.num_reqs_actual, gm.num_kernel_reqs) == (nra, nra, B)
    pos = torch.tensor(st.positions_list, dtype=torch.long)
    if ratio > 1:
        assert torch.equal(gm.cos, CCOS[pos]) and torch.equal(gm.sin, CSIN[pos])
        assert torch.equal(gm.full_compress_cos, CCOS) and torch.equal(gm.full_compress_sin, CSIN)
    else:
        assert torch.equal(gm.cos, COS[pos]) and torch.equal(gm.sin, SIN[pos])
        assert gm.full_compress_cos is None
    # cu_seqlens per plan (docs/design/dsa.md §3.2).
    a5 = device_kind == "a5"
    if st.has_prefill:
        assert gm.cu_seqlens_ori_kv.tolist() == st.query_start_loc_list and gm.cu_seqlens_cmp_kv is None
    elif a5:
        assert gm.cu_seqlens_ori_kv.tolist() == st.cu_seqlens_kv.tolist() and gm.cu_seqlens_cmp_kv is None
    else:
        assert gm.cu_seqlens_ori_kv.numel() == 0 and gm.cu_seqlens_cmp_kv.numel() == 0
    assert gm.max_seqlen_q == st.max_seqlen_q and gm.max_seqlen_kv == st.max_seqlen_kv
    assert gm.sas_metadata.shape == (1024,) and gm.qli_metadata.shape == (1024,)
    return ref


def group(sb, kind, bs=128, dk="a2", num_blocks=512, mbr=16, **kw):
    return aar.dsa.GroupBuilder(sb, kind=kind, cache_block_size=bs, device_kind=dk, num_blocks=num_blocks,
                                max_blocks_per_req=mbr, **kw)


def group_facts(g):
    return g.compress_ratio, g.storage_block_size, g.slot_format == "FLAT"


# ------------------------------------------------------------ tests
@pytest.mark.parametrize("dk", ["a2", "a5"])
@pytest.mark.parametrize("bs", [32, 64, 128])
@pytest.mark.parametrize("kind", KINDS)
def test_decode_and_prefill_every_group(kind, bs, dk):
    sb = step_builder()
    g = group(sb, kind, bs, dk, num_blocks=16384, mbr=2048)
    ratio, sbs, flat = group_facts(g)
    spec = aar.dsa.cache_spec(kind, bs, device_kind=dk)
    assert (ratio, sbs) == (spec["compress_ratio"], spec["storage_block_size"])
    assert g.slot_format == spec["slot_format"]
    # Logical blocks cover sbs * ratio raw tokens; the table has enough columns.
    cases = [
        ([1, 1, 1, 1], [5, 300, 4000, 128]),            # decode only
        ([1, 1, 37, 200], [9, 513, 37, 700]),           # mixed: decodes, fresh prefill, chunk
        ([17], [17]),                                   # one prefill
    ]
    for seed, (q, S) in enumerate(cases):
        cols = max((s - 1) // (sbs * max(ratio, 1)) + 1 for s in S)
        table = make_table(len(q), cols, 16384, seed)
        st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
        check_step(st, q, S)
        gm = g.build(st, i32(table))
        check_group(gm, st, q, S, table, ratio, sbs, flat, device_kind=dk)


def test_spec_example_counts():
    # docs/design/dsa.md §3.1: (T=13, B=3) gives 13 / 6 / 3 rows for ratios 1 / 4 / 128.
    sb = step_builder()
    q, S = [1, 4, 8], [100, 200, 300]
    st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
    t = i32(make_table(3, 4, 512, 1))
    got = [group(sb, k).build(st, t).num_compressed_tokens for k in ("swa", "c4_kv", "c128_kv")]
    assert got == [13, 6, 3]


@pytest.mark.parametrize("dk", ["a2", "a5"])
def test_chunked_prefill_over_many_steps(dk):
    # Three requests progress over many steps (chunks of varied size, then
    # decodes); every group's rows must be exactly the rows completed that step,
    # and over all steps every compressed row is emitted once.
    rnd = random.Random(7)
    sb = step_builder(max_reqs=4, max_tokens=256)
    groups = {k: group(sb, k, 64, dk, num_blocks=2048, mbr=256) for k in KINDS}
    prompt = [700, 333, 520]
    done = [0, 0, 0]
    emitted = {k: [set() for _ in prompt] for k in KINDS}
    tables_ = {k: make_table(3, 256, 2048, i) for i, k in enumerate(KINDS)}
    for step in range(40):
        q = []
        for b in range(3):
            left = prompt[b] - done[b]
            q.append(rnd.randint(2, 120) if left > 120 else (left if left > 1 else 1))
        # decode-first order: requests with 1 token first
        order = sorted(range(3), key=lambda b: q[b] > 1)
        qq = [q[b] for b in order]
        S = [done[b] + q[b] for b in order]
        st = sb.build(i32(ref_step(qq, S)["qsl"]), i32(S))
        check_step(st, qq, S)
        for k, g in groups.items():
            ratio, sbs, flat = group_facts(g)
            tb = [tables_[k][b] for b in order]
            gm = g.build(st, i32(tb))
            ref = check_group(gm, st, qq, S, tb, ratio, sbs, flat, device_kind=dk)
            for c, r in zip(ref["idx"], ref["req"]):
                if r >= 0:
                    assert c not in emitted[k][order[r]]
                    emitted[k][order[r]].add(c)
        for b in range(3):
            done[b] += q[b]
    for k, g in groups.items():
        r = max(g.compress_ratio, 1)
        for b in range(3):
            assert emitted[k][b] == set(range(done[b] // r))


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_batches(k):
    sb = step_builder(k=k)
    assert sb.decode_threshold == 1 + k
    g4 = group(sb, "c4_kv")
    gs = group(sb, "swa")
    q = [1 + k, 1 + k, 1, 40]
    S = [100, 7, 64, 40]
    st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S), num_spec_tokens=i32([k, k, 0, 0]))
    check_step(st, q, S, thr=1 + k)
    assert st.num_decodes == 3 and st.num_prefills == 1
    table = make_table(4, 4, 512, 3)
    check_group(g4.build(st, i32(table)), st, q, S, table, 4, 128, False)
    check_group(gs.build(st, i32(table)), st, q, S, table, 1, 128, False)
    # Decodes only with drafts: SpecDecoding.
    q2, S2 = [1 + k, 1 + k], [50, 60]
    st2 = sb.build(i32(ref_step(q2, S2)["qsl"]), i32(S2), num_spec_tokens=i32([k, k]))
    assert st2.attn_state == aar.AttentionState.SpecDecoding


def test_graph_padding_and_capture():
    sb = step_builder()
    gs, g4 = group(sb, "swa"), group(sb, "c4_kv")
    q, S = [1, 1, 1, 1], [300, 20, 0, 0]  # two real requests, two padding ones
    table = make_table(4, 4, 512, 5)
    qsl = ref_step(q, S)["qsl"]
    st = sb.build_for_graph_capture(i32(qsl), i32(S), num_reqs_actual=2, num_input_tokens=6)
    check_step(st, q, S, nra=2, T=6)
    assert st.attn_state == aar.AttentionState.DecodeOnly and st.num_reqs_actual == 2
    for g, ratio in ((gs, 1), (g4, 4)):
        gm = g.build(st, i32(table))
        ref = check_group(gm, st, q, S, table, ratio, 128, False, nra=2, T=6)
        assert gm.block_table[2:].abs().sum() == 0
    # Only decode states are captured; prefills refused by name.
    with pytest.raises(NotImplementedError, match="ChunkedPrefill"):
        sb.build_for_graph_capture(i32(qsl), i32(S), state=aar.AttentionState.ChunkedPrefill)
    with pytest.raises(ValueError, match="prefill"):
        sb.build_for_graph_capture(i32([0, 1, 20]), i32([5, 20]))


def test_dspark_indices_and_window():
    W, ns = 128, 7
    # DSpark and the window are the model's: given once, to the step builder (the SWA group reads them).
    sb = step_builder(dspark_num_spec=ns, window=W)
    g = group(sb, "swa", 64, mbr=32, num_blocks=1024)
    q, S = [8, 8, 8], [8, 300, 1000]
    table = make_table(3, 16, 1024, 9)
    st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S), attn_state=aar.AttentionState.SpecDecoding)
    # threshold 1: these are prefills for the split -> no DSpark (has_prefill)
    gm = g.build(st, i32(table))
    assert gm.dspark_swa_indices is None and gm.ori_win_left == W - 1
    sb7 = step_builder(k=7, dspark_num_spec=ns, window=W)
    g7 = group(sb7, "swa", 64, mbr=32, num_blocks=1024)
    st = sb7.build(i32(ref_step(q, S)["qsl"]), i32(S))
    assert not st.has_prefill
    gm = g7.build(st, i32(table))
    ref, width = ref_dspark(q, S, table, 64, W, ns, 24)
    assert gm.dspark_width == width == 256
    assert gm.dspark_swa_indices.shape == (24, 1, width)
    assert gm.dspark_swa_indices[:, 0].tolist() == ref and gm.dspark_list == sum(ref, [])
    assert gm.ori_win_left == W + ns - 1 and gm.ori_win_right == 0 and gm.window == W
    # only the SWA group builds DSpark rows
    g4 = group(sb7, "c4_kv", 64, mbr=32, num_blocks=1024).build(st, i32(table))
    assert g4.dspark_swa_indices is None and g4.dspark_width == 0 and g4.window == W
    with pytest.raises(ValueError, match="dspark_num_spec must be >= 0"):
        step_builder(dspark_num_spec=-1)
    with pytest.raises(ValueError, match="width=5 is smaller than window \\+ num_spec = 135"):
        step_builder(dspark_num_spec=ns, dspark_width=5)


def test_address_stability_across_builds():
    sb = step_builder(max_reqs=8, max_tokens=128)
    gs, g4, g128 = group(sb, "swa"), group(sb, "c4_kv"), group(sb, "c128_kv")
    table = i32(make_table(4, 4, 512, 11))
    q, S = [1, 1, 1, 1], [10, 20, 30, 40]
    ptrs = []
    blobs = set()
    for rep in range(3):
        S = [s + 1 for s in S]
        st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
        mds = [g.build(st, table) for g in (gs, g4, g128)]
        p = [t.data_ptr() for t in (st.query_start_loc, st.seq_lens, st.start_pos, st.cu_seqlens_kv, st.cos, st.sin,
                                    st.compress_cos, st.compress_sin)]
        for m in mds:
            p += [m.block_table.data_ptr(), m.slot_mapping.data_ptr(), m.row_index.data_ptr(),
                  m.row_position.data_ptr(), m.row_request.data_ptr(), m.sas_metadata.data_ptr(),
                  m.qli_metadata.data_ptr()]
            blobs.add((m.sas_metadata.data_ptr(), m.qli_metadata.data_ptr()))
        ptrs.append(p)
        # a prefill step in between must not move the SAS/QLI buffers
        st2 = sb.build(i32([0, 50]), i32([50]))
        for g in (gs, g4, g128):
            m2 = g.build(st2, table[:1])
            blobs.add((m2.sas_metadata.data_ptr(), m2.qli_metadata.data_ptr()))
    assert ptrs[0] == ptrs[1] == ptrs[2]
    assert len(blobs) == 3  # one pair per group, whatever the step


def test_separate_device_buffers_same_values():
    q, S = [1, 1, 30], [64, 513, 30]
    table = make_table(3, 8, 512, 13)
    out = []
    for separate in (False, True):
        sb = step_builder(separate_device_buffers=separate)
        gms = [group(sb, k).build(sb.build(i32(ref_step(q, S)["qsl"]), i32(S)), i32(table)) for k in ("swa",)]
        st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
        check_step(st, q, S)
        g = group(sb, "c4_kv")
        gm = g.build(st, i32(table))
        check_group(gm, st, q, S, table, 4, 128, False)
        out.append(gm.slot_mapping.tolist())
    assert out[0] == out[1]


def test_builds_inside_and_outside_inference_mode_agree():
    # The builders take their own inference-mode scope only when the caller is not in one.
    q, S = [1, 1, 30], [64, 513, 30]
    table = make_table(3, 8, 512, 13)
    out = []
    for inference in (False, True):
        sb = step_builder()
        g4, gs = group(sb, "c4_kv"), group(sb, "swa")
        with torch.inference_mode(inference):
            st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
            gm = g4.build(st, i32(table))
            gsm = gs.build(st, i32(table))
        check_step(st, q, S)
        check_group(gm, st, q, S, table, 4, 128, False)
        out.append((gm.slot_mapping.tolist(), gm.compressed_slots.tolist(), st.sin.neg().tolist(),
                    st.neg_sin.tolist(), gsm.row_index.tolist()))
    assert out[0] == out[1]
    assert out[0][2] == out[0][3]  # -sin made by the build in both modes


def test_stale_metadata_rejected():
    sb = step_builder()
    g = group(sb, "c4_kv")
    table = i32(make_table(2, 4, 512, 2))
    st1 = sb.build(i32([0, 1, 2]), i32([10, 20]))
    gm1 = g.build(st1, table)
    assert gm1.is_current
    gm2 = g.build(st1, table)
    assert not gm1.is_current and gm2.is_current
    with pytest.raises(ValueError, match="stale|no longer"):
        gm1.slot_mapping_list
    st2 = sb.build(i32([0, 1, 2]), i32([11, 21]))
    assert not st1.is_current and not gm2.is_current  # its step was rebuilt
    with pytest.raises(ValueError):
        st1.seq_lens_list
    with pytest.raises(ValueError, match="no longer current"):
        gm2.row_index_list
    with pytest.raises(ValueError, match="step metadata"):
        g.build(st1, table)  # a group cannot build from a stale step
    gm3 = g.build(st2, table)
    assert gm3.is_current


def test_bad_input_named_and_nothing_written():
    sb = step_builder()
    g = group(sb, "c4_kv", num_blocks=64)
    table = make_table(3, 4, 64, 4)
    q, S = [1, 1, 40], [100, 200, 40]
    st = sb.build(i32(ref_step(q, S)["qsl"]), i32(S))
    gm = g.build(st, i32(table))
    before_step = (st.query_start_loc_list, st.seq_lens_list, st.start_pos_list, st.positions_list,
                   st.cos.clone())
    before = (gm.slot_mapping_list, gm.row_index_list, gm.block_table_list)
    # not decode-first
    with pytest.raises(ValueError, match="query_start_loc.*decode-first"):
        sb.build(i32([0, 40, 41]), i32([40, 100]))
    # seq_len < query_len
    with pytest.raises(ValueError, match="seq_lens"):
        sb.build(i32([0, 1, 10]), i32([5, 3]))
    # past the RoPE tables
    with pytest.raises(ValueError, match="rope"):
        sb.build(i32([0, 1]), i32([MAXPOS + 1]))
    assert st.is_current and gm.is_current
    assert (st.query_start_loc_list, st.seq_lens_list, st.start_pos_list, st.positions_list) == before_step[:4]
    assert torch.equal(st.cos, before_step[4])
    # block id out of range, and a table too narrow for the rows
    bad = [list(r) for r in table]
    bad[2][0] = 64
    with pytest.raises(ValueError, match="block"):
        g.build(st, i32(bad))
    with pytest.raises(ValueError):
        g.build(st, i32([r[:0] for r in table]))
    assert gm.is_current and (gm.slot_mapping_list, gm.row_index_list, gm.block_table_list) == before
    # config errors by name
    with pytest.raises(ValueError, match="cache_block_size"):
        group(sb, "swa", bs=16)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        step_builder(k=16)
    sb_nc = aar.dsa.StepBuilder(max_num_reqs=4, max_num_tokens=16, cos_table=COS, sin_table=SIN)
    with pytest.raises(ValueError, match="compress"):
        group(sb_nc, "c128_kv")
    with pytest.raises(ValueError, match="max_num_reqs"):
        sb.build(i32(list(range(18))), i32([5] * 17))


def test_drafting_swa_only():
    sb = step_builder(k=2)
    assert sb.num_drafts == 2
    gs, g4 = group(sb, "swa"), group(sb, "c4_kv")
    table = i32(make_table(2, 4, 512, 6))
    st = sb.build(i32([0, 3, 6]), i32([30, 40]))
    m_main = gs.build(st, table)
    d = sb.build_for_drafting(i32([0, 1, 2]), i32([31, 41]), 1)
    assert d.draft_index == 1 and st.is_current  # a draft lane does not stale the main build
    check_step(d, [1, 1], [31, 41], thr=3)
    md = gs.build_for_drafting(d, table, 1)
    assert md.draft_index == 1 and m_main.is_current
    check_group(md, d, [1, 1], [31, 41], table.tolist(), 1, 128, False)
    with pytest.raises(NotImplementedError, match="C4 compressed KV"):
        g4.build_for_drafting(d, table, 1)
    with pytest.raises(ValueError, match="draft"):
        gs.build(d, table)  # a draft step into the main lane
    with pytest.raises(ValueError, match="draft"):
        gs.build_for_drafting(d, table, 0)


ROUTED = ("swa", "attention", "compressor_state", "indexer_cache", "indexer_state", "common")


def test_route_layer():
    sb = step_builder()
    t = i32(make_table(2, 4, 512, 8))
    st = sb.build(i32([0, 1, 2]), i32([10, 20]))
    g = {k: group(sb, k).build(st, t) for k in KINDS}
    r4 = aar.dsa.route_layer(4, st, g["swa"], g["c4_kv"], g["c4_attn_state"], g["c4_indexer_k"],
                             g["c4_indexer_state"])
    assert isinstance(r4, aar.dsa.LayerMetadata) and r4.compress_ratio == 4 and r4.step is st
    assert r4.common is g["c4_kv"] and r4.indexer_cache is g["c4_indexer_k"]
    r128 = aar.dsa.route_layer(128, st, g["swa"], g["c128_kv"], g["c128_state"])
    assert r128.common is g["c128_kv"] and r128.indexer_cache is None
    assert aar.dsa.route_layer(1, st, g["swa"]).common is g["swa"]
    with pytest.raises(ValueError, match="indexer_cache"):
        aar.dsa.route_layer(128, st, g["swa"], g["c128_kv"], g["c128_state"], g["c4_indexer_k"])
    with pytest.raises(ValueError, match="attention has cache kind"):
        aar.dsa.route_layer(128, st, g["swa"], g["c4_kv"], g["c128_state"])
    # By cache kind from all of the step's groups (a dict or a sequence): the same routing.
    for groups in (g, list(g.values())[::-1]):
        r4k = aar.dsa.route_layer(4, st, groups)
        assert all(getattr(r4k, k) is getattr(r4, k) for k in ROUTED)
        r128k = aar.dsa.route_layer(128, st, groups)
        assert all(getattr(r128k, k) is getattr(r128, k) for k in ROUTED)
        r1 = aar.dsa.route_layer(1, st, groups)
        assert r1.swa is g["swa"] and r1.common is g["swa"] and r1.attention is None
    assert aar.dsa.route_layer(128, st, [g["swa"], g["c128_kv"], g["c128_state"]]).attention is g["c128_kv"]
    with pytest.raises(ValueError, match="no group of cache kind C4 indexer K"):
        aar.dsa.route_layer(4, st, {k: v for k, v in g.items() if k != "c4_indexer_k"})
    with pytest.raises(ValueError, match="cache kind SWA is given twice"):
        aar.dsa.route_layer(1, st, [g["swa"], g["c4_kv"], g["swa"]])
    with pytest.raises(ValueError, match=r"groups\[1\] is null"):
        aar.dsa.route_layer(1, st, [g["swa"], None])
    sb.build(i32([0, 1, 2]), i32([11, 21]))
    with pytest.raises(ValueError):
        aar.dsa.route_layer(1, st, g["swa"])


def test_route_layer_names_bad_arguments():
    # Issue 26 item 8: a value that is no metadata is a TypeError naming the argument and the type received (it was
    # a bare std::bad_cast), a ratio outside the supported ones a ValueError listing them (0 was accepted).
    sb = step_builder()
    t = i32(make_table(2, 4, 512, 8))
    st = sb.build(i32([0, 1, 2]), i32([10, 20]))
    g = {k: group(sb, k).build(st, t) for k in KINDS}
    supported = r"compress_ratio=%d is not a DSA layer ratio: the supported ones are 1 \(sliding window only\), 4 " \
                r"\(C4\) and 128 \(C128\)"
    for ratio in (0, 2, 64):
        for args in ((g,), (g["swa"],), (list(g.values()),)):
            with pytest.raises(ValueError, match=supported % ratio):
                aar.dsa.route_layer(ratio, st, *args)
    with pytest.raises(TypeError, match="swa must be an aar.dsa.GroupMetadata .* got int"):
        aar.dsa.route_layer(1, st, 7)
    with pytest.raises(TypeError, match="attention must be an aar.dsa.GroupMetadata .* got str"):
        aar.dsa.route_layer(128, st, g["swa"], "c128_kv", g["c128_state"])
    with pytest.raises(TypeError, match="step must be an aar.dsa.StepMetadata .* got .*GroupMetadata"):
        aar.dsa.route_layer(1, g["swa"], g["swa"])
    with pytest.raises(TypeError, match=r"groups\['c4_kv'\] must be an aar.dsa.GroupMetadata .* got .*Tensor"):
        aar.dsa.route_layer(4, st, dict(g, c4_kv=t))
    with pytest.raises(TypeError, match=r"groups\[1\] must be an aar.dsa.GroupMetadata .* got float"):
        aar.dsa.route_layer(1, st, [g["swa"], 1.5])
    assert aar.dsa.layer_cache_kinds(4) == ["swa", "c4_kv", "c4_attn_state", "c4_indexer_k", "c4_indexer_state"]
    assert aar.dsa.layer_cache_kinds(128) == ["swa", "c128_kv", "c128_state"]
    assert aar.dsa.layer_cache_kinds(1) == ["swa"]
    with pytest.raises(ValueError, match=supported % 0):
        aar.dsa.layer_cache_kinds(0)


def test_sas_metadata_blob():
    group = lambda *a, **kw: globals()["group"](*a, mbr=64, **kw)
    # A2: generated with docs/design/dsa.md §3.5's arguments (the CPU twin's blob records
    # them: [2] heads, [5] B, [6] max q, [7] max kv, [9] cmp_topk, [10]
    # cmp_ratio, [13] ori_win_left, [17] has_cmp_kv, [18] total q, [19] total kv).
    sb = step_builder(num_heads_q=16, window=128)  # the SAS arguments are the model's, on the step builder
    q, S = [1, 1], [100, 300]
    t = i32(make_table(2, 64, 512, 12))
    st = sb.build(i32([0, 1, 2]), i32(S))
    for kind, ratio, topk in (("swa", 1, 0), ("c4_kv", 4, 512), ("c128_kv", 128, 0)):
        g = group(sb, kind)
        gm = g.build(st, t)
        assert gm.sas_metadata_filled and not gm.qli_metadata_filled
        b = gm.sas_metadata.tolist()
        assert b[2] == 16 and b[5] == 2 and b[6] == 1 and b[7] == 300
        assert b[9] == topk and b[10] == ratio and b[13] == 127 and b[17] == (ratio > 1)
        assert b[18] == 2 and b[19] == 400
    # A5 (fp8 rows): the kv-quant metadata operator, the same fields.
    sb8 = step_builder(num_heads_q=8)
    a5 = group(sb8, "c4_kv", dk="a5").build(sb8.build(i32([0, 1, 2]), i32(S)), t)
    assert a5.sas_metadata_filled
    b = a5.sas_metadata.tolist()
    assert b[2] == 8 and b[5] == 2 and b[9] == 512 and b[10] == 4 and b[19] == 400
    # the A5 + BF16 plan: CANN's sparse_flash_mla_metadata (its blob's fields; the full argument check is in
    # test_dsa_sfmla.py)
    bf16 = aar.dsa.GroupBuilder(sb, kind="swa", device_kind="a5", cache_dtype="bfloat16", num_blocks=512,
                                max_blocks_per_req=64)
    b = bf16.build(st, t)
    assert b.sas_metadata_filled and b.sas_metadata[0] == 0x534D4C41 and b.sas_metadata[2] == 16
    # not generated: state groups, num_heads_q unset
    assert not group(sb, "c4_attn_state").build(st, t).sas_metadata_filled
    sb0 = step_builder()
    assert not group(sb0, "swa").build(sb0.build(i32([0, 1, 2]), i32(S)), t).sas_metadata_filled


@pytest.mark.parametrize("separate", [False, True])
def test_staged_block_table(separate):
    # The engine keeps its table in block_table_staging(): on the CPU the
    # metadata's table is those rows (no copy); values as with a host table.
    sb = step_builder(separate_device_buffers=separate)
    g = group(sb, "c4_kv", mbr=16)
    staging = g.block_table_staging
    assert staging.shape == (16, 16) and staging.dtype == torch.int32
    table = make_table(3, 16, 512, 21)
    staging[:3] = i32(table)
    q, S = [1, 1, 1], [100, 900, 4000]
    st = sb.build_for_graph_capture(i32([0, 1, 2, 3]), i32(S), num_reqs_actual=2)
    gm = g.build(st, staging[:3])
    check_group(gm, st, q, S, table, 4, 128, False, nra=2)
    if not separate:
        assert gm.block_table.data_ptr() == staging.data_ptr()
        assert staging[2].abs().sum() == 0  # the padding row zeroed in place
    else:
        assert gm.block_table.data_ptr() != staging.data_ptr()
        assert staging[2].tolist() == table[2]


def ref_qli_blob(q, S, heads, di, topk, T=None):
    """The QLI metadata operator's blob for a step (docs/design/dsa.md §3.5's arguments), from the lists alone."""
    qsl = [0]
    for x in q:
        qsl.append(qsl[-1] + x)
    return torch.ops.ascend_cpu_va.npu_vllm_quant_lightning_indexer_metadata(
        num_heads_q=heads, num_heads_k=1, head_dim=di, query_quant_mode=0, key_quant_mode=0,
        actual_seq_lengths_query=i32(qsl[1:]), actual_seq_lengths_key=i32(S), batch_size=len(q),
        max_seqlen_q=max(q), max_seqlen_k=max(S), layout_query="TND", layout_key="PA_BSND", sparse_count=topk,
        sparse_mode=3, pre_tokens=2**63 - 1, next_tokens=2**63 - 1, cmp_ratio=4, device="npu")


def test_qli_metadata_blob_filled_by_the_indexer_group():
    # docs/design/dsa.md §3.2 / §3.5: the C4 indexer-cache group fills the QLI blob into its stable buffer.
    sb = step_builder(index_n_heads=8, index_head_dim=32, index_topk=16)
    g = group(sb, "c4_indexer_k", bs=128, mbr=64)
    t = i32(make_table(3, 64, 512, 5))
    addr = None
    steps = [([1, 1, 1], [100, 300, 5]), ([20, 7], [20, 57]), ([1, 1], [101, 58]), ([1, 3, 9], [9, 130, 400])]
    for q, S in steps:
        qsl = [0]
        for x in q:
            qsl.append(qsl[-1] + x)
        st = sb.build(i32(qsl), i32(S))
        gm = g.build(st, t[: len(q)].contiguous())
        assert gm.qli_metadata_filled and not gm.sas_metadata_filled
        assert (gm.qli_num_heads, gm.qli_head_dim, gm.qli_sparse_count) == (8, 32, 16)
        assert gm.qli_metadata.dtype == torch.int32 and gm.qli_metadata.shape == (1024,)
        assert torch.equal(gm.qli_metadata, ref_qli_blob(q, S, 8, 32, 16))
        # it tracks the step's lengths (a blob of other lengths differs)
        assert not torch.equal(gm.qli_metadata, ref_qli_blob(q, [s + 4 for s in S], 8, 32, 16))
        addr = addr or gm.qli_metadata.data_ptr()
        assert gm.qli_metadata.data_ptr() == addr
    # a padded capture build: B rows including padding (seq_lens as given)
    st = sb.build_for_graph_capture(i32([0, 1, 2, 3, 4]), i32([40, 9, 0, 0]), num_reqs_actual=2)
    gm = g.build(st, t[:3].contiguous().repeat(2, 1)[:4].contiguous())
    assert gm.qli_metadata.data_ptr() == addr
    assert torch.equal(gm.qli_metadata, ref_qli_blob([1, 1, 1, 1], [40, 9, 0, 0], 8, 32, 16))
    # defaults are docs/design/dsa.md §3.5's (64 heads, Di 128, top-k 512)
    sbd = step_builder()
    std = sbd.build_for_graph_capture(i32([0, 1, 2, 3, 4]), i32([40, 9, 0, 0]), num_reqs_actual=2)
    d = group(sbd, "c4_indexer_k", mbr=64).build(std, t[:3].contiguous().repeat(2, 1)[:4].contiguous())
    assert (d.qli_num_heads, d.qli_head_dim, d.qli_sparse_count) == (64, 128, 512)
    assert torch.equal(d.qli_metadata, ref_qli_blob([1, 1, 1, 1], [40, 9, 0, 0], 64, 128, 512))
    # other groups, and index_n_heads=0, do not fill it
    st = sb.build(i32([0, 1]), i32([50]))
    for kind in ("swa", "c4_kv", "c4_indexer_state", "c4_attn_state"):
        gm = group(sb, kind, mbr=64).build(st, t[:1].contiguous())
        assert not gm.qli_metadata_filled and gm.qli_num_heads == 0
    sb0 = step_builder(index_n_heads=0)
    st0 = sb0.build(i32([0, 1]), i32([50]))
    assert not group(sb0, "c4_indexer_k", mbr=64).build(st0, t[:1].contiguous()).qli_metadata_filled
    with pytest.raises(ValueError, match="index_head_dim"):
        step_builder(index_head_dim=0)
    with pytest.raises(ValueError, match="index_n_heads"):
        step_builder(index_n_heads=-1)
