// store_adapter.cc — forwards shoal's rendezvous calls to a c10d::Store and
// translates its exceptions into shoal's error types.
#include "store_adapter.h"

#include <algorithm>
#include <cctype>

#include "shoal/error.h"

namespace shoal::torch_adapter {
namespace {

bool mentions_timeout(const std::string& msg) {
  std::string low(msg.size(), '\0');
  std::transform(msg.begin(), msg.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  return low.find("timeout") != std::string::npos || low.find("timed out") != std::string::npos;
}

// Runs `fn`, rethrowing torch's store errors as shoal errors.
template <typename Fn>
auto translate(const char* what, const std::string& key, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const shoal::Error&) {
    throw;
  } catch (const c10::Error& e) {
    std::string msg = std::string("torch store ") + what + "('" + key + "'): " + e.what_without_backtrace();
    if (mentions_timeout(msg)) throw shoal::TimeoutError(msg);
    throw shoal::StoreError(msg);
  } catch (const std::exception& e) {
    throw shoal::StoreError(std::string("torch store ") + what + "('" + key + "'): " + e.what());
  }
}

std::string first_key(const std::vector<std::string>& keys) {
  return keys.empty() ? std::string() : keys.front() + (keys.size() > 1 ? ", ..." : "");
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  if (!store_) throw shoal::InvalidArgument("store: null c10d store");
}

void C10dStore::set(const std::string& key, const Bytes& value) {
  translate("set", key, [&] { store_->set(key, value); });
}

Bytes C10dStore::get(const std::string& key) {
  return translate("get", key, [&] { return store_->get(key); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return translate("add", key, [&] { return store_->add(key, delta); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return translate("check", first_key(keys), [&] { return store_->check(keys); });
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  translate("wait", first_key(keys), [&] { store_->wait(keys, timeout); });
}

// c10d's multiGet (torch 2.1 and newer): one request to a TCPStore, get()
// per key on a store without the extended API.
std::vector<Bytes> C10dStore::multi_get(const std::vector<std::string>& keys) {
  return translate("multi_get", first_key(keys), [&] { return store_->multiGet(keys); });
}

bool C10dStore::remove(const std::string& key) {
  return translate("remove", key, [&] { return store_->deleteKey(key); });
}

Bytes C10dStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return translate("compare_set", key, [&] { return store_->compareSet(key, expected, desired); });
}

std::chrono::milliseconds C10dStore::timeout() const { return store_->getTimeout(); }

void C10dStore::set_timeout(std::chrono::milliseconds t) { store_->setTimeout(t); }

}  // namespace shoal::torch_adapter
