// Error types shared by every layer. The plan layer is torch-free, so these
// derive from the standard exceptions only; the bindings map InvalidArgument
// to Python's ValueError, NotSupported to NotImplementedError and everything
// else to RuntimeError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace aar {

// Bad input at a public boundary: names the argument and the offending value.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A feature that the runtime deliberately does not implement (ALiBi, soft-cap,
// an operator argument a CPU twin does not handle, ...). Never silently ignored.
class NotSupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void append_all(std::ostringstream& os, const T& v, const Rest&... rest) {
  os << v;
  append_all(os, rest...);
}
}  // namespace detail

template <typename... Args>
[[noreturn]] void throw_invalid(const Args&... args) {
  std::ostringstream os;
  detail::append_all(os, args...);
  throw InvalidArgument(os.str());
}

template <typename... Args>
[[noreturn]] void throw_not_supported(const Args&... args) {
  std::ostringstream os;
  detail::append_all(os, args...);
  throw NotSupported(os.str());
}

}  // namespace aar

// Cheap check for hot paths: the message is only formatted on failure.
#define AAR_CHECK_ARG(cond, ...)          \
  do {                                    \
    if (__builtin_expect(!(cond), 0)) {   \
      ::aar::throw_invalid(__VA_ARGS__);  \
    }                                     \
  } while (0)
