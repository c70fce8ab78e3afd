// Names, sizes and parsers for the public element types and reduce ops.
#include <string>

#include "shoal/error.h"
#include "shoal/types.h"

namespace shoal {

void bad_dtype(DataType dt) {
  throw InvalidArgument("dtype: unknown value " + std::to_string(static_cast<int>(dt)));
}

std::string_view dtype_name(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kPremulSum: return "premul_sum";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "unknown";
}

bool is_floating(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 || dt == DataType::kFloat32 ||
         dt == DataType::kFloat64;
}

bool parse_dtype(std::string_view s, DataType* out) {
  struct Alias { std::string_view name; DataType dt; };
  static constexpr Alias kAliases[] = {
      {"float16", DataType::kFloat16}, {"fp16", DataType::kFloat16}, {"f16", DataType::kFloat16},
      {"half", DataType::kFloat16},    {"bfloat16", DataType::kBFloat16}, {"bf16", DataType::kBFloat16},
      {"float32", DataType::kFloat32}, {"fp32", DataType::kFloat32}, {"f32", DataType::kFloat32},
      {"float", DataType::kFloat32},   {"float64", DataType::kFloat64}, {"fp64", DataType::kFloat64},
      {"f64", DataType::kFloat64},     {"double", DataType::kFloat64}, {"int8", DataType::kInt8},
      {"uint8", DataType::kUInt8},     {"int32", DataType::kInt32}, {"int", DataType::kInt32},
      {"int64", DataType::kInt64},     {"long", DataType::kInt64}, {"bool", DataType::kBool},
  };
  for (const auto& a : kAliases) {
    if (a.name == s) {
      *out = a.dt;
      return true;
    }
  }
  return false;
}

bool parse_reduce_op(std::string_view s, ReduceOp* out) {
  for (int i = 0; i < kNumReduceOps; ++i) {
    auto op = static_cast<ReduceOp>(i);
    if (reduce_op_name(op) == s) {
      *out = op;
      return true;
    }
  }
  return false;
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kPeerLost: return "peer lost";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kStore: return "store error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "error";
}

}  // namespace shoal
