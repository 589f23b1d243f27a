"""Independent float64 reference of DeepSeek-V3.2 sparse attention (SFA), written from the model
equations of docs/design/sfa.md §1, not from the runtime or its operator twins:

  MLA projections as in _mla_reference (q-LoRA c_q, q_nope/q_rope, latent c_kv, k_rope, GPT-J RoPE);
  lightning indexer (docs/design/sparse.md §4):
    kw    = x W_k^T -> k = LayerNorm(kw) (gamma, beta), then RoPE on its first R dims (neox: pairs (i, i+R/2);
            glm_moe_dsa: pairs (2i, 2i+1)); w = x W_w^T (n_head weights, no extra scaling)
    q_li  = c_q W_qb^T viewed (n_head, D_i), the same RoPE
    score(t, s) = sum_h w[t, h] * relu(q_li[t, h] . k[s]),  s visible iff s <= pos_t (right-down causal)
    top-k = the K visible positions of highest score (ties: lower position first), then -1
  sparse attention (docs/design/sparse.md §5): softmax over the selected positions only of
    scale * (q_nope . k_nope + q_rope . k_rope) (un-absorbed heads here), out = sum P v, then o_proj.
The scan rule of the kernel (stop at the first -1, skip positions past the row's threshold) is applied to the
top-k rows explicitly, so a reference row may be given any index list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import torch

from _mla_reference import F64, MlaDims, gptj_rope, project, rms


@dataclass
class IdxDims:
    n_head: int = 4
    D: int = 32
    K: int = 8
    neox: bool = True  # False: glm_moe_dsa (interleaved pairs)
    eps: float = 1e-6


def make_indexer_weights(d: MlaDims, idx: IdxDims, dtype, gen):
    def w(o, i):
        return (torch.randn(o, i, generator=gen, dtype=F64) / math.sqrt(i)).to(dtype)

    q_in = d.Q if d.Q is not None else d.hidden
    return {
        "wq_b": w(idx.n_head * idx.D, q_in),
        "wk": w(idx.D, d.hidden),
        "weights_proj": w(idx.n_head, d.hidden),
        "k_norm_weight": (1 + 0.1 * torch.randn(idx.D, generator=gen, dtype=F64)).to(dtype),
        "k_norm_bias": (0.1 * torch.randn(idx.D, generator=gen, dtype=F64)).to(dtype),
    }


def indexer_rope(x, pos, R: int, neox: bool, base: float = 10000.0):
    """RoPE on the first R dims of the last axis (the rest untouched), angles pos * base^(-2i/R)."""
    inv = base ** (-torch.arange(0, R, 2, dtype=F64) / R)
    ang = pos.to(F64)[:, None] * inv[None, :]  # (T, R/2)
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    c, s = ang.cos(), ang.sin()
    y = x.clone()
    if neox:
        a, b = x[..., : R // 2], x[..., R // 2: R]
        y[..., : R // 2] = a * c - b * s
        y[..., R // 2: R] = b * c + a * s
    else:
        a, b = x[..., 0:R:2], x[..., 1:R:2]
        y[..., 0:R:2] = a * c - b * s
        y[..., 1:R:2] = b * c + a * s
    return y


def layer_norm(x, g, b, eps):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(v + eps) * g + b


def indexer_keys(d: MlaDims, idx: IdxDims, iw, x, pos):
    """(S, D_i) keys of the tokens x (float64)."""
    W = {k: v.to(F64) for k, v in iw.items()}
    k = layer_norm(x.to(F64) @ W["wk"].T, W["k_norm_weight"], W["k_norm_bias"], idx.eps)
    return indexer_rope(k, pos, d.R, idx.neox)


def indexer_queries(d: MlaDims, idx: IdxDims, ws, iw, x, pos, eps=1e-6):
    """(q_li (T, n_head, D_i), w (T, n_head)) of the tokens x."""
    W = {k: v.to(F64) for k, v in iw.items()}
    xd = x.to(F64)
    cq = rms(xd @ ws["q_a_proj"].to(F64).T, ws["q_a_layernorm"].to(F64), eps) if d.Q is not None else xd
    q = (cq @ W["wq_b"].T).view(-1, idx.n_head, idx.D)
    return indexer_rope(q, pos, d.R, idx.neox), xd @ W["weights_proj"].T


def topk_rows(scores: torch.Tensor, visible: List[int], K: int) -> torch.Tensor:
    """scores (q, S) float64; row i sees positions < visible[i]. -> (q, K) int64, -1 padded."""
    q = scores.shape[0]
    out = torch.full((q, K), -1, dtype=torch.int64)
    for i in range(q):
        n = max(0, min(visible[i], scores.shape[1]))
        if n == 0:
            continue
        row = scores[i, :n]
        # descending score, ties by ascending position
        order = sorted(range(n), key=lambda s: (-float(row[s]), s))[: min(K, n)]
        out[i, : len(order)] = torch.tensor(order)
    return out


def indexer_topk_request(d: MlaDims, idx: IdxDims, ws, iw, x_all, q_len: int):
    """Top-k rows (q_len, K) of the last q_len tokens of a request whose tokens are x_all."""
    s = x_all.shape[0]
    pos = torch.arange(s)
    k = indexer_keys(d, idx, iw, x_all, pos)
    ql, w = indexer_queries(d, idx, ws, iw, x_all[s - q_len:], pos[s - q_len:])
    scores = (w[:, :, None] * torch.relu(torch.einsum("thd,sd->ths", ql, k))).sum(1)  # (q, S)
    return topk_rows(scores, [s - q_len + i + 1 for i in range(q_len)], idx.K), scores


def selected_positions(row: torch.Tensor, threshold: int) -> List[int]:
    """The kernel's scan of one index row: stop at the first -1, skip entries >= threshold."""
    out = []
    for v in row.tolist():
        if v < 0:
            break
        if v < threshold:
            out.append(int(v))
    return out


def sfa_attend_request(d: MlaDims, ws, x_all, q_len: int, scale: float, topk: torch.Tensor, act=None):
    """Output (q_len, hidden) of the last q_len tokens of a request (tokens x_all), attending only the positions
    the top-k rows select (scan rule, causal threshold); act: _mla_reference.project's."""
    s = x_all.shape[0]
    pos = torch.arange(s)
    q_nope, q_rope, c, k_rope = project(d, ws, x_all, pos, act=act)
    kvb = (c @ ws["kv_b_proj"].to(F64).T).view(s, d.H, d.P + d.V)
    k_nope, v = kvb[..., : d.P], kvb[..., d.P:]
    out = torch.zeros(q_len, d.H, d.V, dtype=F64)
    for i in range(q_len):
        t = s - q_len + i
        sel = selected_positions(topk[i], t + 1)
        if not sel:
            continue
        idx = torch.tensor(sel)
        logit = scale * (torch.einsum("hp,jhp->hj", q_nope[t], k_nope[idx]) + torch.einsum("hr,jr->hj", q_rope[t],
                                                                                          k_rope[idx]))
        out[i] = torch.einsum("hj,jhv->hv", torch.softmax(logit, -1), v[idx])
    return out.reshape(q_len, d.H * d.V) @ ws["o_proj"].to(F64).T
