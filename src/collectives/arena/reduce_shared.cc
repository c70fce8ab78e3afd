// reduce_shared.cc — reduce for ranks that share a host, directly on the
// communicator's shared segment (shared_rounds.h). As allreduce_shared,
// except that only the root reads the result: a small piece is reduced by
// the root alone; a larger one slice by slice by every rank in parallel,
// and the root copies the reduced slices out.
#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"

namespace shoal::coll {

void reduce_shared(Ctx& c, const Args& a) { reduce_in_rounds(c, a, Coll::kReduce, a.root); }

}  // namespace shoal::coll
