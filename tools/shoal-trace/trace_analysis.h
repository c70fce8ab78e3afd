// shoal-trace/trace_analysis.h — reads the flight-recorder dumps of the ranks
// of a job (shoal-trace-<comm id>-rank<r>.jsonl, docs/observability.md) and
// finds, per collective sequence number, the ranks that did not join it,
// those that did not finish it, and ranks that disagree about what it is.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shoal::trace {

struct Entry {
  uint64_t seq = 0;
  std::string op;          // "allreduce", "send", ...
  std::string signature;   // "allreduce(count=1, float32, sum)": what ranks must agree on
  std::string state;       // queued, running, done, failed
  std::string algo;
  std::string error;
  std::vector<int> peers;
  int peer = -1;           // send/recv
  int64_t tag = -1;
  int64_t started_us = 0, ended_us = 0;
};

// Where a rank said it was (its progress record in the store, as another
// rank read it when it dumped).
struct Progress {
  uint64_t issued = 0, started = 0, ended = 0;
  std::string op;  // of `started`
};

// One rank's dump.
struct Dump {
  std::string path;
  std::string comm;  // the communicator's id (hex)
  std::string name;  // its name ("c0")
  int rank = 0;
  int size = 0;
  std::string reason;  // timeout, peer_lost, mismatch, signal, ...
  std::string error;
  std::string host;
  int64_t time_us = 0;
  uint64_t issued = 0, started = 0, ended = 0;
  std::map<uint64_t, Entry> collectives;  // by sequence number
  std::vector<Entry> p2p;                 // sends and receives, in order
  std::vector<std::optional<Progress>> progress;  // every rank's record, by rank
};

// Reads one dump; throws std::runtime_error naming the file and line.
Dump read_dump(const std::string& path);
// The dump files named by `paths` (files, or directories searched for
// shoal-trace-*.jsonl), grouped by communicator id.
std::map<std::string, std::vector<Dump>> read_dumps(const std::vector<std::string>& paths);

// What became of one collective across the ranks.
struct SeqReport {
  uint64_t seq = 0;
  std::string signature;                           // the most common one
  std::vector<int> not_joined;                     // ranks that never issued it
  std::map<int, std::string> not_joined_detail;    // rank -> "last issued seq 1"
  std::map<std::string, std::vector<int>> states;  // state -> ranks
  std::vector<int> unknown;                        // no dump, or it left the ring
  std::map<std::string, std::vector<int>> signatures;  // when ranks disagree
  bool mismatch() const { return signatures.size() > 1; }
  bool complete() const;  // done on every rank that left a dump, joined by the others
};

struct Analysis {
  std::string comm, name;
  int size = 0;
  std::vector<int> ranks_with_dumps;
  std::vector<SeqReport> seqs;  // every sequence number seen, ascending
};

Analysis analyze(const std::vector<Dump>& dumps);
// The report shoal-trace prints; `all`: every collective, not only problems.
// Sets *problems when a collective did not complete everywhere or ranks
// disagree about one.
std::string render(const Analysis& a, const std::vector<Dump>& dumps, bool all, bool* problems);

}  // namespace shoal::trace
