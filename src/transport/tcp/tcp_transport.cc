// transport/tcp/tcp_transport.cc — see tcp_transport.h for the contract.
#include "transport/tcp/tcp_transport.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "shoal/error.h"
#include "transport/matching.h"
#include "transport/peer_slot.h"
#include "transport/tcp/tcp_conn.h"

namespace shoal::transport::tcp {

using handshake::Accept;
using handshake::Hello;
namespace {

// Payload remainders at least this large are read straight into the
// destination; smaller ones go through the staging buffer so that the next
// headers come in the same system call.
constexpr size_t kDirectReadBytes = 16 << 10;
constexpr int kMaxEvents = 64;
// An accepted socket must deliver a whole, valid Hello within this long (a
// rank writes its hello as soon as it has connected); at most
// kMaxUnnamed + size accepted sockets may be mid-hello at once.
constexpr size_t kMaxUnnamed = 64;

std::string errno_text(int e) { return std::string(strerror(e)); }

}  // namespace

TcpTransport::TcpTransport(TcpOptions opts)
    : opts_(std::move(opts)), live_(opts_.liveness ? *opts_.liveness : Liveness::none()) {
  peers_.resize(opts_.size);
  addr_cache_.resize(opts_.size);
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) throw InternalError("epoll_create1: " + errno_text(errno));
  if (opts_.size > 1) {
    listen_fd_ = net::listen_tcp(opts_.bind_host, 0);
    net::set_nonblocking(listen_fd_.get(), true);
    // Accepted connections start with the listener's congestion control.
    const std::string cc = initial_congestion();
    if (!cc.empty()) net::set_congestion(listen_fd_.get(), cc);
    listen_port_ = net::bound_port(listen_fd_.get());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  }
}

TcpTransport::~TcpTransport() = default;

bool TcpTransport::heard_from(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || !peers_[peer]) return false;
  return peers_[peer]->fd || peers_[peer]->dead;
}

std::string TcpTransport::describe_peer(int peer) const {
  std::ostringstream o;
  o << live_.name(peer);
  if (peer >= 0 && peer < opts_.size && !addr_cache_[peer].host.empty()) {
    const auto& a = addr_cache_[peer];
    o << " (" << a.hostname << " " << a.host << ":" << a.port << ")";
  }
  return o.str();
}

// ---- failure -------------------------------------------------------------

std::exception_ptr TcpTransport::broken() const { return broken_.get(); }

void TcpTransport::abort(std::exception_ptr cause) {
  broken_.keep(cause);  // the engine wakes its driving thread (HybridTransport::abort)
}

void TcpTransport::fail(std::exception_ptr cause) {
  broken_.fail(std::move(cause), live_, [this] { close_all(); });
}

void TcpTransport::check_broken() {
  if (broken_.set()) fail(broken());
}

void TcpTransport::close_all() {
  auto shut = [](Conn* c) {
    if (c && c->fd) {
      ::shutdown(c->fd.get(), SHUT_RDWR);
      c->fd.reset();
    }
  };
  for (auto& c : peers_) shut(c.get());
  for (auto& c : unnamed_) shut(c.get());
  unnamed_.clear();
  listen_fd_.reset();
}

void TcpTransport::on_conn_error(Conn& c, const std::string& detail) {
  if (c.peer < 0) {  // a stranger or a half-open accept: drop it quietly
    c.dead = true;
    c.fd.reset();
    return;
  }
  bool pending = c.has_pending() || !any_recvs_.empty();
  c.dead = true;
  c.dead_detail = detail;
  c.fd.reset();
  if (pending) {
    fail(live_.lost(c.peer, describe_peer(c.peer), detail));
  }
}

// ---- connections ---------------------------------------------------------

Conn& TcpTransport::conn_for(int peer) {
  Conn& c = peer_slot(peers_, peer, opts_.rank);
  if (c.dead) {
    fail(live_.lost(peer, describe_peer(peer), c.dead_detail));
  }
  if (!c.fd && peer > opts_.rank) connect_to(c);
  return c;
}

void TcpTransport::connect_to(Conn& c) {
  try {
    if (addr_cache_[c.peer].host.empty()) addr_cache_[c.peer] = live_.address(c.peer);
    const PeerAddress& a = addr_cache_[c.peer];
    auto deadline = Clock::now() + opts_.connect_timeout;
    // The peer published its address after it began to listen: a refusal
    // means its process (or its communicator) is gone.
    net::Fd fd = net::connect_tcp(a.host, a.port, deadline, net::Refused::kFinal, initial_congestion());
    tune(fd.get());
    Hello h = handshake::make_hello(identity(), c.peer);
    if (!net::write_full(fd.get(), &h, sizeof(h), deadline)) {
      throw PeerLost("connection closed during the hello", c.peer);
    }
    net::set_nonblocking(fd.get(), true);
    c.fd = std::move(fd);
    c.readable = c.writable = true;
    // Frames may follow the hello at once; the peer's are read only after
    // its answer has proved the secret (read_accept).
    c.hello = h;
    c.await_accept = true;
    c.accept_have = 0;
    register_fd(&c);
  } catch (const Error& e) {
    // Through on_lost, which names the first culprit when this peer only
    // left because another rank failed.
    std::string detail = std::string("cannot connect: ") + e.what();
    fail(live_.lost(c.peer, describe_peer(c.peer), detail));
  }
}

// Congestion control is chosen before a connection is made: a controller
// switched to afterwards keeps the pacing BBR started. "auto" starts every
// connection with reno: one that stays on this host (loopback) is never
// dropped or queued, so there congestion control has nothing to do, and a
// pacing one (BBR, the default of some hosts) costs CPU time on every
// segment. A connection that leaves the host then takes the host's default.
std::string TcpTransport::initial_congestion() const {
  if (opts_.congestion == "system") return "";
  return opts_.congestion == "auto" ? "reno" : opts_.congestion;
}

// A data connection's socket buffers, and (auto) the host's congestion
// control for one that leaves the host.
void TcpTransport::tune(int fd) {
  if (opts_.socket_buffer > 0) net::set_send_buffer(fd, opts_.socket_buffer);
  if (opts_.congestion == "auto" && !net::within_host(fd)) {
    static const std::string host_default = net::default_congestion();
    if (!host_default.empty()) net::set_congestion(fd, host_default);  // best-effort
  }
}

void TcpTransport::register_fd(Conn* c) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = c;
  if (epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, c->fd.get(), &ev) != 0) {
    throw InternalError("epoll_ctl(ADD): " + errno_text(errno));
  }
}

void TcpTransport::accept_all() {
  for (;;) {
    net::Fd fd = net::accept_tcp(listen_fd_.get());
    if (!fd) return;
    std::string from = "?";
    try {
      from = net::peer_address(fd.get());
    } catch (const Error&) {
      // (reset already; the hello read says so)
    }
    if (unnamed_.size() >= kMaxUnnamed + static_cast<size_t>(opts_.size)) {
      std::fprintf(stderr, "shoal: rank %d: rejected a connection from %s: %zu connections are mid-hello already\n",
                   opts_.rank, from.c_str(), unnamed_.size());
      continue;
    }
    net::set_nonblocking(fd.get(), true);
    tune(fd.get());
    auto c = std::make_unique<Conn>();
    c->fd = std::move(fd);
    c->from = from;
    c->hello_deadline = Clock::now() + opts_.hello_timeout;
    register_fd(c.get());
    unnamed_.push_back(std::move(c));
  }
}

void TcpTransport::reject_stranger(Conn& c, const std::string& why) {
  std::fprintf(stderr, "shoal: rank %d: rejected a connection from %s: %s\n", opts_.rank, c.from.c_str(),
               why.c_str());
  c.dead = true;
  c.fd.reset();
}

// Reads the Hello of an accepted socket and checks it (frame.h); on success
// answers it and moves the socket into the peer's slot. Reads no byte past
// the hello. Returns true if the Conn was adopted (and so destroyed).
bool TcpTransport::read_hello(Conn& c) {
  auto reject = [&](const std::string& why) { reject_stranger(c, why); };
  while (c.staged() < sizeof(Hello)) {
    ssize_t n = ::recv(c.fd.get(), c.stage.data() + c.hi, sizeof(Hello) - c.staged(), 0);
    if (n > 0) {
      c.hi += static_cast<size_t>(n);
      std::string bad = handshake::check_hello_prefix(c.stage.data() + c.lo, c.staged());
      if (!bad.empty()) return reject(bad), false;
    } else if (n == 0) {
      reject("closed before its hello");
      return false;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c.readable = false;
      return false;
    } else {
      reject(errno_text(errno));
      return false;
    }
  }
  Hello h;
  std::memcpy(&h, c.stage.data() + c.lo, sizeof(h));
  c.lo += sizeof(h);
  std::string bad = handshake::check_hello(h, identity());
  if (!bad.empty()) return reject(bad), false;
  int peer = static_cast<int>(h.rank);
  auto& slot = peers_[peer];
  if (slot && (slot->fd || slot->dead)) {
    return reject("rank " + std::to_string(peer) + " is already connected"), false;
  }
  // The answer is the first thing this side sends, into an empty socket
  // buffer: it goes whole, or the connection is broken. A peer that has
  // exited meanwhile left frames that its hello proved: they are read all
  // the same, then its end of the connection.
  Accept a = handshake::make_accept(h, identity());
  ssize_t w;
  do {
    w = ::send(c.fd.get(), &a, sizeof(a), MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  (void)w;
  // Adopt: the accepted socket carries on as the peer's connection.
  auto it = std::find_if(unnamed_.begin(), unnamed_.end(), [&](auto& p) { return p.get() == &c; });
  std::unique_ptr<Conn> owned = std::move(*it);
  unnamed_.erase(it);
  if (slot) {
    slot->fd = std::move(owned->fd);
    std::copy(owned->stage.begin() + owned->lo, owned->stage.begin() + owned->hi,
              slot->stage.begin());
    slot->lo = 0;
    slot->hi = owned->staged();
    slot->readable = owned->readable;
    slot->writable = owned->writable;
  } else {
    owned->peer = peer;
    slot = std::move(owned);
  }
  if (addr_cache_[peer].host.empty()) {
    try {
      addr_cache_[peer] = live_.address(peer);
    } catch (...) {
    }
  }
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = slot.get();
  epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, slot->fd.get(), &ev);
  drive(*slot);
  return true;
}

// ---- posting -------------------------------------------------------------

void TcpTransport::post_send(Request* r) {
  check_broken();
  if (r->len > 0 && r->buf == nullptr) throw InvalidArgument("buffer: null with non-zero size");
  Conn& c = conn_for(r->peer);
  r->done = 0;
  r->complete = false;
  c.sendq.push_back(r);
  if (c.fd && c.sendq.size() == 1) try_write(c);
}

// A buffered P2P message that `r` matches, if any, is copied into it.
bool TcpTransport::take_unexpected(Conn& c, Request* r) {
  for (auto it = c.unexpected.begin(); it != c.unexpected.end(); ++it) {
    if (it->hdr.tag() == r->tag) {
      if (it->data.size() != r->len) fail(size_mismatch(describe_peer(c.peer), r->tag, r->len, it->data.size()));
      if (r->len) std::memcpy(r->buf, it->data.data(), r->len);
      r->done = r->len;
      r->source = c.peer;
      r->complete = true;
      c.unexpected.erase(it);
      return true;
    }
  }
  return false;
}

// A P2P message buffered while no receive matched has arrived whole. A
// receive posted meanwhile (while it was still coming in) takes it now.
void TcpTransport::file_unexpected(Conn& c) {
  c.unexpected.push_back(std::move(*c.unexpected_cur));
  c.unexpected_cur.reset();
  const Tag tag = c.unexpected.back().hdr.tag();
  Request* r = take_posted(c.recvq, tag);
  if (!r) r = take_posted(any_recvs_, tag);
  if (r) take_unexpected(c, r);
}

void TcpTransport::post_recv(Request* r) {
  check_broken();
  if (r->len > 0 && r->buf == nullptr) throw InvalidArgument("buffer: null with non-zero size");
  r->done = 0;
  r->complete = false;
  r->source = -1;
  if (r->peer == kAnySource) {
    if (r->tag.space != Space::kP2P) throw InvalidArgument("peer: any-source is for p2p receives");
    for (auto& c : peers_) {
      if (c && take_unexpected(*c, r)) return;
    }
    any_recvs_.push_back(r);
    // Lower ranks connect to us when they send; we connect to the higher ones.
    for (int p = opts_.rank + 1; p < opts_.size; ++p) conn_for(p);
    for (auto& c : peers_) {
      if (c && c->fd && c->have_hdr && !c->rx_target) try_read(*c);
    }
    return;
  }
  Conn& c = conn_for(r->peer);
  if (r->tag.space == Space::kP2P && take_unexpected(c, r)) return;
  c.recvq.push_back(r);
  if (c.fd) try_read(c);
}

bool TcpTransport::cancel(Request* r) {
  if (r->peer == kAnySource) return erase_posted(any_recvs_, r);
  if (r->peer < 0 || r->peer >= opts_.size || !peers_[r->peer]) return false;
  return erase_posted(peers_[r->peer]->recvq, r);
}

// ---- progress ------------------------------------------------------------

void TcpTransport::drive(Conn& c) {
  if (c.peer < 0) {
    if (c.fd) read_hello(c);
    return;
  }
  if (!c.fd) return;
  try_write(c);
  if (c.fd) try_read(c);
}

void TcpTransport::try_write(Conn& c) {
  while (!c.sendq.empty() && c.writable && c.fd) {
    Request* head = c.sendq.front();
    if (!c.tx_started) {
      c.tx_hdr = make_header(*head);
      c.tx_hdr_done = 0;
      c.tx_started = true;
    }
    iovec iov[2];
    int k = 0;
    if (c.tx_hdr_done < sizeof(FrameHeader)) {
      iov[k++] = {reinterpret_cast<char*>(&c.tx_hdr) + c.tx_hdr_done,
                  sizeof(FrameHeader) - c.tx_hdr_done};
    }
    if (head->done < head->len) {
      iov[k++] = {static_cast<char*>(head->buf) + head->done, head->len - head->done};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(k);
    ssize_t n = ::sendmsg(c.fd.get(), &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c.writable = false;
        return;
      }
      on_conn_error(c, "send failed: " + errno_text(errno));
      return;
    }
    size_t left = static_cast<size_t>(n);
    Request* r = c.sendq.front();
    size_t h = std::min(left, sizeof(FrameHeader) - c.tx_hdr_done);
    c.tx_hdr_done += h;
    left -= h;
    r->done += left;
    if (c.tx_hdr_done == sizeof(FrameHeader) && r->done == r->len) {
      r->complete = true;
      c.sendq.pop_front();
      c.tx_started = false;
    }
  }
}

// The connecting side: reads the acceptor's answer (no byte past it) and
// checks its proof. Returns true once it has; until then no frame from the
// peer is read. A bad or missing answer is a connection error.
bool TcpTransport::read_accept(Conn& c) {
  auto* buf = reinterpret_cast<uint8_t*>(&c.accept);
  while (c.accept_have < sizeof(Accept)) {
    if (!c.readable) return false;
    ssize_t n = ::recv(c.fd.get(), buf + c.accept_have, sizeof(Accept) - c.accept_have, 0);
    if (n > 0) {
      c.accept_have += static_cast<size_t>(n);
    } else if (n == 0) {
      on_conn_error(c, "connection closed by the peer before it answered this rank's hello (see the peer's log: "
                       "a different SHOAL_SECRET, or not a rank of this job)");
      return false;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      c.readable = false;
      return false;
    } else {
      on_conn_error(c, "receive failed: " + errno_text(errno));
      return false;
    }
  }
  std::string bad = handshake::check_accept(c.accept, c.hello, identity());
  if (!bad.empty()) {
    std::fprintf(stderr, "shoal: rank %d: rejected the answer of %s: %s\n", opts_.rank,
                 describe_peer(c.peer).c_str(), bad.c_str());
    on_conn_error(c, "its answer to this rank's hello was refused: " + bad);
    return false;
  }
  c.await_accept = false;
  return true;
}

bool TcpTransport::match(Conn& c) {
  const FrameHeader& h = c.rx_hdr;
  const Tag tag = h.tag();
  Request* found = take_posted(c.recvq, tag);
  if (!found && tag.space == Space::kP2P) found = take_posted(any_recvs_, tag);
  const Arrival m{c.peer, tag, h.fp, h.length};
  auto name = [this](int p) { return describe_peer(p); };
  if (found) {
    if (auto e = check_matched(*found, m, live_, name)) fail(e);
    found->source = c.peer;
    c.rx_target = found;
    return true;
  }
  if (tag.space == Space::kP2P) {
    // Buffer it so that later messages from this peer are not held up.
    if (!c.recvq.empty() || !any_recvs_.empty()) {
      if (h.length > (size_t{1} << 34)) {
        on_conn_error(c, "a p2p message of " + std::to_string(h.length) + " bytes");
        return false;
      }
      c.unexpected_cur = std::make_unique<Unexpected>();
      c.unexpected_cur->hdr = h;
      c.unexpected_cur->data.resize(h.length);
      c.unexpected_req.buf = c.unexpected_cur->data.data();
      c.unexpected_req.len = h.length;
      c.unexpected_req.done = 0;
      c.unexpected_req.complete = false;
      c.rx_target = &c.unexpected_req;
      return true;
    }
    return false;
  }
  // A collective message nobody has asked for yet: it waits in the kernel,
  // unless the ranks disagree on the sequence of collectives.
  if (auto e = check_order(c.recvq, m, live_, name)) fail(e);
  return false;
}

void TcpTransport::try_read(Conn& c) {
  auto fill = [&]() -> bool {
    if (!c.readable) return false;
    if (c.lo == c.hi) {
      c.lo = c.hi = 0;
    } else if (c.lo > 0 && c.stage.size() - c.hi < sizeof(FrameHeader)) {
      std::memmove(c.stage.data(), c.stage.data() + c.lo, c.staged());
      c.hi -= c.lo;
      c.lo = 0;
    }
    for (;;) {
      ssize_t n = ::recv(c.fd.get(), c.stage.data() + c.hi, c.stage.size() - c.hi, 0);
      if (n > 0) {
        c.hi += static_cast<size_t>(n);
        return true;
      }
      if (n == 0) {
        on_conn_error(c, "connection closed by the peer");
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c.readable = false;
        return false;
      }
      on_conn_error(c, "receive failed: " + errno_text(errno));
      return false;
    }
  };

  if (c.await_accept && !read_accept(c)) return;
  while (c.fd) {
    if (!c.have_hdr) {
      if (c.staged() < sizeof(FrameHeader)) {
        if (!fill()) return;
        continue;
      }
      std::memcpy(&c.rx_hdr, c.stage.data() + c.lo, sizeof(FrameHeader));
      c.lo += sizeof(FrameHeader);
      if (const char* bad = check_frame_header(c.rx_hdr)) {
        on_conn_error(c, bad);
        return;
      }
      c.have_hdr = true;
      c.rx_target = nullptr;
    }
    if (!c.rx_target && !match(c)) return;  // parked until a receive matches
    Request* r = c.rx_target;
    size_t left = r->len - r->done;
    if (left > 0 && c.staged() > 0) {
      size_t n = std::min(left, c.staged());
      std::memcpy(static_cast<char*>(r->buf) + r->done, c.stage.data() + c.lo, n);
      c.lo += n;
      r->done += n;
      left -= n;
    }
    if (left > 0) {
      if (left >= kDirectReadBytes) {
        if (!c.readable) return;
        ssize_t n = ::recv(c.fd.get(), static_cast<char*>(r->buf) + r->done, left, 0);
        if (n > 0) {
          r->done += static_cast<size_t>(n);
        } else if (n == 0) {
          on_conn_error(c, "connection closed by the peer");
          return;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          c.readable = false;
          return;
        } else if (errno != EINTR) {
          on_conn_error(c, "receive failed: " + errno_text(errno));
          return;
        }
      } else if (!fill()) {
        return;
      }
      continue;
    }
    // The payload is complete.
    c.have_hdr = false;
    c.rx_target = nullptr;
    if (r == &c.unexpected_req) {
      file_unexpected(c);
    } else {
      r->complete = true;
    }
  }
}

int TcpTransport::handle_events(int timeout_ms) {
  epoll_event evs[kMaxEvents];
  int n = epoll_wait(epoll_fd_.get(), evs, kMaxEvents, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    throw InternalError("epoll_wait: " + errno_text(errno));
  }
  for (int i = 0; i < n; ++i) {
    void* p = evs[i].data.ptr;
    if (p == &listen_fd_) {
      if (listen_fd_) accept_all();
      continue;
    }
    Conn* c = static_cast<Conn*>(p);
    if (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c->readable = true;
    if (evs[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) c->writable = true;
    drive(*c);
  }
  // Drop strangers that were rejected or closed, or are too slow with their hello.
  if (!unnamed_.empty()) {
    auto now = Clock::now();
    for (auto& c : unnamed_) {
      if (!c->dead && now >= c->hello_deadline) reject_stranger(*c, "no complete hello within " + std::to_string(opts_.hello_timeout.count()) + " ms");
    }
  }
  unnamed_.erase(std::remove_if(unnamed_.begin(), unnamed_.end(), [](auto& c) { return c->dead; }),
                 unnamed_.end());
  return n;
}

std::string TcpTransport::pending_summary(Request* const* reqs, size_t n) const {
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
    // The connection's state: what it holds back and why.
    if (r->peer >= 0 && r->peer < opts_.size && peers_[r->peer]) {
      const Conn& c = *peers_[r->peer];
      o << " [conn: " << (c.fd ? "open" : (c.dead ? "dead" : "not connected"));
      if (c.fd && c.await_accept) o << ", its answer to the hello not in yet";
      if (c.have_hdr && !c.rx_target) o << ", holds a message for " << describe_tag(c.rx_hdr.tag()) << " not asked for yet";
      o << ", " << c.sendq.size() << " sends queued, " << c.recvq.size() << " receives posted, "
        << c.staged() << " bytes staged" << (c.readable ? "" : ", drained") << (c.writable ? "" : ", send buffer full");
      if (c.fd) o << net::describe_trouble(net::tcp_health(c.fd.get()));  // the kernel's side of a stall
      o << "]";
    }
  }
  return o.str();
}

bool TcpTransport::poll() {
  check_broken();
  bool moved = handle_events(0) > 0;
  check_broken();
  return moved;
}

}  // namespace shoal::transport::tcp
