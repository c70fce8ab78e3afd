// transport/shm/shm_connect.cc — the shared-memory transport's connections
// (shm_transport.h): a channel per peer, made by the lower rank's connect
// over a Unix socket with its ring in a memfd passed along, and the
// handshake that proves the job's secret both ways before a byte of the
// ring is believed.
#include <errno.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <sstream>

#include "shoal/error.h"
#include "transport/peer_slot.h"
#include "transport/shm/shm_channel.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_util.h"

namespace shoal::transport::shm {
using handshake::Accept;
using handshake::Hello;

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it (EINVAL): pages then fault on first use
#endif

// What of each ring is faulted in when the channel is made: the rest is
// faulted in by the first pass over it.
constexpr size_t kEagerRingBytes = size_t{64} << 10;

// Maps a channel's segment and faults in its header and the start of each
// ring, on both sides: small messages, what most channels carry, never take
// a page fault, and a channel never used for large ones does not pay to
// fault in its whole rings (2 x 1 MiB by default: about 1 ms of a core per
// channel on a VM, most of a job's connection time at a thousand ranks on a
// few cores). A large message's first pass over a page faults it in (a few
// microseconds per 4 KiB on a VM, once).
void* map_segment(int fd, size_t ring_bytes) {
  const size_t bytes = segment_bytes(ring_bytes);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return m;
  auto* base = static_cast<char*>(m);
  const size_t header = bytes - 2 * ring_bytes, eager = std::min(ring_bytes, kEagerRingBytes);
  (void)madvise(base, header + eager, MADV_POPULATE_WRITE);
  (void)madvise(base + header + ring_bytes, eager, MADV_POPULATE_WRITE);
  return m;
}

}  // namespace

handshake::Identity ShmTransport::identity() const {
  return {opts_.job, opts_.rank, opts_.size, &opts_.secret, auth::Link::kShm};
}

// ---- connections ---------------------------------------------------------

PeerChannel& ShmTransport::channel_for(int peer) {
  PeerChannel& c = peer_slot(peers_, peer, opts_.rank);
  if (c.dead) {
    fail(live_.lost(peer, describe_peer(peer), c.dead_detail));
  }
  if (!c.sock && !c.ready && peer > opts_.rank) connect_to(c);
  return c;
}

void ShmTransport::connect_to(PeerChannel& c) {
  auto lost = [&](const std::string& why) {
    fail(std::make_exception_ptr(
        PeerLost("cannot connect to " + describe_peer(c.peer) + " over shared memory: " + why, c.peer)));
  };
  learn_name(c.peer);
  net::Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) lost("socket: " + errno_text(errno));
  socklen_t len;
  sockaddr_un a = abstract_address(socket_name(opts_.job, c.peer), &len);
  // The peer listens before it publishes its address, so it is there; a
  // full backlog (EAGAIN) is the only reason to try again.
  for (int tries = 0;; ++tries) {
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), len) == 0) break;
    if ((errno == EAGAIN || errno == EINTR) && tries < 1000) {
      usleep(1000);
      continue;
    }
    // Refused: the peer's socket is gone with its process. Through lost(),
    // which names the first culprit when the peer only left because another
    // rank failed.
    std::string why = "cannot connect over shared memory: connect(@" + socket_name(opts_.job, c.peer) +
                      "): " + errno_text(errno);
    fail(live_.lost(c.peer, describe_peer(c.peer), why));
  }
  ucred cred{};
  socklen_t cl = sizeof(cred);
  if (getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) lost("SO_PEERCRED: " + errno_text(errno));
  if (cred.uid != getuid()) {
    lost("@" + socket_name(opts_.job, c.peer) + " is held by another user (uid " + std::to_string(cred.uid) + ")");
  }
  c.peer_pid = static_cast<uint64_t>(cred.pid);

  // The segment: an anonymous memory file, named for debugging only.
  char name[64];
  std::snprintf(name, sizeof(name), "shoal-%016" PRIx64 "-%d-%d", opts_.job, opts_.rank, c.peer);
  net::Fd mfd(memfd_create(name, MFD_CLOEXEC));
  if (!mfd) lost("memfd_create: " + errno_text(errno));
  size_t bytes = segment_bytes(opts_.ring_bytes);
  if (ftruncate(mfd.get(), static_cast<off_t>(bytes)) != 0) lost("ftruncate: " + errno_text(errno));
  void* m = map_segment(mfd.get(), opts_.ring_bytes);
  if (m == MAP_FAILED) lost("mmap: " + errno_text(errno));
  c.map = m;
  c.map_bytes = bytes;
  Header* h = new (m) Header();
  h->job = opts_.job;
  h->ring_bytes = opts_.ring_bytes;
  h->side[0].pid.store(static_cast<uint64_t>(getpid()));
  h->side[0].seg_addr.store(reinterpret_cast<uint64_t>(m));
  c.seg = Segment(m, opts_.ring_bytes, 0);

  Hello hello = handshake::make_hello(identity(), c.peer, bytes);
  iovec iov{&hello, sizeof(hello)};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  int fd = mfd.get();
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  ssize_t n;
  do {
    n = ::sendmsg(s.get(), &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(hello))) {
    const int e = errno;
    // The peer closed its listener between our connect and this send: it
    // has exited, which is a lost peer like a refused connection.
    if (e == EPIPE || e == ECONNRESET) {
      fail(live_.lost(c.peer, describe_peer(c.peer),
                      "cannot connect over shared memory: sending the hello: " + errno_text(e)));
    }
    lost("sending the hello: " + errno_text(e));
  }

  net::set_nonblocking(s.get(), true);
  c.sock = std::move(s);
  c.ready = true;
  c.hello = hello;
  c.await_accept = true;  // frames of side 1 wait for its answer (read_accept)
  c.accept_have = 0;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = &c;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c.sock.get(), &ev);
  active_.push_back(&c);
}

void ShmTransport::accept_all() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    if (unnamed_.size() >= 64 + static_cast<size_t>(opts_.size)) {
      std::fprintf(stderr, "shoal: rank %d: rejected a shared-memory connection: %zu are mid-hello already\n",
                   opts_.rank, unnamed_.size());
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<PeerChannel>();
    c->sock.reset(fd);
    c->hello_deadline = Clock::now() + std::chrono::seconds(10);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c.get();
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    PeerChannel* raw = c.get();
    unnamed_.push_back(std::move(c));
    read_hello(*raw);
  }
}

// Reads the Hello (and the segment's fd) of an accepted socket; on success
// moves it into the peer's slot. Returns true if it was adopted.
bool ShmTransport::read_hello(PeerChannel& c) {
  auto reject = [&](const std::string& why) {
    ucred who{};
    socklen_t wl = sizeof(who);
    std::string from = "an unknown process";
    if (c.sock && getsockopt(c.sock.get(), SOL_SOCKET, SO_PEERCRED, &who, &wl) == 0) {
      from = "pid " + std::to_string(who.pid) + " (uid " + std::to_string(who.uid) + ")";
    }
    std::fprintf(stderr, "shoal: rank %d: rejected a shared-memory connection from %s: %s\n", opts_.rank,
                 from.c_str(), why.c_str());
    c.dead = true;
    c.sock.reset();
    return false;
  };
  Hello h;
  iovec iov{&h, sizeof(h)};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  ssize_t n = ::recvmsg(c.sock.get(), &msg, MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  net::Fd mfd;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        if (i == 0 && !mfd) {
          mfd.reset(fd);
        } else {
          ::close(fd);
        }
      }
    }
  }
  if (n <= 0) return reject(n == 0 ? "closed before its hello" : errno_text(errno));
  if (n != static_cast<ssize_t>(sizeof(h))) {
    const std::string bad = handshake::check_hello_prefix(reinterpret_cast<const uint8_t*>(&h), static_cast<size_t>(n));
    return reject(bad.empty() ? "not a shoal hello (" + std::to_string(n) + " bytes)" : bad);
  }
  if (std::string bad = handshake::check_hello(h, identity()); !bad.empty()) return reject(bad);
  ucred cred{};
  socklen_t cl = sizeof(cred);
  if (getsockopt(c.sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != getuid()) {
    return reject("it is not from this user");
  }
  if (!mfd) return reject("no segment attached");
  struct stat st {};
  size_t bytes = segment_bytes(opts_.ring_bytes);
  if (fstat(mfd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes || h.extra != bytes) {
    return reject("segment of the wrong size");
  }
  void* m = map_segment(mfd.get(), opts_.ring_bytes);
  if (m == MAP_FAILED) return reject("mmap: " + errno_text(errno));
  auto* hdr = static_cast<Header*>(m);
  if (hdr->magic != kSegMagic || hdr->job != opts_.job || hdr->ring_bytes != opts_.ring_bytes) {
    munmap(m, bytes);
    return reject("bad segment header");
  }
  int peer = static_cast<int>(h.rank);
  auto& slot = peers_[peer];
  if (slot && (slot->ready || slot->dead)) {
    munmap(m, bytes);
    return reject("rank " + std::to_string(peer) + " is already connected");
  }
  // The answer goes first on the socket (before any doorbell), whole. If
  // the peer has exited meanwhile (EPIPE), what it wrote into the rings is
  // still its own, proved by the hello: the channel is adopted all the same,
  // and drains before it reports the peer gone.
  const Accept answer = handshake::make_accept(h, identity());
  ssize_t w;
  do {
    w = ::send(c.sock.get(), &answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (w < 0 && errno == EINTR);
  (void)w;
  auto it = std::find_if(unnamed_.begin(), unnamed_.end(), [&](auto& p) { return p.get() == &c; });
  std::unique_ptr<PeerChannel> owned = std::move(*it);
  unnamed_.erase(it);
  if (!slot) {
    slot = std::make_unique<PeerChannel>();
    slot->peer = peer;
  }
  PeerChannel& ch = *slot;
  ch.sock = std::move(owned->sock);
  ch.map = m;
  ch.map_bytes = bytes;
  ch.seg = Segment(m, opts_.ring_bytes, 1);
  ch.peer_pid = static_cast<uint64_t>(cred.pid);
  hdr->side[1].pid.store(static_cast<uint64_t>(getpid()));
  hdr->side[1].seg_addr.store(reinterpret_cast<uint64_t>(m), std::memory_order_release);
  ch.ready = true;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = &ch;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, ch.sock.get(), &ev);
  active_.push_back(&ch);
  learn_name(peer);
  progress(ch);
  return true;
}

// Side 0: reads side 1's answer from the socket (no byte past it) and checks
// its proof. Returns true once it has; a bad or missing answer is a
// connection error.
bool ShmTransport::read_accept(PeerChannel& c) {
  auto* buf = reinterpret_cast<uint8_t*>(&c.accept);
  while (c.accept_have < sizeof(Accept)) {
    ssize_t n = ::recv(c.sock.get(), buf + c.accept_have, sizeof(Accept) - c.accept_have, MSG_DONTWAIT);
    if (n > 0) {
      c.accept_have += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return false;
    } else {
      on_conn_error(c, n == 0 ? "connection closed by the peer before it answered this rank's hello (see the "
                                "peer's log: a different SHOAL_SECRET, or not a rank of this job)"
                              : "socket error: " + errno_text(errno));
      return false;
    }
  }
  if (std::string why = handshake::check_accept(c.accept, c.hello, identity()); !why.empty()) {
    std::fprintf(stderr, "shoal: rank %d: rejected the shared-memory answer of %s: %s\n", opts_.rank,
                 describe_peer(c.peer).c_str(), why.c_str());
    on_conn_error(c, "its answer to this rank's hello was refused: " + why);
    return false;
  }
  c.await_accept = false;
  return true;
}

// Tries to read the peer's memory; if the kernel allows it, the peer may
// send this side single-copy (kRts) messages from now on.
void ShmTransport::probe(PeerChannel& c) {
  if (opts_.cma_bytes == 0) {
    c.probed = true;
    return;
  }
  SideInfo& other = c.seg.hdr()->side[c.seg.other()];
  uint64_t addr = other.seg_addr.load(std::memory_order_acquire);
  if (addr == 0) return;  // the peer has not mapped the segment yet
  c.probed = true;
  uint32_t word = 0;
  iovec local{&word, sizeof(word)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(word)};
  ssize_t n = process_vm_readv(static_cast<pid_t>(c.peer_pid), &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(sizeof(word)) && word == kSegMagic) {
    c.seg.hdr()->side[c.seg.side()].can_read_peer.store(1, std::memory_order_release);
  }
}

}  // namespace shoal::transport::shm
