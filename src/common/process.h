// common/process.h — who a process is, so that a rank on the same machine can
// tell whether a peer's process still exists without any message from it.
//
// A token names a process by boot id, pid namespace, pid and start time (in
// clock ticks since boot), so a reused pid or a process in another pid
// namespace (containers that share a network namespace) is never mistaken
// for the peer.
#pragma once

#include <string>

namespace shoal::proc {

// This process's token, "<boot id>/<pid ns inode>/<pid>/<start time>", or ""
// when /proc does not tell (then nobody can probe this process).
std::string self_token();

enum class Liveness { kAlive, kGone, kUnknown };

// kGone when `token` names a process of this machine and pid namespace that
// has exited (or is a zombie); kUnknown when the token is empty or names a
// process elsewhere; kAlive otherwise. Reads /proc only: no signal is sent.
Liveness probe(const std::string& token);

// The pid field of a token ("" if it has none), for messages.
std::string pid_of(const std::string& token);

// Moves the calling thread off CPU `cpu` to another CPU of its affinity
// mask, then gives it its mask back (it stays where it was moved until the
// scheduler balances it). False, and nothing changed, when the mask has no
// other CPU. For two ranks that the scheduler keeps on one CPU while others
// are idle (collectives/arena/host_arena.cc).
bool move_off_cpu(int cpu);

}  // namespace shoal::proc
