// core/recovery.cc — surviving a lost rank (communicator.h, docs/errors.md
// "Recovery"): the survivors agree on who goes on (agree), then each aborts
// the old communicator locally and wires a fresh one over them (shrink).
//
// The agreement's keys live under the communicator's own store prefix (a
// fresh one for every communicator: core::incarnation), epoch by epoch:
//   recover/<e>/in/<rank>   a rank checked in, with the ranks it suspects
//   recover/<e>/decision    "m <ranks>" or "abandoned <leader>", written once
//                           (compare-and-set from absent): the first wins
//   recover/<e>/comm/...    the keys of the communicator shrink() makes
// A rank that reads "abandoned" moves to epoch e+1 suspecting that leader;
// one that reads a membership returns it (or is left out). Since the
// decision of an epoch can be written only once, and every rank walks the
// epochs in order, no two ranks return different memberships.
#include <algorithm>
#include <chrono>
#include <thread>

#include "core/communicator_impl.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

std::string list_text(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s.push_back(',');
    s.append(std::to_string(v[i]));
  }
  return s;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) v.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return v;
}

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

}  // namespace

Membership Communicator::agree(const AgreeOptions& o) { return agree_from(o, 1); }

Membership Communicator::agree_from(const AgreeOptions& o, uint64_t first) {
  CommunicatorImpl& c = *impl_;
  const int n = c.size_, me = c.rank_;
  const std::string who = c.label() + ": agree: ";
  if (o.window.count() < 0 || o.timeout.count() <= 0) {
    throw InvalidArgument(who + "window must be >= 0 ms and timeout > 0 ms");
  }
  if (n == 1) return Membership{1, {0}};
  Store& store = *c.store();
  std::vector<char> suspected(static_cast<size_t>(n), 0), gone(static_cast<size_t>(n), 0);
  auto suspect = [&](int r) {
    if (r >= 0 && r < n && r != me) suspected[static_cast<size_t>(r)] = 1;
  };
  for (int r : o.suspects) suspect(r);
  if (auto e = c.error()) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& x) {
      for (int r : x.suspects()) suspect(r);
    } catch (...) {
    }
  }
  const auto give_up = Clock::now() + o.timeout;
  for (uint64_t epoch = first;; ++epoch) {
    const std::string base = "recover/" + std::to_string(epoch) + "/";
    std::vector<char> in(static_cast<size_t>(n), 0);
    in[static_cast<size_t>(me)] = 1;
    std::vector<int> mine;
    for (int r = 0; r < n; ++r) {
      if (suspected[static_cast<size_t>(r)]) mine.push_back(r);
    }
    store.set_str(base + "in/" + std::to_string(me), list_text(mine));
    const auto epoch_start = Clock::now();
    for (int poll = 0;; ++poll) {
      const auto now = Clock::now();
      if (now > give_up) {
        throw TimeoutError(who + "no decision within " + std::to_string(o.timeout.count()) + " ms (epoch " +
                           std::to_string(epoch) + ")");
      }
      if (store.check({base + "decision"})) {
        const std::string d = store.get_str(base + "decision");
        if (d.rfind("abandoned ", 0) == 0) {
          suspect(std::stoi(d.substr(10)));
          break;  // the next epoch
        }
        Membership m{epoch, parse_list(d.substr(2))};
        if (std::find(m.members.begin(), m.members.end(), me) == m.members.end()) {
          throw Aborted(who + "this rank is not in the membership the survivors agreed on in epoch " +
                        std::to_string(epoch) + " ([" + list_text(m.members) +
                        "]): it checked in too late (stopped, cut off or slow)");
        }
        return m;
      }
      for (int q = 0; q < n; ++q) {
        const auto k = static_cast<size_t>(q);
        if (!in[k] && store.check({base + "in/" + std::to_string(q)})) {
          in[k] = 1;
          for (int r : parse_list(store.get_str(base + "in/" + std::to_string(q)))) suspect(r);
        }
        if (q != me && !gone[k] && c.liveness().process_gone(q)) gone[k] = 1;
      }
      auto lost = [&](int q) {
        const auto k = static_cast<size_t>(q);
        return gone[k] || (suspected[k] && !in[k]);
      };
      int leader = 0;
      while (lost(leader)) ++leader;  // this rank is never lost: leader <= me
      bool all_known = true;
      for (int q = 0; q < n; ++q) all_known = all_known && (in[static_cast<size_t>(q)] || lost(q));
      if (leader == me) {
        if (all_known || now - epoch_start >= o.window) {
          std::vector<int> members;
          for (int q = 0; q < n; ++q) {
            if (in[static_cast<size_t>(q)] && !gone[static_cast<size_t>(q)]) members.push_back(q);
          }
          store.compare_set(base + "decision", {}, bytes("m " + list_text(members)));
          continue;  // read back what won
        }
      } else if (now - epoch_start >= o.window + o.window / 2) {
        // The leader has not decided: close the epoch without it.
        store.compare_set(base + "decision", {}, bytes("abandoned " + std::to_string(leader)));
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(poll < 100 ? 500 : 5000));  // polling the store
    }
  }
}

std::shared_ptr<Communicator> Communicator::shrink(const Membership& m) {
  CommunicatorImpl& c = *impl_;
  const std::string who = c.label() + ": shrink: ";
  int rank = -1;
  for (size_t i = 0; i < m.members.size(); ++i) {
    const int r = m.members[i];
    if (r < 0 || r >= c.size_ || (i > 0 && r <= m.members[i - 1])) {
      throw InvalidArgument(who + "members: [" + list_text(m.members) + "] is not an ascending list of ranks of " +
                            std::to_string(c.size_));
    }
    if (r == c.rank_) rank = static_cast<int>(i);
  }
  if (m.epoch < 1) throw InvalidArgument(who + "epoch: 0 is no agreed membership (from agree())");
  if (rank < 0) throw InvalidArgument(who + "members: this rank (" + std::to_string(c.rank_) + ") is not among them");
  abort("shrunk to ranks [" + list_text(m.members) + "] (epoch " + std::to_string(m.epoch) + ")");
  Options o = c.opts_;
  o.advertise_host = c.advertise_host();
  auto host = std::find(m.members.begin(), m.members.end(), o.store_host_rank);
  o.store_host_rank = host == m.members.end() ? -1 : static_cast<int>(host - m.members.begin());
  o.name = (o.name.empty() ? std::string("c") : o.name) + ".e" + std::to_string(m.epoch);
  // Under this communicator's keys (no other communicator's), per epoch, and
  // counted (a second shrink to the same membership gets keys of its own).
  auto scoped = core::incarnation(c.store(), "recover/" + std::to_string(m.epoch) + "/comm", c.rank_);
  std::vector<std::string> processes;
  for (int r : m.members) processes.push_back(r == c.rank_ ? std::string() : c.liveness().process_of(r));
  std::vector<int64_t> job_ranks;  // named as this one names them
  if (!c.job_ranks().empty()) {
    for (int r : m.members) job_ranks.push_back(c.job_rank(r));
  }
  // A member that dies before it joins is seen at once.
  auto impl = std::make_unique<CommunicatorImpl>(std::move(scoped), rank, static_cast<int>(m.members.size()),
                                                 std::move(o), /*fresh_secret=*/true, &processes,
                                                 std::move(job_ranks));
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::recover(const AgreeOptions& o) {
  AgreeOptions a = o;
  Membership m = agree(a);
  for (;;) {
    try {
      return shrink(m);
    } catch (const PeerLost& e) {
      // A member died before it joined: making the communicator waits for
      // its rank 0's keys, so every member failed here alike. Agree again,
      // without it, in the next epoch.
      const int lost = e.peer();
      if (lost < 0 || lost >= static_cast<int>(m.members.size())) throw;
      a.suspects.push_back(m.members[static_cast<size_t>(lost)]);
      m = agree_from(a, m.epoch + 1);
    }
  }
}

}  // namespace shoal
