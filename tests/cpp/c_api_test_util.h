// Shared by the C ABI's test files (tests/cpp/test_c_api*.cpp): DLPack tensors
// lent by torch and the check that a call is rejected with a message naming
// what it should.
#pragma once

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <gtest/gtest.h>

#include <string>

#include "ascend_attn_rt/c_api.h"

namespace aar_c_api_test {

// A DLManagedTensor lent by torch (the test owns it and calls its deleter).
struct Dl {
  explicit Dl(const at::Tensor& t) : m(at::toDLPack(t)) {}
  ~Dl() { m->deleter(m); }
  Dl(const Dl&) = delete;
  Dl& operator=(const Dl&) = delete;
  DLManagedTensor* get() const { return m; }
  DLManagedTensor* m;
};

inline std::string last() { return aar_last_error(); }

}  // namespace aar_c_api_test

#define EXPECT_REJECTED(call, status, needle)                                                          \
  do {                                                                                                 \
    EXPECT_EQ((call), status) << ::aar_c_api_test::last();                                             \
    EXPECT_NE(::aar_c_api_test::last().find(needle), std::string::npos) << "message: " << ::aar_c_api_test::last(); \
  } while (0)
