// shoalrun/fault.cc — see fault.h.
#include "fault.h"

#include <time.h>

#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "process.h"
#include "shoal/store.h"

namespace shoalrun {
namespace {

int64_t now_ns(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); }

}  // namespace

const char* fault_tolerance_name(FaultTolerance f) {
  switch (f) {
    case FaultTolerance::kShrink: return "shrink";
    case FaultTolerance::kReplace: return "replace";
    case FaultTolerance::kNone: break;
  }
  return "none";
}

Ledger::Ledger(const std::string& host, int port, const std::string& secret_hex, double connect_timeout_s,
               double timeout_s) {
  shoal::TcpStoreOptions so;
  so.host = host;
  so.port = static_cast<uint16_t>(port);
  so.secret = secret_hex;
  so.timeout = ms(timeout_s);
  so.connect_timeout = ms(connect_timeout_s);
  store_ = std::make_unique<shoal::TcpStore>(so);
}

Ledger::~Ledger() = default;

int64_t Ledger::record_death(const WorkerExit& x, int incarnation, bool fenced, int node, const std::string& host) {
  const int64_t seq = store_->add("shoal/deaths", 1);
  nlohmann::json j = {
      {"rank", x.rank},
      {"local_rank", x.local_rank},
      {"node", node},
      {"host", host},
      {"pid", static_cast<int64_t>(x.pid)},
      {"exit_code", x.exit_code},
      {"signal", x.signal != 0 ? nlohmann::json(signal_name(x.signal)) : nlohmann::json(nullptr)},
      {"fenced", fenced},
      {"incarnation", incarnation},
      {"seq", seq},
      {"mono_ns", now_ns(CLOCK_MONOTONIC)},
      {"unix_ms", now_ns(CLOCK_REALTIME) / 1000000},
  };
  const std::string rec = j.dump();
  store_->set_str("shoal/death/" + std::to_string(seq), rec);
  store_->set_str("shoal/dead/" + std::to_string(x.rank), rec);
  return seq;
}

void Ledger::record_start(int rank, int incarnation) {
  if (incarnation > 0) store_->add("shoal/replacements", 1);
  store_->set_str("shoal/incarnation/" + std::to_string(rank), std::to_string(incarnation));
}

int64_t Ledger::alive(int world_size) {
  return world_size - store_->add("shoal/deaths", 0) + store_->add("shoal/replacements", 0);
}

std::optional<int> Ledger::excluded(int rank) {
  const std::string key = "shoal/excluded/" + std::to_string(rank);
  if (!store_->check({key})) return std::nullopt;
  const std::string v = store_->get_str(key);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || end == v.c_str() || *end != '\0' || n < 0) return 0;  // not a number: the first process
  return static_cast<int>(n);
}

}  // namespace shoalrun
