// common/env.h — the one table of SHOAL_* environment knobs.
//
// Every knob shoal reads (the library, the torch extension, shoalrun and the
// Python packages) is listed in kKnobs (env.cc), with its default and its
// documentation: docs/knobs.md's table is rendered from it (markdown_table)
// and a test keeps the two equal. Reading an unlisted SHOAL_ name is a bug.
// The library reads its knobs when a communicator is created; an unset knob
// has the table's default, so no default is written twice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shoal::env {

struct Knob {
  const char* name;
  const char* default_value;  // what get() returns when unset ("" = nothing)
  const char* shown_default;  // how docs show the default when it is not a plain value, else null
  const char* meaning;        // markdown, as docs/knobs.md shows it
};

// The table (for docs and `shoal-perf --knobs`).
const Knob* knobs(int* count);

// Value of a listed knob if set and non-empty, else its default if it has
// one, else nothing.
std::optional<std::string> get(const char* name);
// Parsed integer of get() (throws InvalidArgument naming the knob if malformed).
std::optional<int64_t> get_int(const char* name);
// Whether the knob is set (non-empty) in the environment, default aside.
bool is_set(const char* name);

// docs/knobs.md's table of the knobs, rendered from kKnobs.
std::string markdown_table();

}  // namespace shoal::env
