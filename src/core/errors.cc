// core/errors.cc
#include "core/errors.h"

#include <cstdlib>

namespace shoal::core {
namespace {

template <class E>
std::exception_ptr with_suspects(E e, const std::vector<int>& suspects) {
  if (!suspects.empty()) e.set_suspects(suspects);
  return std::make_exception_ptr(std::move(e));
}

std::exception_ptr make(ErrorCode code, const std::string& msg, int peer, const std::vector<int>& suspects = {}) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return with_suspects(InvalidArgument(msg), suspects);
    case ErrorCode::kTimeout: return with_suspects(TimeoutError(msg), suspects);
    case ErrorCode::kPeerLost: return with_suspects(PeerLost(msg, peer), suspects);
    case ErrorCode::kMismatch: return with_suspects(Mismatch(msg), suspects);
    case ErrorCode::kAborted: return with_suspects(Aborted(msg), suspects);
    case ErrorCode::kStore: return with_suspects(StoreError(msg), suspects);
    case ErrorCode::kInternal: break;
  }
  return with_suspects(InternalError(msg), suspects);
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(',');
    s.append(std::to_string(v[i]));
  }
  return s;
}

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> v;
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) v.push_back(std::atoi(s.substr(at, comma - at).c_str()));
    at = comma + 1;
  }
  return v;
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
    return make(x.code(), join_context(prefix, x.what()), x.peer(), x.suspects());
  } catch (const Error& x) {
    return make(x.code(), join_context(prefix, x.what()), -1, x.suspects());
  } catch (const std::exception& x) {
    return make(ErrorCode::kInternal, join_context(prefix, x.what()), -1);
  } catch (...) {
    return make(ErrorCode::kInternal, prefix + "unknown exception", -1);
  }
}

std::string AbortRecord::encode() const {
  return std::to_string(static_cast<int>(code)) + "|" + std::to_string(peer) + "|" +
         std::to_string(detector) + "|" + join_ints(suspects) + "|" + message;
}

std::optional<AbortRecord> AbortRecord::decode(const std::string& s) {
  AbortRecord r;
  size_t a = s.find('|'), b = a == std::string::npos ? a : s.find('|', a + 1),
         c = b == std::string::npos ? b : s.find('|', b + 1), d = c == std::string::npos ? c : s.find('|', c + 1);
  if (d == std::string::npos) return std::nullopt;
  r.code = static_cast<ErrorCode>(std::atoi(s.substr(0, a).c_str()));
  r.peer = std::atoi(s.substr(a + 1, b - a - 1).c_str());
  r.detector = std::atoi(s.substr(b + 1, c - b - 1).c_str());
  r.suspects = split_ints(s.substr(c + 1, d - c - 1));
  r.message = s.substr(d + 1);
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
    r.suspects = x.suspects();
    r.message = x.what();
  } catch (const Error& x) {
    r.code = x.code();
    r.suspects = x.suspects();
    r.message = x.what();
  } catch (const std::exception& x) {
    r.message = x.what();
  } catch (...) {
    r.message = "unknown error";
  }
  return r;
}

std::exception_ptr AbortRecord::to_error(const std::string& detector_name) const {
  // "rank 3 reports: peer lost: rank 1 ...", without the detector's own
  // "shoal rank 3: " (the raising rank puts its own prefix first).
  const std::string who = detector_name.empty() ? "rank " + std::to_string(detector) : detector_name;
  std::string what = message;
  if (what.rfind("shoal " + who + ": ", 0) == 0) what = what.substr(who.size() + 8);
  return make(code, who + " reports: " + what, peer, suspects);
}

}  // namespace shoal::core
