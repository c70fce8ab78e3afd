// shoal/error_mapping.h — how the framework adapters (torch, TensorFlow)
// report each ErrorCode (shoal/error.h): one table, in
// src/common/error_mapping.cc; docs/errors.md lists it.
//
// The category is the kind of failure, named as the canonical status codes
// name it; each adapter maps a category to its framework's exception or
// status code. The phrase is what tooling written for the frameworks' own
// backends (torch's suite, log scrapers written for Gloo and NCCL) looks for
// in the same condition; error_message() appends it to shoal's message.
// Everything here is immutable and thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "shoal/error.h"

namespace shoal {

enum class ErrorCategory {
  kInvalidArgument,     // the caller's input was wrong; nothing was sent
  kDeadlineExceeded,    // a deadline passed
  kUnavailable,         // a peer or the store is gone or unreachable
  kFailedPrecondition,  // the ranks' calls do not match
  kAborted,             // the user ended the communicator
  kInternal,            // shoal broke its own invariant
};

struct ErrorMapping {
  ErrorCode code;
  ErrorCategory category;
  const char* phrase;  // appended by error_message(); "" for none
};

// The entry of `code`. Every ErrorCode has one; a value outside the enum (a
// corrupt or newer abort record) gets kInternal's.
const ErrorMapping& error_mapping(ErrorCode code);
// "invalid argument", "deadline exceeded", ...
const char* error_category_name(ErrorCategory category);

// e.what(), then "; <label>: <phrase>" ("; <phrase>" without a label) when
// the code has a phrase, and " rank N" after a lost peer's phrase when the
// peer is known. E.g. with label "torch":
//   "shoal rank 1: ...; torch: connection closed by peer rank 3".
std::string error_message(const Error& e, std::string_view label = {});

}  // namespace shoal
