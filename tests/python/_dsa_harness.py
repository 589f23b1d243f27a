"""Pieces shared by the DSA layer tests (test_dsa.py, test_dsa_a5.py): a layer's metadata routing by
compress ratio (spec 6.4) and reading a request's rows back out of a paged cache."""

from __future__ import annotations

import torch

import ascend_attn_rt as aar

_GROUP_ARGS = ("attention", "compressor_state", "indexer_cache", "indexer_state")


def group_kw(ratio: int, md: dict, step) -> dict:
    """The forward's group arguments of a layer of `ratio` (spec 6.4) from the step's {cache kind: metadata}
    dict, routed by aar.dsa.route_layer (compressed layers read their compressed-KV and compressor-state
    groups, C4 layers also the indexer's; the others are None)."""
    g = aar.dsa.route_layer(ratio, step, md)
    return {k: g[k] for k in _GROUP_ARGS}


def slot_rows(cache: torch.Tensor, table: torch.Tensor, n: int) -> torch.Tensor:
    """Rows 0..n-1 of one request in a paged cache (its logical block table, physical rows per page)."""
    rows = cache.shape[1]
    return torch.stack([cache[table[c // rows], c % rows, 0] for c in range(n)]) if n else cache[:0, 0, 0]
