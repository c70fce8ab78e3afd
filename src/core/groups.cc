// core/groups.cc — Communicator::create_or_split: the communicators this
// process made afresh (the roots a later group may be split from), and the
// group's rank-0-decides choice between splitting and making a fresh one.
#include <algorithm>

#include "common/env.h"
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
  // The first live root that holds every one of `job_ranks`, and their
  // ranks in it (null if none).
  std::shared_ptr<Communicator> find(const std::vector<int64_t>& job_ranks, std::vector<int>* members) {
    MutexLock g(mu_);
    roots_.erase(std::remove_if(roots_.begin(), roots_.end(), [](const Root& r) { return r.comm.expired(); }),
                 roots_.end());
    for (const Root& root : roots_) {
      members->clear();
      for (int64_t jr : job_ranks) {
        auto it = std::find(root.job_ranks.begin(), root.job_ranks.end(), jr);
        if (it == root.job_ranks.end()) break;
        members->push_back(static_cast<int>(it - root.job_ranks.begin()));
      }
      if (members->size() != job_ranks.size()) continue;
      if (auto comm = root.comm.lock()) return comm;
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

// Whether the group splits from `parent`: its rank 0 decides and publishes
// the answer under `key` (or its error, so that the others do not wait for
// an answer that never comes).
bool decide_split(Store& store, int rank, const std::shared_ptr<Communicator>& parent) {
  const std::string kKey = "shoal/connections";
  if (rank == 0) {
    bool split;
    try {
      split = share_connections() && parent && !parent->error();
    } catch (const InvalidArgument& e) {
      store.set_str(kKey, std::string("error ") + e.what());
      throw;
    }
    store.set_str(kKey, split ? "shared" : "own");
    return split;
  }
  (void)share_connections();  // a bad value here is this rank's own error, before any wait
  const std::string answer = store.get_str(kKey);
  if (answer.rfind("error ", 0) == 0) throw InvalidArgument("the group's rank 0: " + answer.substr(6));
  const bool split = answer == "shared";
  if (split && !parent) {
    throw InvalidArgument(
        "the group's rank 0 splits it from a communicator this rank does not have (groups created in "
        "another order on different ranks?)");
  }
  return split;
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
  if ((size > 1 || parent) && decide_split(*store, rank, parent)) {
    return parent->split(members, std::move(store), std::move(opts));  // blocks until the group's rank 0 has split
  }
  auto comm = create(std::move(store), rank, size, std::move(opts));
  roots().add(comm, std::move(job_ranks));
  return comm;
}

}  // namespace shoal
