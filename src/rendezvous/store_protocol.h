// rendezvous/store_protocol.h — the TcpStore wire format, shared by client and server.
//
// Every message is a frame: u32 body length, then the body. Integers are
// little-endian; a "str" is a u32 length followed by that many bytes.
//
//   request body  = u8 command, then its fields:
//     SET    str key, str value         -> (empty)
//     GET    str key                    -> value bytes  (answered once the key exists)
//     ADD    str key, i64 delta         -> i64 new value (stored as decimal text)
//     CHECK  u32 n, n x str key         -> u8 all-exist
//     WAIT   u32 n, n x str key         -> (empty)      (answered once all keys exist)
//     DELETE str key                    -> u8 existed
//     COMPARE_SET str key, str expected, str desired -> value bytes (what key holds after)
//     MULTI_GET u32 n, n x str key      -> u32 n, n x str value  (answered once all keys
//                                          exist; the values in the keys' order)
//   response body = u8 status (0 ok, 1 error), then the result above, or for
//                   an error the message text.
//
// A client has at most one request in flight per connection; it times out on
// its own side and then closes the connection, which drops any parked request.
// A request that breaks the format or the limits below closes the connection.
//
// Before any request, a handshake (docs/security.md); integers little-endian:
//   client -> server  HELLO   u32 "SHSC", u16 version, u16 flags (1: has a secret), nonce[32]
//   server -> client  ANSWER  u32 "SHSS", u16 version, u16 flags (1: has a secret,
//                             2: refused, the client has none), nonce[32], mac[32]
//   client -> server  PROOF   mac[32]                 (only when both have a secret)
// With a secret on both sides, each mac is auth::prove(role, kStore, both
// nonces): the client checks the server's before it sends its own, and the
// server reads no request before the client's checks out. A client with a
// secret refuses a server without one, and the reverse. The server reads
// no more than the handshake's bytes from a connection before it is done,
// and drops a connection that has not finished it within
// TcpStoreOptions::handshake_timeout (10 s).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/auth.h"
#include "shoal/store.h"

namespace shoal::store_proto {

enum class Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kDelete = 6, kCompareSet = 7,
                         kMultiGet = 8 };
enum class Status : uint8_t { kOk = 0, kError = 1 };

inline constexpr size_t kMaxKey = 4096;              // bytes per key
inline constexpr size_t kMaxValue = size_t{64} << 20;  // bytes per value
inline constexpr size_t kMaxKeys = size_t{1} << 20;  // keys per CHECK/WAIT/MULTI_GET
// The largest legal body: a SET of a maximal key and value.
inline constexpr size_t kMaxBody = 1 + 4 + kMaxKey + 4 + kMaxValue;
inline constexpr size_t kFrameHeader = 4;

inline const char* cmd_name(Cmd c) {
  switch (c) {
    case Cmd::kSet: return "SET";
    case Cmd::kGet: return "GET";
    case Cmd::kAdd: return "ADD";
    case Cmd::kCheck: return "CHECK";
    case Cmd::kWait: return "WAIT";
    case Cmd::kDelete: return "DELETE";
    case Cmd::kCompareSet: return "COMPARE_SET";
    case Cmd::kMultiGet: return "MULTI_GET";
  }
  return "?";
}

inline void put_u32_at(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32_at(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
inline uint16_t get_u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline void put_u16_at(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Appends one frame to a byte buffer: the constructor reserves the length
// field, end() patches it.
class Writer {
 public:
  explicit Writer(Bytes* out) : out_(out), start_(out->size()) { out_->resize(start_ + kFrameHeader); }
  void u8(uint8_t v) { out_->push_back(v); }
  void u32(uint32_t v) {
    size_t at = out_->size();
    out_->resize(at + 4);
    put_u32_at(out_->data() + at, v);
  }
  void i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_->push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void bytes(const Bytes& b) {
    u32(static_cast<uint32_t>(b.size()));
    raw(b.data(), b.size());
  }
  // Patches the frame length; returns the body size. `trailing` bytes of the
  // body are not in the buffer: the caller sends them right after it.
  size_t end(size_t trailing = 0) {
    size_t body = out_->size() - start_ - kFrameHeader + trailing;
    put_u32_at(out_->data() + start_, static_cast<uint32_t>(body));
    return body;
  }

 private:
  Bytes* out_;
  size_t start_;
};

// Bounds-checked reader over one frame body. Any failed read sets !ok() and
// returns a zero value; check ok() (and done()) once at the end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() { return take(1) ? p_[pos_ - 1] : 0; }
  uint32_t u32() { return take(4) ? get_u32_at(p_ + pos_ - 4) : 0; }
  int64_t i64() {
    if (!take(8)) return 0;
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t{p_[pos_ - 8 + i]} << (8 * i);
    return static_cast<int64_t>(u);
  }
  // A str of at most `max` bytes (longer = malformed).
  std::string_view str(size_t max) {
    uint32_t len = u32();
    if (!ok_ || len > max || !take(len)) {
      ok_ = false;
      return {};
    }
    return {reinterpret_cast<const char*>(p_ + pos_ - len), len};
  }
  std::string_view rest() {
    std::string_view v(reinterpret_cast<const char*>(p_ + pos_), n_ - pos_);
    pos_ = n_;
    return v;
  }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == n_; }

 private:
  bool take(size_t k) {
    if (!ok_ || n_ - pos_ < k) {
      ok_ = false;
      return false;
    }
    pos_ += k;
    return true;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// ---- requests, parsed (the server's parser; tests/fuzz/fuzz_store_server.cc)

// One request; the views point into the frame body.
struct Request {
  Cmd cmd = Cmd::kSet;
  std::string_view key;                // SET, GET, ADD, DELETE
  std::string_view value;              // SET; COMPARE_SET: the desired value
  std::string_view expected;           // COMPARE_SET
  int64_t delta = 0;                   // ADD
  std::vector<std::string_view> keys;  // CHECK, WAIT, MULTI_GET
};

// Parses one frame body; false when it is malformed (unknown command, a field
// cut short or over its limit, trailing bytes).
inline bool parse_request(const uint8_t* body, size_t n, Request* out) {
  Reader r(body, n);
  out->cmd = static_cast<Cmd>(r.u8());
  out->keys.clear();
  switch (out->cmd) {
    case Cmd::kSet:
      out->key = r.str(kMaxKey);
      out->value = r.str(kMaxValue);
      return r.done();
    case Cmd::kGet:
    case Cmd::kDelete:
      out->key = r.str(kMaxKey);
      return r.done();
    case Cmd::kAdd:
      out->key = r.str(kMaxKey);
      out->delta = r.i64();
      return r.done();
    case Cmd::kCompareSet:
      out->key = r.str(kMaxKey);
      out->expected = r.str(kMaxValue);
      out->value = r.str(kMaxValue);
      return r.done();
    case Cmd::kCheck:
    case Cmd::kWait:
    case Cmd::kMultiGet: {
      const uint32_t k = r.u32();
      if (!r.ok() || k > kMaxKeys || k > (n - 5) / 4) return false;  // each key takes at least 4 bytes
      out->keys.reserve(k);
      for (uint32_t i = 0; i < k && r.ok(); ++i) out->keys.push_back(r.str(kMaxKey));
      return r.done();
    }
  }
  return false;
}

enum class FrameStatus { kNeedMore, kBad, kOk };

// Splits the next frame off buffered bytes p[0, n): kOk sets the body and
// the bytes the frame takes; kBad for a length of 0 or over kMaxBody.
inline FrameStatus next_frame(const uint8_t* p, size_t n, const uint8_t** body, size_t* body_len, size_t* used) {
  if (n < kFrameHeader) return FrameStatus::kNeedMore;
  const uint32_t len = get_u32_at(p);
  if (len == 0 || len > kMaxBody) return FrameStatus::kBad;
  if (n - kFrameHeader < len) return FrameStatus::kNeedMore;
  *body = p + kFrameHeader;
  *body_len = len;
  *used = kFrameHeader + len;
  return FrameStatus::kOk;
}

// ---- the handshake -------------------------------------------------------

inline constexpr uint32_t kHelloMagic = 0x43534853;   // "SHSC" on the wire
inline constexpr uint32_t kAnswerMagic = 0x53534853;  // "SHSS"
inline constexpr uint16_t kHandshakeVersion = 1;
inline constexpr uint16_t kHasSecret = 1;
inline constexpr uint16_t kRefused = 2;
inline constexpr size_t kHelloBytes = 8 + auth::kNonceBytes;
inline constexpr size_t kAnswerBytes = 8 + auth::kNonceBytes + auth::kMacBytes;
inline constexpr size_t kProofBytes = auth::kMacBytes;

inline auth::Transcript store_transcript(const uint8_t* client_nonce, const uint8_t* server_nonce) {
  auth::Transcript t;
  t.link = auth::Link::kStore;
  std::memcpy(t.connector.data(), client_nonce, auth::kNonceBytes);
  std::memcpy(t.acceptor.data(), server_nonce, auth::kNonceBytes);
  return t;
}

// The client's HELLO, with a fresh nonce (kept in *nonce).
inline Bytes client_hello(const auth::Secret& secret, auth::Nonce* nonce) {
  Bytes b(kHelloBytes);
  put_u32_at(b.data(), kHelloMagic);
  put_u16_at(b.data() + 4, kHandshakeVersion);
  put_u16_at(b.data() + 6, secret.empty() ? 0 : kHasSecret);
  *nonce = auth::fresh_nonce();
  std::memcpy(b.data() + 8, nonce->data(), nonce->size());
  return b;
}

// The client's check of the server's ANSWER (kAnswerBytes): "" when it may go
// on, after sending *proof (empty when none is due); else why not.
inline std::string check_answer(const uint8_t* a, const auth::Secret& secret, const auth::Nonce& mine, Bytes* proof) {
  proof->clear();
  if (get_u32_at(a) != kAnswerMagic) return "it is not a shoal store (an unexpected answer to the handshake)";
  if (get_u16_at(a + 4) != kHandshakeVersion) {
    return "it speaks handshake version " + std::to_string(get_u16_at(a + 4)) + " (another shoal release?)";
  }
  const uint16_t flags = get_u16_at(a + 6);
  if (flags & kRefused) {
    return "the store requires the job's secret and this process has none (set SHOAL_SECRET as on the store's host; "
           "shoalrun sets it for its workers)";
  }
  const bool server_has = flags & kHasSecret;
  if (secret.empty()) return server_has ? "the store asks for a secret this process does not have" : "";
  if (!server_has) {
    return "the store does not check the job's secret, but this process has one (SHOAL_SECRET): refusing it "
           "(a store started without the secret, or not this job's store)";
  }
  const auth::Transcript t = store_transcript(mine.data(), a + 8);
  if (!auth::verify(secret, auth::Role::kAcceptor, t, a + 8 + auth::kNonceBytes)) {
    return "the store did not prove the job's secret (SHOAL_SECRET differs from the store's, or it is another "
           "job's store)";
  }
  const auth::Mac m = auth::prove(secret, auth::Role::kConnector, t);
  proof->assign(m.begin(), m.end());
  return "";
}

// The server's side, fed what a connection has sent so far (from its first
// byte on). Pure: no socket, no clock.
class ServerHandshake {
 public:
  enum class Step { kMore, kDone, kRefuse };
  explicit ServerHandshake(const auth::Secret* secret) : secret_(secret) {}

  // Looks at p[0, n), the connection's unconsumed bytes, and consumes *used
  // of them (whatever it returns). kMore: needs more bytes (no more than
  // wanted() of them belong to the handshake); kDone: requests follow;
  // kRefuse: close the connection after sending *out (*why says why).
  // Bytes to send are appended to *out.
  Step feed(const uint8_t* p, size_t n, size_t* used, Bytes* out, std::string* why) {
    *used = 0;
    if (stage_ == Stage::kHello) {
      if (n >= 4 && get_u32_at(p) != kHelloMagic) return refuse(why, "not a shoal store client (bad magic)");
      if (n >= 6 && get_u16_at(p + 4) != kHandshakeVersion) {
        return refuse(why, "handshake version " + std::to_string(get_u16_at(p + 4)) + " (another shoal release?)");
      }
      if (n < kHelloBytes) return Step::kMore;
      const bool client_has = get_u16_at(p + 6) & kHasSecret;
      const bool server_has = secret_ != nullptr && !secret_->empty();
      std::memcpy(client_.data(), p + 8, client_.size());
      server_ = auth::fresh_nonce();
      size_t at = out->size();
      out->resize(at + kAnswerBytes, 0);
      uint8_t* a = out->data() + at;
      put_u32_at(a, kAnswerMagic);
      put_u16_at(a + 4, kHandshakeVersion);
      put_u16_at(a + 6, static_cast<uint16_t>((server_has ? kHasSecret : 0) | (server_has && !client_has ? kRefused : 0)));
      std::memcpy(a + 8, server_.data(), server_.size());
      *used = kHelloBytes;
      if (server_has && !client_has) {
        return refuse(why, "it has no secret, and this store requires the job's (SHOAL_SECRET)");
      }
      if (!server_has || !client_has) {
        stage_ = Stage::kDone;  // (a client with a secret refuses this server itself)
        return Step::kDone;
      }
      const auth::Mac m = auth::prove(*secret_, auth::Role::kAcceptor, store_transcript(client_.data(), server_.data()));
      std::memcpy(a + 8 + auth::kNonceBytes, m.data(), m.size());
      stage_ = Stage::kProof;
      p += kHelloBytes;
      n -= kHelloBytes;
    }
    if (stage_ == Stage::kProof) {
      if (n < kProofBytes) return Step::kMore;
      if (!auth::verify(*secret_, auth::Role::kConnector, store_transcript(client_.data(), server_.data()), p)) {
        return refuse(why, "it did not prove the job's secret (a different SHOAL_SECRET)");
      }
      *used += kProofBytes;
      stage_ = Stage::kDone;
    }
    return stage_ == Stage::kDone ? Step::kDone : Step::kRefuse;
  }

  // At most this many more bytes belong to the handshake.
  size_t wanted() const {
    return stage_ == Stage::kHello ? kHelloBytes + kProofBytes : stage_ == Stage::kProof ? kProofBytes : 0;
  }
  bool done() const { return stage_ == Stage::kDone; }
  bool answered() const { return stage_ != Stage::kHello; }  // a whole hello came

 private:
  enum class Stage { kHello, kProof, kDone, kRefused };
  Step refuse(std::string* why, std::string text) {
    *why = std::move(text);
    stage_ = Stage::kRefused;
    return Step::kRefuse;
  }
  const auth::Secret* secret_;
  Stage stage_ = Stage::kHello;
  auth::Nonce client_{};
  auth::Nonce server_{};
};

}  // namespace shoal::store_proto
