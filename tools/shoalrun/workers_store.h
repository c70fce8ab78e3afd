// shoalrun/workers_store.h — the workers' store, hosted by node 0's launcher
// on MASTER_PORT, so that losing any worker (rank 0 included) never loses it.
//
// One key space, two wire protocols on one port, told apart by a
// connection's first byte:
//   - torch's TCPStore (first byte 0, its VALIDATE query): what torch's
//     env:// rendezvous connects with when TORCHELASTIC_USE_AGENT_STORE=True,
//     as under torchrun's agent. VALIDATE, PING, SET, GET, ADD, CHECK, WAIT,
//     CANCEL_WAIT, COMPARE_SET, DELETE_KEY, GETNUMKEYS, APPEND, MULTI_GET,
//     MULTI_SET; another query closes the connection (logged once). torch's
//     client puts "/" before every key; that one "/" is dropped here, so a
//     torch client's "shoal/dead/3" and a shoal client's are the same key.
//   - shoal's own TcpStore protocol (rendezvous/store_protocol.h, first byte
//     'S' of its HELLO), with the job's secret proved both ways, plus
//     COMPARE_SET (command 7: str key, str expected, str desired -> value)
//     and MULTI_GET. The launchers write their records (fault.h) through it.
// torch's protocol has no authentication: as with the store torch's rank 0
// hosts, anyone who reaches the port can use the store (docs/launcher.md).
//
// Threading: one epoll thread serves every connection (a batch costs what
// its events bring, however many connections are idle); the key-value map
// is guarded by mu_, which the thread holds while it handles a batch of
// input.
// The owner's calls (erase_prefix) are thread-safe. The destructor stops the
// thread and closes every connection (clients see the store vanish).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/auth.h"

namespace shoalrun {

class WorkersStore {
 public:
  // Listens on host:port (a loopback host binds loopback only; any other
  // binds every interface). Throws std::runtime_error naming the address
  // when it cannot bind.
  WorkersStore(const std::string& host, uint16_t port, const shoal::auth::Secret& secret);
  ~WorkersStore();
  WorkersStore(const WorkersStore&) = delete;
  WorkersStore& operator=(const WorkersStore&) = delete;

  uint16_t port() const { return port_; }
  // Drops every key that starts with `prefix` (a new round's records).
  void erase_prefix(const std::string& prefix);

 private:
  struct Impl;  // the thread's state (workers_store.cc)
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace shoalrun
