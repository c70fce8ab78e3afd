// core/host_info.h — what a communicator knows of the machine it runs on,
// read once when the root communicator is made (groups share it).
#pragma once

#include <string>
#include <vector>

namespace shoal::core {

struct HostInfo {
  std::string id;    // SHOAL_HOST_ID, else net::host_identity(): ranks with the same id share memory
  std::string boot;  // net::boot_id(): the same for every network namespace of one kernel ("" if unknown)
  long cores = 1;    // online cores
  int local_ranks = 1;  // LOCAL_WORLD_SIZE, else the communicator's size: a guess until the topology is read

  static HostInfo here(int size);
  // How many of the ranks whose host ids are `ids` run on this machine
  // (counting other network namespaces of the same kernel).
  int ranks_here(const std::vector<std::string>& ids) const;
  // More ranks on this machine than cores: spinning steals the core a peer needs.
  bool crowded(int ranks) const { return ranks > cores; }
};

}  // namespace shoal::core
