// transport/liveness.cc — the neutral answers of Liveness (liveness.h).
#include "transport/liveness.h"

#include <sstream>

#include "shoal/error.h"

namespace shoal::transport {

PeerAddress Liveness::address(int peer) {
  throw InternalError("no address known for rank " + std::to_string(peer) + " (no rendezvous)");
}

bool Liveness::is_local(int) { return false; }

void Liveness::broke(std::exception_ptr) {}

std::exception_ptr Liveness::lost(int peer, const std::string& who, const std::string& detail) {
  return std::make_exception_ptr(PeerLost("peer lost: " + who + ": " + detail, peer));
}

std::exception_ptr Liveness::check_abort(Clock::time_point) { return nullptr; }

std::exception_ptr Liveness::peer_gone(int) { return nullptr; }

int64_t Liveness::local_pid(int) { return 0; }
void Liveness::learned_process(int, const std::string&) {}

std::exception_ptr Liveness::order_check(int) { return nullptr; }

std::exception_ptr Liveness::broken() { return nullptr; }

std::exception_ptr Liveness::timed_out(const std::string& waiting) {
  return std::make_exception_ptr(TimeoutError("timed out waiting for " + waiting));
}

void Liveness::still_waiting(double, const std::string&) {}

std::string Liveness::name(int peer) { return "rank " + std::to_string(peer); }

std::string Liveness::describe(const Fingerprint& fp) {
  std::ostringstream o;
  o << "operation " << int(fp.coll) << "(count=" << fp.count << ", dtype " << int(fp.dtype) << ")";
  return o.str();
}

Liveness& Liveness::none() {
  static Liveness knows_nothing;
  return knows_nothing;
}

}  // namespace shoal::transport
