"""The MLA metadata builder against a naive Python model of docs/design/mla.md §3.3-§3.5, over many random batches:
decode-only and mixed steps, speculative decodes, block sizes that are and are not powers of two, contexts
on block boundaries, graph decode padding in both modes, host and staged block tables, aliased and separate
device buffers; and random bad block ids, which must be rejected naming the entry and leave the previous
metadata intact."""

import math
import random

import pytest
import torch

import ascend_attn_rt as aar

mla = aar.mla
R = 8  # rope dim: rows of 16 bytes in fp16 / 32 in fp32


def naive(qsl, seq, table, bs, threshold, workspace, t_in, pad_mode):
    """Expected metadata fields, written from the formulas of docs/design/mla.md one request at a time."""
    B = len(seq)
    q_lens = [qsl[i + 1] - qsl[i] for i in range(B)]
    nd = 0
    while nd < B and q_lens[nd] <= threshold:
        nd += 1
    td = qsl[nd]
    slots = []
    for r in range(B):
        for p in range(seq[r] - q_lens[r], seq[r]):
            slots.append(table[r][p // bs] * bs + p % bs)
    slots += [-1] * (t_in - len(slots))
    dpos = [p for r in range(nd) for p in range(seq[r] - q_lens[r], seq[r])]
    ppos = [p for r in range(nd, B) for p in range(seq[r] - q_lens[r], seq[r])]
    q_ends = [qsl[r + 1] for r in range(nd)]
    kv = list(seq[:nd])
    rows = [list(table[r]) for r in range(nd)]
    if pad_mode and nd == B and nd > 0:
        if pad_mode == "enable" and t_in > td:
            n_d = (t_in - td) // threshold
            q_ends += [td + (i + 1) * threshold for i in range(n_d)]
            kv += [0] * n_d
            rows += [[0] * len(table[0])] * n_d
            dpos += [0] * (t_in - td)
        elif pad_mode == "disable" and t_in > nd:
            pad = t_in - nd
            # numpy-style linspace then round half to even (Python's round does half to even).
            step = (t_in - q_ends[-1]) / pad
            q_ends += [t_in if i == pad else round(q_ends[-1] + i * step) for i in range(1, pad + 1)]
            kv += [0] * pad
            rows += [[0] * len(table[0])] * pad
            dpos += [0] * (t_in - td)
    ctx = [seq[r] - q_lens[r] for r in range(nd, B)]
    chunks = None
    nwc = sum(c > 0 for c in ctx)
    if nwc:
        chunk = (workspace // nwc) // bs * bs
        n_chunks = -(-max(ctx) // chunk)
        if n_chunks > 15:
            chunk = -(-(-(-max(ctx) // 15)) // bs) * bs
            n_chunks = -(-max(ctx) // chunk)
        lens = [[max(0, min(c, s * chunk + chunk) - s * chunk) for c in ctx] for s in range(n_chunks)]
        chunks = dict(size=chunk, lens=lens, seq_tot=[sum(x) for x in lens],
                      starts=[[s * chunk] * len(ctx) for s in range(n_chunks)])
    return dict(nd=nd, td=td, slots=slots, dpos=dpos, ppos=ppos, q_ends=q_ends, kv=kv, rows=rows, chunks=chunks,
                prefill_q_ends=[qsl[r + 1] - qsl[nd] for r in range(nd, B)])


def random_batch(rng, bs, mbr, max_reqs, threshold, decode_only):
    B = rng.randint(1, max_reqs)
    nd = B if decode_only else rng.randint(0, B)
    q_lens = [rng.randint(1, threshold) for _ in range(nd)] + [rng.randint(threshold + 1, 3 * bs) for _ in range(B - nd)]
    seq = []
    for q in q_lens:
        cap = mbr * bs
        ctx = rng.choice([0, bs, 2 * bs, rng.randint(0, cap - q)])  # block boundaries are interesting
        seq.append(min(cap, ctx + q))
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    return qsl, seq


@pytest.mark.parametrize("bs,threshold,separate,dtype", [
    (16, 1, False, torch.float32), (32, 2, True, torch.float16), (128, 1, False, torch.bfloat16),
    (16, 4, True, torch.float32)])
@pytest.mark.parametrize("pad_mode", [None, "enable", "disable"])
def test_builder_matches_naive_model(bs, threshold, separate, dtype, pad_mode):
    rng = random.Random(hash((bs, threshold, separate, pad_mode)) & 0xffff)
    mbr, max_reqs, nb = 6, 8, 8 * 6 + 5
    max_tokens = max_reqs * 3 * bs + 16
    workspace = max_reqs * bs + bs // 2  # at least a block per prefill with context; still several chunks
    cos = torch.randn(mbr * bs, R).to(dtype)
    sin = torch.randn(mbr * bs, R).to(dtype)
    builder = mla.MetadataBuilder(
        max_num_reqs=max_reqs, max_num_tokens=max_tokens, max_blocks_per_req=mbr, block_size=bs, num_blocks=nb,
        cos_table=cos, sin_table=sin, num_speculative_tokens=threshold - 1, workspace_tokens=workspace,
        separate_device_buffers=separate, graph_decode_padding=pad_mode is not None,
        disable_padded_drafter_batch=pad_mode == "disable")
    for it in range(60):
        decode_only = pad_mode is not None or it % 2 == 0
        qsl, seq = random_batch(rng, bs, mbr, max_reqs, threshold, decode_only)
        B = len(seq)
        staged = it % 3 == 0
        table = torch.randint(0, nb, (B, mbr), dtype=torch.int32)
        if staged:
            builder.block_table_staging[:B].copy_(table)
            bt = builder.block_table_staging[:B]
        else:
            bt = table
        if pad_mode == "enable":  # dummies of the decode length, at most max_num_reqs rows in all
            t_in = qsl[-1] + min(rng.choice([0, 0, 1, 3]), max_reqs - B) * threshold
        elif pad_mode == "disable":  # the bucket is both rows and tokens: at most max_num_reqs
            if qsl[-1] > max_reqs:
                continue
            t_in = rng.randint(max(B, qsl[-1]), max_reqs)
        else:
            t_in = qsl[-1] + rng.choice([0, 0, 1, 3])
        md = builder.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), bt,
                           num_input_tokens=t_in)
        want = naive(qsl, seq, table.tolist(), bs, threshold, workspace, t_in, pad_mode)
        assert md.num_decodes == want["nd"] and md.num_decode_tokens == want["td"]
        assert md.slot_mapping.tolist() == want["slots"]
        if want["nd"]:
            assert md.decode_actual_seq_lengths_q == want["q_ends"]
            assert md.decode_seq_lens_list == want["kv"]
            assert md.decode_block_table.tolist() == want["rows"]
            assert torch.equal(md.decode_cos, cos[want["dpos"]]) and torch.equal(md.decode_sin, sin[want["dpos"]])
        if md.num_prefills:
            assert md.prefill_actual_seq_lengths_q == want["prefill_q_ends"]
            assert md.prefill_block_table.tolist() == table.tolist()[want["nd"]:]
            assert torch.equal(md.prefill_cos, cos[want["ppos"]]) and torch.equal(md.prefill_sin, sin[want["ppos"]])
        chunks = want["chunks"]
        if chunks is None or not md.num_prefills:
            assert md.num_context_chunks == 0
        else:
            assert md.num_context_chunks == len(chunks["lens"]) and md.context_chunk_size == chunks["size"]
            assert md.context_chunk_seq_lens.tolist() == chunks["lens"]
            assert md.context_seq_tot == chunks["seq_tot"]
            assert md.context_starts.tolist() == chunks["starts"]


@pytest.mark.parametrize("staged", [False, True])
def test_random_bad_block_ids_are_rejected_and_leave_the_metadata(staged):
    rng = random.Random(7 + staged)
    bs, mbr, nb = 16, 6, 40
    cos, sin = torch.randn(mbr * bs, R), torch.randn(mbr * bs, R)
    builder = mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=mbr, block_size=bs,
                                  num_blocks=nb, cos_table=cos, sin_table=sin, workspace_tokens=8 * bs + 8)
    for _ in range(40):
        qsl, seq = random_batch(rng, bs, mbr, 8, 1, decode_only=rng.random() < 0.5)
        B = len(seq)
        good = torch.randint(0, nb, (B, mbr), dtype=torch.int32)
        md = builder.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), good)
        before = (md.slot_mapping.clone(), md.num_decodes, md.num_prefills)
        needed = [(r, c) for r in range(B) for c in range(math.ceil(seq[r] / bs))]
        r, c = rng.choice(needed)
        bad = good.clone()
        bad[r, c] = rng.choice([-1, nb, nb + 1000, -(2 ** 31), 2 ** 31 - 1])
        if staged:
            builder.block_table_staging[:B].copy_(bad)
            bt = builder.block_table_staging[:B]
        else:
            bt = bad
        with pytest.raises(ValueError, match=rf"block_table\[{r}\]\[{c}\]={int(bad[r, c])} is out of range"):
            builder.build(torch.tensor(qsl, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32), bt)
        assert torch.equal(md.slot_mapping, before[0]) and (md.num_decodes, md.num_prefills) == before[1:]
