// match_bench.cc — what checking a received message against its receive
// costs (transport/matching.h): the fingerprint comparison and the length
// check that every collective message goes through, on the path where they
// agree. Compare with the 8-byte allreduce time of shoal-perf
// (bench/results/fingerprint/results.md).
#include <benchmark/benchmark.h>

#include "transport/matching.h"

namespace {

using shoal::transport::Arrival;
using shoal::transport::Request;

// check_fp on: the comparison runs (the messages agree); off: it is skipped,
// so the difference between the two is the fingerprint's own cost.
void check_matched(benchmark::State& st) {
  Request r;
  r.peer = 1;
  r.len = 8;
  r.fp.coll = 1;
  r.fp.dtype = 7;
  r.fp.count = 2;
  r.check_fp = st.range(0) != 0;
  Arrival m{1, r.tag, r.fp, 8};
  auto& describe = shoal::transport::Liveness::none();
  for (auto _ : st) {
    benchmark::DoNotOptimize(&r);
    benchmark::DoNotOptimize(&m);
    auto e = shoal::transport::check_matched(r, m, describe, [](int p) { return std::to_string(p); });
    benchmark::DoNotOptimize(e);
  }
}
BENCHMARK(check_matched)->ArgName("check_fp")->Arg(1)->Arg(0);

}  // namespace

BENCHMARK_MAIN();
