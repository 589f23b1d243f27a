"""SparseFlashMla (CANN cann_ops_transformer::sparse_flash_mla + _metadata, docs/design/dsa.md §4.2, the A5 + bf16 DSA
attention): the CPU twins (``torch.ops.ascend_cpu_cot``) against a float64 brute-force shared-KV sparse attention
over bf16 PA_BBND pages written here (docs/design/dsa.md §1.4), against the npu_sparse_attn_sharedkv twin on the same inputs, the
adapter's derived lengths (S // r, S % r, max // r) against brute-force values, the interface checks, and the
in-place npu_scatter_nd_update_ KV writes with (block, offset) index pairs on a PA_BBND cache."""

import math

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)

COT = torch.ops.ascend_cpu_cot
VA = torch.ops.ascend_cpu_va
NOOP = torch.ops.ascend_noop_cot
D = 64
BS = 4  # block size


def i32(v):
    return torch.tensor(v, dtype=torch.int32)


def _pages(lengths, block_size, g):
    """Scatter per-request rows (S_b, D) into shuffled pages: cache (nb, bs, 1, D) bf16 + block table."""
    rows = [torch.randn(s, D, generator=g).to(torch.bfloat16) for s in lengths]
    need = [max(1, -(-s // block_size)) for s in lengths]
    nb = sum(need) + 1
    perm = torch.randperm(nb, generator=g).tolist()
    cache = torch.randn(nb, block_size, 1, D, generator=g).to(torch.bfloat16)  # garbage outside the rows
    cols = max(need)
    table = torch.full((len(lengths), cols), 0, dtype=torch.int32)
    k = 0
    for b, s in enumerate(lengths):
        for c in range(need[b]):
            table[b, c] = perm[k]
            k += 1
        for t in range(s):
            cache[table[b, t // block_size], t % block_size, 0] = rows[b][t]
    return cache, table, rows


def _reference(q, q_lens, kv_lens, ori_rows, win_left, ratio=1, cmp_rows=None, topk=None, sinks=None, scale=1.0):
    """float64 brute force of docs/design/dsa.md §1.4: window keys of the raw rows, causal compressed rows (all, or the top-k
    entries below the visible limit), a per-head sink in the denominator."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    t = 0
    for b, (ql, s) in enumerate(zip(q_lens, kv_lens)):
        for i in range(ql):
            p = s - ql + i
            keys = [ori_rows[b][j].double() for j in range(max(0, p - win_left), p + 1)]
            if cmp_rows is not None:
                limit = (p + 1) // ratio
                ids = range(limit) if topk is None else [e for e in topk[t].tolist() if 0 <= e < limit]
                keys += [cmp_rows[b][c].double() for c in ids]
            for h in range(q.shape[1]):
                qh = q[t, h].double()
                logits = torch.stack([scale * (qh @ k) for k in keys]) if keys else torch.zeros(0, dtype=torch.float64)
                terms = list(logits.tolist()) + ([float(sinks[h])] if sinks is not None else [])
                if not terms:
                    continue
                m = max(terms)
                den = sum(math.exp(x - m) for x in terms)
                if keys:
                    w = torch.exp(logits - m) / den
                    out[t, h] = sum(w[j] * keys[j] for j in range(len(keys)))
            t += 1
    return out


def _case(ratio, g, topk_k=3):
    q_lens, kv_lens = [2, 1, 3], [9, 6, 13]
    n = 4
    T = sum(q_lens)
    q = torch.randn(T, n, D, generator=g).to(torch.bfloat16)
    ori, ori_table, ori_rows = _pages(kv_lens, BS, g)
    kw = dict(ori_kv=ori, ori_block_table=ori_table, cu_seqlens_q=i32([0, 2, 3, 6]), seqused_ori_kv=i32(kv_lens),
              sinks=torch.randn(n, generator=g), softmax_scale=D ** -0.5, ori_mask_mode=4, ori_win_left=3,
              ori_win_right=0, layout_q="TND", layout_kv="PA_BBND")
    ref = dict(win_left=3, sinks=kw["sinks"], scale=D ** -0.5)
    if ratio > 1:
        cmp_lens = [s // ratio for s in kv_lens]
        cmp, cmp_table, cmp_rows = _pages(cmp_lens, 2, g)
        kw.update(cmp_kv=cmp, cmp_block_table=cmp_table, seqused_cmp_kv=i32(cmp_lens),
                  cmp_residual_kv=i32([s % ratio for s in kv_lens]), cmp_ratio=ratio, cmp_mask_mode=3)
        ref.update(ratio=ratio, cmp_rows=cmp_rows)
        if topk_k:
            sel = torch.randint(-1, max(cmp_lens) + 1, (T, 1, topk_k), generator=g, dtype=torch.int32)
            kw["cmp_sparse_indices"] = sel
            ref["topk"] = sel[:, 0, :]
    else:
        kw.update(cmp_ratio=1, cmp_mask_mode=0)
    return q, q_lens, kv_lens, ori_rows, kw, ref


@pytest.mark.parametrize("ratio,topk", [(1, 0), (4, 3), (4, 0), (2, 0)])
def test_twin_matches_float64_reference_over_pa_bbnd_pages(ratio, topk):
    g = torch.Generator().manual_seed(7 + ratio + topk)
    q, q_lens, kv_lens, ori_rows, kw, ref = _case(ratio, g, topk)
    out, lse = COT.sparse_flash_mla(q, **kw)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert lse.dim() == 0 and lse.dtype == torch.float32  # the documented placeholder
    want = _reference(q, q_lens, kv_lens, ori_rows, **ref)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_twin_equals_the_sharedkv_twin_and_lse_layout():
    g = torch.Generator().manual_seed(3)
    q, _, _, _, kw, _ = _case(4, g, 3)
    out, lse = COT.sparse_flash_mla(q, **kw, return_softmax_lse=True)
    sas = dict(kw)
    sas["seqused_kv"] = sas.pop("seqused_ori_kv")
    del sas["seqused_cmp_kv"], sas["cmp_residual_kv"]
    sas["layout_kv"] = "PA_ND"
    o2, l2 = VA.npu_sparse_attn_sharedkv(q, **sas, return_softmax_lse=True)
    assert torch.equal(out, o2)
    assert lse.shape == (1, q.shape[0], q.shape[1])  # (N2, T, N1), the published Meta shape
    assert torch.equal(lse[0], l2)


def test_interface_checks_name_the_argument():
    g = torch.Generator().manual_seed(5)
    q, _, _, _, kw, _ = _case(4, g, 0)
    bad = dict(kw, cmp_residual_kv=i32([1, 2, 0]))  # 9 % 4 = 1, 6 % 4 = 2, 13 % 4 = 1: entry 2 is wrong
    with pytest.raises(ValueError, match=r"seqused_cmp_kv\[2\]"):
        COT.sparse_flash_mla(q, **bad)
    with pytest.raises(ValueError, match="cmp_residual_kv is required"):
        COT.sparse_flash_mla(q, **{k: v for k, v in kw.items() if k != "cmp_residual_kv"})
    with pytest.raises(ValueError, match=r"cmp_residual_kv\[0\]=4"):
        COT.sparse_flash_mla(q, **dict(kw, cmp_residual_kv=i32([4, 2, 1]), seqused_cmp_kv=i32([1, 1, 3])))
    with pytest.raises(ValueError, match="seqused_ori_kv is required"):
        COT.sparse_flash_mla(q, **{k: v for k, v in kw.items() if k != "seqused_ori_kv"})
    with pytest.raises((RuntimeError, NotImplementedError), match="layout_kv=\"BSND\""):
        COT.sparse_flash_mla(q, **dict(kw, layout_kv="BSND"))
    with pytest.raises((RuntimeError, NotImplementedError), match="cmp_topk_length"):
        COT.sparse_flash_mla(q, **dict(kw, cmp_topk_length=i32([1, 1, 1])))
    with pytest.raises((RuntimeError, NotImplementedError), match="topk_value_mode"):
        COT.sparse_flash_mla(q, **dict(kw, topk_value_mode=2))
    q1, _, _, _, kw1, _ = _case(1, g, 0)
    with pytest.raises(ValueError, match="cmp_ratio"):
        COT.sparse_flash_mla(q1, **dict(kw1, cmp_ratio=0))  # 0 is documented illegal; SWA passes 1


def test_metadata_twin_fields_and_checks():
    S = [9, 6, 13]
    kw = dict(cu_seqlens_q=i32([0, 2, 3, 6]), seqused_ori_kv=i32(S), seqused_cmp_kv=i32([s // 4 for s in S]),
              cmp_residual_kv=i32([s % 4 for s in S]), batch_size=3, max_seqlen_q=3, max_seqlen_ori_kv=13,
              max_seqlen_cmp_kv=3, cmp_topk=512, cmp_ratio=4, ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=127,
              ori_win_right=0, layout_q="TND", layout_kv="PA_BBND", has_ori_kv=True, has_cmp_kv=True)
    blob = COT.sparse_flash_mla_metadata(8, 1, 512, **kw)
    assert blob.shape == (1024,) and blob.dtype == torch.int32
    assert blob[:21].tolist() == [0x534D4C41, 1, 8, 1, 512, 3, 3, 13, 3, 0, 512, 4, 4, 3, 127, 0, 0, 1, 1, 28, 6]
    assert not blob[21:].any()
    assert NOOP.sparse_flash_mla_metadata(8, 1, 512, **kw).shape == (1024,)
    with pytest.raises(ValueError, match="max_seqlen_cmp_kv=4"):
        COT.sparse_flash_mla_metadata(8, 1, 512, **dict(kw, max_seqlen_cmp_kv=4))
    with pytest.raises((RuntimeError, NotImplementedError), match="layout_kv=\"PA_ND\""):
        COT.sparse_flash_mla_metadata(8, 1, 512, **dict(kw, layout_kv="PA_ND"))
    # Unset scalars take the NPU wrapper's defaults (mask mode 0), which the twin refuses by name.
    with pytest.raises((RuntimeError, NotImplementedError), match="ori_mask_mode=0"):
        COT.sparse_flash_mla_metadata(8, 1, 512, seqused_ori_kv=i32(S), batch_size=3, max_seqlen_ori_kv=13,
                                      cmp_ratio=1, has_cmp_kv=False, layout_kv="PA_BBND")


@pytest.mark.parametrize("ratio", [2, 4, 128])
def test_adapter_lengths_match_brute_force(ratio):
    S = [0, 1, ratio - 1, ratio, ratio + 1, 3 * ratio + 2, 1000]
    cmp, res, mx = ascend_attn_rt.dsa.flash_mla_cmp_lengths(S, max(S), ratio)
    assert cmp == [sum(1 for _ in range(0, s - ratio + 1, ratio)) for s in S]  # full compressed rows
    assert res == [s - ratio * c for s, c in zip(S, cmp)]
    assert mx == max(S) // ratio
    with pytest.raises(ValueError, match="cmp_ratio"):
        ascend_attn_rt.dsa.flash_mla_cmp_lengths(S, max(S), 1)


def test_inplace_scatter_writes_pa_bbnd_rows_and_skips_negative_blocks():
    """The A5 + BF16 KV write (docs/design/dsa.md §4.2): in-place npu_scatter_nd_update_(cache, idx [T, 2], rows) on a
    (nb, bs, 1, D) cache; a scheduler slot s maps to (s // bs, s % bs), an invalid slot to block -1, which writes
    nothing (the explicit skip)."""
    g = torch.Generator().manual_seed(11)
    cache = torch.randn(5, BS, 1, D, generator=g).to(torch.bfloat16)
    before = cache.clone()
    slots = [7, -1, 0, 19, -1]
    pairs = torch.tensor([[s // BS, s % BS] if s >= 0 else [-1, -1] for s in slots], dtype=torch.int32)
    rows = torch.randn(len(slots), 1, D, generator=g).to(torch.bfloat16)
    torch.ops.ascend_cpu.npu_scatter_nd_update_(cache, pairs, rows)
    want = before.clone()
    for t, s in enumerate(slots):
        if s >= 0:
            want[s // BS, s % BS] = rows[t]
    assert torch.equal(cache, want)
