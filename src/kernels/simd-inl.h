// kernels/simd-inl.h — per-target building blocks of the kernels (Highway).
//
// Included once per SIMD target by reduce_simd.cc and scale_simd.cc (through
// hwy/foreach_target.h), hence the toggling include guard. Provides:
//   - loop drivers that run a vector body over whole vectors and the tail
//     through one zero-padded stack vector (no scalar copy of the lane math,
//     no read or write past the caller's buffers);
//   - float16 / bfloat16 codecs to and from float32 vectors, bit-identical to
//     kernels/half.h (round to nearest even, NaN stays NaN): F16C instructions
//     on AVX2 and better, integer arithmetic elsewhere;
//   - multiplication with wrap-around for 8- and 64-bit lanes, which Highway
//     does not provide.
// Everything is a pure function of its arguments.

#if defined(SHOAL_KERNELS_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SHOAL_KERNELS_SIMD_INL_H_
#undef SHOAL_KERNELS_SIMD_INL_H_
#else
#define SHOAL_KERNELS_SIMD_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace shoal::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------- loop drivers

// Calls body(dst + i, a + i, b + i) for i = 0, N, 2N, ... < n, where body
// handles exactly N elements. The last partial vector goes through zeroed
// stack copies. Exact aliasing (dst == a or dst == b) is fine: each body call
// loads all of its inputs before it stores.
template <typename TOut, typename TIn, class Body>
HWY_INLINE void BinaryLoop(size_t N, TOut* dst, const TIn* a, const TIn* b, size_t n,
                           const Body& body) {
  size_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    body(dst + i, a + i, b + i);
    body(dst + i + N, a + i + N, b + i + N);
  }
  for (; i + N <= n; i += N) body(dst + i, a + i, b + i);
  if (i == n) return;
  const size_t rest = n - i;
  HWY_ALIGN TIn ta[HWY_MAX_BYTES / sizeof(TIn)] = {};
  HWY_ALIGN TIn tb[HWY_MAX_BYTES / sizeof(TIn)] = {};
  HWY_ALIGN TOut td[HWY_MAX_BYTES / sizeof(TOut)];
  std::memcpy(ta, a + i, rest * sizeof(TIn));
  std::memcpy(tb, b + i, rest * sizeof(TIn));
  body(td, ta, tb);
  std::memcpy(dst + i, td, rest * sizeof(TOut));
}

// body(dst + i, src + i) on N elements at a time; same tail handling.
template <typename TOut, typename TIn, class Body>
HWY_INLINE void UnaryLoop(size_t N, TOut* dst, const TIn* src, size_t n, const Body& body) {
  size_t i = 0;
  for (; i + N <= n; i += N) body(dst + i, src + i);
  if (i == n) return;
  const size_t rest = n - i;
  HWY_ALIGN TIn ts[HWY_MAX_BYTES / sizeof(TIn)] = {};
  HWY_ALIGN TOut td[HWY_MAX_BYTES / sizeof(TOut)];
  std::memcpy(ts, src + i, rest * sizeof(TIn));
  body(td, ts);
  std::memcpy(dst + i, td, rest * sizeof(TOut));
}

// ---------------------------------------------------------------- float16

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
inline constexpr bool kHardwareF16 = true;  // vcvtph2ps / vcvtps2ph
#else
inline constexpr bool kHardwareF16 = false;
#endif

// float16 bits (in u32 lanes) -> float32; exact. See half_to_float.
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> F16BitsToF32(DF df, VU h) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto em = hn::And(h, hn::Set(du, 0x7FFFu));
  auto bits = hn::Add(hn::ShiftLeft<13>(em), hn::Set(du, 112u << 23));
  const auto infnan = hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7BFF));
  bits = hn::Add(bits, hn::IfThenElseZero(hn::RebindMask(du, infnan), hn::Set(du, 112u << 23)));
  // Subnormal (and zero): em * 2^-24 is a normal float32, computed exactly.
  const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, em)),
                                           hn::Set(df, 0x1p-24f)));
  const auto tiny = hn::Lt(hn::BitCast(di, em), hn::Set(di, 0x0400));
  bits = hn::IfThenElse(hn::RebindMask(du, tiny), sub, bits);
  return hn::BitCast(df, hn::Or(sign, bits));
}

// float32 -> float16 bits in u32 lanes, round to nearest even. See float_to_half.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto x = hn::BitCast(du, v);
  const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
  const auto a = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
  const auto ai = hn::BitCast(di, a);  // non-negative: signed compares are safe
  // Normal range: rebias the exponent and round away the 13 low bits.
  const auto odd = hn::And(hn::ShiftRight<13>(a), hn::Set(du, 1u));
  auto r = hn::ShiftRight<13>(
      hn::Add(hn::Sub(a, hn::Set(du, 0x38000000u - 0x0FFFu)), odd));
  // Subnormal range: |v| + 0.5 has an ulp of 2^-24, the float16 subnormal
  // step, so the float addition performs the round-to-nearest-even for us.
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::Set(df, 0.5f))),
                           hn::Set(du, 0x3F000000u));
  r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(ai, hn::Set(di, 0x38800000))), sub, r);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x477FEFFF))),
                     hn::Set(du, 0x7C00u), r);
  const auto nan =
      hn::Or(hn::Set(du, 0x7E00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3FFu)));
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(ai, hn::Set(di, 0x7F800000))), nan, r);
  return hn::Or(sign, r);
}

// Loads Lanes(df) float16 values as float32.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF16(DF df, const uint16_t* p) {
  if constexpr (kHardwareF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToUnsigned<DF> du;
    return F16BitsToF32(df, hn::PromoteTo(du, hn::LoadU(d16, p)));
  }
}

// Stores Lanes(df) float32 values as float16.
template <class DF>
HWY_INLINE void StoreF16(DF df, hn::Vec<DF> v, uint16_t* p) {
  if constexpr (kHardwareF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::RebindToSigned<DF> di;
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, F32ToF16Bits(df, v))), d16, p);
  }
}

// ---------------------------------------------------------------- bfloat16
//
// A vector of 2N bfloat16 is handled as two float32 vectors: the element in
// the low half of each 32-bit lane ("even") shifted up, and the one in the
// high half ("odd") masked. Elementwise ops do not care about the order, and
// the results go back to the same halves, so no lane shuffles are needed.

// float32 -> u32 lanes whose upper 16 bits are the rounded bfloat16.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundToBF16High(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto x = hn::BitCast(du, v);
  const auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
  const auto rounded = hn::Add(x, hn::Add(odd, hn::Set(du, 0x7FFFu)));
  const auto quiet_nan = hn::Or(x, hn::Set(du, 0x00400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
}

// Lanes(df) bfloat16 <-> float32 by widening, for targets whose vectors hold a
// single lane (HWY_SCALAR), where the even/odd split does not exist.
template <class DF>
HWY_INLINE hn::Vec<DF> LoadBF16(DF df, const uint16_t* p) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

template <class DF>
HWY_INLINE void StoreBF16(DF df, hn::Vec<DF> v, uint16_t* p) {
  const hn::Rebind<uint16_t, DF> d16;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::ShiftRight<16>(RoundToBF16High(df, v));
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, p);
}

template <class DF, class VU>
HWY_INLINE hn::Vec<DF> BF16Even(DF df, VU w) {
  return hn::BitCast(df, hn::ShiftLeft<16>(w));
}

template <class DF, class VU>
HWY_INLINE hn::Vec<DF> BF16Odd(DF df, VU w) {
  const hn::RebindToUnsigned<DF> du;
  return hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> PackBF16(DF df, hn::Vec<DF> even, hn::Vec<DF> odd) {
  const hn::RebindToUnsigned<DF> du;
  return hn::Or(hn::ShiftRight<16>(RoundToBF16High(df, even)),
                hn::And(RoundToBF16High(df, odd), hn::Set(du, 0xFFFF0000u)));
}

// ---------------------------------------------------------------- arithmetic

// Lane-wise a * b modulo 2^bits, for unsigned lanes of any width (and floats).
template <class D, class V>
HWY_INLINE V MulWrap(D d, V a, V b) {
  using T = hn::TFromD<D>;
  if constexpr (HWY_TARGET == HWY_SCALAR) {
    return hn::Mul(a, b);  // one lane; Highway multiplies in 64 bits and wraps
  } else if constexpr (sizeof(T) == 1 && !hwy::IsFloat<T>()) {
    // Two products in 16-bit lanes: low bytes, then high bytes.
    const hn::Repartition<uint16_t, D> d16;
    const auto a16 = hn::BitCast(d16, a);
    const auto b16 = hn::BitCast(d16, b);
    const auto lo = hn::And(hn::Mul(a16, b16), hn::Set(d16, 0x00FF));
    const auto hi = hn::Mul(hn::ShiftRight<8>(a16), hn::And(b16, hn::Set(d16, 0xFF00)));
    return hn::BitCast(d, hn::Or(lo, hi));
  } else if constexpr (sizeof(T) == 8 && !hwy::IsFloat<T>()) {
    // (aH*2^32 + aL)(bH*2^32 + bL) mod 2^64 = aL*bL + ((aH*bL + aL*bH) << 32).
    const hn::Repartition<uint32_t, D> d32;
    const auto a32 = hn::BitCast(d32, a);
    const auto b32 = hn::BitCast(d32, b);
    const auto ll = hn::MulEven(a32, b32);
    const auto hl = hn::MulEven(hn::BitCast(d32, hn::ShiftRight<32>(a)), b32);
    const auto lh = hn::MulEven(a32, hn::BitCast(d32, hn::ShiftRight<32>(b)));
    return hn::BitCast(d, hn::Add(ll, hn::ShiftLeft<32>(hn::Add(hl, lh))));
  } else {
    return hn::Mul(a, b);
  }
}

// r, unless a or b is NaN, in which case that NaN (a's first).
template <class V>
HWY_INLINE V PropagateNaN(V a, V b, V r) {
  r = hn::IfThenElse(hn::IsNaN(b), b, r);
  return hn::IfThenElse(hn::IsNaN(a), a, r);
}

}  // namespace shoal::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SHOAL_KERNELS_SIMD_INL_H_
