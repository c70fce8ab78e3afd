// shoalrun/workers_store.cc — see workers_store.h.
#include "workers_store.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/net.h"
#include "log.h"
#include "rendezvous/store_protocol.h"
#include "torch_store_protocol.h"

namespace shoalrun {
namespace {

namespace proto = shoal::store_proto;
using namespace torch_proto;
using Clock = std::chrono::steady_clock;

constexpr uint8_t kShoalCompareSet = 7;  // shoal's COMPARE_SET (store_protocol.h)
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

bool parse_i64(const std::string& s, int64_t* v) {
  if (s.empty()) {
    *v = 0;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  *v = x;
  return true;
}

}  // namespace

struct WorkersStore::Impl {
  enum class Proto { kUnknown, kTorch, kShoal };
  enum class Park { kNone, kTorchWait, kShoalGet, kShoalWait, kShoalMultiGet };
  struct Conn {
    shoal::net::Fd fd;
    std::string from;
    Proto proto = Proto::kUnknown;
    bool validated = false;                         // torch: VALIDATE came
    std::unique_ptr<proto::ServerHandshake> shake;  // shoal
    Clock::time_point born = Clock::now();
    std::string in;
    size_t in_pos = 0;
    std::string out;
    size_t out_pos = 0;
    Park park = Park::kNone;
    std::string get_key;
    std::vector<std::string> get_keys;  // kShoalMultiGet: the keys to answer with, in order
    std::unordered_set<std::string> missing;
    bool want_out = false;  // EPOLLOUT registered: a reply waits for room
  };

  shoal::auth::Secret secret;
  shoal::net::Fd listen;
  shoal::net::Fd epoll;
  int wake[2] = {-1, -1};
  std::thread thread;

  std::mutex mu;  // guards everything below (the thread holds it while it serves a batch)
  bool stop = false;
  uint64_t next_id = kFirstConn;
  std::map<uint64_t, Conn> conns;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  std::set<std::string> refused_queries;  // logged once each
  std::vector<uint64_t> touched;  // connections that may have replies to send (after this batch)
  std::deque<uint64_t> strangers;  // connections by accept time, until they have shaken hands

  static constexpr uint64_t kListenTag = 0, kWakeTag = 1, kFirstConn = 16;

  bool watch(int op, int fd, uint64_t tag, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = tag;
    return ::epoll_ctl(epoll.get(), op, fd, &ev) == 0;
  }

  // Level-triggered epoll: the work of a batch is what its events bring, so
  // a store with thousands of idle connections costs nothing per request.
  void run() noexcept {
    epoll_event evs[64];
    while (true) {
      const int n = ::epoll_wait(epoll.get(), evs, 64, drop_strangers());
      if (n < 0 && errno != EINTR) return;
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = evs[i].data.u64;
        if (tag == kWakeTag) {
          char b[64];
          while (::read(wake[0], b, sizeof(b)) > 0) {
          }
        } else if (tag == kListenTag) {
          accept_all();
        } else if (auto it = conns.find(tag); it != conns.end()) {
          touched.push_back(tag);
          if ((evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && !read_some(tag, it->second)) {
            close_conn(tag);
          }
        }
      }
      // Flush what the batch queued (replies, and waits it completed).
      std::vector<uint64_t> ids;
      ids.swap(touched);
      for (uint64_t id : ids) {
        auto it = conns.find(id);
        if (it == conns.end()) continue;
        Conn& c = it->second;
        const bool alive = flush(c);
        const bool pending = c.out_pos < c.out.size();
        if (alive && pending != c.want_out) {
          c.want_out = pending;
          watch(EPOLL_CTL_MOD, c.fd.get(), id, EPOLLIN | EPOLLRDHUP | (pending ? uint32_t{EPOLLOUT} : 0u));
        }
        if (!alive) close_conn(id);
      }
    }
  }

  // Drops connections that have not shaken hands within kHandshakeTimeout
  // (silent strangers); returns how long epoll may sleep until the next
  // such deadline (ms; -1: none).
  int drop_strangers() {
    std::lock_guard<std::mutex> lock(mu);
    const auto now = Clock::now();
    while (!strangers.empty()) {
      auto it = conns.find(strangers.front());
      if (it == conns.end() || it->second.proto == Proto::kTorch ||
          (it->second.shake && it->second.shake->done())) {
        strangers.pop_front();
        continue;
      }
      const auto deadline = it->second.born + kHandshakeTimeout;
      if (deadline > now) {
        return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count());
      }
      log("workers' store: dropped " + it->second.from + ": no handshake within 10 s");
      strangers.pop_front();
      close_conn(it->first);
    }
    return -1;
  }

  void accept_all() {
    while (true) {
      sockaddr_storage sa;
      socklen_t len = sizeof(sa);
      const int fd = ::accept4(listen.get(), reinterpret_cast<sockaddr*>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or out of descriptors: try again on the next event
      Conn c;
      c.fd.reset(fd);
      shoal::net::set_nodelay(fd);
      c.from = shoal::net::peer_address(fd);
      const uint64_t id = next_id++;
      if (!watch(EPOLL_CTL_ADD, fd, id, EPOLLIN | EPOLLRDHUP)) continue;  // (closes it)
      conns.emplace(id, std::move(c));
      strangers.push_back(id);
    }
  }

  void close_conn(uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    unpark(id, it->second);
    ::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
    conns.erase(it);
  }

  bool read_some(uint64_t id, Conn& c) {
    char buf[65536];
    while (true) {
      const ssize_t r = ::recv(c.fd.get(), buf, sizeof(buf), 0);
      if (r == 0) return false;
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      c.in.append(buf, static_cast<size_t>(r));
      if (static_cast<size_t>(r) < sizeof(buf)) break;
    }
    return pump(id, c);
  }

  bool pump(uint64_t id, Conn& c) {
    while (c.in_pos < c.in.size()) {
      const char* p = c.in.data() + c.in_pos;
      const size_t avail = c.in.size() - c.in_pos;
      if (c.proto == Proto::kUnknown) {
        if (static_cast<uint8_t>(p[0]) == kValidate) {
          c.proto = Proto::kTorch;
        } else if (static_cast<uint8_t>(p[0]) == 'S') {
          c.proto = Proto::kShoal;
          c.shake = std::make_unique<proto::ServerHandshake>(&secret);
        } else {
          log("workers' store: dropped " + c.from + ": neither a torch TCPStore nor a shoal store client");
          return false;
        }
      }
      size_t used = 0;
      bool more = false;
      const bool ok = c.proto == Proto::kTorch ? torch_request(id, c, p, avail, &used, &more)
                                               : shoal_input(id, c, p, avail, &used, &more);
      if (!ok) return false;
      c.in_pos += used;
      if (more) break;
    }
    if (c.in_pos == c.in.size()) {
      c.in.clear();
      c.in_pos = 0;
    } else if (c.in_pos > (size_t{1} << 20)) {
      c.in.erase(0, c.in_pos);
      c.in_pos = 0;
    }
    return true;
  }

  void refuse_query(const Conn& c, const std::string& what) {
    if (refused_queries.insert(what).second) {
      log("workers' store: closed a connection from " + c.from + ": " + what +
          " (this store serves torch's VALIDATE, PING, SET, GET, ADD, CHECK, WAIT, CANCEL_WAIT, COMPARE_SET, "
          "DELETE_KEY, GETNUMKEYS, APPEND, MULTI_GET, MULTI_SET)");
    }
  }

  // One torch query from p[0, n): false closes the connection; *more: wait
  // for more bytes (nothing consumed).
  bool torch_request(uint64_t id, Conn& c, const char* p, size_t n, size_t* used, bool* more) {
    Cursor r(p, n);
    const auto q = r.value<uint8_t>();
    auto need_more = [&] {
      *more = true;
      return true;
    };
    if (!r.ok()) return need_more();
    if (!c.validated && q != kValidate) {
      refuse_query(c, "a query before VALIDATE");
      return false;
    }
    std::string& out = c.out;
    switch (q) {
      case kValidate: {
        const auto magic = r.value<uint32_t>();
        if (!r.ok()) return need_more();
        if (magic != kValidationMagic) {
          log("workers' store: dropped " + c.from + ": a torch client with the wrong validation number");
          return false;
        }
        c.validated = true;
        break;
      }
      case kPing: {
        const auto nonce = r.value<uint32_t>();
        if (!r.ok()) return need_more();
        put<uint32_t>(&out, nonce);
        break;
      }
      case kSet:
      case kAppend: {
        std::string key = r.str(kMaxKey), value = r.str(kMaxValue);
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        key = torch_key(std::move(key));
        if (q == kAppend) {
          auto it = data.find(key);
          if (it != data.end()) value = it->second + value;
        }
        set(key, std::move(value));
        break;
      }
      case kCompareSet: {
        std::string key = r.str(kMaxKey), expected = r.str(kMaxValue), desired = r.str(kMaxValue);
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        key = torch_key(std::move(key));
        auto it = data.find(key);
        if (it == data.end()) {
          // As torch's server: an absent key is set only when nothing was expected.
          if (expected.empty()) {
            put_vec(&out, desired);
            set(key, std::move(desired));
          } else {
            put_vec(&out, expected);
          }
        } else {
          if (it->second == expected) {
            set(key, std::move(desired));
            it = data.find(key);
          }
          put_vec(&out, it->second);
        }
        break;
      }
      case kGet: {
        std::string key = r.str(kMaxKey);
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        auto it = data.find(torch_key(key));
        if (it == data.end()) return false;  // torch's client waits before it gets; its server closes too
        put_vec(&out, it->second);
        break;
      }
      case kAdd: {
        std::string key = r.str(kMaxKey);
        const auto delta = r.value<int64_t>();
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        key = torch_key(std::move(key));
        int64_t v = 0;
        auto it = data.find(key);
        if (it != data.end() && !parse_i64(it->second, &v)) return false;
        v += delta;
        put<int64_t>(&out, v);
        set(key, std::to_string(v));
        break;
      }
      case kCheck:
      case kWait:
      case kMultiGet: {
        const uint64_t k = r.count();
        std::vector<std::string> keys;
        for (uint64_t i = 0; i < k && r.ok(); ++i) keys.push_back(torch_key(r.str(kMaxKey)));
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        if (q == kMultiGet) {
          for (const auto& key : keys) {
            auto it = data.find(key);
            if (it == data.end()) return false;
            put_vec(&out, it->second);
          }
          break;
        }
        std::unordered_set<std::string> missing;
        for (const auto& key : keys) {
          if (!data.count(key)) missing.insert(key);
        }
        if (q == kCheck) {
          put<uint8_t>(&out, missing.empty() ? kCheckReady : kCheckNotReady);
        } else if (missing.empty()) {
          put<uint8_t>(&out, kStopWaiting);
        } else {
          park(id, c, Park::kTorchWait, std::move(missing), "");
        }
        break;
      }
      case kCancelWait:
        unpark(id, c);
        put<uint8_t>(&out, kWaitCanceled);
        break;
      case kGetNumKeys:
        put<int64_t>(&out, static_cast<int64_t>(data.size()));
        break;
      case kDeleteKey: {
        std::string key = r.str(kMaxKey);
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        put<int64_t>(&out, static_cast<int64_t>(data.erase(torch_key(key))));
        break;
      }
      case kMultiSet: {
        const uint64_t k = r.count();
        std::vector<std::pair<std::string, std::string>> kv;
        for (uint64_t i = 0; i < k && r.ok(); ++i) {
          std::string key = r.str(kMaxKey), value = r.str(kMaxValue);
          kv.emplace_back(torch_key(std::move(key)), std::move(value));
        }
        if (r.bad()) return false;
        if (!r.ok()) return need_more();
        for (auto& [key, value] : kv) set(key, std::move(value));
        break;
      }
      default:
        refuse_query(c, "torch query type " + std::to_string(q));
        return false;
    }
    *used = r.used();
    return true;
  }

  // shoal's protocol: the handshake, then frames (store_protocol.h).
  bool shoal_input(uint64_t id, Conn& c, const char* p, size_t n, size_t* used, bool* more) {
    const auto* b = reinterpret_cast<const uint8_t*>(p);
    if (!c.shake->done()) {
      shoal::Bytes reply;
      std::string why;
      const auto step = c.shake->feed(b, n, used, &reply, &why);
      c.out.append(reinterpret_cast<const char*>(reply.data()), reply.size());
      if (step == proto::ServerHandshake::Step::kRefuse) {
        log("workers' store: refused " + c.from + ": " + why);
        flush(c);
        return false;
      }
      if (step == proto::ServerHandshake::Step::kMore) *more = true;
      return true;
    }
    const uint8_t* body = nullptr;
    size_t len = 0;
    switch (proto::next_frame(b, n, &body, &len, used)) {
      case proto::FrameStatus::kNeedMore:
        *more = true;
        *used = 0;
        return true;
      case proto::FrameStatus::kBad:
        return false;
      case proto::FrameStatus::kOk:
        break;
    }
    return shoal_request(id, c, body, len);
  }

  void reply(Conn& c, proto::Status status, const std::string& payload) {
    put<uint32_t>(&c.out, static_cast<uint32_t>(1 + payload.size()));
    put<uint8_t>(&c.out, static_cast<uint8_t>(status));
    c.out.append(payload);
  }

  bool shoal_request(uint64_t id, Conn& c, const uint8_t* body, size_t n) {
    using Cmd = proto::Cmd;
    if (n > 0 && body[0] == kShoalCompareSet) {
      proto::Reader r(body + 1, n - 1);
      const std::string key(r.str(proto::kMaxKey));
      const std::string expected(r.str(proto::kMaxValue)), desired(r.str(proto::kMaxValue));
      if (!r.done()) return false;
      auto it = data.find(key);
      if (it == data.end() ? expected.empty() : it->second == expected) {
        set(key, desired);
        reply(c, proto::Status::kOk, desired);
      } else {
        reply(c, proto::Status::kOk, it == data.end() ? std::string() : it->second);
      }
      return true;
    }
    proto::Request req;
    if (!proto::parse_request(body, n, &req)) return false;
    const std::string key(req.key);
    switch (req.cmd) {
      case Cmd::kSet:
        set(key, std::string(req.value));
        reply(c, proto::Status::kOk, "");
        return true;
      case Cmd::kGet: {
        auto it = data.find(key);
        if (it != data.end()) {
          reply(c, proto::Status::kOk, it->second);
        } else {
          park(id, c, Park::kShoalGet, {key}, key);
        }
        return true;
      }
      case Cmd::kAdd: {
        int64_t v = 0;
        auto it = data.find(key);
        if (it != data.end() && !parse_i64(it->second, &v)) {
          reply(c, proto::Status::kError, "ADD of key '" + key + "': its value is not an integer");
          return true;
        }
        v += req.delta;
        std::string payload;
        put<int64_t>(&payload, v);
        set(key, std::to_string(v));
        reply(c, proto::Status::kOk, payload);
        return true;
      }
      case Cmd::kCheck:
      case Cmd::kWait: {
        std::unordered_set<std::string> missing;
        for (auto k : req.keys) {
          if (!data.count(std::string(k))) missing.insert(std::string(k));
        }
        if (req.cmd == Cmd::kCheck) {
          reply(c, proto::Status::kOk, std::string(1, missing.empty() ? '\1' : '\0'));
        } else if (missing.empty()) {
          reply(c, proto::Status::kOk, "");
        } else {
          park(id, c, Park::kShoalWait, std::move(missing), "");
        }
        return true;
      }
      case Cmd::kDelete:
        reply(c, proto::Status::kOk, std::string(1, data.erase(key) > 0 ? '\1' : '\0'));
        return true;
      case Cmd::kMultiGet:
        c.get_keys.assign(req.keys.begin(), req.keys.end());
        shoal_multi_get(id, c);
        return true;
      default:
        return false;
    }
  }

  // Answers the MULTI_GET of c.get_keys once every key holds a value (a key
  // deleted since it was set parks the request again).
  void shoal_multi_get(uint64_t id, Conn& c) {
    std::unordered_set<std::string> missing;
    size_t body = 4;
    for (const auto& k : c.get_keys) {
      auto it = data.find(k);
      if (it == data.end()) missing.insert(k);
      else body += 4 + it->second.size();
    }
    if (!missing.empty()) {
      park(id, c, Park::kShoalMultiGet, std::move(missing), "");
      return;
    }
    if (body > proto::kMaxValue) {
      reply(c, proto::Status::kError, "MULTI_GET of " + std::to_string(c.get_keys.size()) + " keys: the values take " +
                                          std::to_string(body) + " bytes, over the limit of a reply (ask for fewer "
                                          "keys at a time)");
    } else {
      std::string payload;
      payload.reserve(body);
      put<uint32_t>(&payload, static_cast<uint32_t>(c.get_keys.size()));
      for (const auto& k : c.get_keys) {
        const std::string& v = data[k];
        put<uint32_t>(&payload, static_cast<uint32_t>(v.size()));
        payload.append(v);
      }
      reply(c, proto::Status::kOk, payload);
    }
    c.get_keys.clear();
  }

  void park(uint64_t id, Conn& c, Park kind, std::unordered_set<std::string> missing, const std::string& get_key) {
    unpark(id, c);
    c.park = kind;
    c.get_key = get_key;
    c.missing = std::move(missing);
    for (const auto& k : c.missing) waiters[k].insert(id);
  }

  void unpark(uint64_t id, Conn& c) {
    for (const auto& k : c.missing) {
      auto w = waiters.find(k);
      if (w == waiters.end()) continue;
      w->second.erase(id);
      if (w->second.empty()) waiters.erase(w);
    }
    c.missing.clear();
    c.park = Park::kNone;
  }

  void set(const std::string& key, std::string value) {
    data[key] = std::move(value);
    auto w = waiters.find(key);
    if (w == waiters.end()) return;
    const std::unordered_set<uint64_t> ids = std::move(w->second);
    waiters.erase(w);
    for (uint64_t id : ids) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      c.missing.erase(key);
      if (!c.missing.empty()) continue;
      const Park kind = c.park;
      unpark(id, c);
      touched.push_back(id);
      if (kind == Park::kTorchWait) {
        put<uint8_t>(&c.out, kStopWaiting);
      } else if (kind == Park::kShoalWait) {
        reply(c, proto::Status::kOk, "");
      } else if (kind == Park::kShoalGet) {
        reply(c, proto::Status::kOk, data[c.get_key]);
      } else if (kind == Park::kShoalMultiGet) {
        shoal_multi_get(id, c);
      }
    }
  }

  // Sends what fits; false when the connection is gone.
  bool flush(Conn& c) {
    while (c.out_pos < c.out.size()) {
      const ssize_t w = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.out_pos += static_cast<size_t>(w);
    }
    c.out.clear();
    c.out_pos = 0;
    return true;
  }
};

WorkersStore::WorkersStore(const std::string& host, uint16_t port, const shoal::auth::Secret& secret)
    : impl_(std::make_unique<Impl>()) {
  const bool loopback = host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
  try {
    impl_->listen = shoal::net::listen_tcp(loopback ? host : "", port, shoal::net::kStoreBacklog);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot host the workers' store on port " + std::to_string(port) + ": " + e.what());
  }
  shoal::net::set_nonblocking(impl_->listen.get(), true);
  port_ = shoal::net::bound_port(impl_->listen.get());
  impl_->secret = secret;
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
  impl_->epoll.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!impl_->epoll || !impl_->watch(EPOLL_CTL_ADD, impl_->listen.get(), Impl::kListenTag, EPOLLIN) ||
      !impl_->watch(EPOLL_CTL_ADD, impl_->wake[0], Impl::kWakeTag, EPOLLIN)) {
    throw std::runtime_error(std::string("cannot set up the workers' store's epoll loop: ") + std::strerror(errno));
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

WorkersStore::~WorkersStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  const char b = 1;
  (void)!::write(impl_->wake[1], &b, 1);
  if (impl_->thread.joinable()) impl_->thread.join();
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

void WorkersStore::erase_prefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto it = impl_->data.begin(); it != impl_->data.end();) {
    if (it->first.rfind(prefix, 0) == 0) {
      it = impl_->data.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace shoalrun
