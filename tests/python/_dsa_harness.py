"""Pieces shared by the DSA layer tests (test_dsa.py, test_dsa_a5.py): a layer's metadata routing by
compress ratio (spec 6.4) and reading a request's rows back out of a paged cache."""

from __future__ import annotations

import torch


def group_kw(ratio: int, md: dict) -> dict:
    """The forward's group arguments of a layer of `ratio` (spec 6.4), from a {cache kind: metadata} dict:
    compressed layers read their compressed-KV and compressor-state groups, C4 layers also the indexer's."""
    kw = {}
    if ratio > 1:
        kw["attention"] = md["c4_kv" if ratio == 4 else "c128_kv"]
        kw["compressor_state"] = md["c4_attn_state" if ratio == 4 else "c128_state"]
    if ratio == 4:
        kw["indexer_cache"] = md["c4_indexer_k"]
        kw["indexer_state"] = md["c4_indexer_state"]
    return kw


def slot_rows(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """Rows 0..n-1 of one request in a paged cache (its logical block table, physical rows per page)."""
    rows = cache.shape[1]
    return torch.stack([cache[table[c // rows], c % rows, 0] for c in range(n)]) if n else cache[:0, 0, 0]
