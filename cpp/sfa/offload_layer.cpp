// One SFA layer's KV-offload state and data movements (docs/design/sfa.md §6).
#include "offload_layer.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "../common/shared_by_shape.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "sparse_attention.h"
#include "../graph/exclusive_scope.h"

namespace aar::sfa {

void OffloadCopyHooks::commit(const at::Tensor& pool_rows, const at::Tensor& slots, const at::Tensor& rows) {
  // On a device: one device -> host copy of the rows, then a host scatter.
  at::Tensor src = rows.device() == pool_rows.device() ? rows : rows.to(pool_rows.device());
  at::Tensor dst = pool_rows;
  dst.index_copy_(0, slots, src);
}

void OffloadCopyHooks::onload(const at::Tensor& dst_rows, const at::Tensor& dst_index, const at::Tensor& src_rows,
                              const at::Tensor& src_index) {
  // One host gather of every miss, one host -> device copy of the gathered
  // rows and of the destination index, one device scatter.
  const c10::Device dev = dst_rows.device();
  at::Tensor rows = src_rows.index_select(0, src_index);
  at::Tensor dst = dst_rows;
  if (dev == src_rows.device()) {
    dst.index_copy_(0, dst_index, rows);
  } else {
    dst.index_copy_(0, dst_index.to(dev), rows.to(dev));
  }
}

std::shared_ptr<OffloadCopyHooks> default_offload_copy_hooks() {
  static const std::shared_ptr<OffloadCopyHooks> hooks = std::make_shared<OffloadCopyHooks>();
  return hooks;
}

int64_t offload_resident_rows(int64_t max_num_tokens, int64_t max_num_reqs, int64_t num_speculative_tokens) {
  return std::min(max_num_tokens, max_num_reqs * (1 + num_speculative_tokens));
}

const char* to_string(OffloadStepStats::Route r) {
  switch (r) {
    case OffloadStepStats::Route::None: return "none";
    case OffloadStepStats::Route::DecodeOnly: return "decode_only";
    case OffloadStepStats::Route::WithPrefills: return "with_prefills";
  }
  return "unknown";
}

namespace detail {

OffloadWorkspace::OffloadWorkspace(const OffloadShape& s)
    : shape_(s), exclusive_(std::make_shared<::aar::detail::ExclusiveUse>("the SFA offload workspace")) {
  const int64_t n = s.rows * s.K, ppr = s.capacity / s.block_size;
  const auto host_i32 = at::TensorOptions().dtype(at::kInt);
  const auto host_i64 = at::TensorOptions().dtype(at::kLong);
  const auto dev_i32 = host_i32.device(s.device);
  masked.assign(static_cast<size_t>(n), -1);
  misses.resize(static_cast<size_t>(n));
  src_index = at::empty({n}, host_i64);
  dst_index = at::empty({n}, host_i64);
  slots_device = at::full({s.rows, 1, s.K}, -1, dev_i32);
  if (s.device.is_cpu()) {
    slots_host = slots_device.view({n});  // the LRU writes the kernel's indices in place
  } else {
    // Page-locked: a captured replay copies the slots host -> device (docs/design/sfa.md §6.6).
    topk_host = at::empty({n}, host_i32.pinned_memory(true));
    slots_host = at::empty({n}, host_i32.pinned_memory(true));
  }
  block_table = (at::arange(s.rows * ppr, host_i32).view({s.rows, ppr})).to(s.device);
  cum_query_lens = at::arange(1, s.rows + 1, host_i32).to(s.device);
  seq_lens = at::full({s.rows}, s.capacity, dev_i32);
  row_views_.resize(static_cast<size_t>(s.rows) + 1);
}

void OffloadWorkspace::use() { graph::use_in_forward(exclusive_); }

std::shared_ptr<OffloadWorkspace> OffloadWorkspace::shared(const OffloadShape& shape) {
  return ::aar::detail::shared_by_shape<OffloadWorkspace>(shape);
}

const OffloadWorkspace::RowViews& OffloadWorkspace::rows(int64_t n) {
  RowViews& v = row_views_[static_cast<size_t>(n)];
  if (!v.slots.defined()) {
    v.slots = slots_device.narrow(0, 0, n);
    v.block_table = block_table.narrow(0, 0, n);
    v.cum_query_lens = cum_query_lens.narrow(0, 0, n);
    v.seq_lens = seq_lens.narrow(0, 0, n);
  }
  return v;
}

namespace {

// The configuration checks the LRU's construction depends on; returns the resident rows.
int32_t checked_rows(const OffloadConfig& cfg) {
  AAR_CHECK_ARG(cfg.pool != nullptr, "offload.pool is required: the host KV pool (HostKvPool::create on its owner, "
                "attach elsewhere)");
  AAR_CHECK_ARG(cfg.max_num_reqs > 0 && cfg.max_num_tokens > 0 && cfg.num_speculative_tokens >= 0,
                "offload.max_num_reqs and max_num_tokens must be positive and num_speculative_tokens non-negative, "
                "got ", cfg.max_num_reqs, ", ", cfg.max_num_tokens, ", ", cfg.num_speculative_tokens);
  AAR_CHECK_ARG(cfg.topk_buffer_size > 0 && cfg.topk_buffer_size <= INT32_MAX,
                "offload.topk_buffer_size must be positive, got ", cfg.topk_buffer_size);
  AAR_CHECK_ARG(cfg.lru_threads >= 0 && cfg.lru_threads <= plan::ResidentLru::kMaxThreads, "offload.lru_threads=",
                cfg.lru_threads, " is out of range [0, ", plan::ResidentLru::kMaxThreads,
                "] (0: the hardware threads, 1: the calling thread only)");
  return static_cast<int32_t>(
      offload_resident_rows(cfg.max_num_tokens, cfg.max_num_reqs, cfg.num_speculative_tokens));
}

}  // namespace

OffloadLayer::OffloadLayer(const OffloadConfig& cfg, int64_t layer_index, int64_t L, int64_t R, c10::Device device,
                           bool repeats_decisions)
    : cfg_(cfg),
      hooks_(cfg.copy_hooks != nullptr ? cfg.copy_hooks : default_offload_copy_hooks()),
      L_(L),
      R_(R),
      device_(device),
      lru_(std::make_shared<plan::ResidentLru>(checked_rows(cfg), static_cast<int32_t>(cfg.topk_buffer_size),
                                               cfg.lru_threads)),
      repeats_(repeats_decisions) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  const HostKvPool& p = *cfg_.pool;
  AAR_CHECK_ARG(p.is_owner() || cfg_.copy_hooks != nullptr, "offload.copy_hooks is required on a process that "
                "attached to the host KV pool \"", p.name(), "\" (not its owner): its before_onload must wait for the "
                "owner's commit of the step's rows (upstream: a TP broadcast), which the default hooks cannot do");
  AAR_CHECK_ARG(cfg_.pool_layer >= -1, "offload.pool_layer=", cfg_.pool_layer,
                " is negative: give a layer of the pool, or -1 for the layer's layer_index");
  pool_layer_ = cfg_.pool_layer >= 0 ? cfg_.pool_layer : layer_index;
  AAR_CHECK_ARG(pool_layer_ >= 0 && pool_layer_ < p.num_layers(), "offload.pool_layer=", pool_layer_,
                cfg_.pool_layer >= 0 ? "" : " (the layer_index)", " is out of range [0, ", p.num_layers(),
                ") of the host KV pool \"", p.name(), "\"");
  AAR_CHECK_ARG(p.kv_lora_rank() == L && p.qk_rope_head_dim() == R, "the host KV pool \"", p.name(), "\" holds rows "
                "of kv_lora_rank=", p.kv_lora_rank(), " and qk_rope_head_dim=", p.qk_rope_head_dim(),
                ", the layer's are ", L, " and ", R);
  const int64_t cap = cfg_.topk_buffer_size, bs = p.block_size();
  AAR_CHECK_ARG(cap % bs == 0, "offload.topk_buffer_size=", cap, " must be a multiple of the block size ", bs,
                " (the resident buffers are read as pages of the main cache's block size)");
  rows_ = offload_resident_rows(cfg_.max_num_tokens, cfg_.max_num_reqs, cfg_.num_speculative_tokens);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  buf_k_ = at::zeros({rows_, cap, 1, L}, opts);
  buf_v_ = at::zeros({rows_, cap, 1, R}, opts);
  pages_k_ = buf_k_.view({rows_ * (cap / bs), bs, 1, L});
  pages_v_ = buf_v_.view({rows_ * (cap / bs), bs, 1, R});
  rows_k_ = buf_k_.view({rows_ * cap, L});
  rows_v_ = buf_v_.view({rows_ * cap, R});
}

void OffloadLayer::check(const Metadata& md, int64_t K) const {
  const OffloadMetadata& o = md.offload;
  AAR_CHECK_ARG(o.enabled, "metadata was built by an SFA builder without KV offload (BuilderConfig::offload / "
                "MetadataBuilder(offload=...)): it has no req_ids, token-to-request map or offload split, which the "
                "offloaded layer needs");
  AAR_CHECK_ARG(o.decode_consumer == cfg_.is_decode_consumer, "the metadata's builder has is_decode_consumer=",
                o.decode_consumer ? "True" : "False", " but the layer's offload.is_decode_consumer=",
                cfg_.is_decode_consumer ? "True" : "False", " (the split rule and the layer must agree, docs/design/sfa.md §6)");
  const HostKvPool& p = *cfg_.pool;
  AAR_CHECK_ARG(p.block_size() == md.block_size, "the host KV pool \"", p.name(), "\" has block_size=",
                p.block_size(), " but the metadata's is ", md.block_size);
  AAR_CHECK_ARG(p.num_blocks() >= md.num_blocks, "the host KV pool \"", p.name(), "\" has ", p.num_blocks(),
                " blocks, fewer than the metadata's num_blocks=", md.num_blocks,
                " (the block table indexes the pool)");
  AAR_CHECK_ARG(md.num_decode_tokens <= rows_, "the step has ", md.num_decode_tokens, " decode tokens but the "
                "layer's resident buffers have ", rows_, " rows (offload max_num_tokens=", cfg_.max_num_tokens,
                ", max_num_reqs=", cfg_.max_num_reqs, ", num_speculative_tokens=", cfg_.num_speculative_tokens, ")");
  AAR_CHECK_ARG(K <= cfg_.topk_buffer_size, "the top-k holds ", K, " indices per token, more than offload."
                "topk_buffer_size=", cfg_.topk_buffer_size, " resident slots per row (docs/design/sfa.md §6: topk_buffer_size >= "
                "index_topk)");
}

void OffloadLayer::commit(const at::Tensor& k, const at::Tensor& v, const Metadata& md) {
  commit_rows(k, v, md.offload.slot_mapping_host, md.num_actual_tokens);
}

void OffloadLayer::commit_rows(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots, int64_t n) {
  stats_.commit_bytes = 0;
  if (!cfg_.pool->is_owner() || n == 0) return;  // one writer (upstream: TP rank 0)
  hooks_->commit(cfg_.pool->k_rows(pool_layer_), slots, k.narrow(0, 0, n));
  hooks_->commit(cfg_.pool->v_rows(pool_layer_), slots, v.narrow(0, 0, n));
  stats_.commit_bytes = n * (L_ + R_) * 2;
}

void OffloadLayer::onload(const OffloadMetadata& o, int64_t block_size, const plan::ResidentMiss* m, int64_t n,
                          const at::Tensor& src_index, const at::Tensor& dst_index) {
  // docs/design/sfa.md §6.3's addresses: token p of row t (request b) sits in pool row
  // block_table[b][p / bs] * bs + p % bs and goes to resident row t * capacity + slot.
  const size_t un = static_cast<size_t>(n);
  plan::resident_copy_rows({m, un}, o.token_to_req_host, o.block_table_host, o.block_table_stride,
                           static_cast<int32_t>(block_size), cfg_.topk_buffer_size,
                           {src_index.data_ptr<int64_t>(), un}, {dst_index.data_ptr<int64_t>(), un});
  hooks_->before_onload();
  if (n == 0) return;
  const at::Tensor s = src_index.narrow(0, 0, n), d = dst_index.narrow(0, 0, n);
  hooks_->onload(rows_k_, d, cfg_.pool->k_rows(pool_layer_), s);
  hooks_->onload(rows_v_, d, cfg_.pool->v_rows(pool_layer_), s);
}

int32_t OffloadLayer::resident_token(int32_t row, int32_t slot) const {
  if (mirror_.layer == 0) return lru_->token_at(row, slot);
  const std::shared_ptr<const plan::ResidentLru> src = mirror_.lru.lock();
  if (src == nullptr || src->version() != mirror_.version) return -1;
  return src->token_at(row, slot);
}

void OffloadLayer::reset_resident() {
  lru_->reset();
  own_stale_ = false;
  mirror_ = Mirror{};
}

void OffloadLayer::set_step_stats(int64_t rows, const plan::ResidentStepStats& st, int64_t copies,
                                  int64_t decided_by, bool resynced) {
  stats_.decode_rows = rows;
  stats_.hits = st.hits;
  stats_.misses = copies;
  stats_.resets = st.resets;
  stats_.invalidated = st.invalidated;
  stats_.duplicates = st.duplicates;
  stats_.onload_bytes = copies * (L_ + R_) * 2;
  stats_.decided_by = decided_by;
  stats_.resynced = resynced;
}

bool OffloadLayer::repeat_decision(OffloadWorkspace& w, int64_t rows, const OffloadMetadata& o, int64_t block_size) {
  const OffloadWorkspace::Decision& d = w.decision;
  const bool in_step = mirror_.layer == d.layer && mirror_.version == d.before;
  const plan::ResidentMiss* copies = w.misses.data();
  int64_t n = d.stats.misses;
  at::Tensor src = w.src_index, dst = w.dst_index;
  if (!in_step) {
    // Out of step (the first repeat, a reset here or there, a step of the other LRU this layer did
    // not follow): every resident token of that LRU's state after the decision, which it must still hold.
    const std::shared_ptr<const plan::ResidentLru> lru = d.lru.lock();
    if (lru == nullptr || lru->version() != d.after) return false;
    lru->list_resident(static_cast<int32_t>(rows), resync_);
    copies = resync_.data();
    n = static_cast<int64_t>(resync_.size());
    if (!resync_src_.defined() || resync_src_.numel() < n) {
      const auto opts = at::TensorOptions().dtype(at::kLong);
      resync_src_ = at::empty({std::max<int64_t>(n, 1)}, opts);
      resync_dst_ = at::empty({std::max<int64_t>(n, 1)}, opts);
    }
    src = resync_src_;
    dst = resync_dst_;
  }
  // From here the buffers follow that LRU: this layer's own no longer describes them, and until the
  // copies are done they follow none (a failed copy leaves the next repeat to resync).
  own_stale_ = true;
  mirror_ = Mirror{};
  set_step_stats(rows, d.stats, n, d.pool_layer, !in_step);
  onload(o, block_size, copies, n, src, dst);
  mirror_ = Mirror{d.layer, d.after, d.lru};
  return true;
}

void OffloadLayer::resident_step(OffloadWorkspace& w, const int32_t* tp, int64_t rows, int64_t K,
                                 const OffloadMetadata& o, int64_t block_size) {
  const size_t n = static_cast<size_t>(rows * K), ur = static_cast<size_t>(rows);
  const plan::CSpan<int32_t> seq = o.decode_seq_lens.first(ur), sp = o.decode_stable_prefix.first(ur);
  const plan::CSpan<uint64_t> req = o.decode_req_ids.first(ur);
  OffloadWorkspace::Decision& d = w.decision;
  // docs/design/sfa.md §6.8: the layer before decided on the same selection (an IndexCache layer
  // reusing its top-k): its decision and copies are repeated, no LRU step.
  if (repeats_ && d.valid && d.layer != id_ && d.rows == rows &&
      std::equal(req.begin(), req.end(), d.req_ids.begin()) &&
      std::equal(sp.begin(), sp.end(), d.stable_prefix.begin()) &&
      plan::masked_topk_equals({tp, n}, static_cast<int32_t>(K), seq, {w.masked.data(), n}) &&
      repeat_decision(w, rows, o, block_size)) {
    return;
  }
  d.valid = false;
  // Entries outside [0, seq_len) of the token's request -> -1.
  plan::mask_invalid_topk({tp, n}, static_cast<int32_t>(K), seq, {w.masked.data(), n});
  // The layer's LRU maps the entries to resident slots (from empty if the buffers followed another's).
  if (own_stale_) {
    lru_->reset();
    own_stale_ = false;
  }
  mirror_ = Mirror{};
  plan::ResidentLru& lru = *lru_;
  const uint64_t before = lru.version();
  plan::ResidentStepInputs li;
  li.topk = plan::CSpan<int32_t>(w.masked.data(), n);
  li.K = static_cast<int32_t>(K);
  li.req_ids = req;
  li.stable_prefix = sp;
  plan::ResidentStepOutputs lo;
  lo.current_slots = plan::Span<int32_t>(w.slots_host.data_ptr<int32_t>(), n);
  lo.misses = plan::Span<plan::ResidentMiss>(w.misses.data(), n);
  const plan::ResidentStepStats st = lru.step(li, lo);
  // Rows past this step's forget their residents: while a row is not stepped
  // its request may still decode on another row and rewrite (MTP) the host
  // rows of tokens it holds; coming back with the same request id it would
  // then hit stale copies.
  lru.reset_rows(static_cast<int32_t>(rows), lru.max_rows());
  try {
    set_step_stats(rows, st, st.misses, pool_layer_, false);
    onload(o, block_size, w.misses.data(), st.misses, w.src_index, w.dst_index);
  } catch (...) {
    lru.reset();  // its slots would no longer describe the buffers
    throw;
  }
  d.layer = id_;
  d.pool_layer = pool_layer_;
  d.lru = lru_;
  d.before = before;
  d.after = lru.version();
  d.rows = rows;
  d.req_ids.assign(req.begin(), req.end());
  d.stable_prefix.assign(sp.begin(), sp.end());
  d.stats = st;
  d.valid = true;
}

at::Tensor OffloadLayer::attend(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk, const Metadata& md,
                                double scale) {
  const int64_t rows = qn.size(0), K = topk.size(2);
  const OffloadShape shape{rows_, K, cfg_.topk_buffer_size, md.block_size, device_};
  if (ws_ == nullptr || !(ws_->shape() == shape)) ws_ = OffloadWorkspace::shared(shape);
  OffloadWorkspace& w = *ws_;
  w.use();
  const size_t n = static_cast<size_t>(rows * K);
  // Step 2: the top-k on the host (on a device: the path's one synchronising
  // copy).
  at::Tensor t = topk.narrow(0, 0, rows);
  const int32_t* tp = nullptr;
  at::Tensor keep;
  if (t.device().is_cpu()) {
    keep = t.is_contiguous() ? t : t.contiguous();
    tp = keep.const_data_ptr<int32_t>();
  } else {
    at::Tensor h = w.topk_host.narrow(0, 0, static_cast<int64_t>(n));
    h.copy_(t.reshape({-1}));
    tp = h.const_data_ptr<int32_t>();
  }
  resident_step(w, tp, rows, K, md.offload, md.block_size);
  try {
    const OffloadWorkspace::RowViews& v = w.rows(rows);
    if (!device_.is_cpu()) v.slots.view({-1}).copy_(w.slots_host.narrow(0, 0, static_cast<int64_t>(n)));
    // Step 4-5: each row its own one-query request over its resident pages.
    return sparse_attention(args_, {qn, qr, v.slots, pages_k_, pages_v_, v.block_table, v.cum_query_lens,
                                    v.seq_lens, scale});
  } catch (...) {
    reset_resident();
    throw;
  }
}

// ---------------------------------------------------------------- graph capture (docs/design/sfa.md §6.6)

// ---------------------------------------------------------------- the snapshot ring (docs/design/sfa.md §6.7)

OffloadStepRing::OffloadStepRing(int64_t bucket_tokens) {
  for (OffloadStepSnapshot& s : slots_) {
    s.slot_mapping = at::empty({bucket_tokens}, at::TensorOptions().dtype(at::kLong));
    s.decode_req_ids.reserve(static_cast<size_t>(bucket_tokens));
    s.decode_seq_lens.reserve(static_cast<size_t>(bucket_tokens));
    s.decode_stable_prefix.reserve(static_cast<size_t>(bucket_tokens));
    s.token_to_req.reserve(static_cast<size_t>(bucket_tokens));
  }
}

bool OffloadStepRing::supersedes(const graph::UpdatePass& pass) const {
  // The newest snapshot belongs to an update no replay consumed (it failed part way; or the CPU
  // provider has not replayed since): this update replaces it in place.
  return published_.load(std::memory_order_relaxed) > 0 && pass.unreplayed != 0 && pass.unreplayed == last_pass_;
}

int64_t OffloadStepRing::pending() const {
  return static_cast<int64_t>(published_.load(std::memory_order_acquire) - read_.load(std::memory_order_acquire));
}

void OffloadStepRing::check_free(int64_t bucket, const graph::UpdatePass& pass) const {
  if (pass.id == last_pass_ || supersedes(pass)) return;
  const OffloadStepSnapshot& next = slots_[published_.load(std::memory_order_relaxed) % kSlots];
  if (next.readers_left.load(std::memory_order_acquire) == 0) return;
  throw_invalid("update of SFA KV-offload bucket ", bucket, ": the host inputs of ", pending(), " earlier updates "
                "are still pending (their replays' host callbacks have not run) and the bucket keeps ", kSlots,
                " snapshots (docs/design/sfa.md §6.7); wait for the stream to reach the oldest replay's callbacks "
                "before updating again");
}

void OffloadStepRing::take(const Metadata& md, const graph::UpdatePass& pass) {
  if (pass.id == last_pass_) return;  // an earlier offloaded layer of this update took it
  const bool replace = supersedes(pass);
  const uint64_t seq = published_.load(std::memory_order_relaxed) - (replace ? 1 : 0);
  OffloadStepSnapshot& s = slots_[seq % kSlots];
  AAR_CHECK_ARG(replace || s.readers_left.load(std::memory_order_acquire) == 0,
                "SFA KV-offload snapshot ", seq, " is still pending (the update's check lets it through only free)");
  const OffloadMetadata& o = md.offload;
  const auto ndt = static_cast<size_t>(md.num_decode_tokens);
  const int64_t nat = md.num_actual_tokens;
  AAR_CHECK_ARG(nat <= s.slot_mapping.numel(), "the step has ", nat, " tokens, more than the bucket's ",
                s.slot_mapping.numel());
  s.decode_req_ids.assign(o.decode_req_ids.begin(), o.decode_req_ids.begin() + ndt);
  s.decode_seq_lens.assign(o.decode_seq_lens.begin(), o.decode_seq_lens.begin() + ndt);
  s.decode_stable_prefix.assign(o.decode_stable_prefix.begin(), o.decode_stable_prefix.begin() + ndt);
  s.token_to_req.assign(o.token_to_req_host.begin(), o.token_to_req_host.begin() + ndt);
  // The block table of the requests the decode rows belong to, as wide as their lengths reach (a miss
  // reads block token / block_size of its row's request, token < the row's seq_len).
  int32_t nreq = 0, width = 0;
  const int32_t bs = md.block_size, stride = o.block_table_stride;
  for (size_t t = 0; t < ndt; ++t) {
    nreq = std::max(nreq, s.token_to_req[t] + 1);
    width = std::max(width, (s.decode_seq_lens[t] + bs - 1) / bs);
  }
  width = std::min(width, stride);
  s.block_table.resize(static_cast<size_t>(nreq) * static_cast<size_t>(width));
  for (int32_t b = 0; b < nreq; ++b) {
    std::copy_n(o.block_table_host.data() + static_cast<size_t>(b) * static_cast<size_t>(stride),
                static_cast<size_t>(width), s.block_table.data() + static_cast<size_t>(b) * static_cast<size_t>(width));
  }
  if (nat > 0) {
    std::copy_n(o.slot_mapping_host.const_data_ptr<int64_t>(), nat, s.slot_mapping.data_ptr<int64_t>());
  }
  s.num_decode_tokens = md.num_decode_tokens;
  s.num_actual_tokens = nat;
  OffloadMetadata& v = s.view;
  v.enabled = true;
  v.decode_consumer = o.decode_consumer;
  v.slot_mapping_host = s.slot_mapping.narrow(0, 0, nat);
  v.decode_req_ids = plan::CSpan<uint64_t>(s.decode_req_ids.data(), ndt);
  v.decode_seq_lens = plan::CSpan<int32_t>(s.decode_seq_lens.data(), ndt);
  v.decode_stable_prefix = plan::CSpan<int32_t>(s.decode_stable_prefix.data(), ndt);
  v.token_to_req_host = plan::CSpan<int32_t>(s.token_to_req.data(), ndt);
  v.block_table_host = plan::CSpan<int32_t>(s.block_table.data(), s.block_table.size());
  v.block_table_stride = width;
  s.seq = seq;
  s.pass = pass.id;
  last_pass_ = pass.id;
  if (replace) {
    // A failed CPU replay may have let some layers read it: every layer reads it again.
    s.readers_left.store(readers_, std::memory_order_release);
    if (read_.load(std::memory_order_acquire) > seq) read_.store(seq, std::memory_order_release);
  } else {
    s.readers_left.store(readers_, std::memory_order_relaxed);
    published_.store(seq + 1, std::memory_order_release);  // the callbacks see the copies above
  }
}

const OffloadStepSnapshot& OffloadStepRing::acquire(int64_t bucket) const {
  const uint64_t r = read_.load(std::memory_order_acquire);
  AAR_CHECK_ARG(r < published_.load(std::memory_order_acquire), "SFA KV-offload host callback of bucket ", bucket,
                ": no update is left for this replay (", r, " updates read; every replay needs its own update, "
                "docs/design/sfa.md §6.7)");
  const OffloadStepSnapshot& s = slots_[r % kSlots];
  AAR_CHECK_ARG(s.seq == r && s.readers_left.load(std::memory_order_acquire) > 0, "SFA KV-offload snapshot ", r,
                " of bucket ", bucket, " is not the one this replay's callbacks read (slot holds ", s.seq, ")");
  return s;
}

void OffloadStepRing::release() {
  const uint64_t r = read_.load(std::memory_order_relaxed);
  // The last offloaded layer of the replay frees the slot and moves the replays on to the next update.
  if (slots_[r % kSlots].readers_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    read_.store(r + 1, std::memory_order_release);
  }
}

std::shared_ptr<OffloadGraphStep> OffloadLayer::capture_state(graph::GraphParams& g, const Metadata& md, int64_t rows,
                                                              int64_t K) {
  AAR_CHECK_ARG(rows <= rows_, "SFA KV-offload graph capture: the bucket's ", rows, " kernel tokens exceed the "
                "layer's ", rows_, " resident rows (offload max_num_tokens=", cfg_.max_num_tokens, ", max_num_reqs=",
                cfg_.max_num_reqs, ", num_speculative_tokens=", cfg_.num_speculative_tokens, ")");
  auto gs = std::make_shared<OffloadGraphStep>();
  gs->rows = rows;
  gs->K = K;
  gs->num_kernel_reqs = md.num_kernel_reqs;
  gs->draft_index = md.draft_index;
  gs->block_table = md.block_table.const_data_ptr();
  gs->slot_mapping = md.slot_mapping.const_data_ptr();
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device_);
  gs->k_stage = at::zeros({rows, L_}, opts);
  gs->v_stage = at::zeros({rows, R_}, opts);
  gs->topk_stage = at::full({rows, K}, -1, opts.dtype(at::kInt));
  if (device_.is_cpu()) {
    gs->k_stage_host = gs->k_stage;
    gs->v_stage_host = gs->v_stage;
    gs->topk_stage_host = gs->topk_stage;
  } else {
    // Page-locked, so that the captured device -> host copies are plain DMA the graph replays.
    const auto host = at::TensorOptions().pinned_memory(true);
    gs->k_stage_host = at::zeros({rows, L_}, host.dtype(at::kBFloat16));
    gs->v_stage_host = at::zeros({rows, R_}, host.dtype(at::kBFloat16));
    gs->topk_stage_host = at::full({rows, K}, -1, host.dtype(at::kInt));
  }
  const OffloadShape shape{rows_, K, cfg_.topk_buffer_size, md.block_size, device_};
  if (ws_ == nullptr || !(ws_->shape() == shape)) ws_ = OffloadWorkspace::shared(shape);
  gs->ws = ws_;
  gs->ws->use();  // the bucket's replays enter it (graph/exclusive_scope.h)
  const int64_t bucket = g.capturing_bucket();
  gs->ring = std::static_pointer_cast<OffloadStepRing>(
      g.host_state("sfa.offload_steps", [bucket] { return std::make_shared<OffloadStepRing>(bucket); }));
  gs->ring->add_reader();
  return gs;
}

void OffloadLayer::stage(OffloadGraphStep& gs, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& topk) const {
  const int64_t rows = gs.rows;
  gs.k_stage.copy_(k.narrow(0, 0, rows));
  gs.v_stage.copy_(v.narrow(0, 0, rows));
  gs.topk_stage.copy_(topk.narrow(0, 0, rows).view({rows, gs.K}));
  if (!device_.is_cpu()) {
    // Captured device -> host copies into the page-locked twins (the stream reaches the callback after them).
    gs.k_stage_host.copy_(gs.k_stage, /*non_blocking=*/true);
    gs.v_stage_host.copy_(gs.v_stage, /*non_blocking=*/true);
    gs.topk_stage_host.copy_(gs.topk_stage, /*non_blocking=*/true);
  }
}

void OffloadLayer::check_step(const OffloadGraphStep& gs, const Metadata& md, int64_t bucket,
                              const graph::UpdatePass& pass) const {
  check(md, gs.K);
  const bool decode_only = (md.attn_state == plan::AttentionState::DecodeOnly ||
                            md.attn_state == plan::AttentionState::SpecDecoding) &&
                           md.num_prefills == 0 && md.num_decodes > 0;
  if (!decode_only) {
    throw_not_supported("a captured SFA KV-offload layer replays decode-only steps; this step has num_prefills=",
                        md.num_prefills, ", num_decodes=", md.num_decodes, ", attn_state=",
                        plan::to_string(md.attn_state), " (run it eagerly: docs/design/sfa.md §6.6)");
  }
  const int64_t tk = md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
  AAR_CHECK_ARG(md.num_input_tokens == bucket && tk == gs.rows && md.num_kernel_reqs == gs.num_kernel_reqs,
                "the step does not fit SFA KV-offload bucket ", bucket, ": num_input_tokens=", md.num_input_tokens,
                ", kernel tokens ", tk, ", kernel requests ", md.num_kernel_reqs, " (captured: ", gs.rows, " tokens in ",
                gs.num_kernel_reqs, " requests); build it with graph_decode_padding and num_input_tokens=", bucket);
  AAR_CHECK_ARG(md.draft_index == gs.draft_index && md.block_table.const_data_ptr() == gs.block_table &&
                    md.slot_mapping.const_data_ptr() == gs.slot_mapping,
                "the step's metadata is not at the captured addresses (another builder or lane than the capture's; "
                "draft_index=", md.draft_index, ", captured ", gs.draft_index, ")");
  gs.ring->check_free(bucket, pass);
}

void OffloadLayer::take_step(OffloadGraphStep& gs, const Metadata& md, const graph::UpdatePass& pass) {
  gs.ring->take(md, pass);  // once per update: the bucket's first offloaded layer copies the lists
  gs.stamp = md.stamp;
  gs.has_step = true;
}

void OffloadLayer::host_step(OffloadGraphStep& gs) {
  // The snapshot of this replay's update (docs/design/sfa.md §6.7), not the builder's lists: the engine
  // may have built and updated the next step since.
  const OffloadStepSnapshot& snap = gs.ring->acquire(gs.rows);
  struct Release {
    OffloadStepRing& r;
    ~Release() { r.release(); }
  } release{*gs.ring};
  OffloadWorkspace& w = *gs.ws;
  stats_ = OffloadStepStats{};
  stats_.route = OffloadStepStats::Route::DecodeOnly;
  commit_rows(gs.k_stage_host, gs.v_stage_host, snap.view.slot_mapping_host, snap.num_actual_tokens);
  const int64_t rows = snap.num_decode_tokens, K = gs.K;
  resident_step(w, gs.topk_stage_host.const_data_ptr<int32_t>(), rows, K, snap.view, cfg_.pool->block_size());
  // The bucket's padding rows select nothing.
  int32_t* slots = w.slots_host.data_ptr<int32_t>();
  std::fill(slots + rows * K, slots + gs.rows * K, -1);
}

at::Tensor OffloadLayer::attend_resident(OffloadGraphStep& gs, double scale) {
  OffloadWorkspace& w = *gs.ws;
  const OffloadWorkspace::RowViews& v = w.rows(gs.rows);
  // On a device: a captured host -> device copy of the callback's slots (page-locked).
  if (!device_.is_cpu()) v.slots.view({-1}).copy_(w.slots_host.narrow(0, 0, gs.rows * gs.K), /*non_blocking=*/true);
  return sparse_attention(args_, {gs.qn, gs.qr, v.slots, pages_k_, pages_v_, v.block_table, v.cum_query_lens,
                                  v.seq_lens, scale});
}

}  // namespace detail
}  // namespace aar::sfa
