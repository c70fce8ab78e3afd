// shoalrun/fault.h — the launcher's records in the workers' store, and the
// fault-tolerance modes (docs/launcher.md, "Fault tolerance").
//
// Keys (at the store's root; a torch client reaches them through the
// TCPStore under its PrefixStores, a shoal client through its TcpStore):
//   shoal/dead/<rank>         the rank's latest death (JSON, below), written
//                             by its launcher as soon as it reaps the process
//   shoal/deaths              how many deaths were recorded (an ADD counter)
//   shoal/death/<n>           the n-th death (n = 1, 2, ...; the same JSON)
//   shoal/incarnation/<rank>  the incarnation of the rank's running process
//                             (0, then 1, 2 ... for its replacements)
//   shoal/replacements        how many replacements were started (counter)
//   shoal/excluded/<rank>     written by the survivors (the core's agreement):
//                             the decimal incarnation excluded; the rank's
//                             launcher SIGKILLs (fences) any process of that
//                             rank with that incarnation or an earlier one
//                             (a value that is not a number counts as 0)
// A death record: {"rank", "local_rank", "node", "host", "pid", "exit_code",
// "signal" (name or null), "fenced", "incarnation", "seq", "mono_ns" (the
// recording launcher's CLOCK_MONOTONIC), "unix_ms"}.
//
// Ledger is one launcher's client of that store (shoal's protocol, the job's
// secret). Not thread-safe: the group loop's thread uses it. Calls throw
// shoal::Error when the store is unreachable.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "summary.h"

namespace shoal {
class TcpStore;
}

namespace shoalrun {

enum class FaultTolerance { kNone, kShrink, kReplace };
const char* fault_tolerance_name(FaultTolerance f);  // "none", "shrink", "replace"

class Ledger {
 public:
  // Connects to the workers' store at host:port (retrying for up to
  // connect_timeout_s); `timeout_s` bounds every later call.
  Ledger(const std::string& host, int port, const std::string& secret_hex, double connect_timeout_s,
         double timeout_s);
  ~Ledger();

  // Records a death; returns its sequence number n (shoal/death/<n>).
  int64_t record_death(const WorkerExit& x, int incarnation, bool fenced, int node, const std::string& host);
  // A process of `rank` started (shoal/incarnation/<rank>); a replacement
  // (incarnation > 0) also counts in shoal/replacements.
  void record_start(int rank, int incarnation);
  // Ranks running now, job-wide: world_size - deaths + replacements.
  int64_t alive(int world_size);
  // shoal/excluded/<rank> when set: the incarnation (0 when not a number).
  std::optional<int> excluded(int rank);

 private:
  std::unique_ptr<shoal::TcpStore> store_;
};

}  // namespace shoalrun
