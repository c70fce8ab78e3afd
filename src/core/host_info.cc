// core/host_info.cc — HostInfo (host_info.h).
#include "core/host_info.h"

#include <unistd.h>

#include <cstdlib>

#include "common/env.h"
#include "common/net.h"

namespace shoal::core {

HostInfo HostInfo::here(int size) {
  HostInfo h;
  h.id = env::get("SHOAL_HOST_ID").value_or(net::host_identity());
  h.boot = net::boot_id();
  h.cores = sysconf(_SC_NPROCESSORS_ONLN);
  h.local_ranks = size;
  if (const char* l = std::getenv("LOCAL_WORLD_SIZE")) h.local_ranks = std::atoi(l);
  return h;
}

int HostInfo::ranks_here(const std::vector<std::string>& ids) const {
  int n = 0;
  for (const auto& other : ids) n += boot.empty() ? other == id : other.find(boot) != std::string::npos;
  return n;
}

}  // namespace shoal::core
