// transport/shm/shm_transport.cc — see shm_transport.h for the contract.
// Failure, posting and progress; connections and their handshake are in
// shm_connect.cc.
#include "transport/shm/shm_transport.h"

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
#include "transport/matching.h"
#include "transport/shm/shm_channel.h"
#include "transport/shm/shm_util.h"

namespace shoal::transport::shm {
namespace {

constexpr int kMaxEvents = 64;
// Polls between two looks at the sockets (accepts, doorbells, deaths) while
// spinning on the rings.
constexpr unsigned kEventEvery = 128;

size_t round_pow2(size_t n) {
  size_t p = 4096;
  while (p < n) p <<= 1;
  return p;
}



}  // namespace

PeerChannel::~PeerChannel() {
  if (map) munmap(map, map_bytes);
}

std::string ShmTransport::socket_name(uint64_t job, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shoal/%016" PRIx64 "/%d", job, rank);
  return buf;
}

ShmTransport::ShmTransport(ShmOptions opts)
    : opts_(std::move(opts)), live_(opts_.liveness ? *opts_.liveness : Liveness::none()) {
  opts_.ring_bytes = round_pow2(opts_.ring_bytes);
  peers_.resize(opts_.size);
  names_.resize(opts_.size);
  epoll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_) throw InternalError("epoll_create1: " + errno_text(errno));
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
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_fd_;
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  }
}

ShmTransport::~ShmTransport() { close_all(); }

bool ShmTransport::heard_from(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || !peers_[peer]) return false;
  const PeerChannel& c = *peers_[peer];
  return c.sock || c.ready || c.dead || c.peer_closed;
}

// The peer's host name, for describe_peer(): once, best effort (a store read).
void ShmTransport::learn_name(int peer) {
  if (!names_[peer].empty()) return;
  try {
    names_[peer] = live_.address(peer).hostname;
  } catch (...) {
  }
}

std::string ShmTransport::describe_peer(int peer) const {
  std::ostringstream o;
  o << live_.name(peer);
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
  broken_.keep(cause);  // the engine wakes its driving thread (HybridTransport::abort)
}

void ShmTransport::fail(std::exception_ptr cause) {
  broken_.fail(std::move(cause), live_, [this] { close_all(); });
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
void ShmTransport::on_peer_closed(PeerChannel& c) {
  c.peer_closed = true;
  c.sock.reset();
  progress(c);
  check_closed(c);
}

void ShmTransport::check_closed(PeerChannel& c) {
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

void ShmTransport::on_conn_error(PeerChannel& c, const std::string& detail) {
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
    learn_name(c.peer);
    fail(live_.lost(c.peer, describe_peer(c.peer), detail));
  }
}

// ---- posting -------------------------------------------------------------

void ShmTransport::post_send(Request* r) {
  check_broken();
  if (r->len > 0 && r->buf == nullptr) throw InvalidArgument("buffer: null with non-zero size");
  PeerChannel& c = channel_for(r->peer);
  r->done = 0;
  r->complete = false;
  c.sendq.push_back(r);
  if (c.ready && c.sendq.size() == 1) try_write(c);
  check_closed(c);
}

// A P2P message buffered while no receive matched has arrived whole. A
// receive posted meanwhile (while it was still streaming in) takes it now;
// otherwise it waits in `unexpected`.
void ShmTransport::file_unexpected(PeerChannel& c) {
  c.unexpected.push_back(std::move(*c.unexpected_cur));
  c.unexpected_cur.reset();
  const Tag tag = c.unexpected.back().hdr.tag();
  Request* r = take_posted(c.recvq, tag);
  if (!r) r = take_posted(any_recvs_, tag);
  if (r) take_unexpected(c, r);
}

bool ShmTransport::take_unexpected(PeerChannel& c, Request* r) {
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
      if (live_.is_local(p)) channel_for(p);
    }
    for (size_t i = 0; i < active_.size(); ++i) try_read(*active_[i]);
    return;
  }
  if (r->tag.space == Space::kP2P && r->peer >= 0 && r->peer < opts_.size && peers_[r->peer] &&
      peers_[r->peer]->ready && take_unexpected(*peers_[r->peer], r)) {
    return;  // (also from a peer that has exited since)
  }
  PeerChannel& c = channel_for(r->peer);
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

void ShmTransport::ring_doorbell(PeerChannel& c) {
  if (!c.seg.take_peer_sleeping() || !c.sock) return;
  char b = 1;
  ssize_t n = ::send(c.sock.get(), &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)n;  // a full socket already holds a doorbell; a dead one shows in epoll
}

void ShmTransport::send_fin(PeerChannel& c, uint64_t cookie) {
  if (c.fin_backlog.empty() && c.seg.fin_push(cookie)) {
    ring_doorbell(c);
  } else {
    c.fin_backlog.push_back(cookie);
  }
}

bool ShmTransport::reap_fins(PeerChannel& c) {
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

bool ShmTransport::try_write(PeerChannel& c) {
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

bool ShmTransport::match(PeerChannel& c) {
  const ShmFrame& h = c.rx_hdr;
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
  if (auto e = check_order(c.recvq, m, live_, name)) fail(e);
  return false;
}

void ShmTransport::read_rts(PeerChannel& c, Request* r, const ShmFrame& h) {
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
      fail(live_.lost(c.peer, describe_peer(c.peer), detail));
    }
    done += static_cast<size_t>(n);
  }
  // Read first, then check: if the sender had not broken by now, its buffer
  // was valid for the whole read.
  if (c.seg.hdr()->side[c.seg.other()].broken.load(std::memory_order_seq_cst)) {
    c.dead = true;
    c.dead_detail = "it failed while this rank read its message";
    fail(live_.lost(c.peer, describe_peer(c.peer), c.dead_detail));
  }
  r->done = h.length;
  r->complete = true;
  send_fin(c, h.cookie);
}

bool ShmTransport::try_read(PeerChannel& c) {
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

bool ShmTransport::progress(PeerChannel& c) {
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
    if (p == &listen_fd_) {
      if (listen_fd_) accept_all();
      continue;
    }
    PeerChannel* c = static_cast<PeerChannel*>(p);
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
  for (PeerChannel* c : active_) c->seg.set_sleeping();
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
      const PeerChannel& c = *peers_[r->peer];
      o << " [channel: " << (c.ready ? "open" : (c.dead ? "dead" : "not connected"));
      if (c.have_hdr && !c.rx_target) o << ", holds a message for " << describe_tag(c.rx_hdr.tag()) << " not asked for yet";
      o << ", " << c.sendq.size() << " sends queued, " << c.rts_wait.size() << " awaiting the reader, "
        << c.recvq.size() << " receives posted]";
    }
  }
  return o.str();
}

}  // namespace shoal::transport::shm
