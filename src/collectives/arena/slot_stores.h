// collectives/arena/slot_stores.h — how a rank writes its arena slots:
// through its cache, or streamed to memory.
//
// A rank writes its slot, and its peers read it right after. Through the
// cache, the writer first takes each line back from the peers that read it
// two rounds before: cheap where the cores share a last-level cache, many
// times dearer where they do not (other core complexes or sockets; on a VM,
// wherever the host puts the virtual CPUs at the time: bench/probes/core_rtt.c).
// On the 2-vCPU EPYC VM, filling a 1 MiB slot took 30 us with the vCPUs
// close and 280-520 us with them apart; streamed (non-temporal stores, the
// lines go to memory without being taken back first) 43-58 us either way,
// but then the readers fetch the lines from memory rather than the shared
// cache, which costs where the cores are close (a 2 MiB allgather: 67 us
// through the cache, 102-133 streamed). Which is cheaper changes while a
// job runs, so each rank measures it on its rounds of at least kMinBytes:
// a round's time per byte, from its start to its last read, goes to a
// running estimate of the way the round was written, one pair of estimates
// per size class (a power of two: a round's fixed costs weigh more per byte
// in a smaller one). Every rank writes the k-th round of a class through the
// cache when k % kProbeEvery == 0 or k is 2 or 4, and streamed when k %
// kProbeEvery == kProbeEvery / 2 or k is 3 or 5 (every rank counts the same
// rounds, so a probe round is timed with every rank writing alike; rounds 0
// and 1 are through the cache and not timed: the first in each slot pays its
// page faults; no choice before two samples of each way, and the first rests
// on the faster of the two, since a round runs slow by accident, never fast),
// and its other rounds the way its estimates favour: streamed once the cache
// costs kEnter times as much, back below kLeave (hysteresis: one slow round
// does not flip it).
// Smaller rounds always go through the cache: latency, not the lines' way
// back, decides there. SHOAL_SHM_STREAM fixes the choice.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace shoal::coll::arena {

// The size classes of the arena's measured choices (SlotStores here,
// CopyChoice in copy_choice.h), by bytes per rank: [32 KiB, 64 KiB) is 0,
// then each a power of two, the last from 1 GiB (the largest slot) up. A
// round's or call's fixed costs weigh more per byte in a smaller class.
inline constexpr size_t kClassMinBytes = 32 << 10;
inline constexpr int kSizeClasses = 16;
inline int size_class(size_t bytes) {
  int c = 0;
  for (size_t b = kClassMinBytes * 2; b <= bytes && c < kSizeClasses - 1; b *= 2) ++c;
  return c;
}

// A way's running estimate `e` (ns per byte) after its sample number
// `sample` (from 0), `x`: the first sets it; the second keeps the faster of
// the two, since a round runs slow only by accident (an interrupt, a page
// fault), never fast; later ones move it, a probe half way and others an
// eighth, each counting as at most 4x the estimate (a preempted round may
// take a thousand times its due: it takes a run of them to move it far).
inline void update_estimate(double& e, int sample, double x, bool probe) {
  if (sample == 0) {
    e = x;
  } else if (sample == 1) {
    e = x < e ? x : e;
  } else {
    e += (probe ? 0.5 : 0.125) * ((x < 4 * e ? x : 4 * e) - e);
  }
}

class SlotStores {
 public:
  enum class Mode { kAuto, kCached, kStreamed };
  static constexpr size_t kMinBytes = kClassMinBytes;  // per rank and round
  static constexpr uint64_t kProbeEvery = 64;
  static constexpr double kEnter = 2.0, kLeave = 1.3;

  void set_mode(Mode m) { mode_ = m; }
  // Starts a round of `bytes` per rank (every rank of the arena starts the
  // same rounds); says whether this rank writes its slot streamed in it.
  bool begin(size_t bytes);
  // Ends the round begun last, after its last read of a slot: its time per
  // byte goes to the estimate of the way it was written.
  void end();
  // Ends the round begun last without noting its time: a rank that wrote
  // nothing in it (a broadcast's other ranks) counts the round but has no
  // way of writing to time.
  void abandon() { timing_ = false; }
  // A round of `bytes` that took `ns_per_byte`, written streamed or not
  // (end() calls it); a probe round moves its class's estimate half way,
  // another an eighth, and none counts as more than 4x the estimate.
  void note(size_t bytes, bool streamed, double ns_per_byte, bool probe);

  // Whether the rounds of `bytes` that are not probes are written streamed now.
  bool streaming(size_t bytes) const {
    if (bytes < kMinBytes || mode_ == Mode::kCached) return false;
    return mode_ == Mode::kStreamed || classes_[size_class(bytes)].streaming;
  }

 private:
  struct Class {
    double est[2] = {0, 0};  // ns per byte, through the cache and streamed
    int samples[2] = {0, 0};
    bool streaming = false;
    uint64_t rounds = 0;     // rounds of the class begun
  };

  Mode mode_ = Mode::kAuto;
  Class classes_[kSizeClasses];
  // The round begun last: timed when it is large enough.
  bool timing_ = false, streamed_ = false, probe_ = false;
  size_t bytes_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace shoal::coll::arena
