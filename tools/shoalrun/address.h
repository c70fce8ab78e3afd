// shoalrun/address.h — what an address means for this machine: whether a
// name resolves to loopback only (so that no other machine can reach it
// there), whether it names this machine (so that this launcher hosts the
// c10d rendezvous store), and endpoint parsing. Thread-safe free functions.
#pragma once

#include <string>
#include <vector>

namespace shoalrun {

struct Endpoint {
  std::string host;
  int port = 0;
};

// "host", "host:port", "[v6]:port" or a bare IPv6 literal. Throws UsageError
// naming `what` for a malformed one or a port outside 1 .. 65535.
Endpoint parse_endpoint(const std::string& text, int default_port, const std::string& what);

// The addresses `host` resolves to here (numeric); empty when it does not resolve.
std::vector<std::string> resolve_addresses(const std::string& host);
// True when `host` resolves, and only to loopback addresses (127/8, ::1).
bool is_loopback_only(const std::vector<std::string>& addresses);
// True when `host` is this machine's host name, or resolves to an address of
// one of its interfaces other than loopback.
bool names_this_machine(const std::string& host);
// A TCP port free on every interface now (0 when none could be bound).
int free_port_any();
// "host:port", with IPv6 literals in brackets.
std::string join_endpoint(const std::string& host, int port);

}  // namespace shoalrun
