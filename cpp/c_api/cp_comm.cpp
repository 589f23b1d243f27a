// C ABI of the context-parallel communicator: a gloo group over a TCP rendezvous made here
// (cp_gloo.h), or a group the process registered with c10d; both become a cp::Comm.
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <c10/util/Exception.h>

#include <chrono>
#include <memory>
#include <string>

#include "cp_comm.h"
#include "cp_gloo.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace cp = aar::cp;

namespace {

std::chrono::milliseconds timeout_of(int64_t ms, const char* name) {
  AAR_CHECK_ARG(ms > 0, name, " must be a positive number of milliseconds, got ", ms);
  return std::chrono::milliseconds(ms);
}

aar_cp_comm_t* wrap(std::shared_ptr<cp::Comm> c) {
  auto owned = std::make_unique<std::shared_ptr<cp::Comm>>(std::move(c));
  aar_cp_comm* h = capi::make<aar_cp_comm>();
  h->comm = owned.release();
  return h;
}

// A string argument that is NULL or names something.
std::string optional_string(const char* s, const char* name) {
  if (s == nullptr) return {};
  AAR_CHECK_ARG(*s != '\0', name, " is the empty string (NULL for the default)");
  return s;
}

}  // namespace

extern "C" {

void aar_cp_comm_tcp_config_init(aar_cp_comm_tcp_config_t* c) {
  if (c == nullptr) return;
  *c = aar_cp_comm_tcp_config_t{};
  c->struct_size = sizeof(*c);
  c->rank = -1;        // required: an unset field is refused by name
  c->world_size = 0;
  c->timeout_ms = cp::CommOptions{}.timeout.count();
  c->listen_fd = -1;
}

aar_status_t aar_cp_comm_create_tcp(const aar_cp_comm_tcp_config_t* c, aar_cp_comm_t** out) {
  return guarded("aar_cp_comm_create_tcp", [&] {
    capi::check_struct(c, "config", "aar_cp_comm_tcp_config_init");
    capi::check_not_null(out, "out");
    AAR_CHECK_ARG(c->host != nullptr && *c->host != '\0', "config->host must name rank 0's address, got ",
                  c->host == nullptr ? "NULL" : "the empty string");
    capi::check_group("config->", "world_size", c->world_size, "rank", c->rank);
    AAR_CHECK_ARG(c->port >= 0 && c->port <= 65535, "config->port must be in [1, 65535], got ", c->port);
    AAR_CHECK_ARG(c->port != 0 || c->world_size == 1, "config->port=0 (any free port) needs world_size 1: the other ",
                  c->world_size - 1, " rank(s) could not find it");
    AAR_CHECK_ARG(c->listen_fd >= -1, "config->listen_fd must be -1 or a socket, got ", c->listen_fd);
    AAR_CHECK_ARG(c->listen_fd == -1 || c->rank == 0, "config->listen_fd=", c->listen_fd,
                  " is for rank 0 (the store's server), given on rank ", c->rank);
    AAR_CHECK_ARG(c->listen_fd == -1 || c->port != 0, "config->listen_fd=", c->listen_fd,
                  " needs config->port: the port that socket is bound to");
    capi::GlooGroupSpec s;
    s.host = c->host;
    s.port = static_cast<uint16_t>(c->port);
    s.rank = c->rank;
    s.world = c->world_size;
    s.listen_fd = c->listen_fd;
    s.timeout = timeout_of(c->timeout_ms, "config->timeout_ms");
    s.group_name = optional_string(c->group_name, "config->group_name");
    if (s.group_name.empty()) s.group_name = "aar_tcp:" + s.host + ":" + std::to_string(c->port);
    s.interface = optional_string(c->device_interface, "config->device_interface");
    s.device_host = optional_string(c->device_host, "config->device_host");
    AAR_CHECK_ARG(s.interface.empty() || s.device_host.empty(),
                  "config->device_interface and config->device_host are both set ('", s.interface, "', '",
                  s.device_host, "'): give one, or neither for gloo's default device");
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    try {
      pg = capi::make_gloo_group(s);
    } catch (const aar::InvalidArgument&) {
      throw;  // a device or listening socket named by its config field
    } catch (const std::exception& e) {
      // The rendezvous or a peer failed (refused, timed out): a runtime error naming the group.
      const auto* ce = dynamic_cast<const c10::Error*>(&e);
      throw std::runtime_error("rank " + std::to_string(s.rank) + " of " + std::to_string(s.world) +
                               " could not join the gloo group at " + s.host + ":" + std::to_string(c->port) +
                               " within " + std::to_string(c->timeout_ms) +
                               " ms: " + (ce != nullptr ? ce->what_without_backtrace() : e.what()));
    }
    cp::CommOptions o;
    o.timeout = s.timeout;
    *out = wrap(std::make_shared<cp::Comm>(pg, o));
  });
}

aar_status_t aar_cp_comm_create_from_group(const char* group_name, const void* process_group, int64_t timeout_ms,
                                           aar_cp_comm_t** out) {
  return guarded("aar_cp_comm_create_from_group", [&] {
    AAR_CHECK_ARG(group_name != nullptr && *group_name != '\0', "group_name must name a registered process group, got ",
                  group_name == nullptr ? "NULL" : "the empty string");
    capi::check_not_null(out, "out");
    cp::CommOptions o;
    o.timeout = timeout_of(timeout_ms, "timeout_ms");
    c10::intrusive_ptr<c10d::ProcessGroup> pg;
    try {
      pg = c10d::resolve_process_group(group_name);
    } catch (const std::exception&) {
      aar::throw_invalid("group_name '", group_name,
                         "' is not in torch's process-group registry (c10d::register_process_group)");
    }
    AAR_CHECK_ARG(process_group == nullptr || process_group == static_cast<const void*>(pg.get()), "process_group ",
                  process_group, " is not the c10d::ProcessGroup registered under '", group_name, "' (",
                  static_cast<const void*>(pg.get()), ")");
    *out = wrap(std::make_shared<cp::Comm>(std::move(pg), o));
  });
}

void aar_cp_comm_destroy(aar_cp_comm_t* comm) {
  capi::destroy("aar_cp_comm_destroy", comm, "comm", [](aar_cp_comm* h) { delete h->comm; });
}

aar_status_t aar_cp_comm_get_info(const aar_cp_comm_t* comm, aar_cp_comm_info_t* info) {
  return guarded("aar_cp_comm_get_info", [&] {
    const cp::Comm& c = **capi::checked(comm, "comm")->comm;
    capi::check_struct(info, "info", "sizeof(aar_cp_comm_info_t)");
    info->rank = c.rank();
    info->world_size = c.size();
    info->calls = c.calls();
  });
}

}  // extern "C"
