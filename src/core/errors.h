// core/errors.h — giving errors their context, and the job-wide abort record.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "shoal/error.h"

namespace shoal::core {

// Returns an exception of the same type as `e` whose message is
// `prefix + what()` (join_context). Non-shoal exceptions become InternalError.
std::exception_ptr with_context(std::exception_ptr e, const std::string& prefix);
// prefix + what; when both start with the same "shoal rank R: " (the cause
// came from another operation of this rank), `what` loses it.
std::string join_context(const std::string& prefix, const std::string& what);

// The first cause of a break, as published in the store so that every other
// rank can report it: "<code>|<peer>|<detecting rank>|<message>".
struct AbortRecord {
  ErrorCode code = ErrorCode::kInternal;
  int peer = -1;      // the lost rank for kPeerLost
  int detector = -1;  // the rank that saw it first
  std::vector<int> suspects;  // Error::suspects()
  std::string message;

  std::string encode() const;
  static std::optional<AbortRecord> decode(const std::string& s);
  static AbortRecord from(std::exception_ptr e, int detector);
  // The error to raise on another rank; `detector_name` names the detector
  // (JobLiveness::name; empty: "rank <detector>").
  std::exception_ptr to_error(const std::string& detector_name = "") const;
};

}  // namespace shoal::core
