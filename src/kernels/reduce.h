// kernels/reduce.h — vectorised element-wise reduction kernels.
//
// The dtype and op are erased at the algorithm boundary and dispatched here
// once per call to a typed, vectorised loop (runtime CPU dispatch). float16 and
// bfloat16 are computed in float32 and rounded once (round to nearest even).
// All functions are pure and thread-safe. Buffers may alias exactly (dst == a
// or dst == b) but must not partially overlap (InvalidArgument); null pointers
// are allowed only with count == 0. Any alignment is accepted.
//
// Element semantics:
//   integers   SUM/PROD wrap around (two's complement); MIN/MAX signed for
//              int8/int32/int64, unsigned for uint8.
//   floats     IEEE in the type itself (float16/bfloat16 in float32, rounded
//              once to nearest even; NaN stays NaN). MIN/MAX propagate NaN: if
//              either input is NaN the result is NaN (like torch.minimum).
//   bool       one byte; any non-zero byte reads as true, results are 0 or 1.
//              SUM and MAX = or, PROD and MIN = and, BAND/BOR/BXOR logical.
//              AVG and PREMUL_SUM are not defined for bool.
// Implementation: kernels/dispatch.h (Highway runtime dispatch per CPU).
#pragma once

#include <cstddef>

#include "shoal/types.h"

namespace shoal::kernels {

// dst[i] = a[i] (op) b[i] for i < count. `op` must be a combining op: AVG is
// reduced as SUM and PREMUL_SUM as SUM (the caller applies the scale/division).
// Throws InvalidArgument for bitwise ops on floating types.
void reduce(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// reduce() without its checks, for a caller that has made them already
// (the collectives: the communicator checks (dt, op) and the buffers of
// every call). On the path of small collectives the checks cost more than
// the reduction.
void reduce_unchecked(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// dst[i] = dst[i] (op) src[i]. Same rules as reduce().
inline void reduce_inplace(DataType dt, ReduceOp op, void* dst, const void* src, size_t count) {
  reduce(dt, op, dst, dst, src, count);
}

// dst[i] = src[i] * factor (computed in double for f64, float otherwise, then
// rounded to dt). Used for PREMUL_SUM. Integer types: trunc(double(src[i]) *
// factor) saturated to the type's range, NaN giving 0. Not defined for bool
// (InvalidArgument).
void scale(DataType dt, void* dst, const void* src, double factor, size_t count);

// dst[i] = src[i] / divisor: the final step of AVG; divisor >= 1 (it is the
// world size) else InvalidArgument. Integer types use C++'s truncating
// division (-7 / 2 == -3). Floating types divide (in float32 for the 16-bit
// types, then round once), which is exact where a multiplication by
// 1/divisor is not (3.0f * (1.0f / 3) != 1.0f). Not defined for bool.
void divide(DataType dt, void* dst, const void* src, int divisor, size_t count);

// True if (dt, op) is a valid pair; fills `why` otherwise. The table behind
// shoal::reduce_supported (shoal/types.h): the one dtype x op rule.
bool supported(DataType dt, ReduceOp op, const char** why);

}  // namespace shoal::kernels
