"""Randomised bad input at every public entry point (issue 9, part 4).

For each entry point (the GQA, MLA and SFA builders (SFA's draft and capture builds, cache-tuple composition,
top-k buffer and valid-top-k mask too), every forward, graph update and update_draft,
swap_blocks / copy_blocks, C8 scale preparation) a seeded generator makes thousands of calls that
are valid except for one argument, broken at random: wrong dtype, shape, device (meta), strides,
out-of-range ids, negative lengths, non-monotone query_start_loc, oversized batches, stale metadata.
Each call must raise ValueError or NotImplementedError whose message names the broken argument,
and every cache, the previous metadata and the graph's records must be byte-identical afterwards.
Failures are collected and reported together (mutation, argument, message).
"""

from __future__ import annotations

import math
import random
from typing import Callable, Dict, List, Optional, Sequence

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, make_weights, rope_tables
from _reference import make_batch

mla = aar.mla
S = aar.AttentionState
N, NKV, D, BS = 4, 2, 32, 16
TRIALS = 1500

META = torch.device("meta")


# ----------------------------------------------------------------------------- harness


class Mut:
    """One way to break one argument: `fn(args, rng)` returns the broken args (a new dict) or None when
    the mutation does not apply; the error message must contain one of `names`."""

    def __init__(self, label: str, names: Sequence[str], fn: Callable):
        self.label, self.names, self.fn = label, tuple(names), fn


def _bytes(t: torch.Tensor) -> Optional[torch.Tensor]:
    if t is None or t.device.type == "meta":
        return None
    return t.detach().contiguous().view(-1).view(torch.uint8).clone() if t.numel() else t.detach().clone()


def _snapshot(objs) -> List:
    out = []
    for o in objs:
        if isinstance(o, torch.Tensor):
            out.append(("t", o, _bytes(o)))
        elif callable(o):
            out.append(("f", o, o()))
        else:
            raise TypeError(o)
    return out


def _changed(snap) -> List[str]:
    bad = []
    for i, (kind, o, before) in enumerate(snap):
        now = _bytes(o) if kind == "t" else o()
        if kind == "t":
            if before is not None and not torch.equal(before, now):
                bad.append(f"tensor #{i} {tuple(o.shape)} changed")
        elif now != before:
            bad.append(f"state #{i} changed: {before!r} -> {now!r}")
    return bad


def fuzz(valid: Callable[[random.Random], Dict], call: Callable[[Dict], object], watched: Callable[[Dict], list],
         muts: List[Mut], trials: int = TRIALS, seed: int = 0):
    rng = random.Random(seed)
    failures, applied = [], {}
    for i in range(trials):
        args = valid(rng)
        m = muts[i % len(muts)] if i < len(muts) else rng.choice(muts)
        bad = m.fn(dict(args), rng)
        if bad is None:
            continue
        applied[m.label] = applied.get(m.label, 0) + 1
        snap = _snapshot(watched(bad) + [t for t in watched(args) if all(t is not x for x in watched(bad))])
        try:
            call(bad)
        except (ValueError, NotImplementedError) as e:
            msg = str(e)
            if not any(n in msg for n in m.names):
                failures.append(f"[{m.label}] message names none of {m.names}: {msg[:300]}")
        except Exception as e:  # noqa: BLE001 - any other type is a failure to report
            failures.append(f"[{m.label}] raised {type(e).__name__}, not ValueError/NotImplementedError: "
                            f"{str(e)[:300]}")
        else:
            failures.append(f"[{m.label}] was accepted")
        for c in _changed(snap):
            failures.append(f"[{m.label}] {c}")
    # Every mutation ran at least a few times.
    missing = [m.label for m in muts if applied.get(m.label, 0) == 0]
    assert not missing, f"mutations never applied: {missing}"
    uniq = list(dict.fromkeys(failures))
    assert not uniq, f"{len(failures)} failures in {trials} trials:\n" + "\n".join(uniq[:40])


def _replace(args, key, value):
    args = dict(args)
    args[key] = value
    return args


def _dtype_swap(t: torch.Tensor, rng, choices=(torch.int64, torch.float32, torch.int16, torch.bool, torch.float64)):
    return t.to(rng.choice([c for c in choices if c != t.dtype]))


def _non_contiguous(t: torch.Tensor, rng):
    """Same shape and values, other strides (None when every such view is still contiguous)."""
    if sum(1 for n in t.shape if n > 1) == 0:
        return None
    if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1 and rng.random() < 0.5:
        dims = list(range(t.dim()))
        dims[-1], dims[-2] = dims[-2], dims[-1]
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    big = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    v = big[..., ::2]
    v.copy_(t)
    return None if v.is_contiguous() else v


def _reshape_wrong(t: torch.Tensor, rng):
    """Another shape (one dim more, less, or one size changed)."""
    choice = rng.randrange(3)
    if choice == 0 or t.dim() == 1:
        return t.unsqueeze(0).clone()
    if choice == 1:
        return t.flatten(0, 1).clone()
    d = rng.randrange(t.dim())
    shape = list(t.shape)
    shape[d] += rng.choice([1, 2, 3])
    return torch.zeros(shape, dtype=t.dtype)


# ----------------------------------------------------------------------------- GQA builder


MAX_REQS, MAX_TOKENS, MAX_BLOCKS, NB = 6, 24, 4, 32


def _lens_to_qsl(q):
    out = [0]
    for x in q:
        out.append(out[-1] + x)
    return torch.tensor(out, dtype=torch.int32)


def _valid_step(rng, max_reqs=MAX_REQS, max_tokens=MAX_TOKENS, nb=NB, mb=MAX_BLOCKS, bs=BS):
    while True:
        b = rng.randint(1, max_reqs)
        q = [rng.choice([1, 1, 1, 2, 3, 5]) for _ in range(b)]
        if sum(q) <= max_tokens:
            break
    seq = [x + rng.randint(0, bs * mb - x) for x in q]
    table = torch.tensor([[rng.randrange(nb) for _ in range(mb)] for _ in range(b)], dtype=torch.int32)
    return dict(query_start_loc=_lens_to_qsl(q), seq_lens=torch.tensor(seq, dtype=torch.int32), block_table=table,
                num_input_tokens=0)


def _builder_muts(extra_names=()):
    def qsl_nonmono(a, rng):
        q = a["query_start_loc"].clone()
        if len(q) < 3:
            return None
        i = rng.randrange(1, len(q) - 1)
        q[i] = q[i + 1] + rng.randint(1, 5)
        return _replace(a, "query_start_loc", q)

    def qsl_negative(a, rng):
        q = a["query_start_loc"].clone()
        q[rng.randrange(len(q))] = -rng.randint(1, 100)
        return _replace(a, "query_start_loc", q)

    def qsl_start(a, rng):
        q = a["query_start_loc"].clone()
        q[0] = rng.randint(1, 3)
        return _replace(a, "query_start_loc", q)

    def qsl_len(a, rng):
        q = a["query_start_loc"]
        return _replace(a, "query_start_loc", q[:-1].clone() if rng.random() < 0.5 else torch.cat([q, q[-1:] + 1]))

    def seq_negative(a, rng):
        s = a["seq_lens"].clone()
        s[rng.randrange(len(s))] = -rng.randint(1, 1000)
        return _replace(a, "seq_lens", s)

    def seq_short(a, rng):
        s = a["seq_lens"].clone()
        q = a["query_start_loc"]
        i = rng.randrange(len(s))
        ql = int(q[i + 1] - q[i])
        if ql < 1:
            return None
        s[i] = rng.randrange(0, ql)
        return _replace(a, "seq_lens", s)

    def seq_too_long(a, rng):
        s = a["seq_lens"].clone()
        s[rng.randrange(len(s))] = BS * MAX_BLOCKS + rng.randint(1, 500)
        return _replace(a, "seq_lens", s)

    def bt_id(a, rng):
        t = a["block_table"].clone()
        s = a["seq_lens"]
        r = rng.randrange(len(s))
        need = max(1, math.ceil(int(s[r]) / BS))
        t[r, rng.randrange(need)] = rng.choice([NB, NB + rng.randint(1, 1 << 20), -1, -rng.randint(2, 1 << 20)])
        return _replace(a, "block_table", t)

    def bt_rows(a, rng):
        # Fewer rows than requests (more rows are fine: the first ones are read).
        t = a["block_table"]
        return _replace(a, "block_table", t[:-1].clone())

    def bt_wide(a, rng):
        t = a["block_table"]
        return _replace(a, "block_table", torch.cat([t, torch.zeros(len(t), rng.randint(1, 3), dtype=t.dtype)], 1))

    def oversized(a, rng):
        b = MAX_REQS + rng.randint(1, 4)
        q = [1] * b
        return dict(a, query_start_loc=_lens_to_qsl(q), seq_lens=torch.full((b,), 3, dtype=torch.int32),
                    block_table=torch.zeros(b, MAX_BLOCKS, dtype=torch.int32))

    def too_many_tokens(a, rng):
        q = [MAX_TOKENS + rng.randint(1, 10)]
        return dict(a, query_start_loc=_lens_to_qsl(q), seq_lens=torch.tensor(q, dtype=torch.int32),
                    block_table=torch.zeros(1, MAX_BLOCKS, dtype=torch.int32))

    def num_input(a, rng):
        n = int(a["query_start_loc"][-1])
        return _replace(a, "num_input_tokens", rng.choice([MAX_TOKENS + rng.randint(1, 9)]))

    muts = [
        Mut("qsl non-monotone", ["query_start_loc"], qsl_nonmono),
        Mut("qsl negative", ["query_start_loc"], qsl_negative),
        Mut("qsl not from 0", ["query_start_loc"], qsl_start),
        Mut("qsl length", ["query_start_loc", "seq_lens"], qsl_len),
        Mut("seq_lens negative", ["seq_lens"], seq_negative),
        Mut("seq_len < query len", ["seq_lens"], seq_short),
        Mut("seq_len past the table", ["seq_lens", "block_table"], seq_too_long),
        Mut("block id out of range", ["block_table"], bt_id),
        Mut("block_table rows", ["block_table"], bt_rows),
        Mut("block_table too wide", ["block_table", "max_blocks_per_req"], bt_wide),
        Mut("oversized batch", ["max_num_reqs", "num_reqs"], oversized),
        Mut("too many tokens", ["max_num_tokens", "num_tokens"], too_many_tokens),
        Mut("num_input_tokens too large", ["num_input_tokens", "max_num_tokens", "num_tokens"], num_input),
    ]
    for key in ("query_start_loc", "seq_lens", "block_table"):
        muts += [
            Mut(f"{key} dtype", [key], lambda a, rng, k=key: _replace(a, k, _dtype_swap(a[k], rng))),
            Mut(f"{key} dims", [key], lambda a, rng, k=key: _replace(a, k, a[k].unsqueeze(0).clone()
                                                                        if rng.random() < 0.5 or a[k].dim() == 1
                                                                        else a[k].flatten().clone())),
            Mut(f"{key} meta", [key], lambda a, rng, k=key: _replace(a, k, a[k].to(META))),
            Mut(f"{key} strides", [key], lambda a, rng, k=key: _strided(a, k, rng)),
        ]
    return muts


def _strided(a, key, rng):
    t = _non_contiguous(a[key], rng)
    return None if t is None else _replace(a, key, t)


def _md_state(md, names, lists):
    """The observable state of a metadata: its tensors' bytes and its lists (as a callable for lists)."""

    def read():
        try:
            return [getattr(md, x) for x in lists]
        except ValueError as e:  # e.g. stale: a state of its own
            return f"unreadable: {e}"

    return [getattr(md, n) for n in names if getattr(md, n) is not None] + [read]


def test_gqa_builder_rejects_random_bad_input():
    builder = aar.MetadataBuilder(max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS, max_blocks_per_req=MAX_BLOCKS,
                                  block_size=BS, num_blocks=NB, dense_context=True)
    last = {}

    def valid(rng):
        a = _valid_step(rng)
        if rng.random() < 0.05 or not last:
            last["md"] = builder.build(**a)  # a fresh previous build now and then
        return a

    def watched(a):
        md = last["md"]
        return _md_state(md, ["query_start_loc", "seq_lens", "block_tables", "slot_mapping", "dense_slots"],
                         ["actual_seq_lengths_q", "seq_lens_list", "is_current", "num_reqs", "attn_state"])

    fuzz(valid, lambda a: builder.build(**a), watched, _builder_muts())


def _mla_builder(**kw):
    d = MlaDims()
    cos, sin = rope_tables(BS * MAX_BLOCKS + 8, d.R)
    args = dict(max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS, max_blocks_per_req=MAX_BLOCKS, block_size=BS,
                num_blocks=NB, cos_table=cos.float(), sin_table=sin.float(), workspace_tokens=BS * MAX_REQS * 4)
    args.update(kw)
    return mla.MetadataBuilder(**args)


def test_mla_builder_rejects_random_bad_input():
    builder = _mla_builder()
    last = {}

    def valid(rng):
        a = _valid_step(rng)
        # MLA batches are decode-first.
        q = (a["query_start_loc"][1:] - a["query_start_loc"][:-1]).tolist()
        order = sorted(range(len(q)), key=lambda i: q[i] != 1)
        q = [q[i] for i in order]
        a = dict(a, query_start_loc=_lens_to_qsl(q), seq_lens=a["seq_lens"][order].contiguous(),
                 block_table=a["block_table"][order].contiguous())
        if rng.random() < 0.05 or not last:
            last["md"] = builder.build(**a)
        return a

    def watched(a):
        md = last["md"]
        return _md_state(md, ["query_start_loc", "slot_mapping", "decode_block_table", "decode_cos",
                              "prefill_block_table", "context_cu_seq_lens"],
                         ["decode_seq_lens_list", "decode_actual_seq_lengths_q", "prefill_actual_seq_lengths_q",
                          "is_current", "num_decodes"])

    fuzz(valid, lambda a: builder.build(**a), watched, _builder_muts())


def _sfa_builder(**kw):
    d = MlaDims()
    cos, sin = rope_tables(BS * MAX_BLOCKS + 8, d.R)
    args = dict(max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS, max_blocks_per_req=MAX_BLOCKS, block_size=BS,
                num_blocks=NB, cos_table=cos.float(), sin_table=sin.float())
    args.update(kw)
    return aar.sfa.MetadataBuilder(**args)


_SFA_TENSORS = ["query_start_loc", "cum_query_lens", "seq_lens", "block_table", "slot_mapping", "cos", "sin"]
_SFA_LISTS = ["seq_lens_list", "cum_query_lens_list", "is_current", "num_kernel_reqs", "attn_state"]


def test_sfa_builder_rejects_random_bad_input():
    # SFA batches come in any order: _valid_step's are used as they are.
    builder = _sfa_builder()
    last = {}

    def valid(rng):
        a = _valid_step(rng)
        if rng.random() < 0.05 or not last:
            last["md"] = builder.build(**a)
        return a

    def watched(a):
        return _md_state(last["md"], _SFA_TENSORS, _SFA_LISTS)

    fuzz(valid, lambda a: builder.build(**a), watched, _builder_muts())


def test_sfa_draft_and_capture_builds_reject_random_bad_input():
    """build_for_drafting (per draft lane) and build_for_graph_capture: the builder mutations, a draft index out of
    range and a capture state that cannot be captured; neither the main lane's nor any draft lane's metadata may
    change."""
    builder = _sfa_builder(num_speculative_tokens=1, graph_decode_padding=True, num_drafts=2)
    mds = {}

    def valid(rng):
        a = _valid_step(rng, max_reqs=MAX_REQS // 2, max_tokens=MAX_TOKENS // 2)
        a["mode"] = rng.choice(["draft0", "draft1", "capture"])
        if a["mode"] == "capture":  # decodes of at most the decode threshold: capturable
            q = [1] * len(a["seq_lens"])
            a["query_start_loc"] = _lens_to_qsl(q)
        if rng.random() < 0.05 or not mds:
            args = {k: v for k, v in a.items() if k != "mode"}
            mds["main"] = builder.build(**args)
            mds[0] = builder.build_for_drafting(**args, draft_index=0)
            mds[1] = builder.build_for_drafting(**args, draft_index=1)
        return a

    def call(a):
        args = {k: v for k, v in a.items() if k not in ("mode", "state", "draft_index")}
        if a["mode"] == "capture":
            builder.build_for_graph_capture(**{k: v for k, v in args.items()}, state=a.get("state", S.DecodeOnly))
        else:
            builder.build_for_drafting(**args, draft_index=a.get("draft_index", int(a["mode"][-1])))

    def watched(a):
        out = []
        for md in mds.values():
            out += _md_state(md, _SFA_TENSORS, _SFA_LISTS)
        return out

    muts = []
    for m in _builder_muts():
        if m.label == "oversized batch":  # a draft lane takes more requests: check the main lane's capacity
            m = Mut(m.label, m.names, lambda a, rng, fn=m.fn: dict(fn(a, rng), mode="capture"))
        muts.append(m)
    muts += [
        Mut("draft index out of range", ["draft_index"],
            lambda a, rng: dict(a, mode="draft0", draft_index=rng.choice([-1, 2, 7, -(2 ** 31)]))),
        Mut("capture state", ["cannot be captured"],
            lambda a, rng: dict(a, mode="capture", state=rng.choice([S.PrefillNoCache, S.PrefillCacheHit,
                                                                     S.ChunkedPrefill]))),
    ]
    fuzz(valid, call, watched, muts)


def test_sfa_facts_and_utilities_reject_random_bad_input():
    """compose_kv_cache, TopkBuffer.view / store and plan.build_valid_topk_mask."""
    tb = aar.sfa.TopkBuffer(12, 6)

    def main(nb, c8):
        return [torch.zeros(nb, BS, 1, 64, dtype=torch.int8)] if c8 else \
            [torch.zeros(nb, BS, 1, 32, dtype=torch.bfloat16), torch.zeros(nb, BS, 1, 8, dtype=torch.bfloat16)]

    def indexer(nb, c8):
        return [torch.zeros(nb, BS, 1, 16, dtype=torch.int8), torch.zeros(nb, BS, 1, 1, dtype=torch.float16)] if c8 \
            else [torch.zeros(nb, BS, 1, 16, dtype=torch.bfloat16)]

    def valid(rng):
        nb = rng.randint(1, 6)
        sfa_c8, li_c8 = rng.random() < 0.5, rng.random() < 0.5
        t = rng.randint(0, 12)
        return dict(which=rng.choice(["compose", "store", "view", "mask"]), sfa_c8=sfa_c8, li_c8=li_c8,
                    main=main(nb, sfa_c8), indexer=indexer(nb * rng.choice([1, 2]), li_c8), n=t,
                    topk=torch.randint(-1, 30, (t, 1, 6), dtype=torch.int32),
                    thr=torch.randint(0, 30, (t,), dtype=torch.int32))

    def call(a):
        if a["which"] == "compose":
            aar.sfa.compose_kv_cache(a["main"], a["indexer"], sfa_c8=a["sfa_c8"], li_c8=a["li_c8"])
        elif a["which"] == "store":
            tb.store(a["topk"])
        elif a["which"] == "view":
            tb.view(a["n"])
        else:
            aar.plan.build_valid_topk_mask(a["topk"], a["thr"])

    def drop(a, rng, key):
        lst = list(a[key])
        del lst[rng.randrange(len(lst))]
        return dict(a, which="compose", **{key: lst}) if lst or key == "main" else None

    def extra(a, rng, key):
        return dict(a, which="compose", **{key: list(a[key]) + [a[key][0].clone()]})

    def retype(a, rng, key):
        lst = list(a[key])
        i = rng.randrange(len(lst))
        lst[i] = _dtype_swap(lst[i], rng, (torch.float64, torch.int32, torch.int16, torch.uint8, torch.bool))
        return dict(a, which="compose", **{key: lst})

    def reshape(a, rng, key):
        lst = list(a[key])
        i = rng.randrange(len(lst))
        lst[i] = lst[i].flatten(2).clone() if rng.random() < 0.5 else lst[i][:, : BS // 2].clone()
        return dict(a, which="compose", **{key: lst})

    muts = [
        Mut("main tuple length", ["main_kv_cache"], lambda a, rng: drop(a, rng, "main") if rng.random() < 0.5
            else extra(a, rng, "main")),
        Mut("indexer tuple length", ["indexer_kv_cache"], lambda a, rng: extra(a, rng, "indexer")),
        Mut("main dtype", ["main_kv_cache"], lambda a, rng: retype(a, rng, "main")),
        Mut("indexer dtype", ["indexer_kv_cache"], lambda a, rng: retype(a, rng, "indexer")),
        Mut("main shape", ["main_kv_cache"], lambda a, rng: reshape(a, rng, "main")),  # or the indexer's, naming it
        Mut("indexer shape", ["indexer_kv_cache"], lambda a, rng: reshape(a, rng, "indexer")),
        Mut("cache on meta", ["main_kv_cache", "indexer_kv_cache"],
            lambda a, rng: (lambda key: dict(a, which="compose", **{key: [t.to(META) if i == 0 else t for i, t in
                                                                          enumerate(a[key])]}))(
                rng.choice(["main", "indexer"]))),
        Mut("flags flipped", ["main_kv_cache", "indexer_kv_cache"],
            lambda a, rng: dict(a, which="compose", sfa_c8=not a["sfa_c8"]) if rng.random() < 0.5
            else dict(a, which="compose", li_c8=not a["li_c8"])),
        Mut("topk dtype", ["topk"], lambda a, rng: dict(a, which=rng.choice(["store", "mask"]),
                                                        topk=_dtype_swap(a["topk"], rng))),
        Mut("topk width", ["topk"], lambda a, rng: dict(a, which="store", topk=torch.zeros(
            a["n"], 1, rng.choice([1, 5, 7]), dtype=torch.int32))),
        Mut("topk rows", ["topk"], lambda a, rng: dict(a, which="store", topk=torch.zeros(
            13 + rng.randrange(5), 6, dtype=torch.int32))),
        Mut("topk meta", ["topk"], lambda a, rng: dict(a, which=rng.choice(["store", "mask"]),
                                                       topk=a["topk"].to(META))),
        Mut("view size", ["num_tokens"], lambda a, rng: dict(a, which="view", n=rng.choice([-1, 13, 1 << 20]))),
        Mut("thresholds count", ["thresholds"], lambda a, rng: dict(a, which="mask", thr=torch.zeros(
            a["n"] + rng.choice([1, 2]), dtype=torch.int32))),
        Mut("threshold negative", ["thresholds_per_row"], lambda a, rng: None if a["n"] == 0 else dict(
            a, which="mask", thr=a["thr"].clone().index_fill_(0, torch.tensor([rng.randrange(a["n"])]), -5))),
        Mut("thresholds dtype", ["thresholds"], lambda a, rng: dict(a, which="mask", thr=a["thr"].long())),
    ]
    fuzz(valid, call, lambda a: [tb.buffer], muts, trials=800)


# ----------------------------------------------------------------------------- forwards (GQA, C8, FA3)


def _forward_muts(cache_names=("key_cache", "value_cache"), kv_dtype_ok=None):
    """Mutations of a forward's arguments (query, key, value, caches, output, metadata)."""

    def rows(a, rng, k):
        t = a[k]
        n = rng.choice([0, 1]) if t.shape[0] > 2 else 0
        return _replace(a, k, torch.zeros(n, *t.shape[1:], dtype=t.dtype))

    def heads(a, rng, k):
        t = a[k]
        d = rng.choice([1, 2])
        shape = list(t.shape)
        shape[d] = shape[d] + rng.choice([1, 2]) if shape[d] > 1 or rng.random() < 0.5 else shape[d] * 2
        return _replace(a, k, torch.zeros(shape, dtype=t.dtype))

    def key_alone(a, rng):
        return _replace(a, "value", None)

    def stale(a, rng):
        a = dict(a)
        a["metadata"] = a["stale"]
        return a

    def cache_blocks(a, rng, k):
        t = a[k]
        return _replace(a, k, t[: max(1, t.shape[0] // 4)].clone())

    def cache_dtype(a, rng, k):
        t = a[k]
        return _replace(a, k, _dtype_swap(t, rng, (torch.float64, torch.int32, torch.bfloat16, torch.int8,
                                                   torch.float32)))

    def cache_strides(a, rng, k):
        t = a[k]
        if t.dim() < 2:
            return None
        choice = rng.randrange(3)
        if choice == 0:  # permuted allocation (e.g. HND), same logical shape and values
            p = list(range(t.dim()))
            i = rng.randrange(1, t.dim() - 1)
            p[i], p[i + 1] = p[i + 1], p[i]
            u = t.permute(p).contiguous().permute(p)
            return None if u.is_contiguous() else _replace(a, k, u)  # swapping a size-1 dim changes nothing
        if choice == 1:  # padded block stride
            big = torch.zeros(t.shape[0], 2, *t.shape[1:], dtype=t.dtype)
            big[:, 0].copy_(t)
            return _replace(a, k, big[:, 0])
        # as_strided with overlapping blocks
        return _replace(a, k, t.as_strided(t.shape, (0,) + t.stride()[1:]))

    muts = [
        Mut("query rows", ["query"], lambda a, rng: rows(a, rng, "query")),
        Mut("query heads", ["query"], lambda a, rng: heads(a, rng, "query")),
        Mut("query dtype", ["query", "output"], lambda a, rng: _replace(a, "query", _dtype_swap(a["query"], rng))),
        Mut("query meta", ["query", "output", "is on"], lambda a, rng: _replace(a, "query", a["query"].to(META))),
        Mut("query 2-D", ["query"], lambda a, rng: _replace(a, "query", a["query"].flatten(1).clone())),
        Mut("output shape", ["output"], lambda a, rng: _replace(a, "output", _reshape_wrong(a["output"], rng))),
        Mut("output dtype", ["output"], lambda a, rng: _replace(a, "output", _dtype_swap(a["output"], rng))),
        Mut("output strides", ["output"], lambda a, rng: _strided(a, "output", rng)),
        Mut("output meta", ["output"], lambda a, rng: _replace(a, "output", a["output"].to(META))),
        Mut("key rows", ["key"], lambda a, rng: rows(a, rng, "key")),
        Mut("key heads", ["key"], lambda a, rng: heads(a, rng, "key")),
        Mut("key dtype", ["key"], lambda a, rng: _replace(a, "key", _dtype_swap(a["key"], rng))),
        Mut("value dtype", ["value"], lambda a, rng: _replace(a, "value", _dtype_swap(a["value"], rng))),
        Mut("value meta", ["value"], lambda a, rng: _replace(a, "value", a["value"].to(META))),
        Mut("key without value", ["key", "value"], key_alone),
        Mut("stale metadata", ["stale"], stale),
    ]
    for k in cache_names:
        muts += [
            Mut(f"{k} too few blocks", [k], lambda a, rng, k=k: cache_blocks(a, rng, k)),
            Mut(f"{k} shape", [k], lambda a, rng, k=k: _replace(a, k, _reshape_wrong(a[k], rng))),
            Mut(f"{k} dtype", [k], lambda a, rng, k=k: cache_dtype(a, rng, k)),
            Mut(f"{k} meta", [k], lambda a, rng, k=k: _replace(a, k, a[k].to(META))),
            Mut(f"{k} strides", [k], lambda a, rng, k=k: cache_strides(a, rng, k)),
        ]
    return muts


def _forward_fuzz(make_impl, make_batch_fn, builder_kw=None, cache_names=("key_cache", "value_cache"),
                  forward_args=("query", "key", "value", "key_cache", "value_cache", "metadata", "output"), seed=0):
    rng0 = random.Random(seed)
    cases = []
    for _ in range(6):
        b = make_batch_fn(rng0)
        builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=b.block_table.shape[1],
                                      block_size=b.block_size, num_blocks=b.num_blocks, **(builder_kw or {}))
        qsl = getattr(b, "query_start_loc", None)
        qsl = qsl if qsl is not None else b.qsl
        stale = builder.build(qsl, b.seq_lens_t, b.block_table)
        md = builder.build(qsl, b.seq_lens_t, b.block_table)
        cases.append((b, md, stale))
    impl = make_impl()

    def valid(rng):
        b, md, stale = rng.choice(cases)
        return dict(query=b.q, key=b.k, value=b.v, key_cache=b.key_cache, value_cache=b.value_cache, metadata=md,
                    output=torch.full_like(b.q, 7.0), stale=stale)

    def call(a):
        impl.forward(*[a[k] for k in forward_args])

    def watched(a):
        return [a[k] for k in (*cache_names, "output") if isinstance(a.get(k), torch.Tensor)]

    fuzz(valid, call, watched, _forward_muts(cache_names), seed=seed)


def _gqa_batch(rng, block_size=BS):
    seq = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
    q = [rng.randint(1, s) if rng.random() < 0.5 else 1 for s in seq]
    return make_batch(seq, q, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                      block_size=block_size, gen=torch.Generator().manual_seed(rng.randrange(1 << 30)))


def test_gqa_forward_rejects_random_bad_input():
    _forward_fuzz(lambda: aar.AttentionImpl(N, D, num_kv_heads=NKV), _gqa_batch)


def test_fa3_forward_rejects_random_bad_input():
    _forward_fuzz(lambda: aar.FA3AttentionImpl(N, D, num_kv_heads=NKV), lambda rng: _gqa_batch(rng, 128))


def test_c8_forward_rejects_random_bad_input():
    from test_c8 import make_c8_batch

    batches = {}

    def make(rng):
        seq = [rng.randint(1, 60) for _ in range(rng.randint(1, 3))]
        q = [1 if rng.random() < 0.6 else rng.randint(1, s) for s in seq]
        b = make_c8_batch(seq, q, gen=torch.Generator().manual_seed(rng.randrange(1 << 30)), num_heads=N,
                          num_kv_heads=NKV, head_size=D)
        b.query_start_loc = b.qsl
        batches["last"] = b
        return b

    def impl():
        b = batches["last"]
        return aar.C8AttentionImpl(N, D, num_kv_heads=NKV, k_scale=b.ks, k_offset=b.ko, v_scale=b.vs,
                                   v_offset=b.vo)

    _forward_fuzz(impl, make, builder_kw=dict(dense_context=True))


# ----------------------------------------------------------------------------- MLA forward


def test_mla_forward_rejects_random_bad_input():
    d = MlaDims()
    g = torch.Generator().manual_seed(3)
    ws = make_weights(d, torch.float32, g)
    impl = mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                    qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, **ws)
    nope = torch.randn(NB, BS, 1, d.L, generator=g)
    rope = torch.randn(NB, BS, 1, d.R, generator=g)
    rng0 = random.Random(1)
    cases = []
    for _ in range(6):
        a = _valid_step(rng0)
        q = (a["query_start_loc"][1:] - a["query_start_loc"][:-1]).tolist()
        order = sorted(range(len(q)), key=lambda i: q[i] != 1)
        q = [q[i] for i in order]
        args = (_lens_to_qsl(q), a["seq_lens"][order].contiguous(), a["block_table"][order].contiguous())
        builder = _mla_builder()  # one per case: each case's metadata stays current
        stale = builder.build(*args)
        md = builder.build(*args)
        cases.append((md, stale, sum(q)))

    def valid(rng):
        md, stale, t = rng.choice(cases)
        hidden = torch.randn(t, d.hidden)
        return dict(hidden=hidden, nope_cache=nope, rope_cache=rope, metadata=md, output=torch.zeros_like(hidden),
                    stale=stale)

    def call(a):
        impl.forward(a["hidden"], a["nope_cache"], a["rope_cache"], a["metadata"], a["output"])

    muts = [
        Mut("hidden rows", ["hidden"], lambda a, rng: _replace(a, "hidden", a["hidden"][:0].clone())),
        Mut("hidden width", ["hidden"], lambda a, rng: _replace(a, "hidden", torch.zeros(a["hidden"].shape[0], 7))),
        Mut("hidden dtype", ["hidden"], lambda a, rng: _replace(a, "hidden", a["hidden"].double())),
        Mut("hidden meta", ["hidden", "is on"], lambda a, rng: _replace(a, "hidden", a["hidden"].to(META))),
        Mut("output shape", ["output"], lambda a, rng: _replace(a, "output", _reshape_wrong(a["output"], rng))),
        Mut("output dtype", ["output"], lambda a, rng: _replace(a, "output", a["output"].half())),
        Mut("output strides", ["output"], lambda a, rng: _strided(a, "output", rng)),
        Mut("stale metadata", ["stale"], lambda a, rng: _replace(a, "metadata", a["stale"])),
    ]
    for k in ("nope_cache", "rope_cache"):
        muts += [
            Mut(f"{k} width", [k], lambda a, rng, k=k: _replace(a, k, torch.zeros(*a[k].shape[:-1],
                                                                                   a[k].shape[-1] + 1))),
            Mut(f"{k} blocks", [k], lambda a, rng, k=k: _replace(a, k, a[k][:2].clone())),
            Mut(f"{k} dtype", [k], lambda a, rng, k=k: _replace(a, k, a[k].half())),
            Mut(f"{k} meta", [k], lambda a, rng, k=k: _replace(a, k, a[k].to(META))),
            Mut(f"{k} strides", [k], lambda a, rng, k=k: _replace(a, k, a[k].transpose(1, 2).contiguous()
                                                                   .transpose(1, 2) if rng.random() < 0.0 else
                                                                   _padded_blocks(a[k]))),
        ]

    fuzz(valid, call, lambda a: [t for t in (a["nope_cache"], a["rope_cache"], a["output"])
                                 if isinstance(t, torch.Tensor)], muts)


# ----------------------------------------------------------------------------- SFA forward (every C8 combination)


def test_sfa_forward_rejects_random_bad_input():
    from _sfa_reference import IdxDims, make_indexer_weights

    d = MlaDims(H=2, hidden=64, Q=32, L=512, P=16, R=64, V=16)  # the packed SFA C8 rows need L=512, R=64
    idx = IdxDims(n_head=2, D=128, K=8)
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(4)
    ws = make_weights(d, bf, g)
    iw = make_indexer_weights(d, idx, bf, g)
    combos = [(False, False), (True, False), (False, True), (True, True)]
    impls = [aar.sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                          qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, index_n_head=idx.n_head,
                          index_head_dim=idx.D, index_topk=idx.K, indexer_wq_b=iw["wq_b"], indexer_wk=iw["wk"],
                          indexer_weights_proj=iw["weights_proj"], indexer_k_norm_weight=iw["k_norm_weight"],
                          indexer_k_norm_bias=iw["k_norm_bias"], sfa_c8=s8, li_c8=l8, **ws) for s8, l8 in combos]
    nope = torch.randn(NB, BS, 1, d.L, generator=g).to(bf)
    rope = torch.randn(NB, BS, 1, d.R, generator=g).to(bf)
    packed = torch.randint(-128, 128, (NB, BS, 1, 656), dtype=torch.int8, generator=g)
    idx_k = torch.randn(NB, BS, 1, idx.D, generator=g).to(bf)
    idx_kq = torch.randint(-128, 128, (NB, BS, 1, idx.D), dtype=torch.int8, generator=g)
    idx_s = torch.rand(NB, BS, 1, 1, generator=g).half()

    def tuple_of(c):
        s8, l8 = combos[c]
        return ([packed] if s8 else [nope, rope]) + ([idx_kq, idx_s] if l8 else [idx_k])

    cos, sin = rope_tables(BS * MAX_BLOCKS + 8, d.R)
    rng0 = random.Random(5)
    cases = []
    for _ in range(6):
        a = _valid_step(rng0)
        builder = aar.sfa.MetadataBuilder(max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS,
                                          max_blocks_per_req=MAX_BLOCKS, block_size=BS, num_blocks=NB,
                                          cos_table=cos.to(bf), sin_table=sin.to(bf))
        stale = builder.build(**a)
        md = builder.build(**a)
        cases.append((md, stale, int(a["query_start_loc"][-1])))

    def valid(rng):
        md, stale, t = rng.choice(cases)
        c = rng.randrange(len(combos))
        hidden = torch.randn(t, d.hidden).to(bf)
        return dict(combo=c, hidden=hidden, kv=tuple_of(c), metadata=md, output=torch.zeros_like(hidden),
                    stale=stale)

    def call(a):
        impls[a["combo"]].forward(a["hidden"], a["kv"], a["metadata"], a["output"])

    def entry(a, rng, fn):
        i = rng.randrange(len(a["kv"]))
        t = fn(a["kv"][i], rng)
        if t is None:
            return None
        kv = list(a["kv"])
        kv[i] = t
        return dict(a, kv=kv, names=[f"kv_cache[{i}]"])

    def wrong_dtype(t, rng):
        choices = [torch.float32, torch.float16, bf, torch.int8, torch.float8_e4m3fn]
        return torch.zeros(t.shape, dtype=rng.choice([c for c in choices if c != t.dtype]))

    def wrong_width(t, rng):
        return torch.zeros(*t.shape[:-1], t.shape[-1] + rng.choice([-1, 1, 64]), dtype=t.dtype)

    def other_combo(a, rng):
        c = rng.choice([c for c in range(len(combos)) if len(tuple_of(c)) != len(a["kv"])])
        return dict(a, kv=tuple_of(c))

    def kv_mut(label, fn):
        # The message names the broken entry (kv_cache[i]); entry() records which one.
        m = Mut(label, ["kv_cache"], lambda a, rng: entry(a, rng, fn))
        return m

    muts = [
        Mut("hidden rows", ["hidden"], lambda a, rng: _replace(a, "hidden", a["hidden"][:0].clone())),
        Mut("hidden width", ["hidden"], lambda a, rng: _replace(a, "hidden", torch.zeros(a["hidden"].shape[0], 7))),
        Mut("hidden dtype", ["hidden"], lambda a, rng: _replace(a, "hidden", a["hidden"].double())),
        Mut("hidden meta", ["hidden", "is on"], lambda a, rng: _replace(a, "hidden", a["hidden"].to(META))),
        Mut("output shape", ["output"], lambda a, rng: _replace(a, "output", _reshape_wrong(a["output"], rng))),
        Mut("output dtype", ["output"], lambda a, rng: _replace(a, "output", a["output"].half())),
        Mut("output strides", ["output"], lambda a, rng: _strided(a, "output", rng)),
        Mut("stale metadata", ["stale"], lambda a, rng: _replace(a, "metadata", a["stale"])),
        Mut("tuple one short", ["kv_cache"], lambda a, rng: dict(a, kv=a["kv"][:-1])),
        Mut("tuple one extra", ["kv_cache"], lambda a, rng: dict(a, kv=a["kv"] + [a["kv"][-1]])),
        Mut("another combination's tuple", ["kv_cache"], other_combo),
        kv_mut("entry dtype", wrong_dtype),
        kv_mut("entry width", wrong_width),
        kv_mut("entry blocks", lambda t, rng: t[:2].clone()),
        kv_mut("entry meta", lambda t, rng: t.to(META)),
        kv_mut("entry strides", lambda t, rng: _padded_blocks(t)),
    ]

    # Entry mutations must name the entry they broke, not just any kv_cache entry.
    def call_checked(a):
        try:
            call(a)
        except ValueError as e:
            for n in a.get("names", []):
                assert n in str(e), f"{n} not named: {e}"
            raise

    fuzz(valid, call_checked, lambda a: [t for t in (*a["kv"], a["output"]) if isinstance(t, torch.Tensor)], muts)


def _padded_blocks(t):
    big = torch.zeros(t.shape[0], 2, *t.shape[1:], dtype=t.dtype)
    big[:, 0].copy_(t)
    return big[:, 0]


# ----------------------------------------------------------------------------- graph update / update_draft


def test_graph_update_rejects_random_bad_input():
    bucket = 4
    caches = [(torch.randn(NB, BS, NKV, D), torch.randn(NB, BS, NKV, D)) for _ in range(2)]
    impls = [aar.AttentionImpl(N, D, num_kv_heads=NKV, layer_index=i, kv_sharing=True) for i in range(2)]
    q = torch.randn(bucket, N, D)
    outs = [torch.zeros(bucket, N, D) for _ in range(2)]
    builders = [aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=16, max_blocks_per_req=4, block_size=BS,
                                    num_blocks=NB) for _ in range(3)]
    table = torch.arange(16, dtype=torch.int32).view(4, 4)

    def build(which, n_reqs, q_len=1, seq=10, tokens=None):
        qsl = torch.arange(0, q_len * n_reqs + 1, q_len, dtype=torch.int32)
        return builders[which].build(qsl, torch.full((n_reqs,), seq, dtype=torch.int32), table[:n_reqs],
                                     num_input_tokens=tokens or 0)

    g = aar.GraphParams("recording")
    with g.capture(bucket):
        for i, impl in enumerate(impls):
            impl.forward(q, None, None, *caches[i], build(0, bucket), outs[i])
    good = build(0, bucket, seq=12)
    g.update(bucket, good)
    g.replay(bucket)

    def valid(rng):
        return dict(n=bucket, md=build(rng.randrange(2), rng.randint(1, bucket), seq=rng.randint(1, 60),
                                       tokens=bucket), draft=rng.random() < 0.5)

    def call(a):
        (g.update_draft if a["draft"] else g.update)(a["n"], a["md"])

    def watched(a):
        return [lambda: g.update_log, lambda: g.calls(bucket), lambda: [w is None or w.numel()
                                                                         for w in g.workspaces(bucket)]]

    def stale(a, rng):
        md = a["md"] if not isinstance(a["md"], list) else a["md"][0]
        which = 0 if builders[0].generation == md.generation else 1
        fresh = build(which, 2, tokens=bucket)
        return dict(a, md=[md, fresh] if a["draft"] else md) if not md.is_current else None

    def stale2(a, rng):
        old = build(2, 2, tokens=bucket)
        build(2, 3, tokens=bucket)
        return dict(a, md=[old] if a["draft"] else old)

    muts = [
        Mut("bucket not captured", ["num_tokens", "captured"], lambda a, rng: dict(a, n=rng.choice([1, 3, 5, 8, 64]))),
        Mut("too many tokens", ["bucket", "kernel tokens", "rows"],
            lambda a, rng: dict(a, md=build(2, 1, q_len=6, seq=20, tokens=6))),
        Mut("stale metadata", ["stale"], stale2),
        Mut("not a metadata", ["metadata", "Metadata"], lambda a, rng: dict(a, md=rng.choice([torch.zeros(3), 3]))),
        Mut("empty list", ["at least one", "metadata"], lambda a, rng: dict(a, md=[])),
    ]
    fuzz(valid, call, watched, muts, trials=600)
    # The graph still works after all that.
    g.update(bucket, good := build(0, bucket, seq=12))
    g.replay(bucket)


# ----------------------------------------------------------------------------- swap_blocks / copy_blocks


def test_swap_and_copy_blocks_reject_random_bad_input():
    def valid(rng):
        nb_s, nb_d = rng.randint(2, 8), rng.randint(2, 8)
        m = rng.randint(1, 4)
        pairs = torch.tensor([[rng.randrange(nb_s), rng.randrange(nb_d)] for _ in range(m)])
        return dict(sk=torch.randn(nb_s, BS, NKV, D), sv=torch.randn(nb_s, BS, NKV, D),
                    dk=torch.randn(nb_d, BS, NKV, D), dv=torch.randn(nb_d, BS, NKV, D), pairs=pairs,
                    copy=rng.random() < 0.3)

    def call(a):
        if a["copy"]:
            aar.Backend.copy_blocks([(a["dk"], a["dv"])], a["pairs"].clamp(max=a["dk"].shape[0] - 1)
                                    if a.get("clamp") else a["pairs"])
        else:
            aar.Backend.swap_blocks(a["sk"], a["sv"], a["dk"], a["dv"], a["pairs"])

    def pair_range(a, rng):
        p = a["pairs"].clone()
        i, j = rng.randrange(len(p)), rng.randrange(2)
        p[i, j] = rng.choice([-1, -rng.randint(2, 100), 1000 + rng.randrange(100)])
        return dict(a, pairs=p)

    def value_mismatch(a, rng):
        key = rng.choice(["sv", "dv"])
        t = a[key]
        shape = list(t.shape)
        shape[rng.randrange(1, 4)] += 1
        return dict(a, **{key: torch.zeros(shape)}, copy=False)

    def dtype_mismatch(a, rng):
        key = rng.choice(["sv", "dk", "dv"])
        return dict(a, **{key: a[key].double()}, copy=False)

    def overlap(a, rng):
        key = rng.choice(["dk", "dv"])
        t = a[key]
        return dict(a, **{key: t.as_strided(t.shape, (0,) + t.stride()[1:])})

    muts = [
        Mut("pair out of range", ["src_to_dst"], pair_range),
        Mut("pairs shape", ["src_to_dst"], lambda a, rng: dict(a, pairs=rng.choice(
            [a["pairs"].flatten().clone(), a["pairs"].unsqueeze(0).clone(), torch.zeros(len(a["pairs"]), 3,
                                                                                        dtype=torch.int64)]))),
        Mut("pairs float", ["src_to_dst"], lambda a, rng: dict(a, pairs=a["pairs"].float())),
        Mut("value cache mismatch", ["value", "dst_kv_cache", "src_kv_cache"], value_mismatch),
        Mut("dtype mismatch", ["dtype", "dst_kv_cache", "src_kv_cache", "value"], dtype_mismatch),
        Mut("overlapping cache", ["overlap", "dst", "kv_caches"], overlap),
    ]
    fuzz(valid, call, lambda a: [a[k] for k in ("sk", "sv", "dk", "dv")], muts)


# ----------------------------------------------------------------------------- C8 scale preparation


def test_c8_prepare_scales_rejects_random_bad_input():
    def valid(rng):
        n = rng.choice([1, NKV * D])
        return dict(k_scale=torch.rand(n) + 0.1, k_offset=torch.zeros(n), v_scale=torch.rand(n) + 0.1,
                    v_offset=torch.zeros(n), tp_rank=0, tp_size=1)

    def call(a):
        aar.c8_prepare_scales(a["k_scale"], a["k_offset"], a["v_scale"], a["v_offset"], num_kv_heads=NKV,
                              head_size=D, tp_rank=a["tp_rank"], tp_size=a["tp_size"])

    def poison(a, rng, key, values):
        t = a[key].clone()
        t[rng.randrange(t.numel())] = rng.choice(values)
        return dict(a, **{key: t})

    muts = []
    for key in ("k_scale", "v_scale"):
        muts.append(Mut(f"{key} zero/nan/inf", [key], lambda a, rng, k=key: poison(a, rng, k, [0.0, math.nan,
                                                                                              math.inf])))
    for key in ("k_offset", "v_offset"):
        muts.append(Mut(f"{key} nan/inf", [key], lambda a, rng, k=key: poison(a, rng, k, [math.nan, -math.inf])))
    for key in ("k_scale", "k_offset", "v_scale", "v_offset"):
        muts += [
            Mut(f"{key} size", [key], lambda a, rng, k=key: dict(a, **{k: torch.ones(rng.choice([0, 3, D + 1,
                                                                                             NKV * D + 5]))})),
            Mut(f"{key} int dtype", [key], lambda a, rng, k=key: dict(a, **{k: a[k].to(torch.int32) + 1})),
        ]
    muts += [
        Mut("tp_rank out of range", ["tp_rank"], lambda a, rng: dict(a, tp_rank=rng.choice([-1, 1, 5]))),
        Mut("tp_size", ["tp_size", "tp_rank"], lambda a, rng: dict(a, tp_size=rng.choice([0, -2]))),
    ]
    fuzz(valid, call, lambda a: [], muts)
