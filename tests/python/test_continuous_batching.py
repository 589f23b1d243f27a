"""Continuous batching over one paged cache per layer with a free-block pool.

A small scheduler in Python: requests arrive at different steps, long prompts
are prefilled in chunks under a per-step token budget, the others decode, and
finished requests return their blocks to the pool, from which new requests
take them (so stale K/V of old requests sits in reused blocks). Each step
assembles the batch in decode-first order, builds metadata once, and runs two
layers (separate caches, separate K/V). Every step's output is compared with
the reference computed from each request's full K/V history kept densely in
Python, and every live request's cache content is compared with that history.
"""

import math
from dataclasses import dataclass, field
from typing import List

import pytest
import torch

import ascend_attn_rt as aar
from _reference import SENTINEL, assert_close, read_dense_from_cache, reference_attention

N, NKV, D, BS = 8, 2, 64, 16
NUM_LAYERS = 2
NUM_BLOCKS = 40  # small on purpose: blocks must be recycled
MAX_REQS = 6
MAX_BLOCKS_PER_REQ = 8
TOKEN_BUDGET = 24  # tokens per step (decodes first, then prefill chunks)
MAX_STEPS = 60

# (arrival step, prompt length, decode steps)
WORKLOAD = [
    (0, 40, 5), (0, 7, 8), (1, 70, 3), (2, 3, 10), (3, 25, 2), (4, 1, 4), (5, 50, 4),
    (6, 12, 6), (8, 33, 3), (9, 5, 5), (10, 90, 2), (12, 16, 7), (13, 2, 3),
]


@dataclass
class Req:
    rid: int
    arrival: int
    prompt: int
    decodes: int
    blocks: List[int] = field(default_factory=list)
    computed: int = 0
    decoded: int = 0
    k_hist: List[torch.Tensor] = field(default_factory=list)  # per layer (s, NKV, D)
    v_hist: List[torch.Tensor] = field(default_factory=list)

    @property
    def total(self):
        return self.prompt + self.decodes

    @property
    def prefilling(self):
        return self.computed < self.prompt


def _nblocks(n):
    return (n + BS - 1) // BS


@pytest.mark.parametrize("pad_steps", [False, True])
def test_continuous_batching(pad_steps):
    gen = torch.Generator().manual_seed(2024)
    caches = [
        (torch.randn(NUM_BLOCKS, BS, NKV, D, generator=gen), torch.randn(NUM_BLOCKS, BS, NKV, D, generator=gen))
        for _ in range(NUM_LAYERS)
    ]
    free = list(range(1, NUM_BLOCKS))  # block 0 is the null/dummy block
    waiting = [Req(i, a, p, d) for i, (a, p, d) in enumerate(WORKLOAD)]
    running: List[Req] = []
    builder = aar.MetadataBuilder(max_num_reqs=MAX_REQS, max_num_tokens=TOKEN_BUDGET + 8,
                                  max_blocks_per_req=MAX_BLOCKS_PER_REQ, block_size=BS, num_blocks=NUM_BLOCKS)
    impls = [aar.AttentionImpl(N, D, num_kv_heads=NKV) for _ in range(NUM_LAYERS)]
    scale = 1.0 / math.sqrt(D)

    allocations = {}  # block id -> number of times handed out
    stats = dict(mixed=0, chunked=0, states=set(), reused=0)
    finished = 0

    for step in range(MAX_STEPS):
        # Admission: FIFO, whole request reserved up front so the pool never runs dry mid-request.
        while waiting and waiting[0].arrival <= step and len(running) < MAX_REQS:
            r = waiting[0]
            need = _nblocks(r.total)
            assert need <= MAX_BLOCKS_PER_REQ
            if need > len(free):
                break
            waiting.pop(0)
            for _ in range(need):
                b = free.pop(int(torch.randint(len(free), (1,), generator=gen)))
                allocations[b] = allocations.get(b, 0) + 1
                if allocations[b] > 1:
                    stats["reused"] += 1
                r.blocks.append(b)
            r.k_hist = [torch.zeros(0, NKV, D) for _ in range(NUM_LAYERS)]
            r.v_hist = [torch.zeros(0, NKV, D) for _ in range(NUM_LAYERS)]
            running.append(r)
        if not running:
            if not waiting:
                break
            continue

        # Decode-first batch: decodes (1 token), then prefill chunks under the budget.
        decodes = [r for r in running if not r.prefilling]
        sched = [(r, 1) for r in decodes]
        budget = TOKEN_BUDGET - len(decodes)
        for r in running:
            if r.prefilling and budget > 0:
                chunk = min(r.prompt - r.computed, budget)
                if chunk < r.prompt - r.computed or r.computed > 0:
                    stats["chunked"] += 1
                sched.append((r, chunk))
                budget -= chunk
        if decodes and len(sched) > len(decodes):
            stats["mixed"] += 1

        q_lens = [ql for _, ql in sched]
        seq_lens = [r.computed + ql for r, ql in sched]
        n_act = sum(q_lens)
        t_in = n_act
        if pad_steps and step % 2 == 1:
            t_in = (n_act + 7) // 8 * 8 + (8 if n_act % 8 == 0 else 0)
        qsl = torch.zeros(len(sched) + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0).to(torch.int32)
        bt = torch.zeros(len(sched), MAX_BLOCKS_PER_REQ, dtype=torch.int32)
        for i, (r, _) in enumerate(sched):
            bt[i, : len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)

        md = builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), bt, num_input_tokens=t_in)
        stats["states"].add(str(md.attn_state))
        # Split by the decode-first rule (threshold 1): prefills start at the first q_len > 1.
        first_prefill = next((i for i, q in enumerate(q_lens) if q > 1), len(q_lens))
        assert md.num_actual_tokens == n_act
        if t_in == n_act:
            assert (md.num_decodes, md.num_prefills) == (first_prefill, len(q_lens) - first_prefill), step
            assert md.num_decode_tokens == sum(q_lens[:first_prefill])

        for layer in range(NUM_LAYERS):
            q = torch.randn(t_in, N, D, generator=gen)
            k = torch.randn(t_in, NKV, D, generator=gen)
            v = torch.randn(t_in, NKV, D, generator=gen)
            pos = 0
            for r, ql in sched:
                r.k_hist[layer] = torch.cat([r.k_hist[layer], k[pos : pos + ql]])
                r.v_hist[layer] = torch.cat([r.v_hist[layer], v[pos : pos + ql]])
                pos += ql
            kc, vc = caches[layer]
            out = torch.full((t_in, N, D), SENTINEL)
            ret = impls[layer].forward(q, k, v, kc, vc, md, out)
            assert ret.data_ptr() == out.data_ptr()
            ref = reference_attention(q[:n_act], [r.k_hist[layer] for r, _ in sched],
                                      [r.v_hist[layer] for r, _ in sched], q_lens, scale=scale)
            assert_close(out[:n_act], ref, torch.float32, what=f"step {step} layer {layer} output")
            if md.num_kernel_tokens < t_in:
                assert bool((out[md.num_kernel_tokens:] == SENTINEL).all())
            # The cache holds exactly each live request's history.
            for r, _ in sched:
                bt_row = torch.tensor(r.blocks, dtype=torch.int32)
                s = r.k_hist[layer].shape[0]
                assert torch.equal(read_dense_from_cache(kc, bt_row, s), r.k_hist[layer]), (step, layer, r.rid)
                assert torch.equal(read_dense_from_cache(vc, bt_row, s), r.v_hist[layer]), (step, layer, r.rid)

        # Advance, finish, free.
        for r, ql in sched:
            if r.prefilling:
                r.computed += ql
            else:
                r.computed += 1
                r.decoded += 1
        for r in list(running):
            if r.decoded >= r.decodes:
                running.remove(r)
                free.extend(r.blocks)
                finished += 1
        if not running and not waiting:
            break

    assert finished == len(WORKLOAD), f"only {finished} of {len(WORKLOAD)} requests finished"
    assert stats["reused"] > 0, "the scenario should recycle blocks"
    assert stats["mixed"] > 0 and stats["chunked"] > 0
    assert len(stats["states"]) >= 2
