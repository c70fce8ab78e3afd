// core/growth.cc — newcomers joining a communicator's ranks (communicator.h,
// docs/errors.md "Growing back"): the members grow(), each newcomer join()s,
// and all of them wire a fresh communicator, the old ranks first.
//
// Keys, in the lobby store both sides are given:
//   tickets             an ADD counter: a newcomer's ticket is its value after
//                       its ADD (1, 2, ...): the order of arrival
//   ticket/<t>          set by ticket t's newcomer: a grow() waiting for n
//                       newcomers waits on the n-th mark
//   admitted            how many tickets were admitted (written by leaders only)
//   grows               an ADD counter: the number g of each grow that admits
//   admit/<t>           "<g> <rank> <size>": ticket t's place in grow g
//   decision/<id>/<i>   the leader's word on the i-th grow() of communicator
//                       <id>: "g <g> <first ticket> <count>", "none", or
//                       "failed <reason>"
//   grow/<g>/comm/...   the keys of grow g's communicator
// Tickets are admitted in order and each once: only a leader writes
// `admitted`, and a communicator's grow() calls run one at a time on its
// rank 0. Two communicators growing from one lobby at once would share
// tickets; give each its own lobby.
#include <chrono>
#include <sstream>

#include "core/communicator_impl.h"

namespace shoal {
namespace {

int64_t read_count(Store& s, const std::string& key) { return s.add(key, 0); }

std::unique_ptr<CommunicatorImpl> wire_grown(const std::shared_ptr<Store>& lobby, uint64_t g, int rank, int size,
                                             Options o, const std::vector<std::string>* processes = nullptr) {
  auto keys = std::make_shared<PrefixStore>("grow/" + std::to_string(g) + "/comm", lobby);
  return std::make_unique<CommunicatorImpl>(std::move(keys), rank, size, std::move(o), /*fresh_secret=*/true,
                                            processes);
}

void check(const GrowOptions& o, const std::string& who) {
  if (o.joiners == 0 || o.joiners < -1) {
    throw InvalidArgument(who + "joiners: " + std::to_string(o.joiners) + " (want -1, those waiting, or n > 0)");
  }
  if (o.timeout.count() <= 0) throw InvalidArgument(who + "timeout: must be > 0 ms");
}

}  // namespace

std::shared_ptr<Communicator> Communicator::grow(std::shared_ptr<Store> lobby, const GrowOptions& o) {
  CommunicatorImpl& c = *impl_;
  const std::string who = c.label() + ": grow: ";
  if (!lobby) throw InvalidArgument(who + "lobby: null");
  check(o, who);
  const uint64_t call = c.grow_calls_.fetch_add(1) + 1;
  const std::string decision = "decision/" + std::to_string(c.uid()) + "/" + std::to_string(call);
  std::string d;
  if (c.rank_ == 0) {
    // The leader: count who waits, admit them in order, tell the others.
    const int64_t admitted = read_count(*lobby, "admitted");
    if (o.joiners > 0) {  // each newcomer marks its ticket (join): wait for the n-th one's mark
      std::vector<std::string> marks;
      for (int64_t t = admitted + 1; t <= admitted + o.joiners; ++t) marks.push_back("ticket/" + std::to_string(t));
      try {
        lobby->wait(marks, o.timeout);
      } catch (const TimeoutError&) {
        d = "failed " + std::to_string(read_count(*lobby, "tickets") - admitted) + " of the " +
            std::to_string(o.joiners) + " newcomers grow() waits for joined within " +
            std::to_string(o.timeout.count()) + " ms";
      }
    }
    const int64_t waiting = read_count(*lobby, "tickets") - admitted;
    if (d.empty()) {
      const int64_t k = o.joiners > 0 ? o.joiners : waiting;
      if (k == 0) {
        d = "none";
      } else {
        const int64_t g = lobby->add("grows", 1);
        const int size = c.size_ + static_cast<int>(k);
        for (int64_t i = 0; i < k; ++i) {
          lobby->set_str("admit/" + std::to_string(admitted + 1 + i),
                         std::to_string(g) + " " + std::to_string(c.size_ + i) + " " + std::to_string(size));
        }
        lobby->set_str("admitted", std::to_string(admitted + k));
        d = "g " + std::to_string(g) + " " + std::to_string(admitted + 1) + " " + std::to_string(k);
      }
    }
    lobby->set_str(decision, d);
  } else {
    try {
      lobby->wait({decision}, o.timeout);
    } catch (const Error& e) {
      throw TimeoutError(who + "rank 0 (the leader) gave no decision within " + std::to_string(o.timeout.count()) +
                         " ms (" + e.what() + ")");
    }
    d = lobby->get_str(decision);
  }
  if (d == "none") return nullptr;
  if (d.rfind("failed ", 0) == 0) throw TimeoutError(who + d.substr(7));
  std::istringstream in(d.substr(2));
  uint64_t g = 0;
  int64_t first = 0, k = 0;
  in >> g >> first >> k;
  const int size = c.size_ + static_cast<int>(k);
  abort("grown to " + std::to_string(size) + " ranks (grow " + std::to_string(g) + ")");
  Options opts = c.opts_;
  opts.advertise_host = c.advertise_host();
  opts.name = (opts.name.empty() ? std::string("c") : opts.name) + ".g" + std::to_string(g);
  std::vector<std::string> processes;
  for (int r = 0; r < c.size_; ++r) processes.push_back(r == c.rank_ ? std::string() : c.liveness().process_of(r));
  // An old rank that dies before it joins is seen at once.
  auto impl = wire_grown(lobby, g, c.rank_, size, std::move(opts), &processes);
  return std::shared_ptr<Communicator>(new Communicator(std::move(impl)));
}

std::shared_ptr<Communicator> Communicator::join(std::shared_ptr<Store> lobby, Options opts, const GrowOptions& o) {
  const std::string who = "shoal: join: ";
  if (!lobby) throw InvalidArgument(who + "lobby: null");
  if (o.timeout.count() <= 0) throw InvalidArgument(who + "timeout: must be > 0 ms");
  core::resolve_options(opts, *lobby, who);
  const int64_t ticket = lobby->add("tickets", 1);
  lobby->set_str("ticket/" + std::to_string(ticket), "1");  // what a grow() waiting for n newcomers waits on
  const std::string admit = "admit/" + std::to_string(ticket);
  try {
    lobby->wait({admit}, o.timeout);
  } catch (const Error& e) {
    throw TimeoutError(who + "ticket " + std::to_string(ticket) + " was not admitted within " +
                       std::to_string(o.timeout.count()) + " ms: no communicator called grow() on this lobby (" +
                       e.what() + ")");
  }
  std::istringstream in(lobby->get_str(admit));
  uint64_t g = 0;
  int rank = -1, size = 0;
  in >> g >> rank >> size;
  if (!in || rank < 0 || rank >= size) throw InvalidArgument(who + "admit/" + std::to_string(ticket) + ": malformed");
  opts.name = opts.name + ".g" + std::to_string(g);
  return std::shared_ptr<Communicator>(new Communicator(wire_grown(lobby, g, rank, size, std::move(opts))));
}

}  // namespace shoal
