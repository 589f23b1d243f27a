"""SFA KV offload (docs/design/sfa.md §6): the main MLA cache lives in a host pool, each decode step moves only the
top-k rows a layer's resident buffer misses.

Every run here serves a continuous batch (requests arriving, decoding, finishing, their blocks reused) with two
layers side by side on the same weights and tokens: the device-cache SFA layer and the offloaded one. The
offloaded layer must give the device layer's top-k and outputs, both must match the float64 reference of
_sfa_reference (written from the model equations), and the pool must end up holding the device cache's rows.
The total KV served exceeds the offloaded layer's device-side bytes (its resident buffers) several times.

Also: the copy accounting through the OffloadCopyHooks (bytes = misses x row size; an identical step moves
nothing), the pool shared by a second process (a reader that attends over the owner's rows), and bad input
(budget too small, a non-bf16 cache, a prefill without the device cache, a graph capture without a host-function
launcher): errors that name the argument, with the pool and the resident state unchanged.

Graph mode (docs/design/sfa.md §6.6): a decode bucket captured once (device work, a host callback, the resident
attention) and replayed every step of a continuous batch beside the eager offloaded layer, with the same top-k,
LRU decisions, copies, outputs, resident buffers and pool rows; the refusals that remain name their reason."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import zlib

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import F64, MlaDims, fill_context, make_weights, rope_tables
from _sfa_reference import IdxDims, indexer_keys, indexer_topk_request, make_indexer_weights, sfa_attend_request

sfa = aar.sfa
BF16 = torch.bfloat16
BS = 16
D = MlaDims()
IDX = IdxDims()  # top-k 8
ROW_BYTES = (D.L + D.R) * 2  # one token's latent + rope row, bf16
TOL = dict(atol=2e-2, rtol=2e-2)


def rid(name: str) -> int:
    return zlib.adler32(name.encode())  # the engine's request id, as upstream hashes it


class Layer:
    """The weights of one SFA layer (bf16) and its RoPE tables."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.ws = make_weights(D, BF16, g)
        self.iw = make_indexer_weights(D, IDX, BF16, g)
        self.scale = 1.0 / math.sqrt(D.P + D.R)
        self.cos, self.sin = rope_tables(512, D.R)

    def impl(self, *, offload=None, indexer=True, **kw):
        extra = {}
        if indexer:
            iw = self.iw
            extra = dict(index_n_head=IDX.n_head, index_head_dim=IDX.D, index_topk=IDX.K, indexer_wq_b=iw["wq_b"],
                         indexer_wk=iw["wk"], indexer_weights_proj=iw["weights_proj"],
                         indexer_k_norm_weight=iw["k_norm_weight"], indexer_k_norm_bias=iw["k_norm_bias"],
                         indexer_k_norm_eps=IDX.eps)
        extra.update(kw)
        return sfa.Impl(num_heads=D.H, hidden_size=D.hidden, q_lora_rank=D.Q, kv_lora_rank=D.L,
                        qk_nope_head_dim=D.P, qk_rope_head_dim=D.R, v_head_dim=D.V, scale=self.scale,
                        offload=offload, **extra, **self.ws)

    def builder(self, nb, mbr, *, spec=0, offload=None, max_num_reqs=4, **kw):
        return sfa.MetadataBuilder(max_num_reqs=max_num_reqs, max_num_tokens=128, max_blocks_per_req=mbr,
                                   block_size=BS, num_blocks=nb, cos_table=self.cos.to(BF16),
                                   sin_table=self.sin.to(BF16), num_speculative_tokens=spec, offload=offload, **kw)


def make_pool(nb, num_layers=1, **kw):
    budget = nb * sfa.HostKvPool.block_bytes(num_layers, BS, D.L, D.R)
    pool = sfa.HostKvPool.create(num_layers=num_layers, budget_bytes=budget, block_size=BS, kv_lora_rank=D.L,
                                 qk_rope_head_dim=D.R, **kw)
    assert pool.num_blocks == nb and pool.is_owner
    return pool


class Request:
    def __init__(self, name, prompt, total, blocks, g):
        self.name, self.id = name, rid(name)
        self.prompt, self.total = prompt, total
        self.x = torch.randn(total, D.hidden, generator=g, dtype=F64).to(BF16)
        self.blocks = blocks
        self.n = 0  # tokens whose cache rows are written


class Serve:
    """A continuous-batching run of one layer, device-cache SFA (`ref`) beside the offloaded layer (`off`).

    consumer=True: a PD decode consumer; a request's prompt rows arrive from the KV connector (written here into
    the pool, the reference's cache and both indexer caches) and every step is decode-only.
    consumer=False: keep_device_kv_cache; prompts are prefilled by the layers in chunks, steps are mixed
    (decodes first, as the offload builder requires)."""

    def __init__(self, *, consumer=True, spec=0, nb=40, max_reqs=4, tbs=16, seed=0, hooks=None, reject_every=0,
                 names=None, id_kind="adler", rotate=False, lru_threads=1, index_cache=False, pool_layers=1):
        # names: the requests' names in arrival order (default req-0, req-1, ...); id_kind: how the engine passes
        # them as req_ids ("adler": adler32 integers as upstream, "names": the strings themselves); rotate: the
        # decodes change places every step (each decode row then serves another request than at the last step).
        self.names, self.id_kind, self.rotate = names, id_kind, rotate
        self.layer = Layer(seed)
        self.g = torch.Generator().manual_seed(seed + 1)
        self.consumer, self.spec, self.nb, self.max_reqs = consumer, spec, nb, max_reqs
        self.reject_every = reject_every
        self.mbr = 8
        self.pool = make_pool(nb, num_layers=pool_layers)
        self.off_tbs = tbs
        cfg = sfa.OffloadConfig(self.pool, pool_layer=0, topk_buffer_size=tbs, is_decode_consumer=consumer,
                                keep_device_kv_cache=not consumer, max_num_reqs=max_reqs, max_num_tokens=128,
                                num_speculative_tokens=spec, copy_hooks=hooks, lru_threads=lru_threads)
        assert cfg.lru_threads == lru_threads
        # index_cache: the layers write their selection into a TopkBuffer for a later layer (IndexCacheServe).
        self.off = self.layer.impl(offload=cfg, use_index_cache=index_cache)
        self.ref = self.layer.impl(use_index_cache=index_cache)
        self.tb_off = sfa.TopkBuffer(128, IDX.K) if index_cache else None
        self.tb_ref = sfa.TopkBuffer(128, IDX.K) if index_cache else None
        self.ref_b = self.layer.builder(nb, self.mbr, spec=spec, max_num_reqs=max_reqs)
        self.off_b = self.layer.builder(nb, self.mbr, spec=spec, max_num_reqs=max_reqs,
                                        offload=sfa.BuilderOffloadConfig(is_decode_consumer=consumer))

        def garbage(dim):  # a read from a wrong row shows
            return torch.randn(nb, BS, 1, dim, generator=self.g).to(BF16)

        self.ref_kv = [garbage(D.L), garbage(D.R), garbage(IDX.D)]
        self.off_idx = garbage(IDX.D)
        self.off_main = [garbage(D.L), garbage(D.R)] if not consumer else []
        self.pool.k(0).copy_(garbage(D.L))
        self.pool.v(0).copy_(garbage(D.R))
        self.free = torch.randperm(nb, generator=self.g).tolist()
        self.active, self.served, self.arrived = [], 0, 0
        self.stats, self.peak_kv_tokens, self.kv_tokens_served = [], 0, 0

    # ---------------------------------------------------------------- requests
    def arrive(self, prompt, decode_steps):
        total = prompt + decode_steps * (1 + self.spec) + 1
        nblk = math.ceil(total / BS)
        assert nblk <= self.mbr and len(self.free) >= nblk
        blocks = [self.free.pop() for _ in range(nblk)]
        name = self.names[self.arrived] if self.names else f"req-{self.arrived}"
        r = Request(name, prompt, total, blocks, self.g)
        self.arrived += 1
        if self.consumer:  # the KV connector delivers the prompt's rows
            self.write_rows(r, 0, prompt)
            r.n = prompt
        self.active.append(r)
        return r

    def write_rows(self, r, start, end):
        """The reference rows of positions [start, end) (prefix context [0, end)) into every cache that holds
        them: the pool, the reference's device caches, both indexer caches."""
        x = r.x[:end]
        for nope, rope in ((self.pool.k(0), self.pool.v(0)), (self.ref_kv[0], self.ref_kv[1])):
            fill_context(D, self.layer.ws, x, nope, rope, r.blocks, BS)
        k = indexer_keys(D, IDX, self.layer.iw, x, torch.arange(end))
        for cache in (self.ref_kv[2], self.off_idx):
            for p in range(start, end):
                cache[r.blocks[p // BS], p % BS, 0] = k[p].to(BF16)

    def finish(self, r):
        self.active.remove(r)
        self.free.extend(r.blocks)
        self.kv_tokens_served += r.n
        self.served += 1

    def table(self, reqs):
        t = torch.zeros(len(reqs), self.mbr, dtype=torch.int32)
        for i, r in enumerate(reqs):
            t[i, :len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        return t

    # ---------------------------------------------------------------- one step
    def step(self, chunk=24):
        dec = [r for r in self.active if r.n >= r.prompt]
        pre = [r for r in self.active if r.n < r.prompt]
        if self.rotate and dec:
            k = len(self.stats) % len(dec)
            dec = dec[k:] + dec[:k]
        reqs = dec + pre  # decode-first
        q = [1 + self.spec] * len(dec) + [min(chunk, r.prompt - r.n) for r in pre]
        seq = [r.n + ql for r, ql in zip(reqs, q)]
        qsl = torch.tensor([0] + torch.tensor(q).cumsum(0).tolist(), dtype=torch.int32)
        seq_t = torch.tensor(seq, dtype=torch.int32)
        table = self.table(reqs)
        hidden = torch.cat([r.x[r.n:s] for r, s in zip(reqs, seq)])
        ids = torch.tensor([r.id for r in reqs], dtype=torch.int64) if self.id_kind == "adler" else [r.name for r in reqs]
        kw = {} if self.consumer else dict(is_prefilling=torch.tensor([r.n < r.prompt for r in reqs]))
        if self.spec:  # the engine's per-request draft counts: all-decode steps are SpecDecoding (MTP)
            kw["num_spec_tokens"] = torch.tensor([self.spec] * len(dec) + [0] * len(pre), dtype=torch.int32)
        self.before(reqs, qsl, seq_t, table, ids, kw)
        md_ref = self.ref_b.build(qsl, seq_t, table, **{k: v for k, v in kw.items() if k != "is_prefilling"})
        out_ref = torch.zeros_like(hidden)
        self.ref.forward(hidden, self.ref_kv, md_ref, out_ref, self.tb_ref)
        md = self.off_b.build(qsl, seq_t, table, req_ids=ids, **kw)
        assert md.offload_enabled and md.num_decodes == len(dec) and md.num_prefills == len(pre)
        self.md_ref, self.md = md_ref, md  # for the layers of also()
        out = torch.full_like(hidden, 3.0)
        self.off.forward(hidden, self.off_main + [self.off_idx], md, out, self.tb_off)
        st = self.off.last_offload_stats
        self.stats.append(st)
        # The offloaded layer selects what the device layer selects and attends like it.
        assert torch.equal(self.off.last_topk, self.ref.last_topk)
        torch.testing.assert_close(out, out_ref, **TOL)
        # Other runs of the same step (a graph replay of it: GraphServe).
        outs = [out] + self.also(reqs, qsl, seq_t, table, hidden, ids, kw, out, st)
        # ... and all match the float64 reference over that selection.
        t0 = 0
        for r, s, ql in zip(reqs, seq, q):
            rows = self.off.last_topk[t0:t0 + ql, 0].to(torch.int64)
            ref_topk = indexer_topk_request(D, IDX, self.layer.ws, self.layer.iw, r.x[:s], ql)[0]
            # bf16 indexer scores may swap near-ties: the sets agree on most entries.
            agree = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(rows, ref_topk))
            assert agree >= 0.75 * rows.numel(), (r.name, rows, ref_topk)
            ref = sfa_attend_request(D, self.layer.ws, r.x[:s], ql, self.layer.scale, rows)
            for o in outs:
                torch.testing.assert_close(o[t0:t0 + ql].to(F64), ref, **TOL)
            t0 += ql
        ndt = sum(q[:len(dec)])
        # Every valid entry of a decode row's top-k (a position < S of its request) is a hit or a miss.
        sel = self.off.last_topk[:ndt, 0]
        lim = torch.tensor([s for s, ql in zip(seq[:len(dec)], q[:len(dec)]) for _ in range(ql)]).view(-1, 1)
        assert st["hits"] + st["misses"] == int(((sel >= 0) & (sel < lim)).sum())
        assert st["decode_rows"] == ndt and st["prefill_tokens"] == sum(q) - ndt
        assert st["route"] == ("decode_only" if not pre else "with_prefills")
        assert st["onload_bytes"] == st["misses"] * ROW_BYTES
        assert st["commit_bytes"] == sum(q) * ROW_BYTES
        # A layer with its own indexer decides on its own (docs/design/sfa.md §6.8).
        assert st["decided_by"] == (0 if ndt else -1) and not st["resynced"]
        self.peak_kv_tokens = max(self.peak_kv_tokens, sum(seq))
        # Advance; with speculative decoding every `reject_every`-th step rejects the last draft of each decode:
        # its position is rewritten by the next step with a different token.
        for i, (r, s) in enumerate(zip(reqs, seq)):
            r.n = s
            if i < len(dec) and self.spec and self.reject_every and len(self.stats) % self.reject_every == 0:
                r.n = s - 1
                r.x[r.n] = torch.randn(D.hidden, generator=self.g, dtype=F64).to(BF16)
        for r in [r for r in self.active if r.n + 1 + self.spec > r.total]:
            self.finish(r)
        return st

    def before(self, reqs, qsl, seq_t, table, ids, kw):
        """Work of other runs before the step's layers run (DeferredGraphServe)."""

    def also(self, reqs, qsl, seq_t, table, hidden, ids, kw, out, st):
        """Other runs of the step (before the requests advance); returns their outputs of its tokens."""
        return []

    def check_pool_holds_device_rows(self):
        """Every row the run wrote (the active requests' positions < n) is in the pool as in the device cache."""
        for r in self.active:
            for p in range(r.n):
                b, o = r.blocks[p // BS], p % BS
                assert torch.equal(self.pool.k(0)[b, o], self.ref_kv[0][b, o]), (r.name, p)
                assert torch.equal(self.pool.v(0)[b, o], self.ref_kv[1][b, o]), (r.name, p)

    def resident_bytes(self):
        return self.off.resident_k.numel() * 2 + self.off.resident_v.numel() * 2


def serve(s: Serve, schedule, steps):
    """schedule: {step: [(prompt, decode_steps), ...]} arrivals before that step."""
    waiting = []
    for i in range(steps):
        waiting += schedule.get(i, [])
        # Admission: a batch slot and the blocks of the whole request (a waiting request keeps its place).
        while waiting and len(s.active) < s.max_reqs and \
                len(s.free) >= math.ceil((waiting[0][0] + waiting[0][1] * (1 + s.spec) + 1) / BS):
            s.arrive(*waiting.pop(0))
        if s.active:
            s.step()
            if i % 4 == 3:
                s.check_pool_holds_device_rows()
    s.check_pool_holds_device_rows()


SCHEDULE = {0: [(70, 6), (45, 12), (90, 4)], 2: [(60, 9)], 5: [(100, 5)], 7: [(30, 8)], 10: [(80, 6)]}


@pytest.mark.parametrize("spec", [0, 1])
def test_decode_consumer_continuous_batching_matches_device_cache(spec):
    s = Serve(consumer=True, spec=spec, reject_every=3 if spec else 0)
    serve(s, SCHEDULE, 24)
    assert s.served >= 5 and s.arrived == 7
    # The run served far more KV than the offloaded layer holds on the device (its resident buffers), at its
    # peak step and over the run.
    assert s.peak_kv_tokens * ROW_BYTES >= 2 * s.resident_bytes()
    assert s.kv_tokens_served * ROW_BYTES >= 4 * s.resident_bytes()
    assert all(st["route"] == "decode_only" for st in s.stats)
    # The LRU reused rows between steps, reset rows taken by another request, and (MTP) dropped rewritten tokens.
    # (random weights and tokens: the top-k changes a lot between steps)
    assert sum(st["hits"] for st in s.stats) > 0
    assert sum(st["resets"] for st in s.stats) >= s.arrived
    if spec:
        assert sum(st["invalidated"] for st in s.stats) > 0


def test_twenty_decode_rows_a_step_match_device_cache():
    # 10 requests with one draft each: 20 decode rows a step (the layer's resident LRU runs them on the caller's
    # thread, its default; lru_threads=2 below, the threaded split in tests/cpp/test_plan_resident_lru.cpp); each step
    # checked as above against the device-cache layer and the float64 reference.
    s = Serve(consumer=True, spec=1, nb=80, max_reqs=10, reject_every=3)
    serve(s, {0: [(40 + 6 * i, 5) for i in range(10)]}, 6)
    assert s.arrived == 10
    assert max(st["decode_rows"] for st in s.stats) == 20
    assert sum(st["hits"] for st in s.stats) > 0 and sum(st["misses"] for st in s.stats) > 0


def test_lru_threads_split_the_rows_with_the_same_decisions():
    # The 20-row run of the test above with the LRU step on 2 threads (20 rows >= 2 x 8: the rows are split over
    # the helper pool) and on one: every step matches the device-cache layer as above, and the two runs make the
    # same decisions (per-step LRU statistics and the final resident tokens of every slot).
    runs = []
    for threads in (2, 1):
        s = Serve(consumer=True, spec=1, nb=80, max_reqs=10, reject_every=3, lru_threads=threads)
        serve(s, {0: [(40 + 6 * i, 5) for i in range(10)]}, 6)
        runs.append(s)
    two, one = runs
    assert max(st["decode_rows"] for st in two.stats) == 20
    assert sum(st["misses"] for st in two.stats) > 0
    assert two.stats == one.stats
    assert torch.equal(two.off.resident_tokens(), one.off.resident_tokens())


def test_keep_device_kv_cache_mixed_prefill_and_decode_steps():
    s = Serve(consumer=False)
    serve(s, SCHEDULE, 26)
    routes = {st["route"] for st in s.stats}
    assert routes == {"decode_only", "with_prefills"}
    assert any(st["decode_rows"] and st["prefill_tokens"] for st in s.stats)  # mixed steps
    assert s.served >= 5
    assert s.kv_tokens_served * ROW_BYTES >= 4 * s.resident_bytes()


class IndexCacheServe(Serve):
    """Serve with IndexCache (docs/design/sfa.md §6.8): both layers write their selection into a TopkBuffer, and
    `readers` more layers of other weights and no indexer (pool layers 1, 2, ...) read it, each offloaded beside
    its device-cache twin. Every offloaded reader must attend like its twin and like the float64 reference over the
    selection, and repeat the LRU decision of the layer that decided on that selection: the same slots, its copies
    from its own pool layer, no LRU step of its own.

    resets: {step: "first" | pool layer}: that layer's residents are forgotten before the step (a reader following
    it must copy the deciding layer's whole state back). others: steps at which the buffer gets another selection
    (a part of it) after the first layer ran: reader 1 decides on its own, the readers after it repeat its decision."""

    def __init__(self, *, readers=1, resets=None, others=(), **kw):
        super().__init__(index_cache=True, pool_layers=1 + readers, **kw)
        self.resets, self.others = resets or {}, set(others)
        g = torch.Generator().manual_seed(5)

        def garbage(dim):
            return torch.randn(self.nb, BS, 1, dim, generator=g).to(BF16)

        self.readers = []
        for p in range(1, readers + 1):
            layer = Layer(self.layer.g.initial_seed() + 17 * p)
            cfg = sfa.OffloadConfig(self.pool, pool_layer=p, topk_buffer_size=self.off_tbs,
                                    is_decode_consumer=self.consumer, keep_device_kv_cache=not self.consumer,
                                    max_num_reqs=self.max_reqs, max_num_tokens=128, num_speculative_tokens=self.spec)
            self.readers.append(dict(p=p, layer=layer, off=layer.impl(offload=cfg, indexer=False, layer_index=p),
                                     ref=layer.impl(indexer=False, layer_index=p), ref_kv=[garbage(D.L), garbage(D.R)],
                                     off_main=[garbage(D.L), garbage(D.R)] if not self.consumer else [],
                                     stats=[], src=None))
            self.pool.k(p).copy_(garbage(D.L))
            self.pool.v(p).copy_(garbage(D.R))
        self.b_stats = self.readers[0]["stats"]

    def write_rows(self, r, start, end):
        super().write_rows(r, start, end)
        for rd in self.readers:
            p = rd["p"]
            for nope, rope in ((self.pool.k(p), self.pool.v(p)), (rd["ref_kv"][0], rd["ref_kv"][1])):
                fill_context(D, rd["layer"].ws, r.x[:end], nope, rope, r.blocks, BS)

    def before(self, reqs, qsl, seq_t, table, ids, kw):
        who = self.resets.get(len(self.stats))
        if who is not None:
            (self.off if who == "first" else self.readers[who - 1]["off"]).reset_resident()

    def also(self, reqs, qsl, seq_t, table, hidden, ids, kw, out, st):
        n_step = len(self.stats) - 1
        other = n_step in self.others
        if other:
            # Another selection: the first half of each row's (still a causal one, but not the one the first layer
            # decided on).
            decided = self.tb_off.view(hidden.shape[0]).clone()
            changed = decided.clone()
            changed[..., IDX.K // 2:] = -1
            self.tb_off.store(changed)
            self.tb_ref.store(changed)
        seq = seq_t.tolist()
        q = (qsl[1:] - qsl[:-1]).tolist()
        ndt = st["decode_rows"]
        dec_reqs = [r for r, ql in zip(reqs, q) if r.n >= r.prompt for _ in range(ql)][:ndt]
        reset = self.resets.get(n_step)
        deciders = {0: (self.off, st)}
        for rd in self.readers:
            p, off = rd["p"], rd["off"]
            out_ref = torch.zeros_like(hidden)
            rd["ref"].forward(hidden, rd["ref_kv"], self.md_ref, out_ref, self.tb_ref)
            out_b = torch.full_like(hidden, 3.0)
            off.forward(hidden, rd["off_main"], self.md, out_b, self.tb_off)
            sb = off.last_offload_stats
            rd["stats"].append(sb)
            assert off.last_topk_source == "reused"
            assert torch.equal(off.last_topk, rd["ref"].last_topk)
            torch.testing.assert_close(out_b, out_ref, **TOL)
            t0 = 0
            for r, s_, ql in zip(reqs, seq, q):
                rows = off.last_topk[t0:t0 + ql, 0].to(torch.int64)
                ref = sfa_attend_request(D, rd["layer"].ws, r.x[:s_], ql, rd["layer"].scale, rows)
                torch.testing.assert_close(out_b[t0:t0 + ql].to(F64), ref, **TOL)
                t0 += ql
            assert sb["decode_rows"] == ndt and sb["commit_bytes"] == st["commit_bytes"]
            assert sb["onload_bytes"] == sb["misses"] * ROW_BYTES
            if ndt == 0:
                assert sb["decided_by"] == -1
                continue
            # Who decides on this selection: the first layer; on another selection reader 1, followed by the rest.
            src = (p if p == 1 else 1) if other else 0
            if src == p:
                # Its own decision; from empty after repeated ones (its buffers followed another LRU).
                assert sb["decided_by"] == p and not sb["resynced"]
                if rd["src"] != p:
                    assert sb["hits"] == 0
                deciders[p] = (off, sb)
            else:
                owner, ost = deciders[src]
                assert sb["decided_by"] == src
                for k in ("hits", "resets", "invalidated", "duplicates"):
                    assert sb[k] == ost[k], k
                # Out of step with the deciding LRU: its first resident step, a step that followed another LRU,
                # a reset of either layer.
                first = rd["src"] != src or reset in (p, "first" if src == 0 else src)
                assert sb["resynced"] == bool(first), (n_step, p, sb)
                if not sb["resynced"]:
                    assert sb["misses"] == ost["misses"]  # the decision's copies, from its own pool layer
                # Its resident buffers hold its own pool layer's rows of the deciding layer's resident tokens.
                tok = owner.resident_tokens()
                assert torch.equal(off.resident_tokens(), tok)
                for row, r in enumerate(dec_reqs):
                    for slot in range(tok.shape[1]):
                        t = int(tok[row, slot])
                        if t >= 0:
                            b = r.blocks[t // BS]
                            assert torch.equal(off.resident_k[row, slot], self.pool.k(p)[b, t % BS]), (p, row, t)
                            assert torch.equal(off.resident_v[row, slot], self.pool.v(p)[b, t % BS]), (p, row, t)
            rd["src"] = src
        if other:  # the first layer's selection back (its last_topk views the buffer)
            self.tb_off.store(decided)
            self.tb_ref.store(decided)
        return []

    def check_pool_holds_device_rows(self):
        super().check_pool_holds_device_rows()
        for rd in self.readers:
            p = rd["p"]
            for r in self.active:
                for t in range(r.n):
                    b, o = r.blocks[t // BS], t % BS
                    assert torch.equal(self.pool.k(p)[b, o], rd["ref_kv"][0][b, o]), (p, r.name, t)
                    assert torch.equal(self.pool.v(p)[b, o], rd["ref_kv"][1][b, o]), (p, r.name, t)


@pytest.mark.parametrize("consumer,spec", [(True, 0), (True, 1), (False, 0)])
def test_index_cache_reader_repeats_the_first_layers_lru_decision(consumer, spec):
    s = IndexCacheServe(consumer=consumer, spec=spec, reject_every=3 if spec else 0)
    serve(s, SCHEDULE, 20)
    dec = [sb for sb in s.b_stats if sb["decode_rows"]]
    assert len(dec) >= 15 and all(sb["decided_by"] == 0 for sb in dec)
    assert [sb["resynced"] for sb in dec] == [True] + [False] * (len(dec) - 1)
    assert sum(sb["misses"] for sb in dec) > 0 and sum(sb["hits"] for sb in dec) > 0
    s.check_pool_holds_device_rows()


def test_index_cache_readers_resync_after_a_reset_and_follow_whoever_decided():
    # Two readers. Resets of the first layer's and of each reader's residents, and two steps whose buffer holds
    # another selection when the readers run (reader 1 then decides on its own, reader 2 repeats reader 1): each
    # time every reader copies what it must (also()'s checks) and its outputs stay right.
    s = IndexCacheServe(readers=2, consumer=True, spec=1, reject_every=3, resets={4: "first", 6: 1, 8: 2},
                        others=(11, 12))
    serve(s, SCHEDULE, 16)
    one, two = ([(sb["decided_by"], sb["resynced"]) for sb in rd["stats"]] for rd in s.readers)
    assert one[4] == two[4] == (0, True)
    assert one[6] == (0, True) and two[6] == (0, False)
    assert one[8] == (0, False) and two[8] == (0, True)
    assert one[11] == one[12] == (1, False) and two[11] == (1, True) and two[12] == (1, False)
    assert one[13] == two[13] == (0, True) and one[14] == two[14] == (0, False)


# ------------------------------------------------------------------------------------- copy accounting


class CountingHooks(sfa.OffloadCopyHooks):
    def __init__(self):
        super().__init__()
        self.onload_bytes = self.commit_bytes = self.onload_calls = 0

    def commit(self, pool_rows, slots, rows):
        self.commit_bytes += rows.numel() * rows.element_size()
        super().commit(pool_rows, slots, rows)

    def onload(self, dst_rows, dst_index, src_rows, src_index):
        assert dst_index.numel() == src_index.numel() > 0
        self.onload_calls += 1
        self.onload_bytes += dst_index.numel() * dst_rows.size(1) * dst_rows.element_size()
        super().onload(dst_rows, dst_index, src_rows, src_index)


def test_copy_accounting_through_the_hooks():
    hooks = CountingHooks()
    s = Serve(consumer=True, hooks=hooks)
    for prompt, n in SCHEDULE[0]:
        s.arrive(prompt, n)
    for _ in range(4):
        before = hooks.onload_bytes
        st = s.step()
        moved = hooks.onload_bytes - before
        assert moved == st["misses"] * ROW_BYTES == st["onload_bytes"]
    assert hooks.onload_calls > 0 and hooks.commit_bytes > 0


def test_an_identical_step_moves_nothing():
    """A layer reading its top-k from the TopkBuffer: the test chooses the selection. The same step twice: the
    first copies every selected row, the second none (its rows are resident), with identical outputs."""
    hooks = CountingHooks()
    layer = Layer(3)
    pool = make_pool(12)
    g = torch.Generator().manual_seed(5)
    pool.k(0).copy_(torch.randn(12, BS, 1, D.L, generator=g).to(BF16))
    pool.v(0).copy_(torch.randn(12, BS, 1, D.R, generator=g).to(BF16))
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64,
                            copy_hooks=hooks)
    reader = layer.impl(offload=cfg, indexer=False, layer_index=0)
    b = layer.builder(12, 4, max_num_reqs=2, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    seq = [40, 33]
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    # Every selected position is below the stable prefix S - 1 (the new token's row is rewritten each step).
    sel = torch.tensor([[[3, 39 - 1, 17, 0, 25, -1, 5, 6]], [[31, 1, 2, 30, 12, 13, -1, 7]]], dtype=torch.int32)
    buf = sfa.TopkBuffer(8, 8)
    hidden = torch.randn(2, D.hidden, generator=g).to(BF16)
    outs = []
    for i in range(2):
        md = b.build(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), table,
                     req_ids=torch.tensor([rid("a"), rid("b")]))
        buf.store(sel)
        before = hooks.onload_bytes
        out = torch.zeros_like(hidden)
        reader.forward(hidden, [], md, out, buf)
        st = reader.last_offload_stats
        outs.append(out)
        if i == 0:
            # every valid entry, those after a -1 included (the LRU maps them all; the kernel stops at the -1)
            assert st["misses"] == 14 and st["hits"] == 0
            assert hooks.onload_bytes - before == 14 * ROW_BYTES
        else:
            assert st["misses"] == 0 and st["hits"] == 14 and st["onload_bytes"] == 0
            assert hooks.onload_bytes == before  # nothing moved
    assert torch.equal(outs[0], outs[1])
    # The resident rows are the pool's rows of the selected tokens.
    tok = reader.resident_tokens()
    for row, r in enumerate(range(2)):
        for slot in range(16):
            p = int(tok[row, slot])
            if p >= 0:
                blk = int(table[r, p // BS])
                assert torch.equal(reader.resident_k[row, slot], pool.k(0)[blk, p % BS])
                assert torch.equal(reader.resident_v[row, slot], pool.v(0)[blk, p % BS])


# ------------------------------------------------------------------------------------- two processes


def _reader_process(name, barrier, q):
    """A second rank: attaches to the owner's pool read-only and serves the same decode steps."""
    try:
        pool = sfa.HostKvPool.attach(name)
        assert not pool.is_owner and pool.num_blocks == 40

        class Ordered(sfa.OffloadCopyHooks):
            def before_onload(self):  # the owner's commit lands before this rank reads (upstream: a TP broadcast)
                barrier.wait(60)

        s = _two_rank_run(pool, Ordered(), barrier, owner=False)
        q.put(("ok", s.float().tolist()))  # plain data: the child may exit before the parent reads
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(("error", repr(e)))


def _two_rank_run(pool, hooks, barrier, owner):
    layer = Layer(7)
    g = torch.Generator().manual_seed(8)
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64,
                            copy_hooks=hooks)
    impl = layer.impl(offload=cfg, layer_index=0)
    b = layer.builder(40, 8, max_num_reqs=2, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    xs = [torch.randn(n, D.hidden, generator=g, dtype=F64).to(BF16) for n in (50, 37)]
    blocks = [list(range(0, 4)), list(range(10, 13))]
    table = torch.tensor([blocks[0], blocks[1] + [0]], dtype=torch.int32)
    idx = torch.zeros(40, BS, 1, IDX.D, dtype=BF16)
    prompt = [44, 31]
    for r in range(2):
        if owner:  # the connector's rows land in the owner's pool
            fill_context(D, layer.ws, xs[r][:prompt[r]], pool.k(0), pool.v(0), blocks[r], BS)
        k = indexer_keys(D, IDX, layer.iw, xs[r][:prompt[r]], torch.arange(prompt[r]))
        for p in range(prompt[r]):
            idx[blocks[r][p // BS], p % BS, 0] = k[p].to(BF16)
    if owner:
        barrier.wait(60)  # the prompt rows are in the pool
    else:
        barrier.wait(60)
    outs = []
    for step in range(4):
        seq = [prompt[0] + step + 1, prompt[1] + step + 1]
        md = b.build(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), table,
                     req_ids=torch.tensor([rid("x"), rid("y")]))
        hidden = torch.cat([xs[0][seq[0] - 1:seq[0]], xs[1][seq[1] - 1:seq[1]]])
        out = torch.zeros_like(hidden)
        impl.forward(hidden, [idx], md, out)
        st = impl.last_offload_stats
        assert st["commit_bytes"] == (2 * ROW_BYTES if owner else 0)
        outs.append(out)
        for r in range(2):
            rows = impl.last_topk[r:r + 1, 0].to(torch.int64)
            ref = sfa_attend_request(D, layer.ws, xs[r][:seq[r]], 1, layer.scale, rows)
            torch.testing.assert_close(out[r:r + 1].to(F64), ref, **TOL)
    return torch.stack(outs)


def test_pool_shared_by_a_second_process():
    pool = make_pool(40)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    q = ctx.Queue()

    class Ordered(sfa.OffloadCopyHooks):
        def before_onload(self):  # after this rank's commit: the reader may copy
            barrier.wait(60)

    p = ctx.Process(target=_reader_process, args=(pool.name, barrier, q), daemon=True)
    p.start()
    try:
        mine = _two_rank_run(pool, Ordered(), barrier, owner=True)
        status, theirs = q.get(timeout=120)
        assert status == "ok", theirs
        # The reader computed nothing into the pool, read the owner's rows (including each step's committed
        # decode row), and attends exactly as the owner.
        assert torch.equal(mine.float(), torch.tensor(theirs))
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join(5)
    assert p.exitcode == 0


# ------------------------------------------------------------------------------------- bad input


def test_budget_too_small_names_the_budget():
    one = sfa.HostKvPool.block_bytes(2, BS, D.L, D.R)
    assert one == 2 * BS * (D.L + D.R) * 2
    assert sfa.HostKvPool.blocks_for_budget(10 * one + 5, 2, BS, D.L, D.R) == 10
    with pytest.raises(ValueError, match="budget_bytes=1000"):
        sfa.HostKvPool.create(num_layers=2, budget_bytes=1000, block_size=BS, kv_lora_rank=D.L, qk_rope_head_dim=D.R)
    with pytest.raises(ValueError, match="budget_bytes"):
        sfa.HostKvPool.create(num_layers=2, budget_bytes=10 * one, block_size=BS, kv_lora_rank=D.L,
                              qk_rope_head_dim=D.R, min_blocks=11)


def test_attach_to_a_missing_pool_and_names():
    with pytest.raises(RuntimeError, match="aar_no_such_pool"):
        sfa.HostKvPool.attach("/aar_no_such_pool")
    pool = make_pool(2)
    with pytest.raises(RuntimeError):  # the name is taken
        sfa.HostKvPool.create(name=pool.name, num_layers=1, budget_bytes=10 ** 6, block_size=BS, kv_lora_rank=D.L,
                              qk_rope_head_dim=D.R)
    with pytest.raises(ValueError, match="layer=1"):
        pool.k(1)


def test_configuration_checks_name_the_argument():
    layer = Layer()
    pool = make_pool(4)

    def cfg(**kw):
        args = dict(topk_buffer_size=16, is_decode_consumer=True)
        args.update(kw)
        return sfa.OffloadConfig(pool, **args)

    layer.impl(offload=cfg(), layer_index=0)  # fine
    with pytest.raises(ValueError, match="topk_buffer_size=4"):
        layer.impl(offload=cfg(topk_buffer_size=4), layer_index=0)  # < index_topk 8
    with pytest.raises(ValueError, match="keep_device_kv_cache"):
        layer.impl(offload=cfg(is_decode_consumer=False), layer_index=0)
    for threads in (-1, 65):
        with pytest.raises(ValueError, match=f"lru_threads={threads} is out of range"):
            layer.impl(offload=cfg(lru_threads=threads), layer_index=0)
    layer.impl(offload=cfg(lru_threads=0), layer_index=0)  # the hardware threads
    with pytest.raises(ValueError, match="sfa_c8"):
        layer.impl(offload=cfg(), layer_index=0, sfa_c8=True)
    with pytest.raises((ValueError, NotImplementedError), match="dcp_size"):
        layer.impl(offload=cfg(), layer_index=0, dcp_size=2)
    # A non-bf16 main cache (fp32 weights).
    ws32 = {k: v.float() if torch.is_tensor(v) else v for k, v in layer.ws.items()}
    iw = layer.iw
    with pytest.raises(ValueError, match="bfloat16"):
        sfa.Impl(num_heads=D.H, hidden_size=D.hidden, q_lora_rank=D.Q, kv_lora_rank=D.L, qk_nope_head_dim=D.P,
                 qk_rope_head_dim=D.R, v_head_dim=D.V, scale=layer.scale, index_n_head=IDX.n_head,
                 index_head_dim=IDX.D, index_topk=IDX.K, indexer_wq_b=iw["wq_b"].float(), indexer_wk=iw["wk"].float(),
                 indexer_weights_proj=iw["weights_proj"].float(),
                 indexer_k_norm_weight=iw["k_norm_weight"].float(), indexer_k_norm_bias=iw["k_norm_bias"].float(),
                 offload=cfg(), layer_index=0, **ws32)
    # The pool's row widths must be the layer's.
    other = sfa.HostKvPool.create(num_layers=1, budget_bytes=10 ** 6, block_size=BS, kv_lora_rank=D.L + 16,
                                  qk_rope_head_dim=D.R)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        layer.impl(offload=sfa.OffloadConfig(other, topk_buffer_size=16, is_decode_consumer=True), layer_index=0)


def test_bad_steps_are_refused_with_nothing_lost():
    s = Serve(consumer=True)
    for prompt, n in SCHEDULE[0]:
        s.arrive(prompt, n)
    s.step()
    s.step()
    pool_k, pool_v = s.pool.k(0).clone(), s.pool.v(0).clone()
    idx = s.off_idx.clone()
    tokens = s.off.resident_tokens()
    stats = s.off.last_offload_stats
    reqs = s.active
    q = [1] * len(reqs)
    seq = [r.n + 1 for r in reqs]
    qsl = torch.tensor([0] + torch.tensor(q).cumsum(0).tolist(), dtype=torch.int32)
    hidden = torch.cat([r.x[r.n:r.n + 1] for r in reqs])
    ids = torch.tensor([r.id for r in reqs])
    md = s.off_b.build(qsl, torch.tensor(seq, dtype=torch.int32), s.table(reqs), req_ids=ids)

    def unchanged():
        assert torch.equal(s.pool.k(0), pool_k) and torch.equal(s.pool.v(0), pool_v)
        assert torch.equal(s.off_idx, idx)
        assert torch.equal(s.off.resident_tokens(), tokens)

    # The offload builder needs the request ids.
    with pytest.raises(ValueError, match="req_ids"):
        s.off_b.build(qsl, torch.tensor(seq, dtype=torch.int32), s.table(reqs))
    # A plain builder's metadata on an offloaded layer.
    md_plain = s.ref_b.build(qsl, torch.tensor(seq, dtype=torch.int32), s.table(reqs))
    with pytest.raises(ValueError, match="offload"):
        s.off.forward(hidden, [s.off_idx], md_plain, torch.zeros_like(hidden))
    unchanged()
    md = s.off_b.build(qsl, torch.tensor(seq, dtype=torch.int32), s.table(reqs), req_ids=ids)
    # The main cache passed to a layer without keep_device_kv_cache.
    with pytest.raises(ValueError, match="indexer part only"):
        s.off.forward(hidden, s.ref_kv, md, torch.zeros_like(hidden))
    unchanged()
    # A graph capture on a provider that cannot launch the host callback: refused before anything runs.
    g = aar.GraphParams("noop")
    with pytest.raises(NotImplementedError, match="launch_host_func"):
        with g.capture(len(reqs)):
            s.off.forward(hidden, [s.off_idx], md, torch.zeros_like(hidden))
    unchanged()
    assert s.off.last_offload_stats == stats
    # A prefill on a decode consumer without the device cache.
    r = s.arrive(20, 3)  # the connector wrote its prompt rows into the pool: the new reference state
    r.n = 0
    pool_k, pool_v = s.pool.k(0).clone(), s.pool.v(0).clone()
    idx = s.off_idx.clone()
    pre = s.off_b.build(torch.tensor([0, 20], dtype=torch.int32), torch.tensor([20], dtype=torch.int32),
                        s.table([r]), req_ids=torch.tensor([r.id]))
    with pytest.raises(ValueError, match="keep_device_kv_cache"):
        s.off.forward(r.x[:20], [s.off_idx], pre, torch.zeros(20, D.hidden, dtype=BF16))
    unchanged()
    s.finish(r)
    # The next good step succeeds and matches the device layer.
    st = s.step()
    assert st["decode_rows"] == len(reqs)


def test_rewritten_speculative_tokens_are_copied_again():
    """MTP: a step rewrites the rows of positions >= S - q (rejected drafts get new tokens). The resident copies of
    those tokens are dropped (docs/design/sfa.md §6.3) and copied again from the pool's new rows; nothing stale is read."""
    layer = Layer(4)
    nb = 12
    pool = make_pool(nb)
    g = torch.Generator().manual_seed(6)
    pool.k(0).copy_(torch.randn(nb, BS, 1, D.L, generator=g).to(BF16))
    pool.v(0).copy_(torch.randn(nb, BS, 1, D.R, generator=g).to(BF16))
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64,
                            num_speculative_tokens=1)
    reader = layer.impl(offload=cfg, indexer=False, layer_index=0)
    b = layer.builder(nb, 4, spec=1, max_num_reqs=2, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    seq = [40, 33]  # two tokens each: positions 38, 39 and 31, 32 are written by every step
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    sel = torch.tensor([[3, 38, 39, 17, 0, -1, -1, -1], [3, 38, 39, 17, 0, -1, -1, -1],
                        [31, 32, 2, 30, -1, -1, -1, -1], [31, 32, 2, 30, -1, -1, -1, -1]], dtype=torch.int32)
    buf = sfa.TopkBuffer(8, 8)
    for step in range(3):
        hidden = torch.randn(4, D.hidden, generator=g).to(BF16)  # new tokens at the same positions
        md = b.build(torch.tensor([0, 2, 4], dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), table,
                     num_spec_tokens=torch.tensor([1, 1], dtype=torch.int32),
                     req_ids=torch.tensor([rid("a"), rid("b")]))
        assert md.attn_state == aar.AttentionState.SpecDecoding
        buf.store(sel.unsqueeze(1))
        reader.forward(hidden, [], md, torch.zeros_like(hidden), buf)
        st = reader.last_offload_stats
        if step == 0:
            assert st["misses"] == 18 and st["hits"] == 0 and st["invalidated"] == 0
        else:
            # per row: the two rewritten positions are invalidated and missed again, the rest hit
            assert st["invalidated"] == 8 and st["misses"] == 8 and st["hits"] == 10
        tok = reader.resident_tokens()
        for row, r in enumerate([0, 0, 1, 1]):
            for slot in range(16):
                p = int(tok[row, slot])
                if p >= 0:
                    blk = int(table[r, p // BS])
                    assert torch.equal(reader.resident_k[row, slot], pool.k(0)[blk, p % BS]), (step, row, p)
                    assert torch.equal(reader.resident_v[row, slot], pool.v(0)[blk, p % BS]), (step, row, p)


def test_offload_builder_split_maps_and_rebased_prefill_lengths():
    layer = Layer()
    b = layer.builder(40, 8, spec=1, offload=sfa.BuilderOffloadConfig(is_decode_consumer=False))
    # Two decodes (2 tokens each: MTP), a 1-token extend of a request still prefilling its prompt (a prefill:
    # not a decode consumer), a 5-token chunk.
    q, seq = [2, 2, 1, 5], [30, 12, 9, 20]
    qsl = torch.tensor([0, 2, 4, 5, 10], dtype=torch.int32)
    table = torch.arange(32, dtype=torch.int32).view(4, 8)
    ids = torch.tensor([7, 2 ** 32 - 1, 5, 9])
    pre = torch.tensor([False, False, True, True])
    md = b.build(qsl, torch.tensor(seq, dtype=torch.int32), table, num_input_tokens=12, req_ids=ids,
                 is_prefilling=pre)
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (2, 4, 2)
    assert md.req_ids_list == [7, 2 ** 32 - 1, 5, 9]
    assert md.token_to_req_list == [0, 0, 1, 1, 2, 3, 3, 3, 3, 3, -1, -1]
    assert md.prefill_cum_query_lens.tolist() == [1, 6]  # rebased to the first prefill
    assert md.prefill_seq_lens.tolist() == [9, 20]
    assert torch.equal(md.prefill_block_table, table[2:4])
    assert md.decode_req_ids_list == [7, 7, 2 ** 32 - 1, 2 ** 32 - 1]
    assert md.decode_seq_lens_list == [30, 30, 12, 12]
    assert md.decode_stable_prefix_list == [28, 28, 10, 10]
    # A decode consumer treats the short extend as a decode; it takes no is_prefilling.
    bc = layer.builder(40, 8, spec=1, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    mdc = bc.build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=ids)
    assert (mdc.num_decodes, mdc.num_decode_tokens, mdc.num_prefills) == (3, 5, 1)
    with pytest.raises(ValueError, match="is_prefilling"):
        bc.build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=ids, is_prefilling=pre)
    with pytest.raises(ValueError, match="is_prefilling"):
        b.build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=ids)
    with pytest.raises(ValueError, match="req_ids"):
        b.build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=ids[:3], is_prefilling=pre)
    with pytest.raises(ValueError, match=r"req_ids\[3\]=1 repeats req_ids\[0\]"):
        b.build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=torch.tensor([1, 2, 3, 1]),
                is_prefilling=pre)
    # A decode after the first prefill: the batch must be decode-first.
    with pytest.raises(ValueError, match="decode"):
        b.build(torch.tensor([0, 5, 7], dtype=torch.int32), torch.tensor([20, 30], dtype=torch.int32), table[:2],
                req_ids=ids[:2], is_prefilling=torch.tensor([True, False]))
    # A plain builder takes no offload inputs.
    with pytest.raises(ValueError, match="req_ids"):
        layer.builder(40, 8).build(qsl, torch.tensor(seq, dtype=torch.int32), table, req_ids=ids)


def _check_resident(reader, pool, tables):
    """Every resident slot of row t holds the pool's row of its token (tables[t]: the block table of row t's
    request)."""
    tok = reader.resident_tokens()
    for row, table in enumerate(tables):
        for slot in range(tok.shape[1]):
            p = int(tok[row, slot])
            if p >= 0:
                blk = int(table[p // BS])
                assert torch.equal(reader.resident_k[row, slot], pool.k(0)[blk, p % BS]), (row, p)
                assert torch.equal(reader.resident_v[row, slot], pool.v(0)[blk, p % BS]), (row, p)


def test_rows_a_step_skips_forget_their_residents():
    """MTP: request A decodes on rows 2-3, then on rows 0-1 while its rejected draft's row is rewritten, then on
    rows 2-3 again with the same id. Rows 2-3 must not serve the copies they made two steps before."""
    layer = Layer(9)
    nb = 16
    pool = make_pool(nb)
    g = torch.Generator().manual_seed(10)
    pool.k(0).copy_(torch.randn(nb, BS, 1, D.L, generator=g).to(BF16))
    pool.v(0).copy_(torch.randn(nb, BS, 1, D.R, generator=g).to(BF16))
    cfg = sfa.OffloadConfig(pool, topk_buffer_size=16, is_decode_consumer=True, max_num_reqs=2, max_num_tokens=64,
                            num_speculative_tokens=1)
    reader = layer.impl(offload=cfg, indexer=False, layer_index=0)
    b = layer.builder(nb, 4, spec=1, max_num_reqs=2, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    tables = {"A": [0, 1, 2, 3], "C": [4, 5, 6, 7], "D": [8, 9, 10, 11]}
    buf = sfa.TopkBuffer(8, 8)

    def step(names, seq, sel):
        table = torch.tensor([tables[n] for n in names], dtype=torch.int32)
        md = b.build(torch.arange(0, 2 * len(names) + 1, 2, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32),
                     table, num_spec_tokens=torch.tensor([1] * len(names), dtype=torch.int32),
                     req_ids=torch.tensor([rid(n) for n in names]))
        rows = torch.full((2 * len(names), 1, 8), -1, dtype=torch.int32)
        for i, s in enumerate(sel):
            rows[2 * i:2 * i + 2, 0, :len(s)] = torch.tensor(s, dtype=torch.int32)
        buf.store(rows)
        hidden = torch.randn(2 * len(names), D.hidden, generator=g).to(BF16)
        reader.forward(hidden, [], md, torch.zeros_like(hidden), buf)
        _check_resident(reader, pool, [tables[n] for n in names for _ in range(2)])

    step(["C", "A"], [30, 40], [[1, 2], [5, 38, 39]])   # A's rows 2-3 copy its tokens 38, 39
    step(["A"], [40, ], [[5, 38, 39]])                   # A on rows 0-1: 39 rejected and rewritten
    step(["D", "A"], [20, 41], [[3], [5, 38, 39]])      # A back on rows 2-3, stable prefix 39
    assert reader.last_offload_stats["resets"] == 4      # D's rows (new) and A's rows (skipped a step)


def test_a_reader_process_needs_copy_hooks_and_gets_copies():
    layer = Layer()
    pool = make_pool(4)
    reader_pool = sfa.HostKvPool.attach(pool.name)
    assert not reader_pool.is_owner and reader_pool.num_blocks == 4
    with pytest.raises(ValueError, match="copy_hooks"):
        layer.impl(offload=sfa.OffloadConfig(reader_pool, topk_buffer_size=16, is_decode_consumer=True),
                   layer_index=0)
    layer.impl(offload=sfa.OffloadConfig(reader_pool, topk_buffer_size=16, is_decode_consumer=True,
                                         copy_hooks=sfa.OffloadCopyHooks()), layer_index=0)
    pool.k(0)[1, 2, 0, 3] = 5.0
    got = reader_pool.k(0)  # a copy of the read-only mapping
    assert float(got[1, 2, 0, 3]) == 5.0
    got.zero_()
    assert float(pool.k(0)[1, 2, 0, 3]) == 5.0


def test_unpin_that_raises_does_not_take_the_process_down(monkeypatch):
    import sys
    calls, unraisable = [], []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_type))
    pool = make_pool(2, pin=lambda addr, n: calls.append(("pin", n)), unpin=lambda addr: 1 / 0)
    assert calls == [("pin", pool.segment_bytes)]
    del pool  # the unpin error is reported as unraisable, the mapping goes
    assert unraisable == [ZeroDivisionError]


# ---------------------------------------------------------------- request identities (issue 26, item 1)

COLLIDING = ["req-1001", "req-0110"]  # zlib.adler32 gives both 197591608


def test_colliding_hashed_ids_in_one_batch_are_refused_by_name():
    assert rid(COLLIDING[0]) == rid(COLLIDING[1])
    s = Serve(consumer=True, names=COLLIDING + ["req-2"], id_kind="adler")
    s.arrive(40, 6)
    s.arrive(50, 6)
    pool_k, tokens = s.pool.k(0).clone(), s.off.resident_tokens().clone()
    with pytest.raises(ValueError, match=r"req_ids\[1\]=197591608 repeats req_ids\[0\]"):
        s.step()
    assert torch.equal(s.pool.k(0), pool_k) and torch.equal(s.off.resident_tokens(), tokens)


@pytest.mark.parametrize("consumer", [True, False])
def test_string_request_ids_keep_colliding_requests_apart(consumer):
    # Two requests whose adler32 ids collide, in flight together, changing rows every step: with their names as
    # req_ids the builder keys residency by keys that never collide, so every step equals the device layer and the
    # float64 reference (Serve.step asserts both). Keyed by the 32-bit hash this batch could not even be built.
    s = Serve(consumer=consumer, names=COLLIDING + ["req-2", "req-3"], id_kind="names", rotate=True)
    serve(s, {0: [(40, 8), (50, 8)], 3: [(30, 6)]}, 12)
    assert s.served >= 2
    assert max(st["resets"] for st in s.stats) >= 2  # rows changed requests: reset, never reused


def test_string_request_ids_are_stable_across_steps_and_checked():
    layer = Layer()
    b = layer.builder(40, 8, offload=sfa.BuilderOffloadConfig(is_decode_consumer=True))
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    seq = torch.tensor([9, 12], dtype=torch.int32)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    k1 = b.build(qsl, seq, table, req_ids=["a", "b"]).req_ids_list
    k2 = b.build(qsl, seq, table, req_ids=["b", "a"]).req_ids_list
    assert k2 == [k1[1], k1[0]] and k1[0] != k1[1]
    k3 = b.build(qsl, seq, table, req_ids=["b", "c"]).req_ids_list  # "a" left: "c" gets a key never used before
    assert k3[0] == k1[1] and k3[1] not in k1
    k4 = b.build(qsl, seq, table, req_ids=["a", "c"]).req_ids_list  # "a" came back after a gap: a new key
    assert k4[0] not in k1 + k3 and k4[1] == k3[1]
    with pytest.raises(ValueError, match=r'req_ids\[1\]="c" repeats req_ids\[0\]'):
        b.build(qsl, seq, table, req_ids=["c", "c"])
    with pytest.raises(ValueError, match=r"req_ids\[1\] must be a str"):
        b.build(qsl, seq, table, req_ids=["c", 3])
    # 64-bit integer ids are taken exactly (no 32-bit range any more).
    assert b.build(qsl, seq, table, req_ids=torch.tensor([2 ** 40, -5])).req_ids_list == [2 ** 40, -5]


# ---------------------------------------------------------------- the pool's owner and names (issue 26, items 7, 8)

def _create_pool_and_die(name, nb):
    import os

    import ascend_attn_rt as aar_child

    pool = aar_child.sfa.HostKvPool.create(name=name, num_layers=1, block_size=BS, kv_lora_rank=D.L,
                                           qk_rope_head_dim=D.R,
                                           budget_bytes=nb * aar_child.sfa.HostKvPool.block_bytes(1, BS, D.L, D.R))
    assert pool.is_owner
    os._exit(0)  # dies without destroying its pool: the name stays behind


def test_attach_refuses_a_pool_whose_owner_died():
    name = f"/aar_dead_owner_{os.getpid()}"
    sfa.HostKvPool.unlink(name)
    p = mp.get_context("spawn").Process(target=_create_pool_and_die, args=(name, 4), daemon=True)
    p.start()
    p.join(120)
    assert p.exitcode == 0
    try:
        with pytest.raises(RuntimeError, match=rf"created by process {p.pid}, which has exited"):
            sfa.HostKvPool.attach(name)
    finally:
        assert sfa.HostKvPool.unlink(name)
    # A live owner's pool attaches, and says its owner is alive.
    pool = make_pool(2)
    reader = sfa.HostKvPool.attach(pool.name)
    assert reader.owner_alive and not reader.is_owner and pool.owner_alive


def test_pool_names_with_a_nul_byte_and_negative_pool_layers_are_refused():
    for call in (lambda: sfa.HostKvPool.attach("/aar_pool\0x"), lambda: sfa.HostKvPool.unlink("/aar_pool\0x"),
                 lambda: sfa.HostKvPool.create(name="/aar_pool\0x", num_layers=1, budget_bytes=10 ** 6, block_size=BS,
                                               kv_lora_rank=D.L, qk_rope_head_dim=D.R)):
        with pytest.raises(ValueError, match="NUL byte at offset 9"):
            call()
    layer = Layer()
    pool = make_pool(4)
    with pytest.raises(ValueError, match="offload.pool_layer=-2"):
        layer.impl(offload=sfa.OffloadConfig(pool, pool_layer=-2, topk_buffer_size=16, is_decode_consumer=True),
                   layer_index=0)
    layer.impl(offload=sfa.OffloadConfig(pool, pool_layer=-1, topk_buffer_size=16, is_decode_consumer=True),
               layer_index=0)  # -1: the layer's layer_index


# ---------------------------------------------------------------- graph capture (docs/design/sfa.md §6.6)

class GraphServe(Serve):
    """Serve, plus `layers` more offloaded layers (pool layers 0, 1, ... of a pool of their own) captured
    together once for a decode bucket of every batch slot (graph_decode_padding), updated and replayed every
    decode-only step beside the eager layer; with keep_device_kv_cache (consumer=False) the same layers run the
    steps with prefills eagerly, as an engine does. Each has its own resident buffers and caches; the same
    weights and tokens, so each must do exactly what the eager offloaded layer does.

    reader: after them one more layer of the same weights without an indexer (pool layer `layers`), reading the
    selection the first one writes into a TopkBuffer (IndexCache): it must repeat that layer's LRU decision in its
    host callback (docs/design/sfa.md §6.8) and so also do what the eager layer does."""

    def __init__(self, *, spec=0, consumer=True, layers=1, reader=False, **kw):
        super().__init__(consumer=consumer, spec=spec, **kw)
        self.bucket = self.max_reqs * (1 + spec)
        self.pool_g = make_pool(self.nb, num_layers=layers + reader)
        for i in range(layers + reader):
            self.pool_g.k(i).copy_(self.pool.k(0))
            self.pool_g.v(i).copy_(self.pool.v(0))
        self.idx_g = [self.off_idx.clone() for _ in range(layers)]
        self.main_g = [[t.clone() for t in self.off_main] for _ in range(layers + reader)]  # keep_device_kv_cache
        self.tb_g = sfa.TopkBuffer(128, IDX.K) if reader else None  # the eager steps with prefills too
        self.reader = reader

        def config(i):
            return sfa.OffloadConfig(self.pool_g, pool_layer=i, topk_buffer_size=self.off_tbs,
                                     is_decode_consumer=consumer, keep_device_kv_cache=not consumer,
                                     max_num_reqs=self.max_reqs, max_num_tokens=128, num_speculative_tokens=spec)

        self.gphs = [self.layer.impl(offload=config(i), layer_index=i, use_index_cache=reader and i == 0)
                     for i in range(layers)]
        if reader:
            self.gphs.append(self.layer.impl(offload=config(layers), indexer=False, layer_index=layers))
        self.first_dec = None
        self.gph, self.gph_idx = self.gphs[0], self.idx_g[0]
        self.gph_b = self.layer.builder(self.nb, self.mbr, spec=spec, max_num_reqs=self.max_reqs,
                                        graph_decode_padding=True,
                                        offload=sfa.BuilderOffloadConfig(is_decode_consumer=consumer))
        self.hidden_g = torch.zeros(self.bucket, D.hidden, dtype=BF16)
        self.outs_g = [torch.zeros(self.bucket, D.hidden, dtype=BF16) for _ in self.gphs]
        self.graph = aar.GraphParams("recording")
        q = 1 + spec
        n = self.max_reqs
        state = aar.AttentionState.SpecDecoding if spec else aar.AttentionState.DecodeOnly
        md = self.gph_b.build_for_graph_capture(
            torch.arange(0, n * q + 1, q, dtype=torch.int32), torch.full((n,), q, dtype=torch.int32),
            torch.zeros(n, self.mbr, dtype=torch.int32), req_ids=torch.arange(1000, 1000 + n),
            num_input_tokens=self.bucket, state=state,
            **({} if consumer else dict(is_prefilling=torch.zeros(n, dtype=torch.bool))))
        pool_k, idx = self.pool_g.k(0).clone(), self.gph_idx.clone()
        with self.graph.capture(self.bucket):
            for i, layer in enumerate(self.gphs):
                layer.forward(self.hidden_g, self.caches_g(i), md, self.outs_g[i], self.tb_g)
        # Nothing ran at capture on the recording provider.
        assert torch.equal(self.pool_g.k(0), pool_k) and torch.equal(self.gph_idx, idx)
        assert self.graph.calls(self.bucket) == [(k, i, 0) for i in range(len(self.gphs))
                                                 for k in ("prepare", "host_callback", "prepare")]
        self.replays = self.eager_steps = 0

    def caches_g(self, i):
        return self.main_g[i] + ([self.idx_g[i]] if i < len(self.idx_g) else [])

    def write_rows(self, r, start, end):
        super().write_rows(r, start, end)
        self.write_graph_rows(r, start, end)

    def write_graph_rows(self, r, start, end):
        k = indexer_keys(D, IDX, self.layer.iw, r.x[:end], torch.arange(end))
        for i in range(len(self.gphs)):
            fill_context(D, self.layer.ws, r.x[:end], self.pool_g.k(i), self.pool_g.v(i), r.blocks, BS)
        for cache in self.idx_g:
            for p in range(start, end):
                cache[r.blocks[p // BS], p % BS, 0] = k[p].to(BF16)

    def also(self, reqs, qsl, seq_t, table, hidden, ids, kw, out, st):
        n = hidden.shape[0]
        if st["route"] == "with_prefills":
            # Steps with prefills run eagerly on the same layers (and their LRUs), outside the graph.
            md = self.gph_b.build(qsl, seq_t, table, req_ids=ids, **kw)
            res = [torch.full_like(hidden, 3.0) for _ in self.gphs]
            for i, layer in enumerate(self.gphs):
                layer.forward(hidden, self.caches_g(i), md, res[i], self.tb_g)
            self.eager_steps += 1
        else:
            assert n <= self.bucket
            md = self.gph_b.build(qsl, seq_t, table, req_ids=ids, num_input_tokens=self.bucket, **kw)
            assert md.num_kernel_reqs == self.max_reqs  # padded to the bucket
            self.hidden_g.zero_()
            self.hidden_g[:n] = hidden
            for o in self.outs_g:
                o.fill_(5.0)
            self.graph.update(self.bucket, md)
            self.graph.replay(self.bucket)
            self.replays += 1
            res = [o[:n] for o in self.outs_g]
            assert all(torch.count_nonzero(o[n:]) == 0 for o in self.outs_g)  # the padding rows
        # Each did what the eager offloaded layer did: same selection, LRU decisions, copies, outputs, resident
        # buffers, pool rows and device caches.
        if st["decode_rows"] and self.first_dec is None:
            self.first_dec = len(self.stats) - 1
        for i, layer in enumerate(self.gphs):
            assert torch.equal(layer.last_topk[:n], self.off.last_topk)
            want = dict(st, decided_by=i if st["decode_rows"] else -1)
            if self.reader and i == len(self.gphs) - 1 and st["decode_rows"]:
                # The reader repeated the first layer's decision: copied its whole state at its first resident
                # step, its copies since.
                want = dict(want, decided_by=0, resynced=self.first_dec == len(self.stats) - 1)
                if want["resynced"]:
                    want["misses"] = layer.last_offload_stats["misses"]
                    want["onload_bytes"] = want["misses"] * ROW_BYTES
            assert layer.last_offload_stats == want
            torch.testing.assert_close(res[i], out, atol=1e-2, rtol=1e-2)
            for a, b in zip(self.main_g[i], self.off_main):
                assert torch.equal(a, b)
            assert torch.equal(layer.resident_tokens(), self.off.resident_tokens())
            assert torch.equal(layer.resident_k, self.off.resident_k)
            assert torch.equal(layer.resident_v, self.off.resident_v)
            assert torch.equal(self.pool_g.k(i), self.pool.k(0)) and torch.equal(self.pool_g.v(i), self.pool.v(0))
        for cache in self.idx_g:
            assert torch.equal(cache, self.off_idx)
        return res


@pytest.mark.parametrize("spec,rotate,layers,reader", [(0, False, 2, False), (0, True, 1, False), (1, False, 1, False),
                                                      (1, False, 1, True)])
def test_graph_replay_matches_eager_offload(spec, rotate, layers, reader):
    # layers=2: two offloaded layers in one bucket share the offload workspace, replayed in layer order.
    # reader: an IndexCache layer after them repeats the first one's LRU decision in its host callback.
    s = GraphServe(spec=spec, rotate=rotate, layers=layers, reader=reader, reject_every=3 if spec else 0)
    serve(s, SCHEDULE, 16)
    assert s.replays == len(s.stats) >= 14
    total = {k: sum(st[k] for st in s.stats) for k in ("hits", "misses", "resets")}
    # New requests reset their rows, selections change between steps: hits and misses both.
    assert total["hits"] > 0 and total["misses"] > 0 and total["resets"] >= 5
    if spec:
        assert sum(st["invalidated"] for st in s.stats) > 0
    # The replays left the rows of a batch slot with fewer requests than the bucket (padding rows) empty.
    assert any(st["decode_rows"] < s.bucket for st in s.stats)


class DeferredGraphServe(GraphServe):
    """GraphServe with the recording provider's deferred host callbacks (docs/design/graph.md §1.6), as a device
    runs them: step n's replay runs its device work up to the host callback and queues the rest; the engine then
    builds step n+1 on the SAME builder (its host lists overwritten) and updates the bucket with it, and only then
    does step n's callback run (the queue drains), before step n+1's layers run. Step n's callback must read step
    n's lists (the update's snapshot, docs/design/sfa.md §6.7): its LRU decisions, copies, outputs, resident
    buffers and pool rows are then the eager offloaded layer's for step n."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.graph.defer_host_callbacks = True
        self.pending = None  # step n's eager output and its row count, while its callback is queued
        self.drained = 0
        self.late = []

    def write_rows(self, r, start, end):
        # A request arriving after step n takes blocks step n's finished requests freed: the KV connector's rows
        # land in the graph layers' pool once step n has completed (its callbacks ran), as blocks are freed and
        # reused only after the step that finished their request.
        Serve.write_rows(self, r, start, end)
        self.late.append((r, start, end))

    def drain(self):
        if self.pending is None:
            for r, start, end in self.late:
                self.write_graph_rows(r, start, end)
            self.late = []
            return None
        out, n, st, seq_lens = self.pending
        assert self.graph.deferred > 0  # step n's callback and the attention after it had not run
        self.graph.run_deferred()
        assert self.graph.deferred == 0
        self.drained += 1
        for r, start, end in self.late:
            self.write_graph_rows(r, start, end)
        self.late = []
        # The eager offloaded layer is still at step n (its step n+1 runs after this).
        for i, layer in enumerate(self.gphs):
            assert layer.last_offload_stats == dict(st, decided_by=i if st["decode_rows"] else -1)
            assert torch.equal(layer.resident_tokens(), self.off.resident_tokens())
            assert torch.equal(layer.resident_k, self.off.resident_k)
            assert torch.equal(layer.resident_v, self.off.resident_v)
            assert torch.equal(self.pool_g.k(i), self.pool.k(0)) and torch.equal(self.pool_g.v(i), self.pool.v(0))
            assert torch.equal(self.idx_g[i], self.off_idx)
            torch.testing.assert_close(self.outs_g[i][:n], out, atol=1e-2, rtol=1e-2)
            assert torch.count_nonzero(self.outs_g[i][n:]) == 0  # the padding rows
        self.pending = None
        return seq_lens

    def before(self, reqs, qsl, seq_t, table, ids, kw):
        # Step n+1's build and update on the captured builder, then step n's queued callback.
        md = self.gph_b.build(qsl, seq_t, table, req_ids=ids, num_input_tokens=self.bucket, **kw)
        assert md.num_prefills == 0
        self.graph.update(self.bucket, md)
        prev = self.drain()
        if prev is not None:
            # The builder's lists now hold step n+1's: the requests moved on (their lengths grew).
            assert not torch.equal(prev, seq_t[:len(prev)]) or len(prev) != len(seq_t)

    def also(self, reqs, qsl, seq_t, table, hidden, ids, kw, out, st):
        n = hidden.shape[0]
        self.hidden_g.zero_()
        self.hidden_g[:n] = hidden
        for o in self.outs_g:
            o.fill_(5.0)
        self.graph.replay(self.bucket)
        self.replays += 1
        for layer in self.gphs:  # the device work before the callback ran at once
            assert torch.equal(layer.last_topk[:n], self.off.last_topk)
        assert self.graph.deferred > 0
        self.pending = (out.clone(), n, st, seq_t.clone())
        return []


@pytest.mark.parametrize("spec,rotate", [(0, True), (1, False)])
def test_graph_host_callback_reads_its_update_after_the_next_build_and_update(spec, rotate):
    s = DeferredGraphServe(spec=spec, rotate=rotate, reject_every=3 if spec else 0)
    serve(s, SCHEDULE, 16)
    s.drain()
    assert s.replays == len(s.stats) >= 14 and s.drained == s.replays
    assert sum(st["misses"] for st in s.stats) > 0 and sum(st["hits"] for st in s.stats) > 0
    assert sum(st["resets"] for st in s.stats) >= 5


def test_graph_updates_beyond_the_pending_snapshots_are_refused():
    s = GraphServe()
    for prompt, n in SCHEDULE[0]:
        s.arrive(prompt, n)
    s.step()
    s.graph.defer_host_callbacks = True
    b, reqs = s.bucket, s.active
    seq = torch.tensor([r.n + 1 for r in reqs], dtype=torch.int32)
    qsl = torch.arange(len(reqs) + 1, dtype=torch.int32)
    ids = torch.tensor([r.id for r in reqs])

    def build():
        return s.gph_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)

    # An update nobody replayed is replaced by the next one (it takes no slot of its own).
    for _ in range(5):
        s.graph.update(b, build())
    # Three replays whose callbacks the stream has not reached yet hold the bucket's three snapshots.
    for _ in range(3):
        md = build()
        s.graph.update(b, md)
        s.graph.replay(b)
    queued = s.graph.deferred
    tokens, pool_k = s.gph.resident_tokens(), s.pool_g.k(0).clone()
    # (The latest build again: on the CPU the queued device work reads the builder's buffers, which a build
    # would rewrite; a device orders those copies after it.)
    with pytest.raises(ValueError, match=r"host inputs of 3 earlier updates are still pending"):
        s.graph.update(b, md)
    # Refused by the checks: nothing ran, nothing was queued, the bucket keeps its last update's snapshot.
    assert s.graph.deferred == queued
    assert torch.equal(s.gph.resident_tokens(), tokens) and torch.equal(s.pool_g.k(0), pool_k)
    with pytest.raises(ValueError, match="before update"):
        s.graph.replay(b)
    s.graph.run_deferred()
    s.graph.update(b, build())  # the callbacks ran: their slots are free again
    s.graph.replay(b)
    s.graph.run_deferred()
    # A replay needs its own update: with the queue drained and no update, none is left for the callback.
    with pytest.raises(ValueError, match="before update"):
        s.graph.replay(b)


def test_graph_replays_decode_steps_and_the_layer_runs_prefill_steps_eagerly():
    # keep_device_kv_cache: mixed steps run eagerly on the captured layers, decode-only steps replay its bucket
    # (with an IndexCache reader repeating the first layer's decisions in both).
    s = GraphServe(consumer=False, reader=True)
    serve(s, SCHEDULE, 20)
    assert s.replays >= 3 and s.eager_steps >= 3 and s.replays + s.eager_steps == len(s.stats)
    assert sum(st["misses"] for st in s.stats) > 0 and sum(st["hits"] for st in s.stats) > 0


def test_graph_refusals_name_the_reason():
    s = GraphServe()
    for prompt, n in SCHEDULE[0]:
        s.arrive(prompt, n)
    s.step()
    b = s.bucket
    reqs = s.active
    q = [1] * len(reqs)
    seq = torch.tensor([r.n + 1 for r in reqs], dtype=torch.int32)
    qsl = torch.tensor([0] + torch.tensor(q).cumsum(0).tolist(), dtype=torch.int32)
    ids = torch.tensor([r.id for r in reqs])
    tokens = s.gph.resident_tokens()
    pool_k = s.pool_g.k(0).clone()

    def unchanged():
        assert torch.equal(s.gph.resident_tokens(), tokens) and torch.equal(s.pool_g.k(0), pool_k)

    # A replay consumes its update: the next replay needs the next step's.
    with pytest.raises(ValueError, match="before update"):
        s.graph.replay(b)
    # The update needs the SFA metadata of the captured builder lane, padded to the bucket.
    md_plain = s.off_b.build(qsl, seq, s.table(reqs), req_ids=ids)
    with pytest.raises(ValueError, match="does not fit SFA KV-offload bucket"):
        s.graph.update(b, md_plain)
    md_other = s.off_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)
    with pytest.raises(ValueError, match="does not fit|captured addresses"):
        s.graph.update(b, md_other)
    # A step with prefills runs eagerly (it reads the device cache).
    md_pre = s.gph_b.build(torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([seq[0], 3], dtype=torch.int32),
                           s.table(reqs[:2]), req_ids=ids[:2], num_input_tokens=b)
    assert md_pre.num_prefills == 1
    with pytest.raises(NotImplementedError, match="decode-only"):
        s.graph.update(b, md_pre)
    with pytest.raises(ValueError, match="before update"):
        s.graph.replay(b)
    unchanged()
    # A build after the update leaves stale lists: the replay refuses before anything runs.
    md = s.gph_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)
    s.graph.update(b, md)
    s.gph_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)
    with pytest.raises(ValueError, match="stale"):
        s.graph.replay(b)
    unchanged()
    # Draft-model updates carry no host inputs for the callback.
    with pytest.raises(NotImplementedError, match="draft"):
        s.graph.update_draft(b, [s.gph_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)])
    # Capture refusals: a prefill batch in the capture build; a provider that cannot launch host functions.
    with pytest.raises(NotImplementedError, match="decode-only buckets only"):
        s.gph_b.build_for_graph_capture(torch.tensor([0, 5], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                                        s.table(reqs[:1]), req_ids=ids[:1], num_input_tokens=8)
    layer2 = s.layer.impl(offload=sfa.OffloadConfig(s.pool_g, pool_layer=0, topk_buffer_size=16,
                                                    is_decode_consumer=True, max_num_reqs=4, max_num_tokens=128),
                          layer_index=0)
    md = s.gph_b.build(qsl, seq, s.table(reqs), req_ids=ids, num_input_tokens=b)
    for g, match in ((aar.GraphParams("noop"), "launch_host_func"), (aar.GraphParams("hooks"), "launch_host_func")):
        with pytest.raises(NotImplementedError, match=match):
            with g.capture(b):
                layer2.forward(s.hidden_g, [s.gph_idx], md, torch.zeros_like(s.hidden_g))
        assert not g.has(b)
    # A device provider launches the callback once per layer at capture (the device graph replays it).
    launched = []
    g = aar.GraphParams("hooks", launch_host_func=launched.append)
    with g.capture(b):
        layer2.forward(s.hidden_g, [s.gph_idx], md, torch.zeros_like(s.hidden_g))
    assert len(launched) == 1 and callable(launched[0])
    assert [k for k, _, _ in g.calls(b)] == ["prepare", "host_callback", "prepare"]
    unchanged()
