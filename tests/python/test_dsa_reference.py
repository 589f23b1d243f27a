"""Self-consistency tests of the float64 DSA reference (_dsa_reference.py). No runtime import: every check here is
an identity of the model equations (docs/design/sparse.md §3, docs/design/dsa.md §1.1, §3.4) that a wrong reference would break."""

import math

import pytest
import torch

from _dsa_reference import (F64, DsaDims, compress_rows, compressed_kv_rows, dsa_layer, dspark_positions,
                            indexer_k_rows, indexer_queries, indexer_topk, interleave_rope, make_dsa_weights, o_proj,
                            prolog, rope_last, rope_tables, rotate_activation, sas_attention, swa_rows,
                            sylvester_hadamard, visible_compressed)

COS, SIN = rope_tables(512, 16)


def _setup(gen, S, dtype=F64, **kw):
    d = DsaDims(**kw)
    w = make_dsa_weights(d, dtype, gen)
    x = torch.randn(S, d.hidden, generator=gen, dtype=F64).to(dtype)
    return d, w, x


def _cmp(d, w, x):
    return compressed_kv_rows(d, w, x, COS, SIN)


# ---------------------------------------------------------------------------------------------------- RoPE


def test_rope_tables_layout():
    cos, sin = rope_tables(10, 8, base=100.0)
    assert cos.dtype == torch.float32 and cos.shape == (10, 8)
    assert torch.equal(cos[:, 0::2], cos[:, 1::2]) and torch.equal(sin[:, 0::2], sin[:, 1::2])
    assert cos[3, 2].item() == pytest.approx(math.cos(3 * 100.0 ** (-2 / 8)), abs=1e-7)
    assert sin[7, 6].item() == pytest.approx(math.sin(7 * 100.0 ** (-6 / 8)), abs=1e-7)


def test_interleave_rope_is_complex_rotation_and_inverse_undoes_it(gen):
    x = torch.randn(5, 3, 16, generator=gen, dtype=F64)
    pos = torch.tensor([0, 1, 7, 100, 511])
    y = interleave_rope(x, COS[pos], SIN[pos])
    # independent form: pair (2i, 2i+1) as a complex number times e^{i p theta_i}
    theta = pos.to(F64)[:, None] * 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.polar(torch.ones_like(theta), theta)[:, None, :]
    torch.testing.assert_close(y[..., 0::2], z.real, atol=1e-6, rtol=0)  # tables are fp32
    torch.testing.assert_close(y[..., 1::2], z.imag, atol=1e-6, rtol=0)
    back = interleave_rope(y, COS[pos], -SIN[pos])
    torch.testing.assert_close(back, x, atol=1e-6, rtol=0)
    assert not torch.allclose(y[1:], x[1:], atol=1e-3)


def test_rope_dot_products_depend_on_relative_position(gen):
    q = torch.randn(1, 16, generator=gen, dtype=F64)
    k = torch.randn(1, 16, generator=gen, dtype=F64)

    def dot(pq, pk):
        return (interleave_rope(q, COS[[pq]], SIN[[pq]]) * interleave_rope(k, COS[[pk]], SIN[[pk]])).sum().item()

    assert dot(10, 3) == pytest.approx(dot(107, 100), abs=1e-5)
    assert dot(10, 3) != pytest.approx(dot(10, 4), abs=1e-3)


# ---------------------------------------------------------------------------------------------------- Hadamard


def test_sylvester_hadamard_and_rotation(gen):
    h = sylvester_hadamard(16)
    i = torch.arange(16)
    pc = torch.tensor([[bin(a & b).count("1") for b in range(16)] for a in range(16)])
    assert torch.equal(h, (-1.0) ** pc.to(F64))
    assert torch.equal(h[:, 0], torch.ones(16, dtype=F64)) and torch.equal(h[i, i], (-1.0) ** pc.diagonal().to(F64))
    x = torch.randn(4, 32, generator=gen, dtype=F64)
    y = rotate_activation(x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # orthogonal for powers of two
    # non-power-of-two d: zero-pad to 32, scale by the original d
    x24 = torch.randn(2, 24, generator=gen, dtype=F64)
    ref = (torch.cat([x24, torch.zeros(2, 8, dtype=F64)], 1) @ sylvester_hadamard(32))[:, :24] / math.sqrt(24)
    torch.testing.assert_close(rotate_activation(x24), ref)


# ---------------------------------------------------------------------------------------------------- compressor


@pytest.mark.parametrize("ratio", [2, 4, 8])
def test_compressed_rows_are_causal(gen, ratio):
    d, w, x = _setup(gen, 37, ratio=ratio)
    full = _cmp(d, w, x)
    assert full.shape == (37 // ratio, d.D)
    for n in (ratio - 1, ratio, ratio + 1, 2 * ratio + 3, 36):
        part = _cmp(d, w, x[:n])
        assert part.shape[0] == n // ratio
        torch.testing.assert_close(part, full[: n // ratio], rtol=0, atol=1e-12)


def test_coff1_row_is_per_feature_softmax_of_its_group(gen):
    d, w, x = _setup(gen, 16, ratio=8)
    rows = _cmp(d, w, x)
    g1 = x[8:16]
    kv = g1 @ w["cmp_wkv"].T
    sc = g1 @ w["cmp_wgate"].T + w["cmp_ape"]
    y = (torch.softmax(sc, 0) * kv).sum(0)
    y = y / torch.sqrt((y * y).mean() + d.eps) * w["cmp_norm"]
    y = rope_last(y[None], COS[[8]], SIN[[8]], d.R)[0]
    torch.testing.assert_close(rows[1], y, rtol=0, atol=1e-12)


def test_coff2_row_depends_on_previous_group_only(gen):
    d, w, x = _setup(gen, 16, ratio=4)
    base = _cmp(d, w, x)
    for grp, changes in ((0, [True, True, False, False]), (1, [False, True, True, False]),
                         (2, [False, False, True, True])):
        x2 = x.clone()
        x2[4 * grp + 1] += 1.0
        new = _cmp(d, w, x2)
        for c, ch in enumerate(changes):
            diff = (new[c] - base[c]).abs().max().item()
            assert (diff > 1e-6) == ch, (grp, c, diff)


def test_coff2_rows_hand_formula(gen):
    d, w, x = _setup(gen, 12, ratio=4)
    rows = _cmp(d, w, x)
    D = d.D
    kv = x @ w["cmp_wkv"].T
    sc = x @ w["cmp_wgate"].T + w["cmp_ape"].repeat(3, 1)  # ape by position mod 4
    for c in range(3):
        cur_kv, cur_sc = kv[4 * c: 4 * c + 4, D:], sc[4 * c: 4 * c + 4, D:]
        if c == 0:  # no previous group: only the current group's [D, 2D) entries
            ekv, esc = cur_kv, cur_sc
        else:
            ekv = torch.cat([kv[4 * c - 4: 4 * c, :D], cur_kv])
            esc = torch.cat([sc[4 * c - 4: 4 * c, :D], cur_sc])
        y = (torch.softmax(esc, 0) * ekv).sum(0)
        y = y / torch.sqrt((y * y).mean() + d.eps) * w["cmp_norm"]
        y = rope_last(y[None], COS[[4 * c]], SIN[[4 * c]], d.R)[0]
        torch.testing.assert_close(rows[c], y, rtol=0, atol=1e-12)


def test_coff2_first_row_ignores_previous_columns(gen):
    # c = 0: the previous entries have score -inf, so the [0, D) columns of wkv/wgate do not matter for row 0
    d, w, x = _setup(gen, 8, ratio=4)
    w2 = dict(w)
    w2["cmp_wkv"] = w["cmp_wkv"].clone()
    w2["cmp_wkv"][: d.D] = 5.0
    r1, r2 = _cmp(d, w, x), _cmp(d, w2, x)
    torch.testing.assert_close(r1[0], r2[0], rtol=0, atol=1e-12)
    assert (r1[1] - r2[1]).abs().max() > 1e-3


def test_compress_rows_rejects_bad_coff(gen):
    d, w, x = _setup(gen, 8, ratio=4)
    with pytest.raises(ValueError, match="coff"):
        compress_rows(x, w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm"], 4, 3, d.D, COS, SIN, d.R, d.eps)


# ---------------------------------------------------------------------------------------------------- indexer


def test_indexer_topk_visibility_order_and_padding(gen):
    d, w, x = _setup(gen, 45, ratio=4, K=5)
    q_len = 45
    topk, scores = indexer_topk(d, w, x, q_len, COS, SIN)
    assert topk.shape == (45, 5) and scores.shape == (45, 11)
    for i in range(q_len):
        lim = visible_compressed(i, 4)
        n = min(lim, 5)
        row = topk[i].tolist()
        assert all(v == -1 for v in row[n:]) and all(0 <= v < lim for v in row[:n]), (i, row)
        assert len(set(row[:n])) == n
        sel = [scores[i, v].item() for v in row[:n]]
        assert sel == sorted(sel, reverse=True)
        if n:  # nothing unselected and visible scores higher than the last selected
            rest = [scores[i, c].item() for c in range(lim) if c not in row[:n]]
            assert all(r <= sel[-1] for r in rest)


def test_indexer_scores_match_brute_force_and_hadamard_is_invisible(gen):
    d, w, x = _setup(gen, 24, ratio=4)
    _, scores = indexer_topk(d, w, x, 3, COS, SIN)
    k = indexer_k_rows(d, w, x, COS, SIN)
    k_raw = compress_rows(x, w["idx_cmp_wkv"], w["idx_cmp_wgate"], w["idx_cmp_ape"], w["idx_cmp_norm"], 4, 2, d.Di,
                          COS, SIN, d.R, d.eps)
    qi, wt = indexer_queries(d, w, x[21:], torch.arange(21, 24), COS, SIN)
    # un-rotated queries computed independently from the weights
    xq = x[21:]
    qr = xq @ w["wq_a"].T
    qr = qr / torch.sqrt((qr * qr).mean(-1, keepdim=True) + d.eps) * w["q_norm"]
    q_raw = (qr @ w["idx_wq_b"].T).view(3, d.n_idx, d.Di)
    q_raw = rope_last(q_raw, COS[21:24], SIN[21:24], d.R)
    w_ref = (xq @ w["idx_weights_proj"].T) / math.sqrt(d.Di * d.n_idx)
    torch.testing.assert_close(wt, w_ref)
    ref = torch.zeros(3, k.shape[0], dtype=F64)
    for t in range(3):
        for c in range(k.shape[0]):
            ref[t, c] = sum(w_ref[t, h] * max(0.0, float(q_raw[t, h] @ k_raw[c])) for h in range(d.n_idx))
    torch.testing.assert_close(scores, ref, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(qi, q_raw)  # the rotation did happen


def test_indexer_rope_is_on_last_dims(gen):
    d, w, x = _setup(gen, 8, ratio=4)
    qa, _ = indexer_queries(d, w, x[:1], [0], COS, SIN)  # position 0: rope is identity
    qb, _ = indexer_queries(d, w, x[:1], [5], COS, SIN)
    ia = rotate_activation(qa)  # H/sqrt(d) is an involution: undo the rotation
    ib = rotate_activation(qb)
    torch.testing.assert_close(ia[..., : d.Di - d.R], ib[..., : d.Di - d.R], rtol=0, atol=1e-12)
    assert (ia[..., d.Di - d.R:] - ib[..., d.Di - d.R:]).abs().max() > 1e-3


def test_indexer_ties_take_lower_row_first():
    from _dsa_reference import topk_rows
    s = torch.tensor([[1.0, 3.0, 3.0, 0.5, 3.0]], dtype=F64)
    assert topk_rows(s, [5], 3).tolist() == [[1, 2, 4]]
    assert topk_rows(s, [2], 3).tolist() == [[1, 0, -1]]
    assert topk_rows(s, [0], 2).tolist() == [[-1, -1]]


# ---------------------------------------------------------------------------------------------------- attention


def _dense_ref(d, q, keys, sink):
    """Independent softmax-with-sink over an explicit key list: logits concatenated with the sink column."""
    lg = d.scale * (q @ keys.T)  # (N, J)
    full = torch.softmax(torch.cat([lg, sink[:, None].to(F64)], 1), 1)
    return full[:, :-1] @ keys


def test_swa_window_covers_everything_when_w_ge_s(gen):
    d, w, x = _setup(gen, 11, ratio=1, W=11)
    q, kv = prolog(d, w, x, torch.arange(11), COS, SIN)
    o = sas_attention(d, q, kv, None, torch.arange(11), w["attn_sink"])
    for p in range(11):
        torch.testing.assert_close(o[p], _dense_ref(d, q[p], kv[: p + 1], w["attn_sink"]))
    # and a window of 3 sees exactly the 3 latest tokens
    d3 = DsaDims(ratio=1, W=3)
    o3 = sas_attention(d3, q, kv, None, torch.arange(11), w["attn_sink"])
    torch.testing.assert_close(o3[7], _dense_ref(d3, q[7], kv[5:8], w["attn_sink"]))
    assert not torch.allclose(o3[7], o[7])


def test_sinks_huge_gives_zero_and_minus_inf_is_no_sink(gen):
    d, w, x = _setup(gen, 9, ratio=1)
    big = dict(w, attn_sink=torch.full((d.N,), 1e4, dtype=torch.float32))
    assert dsa_layer(d, big, x, 4, COS, SIN).abs().max() < 1e-12
    none = dict(w, attn_sink=torch.full((d.N,), float("-inf"), dtype=torch.float32))
    q, kv = prolog(d, w, x, torch.arange(9), COS, SIN)
    o = sas_attention(d, q, kv, None, torch.arange(9), none["attn_sink"])
    for p in range(9):
        lo = max(0, p - d.W + 1)
        ref = torch.softmax(d.scale * (q[p] @ kv[lo: p + 1].T), -1) @ kv[lo: p + 1]
        torch.testing.assert_close(o[p], ref)
    assert not torch.allclose(dsa_layer(d, none, x, 4, COS, SIN), dsa_layer(d, w, x, 4, COS, SIN))


def test_compressed_rows_visibility_dense(gen):
    d, w, x = _setup(gen, 20, ratio=2, W=4)
    q, kv = prolog(d, w, x, torch.arange(20), COS, SIN)
    ck = _cmp(d, w, x)
    o = sas_attention(d, q, kv, ck, torch.arange(20), w["attn_sink"])
    for p in (0, 1, 2, 9, 19):
        keys = torch.cat([kv[max(0, p - 3): p + 1], ck[: (p + 1) // 2]])
        torch.testing.assert_close(o[p], _dense_ref(d, q[p], keys, w["attn_sink"]))


def test_ratio4_sparse_equals_dense_when_k_covers_visible(gen):
    S = 30
    d, w, x = _setup(gen, S, ratio=4, K=8)  # S // 4 = 7 <= K
    topk, _ = indexer_topk(d, w, x, S, COS, SIN)
    assert (topk[-1] >= 0).sum() == 7
    q, kv = prolog(d, w, x, torch.arange(S), COS, SIN)
    ck = _cmp(d, w, x)
    sparse = sas_attention(d, q, kv, ck, torch.arange(S), w["attn_sink"], topk)
    dense = sas_attention(d, q, kv, ck, torch.arange(S), w["attn_sink"], None)
    torch.testing.assert_close(sparse, dense, rtol=0, atol=1e-12)
    # with a smaller K the sets differ, and -1 / out-of-range entries are skipped
    d2 = DsaDims(ratio=4, K=2)
    t2, _ = indexer_topk(d2, w, x, S, COS, SIN)
    s2 = sas_attention(d2, q, kv, ck, torch.arange(S), w["attn_sink"], t2)
    assert not torch.allclose(s2[-1], dense[-1])
    junk = torch.cat([t2, torch.full((S, 2), -1), torch.full((S, 1), 99)], 1)
    torch.testing.assert_close(sas_attention(d2, q, kv, ck, torch.arange(S), w["attn_sink"], junk), s2)
    p = S - 1
    keys = torch.cat([kv[p - d.W + 1: p + 1], ck[t2[p]]])
    torch.testing.assert_close(s2[p], _dense_ref(d2, q[p], keys, w["attn_sink"]))


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
def test_decode_rows_equal_prefill_rows(gen, ratio):
    S = 27
    d, w, x = _setup(gen, S, ratio=ratio, K=3)
    full = dsa_layer(d, w, x, S, COS, SIN)
    assert full.shape == (S, d.hidden) and full.dtype == F64
    for n in (1, 4, 5, 16, 27):
        torch.testing.assert_close(dsa_layer(d, w, x[:n], 1, COS, SIN)[0], full[n - 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(dsa_layer(d, w, x, 6, COS, SIN), full[-6:], rtol=0, atol=1e-12)
    assert full.abs().max() < 50 and full.std() > 1e-2  # O(1) activations


def test_ratio128_runs_and_uses_compressed_rows(gen):
    S = 260
    d, w, x = _setup(gen, S, ratio=128, W=4)
    assert _cmp(d, w, x).shape == (2, d.D)
    out = dsa_layer(d, w, x, 3, COS, SIN)
    w2 = dict(w, cmp_norm=w["cmp_norm"] * 3)
    assert not torch.allclose(dsa_layer(d, w2, x, 3, COS, SIN), out)
    # a query before any complete row does not depend on the compressor
    torch.testing.assert_close(dsa_layer(d, w2, x[:100], 1, COS, SIN), dsa_layer(d, w, x[:100], 1, COS, SIN))


def test_inverse_rope_on_output(gen):
    # the output rope slice is de-rotated at the query position: recompute by hand for one row
    d, w, x = _setup(gen, 10, ratio=1)
    q, kv = prolog(d, w, x, torch.arange(10), COS, SIN)
    o = sas_attention(d, q, kv, None, torch.arange(10), w["attn_sink"])[9]
    o = o.clone()
    o[:, -d.R:] = interleave_rope(o[:, -d.R:], COS[[9]], -SIN[[9]])
    ref = o_proj(d, w, o[None])
    torch.testing.assert_close(dsa_layer(d, w, x, 1, COS, SIN), ref)


def test_o_proj_grouping_is_block_diagonal(gen):
    d, w, _ = _setup(gen, 1, G=4, o_lora=8)
    o = torch.randn(3, d.N, d.D, generator=gen, dtype=F64)
    bd = torch.block_diag(*[w["wo_a"][g] for g in range(d.G)])  # (N D, G o_lora)
    torch.testing.assert_close(o_proj(d, w, o), o.reshape(3, -1) @ bd @ w["wo_b"].T)


def test_prolog_against_hand_formulas(gen):
    d, w, x = _setup(gen, 5, ratio=1)
    q, kv = prolog(d, w, x, [0, 0, 0, 0, 0], COS, SIN)  # position 0: rope is identity
    qr = x @ w["wq_a"].T
    qr = qr / torch.sqrt((qr ** 2).mean(-1, keepdim=True) + d.eps) * w["q_norm"]
    qq = (qr @ w["wq_b"].T).view(5, d.N, d.D)
    torch.testing.assert_close(q, qq / torch.sqrt((qq ** 2).mean(-1, keepdim=True) + d.eps))
    kk = x @ w["wkv"].T
    torch.testing.assert_close(kv, kk / torch.sqrt((kk ** 2).mean(-1, keepdim=True) + d.eps) * w["kv_norm"])
    torch.testing.assert_close(swa_rows(d, w, x, COS, SIN)[0], kv[0])
    q3, kv3 = prolog(d, w, x, [3] * 5, COS, SIN)
    torch.testing.assert_close(q3[..., : d.D - d.R], q[..., : d.D - d.R])
    torch.testing.assert_close(kv3[..., d.D - d.R:], interleave_rope(kv[..., d.D - d.R:], COS[[3] * 5], SIN[[3] * 5]))


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_fp32_and_float64_inputs_agree(ratio):
    S = 140 if ratio == 128 else 21
    outs = []
    for dt in (torch.float32, F64):
        g = torch.Generator()
        g.manual_seed(99)
        d, w, x = _setup(g, S, dtype=dt, ratio=ratio)
        outs.append(dsa_layer(d, w, x, 5, COS, SIN))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- DSpark


def test_dspark_window_is_context_plus_whole_block(gen):
    S, q_len = 20, 4
    d, w, x = _setup(gen, S, ratio=1, W=5)
    assert dspark_positions(S, q_len, 5) == list(range(11, 20))
    assert dspark_positions(6, 4, 5) == list(range(0, 6))
    out = dsa_layer(d, w, x, q_len, COS, SIN, dspark=4)
    q, kv = prolog(d, w, x, torch.arange(S), COS, SIN)
    for i in range(q_len):
        p = S - q_len + i
        o = _dense_ref(d, q[p], kv[11:20], w["attn_sink"])
        o[:, -d.R:] = interleave_rope(o[:, -d.R:], COS[[p]], -SIN[[p]])
        torch.testing.assert_close(out[i], o_proj(d, w, o[None])[0])
    # non-causal: the first draft row depends on the last draft token; the causal path does not
    x2 = x.clone()
    x2[-1] += 1.0
    assert not torch.allclose(dsa_layer(d, w, x2, q_len, COS, SIN, dspark=4)[0], out[0])
    torch.testing.assert_close(dsa_layer(d, w, x2, q_len, COS, SIN)[0], dsa_layer(d, w, x, q_len, COS, SIN)[0])


def test_bad_arguments_raise(gen):
    d, w, x = _setup(gen, 8, ratio=4)
    with pytest.raises(ValueError, match="dspark"):
        dsa_layer(d, w, x, 2, COS, SIN, dspark=2)
    d1, w1, x1 = _setup(gen, 8, ratio=1)
    with pytest.raises(ValueError, match="num_spec"):
        dsa_layer(d1, w1, x1, 3, COS, SIN, dspark=2)
    with pytest.raises(ValueError, match="q_len"):
        dsa_layer(d1, w1, x1, 9, COS, SIN)
    with pytest.raises(ValueError, match="Di"):
        DsaDims(Di=24)
    with pytest.raises(ValueError, match="ratio"):
        DsaDims(ratio=0)
