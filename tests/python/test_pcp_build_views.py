"""The PCP builders' per-step lists are cached views (docs/design/cp.md §11.6): a builder that went
through any sequence of steps gives, for each step, the same lists as a fresh builder given that
step alone (the views are keyed by length and offset; the offsets move with the other lists' sizes).
GQA PCP (sharded KV) and MLA PCP, ranks 0 and 1 of a PCP group of 2 (single process, no collectives).
"""

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import rope_tables

MB = 4


def _i32(x):
    return torch.tensor(x, dtype=torch.int32)


# (query lens, seq lens), decodes first: prefills of different shapes between decode-only steps,
# so the packed lists' offsets move and come back.
STEPS = [
    ([5, 9], [5, 9]),
    ([1, 1, 1], [6, 10, 30]),
    ([1, 1, 1], [7, 11, 31]),
    ([1, 1, 7, 2], [8, 12, 20, 9]),
    ([1, 1, 1], [9, 13, 21]),
    ([1, 1, 1, 1], [10, 14, 22, 10]),
    ([1, 3], [11, 3]),
    ([1, 1, 1, 1], [10, 14, 22, 10]),
]


def _inputs(q, s):
    qsl = [0]
    for x in q:
        qsl.append(qsl[-1] + x)
    bt = torch.arange(len(q) * MB, dtype=torch.int32).view(len(q), MB)
    return _i32(qsl), _i32(s), bt


GQA_LISTS = ["padded_slot_mapping", "restore_idx", "decode_slots", "decode_block_tables"]
GQA_VALUES = ["decode_kv_lens", "ctx_kv_lens", "decode_q_ends", "num_local_tokens", "decode_kernel_rows"]
MLA_LISTS = ["pcp_padded_slot_mapping", "pcp_prefill_restore_idx", "pcp_q_head_idx", "pcp_q_tail_idx",
             "pcp_kv_head_nomask_idx", "pcp_kv_head_mask_idx", "pcp_kv_tail_nomask_idx", "pcp_kv_tail_mask_idx",
             "pcp_q_full_idx", "slot_mapping"]
MLA_VALUES = ["num_local_tokens", "num_local_prefill_tokens", "pcp_mask_seq_ends", "pcp_head_nomask_kv_ends",
              "pcp_tail_nomask_kv_ends"]


def _gqa(rank):
    return aar.cp.PcpMetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=MB, block_size=16,
                                     num_blocks=32, pcp_size=2, pcp_rank=rank)


def _mla(rank):
    cos, sin = rope_tables(64, 8)
    return aar.mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=MB, block_size=16,
                                   num_blocks=32, cos_table=cos, sin_table=sin, workspace_tokens=128,
                                   pcp_world_size=2, pcp_rank=rank)


def _snapshot(md, lists, values):
    return ({k: getattr(md, k).clone() for k in lists}, {k: getattr(md, k) for k in values})


@pytest.mark.parametrize("make,lists,values", [(_gqa, GQA_LISTS, GQA_VALUES), (_mla, MLA_LISTS, MLA_VALUES)],
                         ids=["gqa", "mla"])
@pytest.mark.parametrize("rank", [0, 1])
def test_pcp_lists_match_a_fresh_build_after_any_sequence(make, lists, values, rank):
    kept = make(rank)
    for i, (q, s) in enumerate(STEPS):
        args = _inputs(q, s)
        got = _snapshot(kept.build(*args), lists, values)
        want = _snapshot(make(rank).build(*args), lists, values)
        assert got[1] == want[1], (i, got[1], want[1])
        for k in lists:
            assert got[0][k].dtype == want[0][k].dtype and torch.equal(got[0][k], want[0][k]), (i, k)
