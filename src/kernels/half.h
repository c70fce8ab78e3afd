// kernels/half.h — scalar float16 / bfloat16 <-> float32 conversions.
//
// The reference semantics of shoal's 16-bit float types; the vector kernels
// (simd-inl.h, or the F16C instructions where the CPU has them) produce the
// same bits. float -> 16-bit rounds to nearest, ties to even; overflow gives
// infinity; a NaN stays a NaN (quieted, sign and top payload bits kept).
// Pure functions, thread-safe. The storage type of both is uint16_t.
#pragma once

#include <cstdint>
#include <cstring>

namespace shoal::kernels {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Exact: every float16 value is a float32 value.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  if (em < 0x0400u) {               // zero or subnormal: em * 2^-24
    return bits_float(sign | float_bits(static_cast<float>(em) * 0x1p-24f));
  }
  uint32_t bits = (em << 13) + (112u << 23);  // rebias 15 -> 127
  if (em >= 0x7C00u) bits += 112u << 23;       // inf / NaN: exponent 31 -> 255
  return bits_float(sign | bits);
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (a >= 0x38800000u) {  // normal float16: rebias, round the 13 dropped bits
    return static_cast<uint16_t>(sign | ((a - 0x38000000u + 0x0FFFu + ((a >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: rounds to zero
  // Subnormal float16: the result counts units of 2^-24.
  const uint32_t shift = 126u - (a >> 23);  // 14 .. 24
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float bfloat16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bfloat16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace shoal::kernels
