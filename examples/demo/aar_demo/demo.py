"""Continuous batching of a small Llama-shaped decoder with ascend_attn_rt doing the attention.

``--attention gqa`` (default) uses the GQA backend; ``--attention mla`` swaps every
attention block for DeepSeek-style multi-head latent attention (q-LoRA, latent KV,
decoupled RoPE) served by the MLA backend: ``aar.mla.MetadataBuilder`` /
``aar.mla.Impl`` with a latent and a rope cache per layer, a small chunked-prefill
workspace so later prefill chunks gather their cached context in several chunks,
and a dense reference that runs the un-absorbed MLA equations over each sequence.
``--attention sfa`` serves the same MLA layers as DeepSeek-V3.2 sparse attention
(``aar.sfa``): even layers run a lightning indexer (its own key cache sharing the
block ids) and select the top-k cached positions every query token attends to,
odd layers reuse that selection from the shared top-k buffer; the dense reference
computes the indexer scores and the top-k itself (float64) and attends over that
selection only.
``--attention dsa`` serves a DeepSeek-V4-shaped stack (``aar.dsa``): layers cycle
through sliding-window-only (ratio 1), C4 (compressed every 4 tokens, with the
DSV4 quantised indexer choosing the compressed rows) and C128 (compressed every
128 tokens) attention with per-head sinks; one ``StepBuilder`` per step and one
``GroupBuilder`` per KV-cache group (SWA, compressed KV, compressor states,
indexer keys), each group with its own block pool and block geometry (cache
block size 32). The dense reference recomputes every layer over each whole
sequence in float64 (prolog, compressors from scratch, window + compressed
rows + sink attention, o_proj). Its index_topk (64) exceeds the compressed rows
any demo query sees, so the reference attends to every visible compressed row
and the runtime's indexer selection is checked to be exactly that set.

A random-weight decoder stack (fixed seed; RMSNorm, rotary embeddings, GQA
attention, SwiGLU MLP; fp32) serves a handful of requests of mixed prompt
lengths that arrive over the first steps and generate greedily. A small
scheduler shapes each step the way a serving engine does:

* decodes first, then prefill chunks, under a per-step token budget (long
  prompts are prefilled in chunks over several steps);
* one paged KV cache per layer (block size 16) fed by a free-block pool: a
  request reserves its blocks on admission and returns them when it finishes,
  so later requests reuse blocks holding stale K/V of earlier ones;
* the engine's block table *is* the builder's ``block_table_staging`` buffer
  (the zero-copy path), and ``MetadataBuilder.build`` runs once per step;
* ``AttentionImpl.forward`` runs once per layer and writes the step's K/V into
  the paged cache itself.

``--dcp N`` serves the same requests with decode context parallelism over N
local processes (gloo): every rank runs the whole stack and holds a sequence shard
of every KV cache. GQA (``aar.DcpMetadataBuilder`` / ``aar.DcpAttentionImpl``):
each rank holds its share of the query heads and the ranks' attention outputs are
gathered back to all heads. SFA (``aar.sfa.MetadataBuilder(dcp_world_size=N, ...)``
/ ``aar.sfa.Impl(dcp_comm=...)``, the replicated indexer): every rank computes all
heads; the latent / rope caches hold only the rank's own tokens while every
indexer cache is replicated (num_blocks * N blocks), so each rank selects the
same top-k over the whole sequence and attends over its shard, and the layer's
LSE merge returns the full result on every rank. Both use one block table per
group (a block id stands for bs tokens on each of the N ranks, a virtual block of
bs * N). Rank 0 also runs the single-rank engine and reports whether the greedy
tokens match.

``--attention dsa --dsa-cp N`` serves the DSA stack with DSA-CP over N local
processes (gloo; docs/design/sparse_cp.md §10): ``aar.dsa.StepBuilder(dsa_cp_world_size=N,
dsa_cp_rank=r, ...)`` splits every step's tokens into N slices (its local lengths
and RoPE rows), and ``aar.dsa.Impl(dsa_cp_comm=...)`` holds every head's query
weights and its row-parallel o_proj shard (wo_a's groups [r G/N, (r+1) G/N) and
wo_b's matching columns). Every rank writes every token's KV, compressor and
indexer rows itself, attends for its slice only, and returns the complete output:
decode steps exchange the heads (all-to-all) and all-reduce the shards' partial
o_proj sums, steps with prefills gather the full o_proj weights and the slices'
outputs; the demo tells each layer call's road by its collectives and checks it is
its step's. Rank 0 checks its slices' indexer selections against the reference,
runs the single-rank engine and reports whether the greedy tokens match. --dsa-cp
and --dcp are not combined.

``--attention dsa --dcp N`` serves the DSA stack with DCP over N local processes
(gloo; docs/design/sparse_cp.md §12): the DCP group is the TP group, so each rank holds
its heads [r H/N, (r+1) H/N) (wq_b's rows, the sinks) and its row-parallel o_proj
shard, and the demo sums the ranks' partial outputs (the model's TP reduction,
one all-reduce per layer). ``aar.dsa.StepBuilder(dcp_world_size=N, dcp_rank=r, ...)``
gives the SWA and compressed-KV groups this rank's local slots (position x on rank
x mod N, interleave 1), the indexer and compressor-state groups stay replicated;
``aar.dsa.Impl(dcp_comm=...)`` gathers the query heads, attends over the rank's keys
and merges the partials by LSE, for every step (prefill, chunked prefill, mixed,
decode). The demo checks each layer call issued one all-gather and one all-to-all.

At the end the same stack is run again with plain-torch dense causal attention
over each request's whole sequence (no cache at all), and the greedy tokens and
the logits that chose them are compared.
The demo exits non-zero if any token differs or the logits differ by more
than 1e-3.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

import ascend_attn_rt as aar

LOGIT_TOLERANCE = 1e-3


# --------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    vocab: int = 512
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_size: int = 32
    intermediate: int = 688
    rope_theta: float = 10000.0
    eps: float = 1e-6
    attention: str = "gqa"  # or "mla", "sfa"
    # MLA (attention == "mla"): q-LoRA rank, latent rank, nope / rope / value head sizes.
    q_lora_rank: int = 48
    kv_lora_rank: int = 64
    qk_nope: int = 32
    qk_rope: int = 16
    v_head: int = 32
    # SFA (attention == "sfa"): lightning indexer heads / head size / top-k; every other layer has an indexer.
    index_heads: int = 4
    index_dim: int = 32
    index_topk: int = 24
    # DSA (attention == "dsa"): head dim / rope dims, window, output groups, indexer; layer ratios cycle.
    dsa_head_dim: int = 64
    dsa_window: int = 16
    dsa_o_groups: int = 2
    dsa_o_lora: int = 32
    dsa_index_topk: int = 64
    dsa_ratios: tuple = (1, 4, 128)


class TinyLlama:
    """Weights and the per-token maths of a Llama decoder; attention is a callback.

    ``forward(tokens, positions, attend)`` runs the stack over a flat token list
    (T,) and returns the final hidden states (T, hidden). ``attend(layer, q, k, v)``
    receives q (T, H, D) and k/v (T, Hkv, D) after rotary embedding and returns
    the attention output (T, H, D). The paged runtime and the dense reference
    plug in here, so both runs share every other operation bit for bit.
    """

    def __init__(self, cfg: ModelConfig, seed: int):
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)

        def w(out_f: int, in_f: int) -> torch.Tensor:
            return torch.randn(out_f, in_f, generator=g) / math.sqrt(in_f)

        h, d = cfg.hidden, cfg.head_size
        self.embed = torch.randn(cfg.vocab, h, generator=g)
        self.layers = []
        for _ in range(cfg.layers):
            attn_norm = 1.0 + 0.1 * torch.randn(h, generator=g)  # drawn first: the GQA weights keep their seed order
            if cfg.attention in ("mla", "sfa"):
                H, Q, L, P, R, V = cfg.heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope, cfg.qk_rope, cfg.v_head
                attn = dict(
                    q_a_proj=w(Q, h),
                    q_a_layernorm=1.0 + 0.1 * torch.randn(Q, generator=g),
                    q_proj=w(H * (P + R), Q),
                    kv_a_proj_with_mqa=w(L + R, h),
                    kv_a_layernorm=1.0 + 0.1 * torch.randn(L, generator=g),
                    kv_b_proj=w(H * (P + V), L),
                    o_proj=w(h, H * V),
                )
                if cfg.attention == "sfa" and len(self.layers) % 2 == 0:
                    n, di = cfg.index_heads, cfg.index_dim
                    attn.update(indexer_wq_b=w(n * di, Q), indexer_wk=w(di, h), indexer_weights_proj=w(n, h),
                                indexer_k_norm_weight=1.0 + 0.1 * torch.randn(di, generator=g),
                                indexer_k_norm_bias=0.1 * torch.randn(di, generator=g))
            elif cfg.attention == "dsa":
                attn = self._dsa_weights(len(self.layers), w, g)
            else:
                attn = dict(wqkv=w((cfg.heads + 2 * cfg.kv_heads) * d, h), wo=w(h, cfg.heads * d))
            self.layers.append(
                dict(
                    attn_norm=attn_norm,
                    **attn,
                    mlp_norm=1.0 + 0.1 * torch.randn(h, generator=g),
                    w_gate_up=w(2 * cfg.intermediate, h),
                    w_down=w(h, cfg.intermediate),
                )
            )
        self.final_norm = 1.0 + 0.1 * torch.randn(h, generator=g)
        self.lm_head = w(cfg.vocab, h)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.eps) * weight

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Neox-style (rotate halves), x (T, heads, D).
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Callable) -> torch.Tensor:
        """attend(layer, q, k, v) -> (T, H, D) for GQA; attend(layer, h, positions) -> (T, hidden) for MLA,
        where h is the layer's normed input."""
        cfg = self.cfg
        t = tokens.shape[0]
        nq, nkv, d = cfg.heads * cfg.head_size, cfg.kv_heads * cfg.head_size, cfg.head_size
        x = self.embed[tokens]
        for i, lw in enumerate(self.layers):
            if cfg.attention in ("mla", "sfa", "dsa"):
                # The whole attention block (projections, norms, RoPE, o_proj) is the callback's.
                x = x + attend(i, self.rms_norm(x, lw["attn_norm"]), positions)
            else:
                qkv = self.rms_norm(x, lw["attn_norm"]) @ lw["wqkv"].T
                q = self.rope(qkv[:, :nq].reshape(t, cfg.heads, d), positions)
                k = self.rope(qkv[:, nq : nq + nkv].reshape(t, cfg.kv_heads, d), positions)
                v = qkv[:, nq + nkv :].reshape(t, cfg.kv_heads, d).contiguous()
                o = attend(i, q.contiguous(), k.contiguous(), v)
                x = x + o.reshape(t, nq) @ lw["wo"].T
            gate, up = (self.rms_norm(x, lw["mlp_norm"]) @ lw["w_gate_up"].T).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ lw["w_down"].T
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(hidden, self.final_norm) @ self.lm_head.T

    # -- MLA
    MLA_WEIGHTS = ("q_a_proj", "q_a_layernorm", "q_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                   "o_proj")

    def mla_rope_tables(self, max_pos: int):
        """(max_pos, R) cos/sin with both halves equal: what the MLA builder gathers rows from."""
        R = self.cfg.qk_rope
        inv = self.cfg.rope_theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
        ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        return torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()

    INDEXER_WEIGHTS = ("indexer_wq_b", "indexer_wk", "indexer_weights_proj", "indexer_k_norm_weight",
                       "indexer_k_norm_bias")

    def has_indexer(self, layer: int) -> bool:
        return "indexer_wk" in self.layers[layer]

    def sfa_topk(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The lightning indexer over one whole sequence (float64): LayerNorm'd keys and q-LoRA queries with
        neox RoPE on their first R dims, score(t, s) = sum_h w[t,h] relu(q[t,h] . k[s]) over s <= t, the top-k
        positions by score (ties: lower position). -> (S, K) int64, -1 padded."""
        cfg, lw = self.cfg, {k: v.double() for k, v in self.layers[layer].items()}
        x, s, R, n, di = h.double(), h.shape[0], cfg.qk_rope, cfg.index_heads, cfg.index_dim
        inv = cfg.rope_theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
        ang = positions.double()[:, None] * inv[None, :]

        def neox_first_r(v):  # v (S, heads, di)
            c, sn = ang.cos()[:, None, :], ang.sin()[:, None, :]
            a, b = v[..., : R // 2], v[..., R // 2: R]
            return torch.cat([a * c - b * sn, b * c + a * sn, v[..., R:]], -1)

        kw = x @ lw["indexer_wk"].T
        k = torch.nn.functional.layer_norm(kw, (di,), lw["indexer_k_norm_weight"], lw["indexer_k_norm_bias"],
                                           cfg.eps)
        k = neox_first_r(k[:, None, :])[:, 0]
        cq = x @ lw["q_a_proj"].T
        cq = cq * torch.rsqrt(cq.pow(2).mean(-1, keepdim=True) + cfg.eps) * lw["q_a_layernorm"]
        q = neox_first_r((cq @ lw["indexer_wq_b"].T).view(s, n, di))
        w = x @ lw["indexer_weights_proj"].T
        scores = (w[:, :, None] * torch.relu(torch.einsum("thd,sd->ths", q, k))).sum(1)  # (S, S)
        out = torch.full((s, cfg.index_topk), -1, dtype=torch.int64)
        for t in range(s):
            order = sorted(range(t + 1), key=lambda j: (-float(scores[t, j]), j))[: cfg.index_topk]
            out[t, : len(order)] = torch.tensor(order)
        return out

    def sfa_dense_attention(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """MLA over one whole sequence where every query token attends only to the positions the lightning
        indexer selected for it (this layer's indexer, or the last indexer layer's selection)."""
        if self.has_indexer(layer):
            self._sfa_topk = self.sfa_topk(layer, h, positions)
        s = h.shape[0]
        allowed = torch.zeros(s, s, dtype=torch.bool)
        for t in range(s):
            sel = self._sfa_topk[t]
            allowed[t, sel[sel >= 0]] = True
        return self.mla_dense_attention(layer, h, positions, allowed)

    def mla_dense_attention(self, layer: int, h: torch.Tensor, positions: torch.Tensor,
                            allowed: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Un-absorbed MLA over one whole sequence h (S, hidden), full causal (or the `allowed` (S, S) mask), in
        float64: q-LoRA, RMSNorm of the latent, GPT-J (interleaved-pair) RoPE on q_pe / k_pe, K/V up-projected
        per head, o_proj."""
        cfg, lw = self.cfg, {k: v.double() for k, v in self.layers[layer].items()}
        H, L, P, R, V = cfg.heads, cfg.kv_lora_rank, cfg.qk_nope, cfg.qk_rope, cfg.v_head
        x, s = h.double(), h.shape[0]

        def rms(v, wt):
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.eps) * wt

        def gptj(v):
            inv = cfg.rope_theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
            ang = positions.double()[:, None] * inv[None, :]
            while ang.dim() < v.dim():
                ang = ang.unsqueeze(-2)
            v0, v1 = v[..., 0::2], v[..., 1::2]
            out = torch.empty_like(v)
            out[..., 0::2] = v0 * ang.cos() - v1 * ang.sin()
            out[..., 1::2] = v1 * ang.cos() + v0 * ang.sin()
            return out

        q = (rms(x @ lw["q_a_proj"].T, lw["q_a_layernorm"]) @ lw["q_proj"].T).view(s, H, P + R)
        kv = x @ lw["kv_a_proj_with_mqa"].T
        c = rms(kv[:, :L], lw["kv_a_layernorm"])
        k_pe = gptj(kv[:, L:])
        kvb = (c @ lw["kv_b_proj"].T).view(s, H, P + V)
        scores = (torch.einsum("qhp,khp->hqk", q[..., :P], kvb[..., :P])
                  + torch.einsum("qhr,kr->hqk", gptj(q[..., P:]), k_pe)) / math.sqrt(P + R)
        if allowed is None:
            allowed = ~torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        o = torch.einsum("hqk,khv->qhv", scores.softmax(-1), kvb[..., P:]).reshape(s, H * V)
        return (o @ lw["o_proj"].T).float()


    # -- DSA (DeepSeek-V4)
    def dsa_ratio(self, layer: int) -> int:
        return self.cfg.dsa_ratios[layer % len(self.cfg.dsa_ratios)]

    def _dsa_weights(self, layer: int, w, g) -> dict:
        """The names and shapes of aar.dsa.Impl's weights (tests/python/_dsa_reference.py's contract)."""
        cfg, r = self.cfg, self.dsa_ratio(layer)
        h, N, D, Q, G, O = cfg.hidden, cfg.heads, cfg.dsa_head_dim, cfg.q_lora_rank, cfg.dsa_o_groups, cfg.dsa_o_lora
        n, di = cfg.index_heads, cfg.index_dim
        norm = lambda k: 1.0 + 0.1 * torch.randn(k, generator=g)
        ws = dict(wq_a=w(Q, h), q_norm=norm(Q), wq_b=w(N * D, Q), wkv=w(D, h), kv_norm=norm(D),
                  attn_sink=torch.randn(N, generator=g),
                  wo_a=torch.randn(G, N * D // G, O, generator=g) / math.sqrt(N * D // G), wo_b=w(h, G * O))
        if r > 1:
            c = 2 if r == 4 else 1
            ws.update(cmp_wkv=w(c * D, h), cmp_wgate=w(c * D, h), cmp_ape=0.5 * torch.randn(r, c * D, generator=g),
                      cmp_norm=norm(D))
        if r == 4:
            ws.update(idx_wq_b=w(n * di, Q), idx_weights_proj=w(n, h), idx_cmp_wkv=w(2 * di, h),
                      idx_cmp_wgate=w(2 * di, h), idx_cmp_ape=0.5 * torch.randn(4, 2 * di, generator=g),
                      idx_cmp_norm=norm(di))
        return ws

    DSA_WEIGHTS = ("wq_a", "q_norm", "wq_b", "wkv", "kv_norm", "attn_sink", "wo_a", "wo_b", "cmp_wkv", "cmp_wgate",
                   "cmp_ape", "cmp_norm", "idx_wq_b", "idx_weights_proj", "idx_cmp_wkv", "idx_cmp_wgate",
                   "idx_cmp_ape", "idx_cmp_norm")

    def dsa_rope_tables(self, max_pos: int):
        """(max_pos, R) cos/sin, each angle repeated for the pair (2i, 2i+1): the DSV4 interleave tables."""
        R = self.cfg.qk_rope
        inv = self.cfg.rope_theta ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
        ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
        return ang.cos().repeat_interleave(2, -1).float(), ang.sin().repeat_interleave(2, -1).float()

    def dsa_dense_attention(self, layer: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One DSA layer over one whole sequence h (S, hidden) at positions 0..S-1, float64 (spec 1.6): the
        window of W raw keys, the compressed rows c < (p + 1) // ratio (all of them: index_topk exceeds them),
        a per-head sink in the denominator, inverse RoPE, grouped o_proj."""
        cfg, lw = self.cfg, {k: v.double() for k, v in self.layers[layer].items() if torch.is_tensor(v)}
        r, N, D, R, W = self.dsa_ratio(layer), cfg.heads, cfg.dsa_head_dim, cfg.qk_rope, cfg.dsa_window
        x, S = h.double(), h.shape[0]
        cos, sin = (t.double() for t in self.dsa_rope_tables(S))

        def rms(v, wt=None):
            v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.eps)
            return v if wt is None else v * wt

        def rope(v, c, s):  # interleave pairs on the last R dims; c/s (rows, R)
            v = v.clone()
            while c.dim() < v.dim():
                c, s = c.unsqueeze(-2), s.unsqueeze(-2)
            a, b = v[..., -R:][..., 0::2].clone(), v[..., -R:][..., 1::2].clone()
            v[..., -R:][..., 0::2] = a * c[..., 0::2] - b * s[..., 0::2]
            v[..., -R:][..., 1::2] = b * c[..., 1::2] + a * s[..., 1::2]
            return v

        q = rope(rms((rms(x @ lw["wq_a"].T, lw["q_norm"]) @ lw["wq_b"].T).view(S, N, D)), cos, sin)
        kv = rope(rms(x @ lw["wkv"].T, lw["kv_norm"]), cos, sin)
        cmp = x.new_zeros(0, D)
        if r > 1:
            n, co = S // r, (2 if r == 4 else 1)
            if n:
                k_ = (x @ lw["cmp_wkv"].T)[: n * r].view(n, r, co * D)
                g_ = (x @ lw["cmp_wgate"].T)[: n * r].view(n, r, co * D) + lw["cmp_ape"][None]
                if co == 2:  # overlap: group c-1's first D columns, then group c's last D
                    k_ = torch.cat([torch.cat([k_.new_zeros(1, r, D), k_[:-1, :, :D]]), k_[:, :, D:]], 1)
                    g_ = torch.cat([torch.cat([g_.new_full((1, r, D), float("-inf")), g_[:-1, :, :D]]),
                                    g_[:, :, D:]], 1)
                y = rms((g_.softmax(1) * k_).sum(1), lw["cmp_norm"])
                pc = torch.arange(n) * r
                cmp = rope(y, cos[pc], sin[pc])
        out = torch.zeros(S, N, D, dtype=torch.float64)
        sink = lw["attn_sink"]
        for p in range(S):
            keys = torch.cat([kv[max(0, p - W + 1): p + 1], cmp[: (p + 1) // r] if r > 1 else cmp[:0]])
            lg = (q[p] @ keys.T) / math.sqrt(D)
            m = torch.maximum(lg.max(-1).values, sink)
            e = torch.exp(lg - m[:, None])
            out[p] = (e @ keys) / (torch.exp(sink - m) + e.sum(-1))[:, None]
        out = rope(out, cos, -sin)
        G = cfg.dsa_o_groups
        og = out.reshape(S, G, N * D // G)
        y = torch.einsum("tgi,gio->tgo", og, lw["wo_a"]).reshape(S, -1) @ lw["wo_b"].T
        return y.float()


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain full causal attention over one sequence: q (S, H, D), k/v (S, Hkv, D)."""
    s, h, _ = q.shape
    rep = h // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


# --------------------------------------------------------------------------- engine


@dataclass
class Request:
    rid: int
    arrival: int
    prompt: List[int]
    max_new: int
    blocks: List[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V is in the cache
    generated: List[int] = field(default_factory=list)
    chosen_logits: List[torch.Tensor] = field(default_factory=list)  # logits that picked each token
    reference_topk: dict = field(default_factory=dict)  # SFA: layer -> the reference indexer's (S, K) selection
    dsa_blocks: dict = field(default_factory=dict)  # DSA: KV-cache group kind -> the request's block ids

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt)

    @property
    def finished(self) -> bool:
        return len(self.generated) >= self.max_new

    @property
    def max_len(self) -> int:
        # The last generated token is never fed back, so it needs no cache slot.
        return len(self.prompt) + self.max_new - 1

    def token_at(self, pos: int) -> int:
        return self.prompt[pos] if pos < len(self.prompt) else self.generated[pos - len(self.prompt)]


class Progress:
    """tqdm when available, else a one-line progress on stderr."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.n, self.enabled, self._bar = total, 0, enabled, None
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc="generating", unit="tok", leave=True, file=sys.stderr)
        except ImportError:
            self._bar = None

    def update(self, n: int, **info) -> None:
        self.n += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix(info, refresh=False)
            self._bar.update(n)
        else:
            extra = " ".join(f"{k}={v}" for k, v in info.items())
            sys.stderr.write(f"\rgenerating {self.n}/{self.total} tokens {extra}".ljust(72))
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    build_ns: List[int] = field(default_factory=list)
    forward_ns: List[int] = field(default_factory=list)  # one entry per layer call
    states: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    mixed_steps: int = 0
    chunked_prefills: int = 0
    blocks_reused: int = 0
    context_chunks: int = 0  # MLA: context chunks gathered over all steps
    road_mismatches: int = 0  # DSA-CP: layer calls whose collectives were not their step's output road
    max_running: int = 0
    wall_s: float = 0.0


class Engine:
    def __init__(self, model: TinyLlama, args: argparse.Namespace):
        cfg = model.cfg
        self.model, self.args = model, args
        # The DCP group's aar.cp.Comm (--dcp > 1, GQA or SFA), or None.
        self.dcp = getattr(args, "dcp_comm", None) if cfg.attention in ("gqa", "sfa") else None
        # The DSA-CP group's aar.cp.Comm (--dsa-cp > 1, DSA), or None.
        self.dsa_cp = getattr(args, "dsa_cp_comm", None) if cfg.attention == "dsa" else None
        # The DSA DCP group's aar.cp.Comm (--dcp > 1, DSA; also its TP group), or None.
        self.dsa_dcp = getattr(args, "dcp_comm", None) if cfg.attention == "dsa" else None
        W = self.dcp.size if self.dcp is not None else 1
        self.bs = args.block_size
        self.max_blocks_per_req = args.max_blocks_per_req
        sizes = dict(max_num_reqs=args.max_running, max_num_tokens=max(args.token_budget, args.max_running),
                     max_blocks_per_req=self.max_blocks_per_req, block_size=self.bs, num_blocks=args.num_blocks)
        self.mla = cfg.attention == "mla"
        self.sfa = cfg.attention == "sfa"
        self.dsa = cfg.attention == "dsa"
        if self.dsa:
            self._init_dsa(model, args)
        elif self.sfa:
            # Rotary rows by global position: under DCP a table row spans bs * W positions.
            cos, sin = model.mla_rope_tables(self.max_blocks_per_req * self.bs * W)
            # DCP: the builder computes this rank's latent slots (token x on rank (x // I) % W, I = 1 here, at
            # local index x // W through the group's table) and the replicated indexer's table and slots.
            dcp_kw = {} if self.dcp is None else dict(dcp_world_size=W, dcp_rank=self.dcp.rank,
                                                      cp_kv_cache_interleave_size=1)
            self.builder = aar.sfa.MetadataBuilder(**sizes, cos_table=cos, sin_table=sin, **dcp_kw)
            names = TinyLlama.MLA_WEIGHTS
            self.impls = []
            for i, lw in enumerate(model.layers):
                idx = {}
                if model.has_indexer(i):
                    idx = dict(index_n_head=cfg.index_heads, index_head_dim=cfg.index_dim,
                               index_topk=cfg.index_topk, indexer_k_norm_eps=cfg.eps, use_index_cache=True,
                               **{k: lw[k] for k in TinyLlama.INDEXER_WEIGHTS})
                self.impls.append(
                    aar.sfa.Impl(num_heads=cfg.heads, hidden_size=cfg.hidden, q_lora_rank=cfg.q_lora_rank,
                                 kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope,
                                 qk_rope_head_dim=cfg.qk_rope, v_head_dim=cfg.v_head, q_norm_eps=cfg.eps,
                                 kv_norm_eps=cfg.eps, layer_index=i, dcp_comm=self.dcp, **idx,
                                 **{k: lw[k] for k in names}))
            shapes = aar.mla.Backend.kv_cache_shapes(args.num_blocks, self.bs, cfg.kv_lora_rank, cfg.qk_rope)
            # The indexer's keys are a KV-cache group of their own sharing the main group's block ids. Under DCP
            # the indexer cache is replicated (every rank holds every key): num_blocks * W blocks.
            idx_shape = aar.sfa.IndexerBackend.cache_shapes(args.num_blocks * W, self.bs, False,
                                                            index_head_dim=cfg.index_dim)[0]
            self.caches = [
                [torch.zeros(sh) for sh in shapes] + ([torch.zeros(idx_shape)] if model.has_indexer(i) else [])
                for i in range(cfg.layers)
            ]
            self.topk = aar.sfa.TopkBuffer(sizes["max_num_tokens"], cfg.index_topk)
        elif self.mla:
            cos, sin = model.mla_rope_tables(self.max_blocks_per_req * self.bs)
            # A small chunked-prefill workspace: a later prefill chunk gathers its cached context in chunks.
            self.builder = aar.mla.MetadataBuilder(**sizes, cos_table=cos, sin_table=sin,
                                                   workspace_tokens=args.mla_workspace)
            names = TinyLlama.MLA_WEIGHTS
            self.impls = [
                aar.mla.Impl(num_heads=cfg.heads, hidden_size=cfg.hidden, q_lora_rank=cfg.q_lora_rank,
                             kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope,
                             qk_rope_head_dim=cfg.qk_rope, v_head_dim=cfg.v_head, q_norm_eps=cfg.eps,
                             kv_norm_eps=cfg.eps, layer_index=i, **{k: lw[k] for k in names})
                for i, lw in enumerate(model.layers)
            ]
            shapes = aar.mla.Backend.kv_cache_shapes(args.num_blocks, self.bs, cfg.kv_lora_rank, cfg.qk_rope)
            self.caches = [tuple(torch.zeros(sh) for sh in shapes) for _ in range(cfg.layers)]
        elif self.dcp is not None:
            comm = self.dcp
            W = comm.size
            if (cfg.heads // cfg.kv_heads) % W:
                raise ValueError(f"--dcp {W}: query heads per KV head ({cfg.heads // cfg.kv_heads}) must be "
                                 f"divisible by the DCP size (spec cp.md 1.1)")
            self.builder = aar.DcpMetadataBuilder(**sizes, dcp_world=W, dcp_rank=comm.rank)
            self.impls = [aar.DcpAttentionImpl(comm, cfg.heads // W, cfg.head_size, num_kv_heads=cfg.kv_heads)
                          for _ in range(cfg.layers)]
            self.caches = [
                (
                    torch.zeros(args.num_blocks, self.bs, cfg.kv_heads, cfg.head_size),
                    torch.zeros(args.num_blocks, self.bs, cfg.kv_heads, cfg.head_size),
                )
                for _ in range(cfg.layers)
            ]
        else:
            self.builder = aar.MetadataBuilder(**sizes)
            self.impls = [aar.AttentionImpl(cfg.heads, cfg.head_size, num_kv_heads=cfg.kv_heads)
                          for _ in range(cfg.layers)]
            self.caches = [
                (
                    torch.zeros(args.num_blocks, self.bs, cfg.kv_heads, cfg.head_size),
                    torch.zeros(args.num_blocks, self.bs, cfg.kv_heads, cfg.head_size),
                )
                for _ in range(cfg.layers)
            ]
        # The engine's block table lives in the builder's staging buffer: build() then copies nothing.
        if self.dcp is not None and not self.sfa:
            self.block_table = torch.zeros(args.max_running, self.max_blocks_per_req, dtype=torch.int32)
        elif not self.dsa:
            self.block_table = self.builder.block_table_staging
        # Block 0 is kept out of the pool (the dummy/padding block). LIFO pool:
        # blocks freed by a finished request are the next ones handed out.
        self.free_blocks = list(range(args.num_blocks - 1, 0, -1))
        self.ever_allocated = set()
        self.stats = EngineStats()
        self.topk_log = {}  # SFA: (request id, layer, position) -> the indexer's selection

    # -- DSA: one StepBuilder, one GroupBuilder and one block pool per KV-cache group
    DSA_CBS = 32  # cache block size (spec 6.2): SWA 32 raw tokens/block, C4 KV 128, C128 KV 4096, states 2 / 8

    def _init_dsa(self, model: TinyLlama, args: argparse.Namespace) -> None:
        cfg = model.cfg
        ratios = [model.dsa_ratio(i) for i in range(cfg.layers)]
        kinds = ["swa"]
        if 4 in ratios:
            kinds += ["c4_kv", "c4_attn_state", "c4_indexer_k", "c4_indexer_state"]
        if 128 in ratios:
            kinds += ["c128_kv", "c128_state"]
        max_len = args.max_prompt + args.max_new_tokens
        cos, sin = model.dsa_rope_tables(max_len + 1)
        max_tokens = max(args.token_budget, args.max_running)
        # DSA-CP (docs/design/sparse_cp.md §10): the step builder splits each step's tokens over the group and
        # gives this rank's slice its local lengths and RoPE rows; the groups keep the whole step's slots.
        comm = self.dsa_cp
        cp_kw = {} if comm is None else dict(dsa_cp_world_size=comm.size, dsa_cp_rank=comm.rank)
        # DCP (docs/design/sparse_cp.md §12): the SWA and compressed-KV groups get this rank's local slots (its
        # local block table is a prefix of the request's blocks), the indexer and state groups stay whole.
        dcp = self.dsa_dcp
        if dcp is not None:
            cp_kw = dict(dcp_world_size=dcp.size, dcp_rank=dcp.rank, dcp_interleave=1)
        # The model's settings, once: every group builder reads them from the step builder.
        self.builder = aar.dsa.StepBuilder(max_num_reqs=args.max_running, max_num_tokens=max_tokens, cos_table=cos,
                                           sin_table=sin, compress_cos_table=cos, compress_sin_table=sin,
                                           head_dim=cfg.dsa_head_dim, window=cfg.dsa_window, num_heads_q=cfg.heads,
                                           index_topk=cfg.dsa_index_topk, index_n_heads=cfg.index_heads,
                                           index_head_dim=cfg.index_dim, **cp_kw)
        self.dsa_kinds, self.dsa_groups, self.dsa_tables, self.dsa_pools, self.dsa_bs = kinds, {}, {}, {}, {}
        self.dsa_row_owner = {}  # batch row -> the request whose block ids it holds
        for kd in kinds:
            sp = aar.dsa.cache_spec(kd, self.DSA_CBS, device_kind="a2", model_dtype="bfloat16")
            bs = sp["block_size"]
            need = -(-max_len // bs)
            nb = args.max_running * need + 1  # block 0 reserved; each group's pool fits max_running requests
            self.dsa_bs[kd] = bs
            self.dsa_groups[kd] = aar.dsa.GroupBuilder(
                self.builder, kind=kd, cache_block_size=self.DSA_CBS, device_kind="a2", model_dtype="bfloat16",
                max_blocks_per_req=need, num_blocks=nb)
            # The engine's table of this group lives in the builder's staging rows (zero copy, as for the
            # other backends): a request's row is written when it is scheduled into a new batch row.
            self.dsa_tables[kd] = self.dsa_groups[kd].block_table_staging
            self.dsa_pools[kd] = list(range(nb - 1, 0, -1))
        # Each group's cache as the runtime shapes it for this model's dims (GroupBuilder.cache_spec).
        spec = {kd: g.cache_spec for kd, g in self.dsa_groups.items()}
        self.impls, self.caches = [], []
        for i, lw in enumerate(model.layers):
            r = ratios[i]
            ws = {k: lw[k] for k in TinyLlama.DSA_WEIGHTS if k in lw}
            impl_kw = {}
            if comm is not None:
                # Every head's query weights, this rank's row-parallel o_proj shard: wo_a's groups
                # [rank G/W, (rank+1) G/W) and wo_b's columns of those groups (the full weights are gathered
                # into the layer's pools for the prefill road's o_proj).
                g = cfg.dsa_o_groups // comm.size
                ws["wo_a"] = lw["wo_a"][comm.rank * g:(comm.rank + 1) * g].contiguous()
                ws["wo_b"] = lw["wo_b"][:, comm.rank * g * cfg.dsa_o_lora:(comm.rank + 1) * g * cfg.dsa_o_lora]
                ws["wo_b"] = ws["wo_b"].contiguous()
                impl_kw = dict(dsa_cp_comm=comm, dsa_cp_full_o_proj_prefill=True)
            heads, groups = cfg.heads, cfg.dsa_o_groups
            if dcp is not None:
                # The TP shard of this rank: its heads' wq_b rows and sinks, its o_proj groups / columns; the
                # layer returns a partial sum (attend_dsa all-reduces it).
                heads, groups = cfg.heads // dcp.size, cfg.dsa_o_groups // dcp.size
                h, D, g, ol = heads, cfg.dsa_head_dim, groups, cfg.dsa_o_lora
                ws["wq_b"] = lw["wq_b"][dcp.rank * h * D:(dcp.rank + 1) * h * D].contiguous()
                ws["attn_sink"] = lw["attn_sink"][dcp.rank * h:(dcp.rank + 1) * h].contiguous()
                ws["wo_a"] = lw["wo_a"][dcp.rank * g:(dcp.rank + 1) * g].contiguous()
                ws["wo_b"] = lw["wo_b"][:, dcp.rank * g * ol:(dcp.rank + 1) * g * ol].contiguous()
                impl_kw = dict(dcp_comm=dcp)
            self.impls.append(aar.dsa.Impl(
                ws, hidden_size=cfg.hidden, num_heads=heads,
                head_dim=cfg.dsa_head_dim, rope_dim=cfg.qk_rope, q_lora_rank=cfg.q_lora_rank,
                compress_ratio=r, index_n_heads=cfg.index_heads, index_head_dim=cfg.index_dim,
                index_topk=cfg.dsa_index_topk, eps=cfg.eps, o_groups=groups, o_lora_rank=cfg.dsa_o_lora,
                layer_index=i, **impl_kw))
            # float32 KV rows (the model's dtype here; the spec's bf16 is the production one), int8 / fp16 indexer
            z = lambda kd, key="shape", dt=torch.float32: torch.zeros(spec[kd][key], dtype=dt)
            ck = {4: "c4", 128: "c128"}.get(r)
            cmp = z(f"{ck}_kv") if ck else None
            state = z("c4_attn_state" if r == 4 else "c128_state") if ck else None
            ist = ik = isc = None
            if r == 4:
                ist, ik = z("c4_indexer_state"), z("c4_indexer_k", dt=torch.int8)
                isc = z("c4_indexer_k", "scale_shape", torch.float16)
            self.caches.append(aar.dsa.compose_kv_cache(compress_kv=cmp, swa_kv=z("swa"), state=state,
                                                        indexer_state=ist, indexer_k=ik, indexer_scale=isc))

    def _dsa_admit(self, r: Request) -> bool:
        need = {kd: -(-r.max_len // bs) for kd, bs in self.dsa_bs.items()}
        if any(n > len(self.dsa_pools[kd]) for kd, n in need.items()):
            return False
        r.dsa_blocks = {}
        for kd, n in need.items():
            got = [self.dsa_pools[kd].pop() for _ in range(n)]
            if any(b in self.ever_allocated for b in got[:1]) and kd == "swa":
                self.stats.blocks_reused += 1
            if kd == "swa":
                self.ever_allocated.update(got)
            r.dsa_blocks[kd] = got
        return True

    def _dsa_write_tables(self, sched) -> None:
        """Each scheduled request's block ids into its batch row of every group's staging table. A request's
        blocks are fixed at admission, so a row is rewritten only when another request takes it."""
        for i, (r, _ql) in enumerate(sched):
            if self.dsa_row_owner.get(i) == r.rid:
                continue
            self.dsa_row_owner[i] = r.rid
            for kd in self.dsa_kinds:
                self.dsa_tables[kd][i, : len(r.dsa_blocks[kd])] = torch.tensor(r.dsa_blocks[kd], dtype=torch.int32)

    def _dsa_metadata(self, sched, qsl, seq_lens):
        step = self.builder.build(qsl, seq_lens)
        n = len(sched)
        # A view of the staging rows: build() copies nothing.
        md = {kd: self.dsa_groups[kd].build(step, self.dsa_tables[kd][:n]) for kd in self.dsa_kinds}
        return step, md

    # -- pool
    def _admit(self, r: Request) -> bool:
        if self.dsa:
            return self._dsa_admit(r)
        # Under DCP a block holds bs tokens on each of W ranks (a virtual block of bs*W, spec cp.md 1.2).
        span = self.bs * (self.dcp.size if self.dcp is not None else 1)
        need = -(-r.max_len // span)
        if need > self.max_blocks_per_req:
            raise ValueError(f"request {r.rid} needs {need} blocks > max_blocks_per_req={self.max_blocks_per_req}")
        if need > self.args.num_blocks - 1:
            raise ValueError(f"request {r.rid} needs {need} blocks, more than the pool holds "
                             f"(num_blocks={self.args.num_blocks}, block 0 reserved)")
        if need > len(self.free_blocks):
            return False
        for _ in range(need):
            b = self.free_blocks.pop()
            if b in self.ever_allocated:
                self.stats.blocks_reused += 1
            self.ever_allocated.add(b)
            r.blocks.append(b)
        return True

    def _release(self, r: Request) -> None:
        if self.dsa:
            for kd, got in r.dsa_blocks.items():
                self.dsa_pools[kd].extend(reversed(got))
            r.dsa_blocks = {}
            return
        self.free_blocks.extend(reversed(r.blocks))
        r.blocks = []

    # -- one step
    def _schedule(self, running: List[Request]):
        decodes = [r for r in running if not r.prefilling]
        sched = [(r, 1) for r in decodes]
        budget = self.args.token_budget - len(decodes)
        for r in running:
            if r.prefilling and budget > 0:
                chunk = min(len(r.prompt) - r.num_computed, budget)
                if chunk < len(r.prompt) - r.num_computed or r.num_computed > 0:
                    self.stats.chunked_prefills += 1
                sched.append((r, chunk))
                budget -= chunk
        if decodes and len(sched) > len(decodes):
            self.stats.mixed_steps += 1
        return sched

    def step(self, sched) -> int:
        n = len(sched)
        q_lens = [ql for _, ql in sched]
        tokens, positions = [], []
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        seq_lens = torch.empty(n, dtype=torch.int32)
        for i, (r, ql) in enumerate(sched):
            start = r.num_computed
            positions.extend(range(start, start + ql))
            tokens.extend(r.token_at(p) for p in range(start, start + ql))
            qsl[i + 1] = qsl[i] + ql
            seq_lens[i] = start + ql
            if not self.dsa:
                self.block_table[i, : len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        if self.dsa:
            self._dsa_write_tables(sched)
        tokens_t = torch.tensor(tokens, dtype=torch.long)
        positions_t = torch.tensor(positions, dtype=torch.long)

        t0 = time.perf_counter_ns()
        if self.dsa:
            md, dsa_md = self._dsa_metadata(sched, qsl, seq_lens)
            dsa_routed = {}  # compress ratio -> this step's route_layer result, shared by its layers
        else:
            block_table = self.block_table[:n]  # a view of the staging buffer: build() copies nothing
            if self.dcp is not None and not self.sfa:
                prefilling = torch.tensor([r.prefilling for r, _ in sched], dtype=torch.bool)
                md = self.builder.build(qsl, seq_lens, block_table, is_prefilling=prefilling)
            else:
                md = self.builder.build(qsl, seq_lens, block_table)
        self.stats.build_ns.append(time.perf_counter_ns() - t0)
        state = str(md.attn_state).rsplit(".", 1)[-1]
        if self.dsa_cp is not None:
            state = "DSA-CP " + state
        if self.dsa_dcp is not None:
            state = "DCP " + state
        if self.dcp is not None:
            state = "DCP " + (state if self.sfa else " + ".join(
                (["decode"] if md.num_decodes else []) +
                (["prefill with context" if md.has_context else "fresh prefill"] if md.num_prefills else [])))
        self.stats.states[state] = self.stats.states.get(state, 0) + 1

        cfg = self.model.cfg
        t = len(tokens)

        def attend_dcp(layer, q, k, v):
            # Rank rd holds, for each KV head, its share of that head's query heads
            # (local head h uses KV head h // (G/W), cp/gqa_dcp.h); outputs are gathered back.
            W, rd, G = self.dcp.size, self.dcp.rank, cfg.heads // cfg.kv_heads
            mine = q.view(t, cfg.kv_heads, W, G // W, cfg.head_size)[:, :, rd].reshape(t, -1, cfg.head_size)
            out = torch.empty_like(mine)
            kc, vc = self.caches[layer]
            t1 = time.perf_counter_ns()
            self.impls[layer].forward(mine, k, v, kc, vc, md, out)
            self.stats.forward_ns.append(time.perf_counter_ns() - t1)
            self.stats.paths["dcp"] = self.stats.paths.get("dcp", 0) + 1
            full = self.dcp.all_gather(out, 1).view(t, W, cfg.kv_heads, G // W, cfg.head_size)
            return full.permute(0, 2, 1, 3, 4).reshape(t, cfg.heads, cfg.head_size)

        def attend(layer, q, k, v):
            out = torch.empty(t, cfg.heads, cfg.head_size)
            kc, vc = self.caches[layer]
            impl = self.impls[layer]
            t1 = time.perf_counter_ns()
            impl.forward(q, k, v, kc, vc, md, out)
            self.stats.forward_ns.append(time.perf_counter_ns() - t1)
            self.stats.paths[impl.last_path] = self.stats.paths.get(impl.last_path, 0) + 1
            return out

        def attend_mla(layer, h, _positions):
            out = torch.empty(t, cfg.hidden)
            nope, rope = self.caches[layer]
            impl = self.impls[layer]
            t1 = time.perf_counter_ns()
            impl.forward(h, nope, rope, md, out)
            self.stats.forward_ns.append(time.perf_counter_ns() - t1)
            parts = ([f"decode ({impl.last_decode_path})"] if md.num_decodes else []) + (
                ["prefill"] if md.num_prefills else [])
            key = " + ".join(parts)
            self.stats.paths[key] = self.stats.paths.get(key, 0) + 1
            return out

        def attend_sfa(layer, h, _positions):
            out = torch.empty(t, cfg.hidden)
            impl = self.impls[layer]
            t1 = time.perf_counter_ns()
            impl.forward(h, self.caches[layer], md, out, self.topk)
            self.stats.forward_ns.append(time.perf_counter_ns() - t1)
            key = f"sparse, top-k {impl.last_topk_source}"
            self.stats.paths[key] = self.stats.paths.get(key, 0) + 1
            if impl.last_topk_source == "indexer":
                # The rows the indexer selected, by (request, position), for the comparison with the reference.
                rows = impl.last_topk[:, 0]
                i = 0
                for r, ql in sched:
                    for p in range(r.num_computed, r.num_computed + ql):
                        self.topk_log[(r.rid, layer, p)] = rows[i].tolist()
                        i += 1
            return out

        def attend_dsa(layer, h, _positions):
            out = torch.empty(t, cfg.hidden)
            impl = self.impls[layer]
            r = impl.compress_ratio
            # Spec 6.4: the groups this layer reads, picked by cache kind from the step's groups and checked
            # once per step and ratio; forward takes the routed metadata as it is.
            if r not in dsa_routed:
                dsa_routed[r] = aar.dsa.route_layer(r, md, dsa_md)
            comm = self.dsa_cp
            dcp = self.dsa_dcp
            for c in (comm, dcp):
                if c is not None:
                    c.reset_counters()
            t1 = time.perf_counter_ns()
            impl.forward(h, self.caches[layer], dsa_routed[r], out)
            self.stats.forward_ns.append(time.perf_counter_ns() - t1)
            key = {1: "SWA", 4: "C4 (indexer top-k)", 128: "C128"}[r]
            if dcp is not None:
                # docs/design/sparse_cp.md §12.2: the query heads' all-gather and the partials' all-to-all, in every
                # step; then the TP reduction of this rank's o_proj partial sum (the model's, not the layer's).
                calls = tuple(dcp.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
                if calls != (1, 1, 0):
                    self.stats.road_mismatches += 1
                    key += f" [collectives {calls}]"
                dcp.all_reduce(out)
            if comm is not None:
                # The output road this layer call took, told by its collectives (sparse_cp.md §10.2): decode
                # steps all-to-all the heads and all-reduce the o_proj shards' partial sums, steps with prefills
                # gather wo_a, wo_b and the slices' outputs.
                calls = tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
                road = {(0, 1, 1): "decode road", (3, 0, 0): "prefill road"}.get(calls, f"collectives {calls}")
                decode = md.attn_state in (aar.AttentionState.DecodeOnly, aar.AttentionState.SpecDecoding)
                if road != ("decode road" if decode else "prefill road"):
                    self.stats.road_mismatches += 1
                key += f" [{road}]"
            self.stats.paths[key] = self.stats.paths.get(key, 0) + 1
            if r == 4:
                # The selection rows of the tokens this layer attended for: the whole step, or under DSA-CP this
                # rank's slice [local_start, local_end) of the step's tokens (padding rows past the real ones).
                rows = impl.last_topk[:, 0]
                lo = md.local_start if comm is not None else 0
                keys = [(rq.rid, p) for rq, ql in sched for p in range(rq.num_computed, rq.num_computed + ql)]
                for i in range(min(rows.shape[0], len(keys) - lo)):
                    rid, p = keys[lo + i]
                    self.topk_log[(rid, layer, p)] = sorted(e for e in rows[i].tolist() if e >= 0)
            return out

        if self.mla:
            self.stats.context_chunks += md.num_context_chunks

        attend_fn = attend_dsa if self.dsa else (attend_sfa if self.sfa else (attend_mla if self.mla else attend))
        if self.dcp is not None and not self.sfa:
            attend_fn = attend_dcp
        hidden = self.model.forward(tokens_t, positions_t, attend_fn)

        # Sample where a request's last scheduled token is its last known token.
        rows, owners = [], []
        end = 0
        for r, ql in sched:
            end += ql
            if r.num_computed + ql >= len(r.prompt):
                rows.append(end - 1)
                owners.append(r)
        new_tokens = 0
        if rows:
            logits = self.model.logits(hidden[rows])
            for r, lg in zip(owners, logits):
                r.generated.append(int(lg.argmax()))
                r.chosen_logits.append(lg.clone())
                new_tokens += 1
        for r, ql in sched:
            if r.prefilling:
                self.stats.prompt_tokens += ql
            r.num_computed += ql
        self.stats.generated_tokens += new_tokens
        return new_tokens

    def run(self, requests: List[Request], max_steps: Optional[int], progress: Progress) -> None:
        waiting = sorted(requests, key=lambda r: (r.arrival, r.rid))
        running: List[Request] = []
        t_start = time.perf_counter()
        step = 0
        while (waiting or running) and (max_steps is None or step < max_steps):
            while waiting and waiting[0].arrival <= step and len(running) < self.args.max_running:
                if not self._admit(waiting[0]):
                    break
                running.append(waiting.pop(0))
            self.stats.max_running = max(self.stats.max_running, len(running))
            if running:
                sched = self._schedule(running)
                new = self.step(sched)
                for r in [r for r in running if r.finished]:
                    running.remove(r)
                    self._release(r)
                progress.update(new, running=len(running), waiting=len(waiting))
            step += 1
        self.stats.steps = step
        self.stats.wall_s = time.perf_counter() - t_start


# --------------------------------------------------------------------------- reference


def dense_reference(model: TinyLlama, req: Request):
    """The request's whole sequence through the stack with dense causal attention, no cache.

    One causal pass over prompt + generated[:-1] gives, at every position, the
    logits a cache-free greedy decoder would compute there (position p sees
    tokens 0..p only). So if the argmax at each sampling position equals the
    token the engine fed next, cache-free greedy generation reproduces the
    engine's tokens exactly (by induction over the generated tokens).
    Returns (greedy tokens, their logits), one per generated token.
    """
    scale = 1.0 / math.sqrt(model.cfg.head_size)
    seq = req.prompt + req.generated[:-1]
    toks = torch.tensor(seq, dtype=torch.long)
    pos = torch.arange(len(seq), dtype=torch.long)
    if model.cfg.attention == "mla":
        hidden = model.forward(toks, pos, model.mla_dense_attention)
    elif model.cfg.attention == "dsa":
        hidden = model.forward(toks, pos, model.dsa_dense_attention)
    elif model.cfg.attention == "sfa":
        selections = {}

        def attend(layer, h, positions):
            out = model.sfa_dense_attention(layer, h, positions)
            if model.has_indexer(layer):
                selections[layer] = model._sfa_topk
            return out

        hidden = model.forward(toks, pos, attend)
        req.reference_topk = selections
    else:
        hidden = model.forward(toks, pos, lambda _l, q, k, v: dense_causal_attention(q, k, v, scale))
    logits = model.logits(hidden[len(req.prompt) - 1 :])
    return logits.argmax(-1).tolist(), list(logits)


# --------------------------------------------------------------------------- driver


def make_requests(args: argparse.Namespace, vocab: int) -> List[Request]:
    g = torch.Generator().manual_seed(args.seed + 1)
    lo, hi = args.min_prompt, args.max_prompt
    # Lengths spread evenly over [lo, hi], arriving in shuffled order, so short and long prompts mix.
    lengths = [int(round(lo + i / max(1, args.requests - 1) * (hi - lo))) for i in range(args.requests)]
    order = torch.randperm(len(lengths), generator=g).tolist()
    out = []
    for rid, idx in enumerate(order):
        plen = lengths[idx]
        prompt = torch.randint(0, vocab, (plen,), generator=g).tolist()
        arrival = rid * args.arrival_every
        out.append(Request(rid=rid, arrival=arrival, prompt=prompt, max_new=args.max_new_tokens))
    return out


def _us(ns_values: List[int]):
    if not ns_values:
        return float("nan"), float("nan")
    return statistics.fmean(ns_values) / 1e3, statistics.median(ns_values) / 1e3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attention", choices=("gqa", "mla", "sfa", "dsa"), default="gqa",
                   help="GQA layers (default), DeepSeek-style MLA layers (the MLA backend), or DeepSeek-V3.2 sparse "
                        "attention (the SFA backend), or DeepSeek-V4 attention (the DSA backend: SWA / C4 / C128 layers)")
    p.add_argument("--mla-workspace", type=int, default=48,
                   help="MLA chunked-prefill workspace in tokens (small: context gathered in several chunks)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many engine steps (default: until done)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-size", type=int, default=32)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--min-prompt", type=int, default=5)
    p.add_argument("--max-prompt", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--arrival-every", type=int, default=1, help="request i arrives at step i*N")
    p.add_argument("--token-budget", type=int, default=64, help="tokens per step (decodes first, then chunks)")
    p.add_argument("--max-running", type=int, default=6, help="requests in flight at once")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=40, help="KV blocks per layer (block 0 is reserved)")
    p.add_argument("--max-blocks-per-req", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1; 0: torch default)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dcp", type=int, default=1,
                   help="GQA, SFA or DSA: decode context parallel over this many local processes (gloo; DSA: also "
                        "the TP group, each rank its heads); rank 0 also runs the single-rank engine and compares "
                        "the greedy tokens")
    p.add_argument("--dsa-cp", type=int, default=1,
                   help="DSA: DSA-CP (the step's tokens split over this many local processes, gloo; every rank holds "
                        "every head's query weights and its o_proj shard); rank 0 also runs the single-rank engine "
                        "and compares the greedy tokens")


# The context-parallel runs: flag -> (the attention backends it serves, the Comm's name in args, the run's name).
CP_FLAGS = {
    "dcp": (("gqa", "sfa", "dsa"), "dcp_comm", "DCP"),
    "dsa_cp": (("dsa",), "dsa_cp_comm", "DSA-CP"),
}


def _cp_rank(rank: int, world: int, init_file: str, args: argparse.Namespace, flag: str) -> None:
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    setattr(args, CP_FLAGS[flag][1], aar.cp.Comm(dist.group.WORLD, timeout_s=120.0))
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # rank 0 reports
        args.no_progress = True
    code = run(args)
    if code:
        sys.exit(code)


def _check_cp_flags(args: argparse.Namespace) -> Optional[str]:
    """The context-parallel flag this run uses ('dcp', 'dsa_cp' or None); flags that make no sense together
    raise by name, before any process is spawned."""
    sizes = {f: getattr(args, f, 1) for f in CP_FLAGS}
    for f, n in sizes.items():
        if n < 1:
            raise SystemExit(f"--{f.replace('_', '-')} must be >= 1, got {n}")
    on = [f for f, n in sizes.items() if n > 1]
    if len(on) > 1:
        raise SystemExit(" and ".join(f"--{f.replace('_', '-')} {sizes[f]}" for f in on) +
                         ": the context-parallel modes are not combined")
    if not on:
        return None
    flag = on[0]
    backends = CP_FLAGS[flag][0]
    if args.attention not in backends:
        raise SystemExit(f"--{flag.replace('_', '-')} is implemented for --attention {', '.join(backends)} only, "
                         f"got --attention {args.attention}")
    if args.attention == "dsa":
        # docs/design/sparse_cp.md §10 and §12: a rank's o_proj shard (and under DCP its heads) holds whole heads
        # and whole groups.
        W, groups, name = sizes[flag], ModelConfig().dsa_o_groups, flag.replace("_", "-")
        if args.heads % W or groups % W:
            raise SystemExit(f"--{name} {W} must divide the heads (--heads {args.heads}) and the o_proj groups "
                             f"({groups})")
    return flag


def _run_cp(args: argparse.Namespace, flag: str) -> int:
    """Run the demo on getattr(args, flag) local processes (gloo), each with the group's aar.cp.Comm in args."""
    import os
    import tempfile

    import torch.multiprocessing as mp

    world = getattr(args, flag)
    setattr(args, flag, 1)  # the ranks run the ordinary driver with a Comm
    name = CP_FLAGS[flag][2]
    with tempfile.TemporaryDirectory(prefix=f"aar_demo_{flag}_") as tmp:
        try:
            mp.spawn(_cp_rank, args=(world, os.path.join(tmp, "store"), args, flag), nprocs=world, join=True)
        except mp.ProcessExitedException as e:  # a rank's run() failed (it printed why)
            print(f"{name} demo: {e}", file=sys.stderr)
            return 1
    return 0


def run(args: argparse.Namespace) -> int:
    flag = _check_cp_flags(args)
    if flag is not None:
        return _run_cp(args, flag)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    cfg = ModelConfig(
        vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
        head_size=args.head_size, attention=args.attention,
    )
    model = TinyLlama(cfg, seed=args.seed)
    requests = make_requests(args, cfg.vocab)
    aar.set_provider("auto")

    if cfg.attention == "dsa":
        kinds = {1: "SWA", 4: "C4", 128: "C128"}
        heads = (f"DSA {cfg.heads} heads x {cfg.dsa_head_dim} (rope {cfg.qk_rope}, window {cfg.dsa_window}; layers "
                 f"{'/'.join(kinds[model.dsa_ratio(i)] for i in range(cfg.layers))}; C4 indexer "
                 f"{cfg.index_heads}x{cfg.index_dim}, top-k {cfg.dsa_index_topk}; o_proj {cfg.dsa_o_groups} groups)")
        comm = getattr(args, "dsa_cp_comm", None)
        if comm is not None:
            g = cfg.dsa_o_groups // comm.size
            heads += (f", DSA-CP {comm.size} (this rank: every head's query, 1/{comm.size} of every step's tokens, "
                      f"o_proj groups [{comm.rank * g}, {(comm.rank + 1) * g}) of {cfg.dsa_o_groups})")
        comm = getattr(args, "dcp_comm", None)
        if comm is not None:
            h = cfg.heads // comm.size
            heads += (f", DCP {comm.size} (this rank: heads [{comm.rank * h}, {(comm.rank + 1) * h}) and their o_proj "
                      f"shard, 1/{comm.size} of every sequence's SWA and compressed KV, the indexer keys and "
                      f"compressor states replicated)")
    elif cfg.attention == "sfa":
        heads = (f"SFA {cfg.heads} heads (MLA latent {cfg.kv_lora_rank}, nope/rope/v {cfg.qk_nope}/{cfg.qk_rope}/"
                 f"{cfg.v_head}; lightning indexer {cfg.index_heads}x{cfg.index_dim} on even layers, top-k "
                 f"{cfg.index_topk}, odd layers reuse it)")
        if getattr(args, "dcp_comm", None) is not None:
            heads += (f", DCP {args.dcp_comm.size} (this rank: all {cfg.heads} heads, 1/{args.dcp_comm.size} of "
                      f"every sequence's latent KV, the indexer keys replicated)")
    elif cfg.attention == "mla":
        heads = (f"MLA {cfg.heads} heads (q-LoRA {cfg.q_lora_rank}, latent {cfg.kv_lora_rank}, nope/rope/v "
                 f"{cfg.qk_nope}/{cfg.qk_rope}/{cfg.v_head}, chunked-prefill workspace {args.mla_workspace} tokens)")
    else:
        heads = f"{cfg.heads} query / {cfg.kv_heads} KV heads x {cfg.head_size}"
        if getattr(args, "dcp_comm", None) is not None:
            heads += f", DCP {args.dcp_comm.size} (this rank: {cfg.heads // args.dcp_comm.size} query heads, 1/" \
                     f"{args.dcp_comm.size} of every sequence's KV)"
    print(
        f"ascend_attn_rt demo: {cfg.layers} layers, hidden {cfg.hidden}, {heads}, vocab {cfg.vocab}, fp32, "
        f"provider '{aar.get_provider()}'"
    )
    print(
        f"  {len(requests)} requests, prompts {min(len(r.prompt) for r in requests)}.."
        f"{max(len(r.prompt) for r in requests)} tokens, {args.max_new_tokens} new tokens each, "
        f"token budget {args.token_budget}/step, "
        + (f"cache block size {Engine.DSA_CBS} (a block pool per KV-cache group), " if cfg.attention == "dsa" else
           f"block size {args.block_size}, {args.num_blocks} blocks/layer, ")
        + f"at most {args.max_running} in flight"
    )

    with torch.inference_mode():
        engine = Engine(model, args)
        progress = Progress(sum(r.max_new for r in requests), enabled=not args.no_progress)
        try:
            engine.run(requests, args.steps, progress)
        finally:
            progress.close()

        t_ref = time.perf_counter()
        max_diff, mismatches = 0.0, []
        topk_checked, topk_mismatches = 0, 0
        for r in requests:
            if not r.generated:
                continue
            ref_tokens, ref_logits = dense_reference(model, r)
            if cfg.attention == "dsa":
                # Every C4 selection is the full set of visible compressed rows (index_topk exceeds them).
                for (rid, layer, p), got in engine.topk_log.items():
                    if rid != r.rid:
                        continue
                    topk_checked += 1
                    if got != list(range(min((p + 1) // 4, cfg.dsa_index_topk))):
                        topk_mismatches += 1
            if cfg.attention == "sfa":
                # Every selection the runtime's indexers made equals the reference's (same rule, float64).
                for layer, sel in r.reference_topk.items():
                    for p in range(sel.shape[0]):
                        got = engine.topk_log.get((r.rid, layer, p))
                        if got is None:
                            continue
                        topk_checked += 1
                        if got != sel[p].tolist():
                            topk_mismatches += 1
            if ref_tokens != r.generated:
                first = next(i for i, (a, b) in enumerate(zip(ref_tokens, r.generated)) if a != b)
                mismatches.append((r.rid, first, r.generated[first], ref_tokens[first]))
            for a, b in zip(r.chosen_logits, ref_logits):
                max_diff = max(max_diff, float((a - b).abs().max()))
        ref_s = time.perf_counter() - t_ref

        single_match = None
        cp_comm, cp_name = ((engine.dcp, "DCP") if engine.dcp is not None else
                            (engine.dsa_dcp, "DCP") if engine.dsa_dcp is not None else (engine.dsa_cp, "DSA-CP"))
        if cp_comm is not None and cp_comm.rank == 0:
            # The same requests through the single-rank engine (no DCP / DSA-CP): greedy tokens must agree.
            solo_args = argparse.Namespace(**{k: v for k, v in vars(args).items()
                                              if k not in ("dcp_comm", "dsa_cp_comm")})
            solo_reqs = make_requests(args, cfg.vocab)
            Engine(model, solo_args).run(solo_reqs, args.steps, Progress(0, enabled=False))
            single_match = [r.generated for r in solo_reqs] == [r.generated for r in requests]

    s = engine.stats
    b_mean, b_p50 = _us(s.build_ns)
    f_mean, f_p50 = _us(s.forward_ns)
    all_done = all(r.finished for r in requests)
    rows = [
        ("steps", f"{s.steps}" + ("" if all_done else " (stopped early: --steps)")),
        ("requests finished", f"{sum(r.finished for r in requests)}/{len(requests)}, at most {s.max_running} in flight"),
        ("prompt tokens", f"{s.prompt_tokens} ({s.chunked_prefills} chunked-prefill pieces)"),
        ("generated tokens", f"{s.generated_tokens}"),
        ("steps by attention state", ", ".join(f"{k} {v}" for k, v in sorted(s.states.items()))),
        ("mixed decode+prefill steps", f"{s.mixed_steps}"),
        ("KV blocks reused after free", f"{s.blocks_reused}"),
    ] + ([("MLA context chunks gathered", f"{s.context_chunks}")] if cfg.attention == "mla" else []) + (
        [("top-k rows equal to reference", f"{topk_checked - topk_mismatches}/{topk_checked}"
          + (" (this rank's token slices)" if engine.dsa_cp is not None else ""))]
        if cfg.attention in ("sfa", "dsa") else []) + (
        [("DSA-CP layer calls off their road", f"{s.road_mismatches}")] if engine.dsa_cp is not None else []) + (
        [("DCP layer calls with other collectives", f"{s.road_mismatches}")] if engine.dsa_dcp is not None else []) + [
        ("forward paths (layer calls)", ", ".join(f"{k} {v}" for k, v in sorted(s.paths.items()))),
        ("build, host time / step", f"mean {b_mean:.1f} us, p50 {b_p50:.1f} us (one cold call per step)"),
        ("attention forward / layer", f"mean {f_mean:.1f} us, p50 {f_p50:.1f} us (incl. CPU-twin compute)"),
        ("end-to-end (CPU)", f"{s.wall_s:.2f} s, {(s.prompt_tokens + s.generated_tokens) / s.wall_s:.0f} tok/s "
                             f"processed, {s.generated_tokens / s.wall_s:.0f} tok/s generated"),
        ("dense reference (no cache)", f"{ref_s:.2f} s"),
        ("max |logits - dense|", f"{max_diff:.3e} (tolerance {LOGIT_TOLERANCE:.0e})"),
        ("greedy tokens match dense", "yes" if not mismatches else f"NO: {len(mismatches)} request(s)"),
    ] + ([(f"{cp_name} {cp_comm.size}: tokens match single-rank", "yes" if single_match else "NO")]
         if single_match is not None else [])
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    for rid, pos, got, want in mismatches:
        print(f"  request {rid}: token {pos} is {got}, dense reference gives {want}", file=sys.stderr)

    ok = (not mismatches and max_diff <= LOGIT_TOLERANCE and topk_mismatches == 0 and single_match is not False
          and s.road_mismatches == 0)
    print("\nOK" if ok else "\nFAILED: the paged runtime disagrees with dense attention")
    return 0 if ok else 1


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aar_demo", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
