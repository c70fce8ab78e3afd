// bench/start/counting_store.h — a Store that forwards every call to another
// and counts the requests and the bytes they put on the wire.
//
// The bytes are those of the TcpStore protocol (src/rendezvous/store_protocol.h):
// every frame's 4-byte length, the command or status byte, each str's 4-byte
// length and its bytes, both ways. A request is one round trip to the server.
// Thread-safe (the counters are atomics; the base must be thread-safe itself).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::bench {

struct StoreCounts {
  int64_t requests = 0;
  int64_t bytes = 0;    // sent and received
  int64_t addr_gets = 0;  // GETs of a key ending in "addr/<rank>": one per peer whose address was read
};

class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> base) : base_(std::move(base)) {}

  StoreCounts counts() const {
    return {requests_.load(std::memory_order_relaxed), bytes_.load(std::memory_order_relaxed),
            addr_gets_.load(std::memory_order_relaxed)};
  }

  void set(const std::string& key, const Bytes& value) override {
    count(kReq + str(key) + str(value.size()), kResp);
    base_->set(key, value);
  }
  Bytes get(const std::string& key) override {
    if (key.rfind("addr/") != std::string::npos) addr_gets_.fetch_add(1, std::memory_order_relaxed);
    Bytes v = base_->get(key);
    count(kReq + str(key), kResp + v.size());
    return v;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    count(kReq + str(key) + 8, kResp + 8);
    return base_->add(key, delta);
  }
  bool check(const std::vector<std::string>& keys) override {
    count(kReq + 4 + strs(keys), kResp + 1);
    return base_->check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    count(kReq + 4 + strs(keys), kResp);
    base_->wait(keys, timeout);
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override {
    std::vector<Bytes> v = base_->multi_get(keys);
    size_t back = kResp + 4;
    for (const auto& b : v) back += str(b.size());
    count(kReq + 4 + strs(keys), back);
    return v;
  }
  bool remove(const std::string& key) override {
    count(kReq + str(key), kResp + 1);
    return base_->remove(key);
  }
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    Bytes v = base_->compare_set(key, expected, desired);
    count(kReq + str(key) + str(expected.size()) + str(desired.size()), kResp + v.size());
    return v;
  }
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) override { base_->set_timeout(t); }

 private:
  static constexpr size_t kReq = 4 + 1;   // frame length, command
  static constexpr size_t kResp = 4 + 1;  // frame length, status
  static size_t str(const std::string& s) { return 4 + s.size(); }
  static size_t str(size_t n) { return 4 + n; }
  static size_t strs(const std::vector<std::string>& keys) {
    size_t n = 0;
    for (const auto& k : keys) n += str(k);
    return n;
  }
  void count(size_t out, size_t in) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    bytes_.fetch_add(static_cast<int64_t>(out + in), std::memory_order_relaxed);
  }

  std::shared_ptr<Store> base_;
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> addr_gets_{0};
};

}  // namespace shoal::bench
