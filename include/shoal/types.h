// shoal/types.h — element types and reduction operators of the public API.
//
// Plain value types; no state, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shoal {

// Element types. The numeric values travel in frame headers: never renumber.
enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
};
inline constexpr int kNumDataTypes = 9;

// Reduction operators. AVG divides the sum by the world size (integer division
// for integer types); PREMUL_SUM multiplies each rank's input by a scale before
// summing. BAND/BOR/BXOR accept integer and bool types only. On bool, SUM and
// MAX are logical or, PROD and MIN logical and (as NCCL and PyTorch do).
enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,
  kPremulSum = 5,
  kBand = 6,
  kBor = 7,
  kBxor = 8,
};
inline constexpr int kNumReduceOps = 9;

[[noreturn]] void bad_dtype(DataType dt);  // throws InvalidArgument
inline size_t dtype_size(DataType dt) {
  constexpr size_t kSizes[kNumDataTypes] = {2, 2, 4, 8, 1, 1, 4, 8, 1};
  const auto i = static_cast<size_t>(dt);
  if (i >= static_cast<size_t>(kNumDataTypes)) bad_dtype(dt);
  return kSizes[i];
}
std::string_view dtype_name(DataType dt);
std::string_view reduce_op_name(ReduceOp op);
bool is_floating(DataType dt);
// Whether a reducing collective may apply `op` to elements of `dt`: the one
// rule that the communicator's argument check, the torch adapter, shoal-perf
// and the tests all use. Bitwise ops need an integer or bool dtype,
// premul_sum a floating one, and avg is not defined for bool. When the pair
// is refused and `why` is given, it says why, naming the argument
// ("op: premul_sum needs a floating dtype, got int32").
bool reduce_supported(DataType dt, ReduceOp op, std::string* why = nullptr);
// Parses "float32", "fp32", "f32", "bf16", "int64", ...; returns false if unknown.
bool parse_dtype(std::string_view s, DataType* out);
// Parses "sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor".
bool parse_reduce_op(std::string_view s, ReduceOp* out);

}  // namespace shoal
