// transport/tcp/tcp_transport.h — the Transport over TCP sockets and epoll.
//
// One listening socket per communicator; connections are made lazily, the
// first time a request names a peer: the lower rank of a pair connects, the
// higher accepts. The connector sends its Hello (with its proof of the job's
// secret) and may send frames right behind it; the acceptor checks the proof
// before it reads a frame and answers with its own, which the connector
// checks before it reads a frame (frame.h). An accepted socket that does not
// complete a valid hello within TcpOptions::hello_timeout is dropped; each rejection is
// one line on stderr naming the peer's address, and the job goes on. Sockets
// are non-blocking and edge-triggered; the progress engine (hybrid_transport.h)
// polls them and blocks on event_fd().
//
// Failure: an error on a connection with pending requests (EOF, reset, a bad
// frame, a mismatch) or a timeout breaks the transport. The first cause is
// kept, Liveness::broke() is called with it (the core publishes it to the store so
// that other ranks can name the culprit), then every socket is closed so that
// peers blocked on this rank fail too instead of hanging.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net.h"
#include "transport/first_cause.h"
#include "transport/liveness.h"
#include "transport/tcp/frame.h"
#include "transport/transport.h"

namespace shoal::transport::tcp {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  uint64_t job = 0;                 // communicator unique id (checked in Hello)
  // The job's secret: every connection proves it both ways before a frame
  // is believed (frame.h, docs/security.md).
  auth::Secret secret;
  std::string bind_host = "0.0.0.0";
  int socket_buffer = 4 << 20;      // SO_SNDBUF (receive buffers autotune), 0 = kernel default
  // Congestion control of data connections: "auto" (reno on connections that
  // stay on this host, the system's default elsewhere), "system", or a name
  // (checked by the caller: net::congestion_refusal).
  std::string congestion = "auto";
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
  // Where peers listen, what a break or a lost connection means for the job,
  // and (every `abort_poll_ms` while a wait is blocked) whether another rank
  // has published a cause: this catches ranks this one has no connection
  // to. Owned by the core; must outlive the transport. Null: knows nothing.
  Liveness* liveness = nullptr;
  int abort_poll_ms = 250;
  // An accepted socket that has not completed a valid hello by then is
  // dropped (a silent stranger). Tests set it short.
  std::chrono::milliseconds hello_timeout{std::chrono::seconds(10)};
};

struct Conn;

class TcpTransport final : public Channel {
 public:
  explicit TcpTransport(TcpOptions opts);
  ~TcpTransport() override;

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
  bool cancel(Request* r) override;
  std::string pending_summary(Request* const* reqs, size_t n) const override;

  // The port this rank listens on (publish it with the host address).
  uint16_t listen_port() const { return listen_port_; }

 private:
  Conn& conn_for(int peer);
  void connect_to(Conn& c);
  std::string initial_congestion() const;
  void tune(int fd);
  void register_fd(Conn* c);
  void drive(Conn& c);
  void try_write(Conn& c);
  void try_read(Conn& c);
  bool read_hello(Conn& c);
  bool read_accept(Conn& c);
  void reject_stranger(Conn& c, const std::string& why);
  handshake::Identity identity() const { return {opts_.job, opts_.rank, opts_.size, &opts_.secret, auth::Link::kTcp}; }
  void adopt(std::unique_ptr<Conn> accepted, int peer);
  bool match(Conn& c);
  bool take_unexpected(Conn& c, Request* r);
  void file_unexpected(Conn& c);
  void on_conn_error(Conn& c, const std::string& detail);
  void accept_all();
  int handle_events(int timeout_ms);  // returns the number of events
  void check_broken();
  [[noreturn]] void fail(std::exception_ptr cause);
  void close_all();

  TcpOptions opts_;
  Liveness& live_;  // opts_.liveness, or Liveness::none()
  net::Fd listen_fd_;
  uint16_t listen_port_ = 0;
  net::Fd epoll_fd_;
  std::vector<std::unique_ptr<Conn>> peers_;      // by rank; created on first use
  std::vector<std::unique_ptr<Conn>> unnamed_;    // accepted, Hello not yet read
  std::deque<Request*> any_recvs_;                // P2P receives from kAnySource
  std::vector<PeerAddress> addr_cache_;

  FirstCause broken_;
};

}  // namespace shoal::transport::tcp
