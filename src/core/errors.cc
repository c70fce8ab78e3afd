// core/errors.cc
#include "core/errors.h"

#include <cstdlib>

namespace shoal::core {
namespace {

std::exception_ptr make(ErrorCode code, const std::string& msg, int peer) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return std::make_exception_ptr(InvalidArgument(msg));
    case ErrorCode::kTimeout: return std::make_exception_ptr(TimeoutError(msg));
    case ErrorCode::kPeerLost: return std::make_exception_ptr(PeerLost(msg, peer));
    case ErrorCode::kMismatch: return std::make_exception_ptr(Mismatch(msg));
    case ErrorCode::kAborted: return std::make_exception_ptr(Aborted(msg));
    case ErrorCode::kStore: return std::make_exception_ptr(StoreError(msg));
    case ErrorCode::kInternal: break;
  }
  return std::make_exception_ptr(InternalError(msg));
}

}  // namespace

// E.g. "shoal rank 0: send: recv (tag 3): timed out ..." for a send failed by
// a receive's timeout.
std::string join_context(const std::string& prefix, const std::string& what) {
  const size_t cut = prefix.find(": ");
  if (cut != std::string::npos && what.compare(0, cut + 2, prefix, 0, cut + 2) == 0) {
    return prefix + what.substr(cut + 2);
  }
  return prefix + what;
}

std::exception_ptr with_context(std::exception_ptr e, const std::string& prefix) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerLost& x) {
    return make(x.code(), join_context(prefix, x.what()), x.peer());
  } catch (const Error& x) {
    return make(x.code(), join_context(prefix, x.what()), -1);
  } catch (const std::exception& x) {
    return make(ErrorCode::kInternal, join_context(prefix, x.what()), -1);
  } catch (...) {
    return make(ErrorCode::kInternal, prefix + "unknown exception", -1);
  }
}

std::string AbortRecord::encode() const {
  return std::to_string(static_cast<int>(code)) + "|" + std::to_string(peer) + "|" +
         std::to_string(detector) + "|" + message;
}

std::optional<AbortRecord> AbortRecord::decode(const std::string& s) {
  AbortRecord r;
  size_t a = s.find('|'), b = a == std::string::npos ? a : s.find('|', a + 1),
         c = b == std::string::npos ? b : s.find('|', b + 1);
  if (c == std::string::npos) return std::nullopt;
  r.code = static_cast<ErrorCode>(std::atoi(s.substr(0, a).c_str()));
  r.peer = std::atoi(s.substr(a + 1, b - a - 1).c_str());
  r.detector = std::atoi(s.substr(b + 1, c - b - 1).c_str());
  r.message = s.substr(c + 1);
  return r;
}

AbortRecord AbortRecord::from(std::exception_ptr e, int detector) {
  AbortRecord r;
  r.detector = detector;
  try {
    std::rethrow_exception(e);
  } catch (const PeerLost& x) {
    r.code = x.code();
    r.peer = x.peer();
    r.message = x.what();
  } catch (const Error& x) {
    r.code = x.code();
    r.message = x.what();
  } catch (const std::exception& x) {
    r.message = x.what();
  } catch (...) {
    r.message = "unknown error";
  }
  return r;
}

std::exception_ptr AbortRecord::to_error() const {
  // "rank 3 reports: peer lost: rank 1 ...", without the detector's own
  // "shoal rank 3: " (the raising rank puts its own prefix first).
  const std::string who = "rank " + std::to_string(detector);
  std::string what = message;
  if (what.rfind("shoal " + who + ": ", 0) == 0) what = what.substr(who.size() + 8);
  return make(code, who + " reports: " + what, peer);
}

}  // namespace shoal::core
