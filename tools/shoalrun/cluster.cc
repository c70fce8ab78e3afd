// shoalrun/cluster.cc — resolve_cluster: pick the first matching source, apply
// the per-field flags, fill in defaults and validate.
#include "cluster.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/net.h"

namespace shoalrun {
namespace {

constexpr int kDefaultMasterPort = 29500;
constexpr int kMaxWorkersPerNode = 1024;  // as shoal-perf --np

// A free TCP port on the loopback interface, for one-node jobs.
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return kDefaultMasterPort;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = kDefaultMasterPort;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// `v` as --nproc-per-node means it (torchrun's values); `what` names the flag
// or variable. The default when none is given is GPUs, else 1 (resolve_cluster).
int resolve_nproc(const std::string& v, const std::string& what, std::string* detail) {
  if (v == "auto") {
    const int g = gpu_count();
    *detail = g > 0 ? "auto: " + std::to_string(g) + " GPUs" : "auto: no GPU, " + std::to_string(cpu_count()) + " cores";
    return g > 0 ? g : cpu_count();
  }
  if (v == "gpu") {
    const int g = gpu_count();
    if (g == 0) throw UsageError(what + " gpu: no GPU found on this node");
    *detail = "gpu: " + std::to_string(g) + " GPUs";
    return g;
  }
  if (v == "cpu") {
    *detail = "cpu: " + std::to_string(cpu_count()) + " cores";
    return cpu_count();
  }
  if (v == "xpu") throw UsageError(what + " xpu: shoalrun counts no XPU devices; give a number");
  const int n = parse_int(v, what);
  if (n < 1) throw UsageError(what + " must be at least 1 (got " + v + ")");
  *detail = what;
  return n;
}

void check_port(int port, const std::string& what) {
  if (port < 1 || port > 65535) throw UsageError(what + " " + std::to_string(port) + " is not a TCP port (1 .. 65535)");
}

}  // namespace

std::optional<std::string> env_str(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const char* start = text.c_str() + i;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(start, &end, 10);
  while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == start || *end != '\0' || errno == ERANGE || v < -1000000000L || v > 1000000000L) {
    throw UsageError(what + ": '" + text + "' is not an integer");
  }
  return static_cast<int>(v);
}

int gpu_count() {
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES")) {
    // Like CUDA: entries up to the first invalid one ("-1" hides every device).
    std::string s(cvd);
    int n = 0;
    size_t pos = 0;
    while (pos <= s.size() && !s.empty()) {
      const size_t comma = s.find(',', pos);
      const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      if (item.empty() || item[0] == '-') break;
      ++n;
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return n;
  }
  int n = 0;
  if (DIR* d = ::opendir("/dev")) {
    while (dirent* e = ::readdir(d)) {
      const char* name = e->d_name;
      if (std::strncmp(name, "nvidia", 6) != 0 || name[6] == '\0') continue;
      bool digits = true;
      for (const char* p = name + 6; *p; ++p) digits = digits && std::isdigit(static_cast<unsigned char>(*p));
      if (digits) ++n;
    }
    ::closedir(d);
  }
  return n;
}

int cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

Cluster resolve_cluster(const Options& o) {
  std::optional<SourceResult> src = source_from_flags(o);
  if (!src) src = source_from_sagemaker();
  if (!src) src = source_from_slurm();
  if (!src) src = source_from_ompi(o);
  if (!src) {
    src = SourceResult{};
    src->name = "local";
    src->detail = "no flags and no SageMaker, Slurm or Open MPI environment: one node";
  }

  Cluster c;
  c.source = src->name;
  c.source_detail = src->detail;
  c.nnodes = src->nnodes;
  c.node_rank = src->node_rank;
  c.hosts = src->hosts;
  if (c.nnodes < 1) throw UsageError("the number of nodes must be at least 1 (got " + std::to_string(c.nnodes) + ")");
  if (c.node_rank < 0 || c.node_rank >= c.nnodes) {
    throw UsageError("node rank " + std::to_string(c.node_rank) + " is out of range for " + std::to_string(c.nnodes) +
                     (c.nnodes == 1 ? " node" : " nodes") + " (0 .. " + std::to_string(c.nnodes - 1) + ", from " +
                     c.source + ")");
  }

  c.max_nnodes = o.max_nnodes && src->name == "flags" && !o.standalone ? *o.max_nnodes : c.nnodes;

  // Workers per node.
  if (o.nproc_per_node) {
    c.nproc_per_node = resolve_nproc(*o.nproc_per_node, o.named("nproc_per_node"), &c.nproc_detail);
  } else if (src->nproc_per_node) {
    c.nproc_per_node = *src->nproc_per_node;
    c.nproc_detail = src->nproc_detail;
    if (c.nproc_per_node < 1) throw UsageError(c.nproc_detail + " must be at least 1");
  } else {
    const int g = gpu_count();
    c.nproc_per_node = g > 0 ? g : 1;
    c.nproc_detail = g > 0 ? "default: " + std::to_string(g) + " GPUs" : "default: no GPU, 1 worker";
  }
  // A typo such as 100000 must not become a fork storm.
  if (c.nproc_per_node > kMaxWorkersPerNode) {
    throw UsageError(c.nproc_detail + ": " + std::to_string(c.nproc_per_node) +
                     " workers on one node is more than shoalrun starts (at most " +
                     std::to_string(kMaxWorkersPerNode) + ")");
  }

  // Where node 0 is. One node needs no name resolution at all.
  if (o.master_addr) {
    c.master_addr = *o.master_addr;
    c.master_origin = o.named("master_addr");
  } else if (c.multi_node() && src->master_addr) {
    c.master_addr = *src->master_addr;
    c.master_origin = src->master_origin;
  } else {
    c.master_addr = "127.0.0.1";
    c.master_origin = "the default of --master-addr";
  }
  if (c.master_addr.empty()) throw UsageError(o.named("master_addr") + " is empty");
  if (o.master_port) {
    c.master_port = *o.master_port;
    c.master_port_detail = o.named("master_port");
    c.master_port_given = true;
  } else if (!c.multi_node()) {
    c.master_port = free_local_port();
    c.master_port_detail = "a free local port (one node)";
  } else {
    c.master_port = kDefaultMasterPort;
    c.master_port_detail = "default";
  }
  check_port(c.master_port, o.named("master_port"));
  if (o.max_restarts < 0) throw UsageError("--max-restarts must not be negative");

  if (static_cast<int>(c.hosts.size()) == c.nnodes) {
    c.node_name = c.hosts[c.node_rank];
  } else {
    c.node_name = shoal::net::hostname();
  }
  plan_rendezvous(o, &c);
  return c;
}

}  // namespace shoalrun
