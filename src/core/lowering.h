// core/lowering.h — an operation's arguments as its algorithm runs them.
//
// The algorithms know SUM, PROD, MIN, MAX and the bitwise ops; AVG and
// PREMUL_SUM are lowered to SUM: PREMUL_SUM scales the input by the
// factor first (into the output for allreduce, else into a scratch
// buffer), AVG divides the output by the group's size afterwards. The
// v-collectives' count and displacement vectors are bound here too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/op.h"

namespace shoal::core {

class Lowering {
 public:
  // `op`'s arguments for a group of `size` ranks, lowered.
  Lowering(const Op& op, int size);
  const coll::Args& args() const { return args_; }
  // After the algorithm ran: completes AVG on this rank's output.
  void finish(const Op& op, int rank) const;

 private:
  coll::Args args_;
  int size_;
  std::vector<uint8_t> premul_;  // PREMUL_SUM's scaled input (not for allreduce)
};

// The operation's element count as every rank sees it (its fingerprint).
uint64_t fingerprint_count(const Op& op);

// Nothing to move on any rank (every count 0): the operation is skipped.
// The barrier always runs, and so does alltoallv, whose ranks may disagree.
bool moves_nothing(const Op& op);

}  // namespace shoal::core
