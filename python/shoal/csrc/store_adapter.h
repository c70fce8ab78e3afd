// store_adapter.h — a shoal::Store over the c10d::Store that PyTorch passes to
// a process group's backend.
//
// Ownership: holds a strong reference to the c10d store, so the store lives
// as long as the communicator that uses it.
// Thread-safety: as safe as the c10d store underneath (PyTorch's TCPStore,
// FileStore, HashStore and PrefixStore serialise their calls internally).
// Errors: c10d's store errors become shoal::TimeoutError (the message says
// the store timed out) or shoal::StoreError (anything else), keeping the
// original message, so that the core's error policy (docs/errors.md) holds.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "shoal/store.h"

namespace shoal::torch_adapter {

class C10dStore final : public shoal::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds t) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace shoal::torch_adapter
