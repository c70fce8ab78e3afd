// fuzz_tcp_stream — libFuzzer target: a real TcpTransport (one rank of 2, on
// loopback) reading what its peer sends: the handshake, then a stream of
// frames (headers, payloads, P2P messages nobody asked for yet, mismatches,
// EOF). Both ends of the handshake are exercised: the transport accepting
// (it reads a Hello) and the transport connecting (it reads an Accept).
//
// Input: a mode byte, a receive-plan byte, then the bytes to send. Mode bit
// 0: the target does its side of the handshake properly (a valid Hello or
// Accept with the job's secret) before the bytes, so that they are read as
// frames; else the bytes are the Hello or Accept. Bit 1: close the sending
// side when done (EOF). Bit 2: the transport is rank 0 and connects to the
// target, else it is rank 1 and the target connects. The plan posts up to
// four receives from the peer (collective or p2p, 0 to 1 KiB) first.
// Invariants: nothing crashes or leaks; a failure is one of shoal's errors;
// without a valid proof from the target no receive ever completes. (Each
// rejection is a line on stderr: run with -close_fd_mask=2, as `make
// test-fuzz` does.)
#include <netinet/in.h>
#include <poll.h>  // (POLLRDHUP needs _GNU_SOURCE, which g++ and clang++ define)
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/net.h"
#include "shoal/error.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_transport.h"

using namespace shoal;
using namespace shoal::transport;

namespace {

const auth::Secret& key() {
  static const auth::Secret k =
      auth::Secret::from_hex("0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0");
  return k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0], plan = data[1];
  data += 2;
  size -= 2;
  constexpr uint64_t kJob = 0xfeed;
  const bool proper = mode & 1, eof = mode & 2, transport_connects = mode & 4;
  const int me = transport_connects ? 0 : 1, peer = 1 - me;

  net::Fd listener;  // the target's, when the transport connects
  uint16_t port = 1;
  if (transport_connects) {
    listener = net::listen_tcp("127.0.0.1", 0);
    port = net::bound_port(listener.get());
  }
  tcp::TcpOptions o;
  o.rank = me;
  o.size = 2;
  o.job = kJob;
  o.secret = key();
  o.bind_host = "127.0.0.1";
  o.socket_buffer = 0;
  o.connect_timeout = std::chrono::seconds(5);
  struct FixedAddress : transport::Liveness {
    uint16_t port = 0;
    transport::PeerAddress address(int) override { return {"127.0.0.1", port, "fuzzer", "fuzzer", ""}; }
  } peers;
  peers.port = port;
  o.liveness = &peers;
  tcp::TcpTransport t(std::move(o));

  // Up to four receives from the peer, described by the plan byte (at least
  // one when the transport connects: a receive is what makes it connect).
  const int nrecv = std::max(plan & 3, transport_connects ? 1 : 0);
  std::vector<std::vector<uint8_t>> bufs(4);
  Request reqs[4];
  for (int i = 0; i < nrecv; ++i) {
    const int bits = (plan >> (2 + 2 * i)) & 3;
    bufs[i].resize(bits == 0 ? 0 : size_t{16} << (2 * bits));  // 0, 64, 256, 1024 bytes
    Request& r = reqs[i];
    r.kind = Request::Kind::kRecv;
    r.peer = peer;
    r.tag = Tag{bits & 1 ? Space::kP2P : Space::kCollective, static_cast<uint64_t>(i), 0};
    r.buf = bufs[i].data();
    r.len = bufs[i].size();
    r.fp.count = r.len;
  }

  // A peer may announce a P2P message of up to 16 GiB, which the rank then
  // buffers: an authenticated peer is trusted with that much memory, and the
  // fuzzer's machine has less. Lengths between 64 KiB and that limit are
  // clamped here, walking the frames as the transport does; larger ones are
  // kept (the transport refuses them before allocating).
  std::vector<uint8_t> bytes(data, data + size);
  if (proper) {
    for (size_t at = 0; at + sizeof(tcp::FrameHeader) <= bytes.size();) {
      uint64_t len;
      std::memcpy(&len, bytes.data() + at + offsetof(tcp::FrameHeader, length), sizeof(len));
      if (len > (uint64_t{64} << 10) && len <= (uint64_t{1} << 34)) {
        len &= 0xffff;
        std::memcpy(bytes.data() + at + offsetof(tcp::FrameHeader, length), &len, sizeof(len));
      }
      if (len > bytes.size()) break;
      at += sizeof(tcp::FrameHeader) + static_cast<size_t>(len);
    }
  }
  data = bytes.data();

  const auto deadline = net::Clock::now() + std::chrono::seconds(5);
  const transport::handshake::Identity target{kJob, peer, 2, &key()};
  try {
    for (int i = 0; i < nrecv; ++i) t.post_recv(&reqs[i]);  // (connects when the transport is rank 0)
    net::Fd s;
    if (transport_connects) {
      s = net::accept_tcp(listener.get());
      transport::handshake::Hello h;
      if (!s || !net::read_full(s.get(), &h, sizeof(h), deadline)) __builtin_trap();  // no hello from rank 0
      if (!transport::handshake::check_hello(h, target).empty()) __builtin_trap();  // a hello we refuse
      if (proper) {
        transport::handshake::Accept a = transport::handshake::make_accept(h, target);
        net::write_full(s.get(), &a, sizeof(a), deadline);
      }
    } else {
      s = net::connect_tcp("127.0.0.1", t.listen_port(), deadline);
      if (proper) {
        transport::handshake::Hello h = transport::handshake::make_hello(target, me);
        net::write_full(s.get(), &h, sizeof(h), deadline);
      }
    }
    linger lg{1, 0};  // close with a reset: no TIME_WAIT piling up over millions of runs
    ::setsockopt(s.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    // Loopback delivers within the call, so what is written is there to read.
    size_t sent = 0;
    if (size == 0 && eof) ::shutdown(s.get(), SHUT_WR);
    for (int rounds = 0; rounds < 64; ++rounds) {
      if (sent < size) {
        ssize_t n = ::send(s.get(), data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) sent += static_cast<size_t>(n);
        if (sent == size && eof) ::shutdown(s.get(), SHUT_WR);
      }
      t.poll();
      pollfd p{s.get(), POLLRDHUP, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) break;  // the transport closed it
      bool all = nrecv > 0;
      for (int i = 0; i < nrecv; ++i) all = all && reqs[i].complete;
      if (all || (sent == size && rounds > 8)) break;
    }
    if (!proper) {
      for (int i = 0; i < nrecv; ++i) {
        if (reqs[i].complete) __builtin_trap();  // data believed without a proof
      }
    }
  } catch (const Error&) {
    // A broken connection or a mismatch: the transport's business, not a bug.
  }
  for (int i = 0; i < nrecv; ++i) t.cancel(&reqs[i]);
  return 0;
}
