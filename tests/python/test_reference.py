"""Self-checks of the test reference (no runtime needed): the explicit-mask
float64 reference agrees with torch's scaled_dot_product_attention and with
independent formulations of sliding windows and sinks, and the paged-cache
helpers round-trip."""

import math

import pytest
import torch
import torch.nn.functional as F

from _reference import (
    allowed_mask,
    make_batch,
    read_dense_from_cache,
    reference_attention,
    reference_attention_one,
)


def _sdpa(q, k, v, mask, scale):
    # q (Sq,N,D), k/v (Skv,Nkv,D) -> (Sq,N,D), GQA by repeat_interleave.
    g = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], kk.transpose(0, 1)[None], vv.transpose(0, 1)[None], attn_mask=mask, scale=scale
    )
    return out[0].transpose(0, 1)


def test_mask_semantics():
    m = allowed_mask(2, 5)
    assert m.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    m = allowed_mask(3, 6, window=2)
    # positions 3,4,5 ; window 2 -> {2,3}, {3,4}, {4,5}
    assert m.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]
    assert allowed_mask(2, 3, causal=False).all()


@pytest.mark.parametrize("sq,skv", [(5, 5), (1, 9), (4, 11), (7, 7)])
@pytest.mark.parametrize("n,nkv", [(4, 4), (8, 2), (8, 1)])
def test_reference_vs_sdpa_causal(sq, skv, n, nkv):
    g = torch.Generator().manual_seed(sq * 100 + skv)
    d = 16
    q = torch.randn(sq, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(skv, nkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(skv, nkv, d, generator=g, dtype=torch.float64)
    scale = 1 / math.sqrt(d)
    ref = reference_attention_one(q, k, v, scale=scale)
    if sq == skv:
        g_ = n // nkv
        exp = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.repeat_interleave(g_, 1).transpose(0, 1)[None],
            v.repeat_interleave(g_, 1).transpose(0, 1)[None],
            is_causal=True,
            scale=scale,
        )[0].transpose(0, 1)
    else:
        mask = torch.ones(skv, skv, dtype=torch.bool).tril()[skv - sq :]
        exp = _sdpa(q, k, v, mask, scale)
    torch.testing.assert_close(ref, exp, atol=1e-12, rtol=1e-10)
    # non-causal
    torch.testing.assert_close(
        reference_attention_one(q, k, v, scale=scale, causal=False), _sdpa(q, k, v, None, scale), atol=1e-12, rtol=1e-10
    )


def test_reference_window_vs_loop():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 2, 8, generator=g, dtype=torch.float64)
    k = torch.randn(10, 1, 8, generator=g, dtype=torch.float64)
    v = torch.randn(10, 1, 8, generator=g, dtype=torch.float64)
    w = 4
    ref = reference_attention_one(q, k, v, scale=0.3, window=w)
    for i in range(3):
        p = 10 - 3 + i
        keys = list(range(p - w + 1, p + 1))
        for h in range(2):
            s = torch.stack([0.3 * (q[i, h] @ k[j, 0]) for j in keys])
            pr = torch.softmax(s, 0)
            exp = sum(pr[t] * v[j, 0] for t, j in enumerate(keys))
            torch.testing.assert_close(ref[i, h], exp, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("window", [None, 3])
def test_reference_sinks_as_virtual_key(window):
    # A sink is a virtual key with logit sigma_h and a zero value.
    g = torch.Generator().manual_seed(5)
    sq, skv, n, nkv, d = 4, 9, 4, 2, 8
    q = torch.randn(sq, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(skv, nkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(skv, nkv, d, generator=g, dtype=torch.float64)
    sinks = torch.tensor([0.5, -1.0, 3.0, 10.0])
    ref = reference_attention_one(q, k, v, scale=0.25, window=window, sinks=sinks)
    mask = allowed_mask(sq, skv, window=window)
    for h in range(n):
        s = (q[:, h] @ k[:, h // 2].T) * 0.25
        s = s.masked_fill(~mask, float("-inf"))
        s_ext = torch.cat([s, torch.full((sq, 1), float(sinks[h]), dtype=torch.float64)], 1)
        p = torch.softmax(s_ext, 1)
        v_ext = torch.cat([v[:, h // 2], torch.zeros(1, d, dtype=torch.float64)], 0)
        torch.testing.assert_close(ref[:, h], p @ v_ext, atol=1e-12, rtol=1e-10)


def test_make_batch_cache_layout():
    g = torch.Generator().manual_seed(11)
    b = make_batch([20, 5, 33], [3, 5, 1], num_heads=4, num_kv_heads=2, head_size=8, dtype=torch.float32,
                   block_size=16, gen=g, write_new_tokens=True)
    assert b.query_start_loc.tolist() == [0, 3, 8, 9]
    used = b.block_table[b.block_table != 0].tolist()
    assert len(used) == len(set(used)) == 2 + 1 + 3
    for r, s in enumerate(b.seq_lens):
        assert torch.equal(read_dense_from_cache(b.key_cache, b.block_table[r], s), b.k_full[r])
        assert torch.equal(read_dense_from_cache(b.value_cache, b.block_table[r], s), b.v_full[r])
    # new-token slots hold the new keys
    flat = b.key_cache.reshape(-1, 2, 8)
    for t, s in enumerate(b.new_slots):
        assert torch.equal(flat[s], b.k[t])
    ref = b.reference()
    ref2 = reference_attention(b.q[:9], b.k_full, b.v_full, [3, 5, 1], scale=1 / math.sqrt(8))
    assert torch.equal(ref, ref2)
