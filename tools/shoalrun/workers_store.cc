// shoalrun/workers_store.cc — see workers_store.h.
#include "workers_store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
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

namespace shoalrun {
namespace {

namespace proto = shoal::store_proto;
using Clock = std::chrono::steady_clock;

// torch's c10d::detail::QueryType and its constants (TCPStoreBackend.hpp).
enum TorchQuery : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
constexpr uint8_t kShoalCompareSet = 7;  // shoal's COMPARE_SET (store_protocol.h)

constexpr size_t kMaxKey = size_t{64} << 10;
constexpr size_t kMaxValue = size_t{256} << 20;
constexpr uint64_t kMaxCount = uint64_t{1} << 20;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

// Reads little-endian fields of a torch query from buffered bytes. A read
// past the end sets short_ (wait for more); a length over its limit sets bad_.
class Cursor {
 public:
  Cursor(const char* p, size_t n) : p_(p), n_(n) {}
  template <class T>
  T value() {
    T v{};
    if (!take(sizeof(T))) return v;
    std::memcpy(&v, p_ + pos_ - sizeof(T), sizeof(T));  // the host is little-endian, as torch assumes
    return v;
  }
  std::string str(size_t max) {
    const auto len = value<uint64_t>();
    if (!ok()) return {};
    if (len > max) {
      bad_ = true;
      return {};
    }
    if (!take(len)) return {};
    return std::string(p_ + pos_ - len, len);
  }
  uint64_t count() {
    const auto k = value<uint64_t>();
    if (ok() && k > kMaxCount) bad_ = true;
    return ok() ? k : 0;
  }
  bool ok() const { return !short_ && !bad_; }
  bool bad() const { return bad_; }
  size_t used() const { return pos_; }

 private:
  bool take(size_t k) {
    if (!ok()) return false;
    if (n_ - pos_ < k) {
      short_ = true;
      return false;
    }
    pos_ += k;
    return true;
  }
  const char* p_;
  size_t n_;
  size_t pos_ = 0;
  bool short_ = false;
  bool bad_ = false;
};

template <class T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_vec(std::string* out, const std::string& v) {
  put<uint64_t>(out, v.size());
  out->append(v);
}

// torch's client puts "/" before every key.
std::string torch_key(std::string raw) {
  if (!raw.empty() && raw[0] == '/') raw.erase(0, 1);
  return raw;
}

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
  enum class Park { kNone, kTorchWait, kShoalGet, kShoalWait };
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
    std::unordered_set<std::string> missing;
  };

  shoal::auth::Secret secret;
  shoal::net::Fd listen;
  int wake[2] = {-1, -1};
  std::thread thread;

  std::mutex mu;  // guards everything below (the thread holds it while it serves a batch)
  bool stop = false;
  uint64_t next_id = 1;
  std::map<uint64_t, Conn> conns;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters;
  std::set<std::string> refused_queries;  // logged once each

  void run() noexcept {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    while (true) {
      fds.clear();
      ids.clear();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
        fds.push_back({listen.get(), POLLIN, 0});
        fds.push_back({wake[0], POLLIN, 0});
        for (auto& [id, c] : conns) {
          short ev = POLLIN;
          if (c.out_pos < c.out.size()) ev |= POLLOUT;
          fds.push_back({c.fd.get(), ev, 0});
          ids.push_back(id);
        }
      }
      const int n = ::poll(fds.data(), fds.size(), 1000);
      if (n < 0 && errno != EINTR) return;
      std::lock_guard<std::mutex> lock(mu);
      if (stop) return;
      if (fds[1].revents != 0) {
        char b[64];
        while (::read(wake[0], b, sizeof(b)) > 0) {
        }
      }
      if (fds[0].revents != 0) accept_all();
      for (size_t i = 0; i < ids.size(); ++i) {
        const short re = fds[i + 2].revents;
        if (re == 0) continue;
        auto it = conns.find(ids[i]);
        if (it == conns.end()) continue;
        bool keep = true;
        if (re & (POLLIN | POLLHUP | POLLERR)) keep = read_some(ids[i], it->second);
        if (!keep) close_conn(ids[i]);
      }
      // Flush what the batch queued (replies, and waits it completed), and
      // drop silent strangers.
      const auto now = Clock::now();
      std::vector<uint64_t> dead;
      for (auto& [id, c] : conns) {
        if (!flush(c)) dead.push_back(id);
        else if (c.proto != Proto::kTorch && !(c.shake && c.shake->done()) && now - c.born > kHandshakeTimeout) {
          log("workers' store: dropped " + c.from + ": no handshake within 10 s");
          dead.push_back(id);
        }
      }
      for (uint64_t id : dead) close_conn(id);
    }
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
      conns.emplace(next_id++, std::move(c));
    }
  }

  void close_conn(uint64_t id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    unpark(id, it->second);
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
      default:
        return false;
    }
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
      if (kind == Park::kTorchWait) {
        put<uint8_t>(&c.out, kStopWaiting);
      } else if (kind == Park::kShoalWait) {
        reply(c, proto::Status::kOk, "");
      } else if (kind == Park::kShoalGet) {
        reply(c, proto::Status::kOk, data[c.get_key]);
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
    impl_->listen = shoal::net::listen_tcp(loopback ? host : "", port);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot host the workers' store on port " + std::to_string(port) + ": " + e.what());
  }
  shoal::net::set_nonblocking(impl_->listen.get(), true);
  port_ = shoal::net::bound_port(impl_->listen.get());
  impl_->secret = secret;
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe failed");
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
