// core/stall_inspector.cc — progress records in the store and the warning
// that names the ranks a collective waits for.
#include "core/stall_inspector.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "collectives/coll.h"
#include "common/env.h"
#include "core/debug_log.h"
#include "shoal/error.h"

namespace shoal::core {

std::string Progress::encode() const {
  return std::to_string(issued) + " " + std::to_string(started) + " " + std::to_string(ended) + " " +
         std::to_string(coll);
}

std::optional<Progress> Progress::decode(const std::string& s) {
  std::istringstream in(s);
  Progress p;
  unsigned c = 0;
  if (!(in >> p.issued >> p.started >> p.ended >> c) || c > 255) return std::nullopt;
  p.coll = static_cast<uint8_t>(c);
  return p;
}

std::string stall_report(int rank, uint8_t coll, uint64_t seq, double waited_s,
                         const std::vector<std::optional<Progress>>& progress) {
  constexpr size_t kDetailed = 8;  // ranks described one by one, at most
  std::vector<int> missing, unknown;
  std::vector<std::string> details;
  for (int r = 0; r < static_cast<int>(progress.size()); ++r) {
    if (r == rank) continue;
    const auto& p = progress[static_cast<size_t>(r)];
    if (!p) {
      unknown.push_back(r);
      continue;
    }
    if (p->started >= seq) continue;  // joined
    missing.push_back(r);
    if (details.size() >= kDetailed) continue;
    std::string d = "rank " + std::to_string(r) + ": ";
    if (p->running()) {
      d += "in " + std::string(coll::coll_name(static_cast<coll::Coll>(p->coll))) + " seq " + std::to_string(p->started);
    } else if (p->ended > 0) {
      d += "idle after seq " + std::to_string(p->ended);
    } else {
      d += "idle, no collective yet";
    }
    if (p->issued >= seq) d += ", seq " + std::to_string(seq) + " queued behind it";
    details.push_back(std::move(d));
  }
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", waited_s);
  std::ostringstream o;
  o << "shoal rank " << rank << ": " << coll::coll_name(static_cast<coll::Coll>(coll)) << " seq " << seq
    << " has waited " << waited << " s; ranks not joined: ";
  if (missing.empty()) {
    o << "none known";
  } else {
    o << "[";
    for (size_t i = 0; i < missing.size(); ++i) o << (i ? ", " : "") << missing[i];
    o << "] (";
    for (size_t i = 0; i < details.size(); ++i) o << (i ? "; " : "") << details[i];
    if (missing.size() > details.size()) o << "; ...";
    o << ")";
  }
  if (!unknown.empty()) o << "; no progress record from ranks [" << rank_ranges(unknown) << "]";
  return o.str();
}

std::chrono::nanoseconds parse_stall_warn(const std::string& value) {
  char* end = nullptr;
  double s = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(s >= 0) || s > 1e9) {
    throw InvalidArgument("SHOAL_STALL_WARN: '" + value + "' is not a number of seconds >= 0");
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
}

std::chrono::nanoseconds stall_warn_setting() { return parse_stall_warn(env::get("SHOAL_STALL_WARN").value()); }

StallInspector::StallInspector(std::shared_ptr<Store> store, int rank, int size, std::chrono::nanoseconds warn)
    : store_(std::move(store)), rank_(rank), size_(size), warn_(warn) {}

std::chrono::nanoseconds StallInspector::period() const {
  return std::clamp<std::chrono::nanoseconds>(warn_ / 4, std::chrono::milliseconds(10),
                                              std::chrono::milliseconds(500));
}

std::vector<std::optional<Progress>> StallInspector::read_all(const Progress& mine) const {
  std::vector<std::optional<Progress>> all(static_cast<size_t>(size_));
  all[static_cast<size_t>(rank_)] = mine;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::string key = "progress/" + std::to_string(r);
    try {
      // check() first: get() of a missing key would block the store.
      if (store_->check({key})) all[static_cast<size_t>(r)] = Progress::decode(store_->get_str(key));
    } catch (const std::exception&) {
    }
  }
  return all;
}

void StallInspector::tick(const Progress& p, Clock::time_point changed, Clock::time_point running_since,
                          Clock::time_point now) {
  if (size_ <= 1) return;
  // Standing still for half the threshold: tell the others where.
  if (now - changed >= warn_ / 2 && published_ != p) {
    try {
      store_->set_str("progress/" + std::to_string(rank_), p.encode());
      published_ = p;
    } catch (const std::exception&) {
    }
  }
  if (!p.running()) return;
  if (p.started != warned_seq_) {
    warned_seq_ = p.started;
    next_warning_ = running_since + warn_;
  }
  if (now < next_warning_) return;
  next_warning_ = now + warn_;
  const double waited = std::chrono::duration<double>(now - running_since).count();
  std::string line = stall_report(rank_, p.coll, p.started, waited, read_all(p)) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace shoal::core
