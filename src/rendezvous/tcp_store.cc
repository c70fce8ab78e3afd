// rendezvous/tcp_store.cc — TcpStore: the client side, and ownership of the
// server (tcp_store_server.cc) when is_server.
//
// The client keeps one blocking socket, guarded by a mutex, with at most one
// request in flight. On a client-side timeout it closes the socket (the server
// then drops the parked request) and reconnects on the next call, so a late
// reply can never be mistaken for the next request's. A lost connection is
// final: that call and every later one throw StoreError with the first cause.
// Every connection starts with the handshake of store_protocol.h (the job's
// secret, when there is one, proved both ways); a failed one is a StoreError
// that says why.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "common/net.h"
#include "common/thread_annotations.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store_server.h"
#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {
namespace {

using std::chrono::milliseconds;
using store_proto::Cmd;
using store_proto::Writer;

net::Clock::time_point deadline_after(milliseconds ms) {
  const auto now = net::Clock::now();
  if (ms.count() <= 0) return now;
  if (ms >= std::chrono::duration_cast<milliseconds>(net::Clock::time_point::max() - now)) {
    return net::Clock::time_point::max();
  }
  return now + ms;
}

std::string join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// The server binds loopback names as given (nothing else can reach them
// anyway) and otherwise every interface, so that a hostname that resolves to
// 127.0.1.1 locally and to a real address elsewhere works from both sides.
std::string bind_host_for(const std::string& h) {
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0 || h == "0.0.0.0") return h;
  return "";
}

// Where a client connects when given a wildcard address.
std::string connect_host_for(const std::string& h) {
  if (h.empty() || h == "0.0.0.0" || h == "*") return "127.0.0.1";
  if (h == "::") return "::1";
  return h;
}

void check_key(const std::string& key) {
  if (key.size() > store_proto::kMaxKey) {
    throw InvalidArgument("store: key of " + std::to_string(key.size()) + " bytes exceeds the " +
                          std::to_string(store_proto::kMaxKey) + "-byte limit: '" + key.substr(0, 64) + "...'");
  }
}

// A CHECK, WAIT or MULTI_GET request: the command, then the keys.
Bytes keys_frame(Cmd cmd, const std::vector<std::string>& keys) {
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(cmd));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  if (keys.size() > store_proto::kMaxKeys || w.end() > store_proto::kMaxBody) {
    throw InvalidArgument(std::string("store: ") + store_proto::cmd_name(cmd) + " of " + std::to_string(keys.size()) +
                          " keys exceeds the request limit");
  }
  return f;
}

std::string keys_text(const std::vector<std::string>& keys) {
  std::string s = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size() && i < 4; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 4) s += " and " + std::to_string(keys.size() - 4) + " more";
  return s;
}

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions opts;
  auth::Secret secret;  // the job's (options, else SHOAL_SECRET); may be empty
  std::string connect_host;
  uint16_t port = 0;
  std::string addr;  // "host:port", for messages
  std::atomic<int64_t> timeout_ms{0};
  std::unique_ptr<detail::StoreServer> server;  // is_server only
  pid_t owner_pid = ::getpid();

  ~Impl() {
    // In a forked child the server's thread does not exist and its state may be
    // mid-update: leak the copy rather than join or destroy it. The parent's
    // server is unaffected.
    if (server && ::getpid() != owner_pid) (void)server.release();
  }

  Mutex mu;
  net::Fd sock GUARDED_BY(mu);      // closed after a client-side timeout
  std::string lost GUARDED_BY(mu);  // non-empty once the connection broke

  milliseconds timeout() const { return milliseconds(timeout_ms.load(std::memory_order_relaxed)); }

  void connect_locked(net::Clock::time_point deadline) REQUIRES(mu) {
    try {
      sock = net::connect_tcp(connect_host, port, deadline);
    } catch (const TimeoutError& e) {
      throw TimeoutError("store: could not reach the store at " + addr + " (" + e.what() + ")");
    } catch (const Error& e) {
      throw StoreError("store: cannot connect to the store at " + addr + " (" + e.what() + ")");
    }
    // (Once connected, the handshake gets its own bound, however little of
    // the connect deadline is left: the server answers at once.)
    handshake_locked(deadline_after(opts.handshake_timeout));
  }

  // The client's side of the handshake (store_protocol.h), on a fresh socket.
  void handshake_locked(net::Clock::time_point deadline) REQUIRES(mu) {
    auto refuse = [&](const std::string& why) REQUIRES(mu) {
      sock.reset();
      throw StoreError("store: refusing the store at " + addr + ": " + why);
    };
    try {
      auth::Nonce nonce;
      const Bytes hello = store_proto::client_hello(secret, &nonce);
      uint8_t answer[store_proto::kAnswerBytes];
      if (!net::write_full(sock.get(), hello.data(), hello.size(), deadline) ||
          !net::read_full(sock.get(), answer, sizeof(answer), deadline)) {
        refuse("it closed the connection during the handshake (not a shoal store of this release?)");
      }
      Bytes proof;
      const std::string bad = store_proto::check_answer(answer, secret, nonce, &proof);
      if (!bad.empty()) refuse(bad);
      if (!proof.empty() && !net::write_full(sock.get(), proof.data(), proof.size(), deadline)) {
        refuse("it closed the connection during the handshake");
      }
    } catch (const TimeoutError&) {
      refuse("no answer to the handshake within " + std::to_string(opts.handshake_timeout.count()) +
             " ms (not a shoal store?)");
    } catch (const InternalError& e) {
      refuse(std::string("the handshake failed: ") + e.what());
    }
  }

  [[noreturn]] void fail_locked(const std::string& why) REQUIRES(mu) {
    lost = why;
    sock.reset();
    throw StoreError(why);
  }

  // Sends one request frame and returns the reply's payload (after the status
  // byte). `what` names the request in messages ("GET of key 'k'");
  // `timeout_msg` is the TimeoutError text.
  // `tail`, when given, is the end of the frame, sent from the caller's buffer.
  Bytes call(const Bytes& frame, net::Clock::time_point deadline, const std::string& what,
             const std::string& timeout_msg, const Bytes* tail = nullptr) {
    MutexLock lock(mu);
    if (!lost.empty()) throw StoreError(lost);
    if (!sock) connect_locked(std::min(deadline, deadline_after(opts.connect_timeout)));
    const std::string gone = "store: lost the connection to " + addr + " during " + what +
                             " (is the store server still running?)";
    try {
      if (!net::write_full(sock.get(), frame.data(), frame.size(), deadline)) fail_locked(gone);
      if (tail != nullptr && !net::write_full(sock.get(), tail->data(), tail->size(), deadline)) fail_locked(gone);
      uint8_t head[store_proto::kFrameHeader + 1];
      if (!net::read_full(sock.get(), head, sizeof(head), deadline)) fail_locked(gone);
      const uint32_t len = store_proto::get_u32_at(head);
      const auto status = static_cast<store_proto::Status>(head[store_proto::kFrameHeader]);
      if (len == 0 || len > 1 + store_proto::kMaxValue ||
          (status != store_proto::Status::kOk && status != store_proto::Status::kError)) {
        fail_locked("store: malformed reply from " + addr + " to " + what + " (not a shoal store?)");
      }
      Bytes payload(len - 1);
      if (!net::read_full(sock.get(), payload.data(), payload.size(), deadline)) fail_locked(gone);
      if (status == store_proto::Status::kError) {
        throw StoreError("store: " + std::string(payload.begin(), payload.end()) + " at " + addr);
      }
      return payload;
    } catch (const TimeoutError&) {
      sock.reset();  // the server drops the parked request when it sees the close
      throw TimeoutError(timeout_msg);
    } catch (const InternalError& e) {
      fail_locked("store: connection to " + addr + " failed during " + what + ": " + e.what());
    }
  }

  Bytes call_key(Cmd cmd, const Bytes& frame, const std::string& key, const Bytes* tail = nullptr) {
    const milliseconds t = timeout();
    const std::string what = std::string(store_proto::cmd_name(cmd)) + " of key '" + key + "'";
    std::string tmsg = cmd == Cmd::kGet
                           ? "store: timed out after " + std::to_string(t.count()) + " ms waiting for key '" +
                                 key + "' at " + addr
                           : "store: timed out after " + std::to_string(t.count()) + " ms on " + what + " at " +
                                 addr + " (no reply from the server)";
    return call(frame, deadline_after(t), what, tmsg, tail);
  }
};

TcpStore::TcpStore(const TcpStoreOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opts = opts;
  s.secret = opts.secret.empty() ? auth::Secret::from_env() : auth::Secret::from_hex(opts.secret, "TcpStoreOptions::secret");
  s.timeout_ms = opts.timeout.count();
  s.port = opts.port;
  if (opts.is_server) {
    try {
      s.server = std::make_unique<detail::StoreServer>(bind_host_for(opts.host), opts.port, s.secret,
                                                      opts.handshake_timeout);
    } catch (const Error& e) {
      throw StoreError("store: cannot start the server at " + join_host_port(opts.host, opts.port) + " (" +
                       e.what() + ")");
    }
    s.port = s.server->port();
  } else if (opts.port == 0) {
    throw InvalidArgument("store: a client needs the server's port (port 0 is valid only with is_server)");
  }
  s.connect_host = connect_host_for(opts.host);
  s.addr = join_host_port(opts.host, s.port);
  MutexLock lock(s.mu);
  s.connect_locked(deadline_after(opts.connect_timeout));
}

TcpStore::~TcpStore() = default;  // closes the client socket, then stops the server

void TcpStore::set(const std::string& key, const Bytes& value) {
  check_key(key);
  if (value.size() > store_proto::kMaxValue) {
    throw InvalidArgument("store: value of " + std::to_string(value.size()) + " bytes for key '" + key +
                          "' exceeds the " + std::to_string(store_proto::kMaxValue) + "-byte limit");
  }
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(Cmd::kSet));
  w.str(key);
  w.u32(static_cast<uint32_t>(value.size()));
  w.end(value.size());
  impl_->call_key(Cmd::kSet, f, key, &value);  // the value goes from the caller's buffer
}

Bytes TcpStore::get(const std::string& key) {
  check_key(key);
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(Cmd::kGet));
  w.str(key);
  w.end();
  return impl_->call_key(Cmd::kGet, f, key);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_key(key);
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(Cmd::kAdd));
  w.str(key);
  w.i64(delta);
  w.end();
  Bytes r = impl_->call_key(Cmd::kAdd, f, key);
  store_proto::Reader rd(r.data(), r.size());
  const int64_t v = rd.i64();
  if (!rd.done()) throw StoreError("store: malformed reply to ADD of key '" + key + "' from " + impl_->addr);
  return v;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const Bytes f = keys_frame(Cmd::kCheck, keys);
  const milliseconds t = impl_->timeout();
  const std::string what = "CHECK of " + keys_text(keys);
  Bytes r = impl_->call(f, deadline_after(t), what,
                        "store: timed out after " + std::to_string(t.count()) + " ms on " + what + " at " +
                            impl_->addr + " (no reply from the server)");
  if (r.size() != 1) throw StoreError("store: malformed reply to " + what + " from " + impl_->addr);
  return r[0] != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  const Bytes f = keys_frame(Cmd::kWait, keys);
  impl_->call(f, deadline_after(timeout), "WAIT on " + keys_text(keys),
              "store: timed out after " + std::to_string(timeout.count()) + " ms waiting for " + keys_text(keys) +
                  " at " + impl_->addr);
}

std::vector<Bytes> TcpStore::multi_get(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  const Bytes f = keys_frame(Cmd::kMultiGet, keys);
  const milliseconds t = impl_->timeout();
  const std::string what = "MULTI_GET of " + keys_text(keys);
  Bytes r = impl_->call(f, deadline_after(t), what,
                        "store: timed out after " + std::to_string(t.count()) + " ms waiting for " + keys_text(keys) +
                            " at " + impl_->addr);
  store_proto::Reader rd(r.data(), r.size());
  std::vector<Bytes> values(rd.u32() == keys.size() ? keys.size() : 0);
  for (auto& v : values) {
    const std::string_view b = rd.str(store_proto::kMaxValue);
    v.assign(b.begin(), b.end());
  }
  if (values.size() != keys.size() || !rd.done()) {
    throw StoreError("store: malformed reply to " + what + " from " + impl_->addr);
  }
  return values;
}

bool TcpStore::remove(const std::string& key) {
  check_key(key);
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(Cmd::kDelete));
  w.str(key);
  w.end();
  Bytes r = impl_->call_key(Cmd::kDelete, f, key);
  if (r.size() != 1) throw StoreError("store: malformed reply to DELETE of key '" + key + "' from " + impl_->addr);
  return r[0] != 0;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_key(key);
  if (expected.size() > store_proto::kMaxValue || desired.size() > store_proto::kMaxValue) {
    throw InvalidArgument("store: COMPARE_SET of key '" + key + "': a value exceeds the " +
                          std::to_string(store_proto::kMaxValue) + "-byte limit");
  }
  Bytes f;
  Writer w(&f);
  w.u8(static_cast<uint8_t>(Cmd::kCompareSet));
  w.str(key);
  w.bytes(expected);
  w.bytes(desired);
  w.end();
  return impl_->call_key(Cmd::kCompareSet, f, key);
}

milliseconds TcpStore::timeout() const { return impl_->timeout(); }

void TcpStore::set_timeout(milliseconds t) { impl_->timeout_ms.store(t.count(), std::memory_order_relaxed); }

uint16_t TcpStore::port() const { return impl_->port; }

const std::string& TcpStore::host() const { return impl_->opts.host; }

}  // namespace shoal
