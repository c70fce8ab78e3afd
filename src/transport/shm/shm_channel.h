// transport/shm/shm_channel.h — one shared-memory channel to a peer on the
// same host (internal to shm/). Owned by ShmTransport and touched only by its
// driving thread.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/net.h"
#include "transport/handshake.h"
#include "transport/shm/shm_segment.h"

namespace shoal::transport::shm {

// A P2P message that arrived before its receive was posted. A kStream
// message is copied here; a kRts one stays in the sender's memory.
struct Unexpected {
  ShmFrame hdr;
  std::vector<uint8_t> data;
};

struct PeerChannel {
  int peer = -1;        // -1 for an accepted socket whose Hello is not read yet
  net::Fd sock;         // Unix socket: the handshake, doorbells, peer death
  void* map = nullptr;  // the mapped segment
  size_t map_bytes = 0;
  Segment seg;
  bool ready = false;   // segment mapped
  bool probed = false;  // process_vm_readv of the peer was tried
  uint64_t peer_pid = 0;
  bool peer_closed = false;  // its socket is closed; the rings may still hold messages
  bool dead = false;
  std::string dead_detail;

  // Connection set-up, side 0: the hello sent, and side 1's answer while it
  // is not verified yet (until then no frame of side 1 is read).
  bool await_accept = false;
  Clock::time_point hello_deadline{};  // side 1, accepted: when a missing hello is given up
  handshake::Hello hello;
  handshake::Accept accept;
  size_t accept_have = 0;

  // Send side: the head of sendq is being written into the ring.
  std::deque<Request*> sendq;
  size_t tx_hdr_done = 0;  // bytes of the head's ShmFrame written (0 or all)
  uint64_t next_cookie = 1;
  std::deque<std::pair<uint64_t, Request*>> rts_wait;  // kRts sends awaiting their FIN
  std::deque<uint64_t> fin_backlog;                    // FINs the full FinRing refused

  // Receive side.
  bool have_hdr = false;
  ShmFrame rx_hdr;
  Request* rx_target = nullptr;
  std::deque<Request*> recvq;  // posted receives naming this peer
  Request unexpected_req;
  std::unique_ptr<Unexpected> unexpected_cur;
  std::deque<Unexpected> unexpected;

  ~PeerChannel();
  bool has_pending() const {
    return !sendq.empty() || !recvq.empty() || !rts_wait.empty() || rx_target != nullptr;
  }
};

}  // namespace shoal::transport::shm
