// One object per distinct shape, shared by every holder of that shape: the
// layers of a model with equal dimensions share one workspace. Held weakly:
// the object goes when its last holder does. Thread safety: any number of
// threads at once (one mutex per T); the objects themselves are not guarded:
// their holders use them one at a time.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace aar::detail {

// T has `explicit T(const Shape&)` and `const Shape& shape() const`; Shape has
// operator==. One registry per T.
template <class T, class Shape>
std::shared_ptr<T> shared_by_shape(const Shape& shape) {
  static std::mutex mu;
  static std::vector<std::weak_ptr<T>> registry;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<T> found;
  for (auto it = registry.begin(); it != registry.end();) {
    std::shared_ptr<T> w = it->lock();
    if (!w) {
      it = registry.erase(it);
      continue;
    }
    if (!found && w->shape() == shape) found = std::move(w);
    ++it;
  }
  if (found) return found;
  auto w = std::make_shared<T>(shape);
  registry.push_back(w);
  return w;
}

}  // namespace aar::detail
