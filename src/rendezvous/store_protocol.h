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
//   response body = u8 status (0 ok, 1 error), then the result above, or for
//                   an error the message text.
//
// A client has at most one request in flight per connection; it times out on
// its own side and then closes the connection, which drops any parked request.
// A request that breaks the format or the limits below closes the connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shoal/store.h"

namespace shoal::store_proto {

enum class Cmd : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kDelete = 6 };
enum class Status : uint8_t { kOk = 0, kError = 1 };

inline constexpr size_t kMaxKey = 4096;              // bytes per key
inline constexpr size_t kMaxValue = size_t{64} << 20;  // bytes per value
inline constexpr size_t kMaxKeys = size_t{1} << 20;  // keys per CHECK/WAIT
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
  }
  return "?";
}

inline void put_u32_at(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_u32_at(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
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

}  // namespace shoal::store_proto
