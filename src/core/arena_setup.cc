// core/arena_setup.cc — the shared segment of a communicator whose ranks all
// live on one host (collectives/arena/host_arena.h), set up on its first
// collective, when the topology is first read.
//
// Rank 0 makes it and publishes where it is; every other rank maps it and
// says whether it could; rank 0 publishes the verdict. Both directions carry
// a proof of the job's secret (auth.h, Link::kArena, bound to a fresh nonce
// of rank 0): a rank that cannot prove it is not let in, and the job then
// uses the message-based algorithms, whose connections refuse it with the
// usual error (docs/security.md). Every rank uses the
// arena only if every rank has it, so the *_shared algorithms are chosen
// alike everywhere; when it cannot be had (a kernel or container that
// forbids opening another process's descriptors) the job goes on with the
// message-based algorithms and SHOAL_DEBUG=INFO says why.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "core/communicator_impl.h"

namespace shoal {
namespace {

// Exactly N bytes from hex (auth::decode_hex).
template <size_t N>
bool from_hex(const std::string& s, std::array<uint8_t, N>* out) {
  std::vector<uint8_t> b;
  if (!auth::decode_hex(s, &b) || b.size() != N) return false;
  std::copy(b.begin(), b.end(), out->begin());
  return true;
}

// What rank 0 (to == 0) or member `to` proves about the arena of `job`.
auth::Transcript arena_transcript(uint64_t job, int size, int to, const auth::Nonce& nonce) {
  auth::Transcript t;
  t.link = auth::Link::kArena;
  t.job = job;
  t.from = 0;
  t.to = static_cast<uint32_t>(to);
  t.size = static_cast<uint32_t>(size);
  t.connector = nonce;
  return t;
}

}  // namespace

// Waits for `key`, which rank `who` publishes during its own setup, until
// `deadline`; fails like any wait of a collective: on an abort, another
// rank's published cause, `who`'s exit, or the deadline (naming who).
void CommunicatorImpl::await_arena_key(const std::string& key, int who, transport::Clock::time_point deadline) {
  for (;;) {
    try {
      store_->wait({key}, std::chrono::milliseconds(100));
      return;
    } catch (const TimeoutError&) {
    }
    if (auto e = transport_->broken()) std::rethrow_exception(e);
    if (auto e = while_blocked(deadline)) std::rethrow_exception(e);
    if (auto e = root_->peer_gone(transport_->to_wire(who))) std::rethrow_exception(e);
    if (auto e = order_check(who)) std::rethrow_exception(e);
    if (transport::Clock::now() >= deadline) {
      std::rethrow_exception(timed_out("rank " + std::to_string(who) +
                                       " to set up the shared-memory arena (on its first collective)"));
    }
  }
}

void CommunicatorImpl::setup_arena(transport::Clock::time_point deadline) {
  if (arena_checked_) return;
  arena_checked_ = true;
  if (size_ < 2 || arena_bytes_ == 0 || topo_.nhosts() != 1) return;
  using coll::arena::HostArena;
  std::string why, verdict;
  const auth::Secret& secret = root_->secret_;
  if (rank_ == 0) {
    const auth::Nonce nonce = auth::fresh_nonce();
    arena_ = HostArena::create(0, size_, uid_, arena_bytes_, &why);
    const auth::Mac mac = auth::prove(secret, auth::Role::kConnector, arena_transcript(uid_, size_, 0, nonce));
    store_->set_str("arena/where", arena_ ? arena_->where() + " " + auth::to_hex(nonce.data(), nonce.size()) + " " +
                                                auth::to_hex(mac.data(), mac.size())
                                          : "-");
    verdict = arena_ ? "1" : "rank 0: " + why;
    for (int r = 1; r < size_; ++r) {
      const std::string key = "arena/ok/" + std::to_string(r);
      await_arena_key(key, r, deadline);
      std::istringstream in(store_->get_str(key));
      std::string ok, theirs;
      in >> ok >> theirs;
      auth::Mac m{};
      std::string bad;
      if (ok != "1") {
        std::getline(in, bad);
        bad = theirs + bad;
      } else if (!from_hex(theirs, &m) ||
                 !auth::verify(secret, auth::Role::kAcceptor, arena_transcript(uid_, size_, r, nonce), m.data())) {
        bad = "did not prove the job's secret (SHOAL_SECRET differs?)";
      }
      if (!bad.empty() && verdict == "1") verdict = "rank " + std::to_string(r) + ": " + bad;
    }
    store_->set_str("arena/verdict", verdict);
    if (arena_) arena_->close_fd();  // every rank has it mapped, or none uses it
  } else {
    await_arena_key("arena/where", 0, deadline);
    std::istringstream in(store_->get_str("arena/where"));
    std::string pid, fd, nonce_hex, mac_hex;
    in >> pid >> fd >> nonce_hex >> mac_hex;
    auth::Nonce nonce{};
    auth::Mac mac{};
    std::string answer;
    if (pid == "-") {
      answer = "0 rank 0 could not make it";
    } else if (!from_hex(nonce_hex, &nonce) || !from_hex(mac_hex, &mac) ||
               !auth::verify(secret, auth::Role::kConnector, arena_transcript(uid_, size_, 0, nonce), mac.data())) {
      answer = "0 rank 0 did not prove the job's secret (SHOAL_SECRET differs?)";
    } else if (!(arena_ = HostArena::attach(rank_, size_, uid_, pid + " " + fd, &why))) {
      answer = "0 " + why;
    } else {
      const auth::Mac mine = auth::prove(secret, auth::Role::kAcceptor, arena_transcript(uid_, size_, rank_, nonce));
      answer = "1 " + auth::to_hex(mine.data(), mine.size());
    }
    store_->set_str("arena/ok/" + std::to_string(rank_), answer);
    await_arena_key("arena/verdict", 0, deadline);
    verdict = store_->get_str("arena/verdict");
  }
  if (verdict != "1") {
    arena_.reset();
    observer_->info(label_ + ": no shared-memory arena (" + verdict + "); message-based algorithms only");
    return;
  }
  coll::arena::ArenaHooks h;
  h.broken = [this] { return transport_->broken(); };
  h.check_abort = [this](transport::Clock::time_point deadline) { return while_blocked(deadline); };
  h.order_check = [this](int peer) { return order_check(peer); };
  h.peer_gone = [this](int peer) { return root_->peer_gone(transport_->to_wire(peer)); };
  h.timed_out = [this](const std::string& waiting) { return timed_out(waiting); };
  h.describe_fp = [this](const transport::Fingerprint& fp) { return describe(fp); };
  arena_->set_hooks(std::move(h));
  arena_->set_spin(spin_us_, spin_yield_);
  const std::string reads = agree_on_reads(deadline);
  observer_->info(label_ + ": shared-memory arena of " + std::to_string(size_) + " ranks, " +
                  std::to_string(arena_->slot_bytes()) + " bytes per slot, single-copy reads " + reads);
}

// Every rank tries to read every other's memory (HostArena::probe_reads)
// and publishes what it found; the arena reads only if all of them can.
// Says "on", or "off (why)".
std::string CommunicatorImpl::agree_on_reads(transport::Clock::time_point deadline) {
  if (!arena_reads_) return "off (SHOAL_SHM=copy)";
  auto key = [](int r) { return "arena/reads/" + std::to_string(r); };
  const std::string failed = arena_->probe_reads();
  const std::string mine = failed.empty() ? "1" : "0 " + failed;
  store_->set_str(key(rank_), mine);
  std::string why;
  for (int r = 0; r < size_ && why.empty(); ++r) {
    if (r != rank_) await_arena_key(key(r), r, deadline);
    const std::string v = r == rank_ ? mine : store_->get_str(key(r));
    if (v != "1") why = "rank " + std::to_string(r) + ": " + v.substr(std::min<size_t>(2, v.size()));
  }
  arena_->set_reads(why.empty());
  return why.empty() ? "on" : "off (" + why + ")";
}

}  // namespace shoal
