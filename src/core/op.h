// core/op.h — one operation as the core queues and runs it (internal).
#pragma once

#include <memory>
#include <vector>

#include "collectives/coll.h"
#include "core/observer.h"
#include "shoal/communicator.h"
#include "transport/transport.h"

namespace shoal {

// Owns copies of every vector argument.
struct Op {
  coll::Coll coll = coll::Coll::kAllreduce;
  coll::Args args;
  ReduceOp user_op = ReduceOp::kSum;  // before lowering (core/lowering.h)
  std::vector<size_t> counts, displs, send_counts, send_displs;
  OpOptions opts;
  const coll::Algorithm* algo = nullptr;
  WorkPtr work;
  uint64_t seq = 0;
  uint64_t ticket = 0;  // its place in the family's order (core/family.h)
  // Point-to-point.
  int peer = 0;
  int64_t tag = 0;
  std::unique_ptr<transport::Request> req;
  transport::Clock::time_point deadline;  // point-to-point: when it times out
  core::OpTrace trace;                    // the observer's (flight recorder, timeline)

  bool is_p2p() const { return coll::is_p2p(coll); }
};

}  // namespace shoal
