// core/bootstrap.cc — creating communicators: from a store, or from the
// launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/env.h"
#include "common/net.h"
#include "core/communicator_impl.h"

namespace shoal {
namespace {

std::atomic<uint64_t> g_comm_counter{0};

// The local address this host uses to reach `host` (no packet is sent: a UDP
// socket is connected and asked for its name). Empty if unknown.
std::string route_to(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::string out;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {};
      if (ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
      } else {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
      }
      out = buf;
    }
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(res);
  return out;
}

// The TcpStore behind `store`, looking through PrefixStores.
const TcpStore* tcp_store_of(const Store* s) {
  while (s) {
    if (auto* t = dynamic_cast<const TcpStore*>(s)) return t;
    auto* p = dynamic_cast<const PrefixStore*>(s);
    s = p ? p->base().get() : nullptr;
  }
  return nullptr;
}

int env_int(const char* name, bool required, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required) throw InvalidArgument(std::string(name) + ": not set (needed to join a job from the environment)");
    return fallback;
  }
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) throw InvalidArgument(std::string(name) + ": '" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

// SHOAL_TIMEOUT_S replaces the default timeout; any timeout must be > 0
// (`who` prefixes the error).
void resolve_timeout(Options& opts, const std::string& who) {
  if (auto t = env::get_int("SHOAL_TIMEOUT_S"); t && opts.timeout == std::chrono::minutes(30)) {
    if (*t <= 0) throw InvalidArgument("SHOAL_TIMEOUT_S: must be > 0");
    opts.timeout = std::chrono::seconds(*t);
  }
  if (opts.timeout.count() <= 0) throw InvalidArgument(who + "timeout: must be > 0");
}

}  // namespace

namespace core {
std::string describe_store(const Store& store) {
  const TcpStore* t = tcp_store_of(&store);
  return t ? "at " + t->host() + ":" + std::to_string(t->port()) : std::string("the store the job was given");
}

void resolve_options(Options& opts, const Store& store, const std::string& who) {
  resolve_timeout(opts, who);
  if (opts.name.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "c%llu", static_cast<unsigned long long>(g_comm_counter.fetch_add(1)));
    opts.name = buf;  // the observer names the communicator in what it writes
  }
  if (opts.advertise_host.empty()) opts.advertise_host = env::get("SHOAL_ADVERTISE_ADDR").value_or("");
  if (opts.advertise_host.empty()) {
    std::string target;
    if (const TcpStore* t = tcp_store_of(&store)) target = t->host();
    if (target.empty()) {
      if (const char* m = std::getenv("MASTER_ADDR")) target = m;
    }
    if (!target.empty()) opts.advertise_host = route_to(target);
    if (opts.advertise_host.empty()) opts.advertise_host = "127.0.0.1";
  }
}

// The keys of one communicator, never those of an earlier one made under the
// same prefix (torch reuses a group's name, and so its store prefix, after
// destroy_process_group): each rank counts the communicators it has made
// under `prefix` ("arrivals/<rank>"); every rank makes the same ones in the
// same order, so the counts agree. The first lives at `prefix` itself, the
// n-th at "<prefix>/<n>".
std::shared_ptr<Store> incarnation(const std::shared_ptr<Store>& store, const std::string& prefix, int rank) {
  auto scoped = std::make_shared<PrefixStore>(prefix, store);
  const int64_t n = scoped->add("arrivals/" + std::to_string(rank), 1);
  if (n == 1) return scoped;
  return std::make_shared<PrefixStore>(std::to_string(n), scoped);
}
}  // namespace core

std::shared_ptr<Communicator> Communicator::create(std::shared_ptr<Store> store, int rank, int size,
                                                   Options opts) {
  return create_named(std::move(store), rank, size, std::move(opts), {});
}

std::shared_ptr<Communicator> Communicator::create_named(std::shared_ptr<Store> store, int rank, int size,
                                                         Options opts, std::vector<int64_t> job_ranks) {
  if (!store) throw InvalidArgument("store: null");
  if (size < 1) throw InvalidArgument("size: must be >= 1, got " + std::to_string(size));
  if (rank < 0 || rank >= size) {
    throw InvalidArgument("rank: " + std::to_string(rank) + " is out of range for size " + std::to_string(size));
  }
  core::resolve_options(opts, *store, "");
  auto scoped = core::incarnation(store, "shoal/" + opts.name, rank);
  auto impl = std::make_unique<CommunicatorImpl>(std::move(scoped), rank, size, std::move(opts),
                                                 /*fresh_secret=*/false, /*processes=*/nullptr, std::move(job_ranks));
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::split(const std::vector<int>& ranks, std::shared_ptr<Store> store,
                                                  Options opts) {
  const std::string who = impl_->label() + ": split: ";
  if (!store) throw InvalidArgument(who + "store: null");
  if (ranks.empty()) throw InvalidArgument(who + "ranks: empty");
  std::vector<bool> seen(static_cast<size_t>(size()), false);
  int me = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int r = ranks[i];
    if (r < 0 || r >= size()) {
      throw InvalidArgument(who + "ranks: " + std::to_string(r) + " is out of range for size " + std::to_string(size()));
    }
    if (seen[static_cast<size_t>(r)]) throw InvalidArgument(who + "ranks: " + std::to_string(r) + " appears twice");
    seen[static_cast<size_t>(r)] = true;
    if (r == rank()) me = static_cast<int>(i);
  }
  if (me < 0) throw InvalidArgument(who + "ranks: this rank (" + std::to_string(rank()) + ") is not among them");
  resolve_timeout(opts, who);
  if (opts.name.empty()) opts.name = "group";  // `store` is the group's own
  // Counted per process (its root rank): ranks that disagree on the list
  // may both think they are member `me`.
  auto scoped = core::incarnation(store, "shoal/" + opts.name, impl_->root_rank());
  auto impl = std::make_unique<CommunicatorImpl>(shared_from_this(), *impl_, std::move(scoped), me, ranks,
                                                 std::move(opts));
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::from_env(Options opts) {
  int rank = env_int("RANK", true, 0);
  int size = env_int("WORLD_SIZE", true, 1);
  // Checked before the store is reached: a rank other than 0 would otherwise
  // wait for a store that may never come up.
  if (size < 1) throw InvalidArgument("WORLD_SIZE: must be at least 1, got " + std::to_string(size));
  if (rank >= size) {
    throw InvalidArgument("RANK: " + std::to_string(rank) + " is out of range for WORLD_SIZE " + std::to_string(size));
  }
  const char* addr = std::getenv("MASTER_ADDR");
  int port = env_int("MASTER_PORT", false, 29500);
  if (port <= 0 || port > 65535) throw InvalidArgument("MASTER_PORT: " + std::to_string(port) + " is not a port");
  // TORCHELASTIC_USE_AGENT_STORE=True (shoalrun, torchrun's agent): the launcher hosts the store
  // outside the ranks, so that losing any rank never loses it; every rank is a client.
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_store = agent && std::string(agent) == "True";
  TcpStoreOptions so;
  so.host = addr && *addr ? addr : "127.0.0.1";
  so.port = static_cast<uint16_t>(port);
  so.is_server = rank == 0 && !agent_store;
  so.timeout = opts.timeout;
  auto store = std::make_shared<TcpStore>(so);
  opts.store_host_rank = agent_store ? -1 : 0;
  return create(std::move(store), rank, size, std::move(opts));
}

}  // namespace shoal
