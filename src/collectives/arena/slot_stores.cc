// collectives/arena/slot_stores.cc — SlotStores (slot_stores.h).
#include "collectives/arena/slot_stores.h"


namespace shoal::coll::arena {

bool SlotStores::begin(size_t bytes) {
  timing_ = false;
  if (bytes < kMinBytes || mode_ == Mode::kCached) return false;
  if (mode_ == Mode::kStreamed) return true;
  Class& cl = classes_[size_class(bytes)];
  const uint64_t k = cl.rounds++, phase = k % kProbeEvery;
  if (k < 2) return false;  // the first round in each slot pays page faults and cold lines: not timed
  // Rounds 2-5 probe through the cache, streamed, cached, streamed: two
  // samples of each before the first choice.
  const bool early = k < 6;
  probe_ = early || phase == 0 || phase == kProbeEvery / 2;
  if (!probe_) {
    streamed_ = cl.streaming;
  } else {
    streamed_ = early ? k % 2 == 1 : phase != 0;
  }
  timing_ = true;
  bytes_ = bytes;
  t0_ = std::chrono::steady_clock::now();
  return streamed_;
}

void SlotStores::end() {
  if (!timing_) return;
  timing_ = false;
  const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0_;
  note(bytes_, streamed_, dt.count() / static_cast<double>(bytes_), probe_);
}

void SlotStores::note(size_t bytes, bool streamed, double ns_per_byte, bool probe) {
  Class& cl = classes_[size_class(bytes)];
  update_estimate(cl.est[streamed], cl.samples[streamed]++, ns_per_byte, probe);
  if (cl.samples[0] < 2 || cl.samples[1] < 2) return;  // not enough to compare yet
  if (!cl.streaming && cl.est[0] > kEnter * cl.est[1]) cl.streaming = true;
  if (cl.streaming && cl.est[0] < kLeave * cl.est[1]) cl.streaming = false;
}

}  // namespace shoal::coll::arena
