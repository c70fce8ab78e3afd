// kernel_bench.cc — throughput of the reduce kernels next to memcpy.
//
// reduce/<dtype>/<op>/<size>: dst = a (op) b out of place, with each buffer
// <size> bytes; bytes_per_second counts 3 x size per call (two reads, one
// write). memcpy/<size> counts 2 x size (one read, one write), so the GB/s of
// the two are directly comparable: a memory-bound kernel reaches memcpy's.
// reduce-target/...: the same kernel forced onto each SIMD target this CPU
// supports, to show what the dispatch buys.
//
//   build/bin/shoal-kernel-bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "kernels/reduce.h"
#include "shoal/types.h"

namespace {

using shoal::DataType;
using shoal::ReduceOp;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// A page-aligned buffer of `bytes`, every element set to `value` (touched, so
// page faults stay out of the timing).
Buffer make_buffer(DataType dt, size_t bytes, double value) {
  Buffer b(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
  const size_t n = bytes / shoal::dtype_size(dt);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = b.get() + i * shoal::dtype_size(dt);
    switch (dt) {
      case DataType::kFloat16: {
        const uint16_t h = shoal::kernels::float_to_half(static_cast<float>(value));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t h = shoal::kernels::float_to_bfloat16(static_cast<float>(value));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kFloat32: {
        const float f = static_cast<float>(value);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kInt32: {
        const int32_t v = static_cast<int32_t>(value);
        std::memcpy(p, &v, 4);
        break;
      }
      default: std::memset(p, 0, shoal::dtype_size(dt)); break;
    }
  }
  return b;
}

void bm_reduce(benchmark::State& state, DataType dt, ReduceOp op, size_t bytes,
               const std::string& target) {
  if (!target.empty() && !shoal::kernels::detail::force_target(target)) {
    state.SkipWithError("target not available");
    return;
  }
  const size_t n = bytes / shoal::dtype_size(dt);
  Buffer a = make_buffer(dt, bytes, 1.5);
  Buffer b = make_buffer(dt, bytes, 2.25);
  Buffer d = make_buffer(dt, bytes, 0);
  for (auto _ : state) {
    shoal::kernels::reduce(dt, op, d.get(), a.get(), b.get(), n);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * bytes));
  state.SetLabel(shoal::kernels::detail::reduce_table().target);
  if (!target.empty()) shoal::kernels::detail::force_target("");
}

void bm_memcpy(benchmark::State& state, size_t bytes) {
  Buffer a = make_buffer(DataType::kUInt8, bytes, 1), d = make_buffer(DataType::kUInt8, bytes, 0);
  for (auto _ : state) {
    std::memcpy(d.get(), a.get(), bytes);
    benchmark::DoNotOptimize(d.get());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}

std::string size_name(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return std::to_string(bytes >> 20) + "MiB";
  return std::to_string(bytes >> 10) + "KiB";
}

void register_all() {
  const size_t kSizes[] = {4u << 10, 256u << 10, 4u << 20, 64u << 20};
  struct Kernel {
    DataType dt;
    ReduceOp op;
  };
  const Kernel kKernels[] = {{DataType::kFloat32, ReduceOp::kSum},
                             {DataType::kBFloat16, ReduceOp::kSum},
                             {DataType::kFloat16, ReduceOp::kSum},
                             {DataType::kInt32, ReduceOp::kSum},
                             {DataType::kFloat32, ReduceOp::kMax}};
  for (size_t bytes : kSizes) {
    for (const Kernel& k : kKernels) {
      const std::string name = "reduce/" + std::string(shoal::dtype_name(k.dt)) + "/" +
                               std::string(shoal::reduce_op_name(k.op)) + "/" + size_name(bytes);
      benchmark::RegisterBenchmark(name.c_str(), bm_reduce, k.dt, k.op, bytes, std::string());
    }
    benchmark::RegisterBenchmark(("memcpy/" + size_name(bytes)).c_str(), bm_memcpy, bytes);
  }
  // Per-target comparison at an L2-resident size.
  for (const std::string& target : shoal::kernels::detail::available_targets()) {
    for (const Kernel& k : {kKernels[0], kKernels[2]}) {
      const std::string name = "reduce-target/" + std::string(shoal::dtype_name(k.dt)) + "/" +
                               std::string(shoal::reduce_op_name(k.op)) + "/256KiB/" + target;
      benchmark::RegisterBenchmark(name.c_str(), bm_reduce, k.dt, k.op, size_t{256} << 10, target);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
