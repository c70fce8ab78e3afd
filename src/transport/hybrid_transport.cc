// transport/hybrid_transport.cc — see hybrid_transport.h for the contract.
#include "transport/hybrid_transport.h"

#include <errno.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/spin_lock.h"
#include "common/yield_gauge.h"
#include "shoal/error.h"

namespace shoal::transport {
namespace {
// While spinning on shared memory only, look at the network side this often
// (an epoll_wait, which costs more than a pass over the shared-memory rings).
constexpr unsigned kNetEvery = 128;
// A spinning wait reads the clock (~30 ns on a VM) this often.
constexpr unsigned kClockEvery = 8;
}  // namespace

Clock::time_point BesideLooks::begin(Clock::time_point now) {
  told_ = false;
  return beside_ ? now : now + kFirstLook;
}

HybridTransport::HybridTransport(std::unique_ptr<Channel> net, std::unique_ptr<Channel> local,
                                 HybridOptions opts)
    : net_(std::move(net)),
      local_(std::move(local)),
      opts_(std::move(opts)),
      live_(opts_.liveness ? *opts_.liveness : Liveness::none()) {
  local_cache_.assign(static_cast<size_t>(net_->size()), -1);
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) throw InternalError(std::string("epoll_create1: ") + strerror(errno));
  wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_) throw InternalError(std::string("eventfd: ") + strerror(errno));
  auto add = [&](int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
  };
  add(wake_fd_.get());
  add(net_->event_fd());
  if (local_) add(local_->event_fd());
}

HybridTransport::~HybridTransport() = default;

bool HybridTransport::is_local(int peer) const {
  if (!local_ || peer < 0 || peer >= size() || peer == rank()) return false;
  int8_t& v = local_cache_[static_cast<size_t>(peer)];
  if (v < 0) v = live_.is_local(peer) ? 1 : 0;
  return v == 1;
}

Channel& HybridTransport::route(int peer) const { return is_local(peer) ? *local_ : *net_; }

std::string HybridTransport::describe_peer(int peer) const {
  try {
    return route(peer).describe_peer(peer);
  } catch (...) {
    return net_->describe_peer(peer);
  }
}

// ---- failure -------------------------------------------------------------

std::exception_ptr HybridTransport::broken() const {
  if (auto e = net_->broken()) return e;
  return local_ ? local_->broken() : nullptr;
}

void HybridTransport::abort(std::exception_ptr cause) {
  broken_flag_.store(true, std::memory_order_release);
  net_->abort(cause);
  if (local_) local_->abort(cause);
  wake();
}

void HybridTransport::fail(std::exception_ptr cause) {
  // Each child publishes (first cause wins) and shuts its connections when
  // it next runs on this thread.
  broken_flag_.store(true, std::memory_order_release);
  net_->abort(cause);
  if (local_) local_->abort(cause);
  try {
    net_->poll();
  } catch (...) {
  }
  if (local_) {
    try {
      local_->poll();
    } catch (...) {
    }
  }
  std::rethrow_exception(broken() ? broken() : cause);
}

void HybridTransport::check_broken() {
  if (!broken_flag_.load(std::memory_order_acquire)) return;
  if (auto e = broken()) fail(e);
}

template <class F>
auto HybridTransport::guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const InvalidArgument&) {
    throw;  // the caller's mistake: nothing is broken
  } catch (...) {
    fail(std::current_exception());
  }
}

// ---- posting -------------------------------------------------------------

void HybridTransport::post_send(Request* r) {
  check_broken();
  Channel& t = route(r->peer);
  if (&t == net_.get()) net_active_ = true;
  guarded([&] { t.post_send(r); });
}

void HybridTransport::post_recv(Request* r) {
  check_broken();
  if (r->peer != kAnySource || !local_) {
    Channel& t = route(r->peer);
    if (&t == net_.get()) net_active_ = true;
    guarded([&] { t.post_recv(r); });
    return;
  }
  guarded([&] { local_->post_recv(r); });
  if (r->source >= 0) return;
  bool remote = false;
  for (int p = 0; p < size() && !remote; ++p) remote = p != rank() && !is_local(p);
  if (!remote) return;
  net_active_ = true;
  guarded([&] { net_->post_recv(r); });
  if (r->source >= 0) {
    local_->cancel(r);
    return;
  }
  any_pending_.push_back(r);
}

bool HybridTransport::cancel(Request* r) {
  bool a = net_->cancel(r);
  bool b = local_ && local_->cancel(r);
  any_pending_.erase(std::remove(any_pending_.begin(), any_pending_.end(), r), any_pending_.end());
  return a || b;
}

// An any-source receive matched by one child is withdrawn from the other.
void HybridTransport::resolve_any() {
  for (size_t i = 0; i < any_pending_.size();) {
    Request* r = any_pending_[i];
    if (r->source >= 0) {
      net_->cancel(r);
      local_->cancel(r);
      any_pending_.erase(any_pending_.begin() + static_cast<ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

// ---- progress ------------------------------------------------------------

bool HybridTransport::poll_children() {
  return guarded([&] {
    bool moved = false;
    if (local_) {
      moved |= local_->poll();
      resolve_any();
    }
    if (!local_ || net_active_ || net_due_ || (++polls_ % kNetEvery) == 0) {
      net_due_ = false;
      moved |= net_->poll();
      resolve_any();
    }
    return moved;
  });
}

void HybridTransport::poll_both() {
  check_broken();
  for (int round = 0; round < 16; ++round) {
    net_due_ = true;
    if (!poll_children()) break;
  }
}

std::exception_ptr HybridTransport::gone_silently(int peer) {
  if (heard_from(peer)) return nullptr;
  auto cause = live_.peer_gone(peer);
  if (!cause) return nullptr;
  // Gone: but it may have connected and sent before it went (still in the
  // backlog); then its connection tells the rest.
  poll_both();
  return heard_from(peer) ? nullptr : cause;
}

bool HybridTransport::poll() {
  check_broken();
  return poll_children();
}

bool HybridTransport::arm() {
  return guarded([&] {
    bool ok = net_->arm();
    if (local_) {
      ok = local_->arm() && ok;
      resolve_any();
    }
    return ok;
  });
}

// Blocks on both children's event fds; returns the number of events.
int HybridTransport::block(int timeout_ms) {
  epoll_event evs[4];
  int n = epoll_wait(epoll_fd_.get(), evs, 4, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    throw InternalError(std::string("epoll_wait: ") + strerror(errno));
  }
  for (int i = 0; i < n; ++i) {
    if (evs[i].data.fd == wake_fd_.get()) {
      uint64_t v;
      while (::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
      }
    } else if (evs[i].data.fd == net_->event_fd()) {
      net_due_ = true;  // the network side has something: look at it next
    }
  }
  return n;
}

void HybridTransport::poll_wait(Clock::time_point until) {
  check_broken();
  if (!poll_children() && arm()) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    block(static_cast<int>(std::clamp<int64_t>(ms, 0, 1000)));
    poll_children();
  }
  check_broken();
}

std::string HybridTransport::pending_summary(Request* const* reqs, size_t n) const {
  std::ostringstream o;
  bool first = true;
  for (size_t i = 0; i < n; ++i) {
    if (reqs[i]->complete) continue;
    Request* one[1] = {reqs[i]};
    const Channel& t = reqs[i]->peer == kAnySource ? (local_ ? *local_ : *net_) : route(reqs[i]->peer);
    if (!first) o << "; ";
    first = false;
    o << t.pending_summary(one, 1);
  }
  return o.str();
}

int peer_queued_on(int cpu, Request* const* reqs, size_t n, Liveness& live, std::vector<int64_t>& pids,
                   proc::TaskWatch& watch) {
  for (size_t i = 0; i < n; ++i) {
    const int peer = reqs[i]->peer;
    if (reqs[i]->complete || peer < 0) continue;
    if (pids.size() <= static_cast<size_t>(peer)) pids.resize(static_cast<size_t>(peer) + 1, -1);
    int64_t& pid = pids[static_cast<size_t>(peer)];
    if (pid < 0) pid = live.local_pid(peer);
    if (pid > 0 && watch.watch(pid, static_cast<int>(pid)) && watch.runnable_on(cpu) == 1) return peer;
  }
  return -1;
}

void HybridTransport::wait(Request* const* reqs, size_t n, Clock::time_point deadline) {
  check_broken();
  auto now = Clock::now();
  // A crowded host's wait gives the core away from the start, unless its
  // yields were found to hand it to other work for a time slice: then it
  // blocks at once (YieldGauge).
  YieldGauge& gauge = YieldGauge::here();
  auto spin_until = now + std::chrono::microseconds(spin_us_);
  const bool gauged = spin_yield_ && spin_us_ > 0;  // this wait's yields are the gauge's (not the executor's)
  if (gauged && !gauge.spin()) spin_until = now;
  auto look_at = looks_.begin(now);
  bool yielding = false;  // a holding spin whose peer is queued behind it
  proc::TaskWatch watch;  // open for this wait only: a rank keeps no descriptor
  auto next_abort_check = now + std::chrono::milliseconds(opts_.abort_poll_ms);
  const auto began = now;
  auto next_report = opts_.report_every.count() > 0 ? now + opts_.report_every : Clock::time_point::max();
  for (unsigned iter = 1;; ++iter) {
    bool all = true;
    for (size_t i = 0; i < n && all; ++i) all = reqs[i]->complete;
    if (all) {
      if (gauged) gauge.quiet();
      return;
    }
    if (iter % kClockEvery == 0) now = Clock::now();
    if (now >= deadline) {
      fail(live_.timed_out(pending_summary(reqs, n)));
    }
    if (poll_children()) continue;
    if (now < spin_until) {
      // A spinning wait holds its core, as Open MPI's does: a poll that
      // found nothing pauses (cpu_relax) and polls again. It gives the core
      // away (sched_yield) while the peer's main thread is queued on it, or
      // from the start when this host runs more ranks than cores
      // (set_spin). Given away otherwise, the core goes, on a kernel that
      // schedules by deadlines (EEVDF, Linux 6.6 and later), to any other
      // runnable task for a whole time slice: beside bursty load, 2 ranks'
      // 8 B allreduce over TCP took 55 us to 7.9 ms per call (median start
      // 5.8 ms) yielding after every empty poll, against 15-18 us holding
      // the core (bench/compare/peers/README.md, "The spin under load").
      // Two ranks the scheduler keeps on one CPU take turns on it at every
      // step while another core may be idle: then one moves (BesideLooks).
      if (!spin_yield_ && now >= look_at) {
        const int cpu = sched_getcpu();
        const int peer = peer_queued_on(cpu, reqs, n, live_, pids_, watch);
        yielding = looks_.found(rank(), peer, [cpu] { return proc::move_off_cpu(cpu); });
        look_at = now + BesideLooks::kLookEvery;
      }
      if (spin_yield_) {
        if (!gauge.yield()) spin_until = now;
      } else if (yielding) {
        sched_yield();
      } else {
        cpu_relax();
      }
      continue;
    }
    now = Clock::now();
    if (!arm()) continue;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    int timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 1, opts_.abort_poll_ms));
    if (block(timeout_ms) == 0 && Clock::now() >= next_abort_check) {
      // Blocked with nothing moving: has another rank failed the job?
      next_abort_check = Clock::now() + std::chrono::milliseconds(opts_.abort_poll_ms);
      if (auto cause = live_.check_abort(deadline)) fail(cause);
      for (size_t i = 0; i < n; ++i) {
        if (reqs[i]->complete || reqs[i]->peer < 0) continue;
        if (auto cause = gone_silently(reqs[i]->peer)) fail(cause);
      }
    }
    now = Clock::now();
    check_broken();
    if (now >= next_report) {
      live_.still_waiting(std::chrono::duration<double>(now - began).count(), pending_summary(reqs, n));
      next_report = now + opts_.report_every;
    }
  }
}

void HybridTransport::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)r;
}

}  // namespace shoal::transport
