// rendezvous/prefix_store.cc — PrefixStore: every key of `base` under "<prefix>/";
// the Store defaults (multi_get, compare_set).
#include <utility>

#include "shoal/error.h"
#include "shoal/store.h"

namespace shoal {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_) throw InvalidArgument("store: PrefixStore '" + prefix_ + "' needs a base store (got null)");
}

void PrefixStore::set(const std::string& key, const Bytes& value) { base_->set(full(key), value); }

Bytes PrefixStore::get(const std::string& key) { return base_->get(full(key)); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(full(key), delta); }

bool PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> k;
  k.reserve(keys.size());
  for (const auto& key : keys) k.push_back(full(key));
  return base_->check(k);
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> k;
  k.reserve(keys.size());
  for (const auto& key : keys) k.push_back(full(key));
  base_->wait(k, timeout);
}

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  std::vector<std::string> k;
  k.reserve(keys.size());
  for (const auto& key : keys) k.push_back(full(key));
  return base_->multi_get(k);
}

bool PrefixStore::remove(const std::string& key) { return base_->remove(full(key)); }

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return base_->compare_set(full(key), expected, desired);
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys) {
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

Bytes Store::compare_set(const std::string& key, const Bytes&, const Bytes&) {
  throw InvalidArgument("store: compare_set of key '" + key +
                        "': this store cannot compare and set (recovery after a fault needs it)");
}

std::chrono::milliseconds PrefixStore::timeout() const { return base_->timeout(); }

void PrefixStore::set_timeout(std::chrono::milliseconds t) { base_->set_timeout(t); }

}  // namespace shoal
