// common/env.h — the one table of SHOAL_* environment knobs.
//
// Every knob shoal reads is listed in kKnobs (env.cc) and documented in
// docs/knobs.md; reading an unlisted SHOAL_ name is a bug. Values are read
// when a communicator is created.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shoal::env {

struct Knob {
  const char* name;
  const char* default_value;
  const char* meaning;
};

// The table (for docs and `shoal-perf --knobs`).
const Knob* knobs(int* count);

// Raw value of a listed knob, if set and non-empty.
std::optional<std::string> get(const char* name);
// Parsed integer (throws InvalidArgument naming the knob if malformed).
std::optional<int64_t> get_int(const char* name);

}  // namespace shoal::env
