// collectives/arena/arena_setup.h — the arena of a communicator whose ranks
// all live on one host, set up once, on its first collective.
//
// Rank 0 makes the segment and publishes where it is; every other rank maps
// it and says whether it could; rank 0 publishes the verdict. Both
// directions carry a proof of the job's secret: the handshake of every link
// (transport/handshake.h, link kArena), carried through the store, a Hello
// from rank 0 to each member and its Accept back. A rank that cannot prove it is not let in,
// and the job then uses the message-based algorithms, whose connections
// refuse it with the usual error (docs/security.md). Every rank uses the
// arena only if every rank has it, so the *_shared algorithms are chosen
// alike everywhere; when it cannot be had (a kernel or container that
// forbids opening another process's descriptors) the job goes on with the
// message-based algorithms and says why. Each rank makes O(1) store
// requests (rank 0 one per member for the hellos): the members count
// themselves in, and rank 0 reads all their answers in one MULTI_GET once
// the last has.
#pragma once

#include <memory>
#include <string>

#include "collectives/arena/host_arena.h"
#include "common/auth.h"
#include "shoal/store.h"
#include "transport/liveness.h"

namespace shoal::coll::arena {

struct SetupParams {
  Store& store;               // the communicator's (keys under "arena/")
  transport::Liveness& live;  // the communicator's: waits fail as a collective's do
  int rank = 0;
  int size = 1;
  uint64_t job = 0;           // the communicator's unique id
  const auth::Secret& secret;
  size_t slot_bytes = 0;      // SHOAL_SHM_ARENA_BYTES
  bool reads = true;          // try single-copy reads (SHOAL_SHM=1)
  SlotStores::Mode stores = SlotStores::Mode::kAuto;  // SHOAL_SHM_STREAM
};

// Every rank of the communicator calls it at the same point (its first
// collective), before `deadline`. Returns the arena, or null when some rank
// cannot have it; `report` says which, or what the arena is.
std::unique_ptr<HostArena> set_up(const SetupParams& p, Clock::time_point deadline, std::string* report);

}  // namespace shoal::coll::arena
