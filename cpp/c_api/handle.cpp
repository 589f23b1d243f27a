// Type tags of the C ABI's handles and the quarantine of destroyed shells (handle.h).
#include "handle.h"

#include <iomanip>
#include <mutex>
#include <sstream>
#include <string>

#include "ascend_attn_rt/errors.h"

namespace aar::capi {
namespace {

// Enough to catch the use of a handle destroyed a few calls ago (the common
// mistake) at 16 to 48 bytes a shell; older shells are freed as new ones come.
constexpr size_t kQuarantined = 64;
std::mutex g_quarantine_mu;
void* g_quarantine[kQuarantined];  // static storage: LeakSanitizer sees the shells as reachable
size_t g_quarantine_next = 0;

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return os.str();
}

}  // namespace

const char* kind_name(uint32_t kind) noexcept {
  switch (static_cast<Kind>(kind)) {
    case Kind::GqaBuilder: return "aar_gqa_builder_t";
    case Kind::GqaImpl: return "aar_gqa_impl_t";
    case Kind::GqaMetadata: return "aar_gqa_metadata_t";
    case Kind::MlaBuilder: return "aar_mla_builder_t";
    case Kind::MlaImpl: return "aar_mla_impl_t";
    case Kind::MlaMetadata: return "aar_mla_metadata_t";
    case Kind::GraphParams: return "aar_graph_params_t";
    case Kind::SfaBuilder: return "aar_sfa_builder_t";
    case Kind::SfaImpl: return "aar_sfa_impl_t";
    case Kind::SfaMetadata: return "aar_sfa_metadata_t";
    case Kind::SfaTopkBuffer: return "aar_sfa_topk_buffer_t";
    case Kind::DsaStepBuilder: return "aar_dsa_step_builder_t";
    case Kind::DsaGroupBuilder: return "aar_dsa_group_builder_t";
    case Kind::DsaImpl: return "aar_dsa_impl_t";
    case Kind::DsaStepMetadata: return "aar_dsa_step_metadata_t";
    case Kind::DsaGroupMetadata: return "aar_dsa_group_metadata_t";
    case Kind::C8Impl: return "aar_c8_impl_t";
    case Kind::Fa3Impl: return "aar_fa3_impl_t";
    case Kind::MlaLatent: return "aar_mla_latent_t";
    case Kind::CpComm: return "aar_cp_comm_t";
    case Kind::GqaDcpBuilder: return "aar_gqa_dcp_builder_t";
    case Kind::GqaDcpImpl: return "aar_gqa_dcp_impl_t";
    case Kind::GqaDcpMetadata: return "aar_gqa_dcp_metadata_t";
    case Kind::GqaPcpBuilder: return "aar_gqa_pcp_builder_t";
    case Kind::GqaPcpImpl: return "aar_gqa_pcp_impl_t";
    case Kind::GqaPcpMetadata: return "aar_gqa_pcp_metadata_t";
  }
  return nullptr;
}

void check_tag(const void* p, Kind expected, const char* name) {
  const char* want = kind_name(static_cast<uint32_t>(expected));
  AAR_CHECK_ARG(p != nullptr, name, " is NULL, expected an ", want);
  if (has_tag(p, expected)) return;
  Tag t;
  std::memcpy(&t, p, sizeof t);
  const char* found = kind_name(t.kind);
  if (found != nullptr && t.magic == kLiveMagic) throw_invalid(name, " is an ", found, ", expected an ", want);
  if (found != nullptr && t.magic == kDeadMagic) {
    if (t.kind == static_cast<uint32_t>(expected)) {
      throw_invalid(name, " is an ", want, " that has been destroyed");
    }
    throw_invalid(name, " is a destroyed ", found, ", expected an ", want);
  }
  throw_invalid(name, " is not a handle of this API (no aar_* type tag at ", p, ": found ", hex(t.magic), " ",
                hex(t.kind), "), expected an ", want);
}

void quarantine(void* shell) noexcept {
  void* evicted;
  {
    std::lock_guard<std::mutex> lock(g_quarantine_mu);
    evicted = g_quarantine[g_quarantine_next];
    g_quarantine[g_quarantine_next] = shell;
    g_quarantine_next = (g_quarantine_next + 1) % kQuarantined;
  }
  ::operator delete(evicted);  // nullptr while the ring fills: a no-op
}

}  // namespace aar::capi
