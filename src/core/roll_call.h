// core/roll_call.h — who is still with us when a wait times out.
//
// A timeout only says which peer this rank was waiting for; in a ring that
// is usually a neighbour, itself waiting for the rank that really stopped (a
// SIGSTOPped or hung process, or one busy elsewhere). So before a rank
// fails with a timeout it calls the roll: it opens a roll call in the store
// and waits a short window for answers. Every rank that is blocked in shoal
// answers (its wait loop asks the store every abort-poll period anyway; see
// HybridOptions::check_abort), and so does every rank that times out itself.
// Those that did not answer are the ones the job waits for: a stopped process
// cannot, nor can one that never entered the collective.
//
// Store keys (in the communicator's prefix): "roll/open", "roll/<rank>" per
// answer and "roll/count". A communicator has one roll call in its life: a
// timeout breaks it.
//
// Thread-safety: answer() and call() may run on any thread; each rank answers
// at most once.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::core {

class RollCall {
 public:
  RollCall(std::shared_ptr<Store> store, int rank, int size);

  // If a roll call is open, answers it. One store look-up; never throws.
  void answer();
  // Opens the roll call (answering it) and waits up to `window` for every
  // rank to answer. Returns the ranks that did not, in order (empty: all
  // did); nullopt when the store could not be asked.
  std::optional<std::vector<int>> call(std::chrono::milliseconds window);

 private:
  void answer_open();

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  std::atomic<bool> answered_{false};
};

// "rank 2 has not answered" / "ranks [2, 5] have not answered" (rank_ranges).
std::string describe_silent(const std::vector<int>& ranks);

}  // namespace shoal::core
