// collectives/arena/copy_choice.cc — CopyChoice (copy_choice.h).
#include "collectives/arena/copy_choice.h"

#include <algorithm>

namespace shoal::coll::arena {

double CopyChoice::estimate(const Class& cl, int way) {
  const int n = std::min(cl.samples[way], kWindow);
  return *std::min_element(cl.recent[way], cl.recent[way] + std::max(n, 1));
}

void CopyChoice::note(size_t block, bool single, double ns) {
  const int c = size_class(block);
  Class& cl = classes_[c];
  const uint64_t k = cl.calls++;
  // Not timed: a class's first call (page faults) and the first call after
  // a change of way (it pays for the other way's lines where they are).
  const bool steady = k > 0 && single == cl.last;
  cl.last = single;
  if (steady) {
    cl.recent[single][cl.samples[single]++ % kWindow] = ns / static_cast<double>(block);
    if (cl.samples[0] >= kLearn && cl.samples[1] >= kLearn) {
      const int other = !cl.single;
      if (estimate(cl, other) < kSwitch * estimate(cl, !other)) {
        cl.single = other;  // probe the way it left kProbeEvery calls on (ending a probe under way)
        cl.probe_gap = kProbeEvery;
        cl.probe_at = cl.calls + kProbeEvery;
      }
    }
  }
  // The way of the class's next calls: the faster so far, the probes aside. A
  // probe lasts two calls, the first until the slots have kLearn timed
  // calls: by samples, not by call, since the ranks follow a proposal one
  // call late while calls come back to back and at once when another
  // operation runs between them, and a change of that lag must not cut a
  // way's calls short.
  const uint64_t next = cl.calls;
  bool way = cl.single;
  if (cl.samples[1] >= kLearn && next >= cl.probe_at) {
    const bool over = next >= cl.probe_at + 2 && cl.samples[!cl.single] >= kLearn;
    if (over) {  // the choice held: the next probe twice as far on
      cl.probe_gap = cl.probe_gap * 2 < kProbeMax ? cl.probe_gap * 2 : kProbeMax;
      cl.probe_at += cl.probe_gap;
      if (cl.probe_at < next) cl.probe_at = next;
    }
    if (next >= cl.probe_at) way = !cl.single;
  }
  word_ = way ? word_ | (1u << c) : word_ & ~(1u << c);
}

}  // namespace shoal::coll::arena
