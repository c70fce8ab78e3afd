// kernels/reference.h — the scalar meaning of every reduce op, one element at
// a time in double: the reference that tests and shoal-perf --check compare
// the vector kernels and the collectives against. Never for hot loops.
#pragma once

#include <algorithm>
#include <cstdint>

#include "shoal/types.h"

namespace shoal::kernels {

// a (op) b. AVG and PREMUL_SUM combine as SUM (the caller divides or scales).
// On bool: SUM and MAX are logical or, PROD and MIN logical and, BXOR xor.
// Bitwise ops act on the values as int64.
inline double reference_combine(DataType dt, ReduceOp op, double a, double b) {
  if (dt == DataType::kBool) {
    const bool x = a != 0, y = b != 0;
    switch (op) {
      case ReduceOp::kProd: case ReduceOp::kMin: case ReduceOp::kBand: return x && y;
      case ReduceOp::kBxor: return x != y;
      default: return x || y;
    }
  }
  auto i = [](double v) { return static_cast<int64_t>(v); };
  switch (op) {
    case ReduceOp::kProd: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kBand: return static_cast<double>(i(a) & i(b));
    case ReduceOp::kBor: return static_cast<double>(i(a) | i(b));
    case ReduceOp::kBxor: return static_cast<double>(i(a) ^ i(b));
    default: return a + b;
  }
}

}  // namespace shoal::kernels
