// make_gloo_group (cp_gloo.h): TCPStore -> ProcessGroupGloo -> ProcessGroup, the steps
// torch.distributed's init_process_group("gloo") takes, in C++. Compiled with
// gloo_decls/ on its include path (gloo/decls.h says why that is sound); the one file that is.
#include "cp_gloo.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <stdexcept>
#include <string>

namespace aar::capi {

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const GlooGroupSpec& s) {
  c10d::TCPStoreOptions so;
  so.port = s.port;
  so.isServer = s.rank == 0;
  so.numWorkers = static_cast<size_t>(s.world);
  so.waitWorkers = true;  // rank 0 returns once every rank has connected (or the timeout passed)
  so.timeout = s.timeout;
  if (s.listen_fd >= 0) so.masterListenFd = s.listen_fd;
  auto store = c10::make_intrusive<c10d::TCPStore>(s.host, so);

  auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
  if (!s.interface.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(s.interface));
  } else if (!s.device_host.empty()) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(s.device_host));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
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
