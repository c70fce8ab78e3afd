// common/error_mapping.cc — the one table of how framework adapters report an
// ErrorCode (shoal/error_mapping.h, docs/errors.md).
#include "shoal/error_mapping.h"

#include <iterator>

namespace shoal {
namespace {

// In ErrorCode order (checked below and in tests/cpp/test_error_mapping.cc).
constexpr ErrorMapping kErrorMappings[] = {
    {ErrorCode::kInvalidArgument, ErrorCategory::kInvalidArgument, ""},
    {ErrorCode::kTimeout, ErrorCategory::kDeadlineExceeded,
     "collective operation timeout (Timed out waiting for the peers)"},
    {ErrorCode::kPeerLost, ErrorCategory::kUnavailable, "connection closed by peer"},
    {ErrorCode::kMismatch, ErrorCategory::kFailedPrecondition, ""},
    {ErrorCode::kAborted, ErrorCategory::kAborted, ""},
    {ErrorCode::kStore, ErrorCategory::kUnavailable, ""},
    {ErrorCode::kInternal, ErrorCategory::kInternal, ""},
};

constexpr bool in_code_order() {
  for (size_t i = 0; i < std::size(kErrorMappings); ++i) {
    if (static_cast<size_t>(kErrorMappings[i].code) != i) return false;
  }
  return true;
}
// The last enumerator of ErrorCode (error_mapping's switch lists them all).
constexpr ErrorCode kLastCode = ErrorCode::kInternal;
static_assert(std::size(kErrorMappings) == static_cast<size_t>(kLastCode) + 1, "one entry per ErrorCode");
static_assert(in_code_order(), "entries in ErrorCode order");

}  // namespace

const ErrorMapping& error_mapping(ErrorCode code) {
  // No default: -Wswitch names a code added to ErrorCode without its case
  // here (then give it an entry above and move kLastCode).
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kTimeout:
    case ErrorCode::kPeerLost:
    case ErrorCode::kMismatch:
    case ErrorCode::kAborted:
    case ErrorCode::kStore:
    case ErrorCode::kInternal:
      return kErrorMappings[static_cast<size_t>(code)];
  }
  return kErrorMappings[static_cast<size_t>(ErrorCode::kInternal)];
}

const char* error_category_name(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInvalidArgument: return "invalid argument";
    case ErrorCategory::kDeadlineExceeded: return "deadline exceeded";
    case ErrorCategory::kUnavailable: return "unavailable";
    case ErrorCategory::kFailedPrecondition: return "failed precondition";
    case ErrorCategory::kAborted: return "aborted";
    case ErrorCategory::kInternal: return "internal";
  }
  return "internal";
}

std::string error_message(const Error& e, std::string_view label) {
  const ErrorMapping& m = error_mapping(e.code());
  std::string out = e.what();
  if (*m.phrase == '\0') return out;
  out += "; ";
  if (!label.empty()) out.append(label).append(": ");
  out += m.phrase;
  if (auto* lost = dynamic_cast<const PeerLost*>(&e); lost && lost->peer() >= 0) {
    out += " rank " + std::to_string(lost->peer());
  }
  return out;
}

}  // namespace shoal
