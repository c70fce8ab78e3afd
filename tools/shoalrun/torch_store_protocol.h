// shoalrun/torch_store_protocol.h — torch's TCPStore wire format, as the
// workers' store (workers_store.h) reads and writes it: the query types and
// constants of c10d's TCPStoreBackend.hpp, a bounds-checked reader of a
// query's fields, and the writers of a reply's. Pure: no socket, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace shoalrun::torch_proto {

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

constexpr size_t kMaxKey = size_t{64} << 10;
constexpr size_t kMaxValue = size_t{256} << 20;
constexpr uint64_t kMaxCount = uint64_t{1} << 20;

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
inline void put_vec(std::string* out, const std::string& v) {
  put<uint64_t>(out, v.size());
  out->append(v);
}

// torch's client puts "/" before every key.
inline std::string torch_key(std::string raw) {
  if (!raw.empty() && raw[0] == '/') raw.erase(0, 1);
  return raw;
}

}  // namespace shoalrun::torch_proto
