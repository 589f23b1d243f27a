#include "ascend_attn_rt/verify_npu.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdio>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "ascend_attn_rt/ops/provider.h"
#include "verify_npu_cases.h"

namespace aar::verify {

namespace {

using ops::Provider;
using namespace detail;


// Paged TND inputs: per-request q / kv lengths, a shuffled block table over a
// (nb, bs, Nkv*D) cache (the layout the GQA backend passes).
struct Paged {
  at::Tensor q, kc, vc, table, mask;
  std::vector<int64_t> q_cum, kv_lens;
};

Paged make_paged(std::vector<int64_t> q_lens, std::vector<int64_t> kv_lens, int64_t n, int64_t nkv, int64_t d,
                 int64_t bs, at::ScalarType dt, uint64_t seed) {
  at::manual_seed(seed);
  Paged p;
  int64_t tq = 0, mbr = 0, nb = 0;
  for (size_t r = 0; r < q_lens.size(); ++r) {
    tq += q_lens[r];
    p.q_cum.push_back(tq);
    const int64_t b = (kv_lens[r] + bs - 1) / bs;
    mbr = std::max(mbr, b);
    nb += b;
  }
  p.kv_lens = kv_lens;
  p.q = at::randn({tq, n, d}).to(dt);
  p.kc = at::randn({nb + 1, bs, nkv * d}).to(dt);
  p.vc = at::randn({nb + 1, bs, nkv * d}).to(dt);
  const at::Tensor perm = at::randperm(nb, at::kInt) + 1;  // block 0 unused
  p.table = at::zeros({static_cast<int64_t>(q_lens.size()), mbr}, at::kInt);
  int64_t k = 0;
  for (size_t r = 0; r < q_lens.size(); ++r) {
    const int64_t b = (kv_lens[r] + bs - 1) / bs;
    p.table[r].narrow(0, 0, b).copy_(perm.narrow(0, k, b));
    k += b;
  }
  p.mask = at::triu(at::ones({2048, 2048}, at::kBool), 1);
  return p;
}

Case fia_v1(std::string name, int64_t mode, int64_t pre, int64_t next, bool lse, const char* assumption,
            at::ScalarType dt = at::kHalf, bool out = false) {
  std::ostringstream a;
  a << name << ": TND paged (nb,bs,Nkv*D) bs=16 N=8 Nkv=2 D=64 " << c10::toString(dt) << " sparse_mode=" << mode;
  if (pre != kMax) a << " pre_tokens=" << pre;
  if (next != kMax) a << " next_tokens=" << next;
  if (lse) a << " softmax_lse_flag=True";
  a << out_note(out);
  return Case{"npu_fused_infer_attention_score", a.str(), assumption, dt == at::kFloat ? 1e-4 : 5e-3,
              [=](const Side& s) {
                const Paged p = make_paged({1, 7, 12}, {40, 7, 30}, 8, 2, 64, 16, dt, 11);
                ops::FiaTensors t{s.to(p.q), s.to(p.kc), s.to(p.vc)};
                if (mode != 0) t.atten_mask = s.to(p.mask);
                t.block_table = s.to(p.table);
                ops::FiaParams f;
                f.actual_seq_lengths = p.q_cum;
                f.actual_seq_lengths_kv = p.kv_lens;
                f.num_heads = 8;
                f.num_key_value_heads = 2;
                f.scale = 0.125;
                f.pre_tokens = pre;
                f.next_tokens = next;
                f.sparse_mode = mode;
                f.block_size = 16;
                f.softmax_lse_flag = lse;
                return run_fia(t, f, s, out ? std::vector<int64_t>(p.q.sizes().begin(), p.q.sizes().end())
                                            : std::vector<int64_t>{}, dt);
              }};
}

Case fia_v2_sinks(bool out = false) {
  return Case{"npu_fused_infer_attention_score_v2",
              std::string("TND paged bs=16 N=8 Nkv=2 D=64 bfloat16 sparse_mode=3 learnable_sink (N,) fp32 ") +
                  (out ? "return_softmax_lse=False" : "return_softmax_lse=True") + out_note(out),
              "sinks enter the softmax denominator only (exp(sink) added per head), LSE includes them", 5e-3,
              [out](const Side& s) {
                const Paged p = make_paged({1, 9}, {33, 20}, 8, 2, 64, 16, at::kBFloat16, 12);
                at::manual_seed(5);
                const at::Tensor sink = at::randn({8}) * 2;
                ops::FiaV2Tensors t{s.to(p.q), s.to(p.kc), s.to(p.vc)};
                t.atten_mask = s.to(p.mask);
                t.block_table = s.to(p.table);
                t.learnable_sink = s.to(sink);
                ops::FiaV2Params f;
                f.actual_seq_qlen = p.q_cum;
                f.actual_seq_kvlen = p.kv_lens;
                f.num_query_heads = 8;
                f.num_key_value_heads = 2;
                f.softmax_scale = 0.125;
                f.sparse_mode = 3;
                f.block_size = 16;
                f.return_softmax_lse = !out;
                return run_fia_v2(t, f, s, out ? std::vector<int64_t>{10, 8, 64} : std::vector<int64_t>{}, at::kBFloat16);
              }};
}

Case fia_antiquant(bool out = false) {
  return Case{"npu_fused_infer_attention_score",
              std::string("C8 decode: BNSD query (B,N,1,D) fp16, int8 NZ cache (nb,Nkv,D/32,bs,32), "
                          "key/value_antiquant_scale and _offset (Nkv,1,D), antiquant_mode=0, sparse_mode=0, "
                          "inner_precise=1") + out_note(out),
              "antiquant offset sign: k = (k_int8 + offset) * scale (the C8 backend passes -k_offset)", 5e-3,
              [out](const Side& s) {
                at::manual_seed(13);
                const int64_t B = 3, N = 4, Nkv = 2, D = 64, bs = 16, nb = 8;
                const at::Tensor q = at::randn({B, N, 1, D}).to(at::kHalf);
                const at::Tensor kc = at::randint(-128, 128, {nb, Nkv, D / 32, bs, 32}, at::kChar);
                const at::Tensor vc = at::randint(-128, 128, {nb, Nkv, D / 32, bs, 32}, at::kChar);
                const at::Tensor ks = (at::rand({Nkv, 1, D}) * 0.02 + 0.005).to(at::kHalf);
                const at::Tensor vs = (at::rand({Nkv, 1, D}) * 0.02 + 0.005).to(at::kHalf);
                const at::Tensor ko = at::randint(-8, 8, {Nkv, 1, D}).to(at::kHalf);
                const at::Tensor vo = at::randint(-8, 8, {Nkv, 1, D}).to(at::kHalf);
                const at::Tensor table = at::tensor({1, 2, 3, 4, 5, 0, 6, 7, 0}, at::kInt).view({B, 3});
                const std::vector<int64_t> kv = {40, 3, 29};
                ops::FiaTensors t{s.to(q), s.to(kc), s.to(vc)};
                t.block_table = s.to(table);
                t.key_antiquant_scale = s.to(ks);
                t.value_antiquant_scale = s.to(vs);
                t.key_antiquant_offset = s.to(ko);
                t.value_antiquant_offset = s.to(vo);
                ops::FiaParams f;
                f.has_actual_seq_lengths = false;
                f.actual_seq_lengths_kv = kv;
                f.num_heads = N;
                f.num_key_value_heads = Nkv;
                f.scale = 0.125;
                f.input_layout = "BNSD";
                f.sparse_mode = 0;
                f.inner_precise = 1;
                f.block_size = bs;
                return run_fia(t, f, s, out ? std::vector<int64_t>{B, N, 1, D} : std::vector<int64_t>{}, at::kHalf);
              }};
}

Case attention_update_case(int64_t update_type) {
  return Case{"npu_attention_update",
              "3 partials, M=40, D=64 fp32, update_type=" + std::to_string(update_type) +
                  " (one partial row all -inf: an empty DCP/PCP shard)",
              "partials merge by their LSE; an empty partial (lse -inf) contributes nothing", 1e-4,
              [=](const Side& s) {
                at::manual_seed(14);
                std::vector<at::Tensor> lse, out;
                for (int i = 0; i < 3; ++i) {
                  lse.push_back(s.to(at::randn({40}) * 3));
                  out.push_back(s.to(at::randn({40, 64})));
                }
                lse[1][7] = -std::numeric_limits<float>::infinity();
                auto [o, l] = ops::attention_update(lse, out, update_type, s.pv);
                std::vector<at::Tensor> r{o.cpu()};
                if (update_type == 1) r.push_back(l.cpu());
                return r;
              }};
}

// The two paged cache writes: ATB's _npu_reshape_and_cache (GQA, C8 float
// path on 310P) and npu_scatter_pa_kv_cache "Norm" (FA3), same inputs.
Case cache_write_case(bool atb) {
  const char* args = atb ? "key/value (T=9, Nkv=2, D=64) fp16 into (nb=6, bs=16, Nkv, D), slot_indices int32"
                         : "key/value (T=9, Nkv=2, D=64) fp16, cache_mode=Norm, slot_mapping int32";
  return Case{atb ? "_npu_reshape_and_cache" : "npu_scatter_pa_kv_cache", args,
              "slot s writes block s / bs, row s % bs", 0.0, [atb](const Side& s) {
                at::manual_seed(15);
                const at::Tensor k = at::randn({9, 2, 64}).to(at::kHalf), v = at::randn({9, 2, 64}).to(at::kHalf);
                at::Tensor kc = s.to(at::zeros({6, 16, 2, 64}, at::kHalf)), vc = s.to(at::zeros({6, 16, 2, 64}, at::kHalf));
                const at::Tensor slots = s.to(at::tensor({17, 18, 19, 3, 80, 81, 82, 83, 40}, at::kInt));
                if (atb) {
                  ops::reshape_and_cache(s.to(k), s.to(v), kc, vc, slots, s.pv);
                } else {
                  ops::scatter_pa_kv_cache(s.to(k), s.to(v), kc, vc, slots, "Norm", s.pv);
                }
                return std::vector<at::Tensor>{kc.cpu(), vc.cpu()};
              }};
}

// The table. Rows follow the calls the backends make (gqa, c8, fa3, cp here;
// the MLA family, SFA, DSA and the quantisation operators in their files).
std::vector<Case> cases() {
  static const char* kCausal =
      "sparse_mode 3 with the 2048 triu mask is bottom-right causal: query i of a request with q new tokens and kv "
      "keys sees keys j <= kv - q + i";
  static const char* kWindow =
      "sliding-window pre_tokens convention: with sparse_mode 4, pre_tokens=W-1 keeps the W keys j in [pos-(W-1), "
      "pos] (the query's own position included)";
  std::vector<Case> c;
  c.push_back(fia_v1("causal prefill over cached context", 3, kMax, kMax, false, kCausal));
  c.push_back(fia_v1("causal, LSE", 3, kMax, kMax, true,
                     "softmax_lse is TND (T, N, 1) fp32, natural log"));
  c.push_back(fia_v1("sliding window", 4, 7, 0, false, kWindow));
  c.push_back(fia_v1("non-causal", 0, kMax, kMax, false, "sparse_mode 0 without a mask attends every cached key",
                     at::kFloat));
  c.push_back(fia_v2_sinks());
  c.push_back(fia_antiquant());
  // The same calls through the .out overloads, as the GQA / C8 / FA3 backends make them eagerly.
  c.push_back(fia_v1("causal prefill over cached context", 3, kMax, kMax, false, kCausal, at::kHalf, true));
  c.push_back(fia_v1("sliding window", 4, 7, 0, false, kWindow, at::kHalf, true));
  c.push_back(fia_v2_sinks(true));
  c.push_back(fia_antiquant(true));
  c.push_back(attention_update_case(0));
  c.push_back(attention_update_case(1));
  c.push_back(cache_write_case(true));
  c.push_back(cache_write_case(false));
  add_mla_cases(c);
  add_sparse_cases(c);
  add_dsa_cases(c);
  add_quant_cases(c);
  return c;
}

}  // namespace

namespace detail {

at::Tensor i32(const std::vector<int64_t>& v) {
  std::vector<int32_t> w(v.begin(), v.end());
  return at::tensor(w, at::kInt);
}

at::Tensor rnd(at::IntArrayRef shape, at::ScalarType dt, double scale) { return (at::randn(shape) * scale).to(dt); }

std::vector<int64_t> cumsum(const std::vector<int64_t>& lens) {
  std::vector<int64_t> out;
  int64_t s = 0;
  for (int64_t l : lens) out.push_back(s += l);
  return out;
}

Paged paged(const std::vector<int64_t>& lens, int64_t bs, std::vector<int64_t> rest, at::ScalarType dt,
            uint64_t seed) {
  at::manual_seed(seed);
  Paged p;
  int64_t mb = 1;
  for (int64_t l : lens) {
    const int64_t b = (l + bs - 1) / bs;
    mb = std::max(mb, b);
    p.nb += b;
  }
  ++p.nb;  // block 0: never referenced
  const at::Tensor perm = at::randperm(p.nb - 1, at::kInt) + 1;
  p.table = at::zeros({static_cast<int64_t>(lens.size()), mb}, at::kInt);
  int64_t k = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t b = (lens[r] + bs - 1) / bs;
    if (b > 0) p.table[r].narrow(0, 0, b).copy_(perm.narrow(0, k, b));
    k += b;
  }
  std::vector<int64_t> shape{p.nb, bs};
  shape.insert(shape.end(), rest.begin(), rest.end());
  p.cache = rnd(shape, dt);
  return p;
}

at::Tensor like_pages(const Paged& p, std::vector<int64_t> rest, at::ScalarType dt, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<int64_t> shape{p.nb, p.cache.size(1)};
  shape.insert(shape.end(), rest.begin(), rest.end());
  return rnd(shape, dt);
}

Outputs on_cpu(std::initializer_list<at::Tensor> ts) {
  Outputs out;
  for (const at::Tensor& t : ts) out.push_back(t.defined() ? t.cpu() : at::empty({0}));
  return out;
}

at::Tensor sorted_rows(const at::Tensor& idx) { return std::get<0>(idx.cpu().sort(-1)); }

namespace {

// The plain call, or the .out call into a (shape, dtype) buffer with the LSE
// into the backends' (1,) fp32 placeholder.
template <class T, class P, class Plain, class Out>
Outputs run_fia_any(const T& t, const P& p, const Side& s, bool lse, const std::vector<int64_t>& shape,
                    at::ScalarType dt, Plain plain, Out out) {
  if (shape.empty()) {
    auto [o, l] = plain(t, p, s.pv);
    return lse ? on_cpu({o, l}) : on_cpu({o});
  }
  at::Tensor o = s.to(at::zeros(shape, dt)), placeholder = s.to(at::zeros({1}));
  out(t, p, std::nullopt, o, placeholder, s.pv);
  return on_cpu({o});
}

}  // namespace

Outputs run_fia(const ops::FiaTensors& t, const ops::FiaParams& p, const Side& s,
                const std::vector<int64_t>& out_shape, at::ScalarType out_dtype) {
  return run_fia_any(t, p, s, p.softmax_lse_flag, out_shape, out_dtype, ops::fused_infer_attention_score,
                     ops::fused_infer_attention_score_out);
}

Outputs run_fia_v2(const ops::FiaV2Tensors& t, const ops::FiaV2Params& p, const Side& s,
                   const std::vector<int64_t>& out_shape, at::ScalarType out_dtype) {
  return run_fia_any(t, p, s, p.return_softmax_lse, out_shape, out_dtype, ops::fused_infer_attention_score_v2,
                     ops::fused_infer_attention_score_v2_out);
}

const char* out_note(bool out) { return out ? ", through .out (the backends' eager call; LSE into a (1,) placeholder)" : ""; }

}  // namespace detail

namespace {

double max_abs(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  const at::Tensor d = t.to(at::kDouble);
  const at::Tensor finite = at::where(at::isfinite(d), d.abs(), at::zeros_like(d));
  return finite.max().item<double>();
}

// Max |a - b| over matching entries; equal infinities count as 0, a NaN or an
// infinity on one side only as +inf.
double max_err(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0;
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  const at::Tensor same = (x == y) | (at::isnan(x) & at::isnan(y));
  const at::Tensor diff = at::where(same, at::zeros_like(x), (x - y).abs());
  const at::Tensor bad = at::isnan(diff) | at::isinf(diff);
  if (bad.any().item<bool>()) return std::numeric_limits<double>::infinity();
  return diff.max().item<double>();
}

std::string pad(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

}  // namespace

bool npu_available() {
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) return false;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->deviceCount() > 0;
}

std::string format_table(const std::vector<Row>& rows) {
  std::ostringstream os;
  size_t w = 8;
  for (const Row& r : rows) w = std::max(w, r.op.size());
  int failed = 0;
  for (const Row& r : rows) {
    char err[64], tol[64];
    std::snprintf(err, sizeof err, "%.3e", r.max_err);
    std::snprintf(tol, sizeof tol, "%.1e", r.tol);
    os << (r.pass ? "PASS  " : "FAIL  ") << pad(r.op, w) << "  max_err " << pad(r.error.empty() ? err : "error", 10)
       << "  tol " << pad(tol, 8) << "  " << r.args << "\n";
    os << "      settles: " << r.assumption << "\n";
    if (!r.error.empty()) os << "      error: " << r.error << "\n";
    if (!r.pass) ++failed;
  }
  os << rows.size() - failed << "/" << rows.size() << " rows passed";
  if (failed) {
    os << "; FAILED:";
    for (const Row& r : rows) {
      if (!r.pass) os << " " << r.op << " [" << r.args << "]";
    }
  }
  os << "\n";
  return os.str();
}

int run_verify_cli(const std::vector<std::string>& args, std::string& out) {
  std::string stand_in, only;
  bool list = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "--stand-in" || a == "--only") && i + 1 < args.size()) {
      (a == "--stand-in" ? stand_in : only) = args[++i];
    } else if (a == "--list") {
      list = true;
    } else {
      out = "verify-npu: unknown argument '" + a +
            "' (expected --stand-in twin|perturbed:OPNAME, --only SUBSTRING, --list)\n";
      return 2;
    }
  }
  std::string perturbed;
  if (!stand_in.empty() && stand_in != "twin") {
    if (stand_in.rfind("perturbed:", 0) != 0 || stand_in.size() == 10) {
      out = "verify-npu: --stand-in must be 'twin' or 'perturbed:OPNAME', got '" + stand_in + "'\n";
      return 2;
    }
    perturbed = stand_in.substr(10);
  }
  std::vector<Case> table = cases();
  if (!perturbed.empty()) {
    bool known = false;
    for (const Case& c : table) known = known || perturbed == c.op;
    if (!known) {
      out = "verify-npu: --stand-in perturbed:" + perturbed + ": no row calls operator '" + perturbed + "'\n";
      return 2;
    }
  }
  std::ostringstream os;
  if (list) {
    for (const Case& c : table) os << c.op << "  " << c.args << "\n      settles: " << c.assumption << "\n";
    out = os.str();
    return 0;
  }
  if (stand_in.empty() && !npu_available()) {
    out = "verify-npu: no NPU here (no PrivateUse1 device; in Python, torch_npu must import and see a device). "
          "Run it on an Ascend machine, or pass --stand-in twin to check the harness with the CPU twin standing "
          "in for the NPU.\n";
    return 2;
  }
  const Side twin{c10::Device(c10::kCPU), Provider::Cpu};
  const Side npu = stand_in.empty() ? Side{c10::Device(c10::DeviceType::PrivateUse1, 0), Provider::Npu} : twin;
  os << "verify-npu: " << (stand_in.empty() ? "torch_npu (provider npu) vs CPU twin" : "stand-in '" + stand_in +
                                                                                            "' vs CPU twin")
     << "\n";
  std::vector<Row> rows;
  for (const Case& c : table) {
    if (!only.empty() && std::string(c.op).find(only) == std::string::npos && c.args.find(only) == std::string::npos)
      continue;
    Row r{c.op, c.args, c.assumption, 0, c.tol, false, ""};
    try {
      std::vector<at::Tensor> want, got;
      {
        c10::InferenceMode guard;
        want = c.run(twin);
        got = c.run(npu);
      }
      if (perturbed == c.op) {
        // The deliberately wrong stand-in: its first output is off by half its
        // scale, 0.5 * (1 + max |out|), at its first finite element (as float64:
        // any dtype, fp8 and int outputs too): beyond every row's tolerance.
        const double off = 0.5 * (1 + max_abs(got[0]));
        got[0] = got[0].to(at::kDouble).contiguous();
        const at::Tensor finite = at::isfinite(got[0].view(-1)).nonzero();
        if (finite.numel() > 0) got[0].view(-1)[finite[0][0].item<int64_t>()] += off;
      }
      // A row whose reference outputs are all zero (or empty) would pass
      // whatever the device computed: refused as a broken row.
      bool informative = false;
      for (const at::Tensor& w : want) informative = informative || max_abs(w) > 0;
      if (!informative) throw std::runtime_error("degenerate row: the CPU twin's outputs are all zero or empty");
      // Each output against its own scale: max |npu - twin| <= tol * (1 + max |twin|).
      double worst = 0;
      bool pass = want.size() == got.size();
      for (size_t i = 0; pass && i < want.size(); ++i) {
        const double e = max_err(got[i], want[i]);
        worst = std::max(worst, e);
        pass = e <= c.tol * (1 + max_abs(want[i]));
      }
      r.max_err = worst;
      r.pass = pass;
    } catch (const std::exception& e) {
      r.error = e.what();
      const size_t nl = r.error.find('\n');
      if (nl != std::string::npos) r.error.resize(nl);
    }
    rows.push_back(std::move(r));
  }
  os << format_table(rows);
  out = os.str();
  for (const Row& r : rows) {
    if (!r.pass) return 1;
  }
  return 0;
}

}  // namespace aar::verify
