// collectives/arena/copy_choice.h — whether an allgather on the arena copies
// once (allgather_shared_cma: every rank reads its peers' inputs with
// process_vm_readv) or twice (allgather_shared: through the slots), chosen
// by measurement per size class.
//
// Which is faster depends on where the ranks' cores are and on what the
// caller's buffers hold, both of which change while a job runs: on the
// 2-vCPU EPYC VM with the cores apart, single copy took 0.48-0.90x the slot
// rounds' time from 64 KiB to 32 MiB of output; with them close, 1.29x at
// 512 KiB, where the slots pipeline (docs/algorithms.md, "Single copy").
// So rank 0 times its allgathers, one estimate of ns per byte per way and
// size class (slot_stores.h: a power of two of the block per rank), and
// proposes a way per class: through the slots until two calls were timed
// (calls 0-2 of a class), then single copy until two were (3-5), then the
// faster, and two calls in every kProbeEvery the other way. Not timed: a
// class's first call (page faults) and the first call after a change of
// way (the other way's lines are still where it left them).
//
// Every rank must run the same algorithm: rank 0 writes its proposals (one
// bit per class) into its control line when it begins a round, every other
// rank takes them from there when it has waited for rank 0 in that round
// (every round waits for every peer), and an allgather follows the word of
// the round before it (HostArena::agreed_copies): one call late when
// allgathers come back to back, none when another operation runs between.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/arena/slot_stores.h"

namespace shoal::coll::arena {

class CopyChoice {
 public:
  static constexpr uint64_t kProbeEvery = 32;
  // The other way must be this much faster to be taken instead.
  static constexpr double kSwitch = 0.9;

  // The way of an allgather of `block` bytes per rank in a word of proposals.
  static bool single(uint32_t word, size_t block) { return (word >> size_class(block)) & 1u; }

  // Rank 0: a call of `block` bytes per rank, run one way, took `ns`.
  void note(size_t block, bool single, double ns);
  // Rank 0's proposals for the calls to come, one bit per class.
  uint32_t proposals() const { return word_; }

 private:
  struct Class {
    double est[2] = {0, 0};  // ns per byte: slots, single copy
    int samples[2] = {0, 0};
    uint64_t calls = 0;
    bool single = false;  // the faster so far
    bool last = false;    // the way of the last call
  };
  Class classes_[kSizeClasses];
  uint32_t word_ = 0;
};

}  // namespace shoal::coll::arena
