// make_gloo_group (cp_gloo.h): TCPStore -> ProcessGroupGloo -> ProcessGroup, the steps
// torch.distributed's init_process_group("gloo") takes, in C++. Compiled with
// gloo_decls/ on its include path (gloo/decls.h says why that is sound); the one file that is.
#include "cp_gloo.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <net/if.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ascend_attn_rt/errors.h"

namespace aar::capi {

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const GlooGroupSpec& s) {
  // The device first: a bad interface or host name is the caller's argument, named before any rendezvous.
  auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
  const auto device_error = [](const char* field, const std::string& value, const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    throw InvalidArgument(std::string("config->") + field + "='" + value + "' gives no gloo device: " +
                          (ce != nullptr ? ce->what_without_backtrace() : e.what()));
  };
  if (!s.interface.empty()) {
    // Checked here first: gloo's own failure path for an unknown interface leaks its getifaddrs list.
    AAR_CHECK_ARG(if_nametoindex(s.interface.c_str()) != 0, "config->device_interface='", s.interface,
                  "' gives no gloo device: no such network interface");
    try {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(s.interface));
    } catch (const std::exception& e) {
      device_error("device_interface", s.interface, e);
    }
  } else if (!s.device_host.empty()) {
    try {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(s.device_host));
    } catch (const std::exception& e) {
      device_error("device_host", s.device_host, e);
    }
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  if (s.listen_fd >= 0) {
    // The store's server accepts on it: it must be a socket in the listening state.
    int listening = 0;
    socklen_t len = sizeof(listening);
    const int rc = getsockopt(s.listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len);
    AAR_CHECK_ARG(rc == 0 && listening != 0, "config->listen_fd=", s.listen_fd, " is not a listening socket (",
                  rc != 0 ? std::strerror(errno) : "a socket, not listening", ")");
  }
  c10d::TCPStoreOptions so;
  so.port = s.port;
  so.isServer = s.rank == 0;
  so.numWorkers = static_cast<size_t>(s.world);
  so.waitWorkers = true;  // rank 0 returns once every rank has connected (or the timeout passed)
  so.timeout = s.timeout;
  if (s.listen_fd >= 0) so.masterListenFd = s.listen_fd;
  auto store = c10::make_intrusive<c10d::TCPStore>(s.host, so);

  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, s.rank, s.world, opts);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, s.rank, s.world);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  pg->setGroupName(s.group_name);
  if (pg->getRank() != s.rank || pg->getSize() != s.world) {
    throw std::runtime_error("the gloo group reports rank " + std::to_string(pg->getRank()) + " of " +
                             std::to_string(pg->getSize()) + ", asked for rank " + std::to_string(s.rank) + " of " +
                             std::to_string(s.world));
  }
  return pg;
}

}  // namespace aar::capi
