// Helpers shared by the C++ host-time benchmarks: timing, synthetic batches,
// the command line and the JSON report every benchmark writes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ascend_attn_rt/plan/span.h"

namespace aar_bench {

// Median over `repeats` of the mean time per call, in microseconds, after a warm-up.
inline double time_us(const std::function<void()>& fn, int iters, int repeats = 7) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < std::max(5, iters / 10); ++i) fn();
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// A step's host inputs: `decodes` one-token requests of decode_seq tokens, then
// `prefills` requests of prefill_new new tokens on prefill_ctx cached ones; a
// block table of `stride` columns with ids i % num_blocks.
struct Batch {
  std::vector<int32_t> qsl, seq, table;
  int stride = 0;
};

inline Batch make_batch(int decodes, int decode_seq, int prefills, int prefill_new, int prefill_ctx, int stride,
                        int num_blocks) {
  Batch b;
  b.stride = stride;
  b.qsl.push_back(0);
  for (int i = 0; i < decodes; ++i) {
    b.qsl.push_back(b.qsl.back() + 1);
    b.seq.push_back(decode_seq);
  }
  for (int i = 0; i < prefills; ++i) {
    b.qsl.push_back(b.qsl.back() + prefill_new);
    b.seq.push_back(prefill_ctx + prefill_new);
  }
  b.table.resize(static_cast<size_t>(decodes + prefills) * stride);
  for (size_t i = 0; i < b.table.size(); ++i) b.table[i] = static_cast<int32_t>(i % static_cast<size_t>(num_blocks));
  return b;
}

// The batch as a builder's BuildInputs (gqa:: or mla::, same field names).
template <class Inputs>
Inputs inputs_of(const Batch& b) {
  Inputs in;
  in.query_start_loc = aar::plan::CSpan<int32_t>(b.qsl.data(), b.qsl.size());
  in.seq_lens = aar::plan::CSpan<int32_t>(b.seq.data(), b.seq.size());
  in.block_table = aar::plan::CSpan<int32_t>(b.table.data(), b.table.size());
  in.block_table_stride = b.stride;
  return in;
}

// ---- command line -----------------------------------------------------------

// The options every benchmark takes: --out PATH (the JSON report; "-" prints
// only), --quick (fewer iterations), and, where a benchmark has cases to pick,
// --only SUBSTRING. Anything else is refused (exit 2) rather than ignored.
struct Args {
  std::string out;
  bool quick = false;
  std::string only;
};

inline Args parse_args(int argc, char** argv, std::string default_out, bool takes_only = false) {
  Args a;
  a.out = std::move(default_out);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      a.out = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      a.quick = true;
    } else if (takes_only && !std::strcmp(argv[i], "--only") && i + 1 < argc) {
      a.only = argv[++i];
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s' (takes --out PATH, --quick%s)\n", argv[0], argv[i],
                   takes_only ? ", --only SUBSTRING" : "");
      std::exit(2);
    }
  }
  return a;
}

// ---- JSON report --------------------------------------------------------------

// One field value: a string (escaped), an integer or a number (printed as an
// ostream prints a double: 6 significant digits).
class JsonValue {
 public:
  JsonValue(const char* s) : kind_(kString), s_(s) {}
  JsonValue(std::string s) : kind_(kString), s_(std::move(s)) {}
  JsonValue(int v) : kind_(kInt), i_(v) {}
  JsonValue(unsigned v) : kind_(kInt), i_(v) {}
  JsonValue(long v) : kind_(kInt), i_(v) {}
  JsonValue(long long v) : kind_(kInt), i_(v) {}
  JsonValue(double v) : kind_(kNumber), d_(v) {}

  void write(std::ostream& o) const {
    if (kind_ == kInt) {
      o << i_;
    } else if (kind_ == kNumber) {
      o << d_;
    } else {
      o << '"';
      for (char c : s_) {
        if (c == '"' || c == '\\') o << '\\';
        o << c;
      }
      o << '"';
    }
  }

 private:
  enum Kind { kString, kInt, kNumber } kind_;
  std::string s_;
  long long i_ = 0;
  double d_ = 0;
};

// Fields in the order they are written.
using JsonFields = std::vector<std::pair<std::string, JsonValue>>;

// {"tool": ..., <header fields>, "<array>": [{record}, ...], ...}: the shape
// of every benchmark's JSON (the README tables quote its fields).
class JsonReport {
 public:
  // `tool` first, then "provider": "no_compute" when no_compute (the
  // benchmarks that stub the kernels say so).
  explicit JsonReport(std::string tool, bool no_compute = true) {
    header_.emplace_back("tool", std::move(tool));
    if (no_compute) header_.emplace_back("provider", "no_compute");
  }
  void field(std::string key, JsonValue v) { header_.emplace_back(std::move(key), std::move(v)); }
  void hardware_threads() { field("hardware_threads", std::thread::hardware_concurrency()); }
  // Appends a record to the array `name` (arrays are written in the order of
  // their first record).
  void add(const std::string& name, JsonFields record) {
    for (auto& a : arrays_) {
      if (a.first == name) {
        a.second.push_back(std::move(record));
        return;
      }
    }
    arrays_.emplace_back(name, std::vector<JsonFields>{std::move(record)});
  }
  // An array that exists even when it gets no record.
  void array(const std::string& name) {
    for (const auto& a : arrays_) {
      if (a.first == name) return;
    }
    arrays_.emplace_back(name, std::vector<JsonFields>{});
  }

  void write(std::ostream& o) const {
    o << "{\n";
    for (std::size_t h = 0; h < header_.size(); ++h) {
      o << "  \"" << header_[h].first << "\": ";
      header_[h].second.write(o);
      o << (h + 1 < header_.size() || !arrays_.empty() ? ",\n" : "\n");
    }
    for (std::size_t a = 0; a < arrays_.size(); ++a) {
      o << "  \"" << arrays_[a].first << "\": [\n";
      const auto& recs = arrays_[a].second;
      for (std::size_t i = 0; i < recs.size(); ++i) {
        o << "    {";
        for (std::size_t k = 0; k < recs[i].size(); ++k) {
          o << (k ? ", \"" : "\"") << recs[i][k].first << "\": ";
          recs[i][k].second.write(o);
        }
        o << "}" << (i + 1 < recs.size() ? "," : "") << "\n";
      }
      o << "  ]" << (a + 1 < arrays_.size() ? "," : "") << "\n";
    }
    o << "}\n";
  }

  // Writes the report to `path` and says so; "" or "-" prints nothing and
  // writes nothing. Returns false (after printing why) when the file cannot
  // be written.
  bool write(const std::string& path) const {
    if (path.empty() || path == "-") return true;
    std::ofstream f(path);
    if (f) write(f);
    if (!f) {
      std::printf("could not write %s\n", path.c_str());
      return false;
    }
    std::printf("wrote %s\n", path.c_str());
    return true;
  }

 private:
  JsonFields header_;
  std::vector<std::pair<std::string, std::vector<JsonFields>>> arrays_;
};

}  // namespace aar_bench
