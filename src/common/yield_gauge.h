// common/yield_gauge.h — whether a wait on a crowded host should give its
// core away between polls, or sleep at once.
//
// With more ranks than cores, a spinning wait gives its core away
// (sched_yield) between polls so that the rank it waits for can run. On a
// quiet host a yield passes the core to another rank for a few
// microseconds, and spinning this way beats sleeping (4 ranks on 2 cores,
// 8 B allreduce: 8.4 us against 15 for a futex sleep and wake-up). Beside
// other work it does not: on a kernel that schedules by deadlines (EEVDF) a
// yield hands the core to that work for a whole time slice, while a thread
// that sleeps is woken ahead of it (the same allreduce beside bursty load:
// 4.0 ms yielding, 75 us sleeping at once; bench/results/crowded-waits).
//
// So each thread measures its yields. One that took kLongYield or more
// (another task's slice) makes the next waits sleep at once, without a
// spin: `skip` of them, then one spins again to look whether the host is
// still busy; `skip` doubles (up to kMaxSkip) while it is, and is back at
// kFirstSkip after a spun wait whose yields were all short.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace shoal {

class YieldGauge {
 public:
  static constexpr auto kLongYield = std::chrono::milliseconds(1);
  static constexpr int kFirstSkip = 16;
  static constexpr int kMaxSkip = 4096;

  // At the start of a wait that would spin giving its core away: whether to
  // (false: sleep at once).
  bool spin() {
    brief_ = false;
    if (skip_left_ == 0) return true;
    --skip_left_;
    return false;
  }
  // Gives the core away once (sched_yield), timed: whether to go on
  // spinning (false: the host is busy; sleep now).
  bool yield() {
    const auto before = std::chrono::steady_clock::now();
    sched_yield();
    return yielded(std::chrono::steady_clock::now() - before);
  }
  // One of its yields took `took` (what yield() reports).
  bool yielded(std::chrono::steady_clock::duration took) {
    brief_ = took < kLongYield;
    if (brief_) return true;
    skip_left_ = skip_;
    skip_ = std::min(2 * skip_, kMaxSkip);
    return false;
  }
  // The wait's peer came: when it spun and every yield was short, the next
  // long yield skips kFirstSkip waits again.
  void quiet() {
    if (brief_) skip_ = kFirstSkip;
    brief_ = false;
  }

  // Waits still to sleep at once (for tests).
  int skipping() const { return skip_left_; }

  // The calling thread's gauge.
  static YieldGauge& here() {
    static thread_local YieldGauge g;
    return g;
  }

 private:
  int skip_ = kFirstSkip;  // waits to sleep at once after the next long yield
  int skip_left_ = 0;      // waits still to sleep at once
  bool brief_ = false;     // this wait's yields so far were all short (and there was one)
};

}  // namespace shoal
