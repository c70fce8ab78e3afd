// transport/liveness.h — what a transport asks of the job while it works:
// where a peer is, whether it still lives, and what to report when it does
// not. One interface, implemented by the core (core/liveness.h), handed to
// every transport (TCP, shared memory, the hybrid over them) and to the
// shared-memory arena; each asks only what it needs.
//
// Peers are numbered as the asker numbers them (a group's arena asks in the
// group's ranks, the transports in the root communicator's). Every method
// has a neutral default, so a test or a fuzzer overrides only what it uses.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include "transport/transport.h"

namespace shoal::transport {

// Where a peer listens, and who it is (published at the rendezvous).
struct PeerAddress {
  std::string host;      // numeric address to connect to
  uint16_t port = 0;
  std::string hostname;  // for messages
  std::string host_id;   // net::host_identity() of the peer's host
  std::string process;   // proc::self_token() of the peer (may be empty)
};

class Liveness {
 public:
  virtual ~Liveness() = default;

  // Where `peer` listens and which host it is on. May block (a store read).
  virtual PeerAddress address(int peer);
  // Whether `peer` shares this host (its messages may use shared memory).
  // May block; the answer never changes.
  virtual bool is_local(int peer);

  // Called once, on the driving thread, with the first cause of a break,
  // before any connection is closed (the core publishes it for the others).
  virtual void broke(std::exception_ptr cause);
  // Turns "the connection to `peer` (described as `who`: "rank 3 (host:port)")
  // was lost" into the cause to report: the job-wide cause when another rank
  // published one first, else a PeerLost naming it.
  virtual std::exception_ptr lost(int peer, const std::string& who, const std::string& detail);

  // Asked every abort poll (about 250 ms) while a wait is blocked, with its
  // deadline: another rank's published cause, else null. (The core also
  // answers and opens roll calls here: core/roll_call.h.)
  virtual std::exception_ptr check_abort(Clock::time_point deadline);
  // Asked likewise for a peer a blocked wait needs that never connected: a
  // cause when its process on this machine has exited, else null.
  virtual std::exception_ptr peer_gone(int peer);
  // The pid of `peer`'s process when it runs on this machine and in this
  // pid namespace, else 0 (a wait that holds its core looks at whether the
  // peer's main thread is queued behind it). May block the first time (a
  // store read).
  virtual int64_t local_pid(int peer);
  // Told by whoever learned it without the store (the arena, from its
  // members' records): `peer`'s process token (common/process.h), so that
  // its exit can be told once the store is gone too.
  virtual void learned_process(int peer, const std::string& token);
  // Asked likewise by the arena for a peer that has not arrived: a cause
  // when it is blocked in an operation this rank has not started (two
  // communicators sharing connections issued in different orders), else null.
  virtual std::exception_ptr order_check(int peer);
  // The communicator's cause when it is broken or aborted, else null
  // (cheap; any thread).
  virtual std::exception_ptr broken();
  // A wait reached its deadline while waiting for `waiting`: the error.
  virtual std::exception_ptr timed_out(const std::string& waiting);
  // A wait has been blocked `waited_s` seconds for `waiting` (told every
  // HybridOptions::report_every while it lasts): every rank may have joined
  // the operation while its data does not come (the stall report of the
  // transport's side).
  virtual void still_waiting(double waited_s, const std::string& waiting);

  // How messages name `peer`: "rank 3", or "rank 3 (group rank 1)" for a
  // communicator that numbers the job's ranks its own way.
  virtual std::string name(int peer);

  // Renders a Fingerprint for mismatch messages ("allreduce(count=4, float32, sum)").
  virtual std::string describe(const Fingerprint& fp);

  // Knows nothing: every answer is the neutral one (no address, not local).
  static Liveness& none();
};

}  // namespace shoal::transport
