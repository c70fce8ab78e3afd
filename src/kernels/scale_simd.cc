// kernels/scale_simd.cc — scale() and divide() loops, compiled once per SIMD target.
//
// Floating types use Highway vectors (float16/bfloat16 through float32, as in
// reduce). Integer types are plain loops: they are compiled inside the same
// per-target region, so the compiler vectorises them with that target's ISA
// (int64 conversions and divisions stay scalar on x86: there is no such
// instruction before AVX-512). These run once per collective, not per step.
// Semantics (documented in reduce.h):
//   scale,  float types: v * factor, in float (double for float64), rounded once.
//   scale,  integers:    trunc(double(v) * factor), saturated to the type, NaN -> 0.
//   divide, float types: v / divisor, a true (correctly rounded) division.
//   divide, integers:    v / divisor truncating toward zero, divisor >= 1; for
//                        8/32-bit values computed as trunc(double(v) / divisor),
//                        which is exact at these widths.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/scale_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep (must precede highway.h)

#include <cstdint>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/dispatch.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace shoal::kernels::HWY_NAMESPACE {
namespace {

struct MulBy {
  template <class D, typename Arg>
  static HWY_INLINE hn::Vec<D> Apply(D d, hn::Vec<D> v, Arg k) {
    return hn::Mul(v, hn::Set(d, static_cast<hn::TFromD<D>>(k)));
  }
};
struct DivBy {
  template <class D, typename Arg>
  static HWY_INLINE hn::Vec<D> Apply(D d, hn::Vec<D> v, Arg k) {
    return hn::Div(v, hn::Set(d, static_cast<hn::TFromD<D>>(k)));
  }
};

template <typename T, class Op, typename Arg>
HWY_NOINLINE void UnaryLanes(void* dst, const void* src, Arg arg, size_t n) {
  const hn::ScalableTag<T> d;
  UnaryLoop(hn::Lanes(d), static_cast<T*>(dst), static_cast<const T*>(src), n,
            [d, arg](T* o, const T* x) { hn::StoreU(Op::Apply(d, hn::LoadU(d, x), arg), d, o); });
}

template <class Op, typename Arg>
HWY_NOINLINE void UnaryF16(void* dst, const void* src, Arg arg, size_t n) {
  const hn::ScalableTag<float> df;
  UnaryLoop(hn::Lanes(df), static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n,
            [df, arg](uint16_t* o, const uint16_t* x) {
              StoreF16(df, Op::Apply(df, LoadF16(df, x), arg), o);
            });
}

template <class Op, typename Arg>
HWY_NOINLINE void UnaryBF16(void* dst, const void* src, Arg arg, size_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  const auto* in = static_cast<const uint16_t*>(src);
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    const hn::ScalableTag<float> df;
    UnaryLoop(hn::Lanes(df), out, in, n, [df, arg](uint16_t* o, const uint16_t* x) {
      StoreBF16(df, Op::Apply(df, LoadBF16(df, x), arg), o);
    });
  } else {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Repartition<float, decltype(d16)> df;
    const hn::Repartition<uint32_t, decltype(d16)> du;
    UnaryLoop(hn::Lanes(d16), out, in, n, [=](uint16_t* o, const uint16_t* x) {
      const auto w = hn::BitCast(du, hn::LoadU(d16, x));
      const auto even = Op::Apply(df, BF16Even(df, w), arg);
      const auto odd = Op::Apply(df, BF16Odd(df, w), arg);
      hn::StoreU(hn::BitCast(d16, PackBF16(df, even, odd)), d16, o);
    });
  }
}

template <typename T>
HWY_NOINLINE void ScaleInt(void* dst, const void* src, double factor, size_t n) {
  constexpr T kMin = std::numeric_limits<T>::min();
  constexpr T kMax = std::numeric_limits<T>::max();
  // Exact, except int64's max, which rounds up to 2^63 (the first overflow).
  constexpr double kLo = static_cast<double>(kMin);
  constexpr double kHi = static_cast<double>(kMax);
  using Wide = std::conditional_t<sizeof(T) == 8, int64_t, int32_t>;
  T* out = static_cast<T*>(dst);
  const T* in = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) {
    const double y = static_cast<double>(in[i]) * factor;
    T r = y >= kHi ? kMax : kMin;
    if (y > kLo && y < kHi) r = static_cast<T>(static_cast<Wide>(y));  // truncates toward zero
    out[i] = y == y ? r : T{0};
  }
}

template <typename T>
HWY_NOINLINE void DivideInt(void* dst, const void* src, int divisor, size_t n) {
  T* out = static_cast<T*>(dst);
  const T* in = static_cast<const T*>(src);
  if constexpr (sizeof(T) <= 4) {
    // |v| < 2^31: the rounding error of the double quotient is below the
    // distance to the next integer, so truncating it gives the exact result.
    const double d = divisor;
    for (size_t i = 0; i < n; ++i) {
      out[i] = static_cast<T>(static_cast<int32_t>(static_cast<double>(in[i]) / d));
    }
  } else {
    const T d = divisor;
    for (size_t i = 0; i < n; ++i) out[i] = in[i] / d;  // d >= 1: no overflow
  }
}

detail::ScaleTable MakeTable() {
  detail::ScaleTable t{};
  t.target = hwy::TargetName(HWY_TARGET);
  auto set = [&t](DataType dt, detail::ScaleFn s, detail::DivideFn d) {
    t.scale[static_cast<int>(dt)] = s;
    t.divide[static_cast<int>(dt)] = d;
  };
  set(DataType::kFloat16, &UnaryF16<MulBy, double>, &UnaryF16<DivBy, int>);
  set(DataType::kBFloat16, &UnaryBF16<MulBy, double>, &UnaryBF16<DivBy, int>);
  set(DataType::kFloat32, &UnaryLanes<float, MulBy, double>, &UnaryLanes<float, DivBy, int>);
  set(DataType::kFloat64, &UnaryLanes<double, MulBy, double>, &UnaryLanes<double, DivBy, int>);
  set(DataType::kInt8, &ScaleInt<int8_t>, &DivideInt<int8_t>);
  set(DataType::kUInt8, &ScaleInt<uint8_t>, &DivideInt<uint8_t>);
  set(DataType::kInt32, &ScaleInt<int32_t>, &DivideInt<int32_t>);
  set(DataType::kInt64, &ScaleInt<int64_t>, &DivideInt<int64_t>);
  // bool: neither is defined (null).
  return t;
}

}  // namespace

const detail::ScaleTable* GetScaleTable() {
  static const detail::ScaleTable kTable = MakeTable();  // immutable once built
  return &kTable;
}

}  // namespace shoal::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shoal::kernels {
HWY_EXPORT(GetScaleTable);

namespace detail {
const ScaleTable& scale_table() { return *HWY_DYNAMIC_DISPATCH(GetScaleTable)(); }
}  // namespace detail
}  // namespace shoal::kernels
#endif  // HWY_ONCE
