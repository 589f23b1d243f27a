// The resident-slot LRU of the SFA KV-offload decode path (docs/design/sfa.md §6.3
// (a)-(g)); the decisions where upstream is silent are in the header.
//
// Per row:
//   tokens [capacity + 1] the slot's token (-1 empty); slot `capacity` is a
//                     sentinel (token -1): the hash table's empty mark and the
//                     queue's padding.
//   stamps [capacity + 1] the queue position of the slot's live entry, modulo
//                     2^bits of the index type (positions are uint32 and wrap).
//                     The ring is at most 2^(bits - 2) entries, so positions
//                     in the ring's window are distinct modulo 2^bits and a
//                     stamp placed half the range away from the window (an
//                     emptied slot's, the sentinel's) matches no entry in it.
//   free  [capacity]  ring of the empty slots, in the order they are used
//   queue [queue_size_] recency queue of slot ids, a ring: positions grow (a
//                     squeeze restarts them at 0)
//                     (entry q is at q mod queue_size_), least recent at
//                     `head`; the entry at position q is live iff
//                     stamps[its slot] == q.
//                     Each step appends one block of exactly K entries: the
//                     padding (sentinels, one per invalid or repeated entry),
//                     then the assigned slots in reverse top-k order, then the
//                     hits in reverse top-k order. Since the block's size is
//                     known before the step, a hit is written at its final
//                     position (K - 1 - its rank among the hits) the moment it
//                     is found: one pass over the top-k, one write per hit. A
//                     slot's older entries are stale at once (its stamp moved
//                     on): eviction skips them, and a hit whose stamp is
//                     already in the current block is a repeat. Eviction
//                     advances `head`; when the ring has no room for a block,
//                     the stale entries are squeezed out. The ring is 3-6 x
//                     capacity (the previous queue's size: a ring of 6-12 x
//                     capacity squeezed less often at 90% hits but was slower
//                     where nothing is evicted, its blocks landing on cold
//                     cache lines).
//   table [table_size_] open-addressing hash (linear probing) token -> slot: an
//                     entry holds a slot id and the key is tokens[id]; load
//                     <= 1/4. Deletion shifts back (no tombstones).
// Every resident slot has exactly one live queue entry and one table entry;
// every empty slot is in the free ring.
//
// A row whose last step was clean (K distinct valid hits, no miss) keeps that
// top-k; if the next step's top-k is the same (memcmp) and nothing is
// invalidated, the step changes nothing: the slots are the last block read
// backwards, and re-appending the same block would leave the recency order
// as it is. No per-entry lookup is made.
//
// Rows share nothing but the outputs, each row writing its own part, so a step
// splits its rows into contiguous chunks run by up to threads_ threads (the
// caller and a process-wide pool of helpers started once); each chunk writes
// its misses at misses[begin_row x K ..) and they are moved together in chunk
// order afterwards: the outputs are those of one thread.
#include "ascend_attn_rt/sfa/plan/resident_lru.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "ascend_attn_rt/errors.h"

namespace aar::plan {

namespace {

constexpr int32_t kMaxCapacity = 1 << 24;
// Capacities up to this use 16-bit index arrays (slot ids <= capacity, the
// sentinel included; stamps modulo 2^16, so the ring, a power of two >= 3 x
// capacity, must stay <= 2^14 entries).
constexpr int32_t kMaxNarrowCapacity = 5461;
constexpr uint32_t kHashMul = 0x9E3779B1u;   // Fibonacci hashing: consecutive positions spread out
constexpr uint32_t kBloomMul = 0x85EBCA6Bu;  // an independent 12-bit hash for the duplicate filter
constexpr int kBloomBits = 12;
// Table slots per capacity slot: load <= 1/4. Shorter probe runs make a miss's
// erase (shift-back) and insert about half as costly as at load 1/2; a hit pays
// a little for the larger table (docs/design/sfa.md §6.3, the cost paragraph).
constexpr int32_t kTableLoad = 4;

int32_t table_size_for(int32_t capacity) {
  int32_t t = 2;
  while (t < kTableLoad * capacity) t *= 2;
  return t;
}

// The ring: a power of two >= 3 x capacity (queue positions are uint32 that
// wrap; entry q is at q mod the ring size).
int32_t queue_size_for(int32_t capacity) {
  int64_t q = 2;
  while (q < 3 * static_cast<int64_t>(capacity)) q *= 2;
  return static_cast<int32_t>(q);
}

int log2_of(int32_t pow2) {
  int b = 0;
  while ((int32_t{1} << b) < pow2) ++b;
  return b;
}

int32_t threads_for(int32_t threads) {
  AAR_CHECK_ARG(threads >= 0 && threads <= ResidentLru::kMaxThreads, "ResidentLru: threads must be in [0, ",
                ResidentLru::kMaxThreads, "] (0: the hardware threads), got ", threads);
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return std::max(1, std::min(static_cast<int32_t>(hw), ResidentLru::kMaxThreads));
}

// Helper threads shared by every ResidentLru of the process, started on first
// need and kept (sleeping on a condition variable between steps). One job at a
// time: a step that finds the pool busy (another LRU stepping on another
// thread) runs all its rows on its caller. A job is a function of the worker
// index (0 the caller, 1 .. helpers the pool threads that join in); it must
// itself share out its work, so a helper that wakes late finds nothing left
// and the caller never waits for a helper that did not start. After a fork the
// child makes a new pool (the parent's threads do not exist there).
class RowPool {
 public:
  static RowPool& instance() {
    static std::atomic<RowPool*> pool{nullptr};
    const pid_t pid = getpid();
    RowPool* p = pool.load(std::memory_order_acquire);
    if (p == nullptr || p->pid_ != pid) {
      RowPool* fresh = new RowPool(pid);  // never deleted: its threads live as long as the process
      if (pool.compare_exchange_strong(p, fresh, std::memory_order_acq_rel)) {
        p = fresh;
      } else {
        delete fresh;  // another thread installed one first (p now holds it)
      }
    }
    return *p;
  }

  // Runs fn(0) on the caller and fn(1 .. helpers) on pool threads that join in
  // time; returns when every started call has returned.
  void run(int32_t helpers, const std::function<void(int32_t)>& fn) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (busy_) {
        lk.unlock();
        fn(0);
        return;
      }
      busy_ = true;
      while (started_ < helpers) {
        try {
          std::thread(&RowPool::worker, this).detach();
        } catch (const std::system_error&) {
          break;  // no more threads: the ones there and the caller do the work
        }
        ++started_;
      }
      job_ = &fn;
      wanted_ = helpers;
      entered_ = 0;
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lk(mu_);
    open_ = false;  // a helper waking from now on does not join
    done_.wait(lk, [this] { return active_ == 0; });
    job_ = nullptr;
    busy_ = false;
  }

 private:
  explicit RowPool(pid_t pid) : pid_(pid) {}

  void worker() {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t seen = 0;  // a thread started for a job joins it
    for (;;) {
      wake_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (!open_ || entered_ >= wanted_) continue;
      const int32_t index = ++entered_;
      ++active_;
      const std::function<void(int32_t)>* job = job_;
      lk.unlock();
      (*job)(index);
      lk.lock();
      if (--active_ == 0) done_.notify_all();
    }
  }

  const pid_t pid_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int32_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int32_t started_ = 0, wanted_ = 0, entered_ = 0, active_ = 0;
  bool open_ = false, busy_ = false;
};

}  // namespace

void resident_copy_rows(CSpan<ResidentMiss> copies, CSpan<int32_t> token_to_req, CSpan<int32_t> block_table,
                        int64_t stride, int32_t block_size, int64_t capacity, Span<int64_t> src, Span<int64_t> dst) {
  const ResidentMiss* m = copies.data();
  const int32_t* ttr = token_to_req.data();
  const int32_t* bt = block_table.data();
  int64_t* s = src.data();
  int64_t* d = dst.data();
  const std::size_t n = copies.size();
  const int64_t bs = block_size;
  const auto place = [&](auto block_of, auto offset_of) {
    for (std::size_t i = 0; i < n; ++i) {
      const int64_t b = ttr[m[i].row];
      s[i] = static_cast<int64_t>(bt[b * stride + block_of(m[i].token)]) * bs + offset_of(m[i].token);
      d[i] = static_cast<int64_t>(m[i].row) * capacity + m[i].slot;
    }
  };
  if ((block_size & (block_size - 1)) == 0) {  // the usual block sizes: a shift and a mask, no division
    const int shift = log2_of(block_size);
    const int32_t low = block_size - 1;
    place([shift](int32_t p) { return p >> shift; }, [low](int32_t p) { return p & low; });
  } else {
    place([block_size](int32_t p) { return p / block_size; }, [block_size](int32_t p) { return p % block_size; });
  }
}

ResidentLru::ResidentLru(int32_t max_rows, int32_t capacity, int32_t threads) {
  AAR_CHECK_ARG(max_rows >= 1, "ResidentLru: max_rows must be >= 1, got ", max_rows);
  AAR_CHECK_ARG(capacity >= 1 && capacity <= kMaxCapacity, "ResidentLru: capacity must be in [1, ", kMaxCapacity,
                "], got ", capacity);
  max_rows_ = max_rows;
  capacity_ = capacity;
  table_size_ = table_size_for(capacity);
  queue_size_ = queue_size_for(capacity);
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const std::size_t cap = static_cast<std::size_t>(capacity);
  const std::size_t stride =
      2 * cap + 1 + static_cast<std::size_t>(queue_size_) + static_cast<std::size_t>(table_size_);
  heads_.assign(rows, RowHead{});
  tokens_.assign(rows * (cap + 1), -1);
  prev_topk_.assign(rows * cap, 0);
  if (capacity <= kMaxNarrowCapacity) {
    index16_.assign(rows * stride, 0);
  } else {
    index32_.assign(rows * stride, 0);
  }
  set_threads(threads);
}

int32_t ResidentLru::max_rows() const { return max_rows_; }
int32_t ResidentLru::capacity() const { return capacity_; }
int32_t ResidentLru::threads() const { return threads_; }

void ResidentLru::set_threads(int32_t threads) {
  const int32_t n = threads_for(threads);
  const std::size_t cap = static_cast<std::size_t>(capacity_);
  std::vector<Scratch> fresh(static_cast<std::size_t>(n));
  for (Scratch& s : fresh) {
    s.miss_pos.assign(cap, 0);
    s.miss_token.assign(cap, 0);
    s.found.assign(cap, 0);
    s.victim_pos.assign(cap, 0);
    s.squeeze.assign(static_cast<std::size_t>(queue_size_), 0);
    s.maybe_dup.assign(cap, 0);
  }
  scratch_ = std::move(fresh);
  threads_ = n;
}

void ResidentLru::reset() {
  // Lazy: a row whose request is unknown is rebuilt at its next step.
  for (RowHead& h : heads_) h.has_req = false;
  ++version_;
}

void ResidentLru::reset_rows(int32_t begin, int32_t end) {
  begin = std::max(begin, 0);
  end = std::min(end, max_rows_);
  for (int32_t r = begin; r < end; ++r) heads_[static_cast<std::size_t>(r)].has_req = false;
  ++version_;
}

void ResidentLru::list_resident(int32_t rows, std::vector<ResidentMiss>& out) const {
  out.clear();
  rows = std::max(0, std::min(rows, max_rows_));
  const std::size_t ucap = static_cast<std::size_t>(capacity_);
  for (int32_t r = 0; r < rows; ++r) {
    if (!heads_[static_cast<std::size_t>(r)].has_req) continue;
    const int32_t* tok = tokens_.data() + static_cast<std::size_t>(r) * (ucap + 1);
    for (int32_t s = 0; s < capacity_; ++s) {
      if (tok[s] >= 0) out.push_back(ResidentMiss{r, tok[s], s});
    }
  }
}

int32_t ResidentLru::token_at(int32_t row, int32_t slot) const {
  AAR_CHECK_ARG(row >= 0 && row < max_rows_, "token_at: row=", row, " is out of range [0, ", max_rows_, ")");
  AAR_CHECK_ARG(slot >= 0 && slot < capacity_, "token_at: slot=", slot, " is out of range [0, ", capacity_, ")");
  if (!heads_[static_cast<std::size_t>(row)].has_req) return -1;
  return tokens_[static_cast<std::size_t>(row) * (static_cast<std::size_t>(capacity_) + 1) +
                 static_cast<std::size_t>(slot)];
}

template <class Idx>
ResidentStepStats ResidentLru::run_rows(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index,
                                        int32_t begin, int32_t end, ResidentMiss* misses, Scratch& scratch) {
  const std::size_t rows = static_cast<std::size_t>(end);
  const int32_t K = in.K;
  const int32_t cap = capacity_;
  const Idx kEmpty = static_cast<Idx>(cap);  // the sentinel slot
  const std::size_t ucap = static_cast<std::size_t>(cap);
  const std::size_t uk = static_cast<std::size_t>(K);
  const uint32_t mask = static_cast<uint32_t>(table_size_) - 1;
  const int shift = 32 - log2_of(table_size_);
  const std::size_t stride =
      2 * ucap + 1 + static_cast<std::size_t>(queue_size_) + static_cast<std::size_t>(table_size_);
  // Half the stamp range: a stamp this far from every position of the ring's window matches none.
  constexpr Idx kHalf = static_cast<Idx>(Idx{1} << (8 * sizeof(Idx) - 1));
  const auto home = [shift](int32_t t) { return (static_cast<uint32_t>(t) * kHashMul) >> shift; };

  int32_t* miss_pos = scratch.miss_pos.data();
  int32_t* miss_token = scratch.miss_token.data();
  int32_t* found = scratch.found.data();
  uint8_t* maybe_dup = scratch.maybe_dup.data();
  int32_t* victim = scratch.found.data();  // (d)'s victims; found is only used before
  uint32_t* victim_pos = scratch.victim_pos.data();
  uint32_t* squeeze = scratch.squeeze.data();
  const uint32_t qmask = static_cast<uint32_t>(queue_size_) - 1;
  uint64_t bloom[(1 << kBloomBits) / 64];
  std::memset(bloom, 0, sizeof(bloom));
  std::size_t n_out = 0;
  ResidentStepStats st;

  for (std::size_t r = static_cast<std::size_t>(begin); r < rows; ++r) {
    RowHead& rh = heads_[r];
    int32_t* tok = tokens_.data() + r * (ucap + 1);
    Idx* stamp = index + r * stride;
    Idx* free_ring = stamp + ucap + 1;
    Idx* queue = free_ring + ucap;
    Idx* table = queue + queue_size_;
    int32_t* prev = prev_topk_.data() + r * ucap;
    const int32_t* tk = in.topk.data() + r * uk;
    int32_t* cur = out.current_slots.data() + r * uk;
    const int32_t row = static_cast<int32_t>(r);

    // The slot holding token t, or kEmpty.
    const auto find = [&](int32_t t) {
      uint32_t h = home(t);
      Idx e;
      while ((e = table[h]) != kEmpty && tok[e] != t) h = (h + 1) & mask;
      return e;
    };
    // Removes the table entry at position i, shifting later entries of the
    // probe run back into the hole (their keys are still in slots).
    const auto erase_at = [&](uint32_t i) {
      uint32_t j = i;
      for (;;) {
        j = (j + 1) & mask;
        const Idx e = table[j];
        if (e == kEmpty) break;
        const uint32_t k = home(tok[e]);
        if (((j - k) & mask) >= ((j - i) & mask)) {
          table[i] = e;
          i = j;
        }
      }
      table[i] = kEmpty;
    };
    // Removes slot s (holding token t) from the table: the entry is found by slot id, no key compares.
    const auto erase_slot = [&](int32_t t, Idx s) {
      uint32_t h = home(t);
      while (table[h] != s) h = (h + 1) & mask;
      erase_at(h);
    };

    if (r + 1 < rows) {  // pull the next row's table and slots towards L2
      const char* lines[3] = {reinterpret_cast<const char*>(table + stride),
                              reinterpret_cast<const char*>(tok + ucap + 1),
                              reinterpret_cast<const char*>(stamp + stride)};
      const std::size_t bytes[3] = {sizeof(Idx) * static_cast<std::size_t>(table_size_), sizeof(int32_t) * ucap,
                                    sizeof(Idx) * ucap};
      for (int a = 0; a < 3; ++a) {
        for (std::size_t o = 0; o < bytes[a]; o += 64) __builtin_prefetch(lines[a] + o, 0, 2);
      }
    }

    // (a) a new request: every slot empty, used in the order 0, 1, ...
    const uint64_t req = in.req_ids[r];
    if (!rh.has_req || rh.req != req) {
      std::fill(tok, tok + ucap + 1, -1);  // no queue entries: the stamps do not matter
      for (int32_t s = 0; s < cap; ++s) free_ring[s] = static_cast<Idx>(s);
      std::fill(table, table + table_size_, kEmpty);
      rh = RowHead{};
      rh.req = req;
      rh.has_req = true;
      rh.free_count = cap;
      ++st.resets;
    }

    // The selection of a clean row did not change and nothing is invalidated:
    // the same slots, no change of state (the block's hits are K - 1 - pos).
    const int32_t sp = in.stable_prefix[r];
    if (rh.clean && rh.clean_k == K && rh.max_token < sp && std::memcmp(tk, prev, uk * sizeof(int32_t)) == 0) {
      const uint32_t first = (rh.tail - static_cast<uint32_t>(K)) & qmask;
      if (first + uk <= static_cast<std::size_t>(queue_size_)) {  // the block does not wrap
        const Idx* last = queue + first + uk - 1;
        for (int32_t pos = 0; pos < K; ++pos) cur[pos] = static_cast<int32_t>(last[-pos]);
      } else {
        for (int32_t pos = 0; pos < K; ++pos) {
          cur[pos] = static_cast<int32_t>(queue[(rh.tail - 1 - static_cast<uint32_t>(pos)) & qmask]);
        }
      }
      st.hits += K;
      continue;
    }

    // (b) the speculative suffix: tokens >= stable_prefix are dropped, in
    // slot order to the free ring. Skipped when no resident token can be that
    // large; a short range of candidate tokens is looked up, else every slot
    // is read.
    if (rh.max_token >= sp) {
      int32_t n_found = 0;
      const int64_t range = static_cast<int64_t>(rh.max_token) - sp + 1;
      if (range <= cap / 4) {
        for (int64_t t = sp; t <= rh.max_token; ++t) {
          const Idx e = find(static_cast<int32_t>(t));
          if (e != kEmpty) found[n_found++] = static_cast<int32_t>(e);
        }
        std::sort(found, found + n_found);
      } else {
        for (int32_t s = 0; s < cap; ++s) {
          found[n_found] = s;
          n_found += tok[s] >= sp;  // sp >= 0, so an empty slot (-1) never counts
        }
      }
      for (int32_t i = 0; i < n_found; ++i) {
        const Idx s = static_cast<Idx>(found[i]);
        erase_slot(tok[s], s);
        tok[s] = -1;
        stamp[s] = static_cast<Idx>(rh.tail + kHalf);  // its queue entry turns stale
        int32_t at = rh.free_head + rh.free_count;
        if (at >= cap) at -= cap;
        free_ring[at] = s;
        ++rh.free_count;
      }
      st.invalidated += n_found;
      rh.max_token = std::min(rh.max_token, sp - 1);  // still an upper bound
    }

    // Room for this step's block of K entries in the ring: squeeze the stale
    // entries out (live entries <= capacity, so K <= capacity always fits).
    // The live ones are listed without a branch per entry (live and stale
    // entries interleave unpredictably), reading the ring in its one or two
    // contiguous pieces, then written back from ring position 0 on.
    if (rh.tail - rh.head + static_cast<uint32_t>(K) > static_cast<uint32_t>(queue_size_)) {
      uint32_t n = 0;
      uint32_t i = rh.head;
      while (i != rh.tail) {
        const uint32_t from = i & qmask;
        const uint32_t len = std::min(rh.tail - i, static_cast<uint32_t>(queue_size_) - from);
        const Idx* piece = queue + from;
        for (uint32_t k = 0; k < len; ++k) {
          const Idx e = piece[k];
          squeeze[n] = e;
          n += static_cast<uint32_t>(stamp[e] == static_cast<Idx>(i + k));
        }
        i += len;
      }
      for (uint32_t k = 0; k < n; ++k) {
        const Idx e = static_cast<Idx>(squeeze[k]);
        queue[k] = e;
        stamp[e] = static_cast<Idx>(k);
      }
      rh.head = 0;
      rh.tail = n;
    }
    // The sentinel (padding) matches no position of this step's window.
    stamp[cap] = static_cast<Idx>(rh.tail + kHalf);
    const uint32_t block = rh.tail;
    const uint32_t top = block + static_cast<uint32_t>(K) - 1;  // the block's last (most recent) position

    // (c), (f), (g): one pass over the top-k. A hit takes the next position
    // down from the block's top (hits in reverse top-k order); a slot already
    // in the block is a repeat. First-seen misses are listed in top-k order,
    // flagged when the filter has seen their hash among this row's misses (a
    // possible repeat, checked in (e)).
    uint32_t nh = 0;
    int32_t nm = 0;
    int64_t dups = 0;
    for (int32_t pos = 0; pos < K; ++pos) {
      const int32_t t = tk[pos];
      if (t < 0) {
        cur[pos] = -1;
        continue;
      }
      // find(t) with the sentinel holding t: the probe ends at t or at an empty entry.
      tok[cap] = t;
      uint32_t h = home(t);
      Idx e;
      while (tok[e = table[h]] != t) h = (h + 1) & mask;
      if (e != kEmpty) {
        cur[pos] = static_cast<int32_t>(e);
        if (static_cast<Idx>(stamp[e] - static_cast<Idx>(block)) >= static_cast<Idx>(K)) {  // not yet in the block
          const uint32_t q = top - nh;
          stamp[e] = static_cast<Idx>(q);
          queue[q & qmask] = e;
          ++nh;
        } else {
          ++dups;
        }
      } else {
        const uint32_t b = (static_cast<uint32_t>(t) * kBloomMul) >> (32 - kBloomBits);
        const uint64_t bit = uint64_t{1} << (b & 63);
        maybe_dup[nm] = (bloom[b >> 6] & bit) != 0;
        bloom[b >> 6] |= bit;
        miss_pos[nm] = pos;
        miss_token[nm] = t;
        ++nm;
      }
    }
    tok[cap] = -1;
    st.hits += nh;

    // (d), (e): the misses take the empty slots, then the least recent
    // non-hit residents (a hit's older entry is stale: its stamp is in the
    // block). K <= capacity guarantees enough of them. The victims are read
    // off the queue first, without a branch per entry (as many as the misses
    // beyond the empty slots; repeats among the misses may leave the last
    // ones unused). The assigned slots go below the hits, in reverse top-k
    // order.
    const int32_t need = nm - rh.free_count;
    if (need > 0) {
      uint32_t i = rh.head;
      for (int32_t n = 0; n < need; ++i) {
        const Idx s = queue[i & qmask];
        victim[n] = static_cast<int32_t>(s);
        victim_pos[n] = i;
        n += static_cast<int32_t>(stamp[s] == static_cast<Idx>(i));
      }
    }
    int32_t n_victims = 0;
    const std::size_t first_miss = n_out;
    int32_t max_token = rh.max_token;
    uint32_t q = top - nh;
    for (int32_t i = 0; i < nm; ++i) {
      const int32_t t = miss_token[i];
      const int32_t pos = miss_pos[i];
      if (maybe_dup[i]) {
        const Idx e = find(t);
        if (e != kEmpty) {  // copied earlier in this row
          cur[pos] = static_cast<int32_t>(e);
          ++dups;
          continue;
        }
      }
      Idx v;
      if (rh.free_count > 0) {
        v = free_ring[rh.free_head];
        if (++rh.free_head == cap) rh.free_head = 0;
        --rh.free_count;
      } else {
        v = static_cast<Idx>(victim[n_victims]);
        rh.head = victim_pos[n_victims] + 1;
        ++n_victims;
        erase_slot(tok[v], v);
      }
      tok[v] = t;
      stamp[v] = static_cast<Idx>(q);
      queue[q & qmask] = v;
      --q;
      uint32_t h = home(t);
      while (table[h] != kEmpty) h = (h + 1) & mask;
      table[h] = v;
      cur[pos] = static_cast<int32_t>(v);
      misses[n_out++] = ResidentMiss{row, t, static_cast<int32_t>(v)};
      max_token = std::max(max_token, t);
    }
    rh.max_token = max_token;
    if (nm > 0) std::memset(bloom, 0, sizeof(bloom));
    st.duplicates += dups;

    // The block's padding, below the assigned slots: one sentinel per invalid or repeated entry.
    const uint32_t assigned = static_cast<uint32_t>(n_out - first_miss);
    const uint32_t pads = static_cast<uint32_t>(K) - nh - assigned;
    for (uint32_t p = block; p != block + pads; ++p) queue[p & qmask] = kEmpty;
    rh.tail = block + static_cast<uint32_t>(K);

    // A clean step keeps its top-k for the unchanged-selection test.
    rh.clean = nh == static_cast<uint32_t>(K) && n_out == first_miss;
    if (rh.clean) {
      rh.clean_k = K;
      std::memcpy(prev, tk, uk * sizeof(int32_t));
    }
  }
  st.misses = static_cast<int64_t>(n_out);
  return st;
}

template <class Idx>
ResidentStepStats ResidentLru::run(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index) {
  const int32_t rows = static_cast<int32_t>(in.req_ids.size());
  const int32_t threads = std::max(1, std::min(threads_, rows / kMinRowsPerThread));
  if (threads == 1) return run_rows(in, out, index, 0, rows, out.misses.data(), scratch_[0]);

  // Contiguous chunks of rows, a few per thread (the machine may be shared:
  // a thread that finishes early takes the next one).
  constexpr int32_t kChunksPerThread = 4;
  const int32_t chunks = std::min(rows, kChunksPerThread * threads);
  std::array<ResidentStepStats, kChunksPerThread * kMaxThreads> chunk_stats{};
  const std::size_t uk = static_cast<std::size_t>(in.K);
  const auto chunk_begin = [rows, chunks](int32_t c) {
    return static_cast<int32_t>(static_cast<int64_t>(rows) * c / chunks);
  };
  std::atomic<int32_t> next{0};
  const std::function<void(int32_t)> work = [&](int32_t worker) {
    Scratch& scratch = scratch_[static_cast<std::size_t>(worker)];
    for (int32_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int32_t b = chunk_begin(c), e = chunk_begin(c + 1);
      chunk_stats[static_cast<std::size_t>(c)] =
          run_rows(in, out, index, b, e, out.misses.data() + static_cast<std::size_t>(b) * uk, scratch);
    }
  };
  RowPool::instance().run(threads - 1, work);

  // Each chunk's misses to their place after the previous chunks'.
  ResidentStepStats st;
  std::size_t n_out = 0;
  ResidentMiss* misses = out.misses.data();
  for (int32_t c = 0; c < chunks; ++c) {
    const ResidentStepStats& cs = chunk_stats[static_cast<std::size_t>(c)];
    const std::size_t from = static_cast<std::size_t>(chunk_begin(c)) * uk;
    const std::size_t n = static_cast<std::size_t>(cs.misses);
    if (from != n_out && n > 0) std::memmove(misses + n_out, misses + from, n * sizeof(ResidentMiss));
    n_out += n;
    st.hits += cs.hits;
    st.misses += cs.misses;
    st.resets += cs.resets;
    st.invalidated += cs.invalidated;
    st.duplicates += cs.duplicates;
  }
  return st;
}

ResidentStepStats ResidentLru::step(const ResidentStepInputs& in, const ResidentStepOutputs& out) {
  // ---------------------------------------------------------------- validate
  const std::size_t rows = in.req_ids.size();
  AAR_CHECK_ARG(rows <= static_cast<std::size_t>(max_rows_), "req_ids has ", rows, " rows, more than max_rows=",
                max_rows_);
  AAR_CHECK_ARG(in.K >= 1, "K (index_topk) must be >= 1, got ", in.K);
  AAR_CHECK_ARG(in.K <= capacity_, "K=", in.K, " exceeds the resident capacity ", capacity_,
                " (topk_buffer_size must be >= index_topk)");
  const std::size_t entries = rows * static_cast<std::size_t>(in.K);
  AAR_CHECK_ARG(in.topk.size() == entries, "topk has ", in.topk.size(), " entries, expected rows x K = ", rows, " x ",
                in.K, " = ", entries);
  AAR_CHECK_ARG(in.stable_prefix.size() == rows, "stable_prefix has ", in.stable_prefix.size(),
                " entries, expected one per row: ", rows);
  for (std::size_t r = 0; r < rows; ++r) {
    AAR_CHECK_ARG(in.stable_prefix[r] >= 0, "stable_prefix[", r, "]=", in.stable_prefix[r],
                  " is negative (a stable prefix is a KV length)");
  }
  AAR_CHECK_ARG(out.current_slots.size() >= entries, "current_slots has room for ", out.current_slots.size(),
                " entries, needs rows x K = ", entries);
  AAR_CHECK_ARG(out.misses.size() >= entries, "misses has room for ", out.misses.size(),
                " entries, needs rows x K = ", entries);

  // ---------------------------------------------------------------- write
  ++version_;
  if (!index16_.empty()) return run(in, out, index16_.data());
  return run(in, out, index32_.data());
}

}  // namespace aar::plan
