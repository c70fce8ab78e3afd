// transport/hybrid_transport.h — the progress engine: one Transport over
// the channels that move the bytes (transport.h): peers on this host go
// through `local` (shared memory), the others through `net` (TCP).
// Every wait of a communicator runs here, and only here.
//
// Which host a peer is on comes from the rendezvous (a host identity, not an
// address string), through `is_local`, asked once per peer. The hybrid
// drives both children from one loop: it polls them, spins for
// set_spin(), then blocks on an epoll set holding both children's event
// fds. An any-source receive is posted to both; the first child to match it
// wins and the other withdraws it.
//
// Failure: a child that fails has already published its cause (Liveness::broke)
// and shut its connections; the hybrid then breaks the other child with the
// same cause, so that every peer of this rank sees it go.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/process.h"
#include "transport/liveness.h"
#include "transport/transport.h"

namespace shoal::transport {

struct HybridOptions {
  // Which peers are on this host (is_local, asked once per peer), and, every
  // `abort_poll_ms` while a wait is blocked: another rank's published cause
  // (check_abort), whether a peer the wait needs that never connected is
  // gone (peer_gone); at the deadline, the error naming what it waited for
  // (timed_out). Owned by the core; must outlive the transport. Null: knows
  // nothing.
  Liveness* liveness = nullptr;
  int abort_poll_ms = 250;
  // How often a blocked wait tells the liveness what it still waits for
  // (Liveness::still_waiting); 0: never.
  std::chrono::milliseconds report_every{0};
};

// A peer that an incomplete request of `reqs` waits for whose process's
// main thread is running or queued on CPU `cpu` (a wait that holds that CPU
// keeps it from answering; the main thread is the one of a training
// script's blocking calls), else -1. `pids` caches `live.local_pid(peer)`
// per peer (-1: not asked yet; 0: not on this machine); `watch` keeps the
// last thread looked at open.
int peer_queued_on(int cpu, Request* const* reqs, size_t n, Liveness& live, std::vector<int64_t>& pids,
                   proc::TaskWatch& watch);

// How a wait that holds its core looks for a peer queued behind it on its
// CPU (peer_queued_on), and what it does about one. A look reads the peer's
// /proc entry (a few µs), which a peer that is simply a little behind should
// not cost: the first look of a wait comes kFirstLook into it, unless the
// last wait's found the peer beside (then at once), and the next every
// kLookEvery. While the peer is beside, the wait gives the core away between
// polls. Two ranks that the scheduler keeps on one CPU take turns on it at
// every step while another core may be idle (beside bursty load, 2 ranks'
// 8 B allreduce over TCP took about 200 us per call that way, in 1 to 3
// starts of 10-12, against 11-20 us apart): the first look of each wait tells a
// proc::CpuSharing, which says when the higher rank of the two moves. A wait
// that ends before its first look says nothing of where the peer is.
class BesideLooks {
 public:
  static constexpr auto kFirstLook = std::chrono::microseconds(50);
  static constexpr auto kLookEvery = std::chrono::microseconds(25);

  // A wait begins at `now`: when its first look is due.
  Clock::time_point begin(Clock::time_point now);
  // A look by `self` found `peer` queued on its CPU (-1: none). Calls `move`
  // (which returns whether this thread moved off the CPU) when it is time;
  // returns whether to give the core away until the next look.
  template <class Move>
  bool found(int self, int peer, Move&& move) {
    if (told_) return peer >= 0;
    told_ = true;
    beside_ = peer >= 0;
    if (!beside_) {
      sharing_.apart();
      return false;
    }
    return !sharing_.beside(self > peer, move);
  }

 private:
  proc::CpuSharing sharing_;
  bool beside_ = false;  // the first look of the last wait that looked found a peer beside
  bool told_ = false;    // this wait's first look has told sharing_
};

class HybridTransport final : public Transport {
 public:
  // `local` may be null (shared memory disabled): then everything goes to `net`.
  HybridTransport(std::unique_ptr<Channel> net, std::unique_ptr<Channel> local, HybridOptions opts);
  ~HybridTransport() override;

  int rank() const override { return net_->rank(); }
  int size() const override { return net_->size(); }
  void post_send(Request* r) override;
  void post_recv(Request* r) override;
  void wait(Request* const* reqs, size_t n, Clock::time_point deadline) override;
  bool poll() override;
  // Polls both children until nothing moves (a bounded number of rounds):
  // poll() visits the network only now and then while shared memory is busy,
  // and a connection in the backlog takes a round to accept and another to
  // read its hello.
  void poll_both();
  // The cause to fail with when `peer` never connected and Liveness::peer_gone says
  // it is gone (after taking in the backlog), else null.
  std::exception_ptr gone_silently(int peer);
  void poll_wait(Clock::time_point until) override;
  void wake() override;
  void set_spin(int us, bool yield) override {
    spin_us_ = us;
    spin_yield_ = yield;
  }
  void abort(std::exception_ptr cause) override;
  std::exception_ptr broken() const override;
  std::string describe_peer(int peer) const override;
  bool heard_from(int peer) const override { return route(peer).heard_from(peer); }
  bool cancel(Request* r) override;
  std::string pending_summary(Request* const* reqs, size_t n) const override;

  // Whether `peer`'s messages go through shared memory.
  bool is_local(int peer) const;

 private:
  Channel& route(int peer) const;
  bool poll_children();
  // Before blocking: every channel arranges to be woken; false if one can
  // make progress now (Channel::arm).
  bool arm();
  void resolve_any();
  int block(int timeout_ms);
  void check_broken();
  [[noreturn]] void fail(std::exception_ptr cause);
  // Runs f; if a child throws, breaks the other child with the same cause.
  template <class F>
  auto guarded(F&& f) -> decltype(f());

  std::unique_ptr<Channel> net_;
  std::unique_ptr<Channel> local_;
  HybridOptions opts_;
  Liveness& live_;  // opts_.liveness, or Liveness::none()
  mutable std::vector<int8_t> local_cache_;  // -1 unknown, 0 net, 1 local
  std::vector<int64_t> pids_;                // peer_queued_on()'s cache of live_.local_pid()
  BesideLooks looks_;                        // for a peer queued behind a wait on its CPU
  std::vector<Request*> any_pending_;        // any-source receives posted to both
  bool net_active_ = false;                  // something was routed to net: poll it every time
  bool net_due_ = false;                     // net has news (an event, a probe): poll it once
  // Set by abort() (any thread) and fail(): the cheap test of check_broken().
  // A child that fails on its own does so on the driving thread, by throwing.
  std::atomic<bool> broken_flag_{false};
  unsigned polls_ = 0;
  int spin_us_ = 0;
  bool spin_yield_ = false;
  net::Fd epoll_fd_;
  net::Fd wake_fd_;
};

}  // namespace shoal::transport
