// rendezvous/tcp_store_server.cc — the epoll loop behind TcpStore (is_server).
//
// Level-triggered epoll over the listener, an eventfd and every connection.
// A connection is parsed only while it has no parked request and no unsent
// reply, so a well-behaved client (one request at a time) never has more than
// one frame buffered; anything beyond one maximal frame is dropped as abuse.
// GET/WAIT/MULTI_GET on missing keys park the connection in `waiters_`;
// SET/ADD/COMPARE_SET wake it.
#include "rendezvous/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "shoal/error.h"

namespace shoal::detail {
namespace {

using store_proto::Cmd;
using store_proto::Status;
using store_proto::Writer;

constexpr uint64_t kListenTag = 1;
constexpr uint64_t kWakeTag = 2;
constexpr size_t kReadChunk = size_t{256} << 10;
constexpr size_t kReadBudget = size_t{4} << 20;  // per event, for fairness between clients
constexpr size_t kMaxBuffered = store_proto::kFrameHeader + store_proto::kMaxBody;
constexpr size_t kKeepBuffer = size_t{1} << 20;  // larger idle buffers are released

void reply(Bytes* out, Status st, const void* p, size_t n) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(st));
  w.raw(p, n);
  w.end();
}
void reply_ok(Bytes* out) { reply(out, Status::kOk, nullptr, 0); }
void reply_u8(Bytes* out, bool v) {
  uint8_t b = v ? 1 : 0;
  reply(out, Status::kOk, &b, 1);
}
void reply_error(Bytes* out, const std::string& msg) { reply(out, Status::kError, msg.data(), msg.size()); }

bool epoll_set(int ep, int op, int fd, uint64_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = tag;
  return ::epoll_ctl(ep, op, fd, &ev) == 0;
}

}  // namespace

StoreServer::StoreServer(const std::string& host, uint16_t port, const auth::Secret& secret,
                         std::chrono::milliseconds handshake_timeout)
    : secret_(secret), handshake_timeout_(handshake_timeout) {
  listen_ = net::listen_tcp(host, port, net::kStoreBacklog);
  net::set_nonblocking(listen_.get(), true);
  port_ = net::bound_port(listen_.get());
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !wake_ || !epoll_set(epoll_.get(), EPOLL_CTL_ADD, listen_.get(), kListenTag, EPOLLIN) ||
      !epoll_set(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), kWakeTag, EPOLLIN)) {
    throw InternalError(std::string("store: cannot set up the server's epoll loop: ") + std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  stop_.store(true, std::memory_order_release);
  uint64_t one = 1;
  while (::write(wake_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) {
    try {
      thread_.join();
    } catch (...) {  // only on self-join, which cannot happen; never throw from here
    }
  }
  // conns_, listen_, epoll_ and wake_ close as members are destroyed.
}

void StoreServer::run() noexcept {
  epoll_event evs[64];
  while (!stop_.load(std::memory_order_acquire)) {
    int n = ::epoll_wait(epoll_.get(), evs, 64, expire_handshakes());
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "[shoal] store server on port %u: epoll_wait failed: %s; serving stops\n",
                   static_cast<unsigned>(port_), std::strerror(errno));
      return;
    }
    for (int i = 0; i < n && !stop_.load(std::memory_order_acquire); ++i) {
      const uint64_t tag = evs[i].data.u64;
      if (tag == kWakeTag) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &v, sizeof(v));
        continue;
      }
      if (tag == kListenTag) {
        accept_all();
        continue;
      }
      try {
        on_event(tag, evs[i].events);
      } catch (...) {  // e.g. bad_alloc on a huge value: drop that client only
        close_conn(tag);
      }
      while (!to_pump_.empty()) {
        std::vector<uint64_t> ids;
        ids.swap(to_pump_);
        for (uint64_t id : ids) {
          try {
            pump(id);
          } catch (...) {
            close_conn(id);
          }
        }
      }
    }
  }
}

void StoreServer::accept_all() {
  for (int i = 0; i < 64; ++i) {
    net::Fd c;
    try {
      c = net::accept_tcp(listen_.get());
      if (!c) return;
      net::set_nonblocking(c.get(), true);
    } catch (const std::exception& e) {
      // Out of descriptors: stop polling the listener (level-triggered, it would
      // spin) until a connection closes.
      std::fprintf(stderr, "[shoal] store server on port %u: %s\n", static_cast<unsigned>(port_), e.what());
      listen_paused_ = epoll_set(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), kListenTag, 0);
      return;
    }
    const uint64_t id = next_id_++;
    if (!epoll_set(epoll_.get(), EPOLL_CTL_ADD, c.get(), id, EPOLLIN | EPOLLRDHUP)) continue;
    Conn& conn = conns_[id];
    try {
      conn.from = net::peer_address(c.get());
    } catch (const Error&) {
      conn.from = "?";
    }
    conn.fd = std::move(c);
    conn.hs = store_proto::ServerHandshake(&secret_);
    handshakes_.emplace_back(std::chrono::steady_clock::now() + handshake_timeout_, id);
  }
}

void StoreServer::reject(const Conn& c, const std::string& why) {
  std::fprintf(stderr, "[shoal] store server on port %u: rejected a connection from %s: %s\n",
               static_cast<unsigned>(port_), c.from.c_str(), why.c_str());
}

// Closes connections whose handshake ran out of time; returns how long
// epoll may sleep until the next deadline (-1: none pending).
int StoreServer::expire_handshakes() {
  const auto now = std::chrono::steady_clock::now();
  while (!handshakes_.empty()) {
    auto [deadline, id] = handshakes_.front();
    Conn* c = find(id);
    if (c == nullptr || c->hs.done()) {
      handshakes_.pop_front();
      continue;
    }
    if (deadline > now) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
      return static_cast<int>(std::min<int64_t>(ms, 60000));
    }
    reject(*c, "no complete handshake within " + std::to_string(handshake_timeout_.count()) + " ms");
    handshakes_.pop_front();
    close_conn(id);
  }
  return -1;
}

// Runs the handshake on what the connection sent; true once it is done (and
// requests may be parsed), false while it needs more or after closing it.
bool StoreServer::shake(uint64_t id, Conn& c) {
  size_t used = 0;
  std::string why;
  const auto step = c.hs.feed(c.in.data() + c.in_pos, c.in_len - c.in_pos, &used, &c.out, &why);
  c.in_pos += used;
  if (step == store_proto::ServerHandshake::Step::kRefuse) {
    reject(c, why);
    if (flush(id, c)) close_conn(id);  // the answer says why, where it is due
    return false;
  }
  if (!flush(id, c)) return false;
  return step == store_proto::ServerHandshake::Step::kDone;
}

StoreServer::Conn* StoreServer::find(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : &it->second;
}

void StoreServer::on_event(uint64_t id, uint32_t events) {
  Conn* c = find(id);
  if (c == nullptr) return;  // closed earlier in this batch
  if ((events & EPOLLOUT) && !flush(id, *c)) return;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    switch (read_some(*c)) {
      case ReadResult::kOk: break;
      case ReadResult::kDrop: close_conn(id); return;
      case ReadResult::kEof:
        pump(id);  // apply what arrived before the close; replies may not be deliverable
        if (Conn* gone = find(id); gone != nullptr && !gone->hs.done()) {
          if (gone->hs.answered()) {
            reject(*gone, "it closed the connection during the handshake (it refused this store's proof: a "
                          "different SHOAL_SECRET, or none?)");
          } else if (gone->in_len > gone->in_pos) {
            reject(*gone, "it closed the connection before finishing its hello");
          }
        }
        close_conn(id);
        return;
    }
  }
  pump(id);
}

StoreServer::ReadResult StoreServer::read_some(Conn& c) {
  size_t budget = kReadBudget;
  while (budget > 0) {
    size_t unparsed = c.in_len - c.in_pos;
    if (unparsed >= kMaxBuffered) {
      // A full maximal frame is waiting: fine if it can be parsed now; a client
      // that keeps sending while its request is parked is misbehaving.
      bool can_parse = c.parked == Parked::kNone && !c.sending();
      return can_parse ? ReadResult::kOk : ReadResult::kDrop;
    }
    if (c.in_pos > 0 && c.in_pos * 2 >= c.in_len) {  // compact
      std::memmove(c.in.data(), c.in.data() + c.in_pos, unparsed);
      c.in_pos = 0;
      c.in_len = unparsed;
    }
    size_t want = std::min(kReadChunk, kMaxBuffered - unparsed);
    if (!c.hs.done()) {  // a stranger gets no buffer beyond the handshake's bytes
      want = std::min(want, c.hs.wanted() > unparsed ? c.hs.wanted() - unparsed : 0);
      if (want == 0) break;
    }
    if (c.in.size() < c.in_len + want) c.in.resize(c.in_len + want);
    ssize_t r = ::recv(c.fd.get(), c.in.data() + c.in_len, want, MSG_DONTWAIT);
    if (r > 0) {
      c.in_len += static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < want) break;  // drained for now
      continue;
    }
    if (r == 0) return ReadResult::kEof;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return ReadResult::kDrop;
  }
  return ReadResult::kOk;
}

bool StoreServer::flush(uint64_t id, Conn& c) {
  while (c.sending()) {
    iovec iov[2];
    int n = 0;
    if (c.out_pos < c.out.size()) iov[n++] = {c.out.data() + c.out_pos, c.out.size() - c.out_pos};
    if (c.value) {
      iov[n++] = {const_cast<uint8_t*>(c.value->data()) + c.value_pos, c.value->size() - c.value_pos};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(c.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      size_t sent = static_cast<size_t>(w);
      const size_t head = std::min(sent, c.out.size() - c.out_pos);
      c.out_pos += head;
      sent -= head;
      if (c.value) {
        c.value_pos += sent;
        if (c.value_pos == c.value->size()) {
          c.value.reset();
          c.value_pos = 0;
        }
      }
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c.want_out) {
        c.want_out = epoll_set(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), id, EPOLLIN | EPOLLRDHUP | EPOLLOUT);
        if (!c.want_out) break;  // cannot wait for writability: give up on this client
      }
      return true;
    }
    break;  // peer gone
  }
  if (c.sending()) {
    close_conn(id);
    return false;
  }
  if (c.out.capacity() > kKeepBuffer) {
    Bytes().swap(c.out);
  } else {
    c.out.clear();
  }
  c.out_pos = 0;
  if (c.want_out) {
    epoll_set(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), id, EPOLLIN | EPOLLRDHUP);
    c.want_out = false;
  }
  return true;
}

void StoreServer::pump(uint64_t id) {
  for (;;) {
    Conn* c = find(id);
    if (c == nullptr) return;
    if (c->parked != Parked::kNone || c->sending()) return;
    if (!c->hs.done()) {
      if (!shake(id, *c)) return;
      continue;
    }
    const uint8_t* body = nullptr;
    size_t len = 0, used = 0;
    const auto st = store_proto::next_frame(c->in.data() + c->in_pos, c->in_len - c->in_pos, &body, &len, &used);
    if (st == store_proto::FrameStatus::kBad) {
      close_conn(id);
      return;
    }
    if (st == store_proto::FrameStatus::kNeedMore) break;
    store_proto::Request req;
    const bool ok = store_proto::parse_request(body, len, &req);
    c->in_pos += used;
    if (!ok || !handle(id, *c, req)) {
      close_conn(id);
      return;
    }
    if (!flush(id, *c)) return;
  }
  Conn* c = find(id);
  if (c != nullptr && c->in_pos == c->in_len) {
    c->in_pos = c->in_len = 0;
    if (c->in.size() > kKeepBuffer) Bytes().swap(c->in);
  }
}

// Executes one parsed request (store_proto::parse_request). Returns false
// when the connection must close. Replies are appended to c.out; the caller
// flushes them. `req` views c.in: copy what must outlive the call.
bool StoreServer::handle(uint64_t id, Conn& c, const store_proto::Request& req) {
  switch (req.cmd) {
    case Cmd::kSet: {
      std::string key(req.key);
      const auto* v = reinterpret_cast<const uint8_t*>(req.value.data());
      data_[key] = std::make_shared<const Bytes>(v, v + req.value.size());
      reply_ok(&c.out);
      notify(key);
      return true;
    }
    case Cmd::kGet: {
      std::string key(req.key);
      if (auto it = data_.find(key); it != data_.end()) {
        reply_value(c, it->second);
      } else {
        c.get_key = key;
        park(id, c, Parked::kGet, {std::move(key)});
      }
      return true;
    }
    case Cmd::kAdd: {
      std::string key(req.key);
      const int64_t delta = req.delta;
      int64_t cur = 0;
      if (auto it = data_.find(key); it != data_.end()) {
        const char* b = reinterpret_cast<const char*>(it->second->data());
        const char* e = b + it->second->size();
        auto [p, ec] = std::from_chars(b, e, cur);
        if (ec != std::errc() || p != e || b == e) {
          reply_error(&c.out, "ADD on key '" + key + "': the stored value is not a decimal integer");
          return true;
        }
      }
      int64_t next = 0;
      if (__builtin_add_overflow(cur, delta, &next)) {
        reply_error(&c.out, "ADD on key '" + key + "': " + std::to_string(cur) + " + " + std::to_string(delta) +
                                " overflows int64");
        return true;
      }
      std::string text = std::to_string(next);
      data_[key] = std::make_shared<const Bytes>(text.begin(), text.end());
      uint8_t buf[8];
      for (int i = 0; i < 8; ++i) buf[i] = static_cast<uint8_t>(static_cast<uint64_t>(next) >> (8 * i));
      reply(&c.out, Status::kOk, buf, sizeof(buf));
      notify(key);
      return true;
    }
    case Cmd::kCheck:
    case Cmd::kWait: {
      std::vector<std::string> absent = missing(req.keys);
      if (req.cmd == Cmd::kCheck) {
        reply_u8(&c.out, absent.empty());
      } else if (absent.empty()) {
        reply_ok(&c.out);
      } else {
        park(id, c, Parked::kWait, std::move(absent));
      }
      return true;
    }
    case Cmd::kMultiGet: {
      c.get_keys.assign(req.keys.begin(), req.keys.end());
      multi_get(id, c);
      return true;
    }
    case Cmd::kDelete: {
      reply_u8(&c.out, data_.erase(std::string(req.key)) > 0);
      return true;
    }
    case Cmd::kCompareSet: {
      std::string key(req.key);
      auto it = data_.find(key);
      const bool absent = it == data_.end();
      const bool match = absent ? req.expected.empty()
                                : std::string_view(reinterpret_cast<const char*>(it->second->data()),
                                                   it->second->size()) == req.expected;
      if (match) {
        const auto* v = reinterpret_cast<const uint8_t*>(req.value.data());
        data_[key] = std::make_shared<const Bytes>(v, v + req.value.size());
        reply_value(c, data_[key]);
        notify(key);
      } else {
        reply_value(c, absent ? std::make_shared<const Bytes>() : it->second);
      }
      return true;
    }
  }
  return false;  // unknown command (parse_request refuses those)
}

// The distinct keys of `keys` that hold no value.
std::vector<std::string> StoreServer::missing(const std::vector<std::string_view>& keys) const {
  std::vector<std::string> absent;
  std::unordered_set<std::string_view> seen;
  for (std::string_view key : keys) {
    if (!data_.count(std::string(key)) && seen.insert(key).second) absent.emplace_back(key);
  }
  return absent;
}

// Answers the MULTI_GET of c.get_keys when every key holds a value, else
// parks it until they all do (a key may have been deleted since it was
// set: the request parks again). True when it answered.
bool StoreServer::multi_get(uint64_t id, Conn& c) {
  std::vector<std::string> absent = missing(std::vector<std::string_view>(c.get_keys.begin(), c.get_keys.end()));
  if (!absent.empty()) {
    park(id, c, Parked::kMultiGet, std::move(absent));
    return false;
  }
  size_t body = 4;
  for (const auto& k : c.get_keys) body += 4 + data_.at(k)->size();
  if (body > store_proto::kMaxValue) {
    reply_error(&c.out, "MULTI_GET of " + std::to_string(c.get_keys.size()) + " keys: the values take " +
                            std::to_string(body) + " bytes, over the " + std::to_string(store_proto::kMaxValue) +
                            "-byte limit of a reply (ask for fewer keys at a time)");
  } else {
    Writer w(&c.out);
    w.u8(static_cast<uint8_t>(Status::kOk));
    w.u32(static_cast<uint32_t>(c.get_keys.size()));
    for (const auto& k : c.get_keys) w.bytes(*data_.at(k));
    w.end();
  }
  c.get_keys.clear();
  return true;
}

void StoreServer::park(uint64_t id, Conn& c, Parked kind, std::vector<std::string> missing_keys) {
  c.parked = kind;
  c.missing = missing_keys.size();
  for (const auto& k : missing_keys) waiters_[k].insert(id);
  c.waiting = std::move(missing_keys);
}

// A GET reply: the header is buffered, the value is sent from the shared copy.
void StoreServer::reply_value(Conn& c, std::shared_ptr<const Bytes> v) {
  Writer w(&c.out);
  w.u8(static_cast<uint8_t>(Status::kOk));
  w.end(v->size());
  if (!v->empty()) {
    c.value = std::move(v);
    c.value_pos = 0;
  }
}

// `key` was just set: answer every parked request that no longer misses a key.
void StoreServer::notify(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::unordered_set<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t wid : ids) {
    Conn* w = find(wid);
    if (w == nullptr || w->parked == Parked::kNone || --w->missing > 0) continue;
    const Parked kind = w->parked;
    w->parked = Parked::kNone;
    w->waiting.clear();
    if (kind == Parked::kGet) {
      reply_value(*w, data_.at(w->get_key));  // == key, set just now
    } else if (kind == Parked::kMultiGet) {
      if (!multi_get(wid, *w)) continue;  // parked again
    } else {
      reply_ok(&w->out);
    }
    w->get_key.clear();
    if (flush(wid, *w)) to_pump_.push_back(wid);
  }
}

void StoreServer::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  for (const auto& k : c.waiting) {
    if (auto w = waiters_.find(k); w != waiters_.end()) {
      w->second.erase(id);
      if (w->second.empty()) waiters_.erase(w);
    }
  }
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  conns_.erase(it);  // closes the socket
  if (listen_paused_) {
    listen_paused_ = !epoll_set(epoll_.get(), EPOLL_CTL_MOD, listen_.get(), kListenTag, EPOLLIN);
  }
}

}  // namespace shoal::detail
