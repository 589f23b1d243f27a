"""Independent float64 reference of DeepSeek-V4 attention (DSA), written from the model equations of 
docs/design/dsa.md §1.1 (with the DSV4 "interleave" RoPE of docs/design/sparse.md §2, the Hadamard of docs/design/sparse.md §3 and DSpark of docs/design/dsa.md §3.4), not from the
runtime or its operator twins. One request at a time; every function computes in float64 (weights, tables and
activations of any float dtype are promoted).

  prolog (docs/design/dsa.md §1.1):
    qr = RMSNorm(x W_q_a^T) * q_norm;  q = qr W_q_b^T viewed (N, D);  q <- q / sqrt(mean(q^2) + eps) per head
    kv = RMSNorm(x W_kv^T) * kv_norm   (D, one shared head; it is the SWA cache row)
    interleave RoPE (pairs (2i, 2i+1), tables read at the same index as x) on q[..., D-R:] and kv[D-R:] at p
    W8A8-dynamic prolog (docs/design/dsa.md §5.4; weights with wq_a_scale / wq_b_scale / wkv_scale): every product
    x W^T of wq_a, wq_b, wkv becomes (round(x / s_x) W_codes^T) s_x[t] scale[o], s_x = amax|x_t| / 127, with x the
    tokens for wq_a / wkv and qr for wq_b
  compressor (docs/design/dsa.md §1.2), ratio r, coff in {1, 2}: kv_t = x_t W_kv^T, g_t = x_t W_gate^T + ape[p_t mod r]
    (width coff*D); row c covers [c r, (c+1) r) and exists once position (c+1) r - 1 exists.
    coff=1: y[d] = sum_k softmax_k(g[k, d]) kv[k, d] over the r tokens of group c.
    coff=2: 2r entries: group c-1's tokens with columns [0, D), group c's with [D, 2D); for c = 0 the previous
            entries are kv = 0, score = -inf. Per-feature softmax over the 2r entries.
    then y = RMSNorm(y) * norm, interleave RoPE on y[D-R:] at position c r.
  indexer (docs/design/dsa.md §1.3, ratio 4 only, unquantised): q_i = qr W_idx_q_b^T viewed (n_idx, Di), RoPE on its last R dims
    at p, then rotate_activation (x H^T / sqrt(Di), H the Sylvester +-1 matrix, 1.5); k_i = C4Li compressor rows
    (coff 2, ratio 4, width Di), rotate_activation; w = (x W_weights_proj^T) Di^-0.5 n_idx^-0.5;
    score(t, c) = sum_h w[t, h] relu(q_i[t, h] . k_i[c]); row t at p sees c < floor((p + 1) / 4);
    top-K by descending score (ties: lower row first), -1 padded.
  SAS attention (docs/design/dsa.md §1.4): query row at p attends SWA keys kv[max(0, p-(W-1)) .. p] plus compressed rows
    c < floor((p+1)/ratio) (all of them when ratio != 4; when ratio == 4 only the top-k entries e with
    0 <= e < limit, -1 skipped, duplicates counted as many times as listed, like the SFA scan), logits
    scale * q[h] . k over all D dims, scale = D^-0.5; the per-head sink joins the denominator only; v = k.
  output (docs/design/dsa.md §1.1): inverse RoPE (-sin) on o[..., D-R:] at p; o_proj viewed (G, N D / G),
    per group @ wo_a[g] (N D / G, o_lora), concatenated (G o_lora), @ wo_b^T.
  DSpark (docs/design/dsa.md §3.4, SWA-only layers): every draft row sees the W context tokens before the draft block plus the whole
    draft block of q tokens, non-causally (the num_spec argument bounds q: q_len > num_spec raises).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

F64 = torch.float64


@dataclass
class DsaDims:
    hidden: int = 128
    N: int = 4  # attention heads
    D: int = 64  # head dim: nope D-R, rope R (last R dims)
    R: int = 16
    q_lora: int = 48
    W: int = 8  # sliding window
    ratio: int = 4  # 1 = SWA only; 4 = C4 (overlap compressor + indexer); other values dense (coff 1)
    n_idx: int = 4  # indexer heads
    Di: int = 32  # indexer head dim (power of two)
    K: int = 8  # index_topk
    G: int = 2  # o_groups
    o_lora: int = 16
    eps: float = 1e-6

    @property
    def coff(self) -> int:
        return 2 if self.ratio == 4 else 1

    @property
    def scale(self) -> float:
        return self.D ** -0.5

    def __post_init__(self):
        if self.ratio < 1:
            raise ValueError(f"ratio must be >= 1 (1 = SWA only), got {self.ratio}")
        if self.R % 2 or self.R > self.D or self.R > self.Di:
            raise ValueError(f"R={self.R} must be even and <= D={self.D} and <= Di={self.Di}")
        if self.Di & (self.Di - 1):
            raise ValueError(f"Di must be a power of two, got {self.Di}")
        if (self.N * self.D) % self.G:
            raise ValueError(f"G={self.G} must divide N*D={self.N * self.D}")


def make_dsa_weights(d: DsaDims, dtype, gen) -> Dict[str, torch.Tensor]:
    """The contract's weight dict (names/shapes in the module brief). Scaled so activations stay O(1);
    attn_sink is float32 whatever dtype is."""

    def w(o, i):
        return (torch.randn(o, i, generator=gen, dtype=F64) / math.sqrt(i)).to(dtype)

    def norm(n):
        return (1 + 0.1 * torch.randn(n, generator=gen, dtype=F64)).to(dtype)

    ws = {
        "wq_a": w(d.q_lora, d.hidden),
        "q_norm": norm(d.q_lora),
        "wq_b": w(d.N * d.D, d.q_lora),
        "wkv": w(d.D, d.hidden),
        "kv_norm": norm(d.D),
        "attn_sink": torch.randn(d.N, generator=gen, dtype=F64).to(torch.float32),
        "wo_a": (torch.randn(d.G, d.N * d.D // d.G, d.o_lora, generator=gen, dtype=F64)
                 / math.sqrt(d.N * d.D // d.G)).to(dtype),
        "wo_b": w(d.hidden, d.G * d.o_lora),
    }
    if d.ratio > 1:
        c = d.coff
        ws["cmp_wkv"] = w(c * d.D, d.hidden)
        ws["cmp_wgate"] = w(c * d.D, d.hidden)
        ws["cmp_ape"] = (0.5 * torch.randn(d.ratio, c * d.D, generator=gen, dtype=F64)).to(dtype)
        ws["cmp_norm"] = norm(d.D)
    if d.ratio == 4:
        ws["idx_wq_b"] = w(d.n_idx * d.Di, d.q_lora)
        ws["idx_weights_proj"] = w(d.n_idx, d.hidden)
        ws["idx_cmp_wkv"] = w(2 * d.Di, d.hidden)
        ws["idx_cmp_wgate"] = w(2 * d.Di, d.hidden)
        ws["idx_cmp_ape"] = (0.5 * torch.randn(4, 2 * d.Di, generator=gen, dtype=F64)).to(dtype)
        ws["idx_cmp_norm"] = norm(d.Di)
    return ws


# ----------------------------------------------------------------------------------------------------------------
# elementary pieces


def rope_tables(max_pos: int, R: int, base: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (max_pos, R) float32, repeat-interleaved: column 2i and 2i+1 hold angle p * base^(-2i/R)
    (docs/design/sparse.md §2 DSV4; plain inv_freq: a YaRN table is just another input)."""
    inv = base ** (-torch.arange(0, R, 2, dtype=F64) / R)
    ang = torch.arange(max_pos, dtype=F64)[:, None] * inv[None, :]
    return (ang.cos().repeat_interleave(2, -1).to(torch.float32),
            ang.sin().repeat_interleave(2, -1).to(torch.float32))


def interleave_rope(x, cos_rows, sin_rows):
    """DSV4 interleave RoPE (docs/design/sparse.md §2) of the slice x (..., R): y[2i] = x[2i] c[2i] - x[2i+1] s[2i],
    y[2i+1] = x[2i+1] c[2i+1] + x[2i] s[2i+1]. cos_rows/sin_rows (T, R) rows for x's leading axis T (broadcast over
    any middle axes). Pass -sin_rows for the inverse rotation. Returns float64."""
    x = x.to(F64)
    c, s = cos_rows.to(F64), sin_rows.to(F64)
    while c.dim() < x.dim():
        c, s = c.unsqueeze(-2), s.unsqueeze(-2)
    y = torch.empty_like(x)
    y[..., 0::2] = x[..., 0::2] * c[..., 0::2] - x[..., 1::2] * s[..., 0::2]
    y[..., 1::2] = x[..., 1::2] * c[..., 1::2] + x[..., 0::2] * s[..., 1::2]
    return y


def rope_last(x, cos_rows, sin_rows, R: int):
    """x with interleave RoPE applied to its last R dims (float64 copy)."""
    y = x.to(F64).clone()
    y[..., -R:] = interleave_rope(y[..., -R:], cos_rows, sin_rows)
    return y


def rms(x, g, eps):
    """RMSNorm(x) * g (g None: no weight)."""
    x = x.to(F64)
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if g is None else y * g.to(F64)


def sylvester_hadamard(n: int) -> torch.Tensor:
    """Unnormalised +-1 Sylvester matrix of size n (power of two): H_1 = [1], H_2m = [[H, H], [H, -H]]."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotate_activation(x):
    """docs/design/sparse.md §3 DSV4: zero-pad the last axis to 2^ceil(log2 d), @ H^T, times d^-0.5 (original d), crop to d."""
    x = x.to(F64)
    dd = x.shape[-1]
    n = 1 << max(0, (dd - 1).bit_length())
    xp = torch.nn.functional.pad(x, (0, n - dd))
    return (xp @ sylvester_hadamard(n).T)[..., :dd] * dd ** -0.5


# ----------------------------------------------------------------------------------------------------------------
# prolog, compressor, indexer


def _w(w, k):
    return w[k].to(F64)


def quant_per_token(x):
    """Per-row symmetric int8 in float64 (docs/design/dsa.md §5.4): s = amax|x| / 127, codes = round-half-even(x / s),
    a zero row codes 0. Returns (codes (float64 integers), s (T, 1))."""
    x = x.to(F64)
    s = x.abs().amax(-1, keepdim=True) / 127
    return torch.round(x / torch.where(s == 0, torch.ones_like(s), s)).clamp(-127, 127), s


def tie_margin(x) -> float:
    """How far, in code units, the per-row quantisation of x is from a rounding tie (min over elements of
    |frac(|x| / s) - 1/2|): an implementation whose pre-quantisation values drift by less than this makes the
    same codes."""
    x = x.to(F64)
    s = x.abs().amax(-1, keepdim=True) / 127
    v = (x / torch.where(s == 0, torch.ones_like(s), s)).abs()
    return ((v - v.floor()) - 0.5).abs().min().item() if v.numel() else 0.5


def _linear(w, k, x):
    """x W_k^T, or with a W8A8-dynamic checkpoint (w[k + "_scale"] given: W_k int8 codes (out, in), float32 scales
    (out)) the quantised product (quant(x) W_k^T) * s_x[t] * scale[o] of docs/design/dsa.md §5.4."""
    sk = k + "_scale"
    if sk in w:
        c, s = quant_per_token(x)
        return (c @ _w(w, k).T) * s * w[sk].to(F64)
    return x.to(F64) @ _w(w, k).T


def q_lora(d: DsaDims, w, x):
    """qr = RMSNorm(x W_q_a^T) * q_norm (docs/design/dsa.md §1.1), (T, q_lora)."""
    return rms(_linear(w, "wq_a", x), w["q_norm"], d.eps)


def prolog_tie_margins(d: DsaDims, w, x) -> Tuple[float, float]:
    """The tie margins (tie_margin) of a W8A8-dynamic prolog's two quantisations over tokens x: x's and qr's."""
    return tie_margin(x), tie_margin(q_lora(d, w, x))


def quantise_prolog(w, keys=("wq_a", "wq_b", "wkv")) -> Dict[str, torch.Tensor]:
    """The weights with `keys` replaced by their per-output-channel symmetric int8 codes and float32 scales
    (k + "_scale", amax|row| / 127), as a W8A8-dynamic checkpoint stores them."""
    out = dict(w)
    for k in keys:
        c, s = quant_per_token(w[k])
        out[k] = c.to(torch.int8)
        out[k + "_scale"] = s.squeeze(-1).to(torch.float32)
    return out


def prolog(d: DsaDims, w, x, pos, cos, sin):
    """docs/design/dsa.md §1.1 for tokens x (T, hidden) at absolute positions pos (T,): (q (T, N, D), kv (T, D)), both
    RoPE'd on their last R dims with the table rows cos[pos], sin[pos]. A W8A8-dynamic checkpoint (wq_a_scale, ...)
    quantises x and qr per token (§5.4)."""
    pos = torch.as_tensor(pos, dtype=torch.long)
    cr, sr = cos[pos], sin[pos]
    q = _linear(w, "wq_b", q_lora(d, w, x)).view(-1, d.N, d.D)
    q = rope_last(rms(q, None, d.eps), cr, sr, d.R)
    kv = rope_last(rms(_linear(w, "wkv", x), w["kv_norm"], d.eps), cr, sr, d.R)
    return q, kv


def swa_rows(d: DsaDims, w, x_all, cos, sin):
    """The SWA-cache rows (S, D) of all tokens of a request (positions 0..S-1): the prolog's kv."""
    return prolog(d, w, x_all, torch.arange(x_all.shape[0]), cos, sin)[1]


def compress_rows(x_all, wkv, wgate, ape, norm, ratio: int, coff: int, D: int, cos, sin, R: int, eps: float):
    """docs/design/dsa.md §1.2: all complete compressed rows (S // ratio, D) of one request's tokens x_all (positions 0..S-1)."""
    if coff not in (1, 2):
        raise ValueError(f"coff must be 1 or 2, got {coff}")
    x = x_all.to(F64)
    S = x.shape[0]
    n = S // ratio
    if n == 0:
        return torch.zeros(0, D, dtype=F64)
    kv = (x @ wkv.to(F64).T)[: n * ratio].view(n, ratio, coff * D)
    g = (x @ wgate.to(F64).T)[: n * ratio].view(n, ratio, coff * D) + ape.to(F64)[None]
    if coff == 1:
        kvs, gs = kv, g
    else:
        prev_kv = torch.cat([torch.zeros(1, ratio, D, dtype=F64), kv[:-1, :, :D]], 0)
        prev_g = torch.cat([torch.full((1, ratio, D), float("-inf"), dtype=F64), g[:-1, :, :D]], 0)
        kvs = torch.cat([prev_kv, kv[:, :, D:]], 1)  # (n, 2r, D)
        gs = torch.cat([prev_g, g[:, :, D:]], 1)
    y = (torch.softmax(gs, 1) * kvs).sum(1)  # per-feature softmax over the entries
    y = rms(y, norm, eps)
    p = torch.arange(n) * ratio
    return rope_last(y, cos[p], sin[p], R)


def compressed_kv_rows(d: DsaDims, w, x_all, cos, sin):
    """The compressed-cache rows (S // ratio, D) of a request (ratio > 1)."""
    if d.ratio <= 1:
        raise ValueError(f"compressed_kv_rows needs ratio > 1, got ratio={d.ratio}")
    return compress_rows(x_all, w["cmp_wkv"], w["cmp_wgate"], w["cmp_ape"], w["cmp_norm"], d.ratio, d.coff, d.D,
                         cos, sin, d.R, d.eps)


def indexer_k_rows(d: DsaDims, w, x_all, cos, sin):
    """The indexer-cache key rows (S // 4, Di) of a request (ratio 4): C4Li compressor rows, Hadamard-rotated,
    unquantised."""
    if d.ratio != 4:
        raise ValueError(f"indexer_k_rows needs ratio 4, got ratio={d.ratio}")
    k = compress_rows(x_all, w["idx_cmp_wkv"], w["idx_cmp_wgate"], w["idx_cmp_ape"], w["idx_cmp_norm"], 4, 2, d.Di,
                      cos, sin, d.R, d.eps)
    return rotate_activation(k)


def indexer_queries(d: DsaDims, w, x, pos, cos, sin):
    """(q_i (T, n_idx, Di) RoPE'd on the last R dims and rotated, weights (T, n_idx) scaled) of tokens x at pos."""
    pos = torch.as_tensor(pos, dtype=torch.long)
    qi = (q_lora(d, w, x) @ _w(w, "idx_wq_b").T).view(-1, d.n_idx, d.Di)
    qi = rotate_activation(rope_last(qi, cos[pos], sin[pos], d.R))
    wt = (x.to(F64) @ _w(w, "idx_weights_proj").T) * (d.Di ** -0.5 * d.n_idx ** -0.5)
    return qi, wt


def visible_compressed(p: int, ratio: int) -> int:
    """Number of compressed rows visible to the query at absolute position p: floor((p + 1) / ratio)."""
    return (p + 1) // ratio


def topk_rows(scores, visible: List[int], K: int):
    """scores (q, C); row i sees rows < visible[i] -> (q, K) int64, descending score, ties lower row first, -1."""
    q = scores.shape[0]
    out = torch.full((q, K), -1, dtype=torch.int64)
    for i in range(q):
        n = max(0, min(visible[i], scores.shape[1]))
        row = scores[i, :n].tolist()
        order = sorted(range(n), key=lambda c: (-row[c], c))[:K]
        if order:
            out[i, : len(order)] = torch.tensor(order)
    return out


def indexer_topk(d: DsaDims, w, x_all, q_len: int, cos, sin):
    """docs/design/dsa.md §1.3 (unquantised) for the last q_len tokens of a request whose tokens are x_all:
    (topk (q_len, K) int64 compressed-row ids, scores (q_len, S // 4) float64 for every complete row, including
    rows the query does not see)."""
    S = x_all.shape[0]
    pos = torch.arange(S - q_len, S)
    k = indexer_k_rows(d, w, x_all, cos, sin)
    qi, wt = indexer_queries(d, w, x_all[S - q_len:], pos, cos, sin)
    scores = (wt[:, :, None] * torch.relu(torch.einsum("thd,cd->thc", qi, k))).sum(1)
    return topk_rows(scores, [visible_compressed(int(p), 4) for p in pos], d.K), scores


# ----------------------------------------------------------------------------------------------------------------
# attention and output


def sas_attention(d: DsaDims, q, swa_kv, cmp_kv, pos, sinks, cmp_topk=None, ori_positions=None):
    """docs/design/dsa.md §1.4 for query rows q (T, N, D) at absolute positions pos (T,). swa_kv (S, D) are the request's SWA rows
    by position; cmp_kv (C, D) its compressed rows (None or empty: none). Visible compressed rows are
    c < floor((p+1)/ratio): all of them when cmp_topk is None, else only the listed entries e (0 <= e < limit; -1 and
    out-of-range skipped; duplicates counted). ori_positions: optional per-row list of the raw positions to attend
    instead of the window [max(0, p-(W-1)), p] (DSpark). sinks (N,) in the denominator only. -> (T, N, D)."""
    q = q.to(F64)
    swa_kv = swa_kv.to(F64)
    sinks = sinks.to(F64)
    T = q.shape[0]
    out = torch.zeros(T, d.N, d.D, dtype=F64)
    for i in range(T):
        p = int(pos[i])
        if ori_positions is None:
            keys = [swa_kv[max(0, p - (d.W - 1)): p + 1]]
        else:
            keys = [swa_kv[torch.as_tensor(list(ori_positions[i]), dtype=torch.long)].view(-1, d.D)]
        if cmp_kv is not None and cmp_kv.shape[0] > 0 and d.ratio > 1:
            lim = min(visible_compressed(p, d.ratio), cmp_kv.shape[0])
            if cmp_topk is None:
                sel = list(range(lim))
            else:
                sel = [int(e) for e in cmp_topk[i].tolist() if 0 <= e < lim]
            if sel:
                keys.append(cmp_kv.to(F64)[torch.tensor(sel)])
        k = torch.cat(keys, 0)
        if k.shape[0] == 0:
            continue
        logit = d.scale * (q[i] @ k.T)  # (N, J)
        m = torch.maximum(logit.max(-1).values, sinks)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.exp(logit - m[:, None])
        out[i] = (e @ k) / (torch.exp(sinks - m) + e.sum(-1))[:, None]
    return out


def o_proj(d: DsaDims, w, o):
    """docs/design/dsa.md §5.2: o (T, N, D) viewed (T, G, N D / G), per-group @ wo_a[g], concat (T, G o_lora), @ wo_b^T."""
    T = o.shape[0]
    og = o.to(F64).reshape(T, d.G, d.N * d.D // d.G)
    return torch.einsum("tgi,gio->tgo", og, _w(w, "wo_a")).reshape(T, d.G * d.o_lora) @ _w(w, "wo_b").T


def dspark_positions(S: int, q_len: int, W: int) -> List[int]:
    """docs/design/dsa.md §3.4: the raw positions every draft row sees: [max(S - q_len - W, 0), S)."""
    return list(range(max(S - q_len - W, 0), S))


def dsa_layer(d: DsaDims, w, x_all, q_len: int, cos, sin, topk=None, dspark: Optional[int] = None):
    """Output (q_len, hidden) float64 of the last q_len tokens of a request whose tokens are x_all (docs/design/dsa.md §1.1).
    topk: (q_len, K) compressed-row ids for ratio 4 (None: computed by indexer_topk); ignored otherwise.
    dspark: num_spec of a DSpark draft step (docs/design/dsa.md §3.4): SWA-only layers, q_len <= num_spec; every row sees the W context
    tokens before the block and the whole block, non-causally."""
    S = x_all.shape[0]
    if not 0 < q_len <= S:
        raise ValueError(f"q_len must be in [1, {S}], got {q_len}")
    pos = torch.arange(S - q_len, S)
    q_all, kv = prolog(d, w, x_all, torch.arange(S), cos, sin)
    q = q_all[S - q_len:]
    ori = None
    if dspark is not None:
        if d.ratio > 1:
            raise ValueError(f"dspark needs an SWA-only layer (ratio <= 1), got ratio={d.ratio}")
        if q_len > dspark:
            raise ValueError(f"dspark: q_len={q_len} exceeds num_spec={dspark}")
        ori = [dspark_positions(S, q_len, d.W)] * q_len
    cmp_kv = None
    if d.ratio > 1:
        cmp_kv = compressed_kv_rows(d, w, x_all, cos, sin)
        if d.ratio == 4 and topk is None:
            topk = indexer_topk(d, w, x_all, q_len, cos, sin)[0]
    o = sas_attention(d, q, kv, cmp_kv, pos, w["attn_sink"], topk if d.ratio == 4 else None, ori)
    o[..., d.D - d.R:] = interleave_rope(o[..., d.D - d.R:], cos[pos], -sin[pos])
    return o_proj(d, w, o)
