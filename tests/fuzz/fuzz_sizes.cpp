// The plan layer's sizing functions and the two planners reached elsewhere only through a step
// planner: round_up, chunked_prefill_workspace_size (plan/workspace.h), hadamard_size and
// fill_hadamard (plan/hadamard.h), pad_for_fia (plan/seq_lens.h) and plan_context_chunks
// (plan/mla_plan.h) on their own. Sizes are checked in 128-bit arithmetic against the
// formulas of docs/design (an int64 overflow must be a rejection, never a wrapped size); the Hadamard matrix
// against Sylvester's doubling; the FIA padding and the context chunks against naive models.
#include "ascend_attn_rt/plan/hadamard.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

using i128 = __int128;

int64_t any_i64(fuzz::Bytes& in) {
  switch (in.u8() % 6) {
    case 0: return -static_cast<int64_t>(in.u8());
    case 1: return INT64_MAX - in.u8();
    case 2: return INT64_MIN + in.u8();
    case 3: return static_cast<int64_t>(in.u32()) << (in.u8() % 32);
    default: return in.range(0, 1 << 20);
  }
}

template <typename F>
bool rejected(F&& f) {
  try {
    f();
    return false;
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
    return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::current_batch() = nullptr;  // only the pad_for_fia case has a batch to dump
  switch (in.u8() % 5) {
    case 0: {  // round_up: the exact ceiling multiple, or a rejection when it leaves int64
      const int64_t v = any_i64(in), a = in.flag() ? any_i64(in) : in.range(-4, 256);
      int64_t got = 0;
      const bool rej = rejected([&] { got = plan::round_up(v, a); });
      if (a == 0) {
        FUZZ_CHECK(!rej && got == 0);
        break;
      }
      // ceil(v / a) * a (the header's rule, either sign), exact in 128 bits.
      const i128 q = static_cast<i128>(v) / a, r = static_cast<i128>(v) % a;
      const i128 cq = (r != 0 && ((v < 0) == (a < 0))) ? q + 1 : q;
      const i128 want = cq * a;
      FUZZ_CHECK(rej == (want > INT64_MAX || want < INT64_MIN));
      if (!rej) FUZZ_CHECK(got == want);
      break;
    }
    case 1: {  // chunked_prefill_workspace_size (docs/design/gqa.md §2.6)
      const int64_t L = any_i64(in), S = any_i64(in), B = in.flag() ? any_i64(in) : in.range(-1, 256);
      int64_t got = 0;
      const bool rej = rejected([&] { got = plan::chunked_prefill_workspace_size(L, S, B); });
      if (L < 0 || S < 0 || B < 0) {
        FUZZ_CHECK(rej);
        break;
      }
      const i128 sb = std::min<i128>(static_cast<i128>(S) * B, static_cast<i128>(1) << 100);  // 4 sb fits
      const i128 inner = std::max<i128>(8 * static_cast<i128>(L), 4 * sb);
      const i128 want = std::max<i128>(std::min<i128>(inner, 131072), sb);
      FUZZ_CHECK(rej == (want > INT64_MAX));
      if (!rej) FUZZ_CHECK(got == want);
      break;
    }
    case 2: {  // hadamard_size and fill_hadamard
      const int64_t d = in.flag() ? any_i64(in) : in.range(-1, 1100);
      int64_t n = 0;
      const bool rej = rejected([&] { n = plan::hadamard_size(d); });
      FUZZ_CHECK(rej == !(d >= 1 && d <= (int64_t{1} << 30)));
      if (!rej) FUZZ_CHECK(plan::is_power_of_two(n) && n >= d && (n == 1 || n / 2 < d));
      // fill: a power of two up to 64 with room (sometimes short), or any n with a small buffer.
      const int64_t fn = in.flag() ? (int64_t{1} << in.range(0, 6)) : any_i64(in);
      const double scale = in.flag() ? 1.0 : 1.0 / (1 + in.u8());
      const bool small = plan::is_power_of_two(fn) && fn <= 64;
      const size_t room = small ? static_cast<size_t>(fn * fn) - (in.u8() % 8 == 0 ? 1 : 0) : in.u8();
      auto out = fuzz::canary<float>(room, -9.f);
      fuzz::Snapshot s;
      s.add(out);
      const bool ok = fuzz::accepted([&] { plan::fill_hadamard(fn, scale, out); }, s);
      const bool valid = plan::is_power_of_two(fn) && fn <= (int64_t{1} << 15) && static_cast<i128>(fn) * fn <= room;
      FUZZ_CHECK(ok == valid);
      if (!ok) break;
      // Sylvester's doubling, H_1 = [1], H_2n = [[H, H], [H, -H]].
      std::vector<int> h = {1};
      for (int64_t m = 1; m < fn; m *= 2) {
        std::vector<int> g(static_cast<size_t>(4 * m * m));
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < m; ++j) {
            const int v = h[i * m + j];
            g[i * 2 * m + j] = v, g[i * 2 * m + m + j] = v, g[(m + i) * 2 * m + j] = v, g[(m + i) * 2 * m + m + j] = -v;
          }
        h.swap(g);
      }
      for (int64_t k = 0; k < fn * fn; ++k) FUZZ_CHECK(out[k] == static_cast<float>(h[k] * scale));
      break;
    }
    case 3: {  // pad_for_fia
      fuzz::Batch b = fuzz::make_batch(in, 8, 40, 300);
      fuzz::current_batch() = &b;
      const int32_t B = b.B(), real = b.qsl.back();
      const int32_t padded = in.flag() ? real : fuzz::input_tokens(in, real);
      const int32_t dummy = in.u8() % 16 == 0 ? in.maybe_bad(1) : in.range(0, 3);
      const size_t need = static_cast<size_t>(B) + (padded > real ? 1 : 0);
      auto qe = fuzz::canary<int64_t>(fuzz::room(static_cast<int64_t>(need) + in.range(-1, 2)), -9);
      auto kv = fuzz::canary<int64_t>(fuzz::room(static_cast<int64_t>(need) + in.range(-1, 2)), -9);
      fuzz::Snapshot s;
      s.add(qe), s.add(kv);
      plan::FiaPadding p;
      const bool ok = fuzz::accepted([&] { p = plan::pad_for_fia(b.qsl, b.seq_lens, padded, qe, kv, dummy); }, s);
      bool valid = b.qsl[0] == 0 && padded >= real && dummy >= 0 && qe.size() >= need && kv.size() >= need;
      for (int32_t r = 0; r < B; ++r) valid = valid && b.qsl[r + 1] >= b.qsl[r] && b.seq_lens[r] >= 0;
      FUZZ_CHECK(ok == valid);
      if (!ok) break;
      FUZZ_CHECK(p.num_reqs == static_cast<int32_t>(need) && p.added_dummy == (padded > real));
      FUZZ_CHECK(p.num_tokens == (padded > real ? padded : real));
      for (int32_t r = 0; r < B; ++r) FUZZ_CHECK(qe[r] == b.qsl[r + 1] && kv[r] == b.seq_lens[r]);
      if (padded > real) FUZZ_CHECK(qe[B] == padded && kv[B] == dummy);
      for (size_t i = need; i < qe.size(); ++i) FUZZ_CHECK(qe[i] == -9);
      for (size_t i = need; i < kv.size(); ++i) FUZZ_CHECK(kv[i] == -9);
      break;
    }
    default: {  // plan_context_chunks
      const int32_t np = in.range(0, 6);
      std::vector<int32_t> ctx(np);
      for (auto& c : ctx) c = in.flag() ? 0 : in.range(1, 2000);
      if (np && in.u8() % 12 == 0) ctx[in.range(0, np - 1)] = in.maybe_bad(100);
      plan::ContextChunkInputs ci;
      ci.context_lens = ctx;
      ci.block_size = in.u8() % 12 == 0 ? in.maybe_bad(16) : (int32_t{1} << in.range(0, 7));
      ci.workspace_tokens = in.u8() % 8 == 0 ? any_i64(in) : in.range(0, 4096);
      ci.max_chunks = in.u8() % 12 == 0 ? in.maybe_bad(15) : in.range(1, 15);
      const size_t w = static_cast<size_t>(np);
      auto sh = [&](size_t n) { return in.u8() % 24 == 0 && n ? n - 1 : n; };
      const size_t cap = static_cast<size_t>(std::clamp(ci.max_chunks, 0, 16));
      auto cu = fuzz::canary<int32_t>(sh(cap * (w + 1)), -9), st = fuzz::canary<int32_t>(sh(cap * w), -9),
           ln = fuzz::canary<int32_t>(sh(cap * w), -9);
      auto ke = fuzz::canary<int64_t>(sh(cap * w), -9), tot = fuzz::canary<int64_t>(sh(cap), -9),
           mx = fuzz::canary<int64_t>(sh(cap), -9);
      fuzz::Snapshot s;
      s.add(cu), s.add(st), s.add(ln), s.add(ke), s.add(tot), s.add(mx);
      plan::ContextChunkPlan p;
      const bool ok = fuzz::accepted([&] { p = plan::plan_context_chunks(ci, {cu, st, ln, ke, tot, mx}); }, s);
      int32_t nwc = 0, mctx = 0;
      bool lens_ok = true;
      for (int32_t c : ctx) lens_ok = lens_ok && c >= 0, nwc += c > 0, mctx = std::max(mctx, c);
      const bool args = ci.block_size > 0 && ci.max_chunks >= 1 && ci.max_chunks <= 15 && lens_ok;
      if (!args) {
        FUZZ_CHECK(!ok);
        break;
      }
      const i128 bs = ci.block_size;
      const i128 base = nwc ? (ci.workspace_tokens / nwc) / bs * bs : 0;
      if (nwc == 0) {
        FUZZ_CHECK(ok && p.num_chunks == 0 && s.unchanged());
        break;
      }
      if (ci.workspace_tokens <= 0 || base <= 0) {
        FUZZ_CHECK(!ok);
        break;
      }
      // Bounded chunks past int32 are refused.
      const i128 bounded_c0 = (static_cast<i128>(mctx) + ci.max_chunks - 1) / ci.max_chunks;
      const i128 base_c = std::min<i128>(base, INT32_MAX / bs * bs);
      if ((mctx + base_c - 1) / base_c > ci.max_chunks && (bounded_c0 + bs - 1) / bs * bs > INT32_MAX) {
        FUZZ_CHECK(!ok);
        break;
      }
      const bool room = cu.size() >= cap * (w + 1) && st.size() >= cap * w && ln.size() >= cap * w &&
                        ke.size() >= cap * w && tot.size() >= cap && mx.size() >= cap;
      {
        // cu_seq_lens are int32: chunk 0's tokens over every request must fit, else refused.
        const bool bounded = (mctx + base_c - 1) / base_c > ci.max_chunks;
        const i128 chunk = bounded ? (bounded_c0 + bs - 1) / bs * bs : base_c;
        i128 chunk0 = 0;
        for (int32_t c : ctx) chunk0 += std::min<i128>(c, chunk);
        if (room && chunk0 > INT32_MAX) {
          FUZZ_CHECK(!ok);
          break;
        }
      }
      FUZZ_CHECK(ok == room);
      if (!ok) break;
      const int64_t C = p.chunk_size, n = p.num_chunks;
      if (!(C > 0 && C % ci.block_size == 0 && n >= 1 && n <= ci.max_chunks))
        std::fprintf(stderr, "chunks: C=%lld n=%lld bs=%d max_chunks=%d W=%lld nwc=%d max_ctx=%d bounded=%d\n",
                     static_cast<long long>(C), static_cast<long long>(n), ci.block_size, ci.max_chunks,
                     static_cast<long long>(ci.workspace_tokens), nwc, mctx, p.bounded);
      FUZZ_CHECK(C > 0 && C % ci.block_size == 0 && n >= 1 && n <= ci.max_chunks);
      FUZZ_CHECK((n - 1) * C < mctx && n * C >= mctx);  // as many chunks as the longest context needs
      const i128 bounded_c = (static_cast<i128>(mctx) + ci.max_chunks - 1) / ci.max_chunks;
      const i128 bounded_rounded = (bounded_c + bs - 1) / bs * bs;
      if (p.bounded) FUZZ_CHECK(base * ci.max_chunks < mctx && C == bounded_rounded);
      // Unbounded: the workspace's share, capped at the largest int32 multiple of the block.
      else FUZZ_CHECK(C == std::min<i128>(base, INT32_MAX / bs * bs));
      FUZZ_CHECK(p.num_with_context == nwc && p.max_context == mctx);
      for (int64_t c = 0; c < n; ++c) {
        int64_t run = 0, m = 0;
        FUZZ_CHECK(cu[c * (w + 1)] == 0);
        for (size_t r = 0; r < w; ++r) {
          const int64_t len = std::clamp<int64_t>(ctx[r] - c * C, 0, C);
          FUZZ_CHECK(st[c * w + r] == c * C && ln[c * w + r] == len);
          run += len, m = std::max(m, len);
          FUZZ_CHECK(cu[c * (w + 1) + r + 1] == run && ke[c * w + r] == run);
        }
        FUZZ_CHECK(tot[c] == run && mx[c] == m);
      }
      break;
    }
  }
  return 0;
}
