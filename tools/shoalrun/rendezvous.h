// shoalrun/rendezvous.h — how the launchers of a multi-node job meet and watch
// each other, through a shoal::TcpStore hosted by one of them, the
// coordinator (rendezvous_plan.cc says which; it is always node 0). The
// workers' own store is elsewhere (MASTER_PORT).
//
// Keys live under "shoalrun/<job id>/" (--rdzv-id), and per run of the worker
// group ("round") under "shoalrun/<job id>/<round>/". The coordinator writes
// the job id under "shoalrun/job" when it opens the store; a launcher of
// another job that reaches the store stops at once with an error naming both.
//   join    static: every launcher claims its node rank and publishes its
//           NodeInfo; the coordinator waits for all of them.
//           c10d: every launcher takes a slot in the round; the coordinator
//           waits for MIN nodes (join_timeout), then up to last_call_timeout
//           for more, up to MAX, and assigns node ranks (itself 0, the others
//           in the order they came). A launcher that came too late for a
//           round waits for the next one, and makes the coordinator restart
//           the job to admit it while it has fewer than MAX nodes (a
//           membership change: it does not use up a restart).
//           Either way the coordinator checks that the nodes agree (workers
//           per node, restarts, node counts) and publishes a verdict that
//           every launcher reads: the node ranks, MASTER_ADDR/MASTER_PORT,
//           the restarts used so far, the job's secret sealed to each node.
//   watch   a monitor thread per launcher heartbeats every keep_alive_interval
//           and polls the job's failure counter every --monitor-interval; the
//           coordinator's declares a node lost after keep_alive_max_attempt
//           missed heartbeats. Remote failures reach the main loop through
//           RemoteEvents (fd() + take()).
//   settle  after its workers stopped, each launcher reports how they ended and
//           waits until every node reported or was declared lost; all then
//           read the same reports and take the same restart-or-exit decision.
//           A lost node ends a static job; a c10d job restarts without it
//           (within --max-restarts) and goes on with MIN or more nodes.
//   leave   the others say so; the coordinator keeps the store up until they
//           did (at most close_timeout), so that nobody mistakes its exit for
//           a crash, and records the job's end for launchers still waiting.
// The job's secret (docs/security.md): given by the user (--secret-file or
// SHOAL_SECRET, the same on every node), it also guards this store. Else
// the coordinator makes one, and each other launcher, in its first join,
// publishes the public half of an X25519 key pair made for the purpose; the
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
  int node = 0;  // static: the claimed node rank; c10d: -1
  std::string host;
  int nnodes = 1;
  int max_nnodes = 1;
  int nproc = 1;
  int max_restarts = 0;
  int pid = 0;
  std::string key;  // X25519 public key (hex) to seal the job's secret to; empty when not needed
};

// What the verdict of a round gave this node.
struct Assignment {
  int round = 0;  // the round actually joined (c10d: a late launcher joins a later one)
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr;
  int master_port = 0;
  std::vector<std::string> hosts;  // by node rank
  int restarts_used = 0;           // failures restarted so far (SHOAL_RESTART_COUNT)
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
  bool counted = true;  // a restart uses up one of --max-restarts (not so to admit waiting nodes)
};

class LauncherRendezvous : public RemoteEvents {
 public:
  using Clock = std::chrono::steady_clock;

  // `secret`: the user's (empty: none; the coordinator then makes one).
  LauncherRendezvous(const Cluster& c, const Options& o, shoal::auth::Secret secret);
  ~LauncherRendezvous() override;

  // Blocks until the round `round` (or, c10d, a later one this launcher is
  // admitted to) has its nodes (any one thread; the main thread keeps
  // handling signals). Throws RendezvousError.
  Assignment join(int round, const NodeInfo& me, Clock::time_point deadline);
  // The job's secret, known after the first join.
  const shoal::auth::Secret& secret() const { return secret_; }
  int restarts_used() const { return restarts_used_; }

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
  // The job is over with `exit_code` (not restarted).
  void leave(int round, int exit_code);

 private:
  std::string job_key(const std::string& k) const;
  std::string key(int round, const std::string& k) const;
  std::string node_name(int n) const;
  std::string seal_context(int round, int64_t slot) const;
  void connect(Clock::time_point deadline);
  void open_store(Clock::time_point deadline);
  void check_job(Clock::time_point deadline);
  // rendezvous_join.cc: one round's join, static or c10d. Return false when
  // this launcher was not admitted to the round (c10d only).
  bool join_static(int round, const NodeInfo& me, Clock::time_point deadline, Assignment* out);
  bool join_c10d(int round, const NodeInfo& me, Clock::time_point deadline, Assignment* out);
  int wait_for_open_round(int after, Clock::time_point deadline);
  void read_verdict(int round, int64_t slot, const NodeInfo& me, Clock::time_point deadline, Assignment* out,
                    bool* admitted);
  std::string agreement_problem(const std::vector<NodeInfo>& infos, const NodeInfo& me) const;
  void monitor_loop(int round);
  Outcome settle_once(int round, const NodeReport& mine, int signal_fd);
  void post(const RemoteEvent& ev);
  std::optional<RemoteEvent> read_first_failure(shoal::Store& s, int round, int64_t count);

  Cluster cluster_;  // node rank, node count and master of the current round
  Options opts_;
  int min_nnodes_ = 1;  // c10d: a round starts with at least this many nodes
  shoal::auth::Secret secret_;  // empty until known (non-coordinators without a user secret)
  bool user_secret_ = false;    // given by the user: the store checks it too
  std::unique_ptr<shoal::auth::Recipient> recipient_;  // the key pair the secret is sealed to
  std::string addr_;                // "host:port" of the store, for messages
  bool coordinator_ = false;        // this launcher hosts the store (node 0)
  bool told_taken_ = false;         // said once that the endpoint's port is taken here
  int master_port_ = 0;             // c10d coordinator: the workers' MASTER_PORT
  int restarts_used_ = 0;           // as in the last verdict, then counted by settle()
  bool joined_once_ = false;
  std::vector<std::string> hosts_;  // by node rank, from the verdict
  std::unique_ptr<shoal::TcpStore> store_;        // main client (the server on the coordinator)
  std::unique_ptr<shoal::TcpStore> mon_store_;    // the monitor's client

  std::thread monitor_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                  // GUARDED_BY(mu_)
  std::deque<RemoteEvent> events_;     // GUARDED_BY(mu_)
  int event_pipe_[2] = {-1, -1};
  // The monitor found node 0 gone: settle() and leave() then skip the store
  // (each call would wait read_timeout for a store that does not answer).
  std::atomic<bool> master_lost_{false};
};

}  // namespace shoalrun
