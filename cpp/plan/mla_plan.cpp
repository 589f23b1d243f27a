// MLA host planning (spec mla.md 3.2, 3.4, 3.5).
#include "ascend_attn_rt/plan/mla_plan.h"

#include <algorithm>
#include <cmath>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::plan {

int32_t mla_reorder_batch(CSpan<int32_t> num_scheduled, int32_t decode_threshold, Span<int32_t> perm_out,
                          Span<int32_t> swaps_out) {
  const std::size_t b = num_scheduled.size();
  AAR_CHECK_ARG(perm_out.size() == b, "perm_out has ", perm_out.size(), " entries, expected ", b);
  AAR_CHECK_ARG(swaps_out.size() >= 2 * b, "swaps_out has room for ", swaps_out.size(),
                " entries, needs at least 2*B = ", 2 * b);
  int32_t num_dec = 0;
  for (std::size_t i = 0; i < b; ++i) {
    AAR_CHECK_ARG(num_scheduled[i] >= 0, "num_scheduled[", i, "]=", num_scheduled[i], " is negative");
    perm_out[i] = static_cast<int32_t>(i);
    if (num_scheduled[i] <= decode_threshold) ++num_dec;
  }
  const int32_t n = static_cast<int32_t>(b);
  const int32_t num_pre = n - num_dec;
  // dec[#dec - i] walks the decodes from the back; pre[k] the prefills from the front.
  int32_t dec_cursor = n - 1;  // next decode from the back
  int32_t pre_cursor = 0;      // next prefill from the front
  int32_t swaps = 0;
  for (int32_t i = 1; i <= std::min(num_dec, num_pre); ++i) {
    while (dec_cursor >= 0 && num_scheduled[dec_cursor] > decode_threshold) --dec_cursor;
    if (dec_cursor < num_dec) break;
    while (num_scheduled[pre_cursor] <= decode_threshold) ++pre_cursor;
    const int32_t d = dec_cursor, p = pre_cursor;
    std::swap(perm_out[d], perm_out[p]);
    swaps_out[2 * swaps] = std::min(d, p);
    swaps_out[2 * swaps + 1] = std::max(d, p);
    ++swaps;
    --dec_cursor;
    ++pre_cursor;
  }
  return swaps;
}

ContextChunkPlan plan_context_chunks(const ContextChunkInputs& in, const ContextChunkBuffers& buf) {
  const std::size_t np = in.context_lens.size();
  AAR_CHECK_ARG(in.block_size > 0, "block_size must be positive, got ", in.block_size);
  AAR_CHECK_ARG(in.max_chunks >= 1 && in.max_chunks <= kMaxContextChunks, "max_chunks must be in [1, ",
                kMaxContextChunks, "] (npu_attention_update merges at most 16 partial results), got ",
                in.max_chunks);
  ContextChunkPlan p;
  for (std::size_t b = 0; b < np; ++b) {
    AAR_CHECK_ARG(in.context_lens[b] >= 0, "context_lens[", b, "]=", in.context_lens[b], " is negative");
    if (in.context_lens[b] > 0) ++p.num_with_context;
    p.max_context = std::max(p.max_context, in.context_lens[b]);
  }
  if (p.num_with_context == 0) return p;
  AAR_CHECK_ARG(in.workspace_tokens > 0, "workspace_tokens must be positive, got ", in.workspace_tokens);
  const std::size_t cap = static_cast<std::size_t>(in.max_chunks);
  AAR_CHECK_ARG(buf.cu_seq_lens.size() >= cap * (np + 1), "cu_seq_lens has room for ", buf.cu_seq_lens.size(),
                " entries, needs max_chunks*(NP+1) = ", cap * (np + 1));
  AAR_CHECK_ARG(buf.starts.size() >= cap * np && buf.chunk_seq_lens.size() >= cap * np &&
                    buf.kv_ends.size() >= cap * np,
                "starts / chunk_seq_lens / kv_ends need room for max_chunks*NP = ", cap * np, " entries, got ",
                buf.starts.size(), " / ", buf.chunk_seq_lens.size(), " / ", buf.kv_ends.size());
  AAR_CHECK_ARG(buf.seq_tot.size() >= cap && buf.max_seq_lens.size() >= cap,
                "seq_tot / max_seq_lens need room for max_chunks = ", cap, " entries");

  const int64_t bs = in.block_size;
  int64_t chunk = (in.workspace_tokens / p.num_with_context) / bs * bs;
  AAR_CHECK_ARG(chunk > 0, "workspace_tokens=", in.workspace_tokens, " is too small: ", p.num_with_context,
                " prefills with context need at least one block of ", bs, " tokens each");
  int64_t chunks = (p.max_context + chunk - 1) / chunk;
  if (chunks > in.max_chunks) {
    chunk = round_up((p.max_context + in.max_chunks - 1) / in.max_chunks, bs);
    chunks = (p.max_context + chunk - 1) / chunk;
    p.bounded = true;
  }
  p.chunk_size = static_cast<int32_t>(chunk);
  p.num_chunks = static_cast<int32_t>(chunks);
  for (int64_t c = 0; c < chunks; ++c) {
    int32_t* cu = buf.cu_seq_lens.data() + c * (np + 1);
    cu[0] = 0;
    int64_t tot = 0, mx = 0;
    for (std::size_t b = 0; b < np; ++b) {
      const int64_t start = c * chunk;
      const int64_t len = std::max<int64_t>(0, std::min<int64_t>(in.context_lens[b], start + chunk) - start);
      buf.starts[c * np + b] = static_cast<int32_t>(start);
      buf.chunk_seq_lens[c * np + b] = static_cast<int32_t>(len);
      tot += len;
      mx = std::max(mx, len);
      cu[b + 1] = static_cast<int32_t>(tot);
      buf.kv_ends[c * np + b] = tot;
    }
    buf.seq_tot[c] = tot;
    buf.max_seq_lens[c] = mx;
  }
  return p;
}

void interp_round_half_even(int64_t a, int64_t b, int32_t n, Span<int64_t> out) {
  AAR_CHECK_ARG(n >= 0, "interp: step count must be non-negative, got ", n);
  AAR_CHECK_ARG(out.size() >= static_cast<std::size_t>(n), "interp: output has room for ", out.size(),
                " values, needs ", n);
  for (int32_t i = 1; i <= n; ++i) {
    // numpy linspace: a + i*step, with the endpoint set exactly to b.
    const double v = i == n ? static_cast<double>(b)
                            : static_cast<double>(a) + i * (static_cast<double>(b - a) / n);
    out[i - 1] = static_cast<int64_t>(std::nearbyint(v));  // default rounding mode: half to even
  }
}

int32_t pad_actual_q_disable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t graph_pad_size,
                                  Span<int64_t> out) {
  AAR_CHECK_ARG(!actual_q.empty(), "actual_q must not be empty");
  const int32_t pad = std::max(0, graph_pad_size - num_reqs);
  const std::size_t n = actual_q.size();
  AAR_CHECK_ARG(out.size() >= n + pad, "output has room for ", out.size(), " values, needs ", n + pad);
  for (std::size_t i = 0; i < n; ++i) out[i] = actual_q[i];
  if (pad > 0) {
    AAR_CHECK_ARG(actual_q.back() <= graph_pad_size, "actual_q.back()=", actual_q.back(),
                  " exceeds graph_pad_size=", graph_pad_size);
    interp_round_half_even(actual_q.back(), static_cast<int64_t>(num_reqs) + pad, pad, out.subspan(n, pad));
  }
  return static_cast<int32_t>(n + pad);
}

int32_t pad_actual_q_enable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t req_pad, CSpan<int64_t> ref,
                                 Span<int64_t> out) {
  AAR_CHECK_ARG(!actual_q.empty(), "actual_q must not be empty");
  AAR_CHECK_ARG(req_pad >= 0, "req_pad must be non-negative, got ", req_pad);
  const std::size_t n = actual_q.size();
  AAR_CHECK_ARG(out.size() >= n + req_pad, "output has room for ", out.size(), " values, needs ", n + req_pad);
  for (std::size_t i = 0; i < n; ++i) out[i] = actual_q[i];
  if (req_pad == 0) return static_cast<int32_t>(n);
  const std::size_t nr = static_cast<std::size_t>(num_reqs);
  if (ref.size() > nr && ref[nr] - actual_q.back() > 16) {
    AAR_CHECK_ARG(ref.size() >= nr + req_pad, "ref (actual_seq_lengths_q) has ", ref.size(), " entries, needs ",
                  nr + req_pad);
    interp_round_half_even(actual_q.back(), ref[nr + req_pad - 1], req_pad, out.subspan(n, req_pad));
  } else {
    AAR_CHECK_ARG(ref.size() >= nr + req_pad, "ref (actual_seq_lengths_q) has ", ref.size(), " entries, needs ",
                  nr + req_pad, " (num_reqs + req_pad)");
    for (int32_t i = 0; i < req_pad; ++i) out[n + i] = ref[nr + i];
  }
  return static_cast<int32_t>(n + req_pad);
}

int64_t next_power_of_two(int64_t n) {
  AAR_CHECK_ARG(n >= 1 && n <= (int64_t{1} << 30), "next_power_of_two: n must be in [1, 2^30], got ", n);
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace aar::plan
