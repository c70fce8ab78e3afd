// tests/cpp/cpu_util.h — running a test's ranks on one CPU: they inherit
// the affinity of the test process, which this pins for its lifetime.
#pragma once

#include <sched.h>

namespace shoal::test {

// Pins this process to the first CPU of its affinity mask; puts the mask
// back when it goes. ok() is false when either call failed.
class OnOneCpu {
 public:
  OnOneCpu() {
    if (sched_getaffinity(0, sizeof(old_), &old_) != 0) return;
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old_)) ++cpu;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ok_ = sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~OnOneCpu() {
    if (ok_) sched_setaffinity(0, sizeof(old_), &old_);
  }
  OnOneCpu(const OnOneCpu&) = delete;
  OnOneCpu& operator=(const OnOneCpu&) = delete;
  bool ok() const { return ok_; }
  const cpu_set_t& old_mask() const { return old_; }  // the mask it puts back

 private:
  cpu_set_t old_{};
  bool ok_ = false;
};

}  // namespace shoal::test
