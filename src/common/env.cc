// common/env.cc — the SHOAL_* knob table (keep it short; docs/knobs.md is
// rendered from it).
#include "common/env.h"

#include <cstdlib>
#include <cstring>

#include "shoal/error.h"

namespace shoal::env {
namespace {

const Knob kKnobs[] = {
    {"SHOAL_ALGO", "", nullptr,
     "Force algorithms per collective: `allreduce=ring,broadcast=chain`. Names in "
     "docs/algorithms.md. An unknown name is an error."},
    {"SHOAL_TIMEOUT_S", "1800", nullptr,
     "Default timeout of every operation, in seconds (`Options::timeout` in code)."},
    {"SHOAL_SPIN_US", "", "auto",
     "Busy-poll this long (µs) before sleeping, when the thread that waits for an operation runs "
     "it itself, or drives a send or receive it waits for (the background executor never spins on"
     " messages: it would steal the core from the computation it overlaps). Auto: 200; 5000 for "
     "a collective that the caller runs itself, of up to 8 MiB per rank in the shared arena (all "
     "ranks on one host) and up to 4 MiB per rank for messages, holding the core, so that a peer "
     "preempted by a neighbour's burst finds its partner still there when it comes back "
     "(bench/results/arena-spin, bench/results/tcp-spin). Such an arena wait "
     "gives the core away (`sched_yield`) between polls only while the peer's thread is queued on"
     " it (read from /proc); other arena waits give it away after 10 µs. When this host runs more"
     " ranks than it has cores (`LOCAL_WORLD_SIZE`, else the world size; revised from the "
     "topology), every spin gives the core away between polls from the start, so the peer it "
     "waits for can run (bench/results/yield-spin); once a yield took 1 ms or more (another "
     "task's time slice), the thread's next 16 waits sleep at once, doubling while its yields "
     "stay long (bench/results/crowded-waits). An explicit value is the spin of every wait "
     "and does not yield from the start. A wait for messages (TCP, the shared-memory rings) holds "
     "the core otherwise, giving it away only while the main thread of the peer's process is "
     "queued on it: a core given away goes to a busy neighbour for a whole time slice "
     "(bench/compare/peers/README.md, \"The spin under load\")."},
    {"SHOAL_SEGMENT_BYTES", "524288", nullptr,
     "Pipelining segment of large transfers (bench/results/segment-sweep)."},
    {"SHOAL_SOCKET_BUFFER", "4194304", nullptr,
     "`SO_SNDBUF` of data sockets (0: the kernel's default). Receive buffers are left to the "
     "kernel's autotuning: one set by hand made Linux drop data it had advertised room for while "
     "a rank held back a message no receive had asked for yet, and the sender's retransmissions "
     "backed off for tens of seconds (bench/results/tcp-receive-buffer)."},
    {"SHOAL_TCP_CONGESTION", "auto", nullptr,
     "Congestion control of shoal's TCP data connections. `auto`: a connection that never leaves "
     "this host (loopback, or this host's own address at both ends) uses `reno`, since loopback "
     "neither drops nor queues and a pacing controller such as BBR only costs CPU time there "
     "(2 ranks over TCP, 32 MiB allreduce: 14.2 ms against 17.9 with BBR; "
     "[transports.md](transports.md), \"TCP\"); every other connection keeps the host's default. "
     "`system`: the host's default everywhere. A name (`cubic`, `bbr`, `dctcp`, ...): every data "
     "connection; one the host does not allow this process is an error when the communicator is "
     "made."},
    {"SHOAL_SHM", "1", nullptr,
     "Ranks on the same host (same host identity at the rendezvous: host name, boot id and network"
     " namespace) talk through shared memory. `1`: large messages (64 KiB and up) are single-copy "
     "with `process_vm_readv` where the kernel allows it, smaller ones stream through a shared "
     "ring; `copy`: everything through the shared ring (faster on cores nothing else uses, several"
     " times slower when they are busy: [transports.md](transports.md)), and no single-copy reads "
     "in the shared arena either (no `*_shared_cma` algorithms); `0`: TCP only. See "
     "[transports.md](transports.md)."},
    {"SHOAL_SHM_ARENA_BYTES", "1048576", nullptr,
     "When every rank of a communicator is on one host: the size of each of the two shared-memory "
     "slots per rank that the `*_shared` algorithms work in (an operation larger than a slot runs "
     "in several rounds). Rounded up to 4 KiB; 4096 to 1073741824, or `0` to turn the arena off "
     "(the message-based algorithms are used instead). `SHOAL_SHM=0` turns it off too. See "
     "[transports.md](transports.md), \"The shared arena\"."},
    {"SHOAL_SHM_STREAM", "auto", nullptr,
     "How a rank writes its arena slots in rounds of 32 KiB and more per rank: `auto` times its "
     "rounds written through the cache and streamed (non-temporal stores; a probe round of each "
     "kind in every 64, the others the cheaper way) and streams while the cache costs twice as "
     "much, which it does where the cores share no cache (other core complexes or sockets, or a "
     "VM's CPUs placed apart); `0` always through the cache; `1` always streamed. See "
     "[algorithms.md](algorithms.md), \"Where the cores are\"."},
    {"SHOAL_DEVICE_CHUNK_BYTES", "4194304", nullptr,
     "torch backend, GPU tensors: an all_reduce larger than this moves through host memory in "
     "pieces of this size, each copied down, reduced across ranks and copied back while the next "
     "is on its way ([torch.md](torch.md), \"GPU tensors\")."},
    {"SHOAL_DEVICE_STAGING_BYTES", "67108864", nullptr,
     "torch backend, GPU tensors: pinned host memory each device of a process group keeps for "
     "staging; the pieces of one all_reduce in flight at a time fit in it (at least two pieces)."},
    {"SHOAL_HOST_ID", "", "(derived)",
     "This rank's host identity. Default: host name, boot id and network namespace. Ranks with "
     "equal identities talk through shared memory and count as one host to the topology-aware "
     "algorithms; the tests use it to split one machine into several \"hosts\"."},
    {"SHOAL_GROUP_CONNECTIONS", "shared", nullptr,
     "torch backend: how `dist.new_group` makes a shoal group (`Communicator::create_or_split`). "
     "`shared`: split it from the first shoal communicator that holds its ranks, reusing its "
     "connections (collectives of the group and of that communicator must then be issued in the "
     "same relative order on every rank; another order fails with a `collective order mismatch` "
     "error; a lost peer breaks both); `own`: new connections for every group, which then fails "
     "only with its own members. One group asks for its own with "
     "`pg_options=shoal.torch.Options(own_connections=True)` (`Options::own_connections`). The "
     "group's rank 0 decides for the group. See [torch.md](torch.md#groups-mixing-backends)."},
    {"SHOAL_ADVERTISE_ADDR", "", "(derived)",
     "The address other ranks use to reach this one. Default: the local address of the route to "
     "the store's host (`MASTER_ADDR`), else 127.0.0.1."},
    {"SHOAL_SECRET", "", "(none; `shoalrun` sets it)",
     "The job's secret, 32 to 128 hex digits (`openssl rand -hex 32`), the same on every rank: "
     "every connection of the job — TCP, shared memory, and the `TcpStore` — proves it both ways "
     "before anything it sends is believed. Unset: rank 0 makes one per communicator and shares it"
     " through the store, which is then not authenticated. See [security.md](security.md)."},
    {"SHOAL_PYTHON", "", "python3 beside `shoalrun`, else on `PATH`",
     "`shoalrun`: the interpreter for Python workers."},
    {"SHOAL_SM_RESOURCE_CONFIG", "/opt/ml/input/config/resourceconfig.json", nullptr,
     "`shoalrun`: SageMaker's resource config file, read when `SM_HOSTS` is unset."},
    {"SHOAL_MP_CONFIG", "", nullptr,
     "`shoal.modelparallel`: the model-parallel config as JSON (e.g. `{\"partitions\": 2, "
     "\"microbatches\": 4}`), read by `smp.init()` when no dict is passed; before SageMaker's "
     "`SM_HP_MP_PARAMETERS`. Keys in docs/modelparallel.md."},
    {"SHOAL_CMAKE_BUILD_DIR", "", nullptr,
     "`setup.py` (`pip wheel`, `pip install .`): build the wheel from this CMake tree, configured with "
     "`SHOAL_BUILD_TORCH=ON` for the same environment, instead of its own (docs/install.md)."},
    {"SHOAL_DEBUG", "WARN", nullptr,
     "What shoal prints on stderr besides warnings: `INFO` (once per communicator: which ranks "
     "share a host, the transport to each peer, the settings; the algorithm chosen the first time "
     "per collective and size class) or `TRACE` (INFO and one line per operation). See "
     "[observability.md](observability.md)."},
    {"SHOAL_TRACE_BUFFER", "1000", nullptr,
     "The flight recorder keeps the last this-many operations per communicator and dumps them on a"
     " timeout, a lost peer, a mismatch or SIGUSR1. `0`: no recorder, no dumps, no SIGUSR1 "
     "handler."},
    {"SHOAL_TRACE_DIR", "/tmp", nullptr,
     "Where the flight recorder writes `shoal-trace-<communicator id>-rank<r>.jsonl`; "
     "`shoal-trace` reads them."},
    {"SHOAL_TIMELINE", "", nullptr,
     "Write a Chrome/Perfetto trace (JSON) of every operation to this path when the communicator "
     "is destroyed (flushed every half second before). `%r`: the rank (added as `-rank<r>` when "
     "missing), `%c`: the communicator's name, `%p`: the process id."},
    {"SHOAL_STALL_WARN", "60", nullptr,
     "Seconds (fractions allowed) a collective may wait before its rank logs which ranks have not "
     "joined it, and again every as many seconds until it ends. `0`: off."},
};

const Knob& find(const char* name) {
  for (const auto& k : kKnobs) {
    if (std::strcmp(k.name, name) == 0) return k;
  }
  throw InternalError(std::string("unlisted knob ") + name);
}

}  // namespace

const Knob* knobs(int* count) {
  *count = static_cast<int>(sizeof(kKnobs) / sizeof(kKnobs[0]));
  return kKnobs;
}

bool is_set(const char* name) {
  find(name);
  const char* v = std::getenv(name);
  return v && *v;
}

std::optional<std::string> get(const char* name) {
  const Knob& k = find(name);
  const char* v = std::getenv(name);
  if (v && *v) return std::string(v);
  if (*k.default_value) return std::string(k.default_value);
  return std::nullopt;
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

std::string markdown_table() {
  std::string out = "| variable | default | meaning |\n|---|---|---|\n";
  for (const auto& k : kKnobs) {
    std::string shown = k.shown_default ? k.shown_default
                        : *k.default_value ? std::string("`") + k.default_value + "`"
                                           : std::string("(none)");
    out += std::string("| `") + k.name + "` | " + shown + " | " + k.meaning + " |\n";
  }
  return out;
}

}  // namespace shoal::env
