// test_kernels.cc — the reduction kernels against a scalar reference.
//
// Sweeps every dtype x op x count {0, 1, 2, 7, 15, 16, 17, 1023, 65537}, out of
// place and in place (dst == a, dst == b), aligned and offset by one element,
// on every SIMD target this CPU supports (forced through dispatch.h). The
// reference is computed here one element at a time; integers must match
// exactly, floats bit for bit (float16/bfloat16: computed in float, rounded
// once), with NaN matching any NaN, and for MIN/MAX +0 matching -0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "kernels/reduce.h"
#include "shoal/error.h"
#include "shoal/types.h"

namespace shoal::kernels {
namespace {

constexpr DataType kTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                               DataType::kFloat64, DataType::kInt8,     DataType::kUInt8,
                               DataType::kInt32,   DataType::kInt64,    DataType::kBool};
constexpr ReduceOp kOps[] = {ReduceOp::kSum,  ReduceOp::kProd,      ReduceOp::kMin,
                             ReduceOp::kMax,  ReduceOp::kAvg,       ReduceOp::kPremulSum,
                             ReduceOp::kBand, ReduceOp::kBor,       ReduceOp::kBxor};
constexpr DataType kFloatTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                    DataType::kFloat64};
constexpr size_t kCounts[] = {0, 1, 2, 7, 15, 16, 17, 1023, 65537};
constexpr size_t kMaxCount = 65537;

bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

bool expect_supported(DataType dt, ReduceOp op) {
  if (is_floating(dt) && is_bitwise(op)) return false;
  if (dt == DataType::kBool && op == ReduceOp::kAvg) return false;
  if (op == ReduceOp::kPremulSum && !is_floating(dt)) return false;
  return true;
}

// ------------------------------------------------------------ scalar reference

template <typename T>
T ref_int(ReduceOp op, T x, T y) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    case ReduceOp::kPremulSum: return static_cast<T>(static_cast<U>(U(x) + U(y)));
    case ReduceOp::kProd: return static_cast<T>(static_cast<U>(U(x) * U(y)));
    case ReduceOp::kMin: return std::min(x, y);
    case ReduceOp::kMax: return std::max(x, y);
    case ReduceOp::kBand: return x & y;
    case ReduceOp::kBor: return x | y;
    case ReduceOp::kBxor: return x ^ y;
  }
  return 0;
}

template <typename F>
F ref_float(ReduceOp op, F x, F y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
    case ReduceOp::kPremulSum: return x + y;
    case ReduceOp::kProd: return x * y;
    case ReduceOp::kMin:
      if (std::isnan(x)) return x;
      if (std::isnan(y)) return y;
      return y < x ? y : x;
    case ReduceOp::kMax:
      if (std::isnan(x)) return x;
      if (std::isnan(y)) return y;
      return x < y ? y : x;
    default: break;
  }
  return 0;
}

uint8_t ref_bool(ReduceOp op, uint8_t a, uint8_t b) {
  const bool x = a != 0, y = b != 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor: return x || y;
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kBand: return x && y;
    case ReduceOp::kBxor: return x != y;
    default: break;
  }
  return 0;
}

template <typename T>
void ref_typed(ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_floating_point_v<T>) d[i] = ref_float(op, x[i], y[i]);
    else d[i] = ref_int(op, x[i], y[i]);
  }
}

void ref_reduce(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  switch (dt) {
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const bool h = dt == DataType::kFloat16;
      auto* d = static_cast<uint16_t*>(dst);
      const auto* x = static_cast<const uint16_t*>(a);
      const auto* y = static_cast<const uint16_t*>(b);
      for (size_t i = 0; i < n; ++i) {
        const float fx = h ? half_to_float(x[i]) : bfloat16_to_float(x[i]);
        const float fy = h ? half_to_float(y[i]) : bfloat16_to_float(y[i]);
        const float r = ref_float(op, fx, fy);
        d[i] = h ? float_to_half(r) : float_to_bfloat16(r);
      }
      return;
    }
    case DataType::kFloat32: return ref_typed<float>(op, dst, a, b, n);
    case DataType::kFloat64: return ref_typed<double>(op, dst, a, b, n);
    case DataType::kInt8: return ref_typed<int8_t>(op, dst, a, b, n);
    case DataType::kUInt8: return ref_typed<uint8_t>(op, dst, a, b, n);
    case DataType::kInt32: return ref_typed<int32_t>(op, dst, a, b, n);
    case DataType::kInt64: return ref_typed<int64_t>(op, dst, a, b, n);
    case DataType::kBool: {
      auto* d = static_cast<uint8_t*>(dst);
      const auto* x = static_cast<const uint8_t*>(a);
      const auto* y = static_cast<const uint8_t*>(b);
      for (size_t i = 0; i < n; ++i) d[i] = ref_bool(op, x[i], y[i]);
      return;
    }
  }
}

// ------------------------------------------------------------ comparison

bool is_nan_bits(DataType dt, const uint8_t* p) {
  switch (dt) {
    case DataType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7FFF) > 0x7C00;
    }
    case DataType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return (h & 0x7FFF) > 0x7F80;
    }
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double f;
      std::memcpy(&f, p, 8);
      return std::isnan(f);
    }
    default: return false;
  }
}

bool is_zero_bits(const uint8_t* p, size_t size) {
  // +0 or -0: all bits but the sign (top bit of the last byte) clear.
  for (size_t k = 0; k + 1 < size; ++k) {
    if (p[k] != 0) return false;
  }
  return (p[size - 1] & 0x7F) == 0;
}

std::string hex(const uint8_t* p, size_t size) {
  static const char* kDigits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = size; k-- > 0;) {
    s += kDigits[p[k] >> 4];
    s += kDigits[p[k] & 15];
  }
  return s;
}

// Index of the first element where got != want, or SIZE_MAX.
size_t first_mismatch(DataType dt, ReduceOp op, const uint8_t* got, const uint8_t* want, size_t n) {
  const size_t size = dtype_size(dt);
  if (std::memcmp(got, want, n * size) == 0) return SIZE_MAX;
  const bool minmax = op == ReduceOp::kMin || op == ReduceOp::kMax;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* g = got + i * size;
    const uint8_t* w = want + i * size;
    if (std::memcmp(g, w, size) == 0) continue;
    if (is_nan_bits(dt, g) && is_nan_bits(dt, w)) continue;
    if (is_floating(dt) && minmax && is_zero_bits(g, size) && is_zero_bits(w, size)) continue;
    return i;
  }
  return SIZE_MAX;
}

// ------------------------------------------------------------ inputs

// Random element bytes: raw bit patterns (all NaNs, infinities, subnormals
// included) mixed with moderate values and specials, so that sums and products
// are not dominated by overflow.
std::vector<uint8_t> make_input(DataType dt, size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> moderate(-64.0, 64.0);
  const size_t size = dtype_size(dt);
  std::vector<uint8_t> v(n * size);
  const float kSpecials[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e-40f, 65504.0f};
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    const unsigned kind = static_cast<unsigned>(rng() % 16);
    uint8_t* p = v.data() + i * size;
    switch (dt) {
      case DataType::kFloat16:
      case DataType::kBFloat16:
      case DataType::kFloat32:
      case DataType::kFloat64:
        if (kind < 8) {
          const double x = std::round(moderate(rng) * 8) / 8;  // sometimes exact, often ties
          const double y = kind < 4 ? x : moderate(rng);
          if (dt == DataType::kFloat64) std::memcpy(&bits, &y, 8);
          const float f = static_cast<float>(y);
          if (dt == DataType::kFloat32) bits = float_bits(f);
          if (dt == DataType::kFloat16) bits = float_to_half(f);
          if (dt == DataType::kBFloat16) bits = float_to_bfloat16(f);
        } else if (kind == 8) {
          const float f = kSpecials[rng() % (sizeof(kSpecials) / sizeof(kSpecials[0]))];
          const double d = f;
          if (dt == DataType::kFloat64) std::memcpy(&bits, &d, 8);
          if (dt == DataType::kFloat32) bits = float_bits(f);
          if (dt == DataType::kFloat16) bits = float_to_half(f);
          if (dt == DataType::kBFloat16) bits = float_to_bfloat16(f);
        }
        break;
      case DataType::kBool:
        // Mostly 0/1; some other non-zero bytes, which must read as true.
        bits = kind < 7 ? 0 : (kind < 14 ? 1 : (bits | 1));
        break;
      default:
        if (kind < 4) bits %= 5;  // small values, so MIN/MAX ties and PROD non-zero
        break;
    }
    std::memcpy(p, &bits, size);  // little-endian low bytes
  }
  return v;
}

// A buffer with guard bytes on both sides; data() is 64-byte aligned plus
// `offset` elements.
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kCanary = 0xA5;

  Guarded(size_t bytes, size_t offset_bytes)
      : bytes_(bytes), raw_(bytes + 3 * kGuard + 64, kCanary) {
    const size_t pad = (64 - reinterpret_cast<uintptr_t>(raw_.data()) % 64) % 64;
    start_ = kGuard + pad + offset_bytes;
  }
  uint8_t* data() { return raw_.data() + start_; }
  bool guards_intact() const {
    for (size_t k = 0; k < start_; ++k) {
      if (raw_[k] != kCanary) return false;
    }
    for (size_t k = start_ + bytes_; k < raw_.size(); ++k) {
      if (raw_[k] != kCanary) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> raw_;
  size_t start_ = 0;
};

enum class Placement { kOutOfPlace, kDstIsA, kDstIsB };
const char* placement_name(Placement p) {
  switch (p) {
    case Placement::kOutOfPlace: return "out-of-place";
    case Placement::kDstIsA: return "dst==a";
    case Placement::kDstIsB: return "dst==b";
  }
  return "?";
}

// ------------------------------------------------------------ per-target suite

class KernelTargetTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(detail::force_target(GetParam()));
    ASSERT_STREQ(detail::reduce_table().target, GetParam().c_str());
    ASSERT_STREQ(detail::scale_table().target, GetParam().c_str());
  }
  void TearDown() override { detail::force_target(""); }
};

// Runs one (dt, op, n, placement, offset) case; returns a failure description or "".
std::string run_case(DataType dt, ReduceOp op, size_t n, Placement placement, size_t offset,
                     const std::vector<uint8_t>& in_a, const std::vector<uint8_t>& in_b) {
  const size_t size = dtype_size(dt);
  const size_t bytes = n * size;
  if (bytes > kMaxCount * 8) std::abort();  // also tells GCC the memcpy sizes are sane
  Guarded a(bytes, offset * size), b(bytes, offset * size), d(bytes, offset * size);
  std::memcpy(a.data(), in_a.data(), bytes);
  std::memcpy(b.data(), in_b.data(), bytes);
  std::vector<uint8_t> want(bytes + 1);
  ref_reduce(dt, op, want.data(), in_a.data(), in_b.data(), n);

  uint8_t* dst = d.data();
  const uint8_t* pa = a.data();
  const uint8_t* pb = b.data();
  if (placement == Placement::kDstIsA) {
    std::memcpy(dst, in_a.data(), bytes);
    pa = dst;
  } else if (placement == Placement::kDstIsB) {
    std::memcpy(dst, in_b.data(), bytes);
    pb = dst;
  }
  reduce(dt, op, dst, pa, pb, n);

  const std::string where = std::string(dtype_name(dt)) + " " + std::string(reduce_op_name(op)) +
                            " n=" + std::to_string(n) + " " + placement_name(placement) +
                            " offset=" + std::to_string(offset);
  if (!a.guards_intact() || !b.guards_intact() || !d.guards_intact()) {
    return where + ": wrote outside the buffer";
  }
  if (placement != Placement::kDstIsA && std::memcmp(a.data(), in_a.data(), bytes) != 0) {
    return where + ": modified input a";
  }
  if (placement != Placement::kDstIsB && std::memcmp(b.data(), in_b.data(), bytes) != 0) {
    return where + ": modified input b";
  }
  const size_t i = first_mismatch(dt, op, dst, want.data(), n);
  if (i != SIZE_MAX) {
    return where + ": element " + std::to_string(i) + " a=" + hex(&in_a[i * size], size) +
           " b=" + hex(&in_b[i * size], size) + " got " + hex(dst + i * size, size) + " want " +
           hex(&want[i * size], size);
  }
  return "";
}

TEST_P(KernelTargetTest, ReduceMatrixMatchesReference) {
  for (DataType dt : kTypes) {
    const auto in_a = make_input(dt, kMaxCount, 1 + static_cast<uint32_t>(dt));
    const auto in_b = make_input(dt, kMaxCount, 101 + static_cast<uint32_t>(dt));
    for (ReduceOp op : kOps) {
      if (!expect_supported(dt, op)) continue;
      int failures = 0;
      for (size_t n : kCounts) {
        for (Placement p : {Placement::kOutOfPlace, Placement::kDstIsA, Placement::kDstIsB}) {
          for (size_t offset : {0, 1}) {
            const std::string err = run_case(dt, op, n, p, offset, in_a, in_b);
            if (!err.empty() && failures++ < 3) ADD_FAILURE() << GetParam() << ": " << err;
          }
        }
      }
    }
  }
}

TEST_P(KernelTargetTest, BoolResultsAreZeroOrOne) {
  std::vector<uint8_t> a(300), b(300), d(300);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>(i);
    b[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  for (ReduceOp op : kOps) {
    if (!expect_supported(DataType::kBool, op)) continue;
    reduce(DataType::kBool, op, d.data(), a.data(), b.data(), a.size());
    for (size_t i = 0; i < d.size(); ++i) {
      ASSERT_EQ(d[i], ref_bool(op, a[i], b[i])) << reduce_op_name(op) << " at " << i;
    }
  }
}

TEST_P(KernelTargetTest, HalfConversionsRoundTripEveryValue) {
  // x + (-0) == x exactly for every x (also +0), so a SUM with -0 round-trips
  // each 16-bit pattern through the vector widen/narrow path.
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint16_t> all(65536), neg_zero(65536, 0x8000), out(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    reduce(dt, ReduceOp::kSum, out.data(), all.data(), neg_zero.data(), all.size());
    const uint16_t exp_mask = dt == DataType::kFloat16 ? 0x7C00 : 0x7F80;
    for (size_t i = 0; i < all.size(); ++i) {
      const bool nan = (all[i] & exp_mask) == exp_mask && (all[i] & ~(exp_mask | 0x8000)) != 0;
      if (nan) {
        ASSERT_TRUE((out[i] & exp_mask) == exp_mask && (out[i] & ~(exp_mask | 0x8000)) != 0)
            << dtype_name(dt) << " NaN " << i << " became " << out[i];
      } else {
        ASSERT_EQ(out[i], all[i]) << dtype_name(dt) << " pattern " << i;
      }
    }
  }
}

TEST_P(KernelTargetTest, MinMaxPropagateNaN) {
  for (DataType dt : kFloatTypes) {
    const size_t size = dtype_size(dt);
    const size_t n = 37;
    // a: values 1..n with a NaN every 3rd; b: values n..1 with a NaN every 5th.
    std::vector<uint8_t> a(n * size), b(n * size), d(n * size);
    auto put = [&](std::vector<uint8_t>& v, size_t i, double x) {
      uint64_t bits = 0;
      if (dt == DataType::kFloat64) std::memcpy(&bits, &x, 8);
      if (dt == DataType::kFloat32) bits = float_bits(static_cast<float>(x));
      if (dt == DataType::kFloat16) bits = float_to_half(static_cast<float>(x));
      if (dt == DataType::kBFloat16) bits = float_to_bfloat16(static_cast<float>(x));
      std::memcpy(&v[i * size], &bits, size);
    };
    for (size_t i = 0; i < n; ++i) {
      put(a, i, i % 3 == 0 ? NAN : static_cast<double>(i + 1));
      put(b, i, i % 5 == 0 ? NAN : static_cast<double>(n - i));
    }
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum, ReduceOp::kProd}) {
      reduce(dt, op, d.data(), a.data(), b.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const bool want_nan = i % 3 == 0 || i % 5 == 0;
        EXPECT_EQ(is_nan_bits(dt, &d[i * size]), want_nan)
            << dtype_name(dt) << " " << reduce_op_name(op) << " at " << i;
      }
    }
  }
}

// Reference for scale(): as documented in reduce.h.
template <typename T>
T ref_scale_int(T x, double f) {
  const double y = static_cast<double>(x) * f;
  if (std::isnan(y)) return 0;
  if (y <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (y >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(std::trunc(y));
}

void ref_unary(DataType dt, bool is_scale, double factor, int divisor, void* dst, const void* src,
               size_t n) {
  auto apply_f = [&](float x) {
    return is_scale ? x * static_cast<float>(factor) : x / static_cast<float>(divisor);
  };
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DataType::kFloat16:
        static_cast<uint16_t*>(dst)[i] =
            float_to_half(apply_f(half_to_float(static_cast<const uint16_t*>(src)[i])));
        break;
      case DataType::kBFloat16:
        static_cast<uint16_t*>(dst)[i] =
            float_to_bfloat16(apply_f(bfloat16_to_float(static_cast<const uint16_t*>(src)[i])));
        break;
      case DataType::kFloat32:
        static_cast<float*>(dst)[i] = apply_f(static_cast<const float*>(src)[i]);
        break;
      case DataType::kFloat64: {
        const double x = static_cast<const double*>(src)[i];
        static_cast<double*>(dst)[i] = is_scale ? x * factor : x / divisor;
        break;
      }
#define SHOAL_TEST_INT_CASE(DT, T)                                                      \
  case DT: {                                                                           \
    const T x = static_cast<const T*>(src)[i];                                         \
    static_cast<T*>(dst)[i] = is_scale ? ref_scale_int<T>(x, factor)                   \
                                       : static_cast<T>(x / static_cast<int64_t>(divisor)); \
    break;                                                                             \
  }
      SHOAL_TEST_INT_CASE(DataType::kInt8, int8_t)
      SHOAL_TEST_INT_CASE(DataType::kUInt8, uint8_t)
      SHOAL_TEST_INT_CASE(DataType::kInt32, int32_t)
      SHOAL_TEST_INT_CASE(DataType::kInt64, int64_t)
#undef SHOAL_TEST_INT_CASE
      case DataType::kBool: break;
    }
  }
}

TEST_P(KernelTargetTest, ScaleAndDivideMatchReference) {
  const double kFactors[] = {0.5, -3.25, 1.0 / 3, 1e30, -1e30, NAN, 0.0};
  const int kDivisors[] = {1, 2, 3, 7, 8, 1000, std::numeric_limits<int>::max()};
  for (DataType dt : kTypes) {
    if (dt == DataType::kBool) continue;
    const size_t size = dtype_size(dt);
    const auto input = make_input(dt, kMaxCount, 7 + static_cast<uint32_t>(dt));
    for (size_t n : kCounts) {
      for (size_t offset : {0, 1}) {
        for (int k = 0; k < 7; ++k) {
          for (bool is_scale : {true, false}) {
            for (bool in_place : {false, true}) {
              const size_t bytes = n * size;
              if (bytes > kMaxCount * 8) std::abort();  // also tells GCC the memcpy size is sane
              Guarded src(bytes, offset * size), dst(bytes, offset * size);
              std::memcpy(src.data(), input.data(), bytes);
              std::vector<uint8_t> want(bytes + 1);
              ref_unary(dt, is_scale, kFactors[k], kDivisors[k], want.data(), input.data(), n);
              uint8_t* out = in_place ? src.data() : dst.data();
              if (is_scale) scale(dt, out, src.data(), kFactors[k], n);
              else divide(dt, out, src.data(), kDivisors[k], n);
              ASSERT_TRUE(src.guards_intact() && dst.guards_intact());
              const size_t i = first_mismatch(dt, ReduceOp::kSum, out, want.data(), n);
              ASSERT_EQ(i, SIZE_MAX)
                  << GetParam() << " " << dtype_name(dt) << (is_scale ? " scale " : " divide ")
                  << (is_scale ? kFactors[k] : kDivisors[k]) << " n=" << n << " offset=" << offset
                  << (in_place ? " in place" : "") << " element " << i << " in "
                  << hex(&input[i * size], size) << " got " << hex(out + i * size, size) << " want "
                  << hex(&want[i * size], size);
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelTargetTest, DivideIsExactAndTruncates) {
  const float f[] = {3.0f, 9.0f, -21.0f, 1.0f};
  float fo[4];
  divide(DataType::kFloat32, fo, f, 3, 4);
  EXPECT_EQ(fo[0], 1.0f);
  EXPECT_EQ(fo[1], 3.0f);
  EXPECT_EQ(fo[2], -7.0f);
  EXPECT_EQ(fo[3], 1.0f / 3.0f);
  const int32_t v[] = {-7, 7, -1, std::numeric_limits<int32_t>::min(), 6};
  int32_t vo[5];
  divide(DataType::kInt32, vo, v, 2, 5);
  EXPECT_EQ(vo[0], -3);
  EXPECT_EQ(vo[1], 3);
  EXPECT_EQ(vo[2], 0);
  EXPECT_EQ(vo[3], std::numeric_limits<int32_t>::min() / 2);
  EXPECT_EQ(vo[4], 3);
  constexpr int64_t kLo = std::numeric_limits<int64_t>::min();
  constexpr int64_t kHi = std::numeric_limits<int64_t>::max();
  const int64_t w[] = {kLo, -9, kHi};
  int64_t wo[3];
  divide(DataType::kInt64, wo, w, 4, 3);
  EXPECT_EQ(wo[0], kLo / 4);
  EXPECT_EQ(wo[1], -2);
  EXPECT_EQ(wo[2], kHi / 4);
  const uint16_t h[] = {float_to_half(3.0f), float_to_half(-12.0f)};
  uint16_t ho[2];
  divide(DataType::kFloat16, ho, h, 3, 2);
  EXPECT_EQ(half_to_float(ho[0]), 1.0f);
  EXPECT_EQ(half_to_float(ho[1]), -4.0f);
}

TEST_P(KernelTargetTest, ConcurrentCallsAreIndependent) {
  const size_t n = 10007;
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> a(n), b(n), d(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<float>(i * (t + 1));
        b[i] = static_cast<float>(t);
      }
      bool good = true;
      for (int rep = 0; rep < 50; ++rep) {
        reduce(DataType::kFloat32, ReduceOp::kSum, d.data(), a.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) good &= d[i] == a[i] + b[i];
      }
      ok[t] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

std::string target_param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

INSTANTIATE_TEST_SUITE_P(Targets, KernelTargetTest,
                         ::testing::ValuesIn(detail::available_targets()), target_param_name);

// ------------------------------------------------------------ target independent

TEST(Kernels, SupportedMatchesTheRules) {
  for (DataType dt : kTypes) {
    for (ReduceOp op : kOps) {
      const char* why = nullptr;
      const bool ok = supported(dt, op, &why);
      EXPECT_EQ(ok, expect_supported(dt, op)) << dtype_name(dt) << " " << reduce_op_name(op);
      if (!ok) {
        ASSERT_NE(why, nullptr);
        EXPECT_NE(std::string(why).find(std::string(dtype_name(dt))), std::string::npos) << why;
      }
      EXPECT_TRUE(supported(dt, op, nullptr) == ok);
    }
  }
  const char* why = nullptr;
  EXPECT_FALSE(supported(static_cast<DataType>(42), ReduceOp::kSum, &why));
  EXPECT_NE(std::string(why).find("dtype"), std::string::npos);
  EXPECT_FALSE(supported(DataType::kInt32, static_cast<ReduceOp>(42), &why));
  EXPECT_NE(std::string(why).find("op"), std::string::npos);
}

TEST(Kernels, BitwiseOnFloatThrowsWithAMessage) {
  float a[4] = {}, b[4] = {}, d[4] = {};
  try {
    reduce(DataType::kFloat32, ReduceOp::kBand, d, a, b, 4);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "op: bitwise op 'band' is not defined for float32 (it needs an integer or bool dtype)");
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  for (DataType dt : kFloatTypes) {
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      EXPECT_THROW(reduce(dt, op, d, a, b, 1), InvalidArgument);
      EXPECT_THROW(reduce(dt, op, d, a, b, 0), InvalidArgument);  // even with nothing to do
    }
  }
}

TEST(Kernels, RejectsBadArguments) {
  int32_t a[8] = {}, d[8] = {};
  EXPECT_NO_THROW(reduce(DataType::kInt32, ReduceOp::kSum, nullptr, nullptr, nullptr, 0));
  EXPECT_THROW(reduce(DataType::kInt32, ReduceOp::kSum, d, nullptr, a, 1), InvalidArgument);
  EXPECT_THROW(reduce(DataType::kInt32, ReduceOp::kSum, nullptr, a, a, 1), InvalidArgument);
  // Partial overlap (dst one element past a) is rejected; exact aliasing is fine.
  EXPECT_THROW(reduce(DataType::kInt32, ReduceOp::kSum, a + 1, a, d, 4), InvalidArgument);
  EXPECT_THROW(reduce(DataType::kInt32, ReduceOp::kSum, a, d, a + 1, 4), InvalidArgument);
  EXPECT_NO_THROW(reduce(DataType::kInt32, ReduceOp::kSum, a, a, a, 8));
  EXPECT_NO_THROW(reduce(DataType::kInt32, ReduceOp::kSum, a + 4, a, d, 4));  // adjacent
  EXPECT_THROW(reduce(static_cast<DataType>(9), ReduceOp::kSum, d, a, a, 1), InvalidArgument);
  EXPECT_THROW(reduce(DataType::kInt32, static_cast<ReduceOp>(9), d, a, a, 1), InvalidArgument);
  uint8_t flags[4] = {};
  EXPECT_THROW(reduce(DataType::kBool, ReduceOp::kAvg, flags, flags, flags, 4), InvalidArgument);
  EXPECT_THROW(scale(DataType::kBool, flags, flags, 2.0, 4), InvalidArgument);
  EXPECT_THROW(divide(DataType::kBool, flags, flags, 2, 4), InvalidArgument);
  EXPECT_THROW(divide(DataType::kInt32, d, a, 0, 8), InvalidArgument);
  EXPECT_THROW(divide(DataType::kFloat32, d, a, -2, 8), InvalidArgument);
  EXPECT_THROW(scale(DataType::kInt32, a + 1, a, 2.0, 4), InvalidArgument);
}

TEST(Kernels, ReduceInplaceIsReduceWithDstAsA) {
  int64_t d[3] = {1, -2, std::numeric_limits<int64_t>::max()};
  const int64_t s[3] = {10, 20, 1};
  reduce_inplace(DataType::kInt64, ReduceOp::kSum, d, s, 3);
  EXPECT_EQ(d[0], 11);
  EXPECT_EQ(d[1], 18);
  EXPECT_EQ(d[2], std::numeric_limits<int64_t>::min());  // wraps
}

TEST(Kernels, AvailableTargetsIncludeTheBaseline) {
  const auto targets = detail::available_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_FALSE(detail::force_target("NO_SUCH_TARGET"));
  EXPECT_TRUE(detail::force_target(""));
  // Without forcing, the best available target is used.
  EXPECT_EQ(std::string(detail::reduce_table().target), targets.front());
}

}  // namespace
}  // namespace shoal::kernels
