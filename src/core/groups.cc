// core/groups.cc — Communicator::create_or_split: the communicators this
// process made afresh (the roots a later group may be split from), and the
// group's rank-0-decides choice between splitting and making a fresh one.
#include <algorithm>

#include "common/env.h"
#include "core/communicator_impl.h"
#include "common/thread_annotations.h"
#include "shoal/communicator.h"
#include "shoal/error.h"

namespace shoal {
namespace {

// A communicator create_or_split() made afresh, with its members' job ranks.
struct Root {
  std::weak_ptr<Communicator> comm;
  std::vector<int64_t> job_ranks;
};

// In creation order: the same on every process (groups are made in the
// same order everywhere), so every member of a group finds the same root.
class Roots {
 public:
  // The first live, unbroken root that holds every one of `job_ranks`
  // (with `id` != 0: the root with that id, broken or not), and their ranks
  // in it (null if none).
  std::shared_ptr<Communicator> find(const std::vector<int64_t>& job_ranks, std::vector<int>* members,
                                     uint64_t id = 0) {
    MutexLock g(mu_);
    roots_.erase(std::remove_if(roots_.begin(), roots_.end(), [](const Root& r) { return r.comm.expired(); }),
                 roots_.end());
    for (const Root& root : roots_) {
      auto comm = root.comm.lock();
      if (!comm || (id != 0 ? comm->id() != id : comm->error() != nullptr)) continue;
      members->clear();
      for (int64_t jr : job_ranks) {
        auto it = std::find(root.job_ranks.begin(), root.job_ranks.end(), jr);
        if (it == root.job_ranks.end()) break;
        members->push_back(static_cast<int>(it - root.job_ranks.begin()));
      }
      if (members->size() == job_ranks.size()) return comm;
    }
    return nullptr;
  }
  void add(const std::shared_ptr<Communicator>& comm, std::vector<int64_t> job_ranks) {
    MutexLock g(mu_);
    roots_.push_back(Root{comm, std::move(job_ranks)});
  }

 private:
  Mutex mu_;
  std::vector<Root> roots_ GUARDED_BY(mu_);
};

Roots& roots() {
  static Roots* r = new Roots;  // never destroyed: communicators may outlive static destruction
  return *r;
}

bool share_connections() {
  const std::string s = env::get("SHOAL_GROUP_CONNECTIONS").value();
  if (s == "shared") return true;
  if (s == "own") return false;
  throw InvalidArgument("SHOAL_GROUP_CONNECTIONS: '" + s + "' is not one of shared, own");
}

// Whether the group splits from `*parent` (never when `own`, the group's
// Options::own_connections, or SHOAL_GROUP_CONNECTIONS=own): its rank 0 decides and publishes
// the answer, with the id of the root it splits from, in `store` (or its
// error, so that the others do not wait for an answer that never comes).
// Every member then splits from that very root (a member's own find() could
// return another one, e.g. when it saw the first one break and rank 0 did
// not), whether or not this member sees it broken.
bool decide_split(Store& store, int rank, bool own, const std::vector<int64_t>& job_ranks,
                  std::shared_ptr<Communicator>* parent, std::vector<int>* members) {
  const std::string kKey = "connections";
  if (rank == 0) {
    bool split;
    try {
      split = share_connections() && !own && *parent;
    } catch (const InvalidArgument& e) {
      store.set_str(kKey, std::string("error ") + e.what());
      throw;
    }
    store.set_str(kKey, split ? "shared " + std::to_string((*parent)->id()) : "own");
    return split;
  }
  (void)share_connections();  // a bad value here is this rank's own error, before any wait
  const std::string answer = store.get_str(kKey);
  if (answer.rfind("error ", 0) == 0) throw InvalidArgument("the group's rank 0: " + answer.substr(6));
  if (answer.rfind("shared ", 0) != 0) return false;
  *parent = roots().find(job_ranks, members, std::stoull(answer.substr(7)));
  if (!*parent) {
    throw InvalidArgument(
        "the group's rank 0 splits it from a communicator this rank does not have (groups created in "
        "another order on different ranks?)");
  }
  return true;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::create_or_split(std::shared_ptr<Store> store, int rank, int size,
                                                           std::vector<int64_t> job_ranks, Options opts) {
  if (job_ranks.empty()) {
    for (int r = 0; r < size; ++r) job_ranks.push_back(r);
  }
  if (static_cast<int>(job_ranks.size()) != size) {
    throw InvalidArgument("create_or_split: job_ranks: " + std::to_string(job_ranks.size()) +
                          " members for a group of size " + std::to_string(size) + " (rank " +
                          std::to_string(rank) + ")");
  }
  std::vector<int> members;
  std::shared_ptr<Communicator> parent = roots().find(job_ranks, &members);
  // The choice lives under keys of its own for each group made under this
  // store's prefix (torch reuses a group's name, and so its prefix).
  if ((size > 1 || parent) && decide_split(*core::incarnation(store, "shoal/choice", static_cast<int>(job_ranks[rank])), rank,
                                           opts.own_connections, job_ranks, &parent, &members)) {
    return parent->split(members, std::move(store), std::move(opts));  // blocks until the group's rank 0 has split
  }
  auto comm = create_named(std::move(store), rank, size, std::move(opts), job_ranks);
  roots().add(comm, std::move(job_ranks));
  return comm;
}

}  // namespace shoal
