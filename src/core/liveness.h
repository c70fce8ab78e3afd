// core/liveness.h — how a communicator learns that the job has failed and
// names why: the one transport::Liveness the core hands to its transports
// and to the shared-memory arena.
//
// Every communicator has one. The root communicator's does the work: peers'
// addresses and processes from the rendezvous (address, peer_gone), a lost
// connection turned into the job-wide cause (lost, broke), the cause another
// rank published, the roll call at a timeout (check_abort, timed_out;
// roll_call.h). A group split from it numbers peers in the group's ranks
// and asks the root's, except for what is its own: whether its transport
// is broken, and operations issued in different orders across the family
// that shares the connections (order_check).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "core/roll_call.h"
#include "transport/liveness.h"

namespace shoal {
class CommunicatorImpl;
}

namespace shoal::core {

// "allreduce(count=4, float32, sum, algorithm ring)": an operation as its
// Fingerprint describes it, for mismatch and timeout messages.
std::string describe_fingerprint(const transport::Fingerprint& fp);

class JobLiveness final : public transport::Liveness {
 public:
  // `c` owns this object; `c`'s store, rank and size are set.
  explicit JobLiveness(CommunicatorImpl& c);

  transport::PeerAddress address(int peer) override;
  bool is_local(int peer) override;
  void broke(std::exception_ptr cause) override;
  std::exception_ptr lost(int peer, const std::string& who, const std::string& detail) override;
  std::exception_ptr check_abort(transport::Clock::time_point deadline) override;
  std::exception_ptr peer_gone(int peer) override;
  int64_t local_pid(int peer) override;
  void learned_process(int peer, const std::string& token) override;
  std::exception_ptr order_check(int peer) override;
  std::exception_ptr broken() override;
  std::exception_ptr timed_out(const std::string& waiting) override;
  void still_waiting(double waited_s, const std::string& waiting) override;
  std::string describe(const transport::Fingerprint& fp) override { return describe_fingerprint(fp); }
  std::string name(int peer) override;

  // The processes of this communicator's ranks, known from another
  // communicator of the same processes (shrink, grow): tokens[i] is rank i's
  // (empty or "-": unknown, read from the rendezvous as usual).
  void seed_processes(const std::vector<std::string>& tokens);
  // Returns once `key` (which `peer` publishes) is in the store; throws
  // PeerLost when `peer`'s process, known from seed_processes, is gone first.
  // Without a known process, returns at once (the caller's get waits).
  void wait_published(int peer, const std::string& key);
  // The same for `key` published by the last of the ranks to join (the host
  // table): PeerLost when any rank's known process is gone first.
  void wait_all_published(const std::string& key);
  // `peer`'s process token ("-": unknown).
  std::string process_of(int peer);
  // Whether `peer`'s process, on this host, has exited (false when it runs
  // elsewhere or this cannot tell). No side effect.
  bool process_gone(int peer);
  // Another rank's published cause, or null; the store's loss (store_lost)
  // when it cannot be asked any more.
  std::exception_ptr abort_record();
  // The error of a store that is gone, naming it (and the rank hosting it).
  std::exception_ptr store_lost(const std::string& cause);
  // This communicator's roll call (answered by its blocked sends and receives).
  RollCall& roll_call() { return roll_call_; }

 private:
  bool is_root() const;
  JobLiveness& root() const;
  int to_wire(int peer) const;
  // The root's: a PeerLost for `peer` with message `msg`.
  std::exception_ptr lost_error(const std::string& msg, int peer) const;
  // The root's: `peer`'s process token from the rendezvous ("-" when it
  // has none or the store cannot tell), read once.
  std::string process_token(int peer);
  // The root's: `peer`'s process token if this rank knows it without the
  // store (seeded, or read with its address), else "".
  std::string known_process(int peer);
  // The root's: the ranks whose known processes on this host have exited.
  std::vector<int> exited_members();
  // A PeerLost naming the ranks `gone` (their processes exited) and then
  // `store_msg`; null when `gone` is empty.
  std::exception_ptr exited_error(const std::vector<int>& gone, const std::string& store_msg);
  // "the job's rendezvous store (<where>) is unreachable: <cause>".
  std::string store_unreachable(const std::string& cause) const;

  CommunicatorImpl& c_;
  RollCall roll_call_;
  Mutex mu_;
  std::vector<std::string> processes_ GUARDED_BY(mu_);  // peers' proc::self_token(), "-" if none
  // The root's: peers' addresses, each read from the store once (host ""
  // until then): a connection asks for its peer's twice (is_local, then
  // the transport's connect or accept).
  std::vector<transport::PeerAddress> addresses_ GUARDED_BY(mu_);
  std::string published_pos_;           // the last "ctx seq" this rank published as blocked in
};

}  // namespace shoal::core
