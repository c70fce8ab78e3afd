// common/env.cc — the SHOAL_* knob table (keep it short; see docs/knobs.md).
#include "common/env.h"

#include <cstdlib>
#include <cstring>

#include "shoal/error.h"

namespace shoal::env {
namespace {

const Knob kKnobs[] = {
    {"SHOAL_ALGO", "", "Force algorithms per collective: 'allreduce=ring,broadcast=chain'."},
    {"SHOAL_TIMEOUT_S", "1800", "Default timeout of every operation, in seconds."},
    {"SHOAL_SPIN_US", "auto",
     "Busy-poll this many microseconds before sleeping when a caller drives its own operation "
     "(auto: 200 when the host runs no more ranks than cores, else 0)."},
    {"SHOAL_SEGMENT_BYTES", "1048576", "Pipelining segment of large transfers, in bytes."},
    {"SHOAL_SOCKET_BUFFER", "4194304", "SO_SNDBUF/SO_RCVBUF of data sockets, in bytes (0: kernel default)."},
    {"SHOAL_SHM_ARENA_BYTES", "1048576",
     "Per rank and round, the shared-memory slot of the *_shared algorithms (all ranks on one host); "
     "0 turns them off."},
    {"SHOAL_SHM", "1",
     "Ranks on one host talk through shared memory: 1 (single-copy for large messages where the "
     "kernel allows process_vm_readv), copy (always through the shared ring), 0 (TCP only)."},
    {"SHOAL_HOST_ID", "",
     "Overrides this rank's host identity (default: host name, boot id and network namespace): "
     "ranks with equal identities share memory and count as one host to the algorithms."},
    {"SHOAL_ADVERTISE_ADDR", "",
     "Address other ranks use to reach this one (default: the address that reaches the store)."},
    {"SHOAL_SECRET", "",
     "The job's secret, 32 to 128 hex digits (shoalrun sets it): every connection of the job, the "
     "store's included, proves it (docs/security.md). Unset: rank 0 makes one per communicator and "
     "shares it through the store, which is then not authenticated."},
    {"SHOAL_DEBUG", "WARN",
     "What shoal prints on stderr besides warnings: INFO (once per communicator: topology, "
     "transports, algorithm choices) or TRACE (INFO and one line per operation)."},
    {"SHOAL_TRACE_BUFFER", "1000",
     "The flight recorder keeps the last this-many operations per communicator, dumped on a "
     "timeout, a lost peer, a mismatch or SIGUSR1 (0: off, no dumps, no SIGUSR1 handler)."},
    {"SHOAL_TRACE_DIR", "/tmp", "Where flight-recorder dumps go: shoal-trace-<comm id>-rank<r>.jsonl."},
    {"SHOAL_TIMELINE", "",
     "Write a Chrome/Perfetto trace of every operation to this path (%r: rank, %c: communicator "
     "name, %p: pid)."},
    {"SHOAL_STALL_WARN", "60",
     "Seconds (fractions allowed) a collective may wait before its rank logs which ranks have "
     "not joined it, and again every as many seconds until it ends (0: off)."},
};

bool listed(const char* name) {
  for (const auto& k : kKnobs) {
    if (std::strcmp(k.name, name) == 0) return true;
  }
  return false;
}

}  // namespace

const Knob* knobs(int* count) {
  *count = static_cast<int>(sizeof(kKnobs) / sizeof(kKnobs[0]));
  return kKnobs;
}

std::optional<std::string> get(const char* name) {
  if (!listed(name)) throw InternalError(std::string("unlisted knob ") + name);
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<int64_t> get_int(const char* name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0') {
    throw InvalidArgument(std::string(name) + ": '" + *v + "' is not an integer");
  }
  return static_cast<int64_t>(x);
}

}  // namespace shoal::env
