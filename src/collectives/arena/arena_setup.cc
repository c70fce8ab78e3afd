// collectives/arena/arena_setup.cc — set_up() (arena_setup.h).
#include "collectives/arena/arena_setup.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shoal/error.h"
#include "transport/handshake.h"

namespace shoal::coll::arena {
namespace {

// Waits for `key`, which rank `who` publishes during its own set-up, until
// `deadline`; fails like any wait of a collective: on an abort, another
// rank's published cause, `who`'s exit, or the deadline (naming who).
// It polls with check() (1 ms, doubling to 50 ms) rather than waiting in
// short slices: torch's TCPStore client logs a warning for every wait that
// times out, which would fill stderr while a late rank is still computing.
void await_key(const SetupParams& p, const std::string& key, int who, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (p.store.check({key})) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
    if (auto e = p.live.broken()) std::rethrow_exception(e);
    if (auto e = p.live.check_abort(deadline)) std::rethrow_exception(e);
    if (auto e = p.live.peer_gone(who)) std::rethrow_exception(e);
    if (auto e = p.live.order_check(who)) std::rethrow_exception(e);
    if (Clock::now() >= deadline) {
      std::rethrow_exception(p.live.timed_out(p.live.name(who) +
                                              " to set up the shared-memory arena (on its first collective)"));
    }
  }
}

// Every rank tries to read every other's memory (HostArena::probe_reads)
// and publishes what it found ("1", or "0 <gone> <why>", <gone> the rank
// whose process had no memory left to read, else -1); the arena reads only
// if all of them can. Says "on", or "off (why)".
std::string agree_on_reads(const SetupParams& p, HostArena& arena, Clock::time_point deadline) {
  if (!p.reads) return "off (SHOAL_SHM=copy)";
  auto key = [](int r) { return "arena/reads/" + std::to_string(r); };
  int gone = -1;
  const std::string failed = arena.probe_reads(&gone);
  const std::string mine = failed.empty() ? "1" : "0 " + std::to_string(gone) + " " + failed;
  p.store.set_str(key(p.rank), mine);
  std::string why;
  for (int r = 0; r < p.size && why.empty(); ++r) {
    if (r != p.rank) await_key(p, key(r), r, deadline);
    const std::string v = r == p.rank ? mine : p.store.get_str(key(r));
    if (v == "1") continue;
    std::istringstream in(v);
    std::string zero;
    int lost = -1;
    if (!(in >> zero >> lost)) lost = -1;  // (a failed >> stores 0)
    std::getline(in >> std::ws, why);
    // A rank's process that exited after it published its address (killed
    // during the set-up) has no memory to read: that is a lost rank, to be
    // named as one, not a kernel that refuses the reads. Its exit may not
    // show in /proc yet (peer_gone below): the failed read is the proof.
    if (lost >= 0 && lost < p.size && lost != p.rank) {
      std::rethrow_exception(p.live.lost(lost, p.live.name(lost),
                                         "its process is gone (" + why + ", found by rank " + std::to_string(r) + ")"));
    }
    why = "rank " + std::to_string(r) + ": " + why;
  }
  if (!why.empty()) {
    // A read fails too when the peer's process has exited since it
    // published its answer: that is a lost rank, to be named as one.
    for (int r = 0; r < p.size; ++r) {
      if (r == p.rank) continue;
      if (auto e = p.live.peer_gone(r)) std::rethrow_exception(e);
    }
  }
  arena.set_reads(why.empty());
  return why.empty() ? "on" : "off (" + why + ")";
}

}  // namespace

std::unique_ptr<HostArena> set_up(const SetupParams& p, Clock::time_point deadline, std::string* report) {
  namespace hs = transport::handshake;
  const hs::Identity me{p.job, p.rank, p.size, &p.secret, auth::Link::kArena};
  std::unique_ptr<HostArena> arena;
  std::string why, verdict;
  if (p.rank == 0) {
    // Where the segment is, and a hello to each member: every member checks
    // rank 0's proof before it maps anything, and answers with its own.
    arena = HostArena::create(0, p.size, p.job, p.slot_bytes, &why);
    std::vector<hs::Hello> hellos(static_cast<size_t>(p.size));
    for (int r = 1; r < p.size; ++r) {
      hellos[static_cast<size_t>(r)] = hs::make_hello(me, r);
      p.store.set_str("arena/hello/" + std::to_string(r), hs::to_hex(hellos[static_cast<size_t>(r)]));
    }
    p.store.set_str("arena/where", arena ? arena->where() : "-");
    verdict = arena ? "1" : "rank 0: " + why;
    for (int r = 1; r < p.size; ++r) {
      const std::string key = "arena/ok/" + std::to_string(r);
      await_key(p, key, r, deadline);
      std::istringstream in(p.store.get_str(key));
      std::string ok, theirs;
      in >> ok >> theirs;
      hs::Accept answer;
      std::string bad;
      if (ok != "1") {
        std::getline(in, bad);
        bad = theirs + bad;
      } else if (!hs::from_hex(theirs, &answer)) {
        bad = "a malformed answer";
      } else {
        bad = hs::check_accept(answer, hellos[static_cast<size_t>(r)], me);
      }
      if (!bad.empty() && verdict == "1") verdict = "rank " + std::to_string(r) + ": " + bad;
    }
    p.store.set_str("arena/verdict", verdict);
    if (arena) arena->close_fd();  // every rank has it mapped, or none uses it
  } else {
    await_key(p, "arena/where", 0, deadline);
    const std::string where = p.store.get_str("arena/where");
    hs::Hello hello;
    std::string answer, bad;
    if (!hs::from_hex(p.store.get_str("arena/hello/" + std::to_string(p.rank)), &hello)) {
      answer = "0 rank 0's hello is malformed";
    } else if (!(bad = hs::check_hello(hello, me)).empty()) {
      answer = "0 rank 0's hello was refused: " + bad;
    } else if (where == "-") {
      answer = "0 rank 0 could not make it";
    } else if (!(arena = HostArena::attach(p.rank, p.size, p.job, where, &why))) {
      answer = "0 " + why;
    } else {
      answer = "1 " + hs::to_hex(hs::make_accept(hello, me));
    }
    p.store.set_str("arena/ok/" + std::to_string(p.rank), answer);
    await_key(p, "arena/verdict", 0, deadline);
    verdict = p.store.get_str("arena/verdict");
  }
  if (verdict != "1") {
    *report = "no shared-memory arena (" + verdict + "); message-based algorithms only";
    return nullptr;
  }
  arena->set_liveness(&p.live);
  arena->stores().set_mode(p.stores);
  const std::string reads = agree_on_reads(p, *arena, deadline);
  *report = "shared-memory arena of " + std::to_string(p.size) + " ranks, " + std::to_string(arena->slot_bytes()) +
            " bytes per slot, single-copy reads " + reads;
  return arena;
}

}  // namespace shoal::coll::arena
