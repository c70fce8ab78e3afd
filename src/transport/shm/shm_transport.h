// transport/shm/shm_transport.h — the Transport between ranks of one host,
// through shared memory.
//
// Same contract as every transport (transport.h). Per pair of ranks: a Unix
// socket in the abstract namespace (the handshake, doorbells, and death
// detection: the kernel closes it when a process dies, so a lost peer is
// seen at once) and a shared segment of two byte rings (shm_segment.h).
// Connections are lazy; the lower rank connects and creates the segment.
//
// Data path: messages below `cma_bytes` (and all of them where the kernel
// forbids cross-memory attach) stream through the ring: two copies,
// pipelined, spin-then-block. Larger ones are single-copy: the sender posts
// its buffer's address, the receiver reads it straight into the destination
// with process_vm_readv and acknowledges, which completes the send.
//
// Failure: like the TCP transport, the first cause is kept, `on_break` is
// called with it, and every socket is shut so that peers fail too.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/net.h"
#include "transport/first_cause.h"
#include "transport/transport.h"

namespace shoal::transport::shm {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  uint64_t job = 0;             // the communicator's unique id
  auth::Secret secret;          // the job's secret: each channel proves it both ways
  size_t ring_bytes = 1 << 20;  // per direction; rounded up to a power of two
  size_t cma_bytes = 64 << 10;  // single-copy from this size (0: never)
  // The peer's name for messages ("host"); may block.
  std::function<std::string(int peer)> peer_name;
  // Whether `peer` is on this host (any-source receives connect to the
  // higher local ranks, as only lower ranks connect on their own); may block.
  std::function<bool(int peer)> is_local;
  std::function<void(std::exception_ptr)> on_break;
  std::function<std::exception_ptr(int peer, const std::string& detail)> on_lost;
  std::function<std::string(const Fingerprint&)> describe_fp;
};

struct Channel;
struct ShmFrame;

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(ShmOptions opts);
  ~ShmTransport() override;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  void post_send(Request* r) override;
  void post_recv(Request* r) override;
  void wait(Request* const* reqs, size_t n, Clock::time_point deadline) override;
  bool poll() override;
  void poll_wait(Clock::time_point until) override;
  void wake() override;
  void set_spin_us(int us) override { spin_us_ = us; }
  void abort(std::exception_ptr cause) override;
  std::exception_ptr broken() const override;
  std::string describe_peer(int peer) const override;
  bool heard_from(int peer) const override;
  int event_fd() const override { return epoll_fd_.get(); }
  bool arm() override;
  bool cancel(Request* r) override;
  std::string pending_summary(Request* const* reqs, size_t n) const override;

  // The abstract Unix-socket name rank `rank` of job `job` listens on.
  static std::string socket_name(uint64_t job, int rank);

 private:
  Channel& channel_for(int peer);
  void connect_to(Channel& c);
  void accept_all();
  bool read_hello(Channel& c);
  bool read_accept(Channel& c);
  void probe(Channel& c);
  bool progress(Channel& c);  // returns true if anything moved
  bool try_write(Channel& c);
  bool try_read(Channel& c);
  bool reap_fins(Channel& c);
  bool match(Channel& c);
  void read_rts(Channel& c, Request* r, const ShmFrame& h);
  void send_fin(Channel& c, uint64_t cookie);
  void ring_doorbell(Channel& c);
  void on_conn_error(Channel& c, const std::string& detail);
  void on_peer_closed(Channel& c);
  void check_closed(Channel& c);
  bool take_unexpected(Channel& c, Request* r);
  void file_unexpected(Channel& c);
  int handle_events(int timeout_ms);
  void check_broken();
  [[noreturn]] void fail(std::exception_ptr cause);
  void close_all();

  ShmOptions opts_;
  net::Fd listen_fd_;
  net::Fd epoll_fd_;
  net::Fd wake_fd_;
  std::vector<std::unique_ptr<Channel>> peers_;
  std::vector<std::unique_ptr<Channel>> unnamed_;
  std::vector<Channel*> active_;  // channels that are connected (polled)
  std::deque<Request*> any_recvs_;
  std::vector<std::string> names_;

  FirstCause broken_;
  bool closed_ = false;
  int spin_us_ = 0;
  unsigned poll_count_ = 0;
  bool events_due_ = false;  // arm() was called: look at the sockets next poll
};

}  // namespace shoal::transport::shm
