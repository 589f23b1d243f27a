// One PCP rank's rows of a global MLA step (docs/design/cp.md §11).
#include "ascend_attn_rt/mla/plan/mla_pcp_plan.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/slot_mapping.h"

namespace aar::plan {
namespace {

void check_room(std::size_t have, int64_t need, const char* name) {
  AAR_CHECK_ARG(have >= static_cast<uint64_t>(need), name, " has room for ", have, " entries, needs ", need);
}

PcpSplitInputs split_inputs(const MlaPcpInputs& in, Span<int32_t> query_lens) {
  PcpSplitInputs sp;
  sp.query_lens = CSpan<int32_t>(query_lens.data(), in.seq_lens.size());
  sp.num_decodes = in.num_decodes;
  sp.pcp_size = in.pcp_size;
  return sp;
}

}  // namespace

MlaPcpSizes mla_pcp_sizes(const MlaPcpInputs& in, Span<int32_t> query_lens) {
  const std::size_t n = in.seq_lens.size();
  AAR_CHECK_ARG(in.query_start_loc.size() == n + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected num_reqs + 1 = ", n + 1);
  AAR_CHECK_ARG(in.query_start_loc[0] == 0, "query_start_loc[0] must be 0, got ", in.query_start_loc[0]);
  check_room(query_lens.size(), static_cast<int64_t>(n), "query_lens");
  // One branch-free pass (the query lengths go to the scratch, which the caller may see written on
  // a rejected call); the offender is named in request order only when something is wrong.
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) {
    const int32_t q = in.query_start_loc[i + 1] - in.query_start_loc[i];
    query_lens[i] = q;
    bad |= (q < 0) | (in.seq_lens[i] < q);
  }
  if (bad) {
    for (std::size_t i = 0; i < n; ++i) {
      const int32_t q = in.query_start_loc[i + 1] - in.query_start_loc[i];
      AAR_CHECK_ARG(q >= 0, "query_start_loc must be non-decreasing, got ", in.query_start_loc[i], " then ",
                    in.query_start_loc[i + 1], " at request ", i);
      AAR_CHECK_ARG(in.seq_lens[i] >= q, "seq_lens[", i, "]=", in.seq_lens[i], " is smaller than its query length ",
                    q);
    }
  }
  AAR_CHECK_ARG(in.token_slots.size() == static_cast<std::size_t>(in.query_start_loc[n]), "token_slots has ",
                in.token_slots.size(), " entries, expected query_start_loc[-1]=", in.query_start_loc[n]);
  const PcpSplitInputs sp = split_inputs(in, query_lens);
  MlaPcpSizes s;
  s.split = pcp_split_sizes(sp);  // num_decodes and pcp_size in range
  if (static_cast<std::size_t>(in.num_decodes) == n) {
    // Decode-only: no prefill, every head/tail count 0 (pcp_head_tail_counts' result without its
    // second pass over the split).
    AAR_CHECK_ARG(in.pcp_rank >= 0 && in.pcp_rank < in.pcp_size, "rank=", in.pcp_rank,
                  " is out of range [0, pcp_size=", in.pcp_size, ")");
    s.head_tail = PcpHeadTailCounts{};
    return s;
  }
  s.head_tail = pcp_head_tail_counts(sp, in.pcp_rank);  // pcp_rank in range
  for (std::size_t i = static_cast<std::size_t>(in.num_decodes); i < n; ++i) {
    const int32_t c = (query_lens[i] + 2 * in.pcp_size - 1) / (2 * in.pcp_size);
    s.prefill_max_query_len = std::max(s.prefill_max_query_len, 2 * c);
  }
  return s;
}

MlaPcpSizes plan_mla_pcp_rows(const MlaPcpInputs& in, const MlaPcpBuffers& out) {
  return plan_mla_pcp_rows(in, mla_pcp_sizes(in, out.query_lens), out);
}

MlaPcpSizes plan_mla_pcp_rows(const MlaPcpInputs& in, const MlaPcpSizes& s, const MlaPcpBuffers& out) {
  // --- validation (nothing written but the scratch) ---
  // `s` is mla_pcp_sizes(in, out.query_lens) of this call's inputs (the builder computes it once
  // to lay out its staging; docs/design/cp.md §11.7): the inputs were validated there.
  const std::size_t n = in.seq_lens.size(), nd = static_cast<std::size_t>(in.num_decodes);
  const int64_t wp = in.pcp_size, tl = s.split.local_tokens, td = s.split.num_decode_tokens;
  const int64_t tpl = s.split.local_prefill_tokens, g = s.split.padded_global_tokens;
  const int64_t sched = in.query_start_loc[n];
  check_room(out.slot_mapping.size(), tl, "slot_mapping");
  check_room(out.prefill_positions.size(), tpl, "prefill_positions");
  check_room(out.prefill_q_ends.size(), static_cast<int64_t>(n - nd), "prefill_q_ends");
  check_room(out.padded_slot_mapping.size(), g, "padded_slot_mapping");
  check_room(out.prefill_restore_idx.size(), wp * tpl, "prefill_restore_idx");
  check_room(out.local_token_index.size(), tl, "local_token_index");
  check_room(out.local_lens.size(), static_cast<int64_t>(n), "local_lens");
  check_room(out.positions.size(), tl, "positions");
  check_room(out.token_rows.size(), sched + g, "token_rows");
  check_room(out.restore_inverse.size(), wp * tpl, "restore_inverse");
  const PcpHeadTailCounts& ht = s.head_tail;
  check_room(out.head_tail.q_head_idx.size(), ht.chunk_tokens, "head_tail.q_head_idx");
  check_room(out.head_tail.q_tail_idx.size(), ht.chunk_tokens, "head_tail.q_tail_idx");
  check_room(out.head_tail.kv_head_nomask_idx.size(), ht.head_nomask_tokens, "head_tail.kv_head_nomask_idx");
  check_room(out.head_tail.kv_head_mask_idx.size(), ht.chunk_tokens, "head_tail.kv_head_mask_idx");
  check_room(out.head_tail.kv_tail_nomask_idx.size(), ht.tail_nomask_tokens, "head_tail.kv_tail_nomask_idx");
  check_room(out.head_tail.kv_tail_mask_idx.size(), ht.chunk_tokens, "head_tail.kv_tail_mask_idx");
  check_room(out.head_tail.q_full_idx.size(), 2 * int64_t{ht.chunk_tokens}, "head_tail.q_full_idx");
  check_room(out.head_tail.mask_seq_ends.size(), ht.num_prefills, "head_tail.mask_seq_ends");
  check_room(out.head_tail.head_nomask_kv_ends.size(), ht.num_prefills, "head_tail.head_nomask_kv_ends");
  check_room(out.head_tail.tail_nomask_kv_ends.size(), ht.num_prefills, "head_tail.tail_nomask_kv_ends");

  // --- write ---
  if (nd == n) {
    // Decode-only (docs/design/cp.md §11.7): every prefill list is empty; the padded-global slot
    // mapping keeps each decode token's slot in the first of its Wp copies (rank 0's), the local
    // rows are the tokens themselves. The scratch lists are not needed.
    int64_t* padded = out.padded_slot_mapping.data();
    std::fill(padded, padded + g, int64_t{kPadSlot});
    for (int64_t t = 0; t < td; ++t) {
      padded[t * wp] = in.token_slots[t];
      out.slot_mapping[t] = in.token_slots[t];
      out.local_token_index[t] = static_cast<int32_t>(t);
    }
    return s;
  }
  const PcpSplitInputs sp = split_inputs(in, out.query_lens);
  pcp_local_tokens(sp, in.pcp_rank, out.local_lens.first(n), out.positions.first(tl));
  // The padded-global order of the token indices (pcp_padded_slot_mapping over "slots" that are
  // the tokens' own indices: -1 where no token sits), then each entry's int64 slot.
  Span<int32_t> tokens = out.token_rows.first(sched), padded = out.token_rows.subspan(sched, g);
  std::iota(tokens.begin(), tokens.end(), 0);
  pcp_padded_slot_mapping(sp, tokens, padded);
  for (int64_t k = 0; k < g; ++k) out.padded_slot_mapping[k] = padded[k] < 0 ? kPadSlot : in.token_slots[padded[k]];
  pcp_chunk_restore_index(sp, out.prefill_restore_idx.first(wp * tpl), out.restore_inverse.first(wp * tpl));
  pcp_head_tail_indices(sp, in.pcp_rank, out.head_tail);
  // Local rows: the decodes' tokens, then each prefill's head and tail chunks.
  for (int64_t t = 0; t < td; ++t) {
    out.slot_mapping[t] = in.token_slots[t];
    out.local_token_index[t] = static_cast<int32_t>(t);
  }
  std::fill(out.slot_mapping.begin() + td, out.slot_mapping.begin() + tl, int64_t{kPadSlot});
  int64_t row = td, q_end = 0;
  for (std::size_t i = nd; i < n; ++i) {
    const int32_t q = out.query_lens[i], ctx = in.seq_lens[i] - q;
    for (int32_t k = 0; k < out.local_lens[i]; ++k, ++row) {
      const int32_t p = out.positions[row];
      out.prefill_positions[row - td] = ctx + std::min(p, q - 1);
      out.local_token_index[row] = p < q ? in.query_start_loc[i] + p : -1;
    }
    out.prefill_q_ends[i - nd] = (q_end += out.local_lens[i]);
  }
  return s;
}

}  // namespace aar::plan
