// The backend contract (include/ascend_attn_rt/core/backend.h), walked over every
// registered backend: each has an adapter (tests/cpp/test_rt_contract_<id>.cpp)
// that runs the generic checks of contract_util.h on a small step.
#include <set>

#include "contract_util.h"

namespace aar_contract {

std::vector<Adapter>& adapters() {
  static std::vector<Adapter> a;
  return a;
}

namespace {

TEST(Contract, EveryRegisteredBackendHasAnAdapterAndDeclaresItsFacts) {
  const auto& backends = aar::core::registered_backends();
  ASSERT_FALSE(backends.empty());
  std::set<std::string> ids;
  for (const Adapter& a : adapters()) ids.insert(a.id);
  for (const BackendFacts& f : backends) {
    EXPECT_TRUE(ids.count(f.id)) << "backend \"" << f.id << "\" is registered but has no contract adapter";
    EXPECT_FALSE(f.name.empty()) << f.id;
    EXPECT_FALSE(f.dtypes.empty()) << f.id;
    EXPECT_FALSE(f.kv_caches.empty()) << f.id;
    EXPECT_EQ(&aar::core::backend_facts(f.id), &f);
    if (!f.builder.empty()) EXPECT_NO_THROW(aar::core::backend_facts(f.builder)) << f.id << " names builder " << f.builder;
  }
  EXPECT_THROW(aar::core::backend_facts("no_such_backend"), aar::InvalidArgument);
}

class ContractTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ContractTest, BuildForwardCaptureAndDrafting) {
  const BackendFacts& f = aar::core::backend_facts(GetParam());
  for (const Adapter& a : adapters()) {
    if (a.id == f.id) {
      a.run(f);
      return;
    }
  }
  FAIL() << "no adapter for " << f.id;
}

std::vector<std::string> registered_ids() {
  std::vector<std::string> ids;
  for (const BackendFacts& f : aar::core::registered_backends()) ids.push_back(f.id);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(Backends, ContractTest, ::testing::ValuesIn(registered_ids()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace aar_contract
