// shoalrun/rendezvous_plan.cc — where the launchers of a multi-node job meet,
// who hosts their store, and the check that no node looks for another
// machine's launcher on loopback.
//
// static  node 0's launcher hosts the store at the master address (or the
//         --rdzv-endpoint's host) on --rdzv-port (default master port + 1),
//         or the endpoint's port; node ranks are given.
// c10d    the launcher on the --rdzv-endpoint's host hosts it (by host name or
//         interface address, or rdzv_conf is_host); when its port is already
//         taken on that machine the launcher joins as a client, as torchrun
//         does. Node ranks are assigned at the rendezvous (the host's node is
//         node 0), and so are MASTER_ADDR (the endpoint's host, or the host's
//         --local-addr) and MASTER_PORT (--master-port, else a free port).
//
// Loopback: in a multi-node job, a node that is not the one hosting the store
// and finds the store's address resolving to loopback only would wait for a
// rendezvous that cannot happen on another machine; that is an error at once,
// naming the flag or variable, unless --same-host-nodes says every node runs
// on this machine.
#include <string>

#include "address.h"
#include "cluster.h"
#include "common/net.h"

namespace shoalrun {
namespace {

constexpr int kDefaultC10dPort = 29400;  // torchrun's

std::string address_list(const std::vector<std::string>& a) {
  std::string s;
  for (const auto& x : a) s += (s.empty() ? "" : ", ") + x;
  return s;
}

[[noreturn]] void loopback_error(const std::string& what, const std::string& value,
                                 const std::vector<std::string>& addrs, const std::string& why) {
  throw UsageError(what + " " + value + " resolves to loopback only (" + address_list(addrs) + ") but " + why +
                   ": the other nodes' launchers cannot be reached there; give an address of that node that "
                   "the others can reach (or --same-host-nodes when every node runs on this machine)");
}

void plan_static(const Options& o, Cluster* c) {
  if (o.rdzv_endpoint.empty()) {
    c->store_host = c->master_addr;
    c->store_origin = c->master_origin;
    c->rdzv_port = o.rdzv_port ? *o.rdzv_port : c->master_port + 1;
    if (c->rdzv_port < 1 || c->rdzv_port > 65535) {
      throw UsageError((o.rdzv_port ? std::string("--rdzv-port ") : o.named("master_port") + " + 1 = ") +
                       std::to_string(c->rdzv_port) + " is not a TCP port (1 .. 65535)");
    }
  } else {
    if (o.rdzv_port) throw UsageError("--rdzv-port and " + o.named("rdzv_endpoint") + " both name the port; give one");
    const Endpoint e = parse_endpoint(o.rdzv_endpoint, kDefaultC10dPort, o.named("rdzv_endpoint"));
    c->store_host = e.host;
    c->store_origin = o.named("rdzv_endpoint");
    c->rdzv_port = e.port;
    if (!o.master_addr) {  // as torchrun: the endpoint is node 0's
      c->master_addr = e.host;
      c->master_origin = o.named("rdzv_endpoint");
    }
  }
  if (c->rdzv_port == c->master_port) {
    throw UsageError("the launchers' rendezvous port (" + std::to_string(c->rdzv_port) + ") must differ from " +
                     o.named("master_port") + ": the workers' store uses the master port (--rdzv-port must differ)");
  }
  c->host_store = c->node_rank == 0;
  if (c->node_rank == 0 || o.same_host_nodes) return;
  const std::string why = "this is node " + std::to_string(c->node_rank) + " of a " + std::to_string(c->nnodes) +
                          "-node job, and node 0 hosts the rendezvous there";
  const auto addrs = resolve_addresses(c->store_host);
  if (is_loopback_only(addrs)) loopback_error(c->store_origin, c->store_host, addrs, why);
  if (c->master_addr != c->store_host) {
    const auto m = resolve_addresses(c->master_addr);
    if (is_loopback_only(m)) loopback_error(c->master_origin, c->master_addr, m, why);
  }
}

void plan_c10d(const Options& o, Cluster* c) {
  if (o.rdzv_endpoint.empty()) {
    throw UsageError(o.named("rdzv_backend") + " c10d: a multi-node job needs --rdzv-endpoint HOST[:PORT] (where "
                     "the nodes meet)");
  }
  if (o.rdzv_port) throw UsageError("--rdzv-port is for the static rendezvous; with c10d give the port in " +
                                    o.named("rdzv_endpoint"));
  const Endpoint e = parse_endpoint(o.rdzv_endpoint, kDefaultC10dPort, o.named("rdzv_endpoint"));
  c->store_host = e.host;
  c->store_origin = o.named("rdzv_endpoint");
  c->rdzv_port = e.port;
  if (c->master_port_given && c->master_port == c->rdzv_port) {
    throw UsageError(o.named("master_port") + " " + std::to_string(c->master_port) + " is the rendezvous port of " +
                     o.named("rdzv_endpoint") + "; the workers' store needs another");
  }
  if (o.node_rank && o.origin.count("node_rank")) {
    c->notes.push_back(o.named("node_rank") + " " + std::to_string(*o.node_rank) +
                       " is not used with --rdzv-backend c10d: node ranks are assigned at the rendezvous (as "
                       "torchrun does); the node that hosts " + c->store_origin + " is node 0");
  }
  if (o.master_addr) {
    c->notes.push_back(o.named("master_addr") + " is not used with --rdzv-backend c10d: MASTER_ADDR is the host of " +
                       c->store_origin + " (or its --local-addr)");
  }
  c->node_rank = -1;
  c->hosts.clear();
  c->master_addr = o.local_addr.empty() ? e.host : o.local_addr;
  c->master_origin = o.local_addr.empty() ? c->store_origin : o.named("local_addr");
  c->advertise = c->master_addr;
  const auto addrs = resolve_addresses(e.host);
  const bool loopback = is_loopback_only(addrs);
  const bool by_name = names_this_machine(e.host);
  if (o.rdzv_conf.is_host) {
    c->host_store = *o.rdzv_conf.is_host;
  } else {
    c->host_store = loopback || by_name;
    c->host_by_guess = true;
  }
  if (loopback && !o.same_host_nodes && !by_name && !o.rdzv_conf.is_host.value_or(false)) {
    std::string count = std::to_string(c->nnodes);
    if (c->max_nnodes != c->nnodes) count.append(1, ':').append(std::to_string(c->max_nnodes));
    loopback_error(c->store_origin, e.host, addrs,
                   "this is a multi-node job (" + o.named("nnodes") + " " + count +
                       ") and no node can tell that it is the one hosting the rendezvous");
  }
}

}  // namespace

void plan_rendezvous(const Options& o, Cluster* c) {
  if (o.standalone) {
    if (o.given("rdzv_backend") || o.given("rdzv_endpoint") || o.given("rdzv_id")) {
      c->notes.push_back(o.named("standalone") +
                         ": one node on a free local port; --rdzv-backend, --rdzv-endpoint and --rdzv-id are not "
                         "used (as torchrun)");
    }
    return;
  }
  if (o.elastic() && o.rdzv_backend != "c10d") {
    throw UsageError(o.named("nnodes") + " " + std::to_string(*o.nnodes) + ":" + std::to_string(*o.max_nnodes) +
                     ": a range of node counts (an elastic job) needs --rdzv-backend c10d");
  }
  c->backend = o.rdzv_backend;
  if (!c->multi_node()) return;
  if (c->c10d()) {
    plan_c10d(o, c);
  } else {
    plan_static(o, c);
  }
}

}  // namespace shoalrun
