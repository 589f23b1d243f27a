// Host planning of the SFA KV-offload builder (docs/design/sfa.md §6, "Builder" and
// "Resident decode path" step 1): the per-request ids, the token-to-request
// map, the rebased lengths of the prefill part and the per-decode-token inputs
// of the resident-slot LRU. Pure C++ over spans; writes into caller buffers.
//
// The offload builder splits the batch with treat_short_extends_as_decodes =
// is_decode_consumer (docs/design/sfa.md §6): on a PD decode consumer a short extend (the
// 1-token boundary step of a prompt) is a decode; elsewhere a request still
// prefilling its prompt is a prefill whatever its length, so the rule needs
// the per-request is_prefilling flags.
//
// Order. The split counts the LEADING decodes (docs/design/gqa.md §2.2: a batch starting
// with a prefill is all prefills); the offload forward sends those through the
// resident path and everything after them through sparse attention on the
// device cache. A decode-only step writes its new rows to the host pool only
// (docs/design/sfa.md §6's table), so a decode request placed after a prefill would read rows
// the device cache never received. check_sfa_offload_step therefore rejects a
// batch with a decode after the first prefill, by name: engines reorder the
// batch decode-first (reorder_batch_threshold = decode threshold;
// plan::reorder_decode_first does it with minimal swaps).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/step_input.h"
#include "ascend_attn_rt/plan/split.h"

namespace aar::plan {

// The step (plan/step_input.h); what the offload reads of it:
//  * query_start_loc (B+1) and seq_lens (B);
//  * req_ids (B): each request's identity, distinct within the batch and
//    never shared by two live requests: the resident-slot LRU keeps a row's
//    resident tokens while its id stays the same, so two requests with one id
//    (a hash collision, e.g. upstream's adler32 of the request id) would read
//    each other's rows. Give the engine's own 64-bit request numbers, or keys
//    from plan::RequestKeys for string ids (plan/request_keys.h);
//  * is_prefilling: B when !decode_consumer (required), empty otherwise
//    (rejected).
// The other StepInput fields are plan_sfa_step's.
struct SfaOffloadInputs : StepInput {
  int32_t decode_threshold = 1;    // 1 + num_speculative_tokens
  bool decode_consumer = false;    // treat_short_extends_as_decodes
};

// Validates what the offload adds to an SFA build, writing nothing: req_ids
// and is_prefilling sizes (named), no id twice in the batch (named with both
// positions), then the split of the batch as given and
// its order (no decode after the first prefill). query_start_loc is checked
// here too (monotonic; the rest of the batch is plan_sfa_step's). Returns the
// split (what plan_sfa_step computes with the same rule).
SplitResult check_sfa_offload_step(const SfaOffloadInputs& in);

// Caller-owned outputs; every span needs room for the entries noted.
struct SfaOffloadBuffers {
  Span<uint64_t> req_ids;                // >= B: the ids (int64 on the device)
  Span<int32_t> token_to_req;            // >= num_tokens: request of each token, -1 past qsl[B]
  Span<int32_t> prefill_cum_query_lens;  // >= num_prefills: qsl[d + 1 .. B] - qsl[d], d = num_decodes
  Span<uint64_t> decode_req_ids;         // >= num_decode_tokens: req_ids of each decode token's request
  Span<int32_t> decode_seq_lens;         // >= num_decode_tokens: S of its request (the top-k mask threshold)
  Span<int32_t> decode_stable_prefix;    // >= num_decode_tokens: max(S - q, 0) of its request (LRU step b)
};

// Writes the offload's per-step arrays for a batch check_sfa_offload_step
// accepted (and plan_sfa_step validated: seq_lens >= query lengths) with its
// split; num_tokens >= qsl[B] (the padded token count). Checks the room of
// every span first.
void write_sfa_offload_step(const SfaOffloadInputs& in, const SplitResult& split, int32_t num_tokens,
                            const SfaOffloadBuffers& buf);

}  // namespace aar::plan
