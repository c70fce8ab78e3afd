// core/roll_call.cc — the roll call a rank makes before it fails with a
// timeout (see roll_call.h).
#include "core/roll_call.h"

#include <thread>

#include "core/debug_log.h"

namespace shoal::core {

RollCall::RollCall(std::shared_ptr<Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {}

uint64_t RollCall::latest() { return static_cast<uint64_t>(store_->add("roll/gen", 0)); }

void RollCall::answer_locked(uint64_t gen) {
  if (gen <= answered_) return;
  store_->set_str("roll/" + std::to_string(rank_), std::to_string(gen));
  answered_ = gen;
}

uint64_t RollCall::open_locked() {
  const auto gen = static_cast<uint64_t>(store_->add("roll/gen", 1));
  answer_locked(gen);
  opened_ = gen;
  opened_at_ = Clock::now();
  return gen;
}

void RollCall::poll(Clock::time_point deadline) {
  if (size_ <= 1) return;
  try {
    const uint64_t gen = latest();
    MutexLock g(mu_);
    answer_locked(gen);
    if (deadline - Clock::now() <= kOpenAhead && opened_for_ != deadline) {
      open_locked();
      opened_for_ = deadline;
    }
  } catch (...) {
    // The store is gone: whoever called the roll learns nothing from us,
    // and the failed store is reported by the wait itself.
  }
}

std::optional<std::vector<int>> RollCall::silent() {
  if (size_ <= 1) return std::vector<int>{};
  uint64_t gen = 0;
  Clock::time_point until;
  try {
    const uint64_t open = latest();
    MutexLock g(mu_);
    answer_locked(open);  // a rank timing out answers the others' roll calls too
    const auto now = Clock::now();
    if (opened_ == 0 || now - opened_at_ > kOpenAhead + kAnswerTime) return std::nullopt;
    gen = opened_;  // opened by poll() ahead of this deadline
    until = std::max(now, opened_at_ + kAnswerTime);
  } catch (...) {
    return std::nullopt;
  }
  return collect(gen, until);
}

std::optional<std::vector<int>> RollCall::collect(uint64_t gen, Clock::time_point until) {
  std::vector<bool> here(static_cast<size_t>(size_), false);
  here[static_cast<size_t>(rank_)] = true;
  try {
    for (;;) {
      std::vector<int> silent;
      for (int r = 0; r < size_; ++r) {
        if (here[static_cast<size_t>(r)]) continue;
        const std::string key = "roll/" + std::to_string(r);
        if (store_->check({key}) && std::stoull(store_->get_str(key)) >= gen) {
          here[static_cast<size_t>(r)] = true;
        } else {
          silent.push_back(r);
        }
      }
      if (silent.empty() || Clock::now() >= until) return silent;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the store for answers
    }
  } catch (...) {
    return std::nullopt;
  }
}

std::string describe_silent(const std::vector<int>& ranks, const std::function<std::string(int)>& name) {
  if (ranks.size() == 1) return name(ranks[0]) + " has not answered";
  std::string named;  // "3 (group rank 1), 5 (group rank 2)"
  bool plain = true;
  for (int r : ranks) {
    const std::string n = name(r);
    plain = plain && n == "rank " + std::to_string(r);
    named += (named.empty() ? "" : ", ") + n.substr(n.rfind("rank ", 0) == 0 ? 5 : 0);
  }
  return "ranks [" + (plain ? rank_ranges(ranks) : named) + "] have not answered";
}

}  // namespace shoal::core
