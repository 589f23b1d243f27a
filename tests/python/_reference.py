"""Independent reference for the attention runtime tests.

Nothing here calls the runtime. The reference builds an explicit boolean mask
per request from the semantics (not from any kernel convention) and runs a
float64 softmax:

* query i of a request with q new tokens and s total KV tokens sits at the
  absolute position p = s - q + i;
* causal: key j allowed iff j <= p;
* sliding window W (vLLM semantics, W keys): p - W < j <= p;
* non-causal (encoder): every j < s;
* sinks: a per-head logit sigma_h joins the softmax denominator only:
  out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sigma_h - m)),
  m = max(max_j s_j, sigma_h);
* GQA: query head h reads KV head h // (N / Nkv).

The paged-cache helpers write through plain Python indexing, so the layout
(num_blocks, block_size, Nkv, D) and the slot formula
slot = block_table[r, pos // bs] * bs + pos % bs are stated here independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

SENTINEL = 7.0


def tolerance(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return dict(atol=2e-5, rtol=1e-5)
    return dict(atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- masks


def allowed_mask(q_len: int, kv_len: int, *, causal: bool = True, window: Optional[int] = None) -> torch.Tensor:
    """Boolean (q_len, kv_len): True where query i may attend key j."""
    assert kv_len >= q_len >= 0
    i = torch.arange(q_len)[:, None]
    j = torch.arange(kv_len)[None, :]
    p = kv_len - q_len + i  # absolute position of query i
    if not causal:
        return torch.ones(q_len, kv_len, dtype=torch.bool)
    mask = j <= p
    if window is not None:
        mask = mask & (j > p - window)
    return mask


# ----------------------------------------------------------------------------- attention


def reference_attention_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool = True,
    window: Optional[int] = None,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One request. q (Sq, N, D); k, v (Skv, Nkv, D) = the request's whole KV
    history (context + new tokens). Returns float64 (Sq, N, D)."""
    sq, n, d = q.shape
    skv, nkv, _ = k.shape
    assert n % nkv == 0
    g = n // nkv
    qd = q.double()
    kd = k.double()
    vd = v.double()
    mask = allowed_mask(sq, skv, causal=causal, window=window)  # (Sq, Skv)
    heads = torch.arange(n) // g  # query head h reads kv head h // G
    kh = kd[:, heads, :]  # (Skv, N, D)
    vh = vd[:, heads, :]
    s = torch.einsum("qhd,khd->hqk", qd, kh) * scale  # (N, Sq, Skv)
    s = s.masked_fill(~mask[None], float("-inf"))
    m = s.max(dim=2).values  # (N, Sq)
    if sinks is not None:
        sigma = sinks.double().reshape(n, 1).expand(n, sq)
        m = torch.maximum(m, sigma)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m[:, :, None])  # masked keys -> exp(-inf) = 0
    z = e.sum(dim=2)
    if sinks is not None:
        z = z + torch.exp(sigma - m)
    z = torch.where(z > 0, z, torch.ones_like(z))  # rows with no key at all: output 0
    out = torch.einsum("hqk,khd->qhd", e, vh) / z.transpose(0, 1)[:, :, None]
    return out


def reference_attention(
    q: torch.Tensor,
    k_full: Sequence[torch.Tensor],
    v_full: Sequence[torch.Tensor],
    q_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
    window: Optional[int] = None,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Packed batch: q (sum q_lens, N, D); k_full[r]/v_full[r] (s_r, Nkv, D)."""
    outs = []
    start = 0
    for r, ql in enumerate(q_lens):
        outs.append(
            reference_attention_one(
                q[start : start + ql], k_full[r], v_full[r], scale=scale, causal=causal, window=window, sinks=sinks
            )
        )
        start += ql
    if not outs:
        return torch.zeros(0, q.shape[1], q.shape[2], dtype=torch.float64)
    return torch.cat(outs, dim=0)


# ----------------------------------------------------------------------------- paged cache


def num_blocks_for(seq_len: int, block_size: int) -> int:
    return (seq_len + block_size - 1) // block_size


def random_block_table(
    seq_lens: Sequence[int],
    block_size: int,
    num_blocks: int,
    gen: torch.Generator,
    *,
    width: Optional[int] = None,
    shuffle: bool = True,
    reserve_zero: bool = True,
) -> torch.Tensor:
    """int32 (B, width): each request gets ceil(s/bs) unique block ids, shuffled
    across the whole cache (non-contiguous), unused columns 0. Block 0 is kept
    out of real requests by default (it is what padded/dummy rows point at)."""
    need = [num_blocks_for(s, block_size) for s in seq_lens]
    width = width if width is not None else max([1] + need)
    first = 1 if reserve_zero else 0
    ids = list(range(first, num_blocks))
    if shuffle:
        perm = torch.randperm(len(ids), generator=gen).tolist()
        ids = [ids[i] for i in perm]
    assert sum(need) <= len(ids), "cache too small for the batch"
    bt = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    pos = 0
    for r, nb in enumerate(need):
        assert nb <= width
        bt[r, :nb] = torch.tensor(ids[pos : pos + nb], dtype=torch.int32)
        pos += nb
    return bt


def slot_of(bt_row: torch.Tensor, pos: int, block_size: int) -> int:
    return int(bt_row[pos // block_size]) * block_size + pos % block_size


def positions_to_slots(bt_row: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """slot = block_table[pos // bs] * bs + pos % bs (int64)."""
    return bt_row.long()[positions // block_size] * block_size + positions % block_size


def write_dense_into_cache(cache: torch.Tensor, bt_row: torch.Tensor, start: int, values: torch.Tensor) -> None:
    """cache (nb, bs, Nkv, D); positions start .. start+len(values)-1 of the request."""
    nb, bs = cache.shape[:2]
    slots = positions_to_slots(bt_row, torch.arange(start, start + values.shape[0]), bs)
    cache.view(nb * bs, *cache.shape[2:])[slots] = values


def read_dense_from_cache(cache: torch.Tensor, bt_row: torch.Tensor, n: int) -> torch.Tensor:
    nb, bs = cache.shape[:2]
    slots = positions_to_slots(bt_row, torch.arange(n), bs)
    return cache.reshape(nb * bs, *cache.shape[2:])[slots]


def check_cache_after_write(before: torch.Tensor, after: torch.Tensor, slots: Sequence[int], new: torch.Tensor):
    """The slots of new tokens hold `new` (bitwise); every other slot is unchanged."""
    nb, bs = before.shape[:2]
    flat_b = before.reshape(nb * bs, *before.shape[2:])
    flat_a = after.reshape(nb * bs, *after.shape[2:])
    expected = flat_b.clone()
    for t, s in enumerate(slots):
        expected[s] = new[t]
    diff = ~(flat_a == expected).reshape(nb * bs, -1).all(dim=1)
    bad = diff.nonzero().flatten().tolist()
    assert not bad, f"cache slots differ from expectation: {bad[:20]} (new-token slots: {list(slots)[:20]})"


# ----------------------------------------------------------------------------- batches


@dataclass
class Batch:
    q_lens: List[int]
    seq_lens: List[int]
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    block_size: int
    num_blocks: int
    query_start_loc: torch.Tensor  # int32 (B+1,)
    seq_lens_t: torch.Tensor  # int32 (B,)
    block_table: torch.Tensor  # int32 (B, W)
    q: torch.Tensor  # (T_in, N, D) incl. padded rows
    k: torch.Tensor  # (T_in, Nkv, D)
    v: torch.Tensor
    k_full: List[torch.Tensor]  # per request (s, Nkv, D), dtype
    v_full: List[torch.Tensor]
    new_slots: List[int]  # slots of the real new tokens, in token order
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    num_input_tokens: int
    extra: dict = field(default_factory=dict)

    @property
    def num_actual_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def num_reqs(self) -> int:
        return len(self.q_lens)

    def reference(self, *, scale=None, causal=True, window=None, sinks=None) -> torch.Tensor:
        scale = 1.0 / math.sqrt(self.head_size) if scale is None else scale
        n = self.num_actual_tokens
        return reference_attention(
            self.q[:n], self.k_full, self.v_full, self.q_lens, scale=scale, causal=causal, window=window, sinks=sinks
        )


def make_batch(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    block_size: int,
    gen: torch.Generator,
    num_blocks: Optional[int] = None,
    width: Optional[int] = None,
    shuffle: bool = True,
    num_input_tokens: int = 0,
    write_new_tokens: bool = False,
    garbage_cache: bool = True,
) -> Batch:
    """A batch with random q/k/v in `dtype`, a paged cache whose unused slots
    hold random garbage (so a read from a wrong slot shows), and the context
    part (positions < s - q) of each request written into the cache with Python
    indexing. `write_new_tokens` also pre-writes the new tokens' K/V (for
    KV-sharing layers / key=None calls that only read the cache)."""
    seq_lens = [int(s) for s in seq_lens]
    q_lens = [int(q) for q in q_lens]
    assert len(seq_lens) == len(q_lens)
    for s, ql in zip(seq_lens, q_lens):
        assert s >= ql >= 0
    need = sum(num_blocks_for(s, block_size) for s in seq_lens)
    if num_blocks is None:
        num_blocks = need + 1 + max(2, need // 4)
    bt = random_block_table(seq_lens, block_size, num_blocks, gen, width=width, shuffle=shuffle)

    n_act = sum(q_lens)
    t_in = max(num_input_tokens, n_act)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    key_cache = rnd(num_blocks, block_size, num_kv_heads, head_size) if garbage_cache else torch.zeros(
        num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    value_cache = rnd(num_blocks, block_size, num_kv_heads, head_size) if garbage_cache else torch.zeros_like(
        key_cache)

    k_full, v_full, new_k, new_v, slots = [], [], [], [], []
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        kf = rnd(s, num_kv_heads, head_size)
        vf = rnd(s, num_kv_heads, head_size)
        k_full.append(kf)
        v_full.append(vf)
        ctx = s - ql
        write_dense_into_cache(key_cache, bt[r], 0, kf[:ctx])
        write_dense_into_cache(value_cache, bt[r], 0, vf[:ctx])
        if write_new_tokens:
            write_dense_into_cache(key_cache, bt[r], ctx, kf[ctx:])
            write_dense_into_cache(value_cache, bt[r], ctx, vf[ctx:])
        new_k.append(kf[ctx:])
        new_v.append(vf[ctx:])
        slots.extend(slot_of(bt[r], p, block_size) for p in range(ctx, s))

    pad = t_in - n_act
    k = torch.cat(new_k + [rnd(pad, num_kv_heads, head_size)], dim=0)
    v = torch.cat(new_v + [rnd(pad, num_kv_heads, head_size)], dim=0)
    q = rnd(t_in, num_heads, head_size)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32) if q_lens else qsl[1:]
    return Batch(
        q_lens=q_lens,
        seq_lens=seq_lens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        dtype=dtype,
        block_size=block_size,
        num_blocks=num_blocks,
        query_start_loc=qsl,
        seq_lens_t=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=bt,
        q=q,
        k=k,
        v=v,
        k_full=k_full,
        v_full=v_full,
        new_slots=slots,
        key_cache=key_cache,
        value_cache=value_cache,
        num_input_tokens=num_input_tokens,
    )


def new_output(batch: Batch, fill: float = SENTINEL) -> torch.Tensor:
    return torch.full((batch.q.shape[0], batch.num_heads, batch.head_size), fill, dtype=batch.dtype)


def assert_close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "output"):
    tol = tolerance(dtype)
    got64 = got.double()
    assert torch.isfinite(got64).all(), f"{what}: non-finite values"
    err = (got64 - expected).abs()
    bound = tol["atol"] + tol["rtol"] * expected.abs()
    if not bool((err <= bound).all()):
        idx = (err - bound).argmax()
        flat_idx = [int(i) for i in torch.unravel_index(idx, err.shape)]
        raise AssertionError(
            f"{what}: max abs err {float(err.max()):.3e} (tol atol={tol['atol']}, rtol={tol['rtol']}); "
            f"worst at {flat_idx}: got {float(got64[tuple(flat_idx)]):.6f} "
            f"expected {float(expected[tuple(flat_idx)]):.6f}; "
            f"{int((err > bound).sum())} of {err.numel()} elements out of tolerance"
        )
