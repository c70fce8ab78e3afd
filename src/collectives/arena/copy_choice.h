// collectives/arena/copy_choice.h — whether an allgather on the arena copies
// once (allgather_shared_cma: every rank writes its input into its peers'
// outputs with process_vm_writev) or twice (allgather_shared: through the
// slots), chosen by measurement per size class.
//
// Which is faster depends on where the ranks' cores are and on what the
// caller's buffers hold, both of which change while a job runs: on the
// 2-vCPU EPYC VM with the cores apart, single copy took 0.48-0.90x the slot
// rounds' time from 64 KiB to 32 MiB of output; with them close, 1.29x at
// 512 KiB, where the slots pipeline (docs/algorithms.md, "Single copy").
// So rank 0 times its allgathers and proposes a way per size class
// (slot_stores.h: a power of two of the block per rank). Single copy comes
// first (the faster on the Xeon VM at every size), and as soon as kLearn of
// its calls were timed (call kFirstProbe) the slots are probed until kLearn
// of theirs were; from then on the faster way runs, and a probe of two
// calls goes the other way kProbeEvery calls on, then twice as far on each
// time the choice held (up to kProbeMax: a probe costs what the slower way
// does, and two calls in every 32 cost a 2-rank allgather 3-6% of its
// time), kProbeEvery on again once it changed. Learning both ways in a
// class's first eight calls costs four calls of the slower way where single
// copy is faster; learning the slots only at call 32 cost thirty-two where
// they are (the EPYC VM with the cores close: 2 ranks, 40 calls a size, 10
// paired starts, 1.69x at 64 KiB and 1.18-1.47x at 8-32 MiB of output for
// the early probe, level at 256 KiB-2 MiB). Not timed: a class's first call
// (page faults) and the first call after a change of way (the other way's
// lines are still where it left them).
//
// A way's estimate is the fastest of its last kWindow timed calls (ns per
// byte): a call runs slow by accident (a rank preempted, an interrupt),
// never fast, and on a busy machine most calls may be slow by some amount.
// A running mean there tracks the bursts: the way that runs most gathers
// them, and a probe of the other that happened to miss them looks faster
// than it is. The fastest of a few recent calls compares the two ways as
// they run when nothing gets in the way, and still follows a change of the
// machine (the cores moved) within kWindow calls of the way in use.
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
  static constexpr int kLearn = 3, kWindow = 4;
  // The first call of the first probe: single copy's first call and kLearn timed ones before it.
  static constexpr uint64_t kFirstProbe = kLearn + 1, kProbeEvery = 32, kProbeMax = 512;
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
    double recent[2][kWindow] = {};  // ns per byte of the last timed calls: slots, single copy
    int samples[2] = {0, 0};         // timed calls of each way so far
    uint64_t calls = 0;
    bool single = true;  // the faster so far (single copy until the slots are shown kSwitch faster)
    bool last = true;    // the way of the last call
    // The next probe's first call, and the gap to it (doubled when the first probe ends).
    uint64_t probe_at = kFirstProbe, probe_gap = kProbeEvery / 2;
  };
  static double estimate(const Class& cl, int way);
  Class classes_[kSizeClasses];
  uint32_t word_ = (1u << kSizeClasses) - 1;  // single copy in every class
};

}  // namespace shoal::coll::arena
