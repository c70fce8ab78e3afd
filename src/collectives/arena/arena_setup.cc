// collectives/arena/arena_setup.cc — set_up() (arena_setup.h).
#include "collectives/arena/arena_setup.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "shoal/error.h"
#include "transport/handshake.h"

namespace shoal::coll::arena {
namespace {

// Waits for `key` until `deadline`; fails like any wait of a collective: on
// an abort, another rank's published cause, the deadline (naming whom it
// waited for), or the exit of `who`, the rank that publishes `key` during
// its own set-up (-1: the last of the other ranks to get there; their exits
// are checked, and one of them per pause for operations issued in another
// order). It polls with check() (1 ms, doubling to 50 ms) rather than
// waiting in short slices: torch's TCPStore client logs a warning for every
// wait that times out, which would fill stderr while a late rank is still
// computing.
void await_key(const SetupParams& p, const std::string& key, int who, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(1);
  for (int round = 0;; ++round) {
    if (p.store.check({key})) return;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
    if (auto e = p.live.broken()) std::rethrow_exception(e);
    if (auto e = p.live.check_abort(deadline)) std::rethrow_exception(e);
    for (int r = who < 0 ? 0 : who; r < (who < 0 ? p.size : who + 1); ++r) {
      if (r == p.rank) continue;
      if (auto e = p.live.peer_gone(r)) std::rethrow_exception(e);
    }
    const int other = who >= 0 ? who : (p.rank + 1 + round % (p.size - 1)) % p.size;
    if (auto e = p.live.order_check(other)) std::rethrow_exception(e);
    if (Clock::now() >= deadline) {
      std::rethrow_exception(p.live.timed_out((who >= 0 ? p.live.name(who) : std::string("the other ranks")) +
                                              " to set up the shared-memory arena (on its first collective)"));
    }
  }
}

// Counts this rank in under `count_key`; the last of the `n` ranks counted
// there sets `all_key`, which the one rank that reads every answer awaits.
void count_in(const SetupParams& p, const std::string& count_key, int64_t n, const std::string& all_key) {
  if (p.store.add(count_key, 1) == n) p.store.set_str(all_key, "1");
}

std::vector<std::string> ranked_keys(const std::string& prefix, int from, int to) {
  std::vector<std::string> keys;
  for (int r = from; r < to; ++r) keys.push_back(prefix + std::to_string(r));
  return keys;
}

std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Every rank tries to read every other's memory (HostArena::probe_reads)
// and publishes what it found ("1", or "0 <gone> <why>", <gone> the rank
// whose process had no memory left to read, else -1); the arena reads only
// if all of them can. Rank 0 reads every answer in one request, once all
// are in, and publishes the verdict: "1", or "<rank> <its answer>" for the
// lowest rank that failed. Says "on", or "off (why)".
std::string agree_on_reads(const SetupParams& p, HostArena& arena, Clock::time_point deadline) {
  if (!p.reads) return "off (SHOAL_SHM=copy)";
  int gone = -1;
  const std::string failed = arena.probe_reads(&gone);
  const std::string mine = failed.empty() ? "1" : "0 " + std::to_string(gone) + " " + failed;
  p.store.set_str("arena/reads/" + std::to_string(p.rank), mine);
  count_in(p, "arena/reads/n", p.size, "arena/reads/all");
  std::string verdict;
  if (p.rank == 0) {
    await_key(p, "arena/reads/all", -1, deadline);
    const std::vector<Bytes> answers = p.store.multi_get(ranked_keys("arena/reads/", 0, p.size));
    verdict = "1";
    for (int r = 0; r < p.size && verdict == "1"; ++r) {
      const std::string v = text(answers[static_cast<size_t>(r)]);
      if (v != "1") verdict = std::to_string(r) + " " + v;
    }
    p.store.set_str("arena/reads/verdict", verdict);
  } else {
    await_key(p, "arena/reads/verdict", 0, deadline);
    verdict = p.store.get_str("arena/reads/verdict");
  }
  std::string why;
  if (verdict != "1") {
    std::istringstream in(verdict);
    std::string zero;
    int r = -1, lost = -1;
    if (!(in >> r >> zero >> lost)) lost = -1;  // (a failed >> stores 0)
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
    // A read fails too when the peer's process has exited since it
    // published its answer: that is a lost rank, to be named as one.
    for (int q = 0; q < p.size; ++q) {
      if (q == p.rank) continue;
      if (auto e = p.live.peer_gone(q)) std::rethrow_exception(e);
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
    await_key(p, "arena/ok/all", -1, deadline);
    const std::vector<Bytes> answers = p.store.multi_get(ranked_keys("arena/ok/", 1, p.size));
    for (int r = 1; r < p.size; ++r) {
      std::istringstream in(text(answers[static_cast<size_t>(r - 1)]));
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
    count_in(p, "arena/ok/n", p.size - 1, "arena/ok/all");
    await_key(p, "arena/verdict", 0, deadline);
    verdict = p.store.get_str("arena/verdict");
  }
  if (verdict != "1") {
    *report = "no shared-memory arena (" + verdict + "); message-based algorithms only";
    return nullptr;
  }
  arena->set_liveness(&p.live);
  // Every member has mapped the segment: its process is known from here on
  // without the store (a store hosted by a member goes when it does).
  for (int r = 0; r < p.size; ++r) {
    if (r != p.rank) p.live.learned_process(r, proc::token_of(arena->member_pid(r)));
  }
  arena->stores().set_mode(p.stores);
  const std::string reads = agree_on_reads(p, *arena, deadline);
  *report = "shared-memory arena of " + std::to_string(p.size) + " ranks, " + std::to_string(arena->slot_bytes()) +
            " bytes per slot, single-copy reads " + reads;
  return arena;
}

}  // namespace shoal::coll::arena
