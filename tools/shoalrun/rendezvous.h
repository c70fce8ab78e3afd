// shoalrun/rendezvous.h — how the launchers of a multi-node job meet and watch
// each other, through a shoal::TcpStore hosted by node 0's launcher at
// master_addr:rdzv_port (the workers' own store is on master_port).
//
// Per run of the worker group ("round" = restart count), under "shoalrun/<round>/":
//   join    every launcher claims its node rank and publishes its NodeInfo;
//           node 0 waits for all, checks that they agree (node count, workers
//           per node, restarts) and publishes a verdict that all read.
//   watch   a monitor thread per launcher heartbeats every second and polls the
//           job's failure counter every 250 ms; node 0's also declares a node
//           lost after 3 s without a heartbeat. Remote failures reach the main
//           loop through RemoteEvents (fd() + take()).
//   settle  after its workers stopped, each launcher reports how they ended and
//           waits until every node reported or was declared lost; all then
//           read the same reports and take the same restart-or-exit decision.
//   leave   non-masters say so; node 0 keeps the store up until they did
//           (at most 10 s), so that nobody mistakes its exit for a crash.
// The job's secret (docs/security.md): given by the user (--secret-file or
// SHOAL_SECRET, the same on every node), it also guards this store. Else
// node 0 makes one, and each other launcher, in its first join, publishes
// the public half of an X25519 key pair made for the purpose; node 0's
// verdict carries the secret sealed to each of those keys. The store is then
// not authenticated, but what passes through it does not reveal the secret.
// The store's one-call-at-a-time rule is respected by giving the monitor
// thread its own client; the main client is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "cluster.h"
#include "common/auth.h"
#include "group.h"
#include "shoal/store.h"

namespace shoalrun {

class RendezvousError : public std::runtime_error {
 public:
  RendezvousError(int exit_code, const std::string& what) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

struct NodeInfo {
  int node = 0;
  std::string host;
  int nnodes = 1;
  int nproc = 1;
  int max_restarts = 0;
  int pid = 0;
  std::string key;  // X25519 public key (hex) to seal the job's secret to; empty when not needed
};

struct NodeReport {
  bool ok = true;            // every worker exited 0 and nothing stopped them
  bool restartable = true;   // false when stopped by a signal or a lost node
  int exit_code = 0;
  std::string message;
};

struct Outcome {
  bool ok = false;
  bool restartable = false;
  int exit_code = 1;
  std::string message;  // names the node that failed, for every launcher
  int node = -1;        // the node that failed first (-1: unknown)
};

class LauncherRendezvous : public RemoteEvents {
 public:
  using Clock = std::chrono::steady_clock;

  // `secret`: the user's (empty: none; node 0 then makes one).
  LauncherRendezvous(const Cluster& c, const Options& o, shoal::auth::Secret secret);
  ~LauncherRendezvous() override;

  // Blocks until every node joined round `round` (any one thread; the main
  // thread keeps handling signals). Throws RendezvousError.
  void join(int round, const NodeInfo& me, Clock::time_point deadline);
  // The job's secret, known after the first join.
  const shoal::auth::Secret& secret() const { return secret_; }

  void start_monitor(int round);
  void stop_monitor();
  int fd() const override { return event_pipe_[0]; }
  std::optional<RemoteEvent> take() override;

  // Tells every node that this one failed (main thread; never throws).
  void publish_failure(int round, const std::string& kind, int exit_code, const std::string& message,
                       bool restartable);
  // The exit barrier (main thread); stops the round's monitor before it
  // returns. `signal_fd`: a terminating signal interrupts the wait.
  Outcome settle(int round, const NodeReport& mine, int signal_fd);
  void leave(int round);

 private:
  std::string key(int round, const std::string& k) const;
  std::string node_name(int n) const;
  std::string seal_context(int node) const;
  void connect(Clock::time_point deadline);
  void monitor_loop(int round);
  Outcome settle_once(int round, const NodeReport& mine, int signal_fd);
  void post(const RemoteEvent& ev);
  std::optional<RemoteEvent> read_first_failure(shoal::Store& s, int round, int64_t count);

  Cluster cluster_;
  Options opts_;
  shoal::auth::Secret secret_;  // empty until known (non-masters without a user secret)
  bool user_secret_ = false;    // given by the user: the store checks it too
  std::unique_ptr<shoal::auth::Recipient> recipient_;  // the key pair the secret is sealed to
  std::string addr_;  // "host:port" of the store, for messages
  std::vector<std::string> hosts_;  // by node rank, from the verdict
  std::unique_ptr<shoal::TcpStore> store_;        // main client (the server on node 0)
  std::unique_ptr<shoal::TcpStore> mon_store_;    // the monitor's client

  std::thread monitor_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                  // GUARDED_BY(mu_)
  std::deque<RemoteEvent> events_;     // GUARDED_BY(mu_)
  int event_pipe_[2] = {-1, -1};
};

}  // namespace shoalrun
