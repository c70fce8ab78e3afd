// transport/transport.h — the point-to-point interface every transport implements.
//
// A transport moves tagged byte ranges between the ranks of one communicator.
// It knows nothing of collectives: algorithms (src/collectives) are written
// only against post_send / post_recv / wait, and the core drives progress.
// One progress engine (hybrid_transport.h) implements Transport over the
// channels that move the bytes (TCP; shared memory), which only post, poll
// and say when they may have news (Channel).
//
// Threading: a Transport is driven by one thread at a time (the communicator's
// executor). abort() and broken() may be called from any thread.
//
// Matching: a message matches the first posted receive from the same peer (or
// from kAnySource) with the same Tag. Messages between one pair of ranks are
// non-overtaking: a receiver that has not posted the matching receive yet
// leaves the message in the kernel's socket buffer (back-pressure) rather than
// copying it; a receive is filled straight into its destination buffer.
// Every message carries the sender's Fingerprint of the operation; a receive
// whose fingerprint or length differs fails with Mismatch before any byte of
// the payload is written.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

namespace shoal::transport {

using Clock = std::chrono::steady_clock;
inline constexpr int kAnySource = -1;

enum class Space : uint8_t { kCollective = 0, kP2P = 1 };

// Identifies one message within a communicator: the collective's sequence
// number and the algorithm's step, or (kP2P) the user's tag in `seq`.
// `ctx` tells apart the communicators that share one transport (a group
// split from its parent, transport/view.h); 0 for the parent.
// A wait's deadline, `timeout` after the first look at it: a collective
// whose waits all end at once reads no clock for it (a clock read is a fair
// share of a small collective on shared memory).
class LazyDeadline {
 public:
  explicit LazyDeadline(Clock::duration timeout) : timeout_(timeout) {}
  Clock::time_point get() const {
    if (at_ == Clock::time_point{}) at_ = Clock::now() + timeout_;
    return at_;
  }

 private:
  Clock::duration timeout_;
  mutable Clock::time_point at_{};
};

struct Tag {
  Space space = Space::kCollective;
  uint64_t seq = 0;
  uint32_t step = 0;
  uint32_t ctx = 0;
  bool operator==(const Tag&) const = default;
};

// What the sender believes the operation is; compared by the receiver.
struct Fingerprint {
  uint8_t coll = 0;    // collective kind (core's Coll enum)
  uint8_t dtype = 0;
  uint8_t op = 0;      // reduce op, 0 where none
  uint8_t algo = 0;    // the algorithm that runs it (coll::algorithm_id), 0 where none
  uint32_t root = 0;
  uint64_t count = 0;  // the operation's element count as every rank sees it
  bool operator==(const Fingerprint&) const = default;
};

// One pending send or receive. The caller owns it and must keep it (and its
// buffer) alive and unmoved until it completes or the transport is aborted.
struct Request {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  int peer = 0;          // kAnySource allowed for P2P receives
  Tag tag;
  Fingerprint fp;
  void* buf = nullptr;   // const for sends
  size_t len = 0;
  // Filled by the transport.
  size_t done = 0;       // bytes moved so far
  int source = -1;       // the rank a receive was matched with
  bool complete = false;
  bool check_fp = true;  // receives: compare the sender's fingerprint

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
};

// What a Transport and each of its channels have in common: posting,
// failure and description.
class Endpoint {
 public:
  virtual ~Endpoint() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Queue a request; it starts moving at once where possible. Throws the
  // first cause if broken.
  virtual void post_send(Request* r) = 0;
  virtual void post_recv(Request* r) = 0;

  // One non-blocking pass of progress; returns true if anything may have
  // moved (false only when certainly nothing did).
  virtual bool poll() = 0;

  // Withdraws a posted receive that has not been matched yet (any-source
  // receives are posted to every channel; the first to match wins). Returns
  // false if it was matched already or not known.
  virtual bool cancel(Request* r) = 0;
  // What the given requests wait for, for a timeout message.
  virtual std::string pending_summary(Request* const* reqs, size_t n) const = 0;

  // Marks it broken with `cause`; every pending and later call fails with
  // it. Idempotent: the first cause wins. Any thread.
  virtual void abort(std::exception_ptr cause) = 0;
  virtual std::exception_ptr broken() const = 0;

  // A description of the peer for error messages: "rank 3 (host:port)".
  virtual std::string describe_peer(int peer) const = 0;

  // Whether a connection with `peer` has been made (it may have closed
  // since): then whatever the peer sent, and its leaving, reach this side
  // through it. Polling first takes in connections still in the backlog.
  virtual bool heard_from(int peer) const = 0;
};

// One way of reaching peers (TCP sockets; shared memory on this host),
// driven by the one progress engine (transport/hybrid_transport.h), which
// polls its channels, spins, and blocks on their event fds. A channel
// never waits itself.
class Channel : public Endpoint {
 public:
  // An fd that becomes readable when poll() may make progress (an epoll fd).
  virtual int event_fd() const = 0;
  // Called before the engine blocks on event_fd(): arranges to be woken by
  // any change a peer makes, and returns false if progress is possible now
  // (then the engine must poll instead of blocking).
  virtual bool arm() { return true; }
};

// What the algorithms are written against: post, then wait.
class Transport : public Endpoint {
 public:
  // Drives progress until every request in reqs[0..n) is complete. Throws the
  // transport's error (PeerLost, Mismatch, ...) or TimeoutError at `deadline`
  // (and then the transport is broken: messages may be half sent).
  virtual void wait(Request* const* reqs, size_t n, Clock::time_point deadline) = 0;

  // Blocks until some event or wake() (or `until`), then makes progress.
  virtual void poll_wait(Clock::time_point until) = 0;
  // Wakes a thread blocked in poll_wait() or wait(); callable from any thread.
  virtual void wake() = 0;

  // How long wait() busy-polls before sleeping, in microseconds, and
  // whether a poll that found nothing gives the core away (sched_yield)
  // rather than pausing on it. Set by the driving thread: a caller that
  // waits for its own operation spins (it has nothing else to do), the
  // background executor does not (it would steal the core from the
  // computation it overlaps with); a host with more ranks than cores yields,
  // since the peer waited for may be queued on this very core.
  virtual void set_spin(int us, bool yield) = 0;
};

}  // namespace shoal::transport
