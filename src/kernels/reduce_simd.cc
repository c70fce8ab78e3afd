// kernels/reduce_simd.cc — the typed reduce loops, compiled once per SIMD target.
//
// One template per storage class (plain lanes, float16, bfloat16) and one
// functor per op; the table at the bottom names the instantiation for every
// supported (dtype, op) pair. Integer SUM/PROD/bitwise run on the unsigned
// lane type (wrap-around, no UB); MIN/MAX on the signed one. float16 and
// bfloat16 are widened to float32, combined, and rounded once.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/reduce_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep (must precede highway.h)

#include <type_traits>

#include "hwy/highway.h"
#include "kernels/dispatch.h"
#include "kernels/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace shoal::kernels::HWY_NAMESPACE {
namespace {

// ---------------------------------------------------------------- op functors
// Apply(d, a, b) combines two vectors of tag d.

struct OpAdd {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) { return hn::Add(a, b); }
};
struct OpMul {
  template <class D, class V>
  static HWY_INLINE V Apply(D d, V a, V b) { return MulWrap(d, a, b); }
};
struct OpMin {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) {
    if constexpr (hwy::IsFloat<hn::TFromD<D>>()) return PropagateNaN(a, b, hn::Min(a, b));
    else return hn::Min(a, b);
  }
};
struct OpMax {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) {
    if constexpr (hwy::IsFloat<hn::TFromD<D>>()) return PropagateNaN(a, b, hn::Max(a, b));
    else return hn::Max(a, b);
  }
};
struct OpAnd {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) { return hn::And(a, b); }
};
struct OpOr {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) { return hn::Or(a, b); }
};
struct OpXor {
  template <class D, class V>
  static HWY_INLINE V Apply(D, V a, V b) { return hn::Xor(a, b); }
};
// bool (uint8 lanes): any non-zero byte is true; results are 0 or 1.
struct OpLogicalOr {
  template <class D, class V>
  static HWY_INLINE V Apply(D d, V a, V b) { return hn::Min(hn::Or(a, b), hn::Set(d, 1)); }
};
struct OpLogicalAnd {
  template <class D, class V>
  static HWY_INLINE V Apply(D d, V a, V b) {
    const auto one = hn::Set(d, 1);
    return hn::And(hn::Min(a, one), hn::Min(b, one));
  }
};
struct OpLogicalXor {
  template <class D, class V>
  static HWY_INLINE V Apply(D d, V a, V b) {
    const auto one = hn::Set(d, 1);
    return hn::Xor(hn::Min(a, one), hn::Min(b, one));
  }
};

// ---------------------------------------------------------------- loops

// T is both the storage and the lane type.
template <typename T, class Op>
HWY_NOINLINE void ReduceLanes(void* dst, const void* a, const void* b, size_t n) {
  const hn::ScalableTag<T> d;
  BinaryLoop(hn::Lanes(d), static_cast<T*>(dst), static_cast<const T*>(a),
             static_cast<const T*>(b), n, [d](T* o, const T* x, const T* y) {
               hn::StoreU(Op::Apply(d, hn::LoadU(d, x), hn::LoadU(d, y)), d, o);
             });
}

template <class Op>
HWY_NOINLINE void ReduceF16(void* dst, const void* a, const void* b, size_t n) {
  const hn::ScalableTag<float> df;
  BinaryLoop(hn::Lanes(df), static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
             static_cast<const uint16_t*>(b), n,
             [df](uint16_t* o, const uint16_t* x, const uint16_t* y) {
               StoreF16(df, Op::Apply(df, LoadF16(df, x), LoadF16(df, y)), o);
             });
}

template <class Op>
HWY_NOINLINE void ReduceBF16(void* dst, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(dst);
  const auto* in_a = static_cast<const uint16_t*>(a);
  const auto* in_b = static_cast<const uint16_t*>(b);
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    const hn::ScalableTag<float> df;
    BinaryLoop(hn::Lanes(df), out, in_a, in_b, n,
               [df](uint16_t* o, const uint16_t* x, const uint16_t* y) {
                 StoreBF16(df, Op::Apply(df, LoadBF16(df, x), LoadBF16(df, y)), o);
               });
  } else {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Repartition<float, decltype(d16)> df;
    const hn::Repartition<uint32_t, decltype(d16)> du;
    BinaryLoop(hn::Lanes(d16), out, in_a, in_b, n,
               [=](uint16_t* o, const uint16_t* x, const uint16_t* y) {
                 const auto wa = hn::BitCast(du, hn::LoadU(d16, x));
                 const auto wb = hn::BitCast(du, hn::LoadU(d16, y));
                 const auto even = Op::Apply(df, BF16Even(df, wa), BF16Even(df, wb));
                 const auto odd = Op::Apply(df, BF16Odd(df, wa), BF16Odd(df, wb));
                 hn::StoreU(hn::BitCast(d16, PackBF16(df, even, odd)), d16, o);
               });
  }
}

// ---------------------------------------------------------------- table rows
// Columns in ReduceOp order: sum prod min max avg premul_sum band bor bxor.

using Row = detail::ReduceFn[kNumReduceOps];

template <class Op>
constexpr detail::ReduceFn F16Fn = &ReduceF16<Op>;
template <class Op>
constexpr detail::ReduceFn BF16Fn = &ReduceBF16<Op>;
template <typename T, class Op>
constexpr detail::ReduceFn LaneFn = &ReduceLanes<T, Op>;

template <typename T>
constexpr void FloatRow(Row& r) {
  r[0] = LaneFn<T, OpAdd>;
  r[1] = LaneFn<T, OpMul>;
  r[2] = LaneFn<T, OpMin>;
  r[3] = LaneFn<T, OpMax>;
  r[4] = r[5] = r[0];
}

template <typename T>
constexpr void IntRow(Row& r) {
  using U = std::make_unsigned_t<T>;
  r[0] = r[4] = r[5] = LaneFn<U, OpAdd>;
  r[1] = LaneFn<U, OpMul>;
  r[2] = LaneFn<T, OpMin>;
  r[3] = LaneFn<T, OpMax>;
  r[6] = LaneFn<U, OpAnd>;
  r[7] = LaneFn<U, OpOr>;
  r[8] = LaneFn<U, OpXor>;
}

detail::ReduceTable MakeTable() {
  detail::ReduceTable t{};
  t.target = hwy::TargetName(HWY_TARGET);
  auto half = [](Row& r, auto add, auto mul, auto min, auto max) {
    r[0] = r[4] = r[5] = add;
    r[1] = mul;
    r[2] = min;
    r[3] = max;
  };
  half(t.fn[static_cast<int>(DataType::kFloat16)], F16Fn<OpAdd>, F16Fn<OpMul>, F16Fn<OpMin>,
       F16Fn<OpMax>);
  half(t.fn[static_cast<int>(DataType::kBFloat16)], BF16Fn<OpAdd>, BF16Fn<OpMul>, BF16Fn<OpMin>,
       BF16Fn<OpMax>);
  FloatRow<float>(t.fn[static_cast<int>(DataType::kFloat32)]);
  FloatRow<double>(t.fn[static_cast<int>(DataType::kFloat64)]);
  IntRow<int8_t>(t.fn[static_cast<int>(DataType::kInt8)]);
  IntRow<uint8_t>(t.fn[static_cast<int>(DataType::kUInt8)]);
  IntRow<int32_t>(t.fn[static_cast<int>(DataType::kInt32)]);
  IntRow<int64_t>(t.fn[static_cast<int>(DataType::kInt64)]);
  // bool: sum/max = or, prod/min = and; avg and premul_sum are not defined.
  Row& b = t.fn[static_cast<int>(DataType::kBool)];
  b[0] = b[3] = b[7] = LaneFn<uint8_t, OpLogicalOr>;
  b[1] = b[2] = b[6] = LaneFn<uint8_t, OpLogicalAnd>;
  b[8] = LaneFn<uint8_t, OpLogicalXor>;
  return t;
}

}  // namespace

const detail::ReduceTable* GetReduceTable() {
  static const detail::ReduceTable kTable = MakeTable();  // immutable once built
  return &kTable;
}

}  // namespace shoal::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace shoal::kernels {
HWY_EXPORT(GetReduceTable);

namespace detail {
const ReduceTable& reduce_table() { return *HWY_DYNAMIC_DISPATCH(GetReduceTable)(); }
}  // namespace detail
}  // namespace shoal::kernels
#endif  // HWY_ONCE
