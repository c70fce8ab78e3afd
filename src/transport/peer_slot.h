// transport/peer_slot.h — a channel's state for one peer (a TCP connection,
// a shared-memory channel), made the first time a request names the peer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shoal/error.h"

namespace shoal::transport {

// `peers` has one slot per rank of the communicator; `rank` is this one's.
// A peer that is not another rank is the caller's mistake (InvalidArgument).
template <class T>
T& peer_slot(std::vector<std::unique_ptr<T>>& peers, int peer, int rank) {
  const int size = static_cast<int>(peers.size());
  if (peer < 0 || peer >= size || peer == rank) {
    throw InvalidArgument("peer: rank " + std::to_string(peer) + " is not another rank of a " +
                          std::to_string(size) + "-rank communicator (this is rank " + std::to_string(rank) + ")");
  }
  auto& slot = peers[static_cast<size_t>(peer)];
  if (!slot) {
    slot = std::make_unique<T>();
    slot->peer = peer;
  }
  return *slot;
}

}  // namespace shoal::transport
