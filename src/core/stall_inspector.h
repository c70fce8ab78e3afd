// core/stall_inspector.h — SHOAL_STALL_WARN: while a collective has waited
// longer than the threshold, its rank logs which ranks have not joined it,
// and again every threshold until it ends.
//
// How a rank knows about the others: every rank publishes its progress (the
// last collective it issued, started and ended) in the store under
// "progress/<rank>", but only once it has stood still for half the threshold,
// and only if it changed since it last did. A job whose ranks keep moving
// therefore writes nothing; a rank that waits, or idles outside shoal, tells
// where it stands before anyone asks. A rank whose collective has waited the
// whole threshold reads everyone's record: those that have not started that
// sequence number have not joined it.
//
// Thread-safety: tick() is called by one thread (the observer's); the store
// must be safe to share with the executor (every Store is).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::core {

// Where a rank stands among the collectives of its communicator.
struct Progress {
  uint64_t issued = 0;   // last collective queued
  uint64_t started = 0;  // last collective that started to run
  uint64_t ended = 0;    // last collective that ended (done or failed)
  uint8_t coll = 0;      // coll::Coll of `started`

  bool running() const { return started > ended; }
  bool operator==(const Progress&) const = default;
  std::string encode() const;
  static std::optional<Progress> decode(const std::string& s);
};

// The warning of rank `rank`, whose collective `coll` number `seq` has waited
// `waited_s`, given every rank's last published progress (by rank; nullopt:
// none published). E.g. "shoal rank 0: allreduce seq 2 has waited 61.0 s;
// ranks not joined: [1] (rank 1: idle after seq 1)".
std::string stall_report(int rank, uint8_t coll, uint64_t seq, double waited_s,
                         const std::vector<std::optional<Progress>>& progress);

// Parses SHOAL_STALL_WARN (seconds, fractions allowed; 0 turns it off).
std::chrono::nanoseconds parse_stall_warn(const std::string& value);
// The knob's setting, parsed: the stall inspector's threshold, and how often
// a blocked transport wait reports (transport::HybridOptions::report_every).
std::chrono::nanoseconds stall_warn_setting();

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  StallInspector(std::shared_ptr<Store> store, int rank, int size, std::chrono::nanoseconds warn);

  // How often tick() should run.
  std::chrono::nanoseconds period() const;
  // `p` is this rank's progress, `changed` when it last changed, `running_since`
  // when `p.started` started. Publishes and warns as described above.
  void tick(const Progress& p, Clock::time_point changed, Clock::time_point running_since, Clock::time_point now);
  // Every rank's last published progress (`mine` for this rank). Any thread.
  std::vector<std::optional<Progress>> read_all(const Progress& mine) const;

 private:

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const std::chrono::nanoseconds warn_;
  std::optional<Progress> published_;
  uint64_t warned_seq_ = 0;
  Clock::time_point next_warning_{};
};

}  // namespace shoal::core
