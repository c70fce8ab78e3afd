// kernels/dispatch.h — the per-CPU-target tables behind reduce.h (internal).
//
// Each of reduce_simd.cc and scale_simd.cc is compiled once per SIMD target
// (Highway's foreach_target) and exports one constant table of typed loops,
// indexed by dtype (and op). The accessors below return the table of the best
// target this CPU supports; the choice is made by Highway on first use and is
// the only process-wide state. Tables are immutable: thread-safe.
// A null entry means "(dtype, op) not supported"; reduce.cc checks before use.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "shoal/types.h"

namespace shoal::kernels::detail {

using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);
using ScaleFn = void (*)(void* dst, const void* src, double factor, size_t count);
using DivideFn = void (*)(void* dst, const void* src, int divisor, size_t count);

struct ReduceTable {
  const char* target;  // Highway target name, e.g. "AVX2"
  ReduceFn fn[kNumDataTypes][kNumReduceOps];
};

struct ScaleTable {
  const char* target;
  ScaleFn scale[kNumDataTypes];
  DivideFn divide[kNumDataTypes];
};

const ReduceTable& reduce_table();
const ScaleTable& scale_table();

// Test and benchmark hooks; they change which target the tables above come
// from for the whole process. Not thread-safe: call with no kernel running.
// Targets compiled in and supported by this CPU, best first ("AVX2", "SSE4",
// "EMU128", ...).
std::vector<std::string> available_targets();
// Forces `name` (one of available_targets()); "" restores the automatic choice.
// Returns false if `name` is not available.
bool force_target(const std::string& name);

}  // namespace shoal::kernels::detail
