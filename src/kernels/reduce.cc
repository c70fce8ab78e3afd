// kernels/reduce.cc — argument checks and the one dispatch per call of reduce.h.
//
// Validates (dtype, op), pointers and overlap, then calls the typed loop that
// the current CPU target's table (dispatch.h) holds for the pair, or, for the
// sum of a few elements of the common types, a plain loop. No state.
#include "kernels/reduce.h"

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/dispatch.h"
#include "shoal/error.h"

namespace shoal::kernels {
namespace {

bool valid_dtype(DataType dt) { return static_cast<int>(dt) < kNumDataTypes; }
bool valid_op(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// Why (dt, op) is rejected, or "" when it is supported. Built once, then read-only.
using WhyTable = std::array<std::array<std::string, kNumReduceOps>, kNumDataTypes>;

WhyTable build_why() {
  WhyTable why;
  for (int d = 0; d < kNumDataTypes; ++d) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto dt = static_cast<DataType>(d);
      const auto op = static_cast<ReduceOp>(o);
      // Appended piecewise: GCC 12 warns (-Wrestrict) on "literal" + std::string.
      std::string names = "'";
      names.append(reduce_op_name(op)).append("' is not defined for ").append(dtype_name(dt));
      if (is_floating(dt) && is_bitwise(op)) {
        why[d][o] = std::string("op: bitwise op ").append(names).append(" (it needs an integer or bool dtype)");
      } else if (dt == DataType::kBool && op == ReduceOp::kAvg) {
        why[d][o] = "op: avg is not defined for bool";
      } else if (op == ReduceOp::kPremulSum && !is_floating(dt)) {
        why[d][o] = std::string("op: premul_sum needs a floating dtype, got ").append(dtype_name(dt));
      }
    }
  }
  return why;
}

const WhyTable& why_table() {
  static const WhyTable kWhy = build_why();
  return kWhy;
}

[[noreturn]] void throw_bad_dtype(DataType dt) {
  throw InvalidArgument("dtype: unknown value " + std::to_string(static_cast<int>(dt)));
}

void check_not_null(const char* name, const void* p, size_t count) {
  if (p == nullptr) {
    throw InvalidArgument(std::string(name) + ": null pointer with count " + std::to_string(count));
  }
}

// Inputs must be exactly dst or disjoint from it: [p, p + bytes) vs [dst, dst + bytes).
void check_overlap(const char* name, const void* p, const void* dst, size_t bytes) {
  if (p == dst) return;
  const auto x = reinterpret_cast<uintptr_t>(p);
  const auto y = reinterpret_cast<uintptr_t>(dst);
  if (x < y + bytes && y < x + bytes) {
    throw InvalidArgument(std::string(name) +
                          ": partially overlaps dst (buffers must be identical or disjoint)");
  }
}

size_t checked_bytes(DataType dt, size_t count) {
  const size_t size = dtype_size(dt);
  if (count > SIZE_MAX / size) {
    throw InvalidArgument("count: " + std::to_string(count) + " elements overflow size_t");
  }
  return count * size;
}

}  // namespace

bool supported(DataType dt, ReduceOp op, const char** why) {
  // The common answer without the table (a static's guard and a string).
  if (valid_dtype(dt) && valid_op(op) && is_floating(dt) && !is_bitwise(op)) return true;
  const char* reason = nullptr;
  if (!valid_dtype(dt)) {
    reason = "dtype: unknown value";
  } else if (!valid_op(op)) {
    reason = "op: unknown value";
  } else {
    const std::string& w = why_table()[static_cast<int>(dt)][static_cast<int>(op)];
    if (!w.empty()) reason = w.c_str();
  }
  if (reason != nullptr && why != nullptr) *why = reason;
  return reason == nullptr;
}

namespace {

// The sum of a few elements in plain code: for a handful of elements the
// dispatch to a vector loop and its masked tail cost more than the sum. The
// same results as the vector loop (IEEE addition element by element;
// integers wrap, as there).
template <class T, bool = std::is_integral_v<T>>
struct Wrapping { using type = T; };
template <class T>
struct Wrapping<T, true> { using type = std::make_unsigned_t<T>; };

template <class T>
void sum_few(void* dst, const void* a, const void* b, size_t count) {
  using U = typename Wrapping<T>::type;
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<U>(x[i]) + static_cast<U>(y[i]));
}

constexpr size_t kFew = 16;

}  // namespace

void reduce_unchecked(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  if (count <= kFew && op == ReduceOp::kSum) {
    switch (dt) {
      case DataType::kFloat32: return sum_few<float>(dst, a, b, count);
      case DataType::kFloat64: return sum_few<double>(dst, a, b, count);
      case DataType::kInt32: return sum_few<int32_t>(dst, a, b, count);
      case DataType::kInt64: return sum_few<int64_t>(dst, a, b, count);
      default: break;
    }
  }
  detail::reduce_table().fn[static_cast<int>(dt)][static_cast<int>(op)](dst, a, b, count);
}

void reduce(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  const char* why = nullptr;
  if (!supported(dt, op, &why)) {
    if (!valid_dtype(dt)) throw_bad_dtype(dt);
    if (!valid_op(op)) {
      throw InvalidArgument("op: unknown value " + std::to_string(static_cast<int>(op)));
    }
    throw InvalidArgument(why);
  }
  if (count == 0) return;
  const size_t bytes = checked_bytes(dt, count);
  check_not_null("dst", dst, count);
  check_not_null("a", a, count);
  check_not_null("b", b, count);
  check_overlap("a", a, dst, bytes);
  check_overlap("b", b, dst, bytes);
  reduce_unchecked(dt, op, dst, a, b, count);
}

void scale(DataType dt, void* dst, const void* src, double factor, size_t count) {
  if (!valid_dtype(dt)) throw_bad_dtype(dt);
  if (dt == DataType::kBool) throw InvalidArgument("dtype: scale is not defined for bool");
  if (count == 0) return;
  const size_t bytes = checked_bytes(dt, count);
  check_not_null("dst", dst, count);
  check_not_null("src", src, count);
  check_overlap("src", src, dst, bytes);
  detail::scale_table().scale[static_cast<int>(dt)](dst, src, factor, count);
}

void divide(DataType dt, void* dst, const void* src, int divisor, size_t count) {
  if (!valid_dtype(dt)) throw_bad_dtype(dt);
  if (dt == DataType::kBool) throw InvalidArgument("dtype: divide is not defined for bool");
  if (divisor < 1) {
    throw InvalidArgument("divisor: must be >= 1, got " + std::to_string(divisor));
  }
  if (count == 0) return;
  const size_t bytes = checked_bytes(dt, count);
  check_not_null("dst", dst, count);
  check_not_null("src", src, count);
  check_overlap("src", src, dst, bytes);
  detail::scale_table().divide[static_cast<int>(dt)](dst, src, divisor, count);
}

}  // namespace shoal::kernels

namespace shoal {

bool reduce_supported(DataType dt, ReduceOp op, std::string* why) {
  const char* reason = nullptr;
  if (kernels::supported(dt, op, &reason)) return true;
  if (why != nullptr) *why = reason != nullptr ? reason : "op: not supported";
  return false;
}

}  // namespace shoal
