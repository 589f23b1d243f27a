#pragma once
// Private to cpp/: the named, aligned allocator over a builder's staging buffer
// (docs/design/core.md §4). A builder lays its buffer out once, at construction,
// by adding named regions; a step writes them on the host and makes one copy
// of the prefix it used; the metadata views them through view caches, so a
// steady-state build creates no tensor and every view keeps its address (graph
// capture records them).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace aar::core {

// Region starts are multiples of 16 int32 words (64 bytes) by default: rows start
// on cache lines and every region can be viewed as a wider dtype.
constexpr int64_t kStagingAlignWords = 16;
inline int64_t align_words(int64_t n, int64_t a = kStagingAlignWords) { return (n + a - 1) / a * a; }

// [offset, offset + words) of the buffer, in int32 words.
struct Region {
  int64_t offset = 0;
  int64_t words = 0;
  int64_t end() const { return offset + words; }
};

class StagingLayout {
 public:
  // Appends a region of `words` int32 words aligned to `align` words.
  Region add(std::string name, int64_t words, int64_t align = kStagingAlignWords);
  int64_t words() const { return end_; }
  // The regions in order, "name [offset, end)" each: for errors and tests.
  std::string describe() const;
  const std::vector<std::pair<std::string, Region>>& regions() const { return regions_; }

  // Per-step packing: regions of the given sizes (words), each aligned, placed
  // one after another so that the last ends at or below `end` as closely as the
  // alignment allows; writes their offsets. Returns the first offset. Builders
  // whose token-sized regions precede the fixed ones use it so one copy from the
  // first used word to the end covers a step, whatever its size.
  // Inline: called once per build and packed region, where the alignment is
  // the constant default and folds to shifts.
  static int64_t pack_before(int64_t end, std::initializer_list<std::pair<int64_t*, int64_t>> regions,
                             int64_t align = kStagingAlignWords) {
    int64_t total = 0;
    for (const auto& [offset, words] : regions) total += align_words(words, align);
    int64_t at = end - total;
    at -= ((at % align) + align) % align;  // round down to the alignment
    const int64_t first = at;
    for (const auto& [offset, words] : regions) {
      *offset = at;
      at += align_words(words, align);
    }
    return first;
  }

 private:
  std::vector<std::pair<std::string, Region>> regions_;
  int64_t end_ = 0;
};

// Views made once per element count and kept (address-stable metadata tensors).
class ViewCache {
 public:
  ViewCache() = default;
  explicit ViewCache(int64_t max_count) { resize(max_count); }
  void resize(int64_t max_count) {
    cache_.assign(static_cast<size_t>(max_count) + 1, at::Tensor());
    keys_.assign(static_cast<size_t>(max_count) + 1, 0);
  }
  // The view for `n` (0 <= n <= max_count), made by make() the first time.
  template <class Make>
  const at::Tensor& get(int64_t n, Make&& make) {
    at::Tensor& v = cache_[static_cast<size_t>(n)];
    if (!v.defined()) v = make();
    return v;
  }
  // The same for a view that also depends on `key`, remade when the key seen
  // for n changes: a pack_before region's offset (it moves with the sizes of
  // the step's other packed regions), a table's width.
  template <class Make>
  const at::Tensor& get(int64_t n, int64_t key, Make&& make) {
    const auto i = static_cast<size_t>(n);
    at::Tensor& v = cache_[i];
    if (!v.defined() || keys_[i] != key) {
      keys_[i] = key;
      v = make();
    }
    return v;
  }

 private:
  std::vector<at::Tensor> cache_;
  std::vector<int64_t> keys_;
};

// The first n elements (or n rows of `cols`) of a region of `buffer`, viewed as
// `dtype` (a region of int64 holds 2 words per element), cached per n.
class RegionViews {
 public:
  RegionViews() = default;
  RegionViews(at::Tensor buffer, Region r, int64_t max_count, at::ScalarType dtype, int64_t cols = 0);
  // Inline: a steady-state build's lookup is a cached view, no call.
  const at::Tensor& first(int64_t n) { return cache_.get(n, [&] { return make(n); }); }

 private:
  at::Tensor make(int64_t n) const;

  at::Tensor buffer_;
  Region region_;
  at::ScalarType dtype_ = at::kInt;
  int64_t cols_ = 0;
  ViewCache cache_;
};

}  // namespace aar::core
