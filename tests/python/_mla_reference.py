"""Independent float64 reference of MLA (DeepSeek V2/V3), written from the model
equations, not from the runtime or the kernels:

  c_q   = RMSNorm(x W_qa^T) * g_q              (q-LoRA; else c_q = x)
  q     = c_q W_q^T  -> per head [q_nope (P) | q_rope (R)]
  kv    = x W_kva^T  -> [c (L) | k_rope (R)];  c_kv = RMSNorm(c) * g_kv
  q_rope, k_rope: GPT-J RoPE on pairs (x[2i], x[2i+1]) with angle pos * base^(-2i/R)
  [k_nope | v] per head = c_kv W_kvb^T
  s[h,i,j] = scale * (q_nope[i,h].k_nope[j,h] + q_rope[i,h].k_rope[j]),  j <= pos_i
  out = softmax(s) v  over the full (un-absorbed) heads, then o_proj.

The paged caches hold c_kv (latent cache) and the RoPE'd k_rope in half-split order
([y0, y2, ..., y1, y3, ...], docs/design/mla.md §1.2 / §1.3); the helper writing the
context into them states that convention here independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

F64 = torch.float64


@dataclass
class MlaDims:
    H: int = 4
    hidden: int = 128
    Q: Optional[int] = 48
    L: int = 64
    P: int = 32
    R: int = 16
    V: int = 32


def rope_tables(max_pos: int, R: int, base: float = 10000.0):
    inv = base ** (-torch.arange(0, R, 2, dtype=F64) / R)
    ang = torch.arange(max_pos, dtype=F64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)


def gptj_rope(x, pos, base: float = 10000.0):
    R = x.shape[-1]
    inv = base ** (-torch.arange(0, R, 2, dtype=F64) / R)
    ang = pos.to(F64)[:, None] * inv[None, :]  # (T, R/2)
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x)
    y[..., 0::2] = x0 * ang.cos() - x1 * ang.sin()
    y[..., 1::2] = x1 * ang.cos() + x0 * ang.sin()
    return y


def half_split(y):
    return torch.cat([y[..., 0::2], y[..., 1::2]], -1)


def rms(x, g, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g


def make_weights(d: MlaDims, dtype, gen):
    def w(o, i):
        return (torch.randn(o, i, generator=gen, dtype=F64) / math.sqrt(i)).to(dtype)

    ws = {}
    if d.Q is not None:
        ws["q_a_proj"] = w(d.Q, d.hidden)
        ws["q_a_layernorm"] = (1 + 0.1 * torch.randn(d.Q, generator=gen, dtype=F64)).to(dtype)
    ws["q_proj"] = w(d.H * (d.P + d.R), d.Q if d.Q is not None else d.hidden)
    ws["kv_a_proj_with_mqa"] = w(d.L + d.R, d.hidden)
    ws["kv_a_layernorm"] = (1 + 0.1 * torch.randn(d.L, generator=gen, dtype=F64)).to(dtype)
    ws["kv_b_proj"] = w(d.H * (d.P + d.V), d.L)
    ws["o_proj"] = w(d.hidden, d.H * d.V)
    return ws


def project(d: MlaDims, ws, x, pos, eps=1e-6, act=None):
    """Per-token projections of all tokens of one request (float64). act (optional): what a quantised layer
    feeds its quantised projections instead of their inputs (x for q_a_proj / kv_a_proj_with_mqa, c_q for
    q_proj), e.g. the float64 value of the MX-fp8 quantised activations (_quant_reference.mx_activations)."""
    W = {k: v.to(F64) for k, v in ws.items()}
    x = x.to(F64)
    a = act or (lambda v: v)
    xa = a(x)
    cq = rms(xa @ W["q_a_proj"].T, W["q_a_layernorm"], eps) if d.Q is not None else x
    q = (a(cq) @ W["q_proj"].T).view(-1, d.H, d.P + d.R)
    kv = xa @ W["kv_a_proj_with_mqa"].T
    c = rms(kv[:, : d.L], W["kv_a_layernorm"], eps)
    k_rope = gptj_rope(kv[:, d.L:], pos)
    return q[..., : d.P], gptj_rope(q[..., d.P:], pos), c, k_rope


def attend_request(d: MlaDims, ws, x_all, q_len, scale, act=None):
    """Output (q_len, hidden) of the last q_len tokens of a request whose tokens are x_all (act: project's)."""
    s = x_all.shape[0]
    pos = torch.arange(s)
    q_nope, q_rope, c, k_rope = project(d, ws, x_all, pos, act=act)
    kvb = (c @ ws["kv_b_proj"].to(F64).T).view(s, d.H, d.P + d.V)
    k_nope, v = kvb[..., : d.P], kvb[..., d.P:]
    qi = torch.arange(s - q_len, s)
    sc = scale * (torch.einsum("ihp,jhp->hij", q_nope[qi], k_nope) + torch.einsum("ihr,jr->hij", q_rope[qi], k_rope))
    mask = pos[None, :] <= qi[:, None]
    sc = sc.masked_fill(~mask[None], float("-inf"))
    o = torch.einsum("hij,jhv->ihv", torch.softmax(sc, -1), v).reshape(q_len, d.H * d.V)
    return o @ ws["o_proj"].to(F64).T


def fill_context(d: MlaDims, ws, x_ctx, nope_cache, rope_cache, blocks: List[int], bs: int, act=None):
    """Writes the context tokens' cache rows: c_kv and the half-split RoPE'd k_rope (act: project's)."""
    n = x_ctx.shape[0]
    if n == 0:
        return
    _, _, c, k_rope = project(d, ws, x_ctx, torch.arange(n), act=act)
    kr = half_split(k_rope)
    for p in range(n):
        blk, off = blocks[p // bs], p % bs
        nope_cache[blk, off, 0] = c[p].to(nope_cache.dtype)
        rope_cache[blk, off, 0] = kr[p].to(rope_cache.dtype)


def lse_merge(lses, outs):
    """float64 LSE merge of partial results; all -inf rows give 0."""
    l = torch.stack([x.to(F64) for x in lses])
    m = l.max(0).values
    safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    tot = torch.log(torch.exp(l - safe).sum(0)) + safe
    w = torch.where(torch.isfinite(m)[None], torch.exp(l - tot), torch.zeros_like(l))
    return sum(o.to(F64) * w[i][:, None] for i, o in enumerate(outs)), tot


def latent_attention_reference(q, c, k_rope, kv_b_proj, q_len: int, scale: float, H: int, P: int, V: int):
    """float64 MLA attention of a request's last q_len tokens from what an engine that
    projects itself hands over: q (q_len, H, P+R) with RoPE applied, the latents c (s, L) and
    rotated k_rope (s, R) of all s tokens, kv_b_proj (H*(P+V), L). Un-absorbed:
    [k_nope | v] per head = c W_kvb^T, causal over the explicit mask j <= s - q_len + i.
    Returns (q_len, H, V)."""
    s = c.shape[0]
    q, c, k_rope = q.to(F64), c.to(F64), k_rope.to(F64)
    kvb = (c @ kv_b_proj.to(F64).T).view(s, H, P + V)
    k_nope, v = kvb[..., :P], kvb[..., P:]
    sc = scale * (torch.einsum("ihp,jhp->hij", q[..., :P], k_nope) + torch.einsum("ihr,jr->hij", q[..., P:], k_rope))
    i = torch.arange(q_len)[:, None]
    j = torch.arange(s)[None, :]
    sc = sc.masked_fill(~(j <= s - q_len + i)[None], float("-inf"))
    return torch.einsum("hij,jhv->ihv", torch.softmax(sc, -1), v)
