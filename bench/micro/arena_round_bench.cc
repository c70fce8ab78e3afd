// arena_round_bench.cc — what one round of the shared arena costs between two
// processes, against the floor of the machine: a cache line written by one
// core and read by the other. The physical reference for the latency of a
// small collective (an 8-byte allreduce through `shared` is one round plus
// shoal's bookkeeping); bench/results/arena-round has results.
//
//   build/bin/shoal-arena-bench [rounds]      (default 200000)
//
// Prints, per rank, the median and the 10th/90th percentiles of one
// iteration in microseconds: `line` (each process stores a counter in its
// own cache line and waits for the other's) and `arena` (HostArena::begin,
// an 8-byte copy into the slot, arrive, wait for the peer, sum both slots).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/arena/host_arena.h"

namespace {

using Clock = std::chrono::steady_clock;

struct alignas(64) Line {
  std::atomic<uint64_t> count{0};
};

void report(const char* what, int rank, std::vector<double>& t) {
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  std::printf("%-5s rank %d: median %.3f us, p10 %.3f, p90 %.3f\n", what, rank, t[n / 2], t[n / 10],
              t[n * 9 / 10]);
}

template <class Step>
std::vector<double> timed(int rounds, Step step) {
  std::vector<double> t(static_cast<size_t>(rounds));
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    step(i);
    t[static_cast<size_t>(i)] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  using shoal::coll::arena::HostArena;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200000;
  if (rounds < 10) {
    std::fprintf(stderr, "usage: shoal-arena-bench [rounds >= 10]\n");
    return 2;
  }
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 1;
  Line* lines = new (page) Line[2];
  std::string why;
  std::unique_ptr<HostArena> arena = HostArena::create(0, 2, 1, 4096, &why);
  if (!arena) {
    std::fprintf(stderr, "shoal-arena-bench: %s\n", why.c_str());
    return 1;
  }
  const std::string where = arena->where();
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return 1;
  const int me = child == 0 ? 1 : 0, peer = 1 - me;
  if (me == 1) {
    arena = HostArena::attach(1, 2, 1, where, &why);
    if (!arena) {
      std::fprintf(stderr, "shoal-arena-bench: %s\n", why.c_str());
      return 1;
    }
  }
  auto line = timed(rounds, [&](int i) {
    lines[me].count.store(static_cast<uint64_t>(i) + 1, std::memory_order_release);
    while (lines[peer].count.load(std::memory_order_acquire) <= static_cast<uint64_t>(i)) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  });
  shoal::transport::Fingerprint fp;
  fp.count = 2;
  const float in[2] = {1.0f + static_cast<float>(me), 2.0f};
  float out[2] = {0, 0};
  const shoal::transport::LazyDeadline deadline(std::chrono::minutes(5));
  auto round = timed(rounds, [&](int i) {
    arena->begin(static_cast<uint64_t>(i) + 1, fp);
    std::memcpy(arena->slot(me), in, sizeof(in));
    arena->arrive(1);
    arena->wait_all(1, deadline);
    const auto* a = reinterpret_cast<const float*>(arena->slot(0));
    const auto* b = reinterpret_cast<const float*>(arena->slot(1));
    out[0] = a[0] + b[0];
    out[1] = a[1] + b[1];
  });
  if (out[0] != 3.0f || out[1] != 4.0f) {
    std::fprintf(stderr, "shoal-arena-bench: rank %d summed %g %g, expected 3 4\n", me, out[0], out[1]);
    return 1;
  }
  int status = 0;
  if (me == 0) waitpid(child, &status, 0);  // rank 1 prints first
  report("line", me, line);
  report("arena", me, round);
  std::fflush(stdout);
  return me == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) ? 1 : 0;
}
