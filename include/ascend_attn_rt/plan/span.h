// A minimal C++17 stand-in for std::span: pointer + length, no ownership.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace aar::plan {

template <typename T>
struct Span {
  T* ptr = nullptr;
  std::size_t len = 0;

  constexpr Span() = default;
  constexpr Span(T* p, std::size_t n) : ptr(p), len(n) {}
  template <typename U>
  Span(std::vector<U>& v) : ptr(v.data()), len(v.size()) {}  // NOLINT
  template <typename U>
  Span(const std::vector<U>& v) : ptr(v.data()), len(v.size()) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U (*)[], T (*)[]>>>
  constexpr Span(Span<U> o) : ptr(o.ptr), len(o.len) {}  // NOLINT

  constexpr T* data() const { return ptr; }
  constexpr std::size_t size() const { return len; }
  constexpr bool empty() const { return len == 0; }
  constexpr T& operator[](std::size_t i) const { return ptr[i]; }
  constexpr T* begin() const { return ptr; }
  constexpr T* end() const { return ptr + len; }
  constexpr T& back() const { return ptr[len - 1]; }
  constexpr Span subspan(std::size_t off, std::size_t n) const { return Span(ptr + off, n); }
  constexpr Span first(std::size_t n) const { return Span(ptr, n); }
};

template <typename T>
using CSpan = Span<const T>;

}  // namespace aar::plan
