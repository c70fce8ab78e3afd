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
// Failure: like the TCP transport, the first cause is kept, Liveness::broke()
// is called with it, and every socket is shut so that peers fail too.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/net.h"
#include "transport/first_cause.h"
#include "transport/handshake.h"
#include "transport/liveness.h"
#include "transport/transport.h"

namespace shoal::transport::shm {

struct ShmOptions {
  int rank = 0;
  int size = 1;
  uint64_t job = 0;             // the communicator's unique id
  auth::Secret secret;          // the job's secret: each channel proves it both ways
  size_t ring_bytes = 1 << 20;  // per direction; rounded up to a power of two
  size_t cma_bytes = 64 << 10;  // single-copy from this size (0: never)
  // The peers' names for messages (address().hostname), which of them are
  // on this host (any-source receives connect to the higher local ranks, as
  // only lower ranks connect on their own), and what a break or a lost
  // channel means for the job. Owned by the core; must outlive the
  // transport. Null: knows nothing.
  Liveness* liveness = nullptr;
};

struct PeerChannel;
struct ShmFrame;

class ShmTransport final : public transport::Channel {
 public:
  explicit ShmTransport(ShmOptions opts);
  ~ShmTransport() override;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  void post_send(Request* r) override;
  void post_recv(Request* r) override;
  bool poll() override;
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
  void learn_name(int peer);
  handshake::Identity identity() const;
  PeerChannel& channel_for(int peer);
  void connect_to(PeerChannel& c);
  void accept_all();
  bool read_hello(PeerChannel& c);
  bool read_accept(PeerChannel& c);
  void probe(PeerChannel& c);
  bool progress(PeerChannel& c);  // returns true if anything moved
  bool try_write(PeerChannel& c);
  bool try_read(PeerChannel& c);
  bool reap_fins(PeerChannel& c);
  bool match(PeerChannel& c);
  void read_rts(PeerChannel& c, Request* r, const ShmFrame& h);
  void send_fin(PeerChannel& c, uint64_t cookie);
  void ring_doorbell(PeerChannel& c);
  void on_conn_error(PeerChannel& c, const std::string& detail);
  void on_peer_closed(PeerChannel& c);
  void check_closed(PeerChannel& c);
  bool take_unexpected(PeerChannel& c, Request* r);
  void file_unexpected(PeerChannel& c);
  int handle_events(int timeout_ms);
  void check_broken();
  [[noreturn]] void fail(std::exception_ptr cause);
  void close_all();

  ShmOptions opts_;
  Liveness& live_;  // opts_.liveness, or Liveness::none()
  net::Fd listen_fd_;
  net::Fd epoll_fd_;
  std::vector<std::unique_ptr<PeerChannel>> peers_;
  std::vector<std::unique_ptr<PeerChannel>> unnamed_;
  std::vector<PeerChannel*> active_;  // channels that are connected (polled)
  std::deque<Request*> any_recvs_;
  std::vector<std::string> names_;  // peers' host names (learn_name)

  FirstCause broken_;
  unsigned poll_count_ = 0;
  bool events_due_ = false;  // arm() was called: look at the sockets next poll
};

}  // namespace shoal::transport::shm
