// The communicator handle of the C ABI (aar_cp_comm_t): shared by cp_comm.cpp, which makes
// it, and the context-parallel families, whose layers keep the cp::Comm alive.
#pragma once

#include <memory>

#include "ascend_attn_rt/comm/comm.h"
#include "handle.h"

struct aar_cp_comm {
  static constexpr aar::capi::Kind kKind = aar::capi::Kind::CpComm;
  aar::capi::Tag tag;
  // Owned: one reference; each layer made with the handle holds another, so destroying the
  // handle before its layers leaves them a live Comm (and process group).
  std::shared_ptr<aar::cp::Comm>* comm;
};

namespace aar::capi {
// The Comm of a communicator handle `name` (checked live): a reference for the layer to keep.
inline std::shared_ptr<cp::Comm> comm_of(aar_cp_comm* c, const char* name) { return *checked(c, name)->comm; }
}  // namespace aar::capi
