// core/roll_call.h — who is still with us when a wait times out.
//
// A timeout only says which peer this rank was waiting for; in a ring that
// is usually a neighbour, itself waiting for the rank that really stopped (a
// SIGSTOPped or hung process, or one busy elsewhere). So a rank whose wait
// nears its deadline calls the roll: it opens a roll call in the store, goes
// on waiting, and if the deadline comes, reads who answered. Every rank that
// is blocked in shoal answers (its wait loop asks the store every abort-poll
// period anyway; see HybridOptions::check_abort), and so does every rank
// that calls a roll itself. Those that did not answer are the ones the job
// waits for: a stopped process cannot, nor can one that never entered the
// collective. The roll is opened at the first poll within kOpenAhead of the
// deadline, so that the answers are in when the operation times out: the
// timeout is kept, not extended by the roll call. A wait that never blocked
// near its deadline (a timeout of zero or under one poll) calls no roll.
//
// Roll calls are numbered: "roll/gen" counts them, "roll/<rank>" holds the
// number of the latest one that rank answered (keys in the communicator's
// prefix). An answer to a later roll call counts for an earlier one, so
// ranks that open roll calls at about the same time answer each other.
// A roll call that an operation finishing in time leaves open costs its
// peers one store write each, nothing else.
//
// Thread-safety: every method may run on any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "common/thread_annotations.h"
#include <optional>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::core {

class RollCall {
 public:
  using Clock = std::chrono::steady_clock;
  // How long a roll call is given for the answers of every blocked rank:
  // two of its abort polls (250 ms each).
  static constexpr std::chrono::milliseconds kAnswerTime{500};
  // A wait opens its roll call at its first poll this close to its deadline
  // (kAnswerTime plus a poll and some slack), so that it has kAnswerTime.
  static constexpr std::chrono::milliseconds kOpenAhead{850};

  RollCall(std::shared_ptr<Store> store, int rank, int size);

  // Called by a wait that is blocked and ends at `deadline`: answers a roll
  // call that is open, and opens one for this wait once the deadline is
  // within kOpenAhead. A few store look-ups; never throws.
  void poll(Clock::time_point deadline);
  // At a deadline: answers any open roll call, and returns the ranks that
  // have not answered the one this rank opened for it (poll), in order
  // (empty: all did), after giving it kAnswerTime since it was opened (which
  // extends only timeouts shorter than kOpenAhead). nullopt when no roll call
  // was opened for it (the wait never blocked near its deadline: a zero or
  // very short timeout fails at once, naming no one) or the store could not
  // be asked.
  std::optional<std::vector<int>> silent();

 private:
  // The latest roll call's number (0: none yet).
  uint64_t latest();
  void answer_locked(uint64_t gen) REQUIRES(mu_);
  uint64_t open_locked() REQUIRES(mu_);
  std::optional<std::vector<int>> collect(uint64_t gen, Clock::time_point until);

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  Mutex mu_;
  uint64_t answered_ GUARDED_BY(mu_) = 0;          // the latest roll call this rank answered
  uint64_t opened_ GUARDED_BY(mu_) = 0;            // the latest roll call this rank opened
  Clock::time_point opened_at_ GUARDED_BY(mu_){};
  Clock::time_point opened_for_ GUARDED_BY(mu_){};  // the deadline it was opened for
};

// "rank 2 has not answered" / "ranks [2, 5] have not answered" (rank_ranges),
// each rank named by `name` ("rank 2", JobLiveness::name) when the
// communicator numbers the job's ranks its own way.
std::string describe_silent(const std::vector<int>& ranks, const std::function<std::string(int)>& name);

}  // namespace shoal::core
