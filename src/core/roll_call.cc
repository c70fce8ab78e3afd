// core/roll_call.cc — the roll call a rank makes before it fails with a
// timeout (see roll_call.h).
#include "core/roll_call.h"

#include <thread>

#include "core/debug_log.h"

namespace shoal::core {

RollCall::RollCall(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {}

void RollCall::answer_open() {
  bool expected = false;
  if (!answered_.compare_exchange_strong(expected, true)) return;  // once: the count must not run ahead
  store_->set_str("roll/" + std::to_string(rank_), "here");
  store_->add("roll/count", 1);
}

void RollCall::answer() {
  if (answered_.load(std::memory_order_relaxed)) return;
  try {
    if (store_->check({"roll/open"})) answer_open();
  } catch (...) {
    // The store is gone: whoever called the roll learns nothing from us,
    // and the failed store is reported by the wait itself.
  }
}

std::optional<std::vector<int>> RollCall::call(std::chrono::milliseconds window) {
  if (size_ <= 1) return std::vector<int>{};
  try {
    store_->set_str("roll/open", "1");
    answer_open();
    const auto deadline = std::chrono::steady_clock::now() + window;
    for (;;) {
      if (store_->add("roll/count", 0) >= size_) return std::vector<int>{};
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the store for answers
    }
    std::vector<int> silent;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && !store_->check({"roll/" + std::to_string(r)})) silent.push_back(r);
    }
    return silent;
  } catch (...) {
    return std::nullopt;
  }
}

std::string describe_silent(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]) + " has not answered";
  return "ranks [" + rank_ranges(ranks) + "] have not answered";
}

}  // namespace shoal::core
