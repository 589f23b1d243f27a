"""vllm-ascend's DeepSeek-V4 quantised lightning indexer, ``_C_ascend::npu_vllm_quant_lightning_indexer`` and
its ``_metadata`` op, through the dispatcher: the CPU twins (``torch.ops.ascend_cpu_va``) against a float64
reference written here, and the no-compute kernels (``torch.ops.ascend_noop_va``) for shapes.

Reference (docs/design/sparse.md §4, docs/design/dsa.md §1.3, docs/design/ops.md §4.6, docs/design/sparse.md §1): query int8 / fp8 per (token, head) with
query_dequant_scale [T, H]; keys int8 / fp8 per compressed row in a paged cache [nb, bs, 1, D] with
key_dequant_scale [nb, bs, 1], read through block_table; actual_seq_lengths_query are cumulative ends,
actual_seq_lengths_key the RAW lengths S_b, so request b has floor(S_b / r) compressed rows and row i sees
c < floor((S_b - q_b + i + 1) / r). score(t, c) = sum_h w[t,h] * relu(dequant(q[t,h]) . dequant(k[c])).
Indices: compressed-row ids by descending score, ties lower id first, then -1."""

import math

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)

CPU = torch.ops.ascend_cpu_va
NOOP = torch.ops.ascend_noop_va
FP8 = torch.float8_e4m3fn
NO_LIMIT = 2**63 - 1


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


# ----------------------------------------------------------------------------- inputs


def _quant_values(shape, qdtype, gen):
    if qdtype == torch.int8:
        return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int32).to(torch.int8)
    return (torch.randn(shape, generator=gen) * 40).clamp(-448, 448).to(FP8)


def make_case(q_lens, kv_lens, cmp_ratio, qdtype, *, heads=4, d=16, bs=4, spare_blocks=3, seed=0):
    """A TND batch over a paged cache of compressed rows; unused cache rows hold garbage too."""
    gen = torch.Generator().manual_seed(seed)
    sdtype = torch.float16 if qdtype == torch.int8 else torch.float32  # A2/A3 fp16 scales, A5 fp32
    t = sum(q_lens)
    rows = [s // cmp_ratio for s in kv_lens]
    nblk = [max(1, math.ceil(r / bs)) for r in rows]
    num_blocks = sum(nblk) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    cols = max(nblk) + 1
    table = torch.full((len(q_lens), cols), -7, dtype=torch.int32)  # unused columns: garbage
    at = 0
    for b, n in enumerate(nblk):
        table[b, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
        at += n
    key = _quant_values((num_blocks, bs, 1, d), qdtype, gen)
    key_scale = (torch.rand((num_blocks, bs, 1), generator=gen) * 0.02 + 0.001).to(sdtype)
    query = _quant_values((t, heads, d), qdtype, gen)
    query_scale = (torch.rand((t, heads), generator=gen) * 0.02 + 0.001).to(sdtype)
    weights = (torch.randn((t, heads), generator=gen)).to(sdtype)  # mixed signs
    ends = torch.tensor([sum(q_lens[:i + 1]) for i in range(len(q_lens))], dtype=torch.int32)
    return dict(query=query, key=key, weights=weights, query_dequant_scale=query_scale,
                key_dequant_scale=key_scale, actual_seq_lengths_query=ends,
                actual_seq_lengths_key=torch.tensor(kv_lens, dtype=torch.int32), block_table=table,
                cmp_ratio=cmp_ratio)


def call(c, sparse_count, *, sparse_mode=3, return_value=False, metadata=None, ns=CPU, **over):
    a = dict(c)
    a.update(over)
    return ns.npu_vllm_quant_lightning_indexer(
        a["query"], a["key"], a["weights"], a["query_dequant_scale"], a["key_dequant_scale"],
        query_quant_mode=a.get("query_quant_mode", 0), key_quant_mode=a.get("key_quant_mode", 0),
        actual_seq_lengths_query=a["actual_seq_lengths_query"], actual_seq_lengths_key=a["actual_seq_lengths_key"],
        block_table=a["block_table"], metadata=metadata, layout_query=a.get("layout_query", "TND"),
        layout_key=a.get("layout_key", "PA_BSND"), sparse_count=sparse_count, sparse_mode=sparse_mode,
        pre_tokens=a.get("pre_tokens", NO_LIMIT), next_tokens=a.get("next_tokens", NO_LIMIT),
        cmp_ratio=a["cmp_ratio"], return_value=return_value)


# ----------------------------------------------------------------------------- float64 reference


def reference_scores(c, sparse_mode=3):
    """Per query token: (float64 scores over the request's compressed rows, number visible)."""
    q = c["query"].to(torch.float64) * c["query_dequant_scale"].to(torch.float64)[..., None]  # (T, H, D)
    w = c["weights"].to(torch.float64)
    key, ks, table, bs = c["key"], c["key_dequant_scale"], c["block_table"], c["key"].shape[1]
    ends = c["actual_seq_lengths_query"].tolist()
    raw = c["actual_seq_lengths_key"].tolist()
    r = c["cmp_ratio"]
    out = []
    start = 0
    for b, end in enumerate(ends):
        n_rows = raw[b] // r
        krows = []
        for cidx in range(n_rows):
            blk, off = int(table[b, cidx // bs]), cidx % bs
            krows.append(key[blk, off, 0].to(torch.float64) * float(ks[blk, off, 0]))
        kd = torch.stack(krows) if krows else torch.zeros((0, q.shape[-1]), dtype=torch.float64)
        qb = end - start
        for i in range(qb):
            t = start + i
            dots = q[t] @ kd.T  # (H, n_rows)
            score = (w[t][:, None] * dots.clamp_min(0)).sum(0)
            if sparse_mode == 3:
                lim = raw[b] - qb + i + 1
                vis = 0 if lim <= 0 else min(lim // r, n_rows)
            else:
                vis = n_rows
            out.append((score, vis))
        start = end
    return out


def reference_topk(scores, vis, k):
    order = sorted(range(vis), key=lambda c: (-float(scores[c]), c))[:k]
    return order + [-1] * (k - len(order))


def check_against_reference(c, k, sparse_mode=3):
    idx, val = call(c, k, sparse_mode=sparse_mode, return_value=True)
    t = c["query"].shape[0]
    assert idx.dtype == torch.int32 and idx.shape == (t, 1, k)
    assert val.dtype == torch.float32 and val.shape == (t, 1, k)
    ref = reference_scores(c, sparse_mode)
    exact = 0
    for tok, (scores, vis) in enumerate(ref):
        want = reference_topk(scores, vis, k)
        got = idx[tok, 0].tolist()
        n = min(k, vis)
        assert got[n:] == [-1] * (k - n), (tok, got, want)
        assert torch.isneginf(val[tok, 0, n:]).all()
        assert len(set(got[:n])) == n and all(0 <= g < vis for g in got[:n]), (tok, got, vis)
        # Same ranking; a swap is tolerated only between rows whose float64 scores are equal to fp32 noise.
        tol = 1e-5 * (float(scores[:vis].abs().max()) if vis else 0.0) + 1e-9
        for j in range(n):
            if got[j] != want[j]:
                assert abs(float(scores[got[j]]) - float(scores[want[j]])) <= tol, (tok, j, got, want)
            else:
                exact += 1
        # Values: the selected scores.
        if n:
            sel = torch.tensor([float(scores[g]) for g in got[:n]], dtype=torch.float64)
            torch.testing.assert_close(val[tok, 0, :n].to(torch.float64), sel, rtol=1e-5, atol=tol)
    return idx, exact


# ----------------------------------------------------------------------------- numeric cases

QDTYPES = [torch.int8, FP8]


@pytest.mark.parametrize("qdtype", QDTYPES, ids=["int8", "fp8"])
@pytest.mark.parametrize("cmp_ratio", [1, 4])
@pytest.mark.parametrize("shape", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("k", [3, 64])
def test_matches_float64_reference(qdtype, cmp_ratio, shape, k):
    if shape == "decode":
        q_lens, kv_lens = [1, 1, 1], [37, 9, 22]
    elif shape == "prefill":
        q_lens, kv_lens = [21, 6], [21, 6]
    else:
        q_lens, kv_lens = [1, 9, 1, 5], [30, 41, 3, 5]
    c = make_case(q_lens, kv_lens, cmp_ratio, qdtype, seed=len(shape) * 100 + cmp_ratio * 10 + k)
    idx, exact = check_against_reference(c, k)
    assert exact > 0
    # sparse_count larger than every visible count (k=64) pads each row; k=3 is smaller than most.
    ref = reference_scores(c)
    if k == 64:
        assert all(int((idx[t, 0] >= 0).sum()) == vis for t, (_, vis) in enumerate(ref))
    else:
        assert any(vis > k for _, vis in ref)


@pytest.mark.parametrize("qdtype", QDTYPES, ids=["int8", "fp8"])
def test_sparse_mode_0_sees_every_compressed_row(qdtype):
    c = make_case([3, 2], [17, 8], 4, qdtype, seed=5)
    idx, _ = check_against_reference(c, 8, sparse_mode=0)
    assert (idx[:3, 0] >= 0).sum(1).tolist() == [4, 4, 4]  # floor(17 / 4) for every row
    assert (idx[3:, 0] >= 0).sum(1).tolist() == [2, 2]


def test_visibility_is_floor_of_raw_lengths_over_cmp_ratio():
    """Prefill of 10 tokens, r=4: row i sees floor((i + 1) / 4) compressed rows (0,0,0,1,1,1,1,2,2,2)."""
    c = make_case([10], [10], 4, torch.int8, seed=3)
    idx, _ = call(c, 4)
    assert (idx[:, 0] >= 0).sum(1).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert idx[0, 0].tolist() == [-1] * 4
    # Chunked prefill: 3 new tokens over a raw length of 13: rows see floor((11 + i) / 4) = 2, 3, 3.
    c = make_case([3], [13], 4, torch.int8, seed=4)
    idx, _ = call(c, 4)
    assert (idx[:, 0] >= 0).sum(1).tolist() == [2, 3, 3]


@pytest.mark.parametrize("qdtype", QDTYPES, ids=["int8", "fp8"])
def test_ties_go_to_the_lower_compressed_row(qdtype):
    c = make_case([2, 1], [24, 16], 4, qdtype, seed=7)
    # Every cache row identical (same codes, same scale): all scores of a token tie.
    c["key"] = c["key"][:1, :1].expand_as(c["key"]).contiguous()
    c["key_dequant_scale"] = torch.full_like(c["key_dequant_scale"], 0.01)
    c["weights"] = c["weights"].abs()
    idx, _ = call(c, 8)
    assert idx[0, 0].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]  # floor(23 / 4) = 5
    assert idx[1, 0].tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    assert idx[2, 0].tolist() == [0, 1, 2, 3, -1, -1, -1, -1]


def test_return_value_false_gives_an_empty_values_tensor():
    c = make_case([2], [8], 4, torch.int8, seed=9)
    idx, val = call(c, 4)
    assert val.dtype == torch.float32 and val.numel() == 0
    idx2, _ = call(c, 4, return_value=True)
    assert torch.equal(idx, idx2)


def test_cmp_ratio_1_equals_the_existing_quant_indexer():
    c = make_case([1, 6], [20, 6], 1, torch.int8, seed=11)
    idx, _ = call(c, 5)
    old = CPU.npu_lightning_indexer_quant(
        c["query"], c["key"], c["weights"], c["query_dequant_scale"], c["key_dequant_scale"],
        actual_seq_lengths_query=c["actual_seq_lengths_query"], actual_seq_lengths_key=c["actual_seq_lengths_key"],
        block_table=c["block_table"], layout_query="TND", layout_key="PA_BSND", sparse_count=5, sparse_mode=3)
    assert torch.equal(idx, old)


def test_block_table_needs_to_cover_only_the_compressed_rows():
    c = make_case([1], [32], 4, torch.int8, bs=4, seed=12)  # 8 compressed rows = 2 blocks; raw would need 8
    c["block_table"] = c["block_table"][:, :2].contiguous()
    check_against_reference(c, 8)


# ----------------------------------------------------------------------------- metadata


def _metadata(ns=CPU, **over):
    a = dict(num_heads_q=64, num_heads_k=1, head_dim=128, query_quant_mode=0, key_quant_mode=0,
             actual_seq_lengths_query=torch.tensor([1, 5], dtype=torch.int32),
             actual_seq_lengths_key=torch.tensor([40, 9], dtype=torch.int32), batch_size=2, max_seqlen_q=4,
             max_seqlen_k=40, layout_query="TND", layout_key="PA_BSND", sparse_count=512, sparse_mode=3,
             pre_tokens=NO_LIMIT, next_tokens=NO_LIMIT, cmp_ratio=4, device="npu")
    a.update(over)
    return ns.npu_vllm_quant_lightning_indexer_metadata(**a)


def test_metadata_is_a_deterministic_1024_int32_blob_the_indexer_accepts():
    m = _metadata()
    assert m.dtype == torch.int32 and m.shape == (1024,)
    assert torch.equal(m, _metadata())
    assert not torch.equal(m, _metadata(sparse_count=2048))  # it depends on its arguments
    assert not torch.equal(m, _metadata(actual_seq_lengths_key=torch.tensor([41, 9], dtype=torch.int32)))
    # No tensor at all (both length tensors optional): still answers.
    m0 = _metadata(actual_seq_lengths_query=None, actual_seq_lengths_key=None)
    assert m0.shape == (1024,) and m0.dtype == torch.int32
    c = make_case([1, 4], [40, 9], 4, torch.int8, seed=13)
    with_md, _ = call(c, 6, metadata=m)
    without, _ = call(c, 6)
    assert torch.equal(with_md, without)  # opaque on CPU: it changes nothing


@pytest.mark.parametrize("over, match", [
    (dict(query_quant_mode=1), "query_quant_mode"),
    (dict(key_quant_mode=2), "key_quant_mode"),
    (dict(cmp_ratio=0), "cmp_ratio"),
    (dict(sparse_count=0), "sparse_count"),
    (dict(sparse_mode=1), "sparse_mode"),
    (dict(layout_key="BSND"), "layout_key"),
    (dict(batch_size=3), "batch_size"),
    (dict(actual_seq_lengths_key=torch.tensor([40, -1], dtype=torch.int32)), "actual_seq_lengths_key"),
    (dict(actual_seq_lengths_query=torch.tensor([5, 1], dtype=torch.int32)), "actual_seq_lengths_query"),
    (dict(num_heads_k=2), "num_heads_k"),
])
def test_metadata_bad_input_is_named(over, match):
    with pytest.raises((ValueError, NotImplementedError, RuntimeError), match=match):
        _metadata(**over)


# ----------------------------------------------------------------------------- no-compute kernels


@pytest.mark.parametrize("return_value", [False, True])
def test_noop_shapes(return_value):
    c = make_case([1, 4], [40, 9], 4, torch.int8, seed=14)
    idx, val = call(c, 7, ns=NOOP, return_value=return_value)
    assert idx.shape == (5, 1, 7) and idx.dtype == torch.int32
    if return_value:
        assert val.shape == (5, 1, 7) and val.dtype == torch.float32
    else:
        assert val.numel() == 0 and val.dtype == torch.float32
    m = _metadata(ns=NOOP)
    assert m.shape == (1024,) and m.dtype == torch.int32
    m0 = _metadata(ns=NOOP, actual_seq_lengths_query=None, actual_seq_lengths_key=None)
    assert m0.shape == (1024,) and m0.dtype == torch.int32


# ----------------------------------------------------------------------------- bad input


def _bad_cases():
    def scale_dtype(c):
        c["query_dequant_scale"] = c["query_dequant_scale"].to(torch.int32)
    def short_table(c):
        c["block_table"] = c["block_table"][:, :1].contiguous()  # request 0: 10 compressed rows need 3 blocks
    def neg_len(c):
        c["actual_seq_lengths_key"] = torch.tensor([40, -2], dtype=torch.int32)
    def key_dtype(c):
        c["key"] = c["key"].to(torch.float16)
    def kscale_shape(c):
        c["key_dequant_scale"] = c["key_dequant_scale"][:, :2].contiguous()
    def weights_shape(c):
        c["weights"] = c["weights"][:, :2].contiguous()
    def lens_dtype(c):
        c["actual_seq_lengths_query"] = c["actual_seq_lengths_query"].to(torch.int64)
    def bad_block(c):
        c["block_table"] = c["block_table"].clone()
        c["block_table"][1, 0] = 999
    return [
        (scale_dtype, {}, "query_dequant_scale"),
        (short_table, {}, "block table capacity"),
        (neg_len, {}, "actual_seq_lengths_key"),
        (key_dtype, {}, "query and key must share"),
        (kscale_shape, {}, "key_dequant_scale"),
        (weights_shape, {}, "weights"),
        (lens_dtype, {}, "actual_seq_lengths_query"),
        (bad_block, {}, "block_table"),
        (None, dict(cmp_ratio=0), "cmp_ratio"),
        (None, dict(query_quant_mode=1), "query_quant_mode"),
        (None, dict(key_quant_mode=1), "key_quant_mode"),
        (None, dict(pre_tokens=100), "pre_tokens"),
        (None, dict(layout_query="BSND"), "layout_query"),
        (None, dict(metadata=torch.zeros(1023, dtype=torch.int32)), "metadata"),
        (None, dict(metadata=torch.zeros(1024, dtype=torch.int64)), "metadata"),
    ]


@pytest.mark.parametrize("mutate, over, match", _bad_cases(), ids=[m for _, _, m in _bad_cases()])
def test_bad_input_is_named(mutate, over, match):
    c = make_case([1, 4], [40, 9], 4, torch.int8, seed=15)
    if mutate is not None:
        mutate(c)
    md = over.pop("metadata", None)
    with pytest.raises((ValueError, NotImplementedError, RuntimeError), match=match):
        call(c, 6, metadata=md, **over)
