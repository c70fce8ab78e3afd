// copy_bench.cc — memcpy against shoal::copy (src/common/copy.h) by how far
// the destination sits after the source modulo a 4 KiB page, the property
// that sends glibc's `rep movsb` into its slow path on some AMD CPUs.
//
//   build/bin/shoal-copy-bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstring>

#include "common/copy.h"

namespace {

// Two page-aligned 80 MiB areas; the destination starts `gap` bytes in.
struct Areas {
  char* src;
  char* dst;
  Areas() {
    const size_t n = 80 << 20;
    src = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    dst = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    std::memset(src, 1, n);
  }
};

Areas& areas() {
  static Areas a;
  return a;
}

template <bool kOurs>
void BM_copy(benchmark::State& st) {
  const size_t bytes = static_cast<size_t>(st.range(0));
  const size_t gap = static_cast<size_t>(st.range(1));
  char* d = areas().dst + gap;
  const char* s = areas().src;
  for (auto _ : st) {
    if (kOurs) {
      shoal::copy(d, s, bytes);
    } else {
      std::memcpy(d, s, bytes);
    }
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * bytes));
  if (kOurs) st.SetLabel(shoal::copy_avoids_rep_movsb(d, s, bytes) ? "vector loop" : "memcpy");
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {16 << 10, 256 << 10, 4 << 20}) {
    for (int64_t gap : {0, 8, 16, 32, 64, 2048}) b->Args({bytes, gap});
  }
  b->ArgNames({"bytes", "gap"});
}

// Non-temporal stores (shoal::copy_stream) against memcpy, by size: the
// large collectives' outputs. Each copy goes to a fresh quarter of the area
// in turn, so above the cache the destination is not cached.
template <bool kStream>
void BM_stream(benchmark::State& st) {
  const size_t bytes = static_cast<size_t>(st.range(0));
  size_t turn = 0;
  for (auto _ : st) {
    char* d = areas().dst + (turn++ % 4) * (16 << 20) + 16;
    const char* s = areas().src + (turn % 4) * (16 << 20);
    if (kStream) {
      shoal::copy_stream(d, s, bytes);
    } else {
      shoal::copy(d, s, bytes);
    }
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * bytes));
}

void StreamArgs(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {256 << 10, 1 << 20, 4 << 20, 16 << 20}) b->Args({bytes});
  b->ArgNames({"bytes"});
}

BENCHMARK(BM_stream<false>)->Name("shoal::copy/fresh")->Apply(StreamArgs);
BENCHMARK(BM_stream<true>)->Name("shoal::copy_stream/fresh")->Apply(StreamArgs);

BENCHMARK(BM_copy<false>)->Name("memcpy")->Apply(Args);
BENCHMARK(BM_copy<true>)->Name("shoal::copy")->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
