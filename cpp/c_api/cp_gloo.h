// A gloo process group over a TCPStore, made inside the library for aar_cp_comm_create_tcp
// (c_api.h): a C engine gets the runtime's collectives without torch headers of its own.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class ProcessGroup;
}

namespace aar::capi {

struct GlooGroupSpec {
  std::string host;         // rank 0's TCPStore address
  uint16_t port = 0;        // its port (0: any free port, world 1 only)
  int32_t rank = 0, world = 1;
  std::chrono::milliseconds timeout{60000};
  std::string group_name;
  std::string interface;    // gloo's device: a network interface name, or
  std::string device_host;  // an address to bind, or neither: gloo's default device
  int listen_fd = -1;       // rank 0: a bound, listening socket for the store (-1: bind port)
};

// Blocks until every rank has joined (at most spec.timeout); throws on failure.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const GlooGroupSpec& spec);

}  // namespace aar::capi
