// collectives/arena/copy_choice.cc — CopyChoice (copy_choice.h).
#include "collectives/arena/copy_choice.h"

namespace shoal::coll::arena {

void CopyChoice::note(size_t block, bool single, double ns) {
  const int c = size_class(block);
  Class& cl = classes_[c];
  const uint64_t k = cl.calls++;
  // Not timed: a class's first call (page faults) and the first call after
  // a change of way (it pays for the other way's lines where they are).
  const bool steady = k > 0 && single == cl.last;
  cl.last = single;
  if (steady) {
    update_estimate(cl.est[single], cl.samples[single]++, ns / static_cast<double>(block), single != cl.single);
    if (cl.samples[0] >= 2 && cl.samples[1] >= 2) {
      const int other = !cl.single;
      if (cl.est[other] < kSwitch * cl.est[!other]) cl.single = other;
    }
  }
  // The way of the class's next calls: the slots until two of their calls
  // were timed, then single copy until two of its were, then the faster,
  // and the other for two calls in every kProbeEvery. By samples, not by
  // call: the ranks follow a proposal one call late while calls come back
  // to back, at once when another operation runs between them, and a
  // change of that lag must not cut a way's calls short.
  const uint64_t next = cl.calls;
  bool way = cl.single;
  if (cl.samples[0] < 2) {
    way = false;
  } else if (cl.samples[1] < 2) {
    way = true;
  } else if (next % kProbeEvery < 2) {
    way = !cl.single;
  }
  word_ = way ? word_ | (1u << c) : word_ & ~(1u << c);
}

}  // namespace shoal::coll::arena
