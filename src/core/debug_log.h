// core/debug_log.h — SHOAL_DEBUG: what a communicator prints on stderr
// besides warnings and errors.
//
//   WARN (default)  nothing more
//   INFO            once per communicator: which ranks share a host, the
//                   transport to every peer and the settings that shape the
//                   traffic; and the algorithm chosen, the first time each
//                   (collective, size class) is chosen
//   TRACE           INFO, and one line per operation as it ends
//
// Every line is "shoal rank R: LEVEL: ...", written with one call so that
// lines of several threads or ranks never interleave mid-line.
//
// Thread-safety: communicator() and algorithm() are called by the thread
// that drives the communicator (one at a time); operation() from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "collectives/coll.h"
#include "core/flight_recorder.h"

namespace shoal::core {

enum class DebugLevel { kWarn, kInfo, kTrace };

// Parses SHOAL_DEBUG's value (any case; unset: WARN). Throws InvalidArgument
// naming the knob for anything else.
DebugLevel parse_debug_level(const std::string& value);

// "0-3, 5, 7-8"
std::string rank_ranges(const std::vector<int>& ranks);
// The power-of-two class of a message size: "[1 KiB, 2 KiB)".
std::string size_class(uint64_t bytes);
// One operation, as the TRACE line tells it (without the line's prefix).
std::string describe_operation(const TraceEntry& e);

class DebugLog {
 public:
  DebugLog(int rank, DebugLevel level) : rank_(rank), level_(level) {}

  bool info() const { return level_ >= DebugLevel::kInfo; }
  bool trace() const { return level_ >= DebugLevel::kTrace; }

  // INFO, once: `header` (the communicator and its settings), the hosts of
  // `topo`, and which peers go through shared memory (`local(peer)`).
  void communicator(const std::string& header, const coll::Topology& topo, const std::function<bool(int)>& local);
  // INFO, the first time `algo` is chosen for `c` in the size class of `bytes`.
  void algorithm(coll::Coll c, uint64_t bytes, std::string_view algo, bool forced);
  // TRACE: an operation that ended.
  void operation(const TraceEntry& e) const;

  void line(DebugLevel level, const std::string& text) const;

 private:
  const int rank_;
  const DebugLevel level_;
  bool told_communicator_ = false;                                   // driving thread only
  std::set<std::tuple<int, int, std::string_view>> told_algorithms_;  // driving thread only
};

}  // namespace shoal::core
