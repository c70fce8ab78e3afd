// fault_ops.h — the random sequence of operations that every rank of a
// shoal-fault trial runs (fault_job.cc), and the run of one with its check.
// Every rank draws the same sequence from the trial's seed and computes every
// other rank's input from it, so each rank checks each result by itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "shoal/communicator.h"

namespace shoal::fault {

uint64_t mix(uint64_t x);  // splitmix64's finaliser

enum class Kind {
  kAllreduce, kBroadcast, kReduce, kAllgather, kAllgatherv, kReduceScatter, kReduceScatterv,
  kAlltoall, kAlltoallv, kGather, kScatter, kBarrier, kSendRecv,
};
constexpr int kNumKinds = 13;

struct Spec {
  uint64_t id = 0;  // the operation's index in the sequence
  Kind kind = Kind::kBarrier;
  DataType dt = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = 0;
  bool in_place = false;
  std::string algo;
  std::vector<size_t> counts;  // allgatherv, reduce_scatterv: per rank; alltoallv: [src * n + dst]
  int64_t tag = 0;


  std::string describe() const;
};

// Every rank draws the same sequence (nothing drawn depends on the rank).
class Sequence {
 public:
  Sequence(uint64_t seed, int n, size_t max_bytes) : g_(seed), n_(n), max_bytes_(max_bytes) {}
  Spec next();

 private:
  // 0 one time in ten; otherwise log-uniform in [1, max].
  size_t draw_count(size_t max);

  std::mt19937_64 g_;
  int n_;
  size_t max_bytes_;
  uint64_t id_ = 0;
};

// Runs one operation and checks its result; returns "" or what was wrong.
// Shoal errors propagate.
std::string run_op(Communicator& c, const Spec& s, uint64_t seed);

}  // namespace shoal::fault
