// transport/shm/shm_transport.cc — see shm_transport.h for the contract.
#include "transport/shm/shm_transport.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
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
#include "transport/matching.h"
#include "transport/shm/shm_channel.h"

namespace shoal::transport::shm {
namespace {

constexpr int kMaxEvents = 64;
// Polls between two looks at the sockets (accepts, doorbells, deaths) while
// spinning on the rings.
constexpr unsigned kEventEvery = 128;

std::string errno_text(int e) { return std::string(strerror(e)); }

size_t round_pow2(size_t n) {
  size_t p = 4096;
  while (p < n) p <<= 1;
  return p;
}

sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

// What both proofs of a channel's handshake are about (auth.h).
auth::Transcript transcript(const Hello& h) {
  auth::Transcript t;
  t.link = auth::Link::kShm;
  t.job = h.job;
  t.from = h.rank;
  t.to = h.to;
  t.size = h.size;
  std::memcpy(t.connector.data(), h.nonce, sizeof(h.nonce));
  return t;
}

}  // namespace

Channel::~Channel() {
  if (map) munmap(map, map_bytes);
}

std::string ShmTransport::socket_name(uint64_t job, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shoal/%016" PRIx64 "/%d", job, rank);
  return buf;
}

ShmTransport::ShmTransport(ShmOptions opts) : opts_(std::move(opts)) {
  opts_.ring_bytes = round_pow2(opts_.ring_bytes);
  peers_.resize(opts_.size);
  names_.resize(opts_.size);
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) throw InternalError("epoll_create1: " + errno_text(errno));
  wake_fd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_) throw InternalError("eventfd: " + errno_text(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &wake_fd_;
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
  if (opts_.size > 1) {
    listen_fd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!listen_fd_) throw InternalError("socket(AF_UNIX): " + errno_text(errno));
    socklen_t len;
    sockaddr_un a = abstract_address(socket_name(opts_.job, opts_.rank), &len);
    if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_fd_.get(), 1024) != 0) {
      throw InternalError("shm: cannot listen on @" + socket_name(opts_.job, opts_.rank) + ": " +
                          errno_text(errno));
    }
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  }
}

ShmTransport::~ShmTransport() { close_all(); }

bool ShmTransport::heard_from(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || !peers_[peer]) return false;
  const Channel& c = *peers_[peer];
  return c.sock || c.ready || c.dead || c.peer_closed;
}

std::string ShmTransport::describe_peer(int peer) const {
  std::ostringstream o;
  o << "rank " << peer;
  if (peer >= 0 && peer < opts_.size && !names_[peer].empty()) {
    o << " (" << names_[peer] << ", shared memory)";
  } else {
    o << " (shared memory)";
  }
  return o.str();
}

// ---- failure -------------------------------------------------------------

std::exception_ptr ShmTransport::broken() const { return broken_.get(); }

void ShmTransport::abort(std::exception_ptr cause) {
  broken_.keep(cause);
  wake();
}

void ShmTransport::fail(std::exception_ptr cause) {
  std::exception_ptr first = broken_.keep(cause);
  if (!closed_) {
    closed_ = true;
    if (opts_.on_break) {
      try {
        opts_.on_break(first);
      } catch (...) {
        // Publishing the cause is best effort; the local error stands.
      }
    }
    close_all();
  }
  std::rethrow_exception(first);
}

void ShmTransport::check_broken() {
  if (broken_.set()) fail(broken());
}

void ShmTransport::close_all() {
  for (auto& c : peers_) {
    if (c && c->map) c->seg.hdr()->side[c->seg.side()].broken.store(1, std::memory_order_seq_cst);
  }
  for (auto& c : peers_) {
    if (c && c->sock) {
      ::shutdown(c->sock.get(), SHUT_RDWR);
      c->sock.reset();
    }
  }
  unnamed_.clear();
  active_.clear();
  listen_fd_.reset();
}

// The peer closed its socket: it exited, normally or not. Messages it wrote
// before are still in the rings; the channel dies once they are taken, or at
// once if something posted here can no longer complete.
void ShmTransport::on_peer_closed(Channel& c) {
  c.peer_closed = true;
  c.sock.reset();
  progress(c);
  check_closed(c);
}

void ShmTransport::check_closed(Channel& c) {
  if (!c.peer_closed || c.dead) return;
  bool drained = !c.have_hdr && c.seg.rx_avail() == 0;
  bool stuck = !c.sendq.empty() || !c.rts_wait.empty() || c.rx_target != nullptr ||
               (drained && (!c.recvq.empty() || !any_recvs_.empty()));
  if (stuck) {
    on_conn_error(c, "connection closed by the peer");
  } else if (drained) {
    c.dead = true;
    c.dead_detail = "connection closed by the peer";
    active_.erase(std::remove(active_.begin(), active_.end(), &c), active_.end());
  }
}

void ShmTransport::on_conn_error(Channel& c, const std::string& detail) {
  if (c.peer < 0) {
    c.dead = true;
    c.sock.reset();
    return;
  }
  c.dead = true;
  c.dead_detail = detail;
  c.sock.reset();
  active_.erase(std::remove(active_.begin(), active_.end(), &c), active_.end());
  if (c.has_pending() || !any_recvs_.empty()) {
    if (names_[c.peer].empty() && opts_.peer_name) {
      try {
        names_[c.peer] = opts_.peer_name(c.peer);
      } catch (...) {
      }
    }
    fail(opts_.on_lost ? opts_.on_lost(c.peer, detail)
                       : std::make_exception_ptr(PeerLost(
                             "peer lost: " + describe_peer(c.peer) + ": " + detail, c.peer)));
  }
}

// ---- connections ---------------------------------------------------------

Channel& ShmTransport::channel_for(int peer) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank) {
    throw InvalidArgument("peer: rank " + std::to_string(peer) + " is not another rank of a " +
                          std::to_string(opts_.size) + "-rank communicator (this is rank " +
                          std::to_string(opts_.rank) + ")");
  }
  auto& slot = peers_[peer];
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->peer = peer;
  }
  Channel& c = *slot;
  if (c.dead) {
    fail(opts_.on_lost ? opts_.on_lost(peer, c.dead_detail)
                       : std::make_exception_ptr(PeerLost(
                             "peer lost: " + describe_peer(peer) + ": " + c.dead_detail, peer)));
  }
  if (!c.sock && !c.ready && peer > opts_.rank) connect_to(c);
  return c;
}

void ShmTransport::connect_to(Channel& c) {
  auto lost = [&](const std::string& why) {
    fail(std::make_exception_ptr(
        PeerLost("cannot connect to " + describe_peer(c.peer) + " over shared memory: " + why, c.peer)));
  };
  if (opts_.peer_name && names_[c.peer].empty()) names_[c.peer] = opts_.peer_name(c.peer);
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
    // Refused: the peer's socket is gone with its process. Through on_lost,
    // which names the first culprit when the peer only left because another
    // rank failed.
    std::string why = "cannot connect over shared memory: connect(@" + socket_name(opts_.job, c.peer) +
                      "): " + errno_text(errno);
    if (opts_.on_lost) fail(opts_.on_lost(c.peer, why));
    lost(why);
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
  // Populated: otherwise every first pass of a ring over a page costs both
  // sides a page fault (several microseconds on a VM, per 4 KiB of messages).
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd.get(), 0);
  if (m == MAP_FAILED) lost("mmap: " + errno_text(errno));
  c.map = m;
  c.map_bytes = bytes;
  Header* h = new (m) Header();
  h->job = opts_.job;
  h->ring_bytes = opts_.ring_bytes;
  h->side[0].pid.store(static_cast<uint64_t>(getpid()));
  h->side[0].seg_addr.store(reinterpret_cast<uint64_t>(m));
  c.seg = Segment(m, opts_.ring_bytes, 0);

  Hello hello;
  hello.job = opts_.job;
  hello.rank = static_cast<uint32_t>(opts_.rank);
  hello.size = static_cast<uint32_t>(opts_.size);
  hello.seg_bytes = bytes;
  hello.to = static_cast<uint32_t>(c.peer);
  auth::Nonce nonce = auth::fresh_nonce();
  std::memcpy(hello.nonce, nonce.data(), nonce.size());
  auth::Mac mac = auth::prove(opts_.secret, auth::Role::kConnector, transcript(hello));
  std::memcpy(hello.mac, mac.data(), mac.size());
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
    if ((e == EPIPE || e == ECONNRESET) && opts_.on_lost) {
      fail(opts_.on_lost(c.peer, "cannot connect over shared memory: sending the hello: " + errno_text(e)));
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
    auto c = std::make_unique<Channel>();
    c->sock.reset(fd);
    c->hello_deadline = Clock::now() + std::chrono::seconds(10);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c.get();
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev);
    Channel* raw = c.get();
    unnamed_.push_back(std::move(c));
    read_hello(*raw);
  }
}

// Reads the Hello (and the segment's fd) of an accepted socket; on success
// moves it into the peer's slot. Returns true if it was adopted.
bool ShmTransport::read_hello(Channel& c) {
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
  if (n != static_cast<ssize_t>(sizeof(h)) || h.magic != kHelloMagic) return reject("not a shoal hello");
  if (h.version != kVersion) return reject("protocol version " + std::to_string(h.version));
  if (h.job != opts_.job) return reject("it belongs to another job or communicator");
  if (h.size != static_cast<uint32_t>(opts_.size) || h.rank >= h.size ||
      static_cast<int>(h.rank) >= opts_.rank) {
    return reject("bad rank " + std::to_string(h.rank) + " of " + std::to_string(h.size));
  }
  if (h.to != static_cast<uint32_t>(opts_.rank)) return reject("it means to reach rank " + std::to_string(h.to));
  if (!auth::verify(opts_.secret, auth::Role::kConnector, transcript(h), h.mac)) {
    return reject("it did not prove the job's secret (a different SHOAL_SECRET, or not a rank of this job)");
  }
  ucred cred{};
  socklen_t cl = sizeof(cred);
  if (getsockopt(c.sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != getuid()) {
    return reject("it is not from this user");
  }
  if (!mfd) return reject("no segment attached");
  struct stat st {};
  size_t bytes = segment_bytes(opts_.ring_bytes);
  if (fstat(mfd.get(), &st) != 0 || static_cast<size_t>(st.st_size) != bytes || h.seg_bytes != bytes) {
    return reject("segment of the wrong size");
  }
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd.get(), 0);
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
  Accept answer;
  auth::Transcript t = transcript(h);
  t.acceptor = auth::fresh_nonce();
  std::memcpy(answer.nonce, t.acceptor.data(), t.acceptor.size());
  auth::Mac mac = auth::prove(opts_.secret, auth::Role::kAcceptor, t);
  std::memcpy(answer.mac, mac.data(), mac.size());
  ssize_t w;
  do {
    w = ::send(c.sock.get(), &answer, sizeof(answer), MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (w < 0 && errno == EINTR);
  (void)w;
  auto it = std::find_if(unnamed_.begin(), unnamed_.end(), [&](auto& p) { return p.get() == &c; });
  std::unique_ptr<Channel> owned = std::move(*it);
  unnamed_.erase(it);
  if (!slot) {
    slot = std::make_unique<Channel>();
    slot->peer = peer;
  }
  Channel& ch = *slot;
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
  if (opts_.peer_name && names_[peer].empty()) {
    try {
      names_[peer] = opts_.peer_name(peer);
    } catch (...) {
    }
  }
  progress(ch);
  return true;
}

// Side 0: reads side 1's answer from the socket (no byte past it) and checks
// its proof. Returns true once it has; a bad or missing answer is a
// connection error.
bool ShmTransport::read_accept(Channel& c) {
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
  auth::Transcript t = transcript(c.hello);
  std::memcpy(t.acceptor.data(), c.accept.nonce, sizeof(c.accept.nonce));
  if (c.accept.magic != kAcceptMagic || c.accept.version != kVersion ||
      !auth::verify(opts_.secret, auth::Role::kAcceptor, t, c.accept.mac)) {
    std::string why = "it did not prove the job's secret (a different SHOAL_SECRET, or not a rank of this job)";
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
void ShmTransport::probe(Channel& c) {
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

// ---- posting -------------------------------------------------------------

void ShmTransport::post_send(Request* r) {
  check_broken();
  if (r->len > 0 && r->buf == nullptr) throw InvalidArgument("buffer: null with non-zero size");
  Channel& c = channel_for(r->peer);
  r->done = 0;
  r->complete = false;
  c.sendq.push_back(r);
  if (c.ready && c.sendq.size() == 1) try_write(c);
  check_closed(c);
}

// A P2P message buffered while no receive matched has arrived whole. A
// receive posted meanwhile (while it was still streaming in) takes it now;
// otherwise it waits in `unexpected`.
void ShmTransport::file_unexpected(Channel& c) {
  c.unexpected.push_back(std::move(*c.unexpected_cur));
  c.unexpected_cur.reset();
  const Tag tag = c.unexpected.back().hdr.tag();
  Request* r = take_posted(c.recvq, tag);
  if (!r) r = take_posted(any_recvs_, tag);
  if (r) take_unexpected(c, r);
}

bool ShmTransport::take_unexpected(Channel& c, Request* r) {
  for (auto it = c.unexpected.begin(); it != c.unexpected.end(); ++it) {
    if (!(it->hdr.tag() == r->tag)) continue;
    if (it->hdr.length != r->len) fail(size_mismatch(describe_peer(c.peer), r->tag, r->len, it->hdr.length));
    ShmFrame h = it->hdr;
    r->source = c.peer;
    if (h.kind == static_cast<uint8_t>(FrameKind::kRts)) {
      c.unexpected.erase(it);
      read_rts(c, r, h);
    } else {
      if (r->len) std::memcpy(r->buf, it->data.data(), r->len);
      r->done = r->len;
      r->complete = true;
      c.unexpected.erase(it);
    }
    return true;
  }
  return false;
}

void ShmTransport::post_recv(Request* r) {
  check_broken();
  if (r->len > 0 && r->buf == nullptr) throw InvalidArgument("buffer: null with non-zero size");
  r->done = 0;
  r->complete = false;
  r->source = -1;
  if (r->peer == kAnySource) {
    if (r->tag.space != Space::kP2P) throw InvalidArgument("peer: any-source is for p2p receives");
    for (auto& c : peers_) {
      if (c && c->ready && take_unexpected(*c, r)) return;
    }
    any_recvs_.push_back(r);
    for (int p = opts_.rank + 1; p < opts_.size; ++p) {
      if (opts_.is_local && opts_.is_local(p)) channel_for(p);
    }
    for (size_t i = 0; i < active_.size(); ++i) try_read(*active_[i]);
    return;
  }
  if (r->tag.space == Space::kP2P && r->peer >= 0 && r->peer < opts_.size && peers_[r->peer] &&
      peers_[r->peer]->ready && take_unexpected(*peers_[r->peer], r)) {
    return;  // (also from a peer that has exited since)
  }
  Channel& c = channel_for(r->peer);
  c.recvq.push_back(r);
  if (c.ready) try_read(c);
  check_closed(c);
}

bool ShmTransport::cancel(Request* r) {
  if (r->peer == kAnySource) return erase_posted(any_recvs_, r);
  if (r->peer < 0 || r->peer >= opts_.size || !peers_[r->peer]) return false;
  return erase_posted(peers_[r->peer]->recvq, r);
}

// ---- progress ------------------------------------------------------------

void ShmTransport::ring_doorbell(Channel& c) {
  if (!c.seg.take_peer_sleeping() || !c.sock) return;
  char b = 1;
  ssize_t n = ::send(c.sock.get(), &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)n;  // a full socket already holds a doorbell; a dead one shows in epoll
}

void ShmTransport::send_fin(Channel& c, uint64_t cookie) {
  if (c.fin_backlog.empty() && c.seg.fin_push(cookie)) {
    ring_doorbell(c);
  } else {
    c.fin_backlog.push_back(cookie);
  }
}

bool ShmTransport::reap_fins(Channel& c) {
  bool moved = false;
  while (!c.fin_backlog.empty() && c.seg.fin_push(c.fin_backlog.front())) {
    c.fin_backlog.pop_front();
    moved = true;
  }
  uint64_t cookie;
  while (c.seg.fin_pop(&cookie)) {
    moved = true;
    auto it = std::find_if(c.rts_wait.begin(), c.rts_wait.end(),
                           [&](const auto& p) { return p.first == cookie; });
    if (it == c.rts_wait.end()) {
      on_conn_error(c, "an acknowledgement for a message never sent");
      return true;
    }
    it->second->done = it->second->len;
    it->second->complete = true;
    c.rts_wait.erase(it);
  }
  if (moved) ring_doorbell(c);
  return moved;
}

bool ShmTransport::try_write(Channel& c) {
  bool moved = false;
  while (!c.sendq.empty()) {
    Request* r = c.sendq.front();
    if (c.tx_hdr_done == 0) {
      if (c.seg.tx_space() < sizeof(ShmFrame)) break;
      ShmFrame f;
      f.space = static_cast<uint8_t>(r->tag.space);
      f.step = r->tag.step;
      f.ctx = r->tag.ctx;
      f.seq = r->tag.seq;
      f.length = r->len;
      f.fp = r->fp;
      bool rts = opts_.cma_bytes > 0 && r->len >= opts_.cma_bytes &&
                 c.seg.hdr()->side[c.seg.other()].can_read_peer.load(std::memory_order_acquire);
      if (rts) {
        f.kind = static_cast<uint8_t>(FrameKind::kRts);
        f.addr = reinterpret_cast<uint64_t>(r->buf);
        f.cookie = c.next_cookie++;
        c.rts_wait.emplace_back(f.cookie, r);
        c.seg.tx_write(&f, sizeof(f));
        c.sendq.pop_front();
        moved = true;
        continue;
      }
      f.kind = static_cast<uint8_t>(FrameKind::kStream);
      c.seg.tx_write(&f, sizeof(f));
      c.tx_hdr_done = sizeof(f);
      moved = true;
    }
    size_t left = r->len - r->done;
    size_t n = std::min(left, c.seg.tx_space());
    if (n > 0) {
      c.seg.tx_write(static_cast<const char*>(r->buf) + r->done, n);
      r->done += n;
      moved = true;
    }
    if (r->done < r->len) break;
    r->complete = true;
    c.sendq.pop_front();
    c.tx_hdr_done = 0;
  }
  if (moved) ring_doorbell(c);
  return moved;
}

bool ShmTransport::match(Channel& c) {
  const ShmFrame& h = c.rx_hdr;
  const Tag tag = h.tag();
  Request* found = take_posted(c.recvq, tag);
  if (!found && tag.space == Space::kP2P) found = take_posted(any_recvs_, tag);
  const Arrival m{c.peer, tag, h.fp, h.length};
  auto name = [this](int p) { return describe_peer(p); };
  if (found) {
    if (auto e = check_matched(*found, m, opts_.describe_fp, name)) fail(e);
    found->source = c.peer;
    c.rx_target = found;
    return true;
  }
  if (tag.space == Space::kP2P) {
    // Buffer it (a kRts message stays where it is) so that later messages
    // from this peer are not held up.
    if (h.length > (size_t{1} << 34)) {
      on_conn_error(c, "a p2p message of " + std::to_string(h.length) + " bytes");
      return false;
    }
    c.unexpected_cur = std::make_unique<Unexpected>();
    c.unexpected_cur->hdr = h;
    if (h.kind == static_cast<uint8_t>(FrameKind::kStream)) c.unexpected_cur->data.resize(h.length);
    c.unexpected_req.buf = c.unexpected_cur->data.data();
    c.unexpected_req.len = c.unexpected_cur->data.size();
    c.unexpected_req.done = 0;
    c.unexpected_req.complete = false;
    c.rx_target = &c.unexpected_req;
    return true;
  }
  // A collective message nobody has asked for yet: it waits at the head of
  // the ring, unless the ranks disagree on the sequence of collectives.
  if (auto e = check_order(c.recvq, m, opts_.describe_fp, name)) fail(e);
  return false;
}

void ShmTransport::read_rts(Channel& c, Request* r, const ShmFrame& h) {
  size_t done = 0;
  while (done < h.length) {
    iovec local{static_cast<char*>(r->buf) + done, h.length - done};
    iovec remote{reinterpret_cast<void*>(h.addr + done), h.length - done};
    ssize_t n = process_vm_readv(static_cast<pid_t>(c.peer_pid), &local, 1, &remote, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // The peer is gone (or its buffer is): the message cannot be delivered.
      std::string detail = std::string("reading its buffer (process_vm_readv): ") +
                           (n < 0 ? errno_text(errno) : "no progress");
      c.dead = true;
      c.dead_detail = detail;
      fail(opts_.on_lost ? opts_.on_lost(c.peer, detail)
                         : std::make_exception_ptr(PeerLost(
                               "peer lost: " + describe_peer(c.peer) + ": " + detail, c.peer)));
    }
    done += static_cast<size_t>(n);
  }
  // Read first, then check: if the sender had not broken by now, its buffer
  // was valid for the whole read.
  if (c.seg.hdr()->side[c.seg.other()].broken.load(std::memory_order_seq_cst)) {
    c.dead = true;
    c.dead_detail = "it failed while this rank read its message";
    fail(opts_.on_lost ? opts_.on_lost(c.peer, c.dead_detail)
                       : std::make_exception_ptr(PeerLost(
                             "peer lost: " + describe_peer(c.peer) + ": " + c.dead_detail, c.peer)));
  }
  r->done = h.length;
  r->complete = true;
  send_fin(c, h.cookie);
}

bool ShmTransport::try_read(Channel& c) {
  if (c.await_accept) return false;  // side 1 has not proved the secret yet
  bool moved = false, consumed = false;
  while (c.ready) {
    if (!c.have_hdr) {
      if (c.seg.rx_avail() < sizeof(ShmFrame)) break;
      c.seg.rx_read(&c.rx_hdr, sizeof(ShmFrame));
      consumed = moved = true;
      uint8_t k = c.rx_hdr.kind;
      if (c.rx_hdr.magic != kFrameMagic || c.rx_hdr.space > 1 ||
          (k != static_cast<uint8_t>(FrameKind::kStream) && k != static_cast<uint8_t>(FrameKind::kRts))) {
        on_conn_error(c, "malformed frame in the shared ring");
        return true;
      }
      c.have_hdr = true;
      c.rx_target = nullptr;
    }
    if (!c.rx_target && !match(c)) break;  // parked until a receive matches
    Request* r = c.rx_target;
    moved = true;
    if (c.rx_hdr.kind == static_cast<uint8_t>(FrameKind::kRts)) {
      c.have_hdr = false;
      c.rx_target = nullptr;
      if (r == &c.unexpected_req) {
        file_unexpected(c);
      } else {
        read_rts(c, r, c.rx_hdr);
      }
      continue;
    }
    size_t left = r->len - r->done;
    size_t n = std::min(left, c.seg.rx_avail());
    if (n > 0) {
      c.seg.rx_read(static_cast<char*>(r->buf) + r->done, n);
      r->done += n;
      consumed = true;
    }
    if (r->done < r->len) break;
    c.have_hdr = false;
    c.rx_target = nullptr;
    if (r == &c.unexpected_req) {
      file_unexpected(c);
    } else {
      r->complete = true;
    }
  }
  if (consumed) ring_doorbell(c);
  return moved;
}

bool ShmTransport::progress(Channel& c) {
  if (!c.ready || c.dead) return false;
  if (!c.probed) probe(c);
  bool moved = reap_fins(c);
  moved |= try_write(c);
  moved |= try_read(c);
  if (c.peer_closed && !moved) check_closed(c);
  return moved;
}

int ShmTransport::handle_events(int timeout_ms) {
  epoll_event evs[kMaxEvents];
  int n = epoll_wait(epoll_fd_.get(), evs, kMaxEvents, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    throw InternalError("epoll_wait: " + errno_text(errno));
  }
  for (int i = 0; i < n; ++i) {
    void* p = evs[i].data.ptr;
    if (p == &wake_fd_) {
      uint64_t v;
      while (::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
      }
      continue;
    }
    if (p == &listen_fd_) {
      if (listen_fd_) accept_all();
      continue;
    }
    Channel* c = static_cast<Channel*>(p);
    if (c->dead || !c->sock) continue;
    if (c->peer < 0) {
      read_hello(*c);
      continue;
    }
    if (c->await_accept && !read_accept(*c)) continue;
    // Doorbells carry no data: drain them; EOF or an error is the peer's end.
    char buf[256];
    for (;;) {
      ssize_t k = ::recv(c->sock.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (k > 0) continue;
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (k == 0 || errno == ECONNRESET) {  // (reset: it left doorbells unread)
        on_peer_closed(*c);
      } else {
        on_conn_error(*c, "socket error: " + errno_text(errno));
      }
      break;
    }
    if (!c->dead && c->sock) progress(*c);
  }
  for (auto& c : unnamed_) {  // a hello comes with the connection; a stranger may not linger
    if (!c->dead && Clock::now() >= c->hello_deadline) {
      std::fprintf(stderr, "shoal: rank %d: rejected a shared-memory connection: no hello within 10 s\n", opts_.rank);
      c->dead = true;
      c->sock.reset();
    }
  }
  unnamed_.erase(std::remove_if(unnamed_.begin(), unnamed_.end(), [](auto& c) { return c->dead; }),
                 unnamed_.end());
  return n;
}

bool ShmTransport::poll() {
  check_broken();
  bool moved = false;
  for (size_t i = 0; i < active_.size(); ++i) moved |= progress(*active_[i]);
  if (events_due_ || (++poll_count_ % kEventEvery) == 0 || active_.empty()) {
    events_due_ = false;
    moved |= handle_events(0) > 0;
  }
  check_broken();
  return moved;
}

bool ShmTransport::arm() {
  events_due_ = true;
  for (Channel* c : active_) c->seg.set_sleeping();
  bool moved = false;
  for (size_t i = 0; i < active_.size(); ++i) moved |= progress(*active_[i]);
  return !moved;
}

std::string ShmTransport::pending_summary(Request* const* reqs, size_t n) const {
  std::ostringstream o;
  bool first = true;
  for (size_t i = 0; i < n; ++i) {
    const Request* r = reqs[i];
    if (r->complete) continue;
    if (!first) o << "; ";
    first = false;
    if (r->kind == Request::Kind::kSend) {
      o << "send to " << describe_peer(r->peer);
    } else {
      o << "receive from " << (r->peer == kAnySource ? "any rank" : describe_peer(r->peer));
    }
    o << " (" << describe_tag(r->tag) << ", " << r->done << " of " << r->len << " bytes)";
    if (r->peer >= 0 && r->peer < opts_.size && peers_[r->peer]) {
      const Channel& c = *peers_[r->peer];
      o << " [channel: " << (c.ready ? "open" : (c.dead ? "dead" : "not connected"));
      if (c.have_hdr && !c.rx_target) o << ", holds a message for " << describe_tag(c.rx_hdr.tag()) << " not asked for yet";
      o << ", " << c.sendq.size() << " sends queued, " << c.rts_wait.size() << " awaiting the reader, "
        << c.recvq.size() << " receives posted]";
    }
  }
  return o.str();
}

void ShmTransport::wait(Request* const* reqs, size_t n, Clock::time_point deadline) {
  check_broken();
  const auto spin_until = Clock::now() + std::chrono::microseconds(spin_us_);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < n && all; ++i) all = reqs[i]->complete;
    if (all) return;
    auto now = Clock::now();
    if (now >= deadline) {
      fail(std::make_exception_ptr(TimeoutError("timed out waiting for " + pending_summary(reqs, n))));
    }
    if (poll() || now < spin_until || !arm()) continue;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    handle_events(static_cast<int>(std::clamp<int64_t>(ms, 1, 100)));
    check_broken();
  }
}

void ShmTransport::poll_wait(Clock::time_point until) {
  check_broken();
  if (!poll() && arm()) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    handle_events(static_cast<int>(std::clamp<int64_t>(ms, 0, 1000)));
  }
  check_broken();
}

void ShmTransport::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)r;
}

}  // namespace shoal::transport::shm
