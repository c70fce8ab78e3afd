// transport/tcp/tcp_conn.h — one TCP connection to a peer (internal to tcp/).
//
// Owned by TcpTransport and touched only by its driving thread.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "transport/tcp/frame.h"

namespace shoal::transport::tcp {

// A P2P message that arrived before its receive was posted (only P2P
// messages are ever buffered; collective messages wait in the kernel).
struct Unexpected {
  FrameHeader hdr;
  std::vector<uint8_t> data;
};

struct Conn {
  static constexpr size_t kStageBytes = 64 << 10;

  int peer = -1;  // -1 for an accepted socket whose Hello is not read yet
  net::Fd fd;

  // Connection set-up (frame.h). Accepted sockets: the peer's address for
  // messages, and when an unfinished hello is given up. Connected ones: the
  // Hello sent, and the acceptor's answer while it is not verified yet.
  std::string from;
  Clock::time_point hello_deadline{};
  bool await_accept = false;  // no frame is read before the answer checks out
  handshake::Hello hello;
  handshake::Accept accept;
  size_t accept_have = 0;
  bool readable = true;
  bool writable = true;
  bool dead = false;            // closed; `dead_detail` says why
  std::string dead_detail;

  // Send side: the head of sendq is being written.
  std::deque<Request*> sendq;
  FrameHeader tx_hdr;
  size_t tx_hdr_done = 0;
  bool tx_started = false;

  // Receive side: bytes read ahead sit in stage[lo, hi).
  std::vector<uint8_t> stage = std::vector<uint8_t>(kStageBytes);
  size_t lo = 0, hi = 0;
  bool have_hdr = false;        // rx_hdr parsed, payload not fully consumed
  FrameHeader rx_hdr;
  Request* rx_target = nullptr; // where the payload goes
  std::deque<Request*> recvq;   // posted receives naming this peer

  // Buffering of P2P messages that arrive ahead of their receive.
  Request unexpected_req;
  std::unique_ptr<Unexpected> unexpected_cur;
  std::deque<Unexpected> unexpected;

  size_t staged() const { return hi - lo; }
  bool has_pending() const { return !sendq.empty() || !recvq.empty() || rx_target != nullptr; }
};

}  // namespace shoal::transport::tcp
