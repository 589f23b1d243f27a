"""The DeepSeek-V4 (DSA) operators of vllm-ascend's ``_C_ascend`` (issue 12) through the dispatcher: the CPU
twins (``torch.ops.ascend_cpu_va``) of ``npu_sparse_attn_sharedkv`` (+ ``_metadata``), ``npu_scatter_nd_update_v2``
and ``inplace_partial_rotary_mul`` against float64 references written here from docs/design/dsa.md §1.4 / docs/design/sparse.md §2 / docs/design/dsa.md §4.1
(SWA windows, C4 sparse compressed rows with -1 and out-of-limit entries, C128-style dense compressed rows, sinks,
DSpark physical ori slots, empty rows, TND and BSND, fp32 and bf16), the no-compute kernels' shapes
(``ascend_noop_va``, CPU and meta), and bad input refused by name with caller buffers untouched."""

import math

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)

CPU = torch.ops.ascend_cpu_va
NOOP = torch.ops.ascend_noop_va


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


def _i32(v):
    return torch.tensor(v, dtype=torch.int32)


# --------------------------------------------------------------------------------------------- batch builder


class Case:
    """A TND batch over paged SWA (ori) and compressed (cmp) caches at shuffled blocks.

    ori_rows[b]: (S_b, D) raw KV rows; cmp_rows[b]: (S_b // r, D) compressed rows."""

    def __init__(self, q_lens, kv_lens, n=4, d=32, bs=4, r=None, bs_cmp=2, dtype=torch.float32, seed=0,
                 spare_blocks=3):
        g = torch.Generator().manual_seed(seed)
        self.q_lens, self.kv_lens, self.n, self.d, self.r, self.dtype = q_lens, kv_lens, n, d, r, dtype
        self.B = len(q_lens)
        self.T = sum(q_lens)
        self.cu = [0]
        for q in q_lens:
            self.cu.append(self.cu[-1] + q)
        self.q = torch.randn(self.T, n, d, generator=g).to(dtype)
        self.ori_rows = [torch.randn(s, d, generator=g).to(dtype) for s in kv_lens]
        self.ori_kv, self.ori_bt = self._page(self.ori_rows, bs, g, spare_blocks)
        if r is not None:
            self.cmp_rows = [torch.randn(s // r, d, generator=g).to(dtype) for s in kv_lens]
            self.cmp_kv, self.cmp_bt = self._page(self.cmp_rows, bs_cmp, g, spare_blocks)
        self.sinks = torch.randn(n, generator=g)
        self.g = g

    def _page(self, rows, bs, g, spare):
        need = [max(1, math.ceil(x.shape[0] / bs)) for x in rows]
        nb = sum(need) + spare
        perm = torch.randperm(nb, generator=g).tolist()
        cache = torch.randn(nb, bs, 1, self.d, generator=g).to(self.dtype)  # garbage everywhere else
        cols = max(need) + 1
        bt = torch.full((self.B, cols), nb + 7, dtype=torch.int32)  # unused columns hold invalid ids
        k = 0
        for b, x in enumerate(rows):
            for c in range(need[b]):
                blk = perm[k]
                k += 1
                bt[b, c] = blk
                part = x[c * bs:(c + 1) * bs]
                cache[blk, :part.shape[0], 0] = part
        return cache, bt

    def pos(self, t):
        b = max(i for i in range(self.B) if self.cu[i] <= t and self.q_lens[i] > 0 and t < self.cu[i + 1])
        return b, self.kv_lens[b] - self.q_lens[b] + (t - self.cu[b])


def reference(case, *, win_left=None, win_right=0, ori=True, ori_slots=None, cmp=False, cmp_idx=None, sinks=None,
              scale=0.1):
    """float64 out (T, N, D) and lse (T, N) of docs/design/dsa.md §1.4, one row at a time."""
    T, N, D = case.T, case.n, case.d
    out = torch.zeros(T, N, D, dtype=torch.float64)
    lse = torch.full((T, N), -math.inf, dtype=torch.float64)
    flat_ori = case.ori_kv.reshape(-1, D).double()
    for t in range(T):
        b, p = case.pos(t)
        S = case.kv_lens[b]
        keys = []
        if ori and ori_slots is not None:
            keys += [flat_ori[s] for s in ori_slots[t].flatten().tolist() if s != -1]
        elif ori:
            lo, hi = max(0, p - win_left), min(S - 1, p + win_right)
            keys += [case.ori_rows[b][j].double() for j in range(lo, hi + 1)]
        if cmp:
            limit = (p + 1) // case.r
            if cmp_idx is None:
                keys += [case.cmp_rows[b][c].double() for c in range(limit)]
            else:
                keys += [case.cmp_rows[b][e].double() for e in cmp_idx[t].flatten().tolist() if 0 <= e < limit]
        qd = case.q[t].double()
        if not keys:
            if sinks is not None:
                lse[t] = sinks.double()
            continue
        K = torch.stack(keys)
        logits = scale * qd @ K.T  # (N, M)
        m = logits.max(dim=1).values
        if sinks is not None:
            m = torch.maximum(m, sinks.double())
        e = torch.exp(logits - m[:, None])
        den = e.sum(dim=1)
        if sinks is not None:
            den = den + torch.exp(sinks.double() - m)
        out[t] = (e @ K) / den[:, None]
        lse[t] = m + torch.log(den)
    return out, lse


def run(case, *, win_left=3, win_right=0, ori=True, ori_slots=None, cmp=False, cmp_idx=None, sinks=None, scale=0.1,
        lse=True, ns=CPU, **over):
    kw = dict(cu_seqlens_q=_i32(case.cu), seqused_kv=_i32(case.kv_lens), softmax_scale=scale,
              ori_win_left=win_left, ori_win_right=win_right, layout_q="TND", layout_kv="PA_ND",
              return_softmax_lse=lse, cmp_ratio=1)
    if ori:
        kw.update(ori_kv=case.ori_kv, ori_block_table=case.ori_bt)
        if ori_slots is not None:
            kw["ori_sparse_indices"] = ori_slots
    if cmp:
        kw.update(cmp_kv=case.cmp_kv, cmp_block_table=case.cmp_bt, cmp_ratio=case.r)
        if cmp_idx is not None:
            kw["cmp_sparse_indices"] = cmp_idx
    if sinks is not None:
        kw["sinks"] = sinks
    kw.update(over)
    return ns.npu_sparse_attn_sharedkv(case.q, **kw)


def check(case, got, ref, tol):
    out, lse = got
    r_out, r_lse = ref
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    torch.testing.assert_close(out.double(), r_out, rtol=tol, atol=tol)
    assert lse.shape == (case.T, case.n) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), r_lse, rtol=tol, atol=tol)


TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
DTYPES = [torch.float32, torch.bfloat16]

# Decode rows, a prefill with context, a zero-length request, a fresh prefill.
Q_LENS, KV_LENS = [1, 5, 0, 4, 2], [9, 13, 6, 4, 23]


# --------------------------------------------------------------------------------------------- attention


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("win_left,win_right", [(3, 0), (0, 0), (127, 0), (2, 2), (5, 1)])
def test_swa_only_windows(dtype, win_left, win_right):
    case = Case(Q_LENS, KV_LENS, dtype=dtype, seed=win_left * 7 + win_right)
    got = run(case, win_left=win_left, win_right=win_right)
    check(case, got, reference(case, win_left=win_left, win_right=win_right), TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_swa_with_sinks(dtype):
    case = Case(Q_LENS, KV_LENS, dtype=dtype, seed=11)
    sinks = case.sinks * 3
    got = run(case, win_left=4, sinks=sinks)
    check(case, got, reference(case, win_left=4, sinks=sinks), TOL[dtype])
    # The sink only adds to the denominator: out is the no-sink output times Z / (Z + e^sink).
    plain = run(case, win_left=4)[0].double()
    assert (got[0].double().norm(dim=-1) < plain.norm(dim=-1) + TOL[dtype]).all()


def _c4_indices(case, k, g):
    """Per row: a random mix of visible rows, -1, rows at/after the visible limit, duplicates."""
    idx = torch.full((case.T, 1, k), -1, dtype=torch.int32)
    for t in range(case.T):
        b, p = case.pos(t)
        n_rows = case.cmp_rows[b].shape[0]
        for j in range(k):
            u = torch.rand(1, generator=g).item()
            if u < 0.2:
                continue  # -1
            if n_rows == 0:
                continue
            idx[t, 0, j] = int(torch.randint(0, n_rows, (1,), generator=g))  # may be >= the row's limit
    if case.T > 1:
        idx[1, 0, :2] = idx[1, 0, 2]  # duplicates count twice
    return idx


@pytest.mark.parametrize("dtype", DTYPES)
def test_c4_sparse_compressed_rows_with_window_and_sinks(dtype):
    case = Case(Q_LENS, [9, 17, 6, 8, 23], r=4, bs_cmp=2, dtype=dtype, seed=21)
    idx = _c4_indices(case, 6, case.g)
    got = run(case, win_left=5, cmp=True, cmp_idx=idx, sinks=case.sinks)
    check(case, got, reference(case, win_left=5, cmp=True, cmp_idx=idx, sinks=case.sinks), TOL[dtype])
    # The compressed rows do change the answer (the test would not notice them otherwise).
    swa = run(case, win_left=5, sinks=case.sinks)[0]
    assert not torch.allclose(swa.double(), got[0].double(), atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("r", [8, 128])
def test_dense_compressed_rows_c128_style(dtype, r):
    kv = [9, 40, 6, 260, 23] if r == 128 else [9, 40, 6, 30, 23]
    case = Case(Q_LENS, kv, r=r, bs_cmp=2, dtype=dtype, seed=r)
    got = run(case, win_left=6, cmp=True, sinks=case.sinks)
    check(case, got, reference(case, win_left=6, cmp=True, sinks=case.sinks), TOL[dtype])


def test_compressed_visibility_boundary():
    # One request, S = 12, q = 12, r = 4: row i sees compressed rows c < (i + 1) // 4.
    case = Case([12], [12], r=4, bs_cmp=1, n=2, d=8, seed=5)
    got = run(case, ori=False, cmp=True, win_left=0)
    ref = reference(case, ori=False, cmp=True)
    check(case, got, ref, 1e-5)
    # Rows 0..2 see nothing: zero output, lse -inf (no sink).
    assert torch.equal(got[0][:3], torch.zeros(3, 2, 8)) and torch.isinf(got[1][:3]).all()
    assert got[0][3].abs().sum() > 0
    # Row 3 (p = 3) sees exactly compressed row 0: out = that row for every head.
    torch.testing.assert_close(got[0][3], case.cmp_rows[0][0].expand(2, 8))


def test_empty_rows_with_sink_give_zero_and_lse_sink():
    case = Case([2, 1], [3, 2], r=4, bs_cmp=1, n=3, d=8, seed=9)
    out, lse = run(case, ori=False, cmp=True, sinks=case.sinks)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse, case.sinks.expand(3, 3))


def _dspark_slots(case, bs, W, num_spec):
    """docs/design/dsa.md §3.4: physical slots of the trailing W context tokens plus the draft block, repeated per row."""
    width = ((W + num_spec + 127) // 128) * 128
    rows = []
    for b in range(case.B):
        q, S = case.q_lens[b], case.kv_lens[b]
        start = max(S - q - W, 0)
        vis = S - start
        row = [-1] * width
        for j in range(min(vis, width)):
            p = start + j
            col = min(max(p // bs, 0), case.ori_bt.shape[1] - 1)
            row[j] = int(case.ori_bt[b, col]) * bs + p % bs
        rows += [row] * q
    return torch.tensor(rows, dtype=torch.int32).view(case.T, 1, width)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dspark_ori_sparse_indices_are_physical_slots(dtype):
    W, num_spec = 3, 2
    case = Case([2, 2, 2], [7, 2, 12], dtype=dtype, seed=31)
    slots = _dspark_slots(case, 4, W, num_spec)
    got = run(case, ori_slots=slots, win_left=W + num_spec - 1, sinks=case.sinks)
    check(case, got, reference(case, ori_slots=slots, sinks=case.sinks), TOL[dtype])
    # Non-causal over the draft block: both rows of a request see the same keys, so with equal queries equal outputs.
    case.q[1] = case.q[0]
    out = run(case, ori_slots=slots, win_left=W + num_spec - 1)[0]
    torch.testing.assert_close(out[0], out[1])


def test_bsnd_layout_equals_tnd():
    case = Case([3, 3], [5, 9], r=4, bs_cmp=2, seed=41)
    idx = _c4_indices(case, 4, case.g)
    tnd = run(case, cmp=True, cmp_idx=idx, sinks=case.sinks)
    bsnd = CPU.npu_sparse_attn_sharedkv(
        case.q.view(2, 3, case.n, case.d), ori_kv=case.ori_kv, cmp_kv=case.cmp_kv, cmp_sparse_indices=idx,
        ori_block_table=case.ori_bt, cmp_block_table=case.cmp_bt, seqused_kv=_i32(case.kv_lens), sinks=case.sinks,
        softmax_scale=0.1, cmp_ratio=4, ori_win_left=3, layout_q="BSND", return_softmax_lse=True)
    assert bsnd[0].shape == (2, 3, case.n, case.d) and bsnd[1].shape == (2, 3, case.n)
    torch.testing.assert_close(bsnd[0].reshape(tnd[0].shape), tnd[0], rtol=0, atol=0)
    torch.testing.assert_close(bsnd[1].reshape(tnd[1].shape), tnd[1], rtol=0, atol=0)


def test_dsv4_shapes_and_unread_arguments():
    """D = 512, 8 heads, the A2/A3 call's extra arguments (cu_seqlens_ori_kv = qsl, an empty cu_seqlens_cmp_kv, the
    metadata blob) change nothing; return_softmax_lse=False gives an empty lse."""
    case = Case([1, 3], [130, 140], n=8, d=512, bs=128, r=4, bs_cmp=128, seed=51)
    idx = _c4_indices(case, 16, case.g)
    md = CPU.npu_sparse_attn_sharedkv_metadata(8, 1, 512, cu_seqlens_q=_i32(case.cu),
                                               seqused_kv=_i32(case.kv_lens), batch_size=2, cmp_ratio=4,
                                               cmp_topk=16, ori_win_left=127, layout_q="TND")
    scale = 512 ** -0.5
    base = run(case, win_left=127, cmp=True, cmp_idx=idx, sinks=case.sinks, scale=scale, lse=False)
    assert base[1].numel() == 0 and base[1].dtype == torch.float32
    extra = run(case, win_left=127, cmp=True, cmp_idx=idx, sinks=case.sinks, scale=scale, lse=False,
                cu_seqlens_ori_kv=_i32(case.cu), cu_seqlens_cmp_kv=torch.empty(0, dtype=torch.int32), metadata=md)
    assert torch.equal(base[0], extra[0])
    ref = reference(case, win_left=127, cmp=True, cmp_idx=idx, sinks=case.sinks, scale=scale)
    torch.testing.assert_close(base[0].double(), ref[0], rtol=1e-5, atol=1e-5)


def test_caches_may_be_strided_views():
    case = Case(Q_LENS, KV_LENS, r=4, bs_cmp=2, seed=61)
    # The same caches as slices of wider rows (a row view with a stride of 2 D).
    wide_o = torch.zeros(*case.ori_kv.shape[:3], 2 * case.d)
    wide_o[..., case.d:] = case.ori_kv
    wide_c = torch.zeros(*case.cmp_kv.shape[:3], 2 * case.d)
    wide_c[..., case.d:] = case.cmp_kv
    a = run(case, cmp=True, sinks=case.sinks)
    b = run(case, cmp=True, sinks=case.sinks, ori_kv=wide_o[..., case.d:], cmp_kv=wide_c[..., case.d:])
    assert torch.equal(a[0], b[0])


# --------------------------------------------------------------------------------------------- bad input


def _bad(case, match, **over):
    with pytest.raises(Exception, match=match):
        run(case, cmp=True, sinks=case.sinks, **over)


def test_attention_rejects_bad_input_by_name():
    case = Case([2, 3], [4, 9], r=4, bs_cmp=2, seed=71)
    _bad(case, "seqused_kv", seqused_kv=None)
    _bad(case, "seqused_kv", seqused_kv=torch.tensor([4, 9]))  # int64
    _bad(case, "seqused_kv", seqused_kv=_i32([1, 9]))  # shorter than the query
    _bad(case, "cu_seqlens_q", cu_seqlens_q=_i32([0, 2]))
    _bad(case, "cu_seqlens_q", cu_seqlens_q=_i32([0, 3, 2]))
    _bad(case, "cu_seqlens_q", cu_seqlens_q=None)
    _bad(case, "softmax_scale", softmax_scale=0.0)
    _bad(case, "ori_win_left", ori_win_left=-1)
    _bad(case, "ori_mask_mode", ori_mask_mode=0)
    _bad(case, "cmp_mask_mode", cmp_mask_mode=1)
    _bad(case, "layout_kv", layout_kv="PA_BSND")
    _bad(case, "layout_q", layout_q="BNSD")
    _bad(case, "seqused_q", seqused_q=_i32([2, 3]))
    _bad(case, "sinks", sinks=torch.zeros(case.n + 1))
    _bad(case, "sinks", sinks=torch.zeros(case.n, dtype=torch.bfloat16))
    _bad(case, "cmp_ratio", cmp_ratio=1)
    _bad(case, "cmp_block_table", cmp_block_table=None)
    _bad(case, "ori_block_table", ori_block_table=None)
    _bad(case, "ori_kv", ori_kv=case.ori_kv.to(torch.bfloat16))
    _bad(case, "ori_kv", ori_kv=case.ori_kv[..., :8])
    _bad(case, "cmp_kv", cmp_kv=case.cmp_kv.squeeze(2))
    _bad(case, "metadata", metadata=torch.zeros(10, dtype=torch.int32))
    _bad(case, "cu_seqlens_ori_kv", cu_seqlens_ori_kv=torch.zeros(2, 2, dtype=torch.int32))
    bt = case.ori_bt.clone()
    bt[1, 0] = -3
    _bad(case, r"ori_block_table\[1, 0\]=-3", ori_block_table=bt)
    _bad(case, "ori_block_table has", ori_block_table=case.ori_bt[:, :1])
    idx = torch.full((case.T, 1, 3), -1, dtype=torch.int32)
    idx[4, 0, 1] = -2
    _bad(case, r"cmp_sparse_indices\[4, 0, 1\]=-2", cmp_sparse_indices=idx)
    _bad(case, "cmp_sparse_indices", cmp_sparse_indices=idx[:2])
    slots = torch.full((case.T, 1, 3), -1, dtype=torch.int32)
    slots[0, 0, 0] = case.ori_kv.shape[0] * case.ori_kv.shape[1]
    _bad(case, "ori_sparse_indices", ori_sparse_indices=slots)
    with pytest.raises(Exception, match="neither ori_kv nor cmp_kv"):
        CPU.npu_sparse_attn_sharedkv(case.q, cu_seqlens_q=_i32(case.cu), seqused_kv=_i32(case.kv_lens),
                                     softmax_scale=0.1, layout_q="TND")
    with pytest.raises(Exception, match="cmp_sparse_indices is given without cmp_kv"):
        run(case, cmp_sparse_indices=idx)


# --------------------------------------------------------------------------------------------- metadata


def test_metadata_blob_is_deterministic_and_validated():
    kw = dict(cu_seqlens_q=_i32([0, 1, 4]), seqused_kv=_i32([9, 20]), batch_size=2, max_seqlen_q=3,
              max_seqlen_kv=20, cmp_topk=512, cmp_ratio=4, ori_win_left=127, layout_q="TND")
    a = CPU.npu_sparse_attn_sharedkv_metadata(64, 1, 512, **kw)
    b = CPU.npu_sparse_attn_sharedkv_metadata(64, 1, 512, **kw)
    assert a.shape == (1024,) and a.dtype == torch.int32 and torch.equal(a, b)
    c = CPU.npu_sparse_attn_sharedkv_metadata(64, 1, 512, **{**kw, "seqused_kv": _i32([9, 21])})
    assert not torch.equal(a, c)  # it follows the lengths
    # Callable with no tensor at all (every length is optional).
    d = CPU.npu_sparse_attn_sharedkv_metadata(8, 1, 512, batch_size=1, cmp_ratio=1, has_cmp_kv=False)
    assert d.shape == (1024,)
    for match, over in [("num_heads_kv", dict(num_heads_kv=2)), ("num_heads_q", dict(num_heads_q=0)),
                        ("cmp_ratio", dict(cmp_ratio=1)), ("cu_seqlens_q", dict(cu_seqlens_q=_i32([0, 1]))),
                        ("seqused_kv", dict(seqused_kv=_i32([9]))), ("layout_kv", dict(layout_kv="BSND")),
                        ("ori_mask_mode", dict(ori_mask_mode=1)), ("max_seqlen_q", dict(max_seqlen_q=-1))]:
        args = {**kw, **over}
        nq = args.pop("num_heads_q", 64)
        nkv = args.pop("num_heads_kv", 1)
        with pytest.raises(Exception, match=match):
            CPU.npu_sparse_attn_sharedkv_metadata(nq, nkv, 512, **args)


# --------------------------------------------------------------------------------------------- scatter v2


def _scatter_ref(var, idx, upd):
    out = var.clone()
    nb, bs = var.shape[0], var.shape[1]
    for i, (blk, off) in enumerate(idx.tolist()):
        lin = blk * bs + off
        if blk < 0 or off < 0 or lin < 0 or lin >= nb * bs:
            continue
        out[lin // bs, lin % bs] = upd[i].reshape(out.shape[2:])
    return out


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("squeezed", [False, True])
def test_scatter_nd_update_v2(idx_dtype, squeezed):
    nb, bs, d = 4, 8, 16
    cache = torch.randn(nb, bs, 1, d).to(torch.bfloat16)
    idx = torch.tensor([[2, 3], [-1, bs - 1], [0, 0], [3, 7], [nb, 0], [1, 5], [2, 3], [-1, bs + 2]],
                       dtype=idx_dtype)
    upd = torch.randn(idx.shape[0], d if squeezed else 1, d).to(torch.bfloat16)
    if squeezed:
        upd = upd[:, 0]
    want = _scatter_ref(cache, idx, upd)
    assert CPU.npu_scatter_nd_update_v2(cache, idx, upd) is None
    assert torch.equal(cache, want)
    # The last of the two writes to (2, 3) won; (-1, bs-1), (nb, 0) and (-1, bs+2) wrote nothing.
    assert torch.equal(cache[2, 3, 0], upd[6].reshape(d))


def test_scatter_nd_update_v2_strided_view_and_noop():
    base = torch.zeros(3, 4, 1, 2 * 8)
    view = base[..., 8:]
    idx = _i32([[1, 2], [0, 0]])
    upd = torch.ones(2, 1, 8)
    CPU.npu_scatter_nd_update_v2(view, idx, upd)
    assert base[1, 2, 0, 8:].eq(1).all() and base[0, 0, 0, 8:].eq(1).all() and base[..., :8].eq(0).all()
    assert base.sum() == 16
    before = base.clone()
    NOOP.npu_scatter_nd_update_v2(view, idx, upd * 5)
    assert torch.equal(base, before)


def test_scatter_nd_update_v2_rejects_bad_input_untouched():
    cache = torch.randn(4, 8, 1, 16)
    before = cache.clone()
    for match, idx, upd in [
        ("indices", torch.zeros(2, 2), torch.zeros(2, 1, 16)),
        ("update", _i32([[0, 1], [1, 1]]), torch.zeros(2, 1, 15)),
        ("update", _i32([[0, 1], [1, 1]]), torch.zeros(2, 1, 16, dtype=torch.float16)),
        ("last dim k", _i32([[0, 1, 0, 0, 0]]), torch.zeros(1)),
    ]:
        with pytest.raises(Exception, match=match):
            CPU.npu_scatter_nd_update_v2(cache, idx, upd)
    assert torch.equal(cache, before)


# --------------------------------------------------------------------------------------------- partial rotary


def _rope_ref(x, cos, sin, mode, a, b):
    y = x.double().clone()
    s = y[..., a:b].clone()
    c, sn = cos.double().expand_as(s), sin.double().expand_as(s)
    w = b - a
    out = torch.empty_like(s)
    if mode == "interleave":
        for i in range(0, w, 2):
            out[..., i] = s[..., i] * c[..., i] - s[..., i + 1] * sn[..., i]
            out[..., i + 1] = s[..., i + 1] * c[..., i + 1] + s[..., i] * sn[..., i + 1]
    else:
        h = w // 2
        for i in range(h):
            out[..., i] = s[..., i] * c[..., i] - s[..., i + h] * sn[..., i]
            out[..., i + h] = s[..., i + h] * c[..., i + h] + s[..., i] * sn[..., i + h]
    y[..., a:b] = out
    return y


def _tables(t, w, mode, g):
    pos = torch.arange(t, dtype=torch.float64)[:, None]
    freq = 1.0 / (10000 ** (torch.arange(w // 2, dtype=torch.float64) * 2 / w))
    ang = pos * freq
    ang = ang.repeat_interleave(2, -1) if mode == "interleave" else torch.cat([ang, ang], -1)
    return ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]  # (T, 1, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["interleave", "half"])
def test_inplace_partial_rotary_mul(dtype, mode):
    g = torch.Generator().manual_seed(3)
    T, N, D, a, b = 6, 4, 40, 24, 40
    x = torch.randn(T, N, D, generator=g).to(dtype)
    orig = x.clone()
    cos, sin = _tables(T, b - a, mode, g)
    want = _rope_ref(x, cos, sin, mode, a, b)
    assert CPU.inplace_partial_rotary_mul(x, cos, sin, mode, [a, b]) is None
    torch.testing.assert_close(x.double(), want, rtol=TOL[dtype], atol=TOL[dtype])
    assert torch.equal(x[..., :a], orig[..., :a])  # outside the slice: untouched
    # -sin de-rotates (docs/design/dsa.md §1.1).
    CPU.inplace_partial_rotary_mul(x, cos, -sin, mode, [a, b])
    torch.testing.assert_close(x.double(), orig.double(), rtol=2 * TOL[dtype], atol=4 * TOL[dtype])


def test_inplace_partial_rotary_mul_2d_tables_and_noop():
    x = torch.randn(3, 2, 8)
    cos, sin = torch.rand(3, 1, 4), torch.rand(3, 1, 4)
    want = _rope_ref(x, cos, sin, "interleave", 4, 8)
    CPU.inplace_partial_rotary_mul(x, cos.view(3, 1, 4), sin, "interleave", [4, 8])
    torch.testing.assert_close(x.double(), want)
    y = torch.randn(2, 8)  # broadcasting a (4,) table over rows
    want = _rope_ref(y, cos[0, 0], sin[0, 0], "half", 2, 6)
    CPU.inplace_partial_rotary_mul(y, cos[0, 0], sin[0, 0], "half", [2, 6])
    torch.testing.assert_close(y.double(), want)
    before = y.clone()
    NOOP.inplace_partial_rotary_mul(y, cos[0, 0], sin[0, 0], "half", [2, 6])
    assert torch.equal(y, before)


def test_inplace_partial_rotary_mul_rejects_bad_input_untouched():
    x = torch.randn(3, 2, 8)
    before = x.clone()
    c = torch.ones(3, 1, 4)
    for match, args in [("rotary_mode", (c, c, "neox", [4, 8])), ("partial_slice", (c, c, "half", [4, 9])),
                        ("partial_slice", (c, c, "half", [4])), ("even", (torch.ones(3, 1, 3),) * 2 + ("half", [4, 7])),
                        ("r1", (torch.ones(3, 1, 6), c, "half", [4, 8])), ("r2", (c, torch.ones(2, 1, 4), "half", [4, 8])),
                        ("r1", (c.int(), c, "half", [4, 8]))]:
        with pytest.raises(Exception, match=match):
            CPU.inplace_partial_rotary_mul(x, *args)
    assert torch.equal(x, before)


# --------------------------------------------------------------------------------------------- no-compute


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("lse", [False, True])
def test_noop_shapes(device, lse):
    def t(shape, dtype):
        return torch.empty(shape, dtype=dtype, device=device)

    q = t((7, 8, 512), torch.bfloat16)
    kv = t((4, 128, 1, 512), torch.bfloat16)
    out, l = NOOP.npu_sparse_attn_sharedkv(
        q, ori_kv=kv, cmp_kv=kv, cmp_sparse_indices=t((7, 1, 512), torch.int32),
        ori_block_table=t((2, 4), torch.int32), cmp_block_table=t((2, 4), torch.int32),
        cu_seqlens_q=t((3,), torch.int32), seqused_kv=t((2,), torch.int32), sinks=t((8,), torch.float32),
        softmax_scale=512 ** -0.5, cmp_ratio=4, layout_q="TND", return_softmax_lse=lse)
    assert out.shape == (7, 8, 512) and out.dtype == torch.bfloat16 and out.device.type == device
    assert l.dtype == torch.float32 and l.device.type == device
    assert l.shape == ((7, 8) if lse else (0,))
    out, l = NOOP.npu_sparse_attn_sharedkv(t((2, 3, 8, 512), torch.float16), ori_kv=kv, softmax_scale=0.1,
                                           layout_q="BSND", return_softmax_lse=True)
    assert out.shape == (2, 3, 8, 512) and out.dtype == torch.float16 and l.shape == (2, 3, 8)
    md = NOOP.npu_sparse_attn_sharedkv_metadata(8, 1, 512, seqused_kv=t((2,), torch.int32), batch_size=2)
    assert md.shape == (1024,) and md.dtype == torch.int32 and md.device.type == device
    x = t((7, 8, 512), torch.bfloat16)
    assert NOOP.inplace_partial_rotary_mul(x, t((7, 1, 64), torch.float32), t((7, 1, 64), torch.float32),
                                           "interleave", [448, 512]) is None
    assert NOOP.npu_scatter_nd_update_v2(kv, t((5, 2), torch.int32), t((5, 1, 512), torch.bfloat16)) is None


# --------------------------------------------------------------------------------------------- A5 kv-quant rows


def _pack_a5_rows(x, g):
    """(M, 512) float -> (M, 640) float8_e4m3fn bytes: [448 fp8 nope | 64 bf16 rope | 7 e8m0 | 57 pad] (docs/design/dsa.md §1.4),
    each 64-group's scale 2^(e - 127) with e = ceil(log2(amax / 448)) + 127; the pad holds random bytes."""
    m = x.shape[0]
    nope, rope = x[:, :448].double(), x[:, 448:].to(torch.bfloat16)
    groups = nope.view(m, 7, 64)
    amax = groups.abs().amax(-1).clamp_min(1e-30)
    e = (torch.ceil(torch.log2(amax / 448.0)) + 127).clamp(0, 254)
    q = (groups / torch.exp2(e - 127)[..., None]).view(m, 448).float().to(torch.float8_e4m3fn)
    out = torch.randint(0, 256, (m, 640), dtype=torch.uint8, generator=g)
    out[:, :448] = q.view(torch.uint8)
    out[:, 448:576] = rope.contiguous().view(torch.uint8).view(m, 128)
    out[:, 576:583] = e.to(torch.uint8)
    return out.view(torch.float8_e4m3fn)


def _unpack_a5_rows(b):
    """The float64 values a 640-byte row stands for, decoded here independently of the twin."""
    u = b.view(torch.uint8)
    m = u.shape[0]
    nope = u[:, :448].contiguous().view(torch.float8_e4m3fn).double().view(m, 7, 64)
    e = u[:, 576:583].double()
    nope = (nope * torch.exp2(e - 127)[..., None]).view(m, 448)
    rope = u[:, 448:576].contiguous().view(torch.bfloat16).double()
    return torch.cat([nope, rope], 1)


def _quantise_case(case, g):
    """Replaces the case's float caches / rows with A5 rows and the values they decode to."""
    def conv(cache):
        nb, bs = cache.shape[:2]
        packed = _pack_a5_rows(cache.reshape(nb * bs, case.d).float() * 4, g)
        dec = _unpack_a5_rows(packed).float().view(nb, bs, 1, case.d)
        return packed.view(nb, bs, 1, 640), dec

    q8_ori, case.ori_kv = conv(case.ori_kv)
    q8_cmp = None
    if case.r is not None:
        q8_cmp, case.cmp_kv = conv(case.cmp_kv)
    # Rows per request as the reference reads them (from the decoded caches through the tables).
    bs = case.ori_kv.shape[1]
    case.ori_rows = [case.ori_kv[case.ori_bt[b, torch.arange(s) // bs].long(), torch.arange(s) % bs, 0]
                     for b, s in enumerate(case.kv_lens)]
    if case.r is not None:
        bsc = case.cmp_kv.shape[1]
        case.cmp_rows = [case.cmp_kv[case.cmp_bt[b, torch.arange(n) // bsc].long(), torch.arange(n) % bsc, 0]
                         for b, n in enumerate(x.shape[0] for x in case.cmp_rows)]
    return q8_ori, q8_cmp


def _kvq(case, q8_ori, q8_cmp, *, ns=CPU, cmp_idx=None, scale=512 ** -0.5, win_left=127, **over):
    kw = dict(ori_kv=q8_ori, ori_block_table=case.ori_bt, cu_seqlens_q=_i32(case.cu), seqused_kv=_i32(case.kv_lens),
              sinks=case.sinks, tile_size=64, rope_head_dim=64, softmax_scale=scale, cmp_ratio=1,
              ori_win_left=win_left, layout_q="TND", layout_kv="PA_ND", return_softmax_lse=True)
    if q8_cmp is not None:
        kw.update(cmp_kv=q8_cmp, cmp_block_table=case.cmp_bt, cmp_ratio=case.r)
        if cmp_idx is not None:
            kw["cmp_sparse_indices"] = cmp_idx
    kw.update(over)
    kv_quant_mode = kw.pop("kv_quant_mode", 1)
    return ns.npu_kv_quant_sparse_attn_sharedkv(case.q, kv_quant_mode, **kw)


def test_a5_row_codec_roundtrip_is_close():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(10, 512, generator=g) * torch.logspace(-3, 3, 10)[:, None]
    dec = _unpack_a5_rows(_pack_a5_rows(x, g))
    torch.testing.assert_close(dec[:, 448:], x[:, 448:].to(torch.bfloat16).double())
    # e4m3: half an ulp is 2^-4 relative for normals; subnormals (tiny values beside a large group maximum)
    # round to a step of 2^-9 times the group scale, which is below 2 amax / 448.
    xn = x[:, :448].double()
    amax = xn.view(10, 7, 64).abs().amax(-1).repeat_interleave(64, 1)
    assert ((dec[:, :448] - xn).abs() <= xn.abs() * 2 ** -4 + 2 ** -10 * 2 * amax / 448).all()
    assert (dec[:, :448] != xn).any()  # it is a lossy format: the bound above is what is being tested


@pytest.mark.parametrize("q_dtype", DTYPES)
def test_kv_quant_attention_over_a5_rows(q_dtype):
    case = Case([1, 3, 2], [140, 9, 300], n=4, d=512, bs=16, r=4, bs_cmp=8, dtype=q_dtype, seed=81)
    idx = _c4_indices(case, 24, case.g)
    q8_ori, q8_cmp = _quantise_case(case, case.g)
    got = _kvq(case, q8_ori, q8_cmp, cmp_idx=idx)
    ref = reference(case, win_left=127, cmp=True, cmp_idx=idx, sinks=case.sinks, scale=512 ** -0.5)
    check(case, got, ref, TOL[q_dtype] if q_dtype == torch.bfloat16 else 2e-5)
    # Equal to the plain operator over the decoded fp32 rows (same maths, only the row format differs).
    if q_dtype == torch.float32:
        plain = run(case, win_left=127, cmp=True, cmp_idx=idx, sinks=case.sinks, scale=512 ** -0.5)
        torch.testing.assert_close(got[0], plain[0], rtol=1e-6, atol=1e-6)
    # The same bytes as uint8 give the same answer.
    again = _kvq(case, q8_ori.view(torch.uint8), q8_cmp.view(torch.uint8), cmp_idx=idx)
    assert torch.equal(again[0], got[0])


def test_kv_quant_rejects_bad_input_by_name():
    case = Case([1], [5], n=2, d=512, bs=4, seed=91)
    q8, _ = _quantise_case(case, case.g)
    for match, over in [("kv_quant_mode", dict(kv_quant_mode=0)), ("tile_size", dict(tile_size=128)),
                        ("rope_head_dim", dict(rope_head_dim=0)), ("640", dict(ori_kv=q8[..., :512])),
                        ("1-byte", dict(ori_kv=torch.zeros(q8.shape, dtype=torch.bfloat16)))]:
        with pytest.raises(Exception, match=match):
            _kvq(case, q8, None, **over)
    with pytest.raises(Exception, match="512"):
        CPU.npu_kv_quant_sparse_attn_sharedkv(torch.zeros(1, 2, 576), 1, ori_kv=q8, ori_block_table=case.ori_bt,
                                              cu_seqlens_q=_i32(case.cu), seqused_kv=_i32(case.kv_lens),
                                              tile_size=64, rope_head_dim=64, softmax_scale=0.1, layout_q="TND")


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_kv_quant_noop_shapes_and_metadata(device):
    q = torch.empty(5, 8, 512, dtype=torch.bfloat16, device=device)
    rows = torch.empty(3, 128, 1, 640, dtype=torch.float8_e4m3fn, device=device)
    out, lse = NOOP.npu_kv_quant_sparse_attn_sharedkv(q, 1, ori_kv=rows, tile_size=64, rope_head_dim=64,
                                                      softmax_scale=0.1, layout_q="TND", return_softmax_lse=True)
    assert out.shape == (5, 8, 512) and out.dtype == torch.bfloat16 and lse.shape == (5, 8)
    assert out.device.type == device
    lens = torch.empty(2, dtype=torch.int32, device=device)
    md = NOOP.npu_kv_quant_sparse_attn_sharedkv_metadata(8, 1, 512, 1, seqused_kv=lens, batch_size=2, tile_size=64,
                                                         rope_head_dim=64, cmp_ratio=4)
    assert md.shape == (1024,) and md.dtype == torch.int32 and md.device.type == device
    if device == "cpu":
        kw = dict(cu_seqlens_q=_i32([0, 1, 3]), seqused_kv=_i32([4, 9]), batch_size=2, tile_size=64,
                  rope_head_dim=64, cmp_ratio=4, cmp_topk=512)
        a = CPU.npu_kv_quant_sparse_attn_sharedkv_metadata(8, 1, 512, 1, **kw)
        assert a.shape == (1024,) and torch.equal(a, CPU.npu_kv_quant_sparse_attn_sharedkv_metadata(8, 1, 512, 1, **kw))
        with pytest.raises(Exception, match="kv_quant_mode"):
            CPU.npu_kv_quant_sparse_attn_sharedkv_metadata(8, 1, 512, 0, **kw)
        with pytest.raises(Exception, match="cmp_ratio"):  # the schema's default -1
            CPU.npu_kv_quant_sparse_attn_sharedkv_metadata(8, 1, 512, 1, **{**kw, "cmp_ratio": -1})
