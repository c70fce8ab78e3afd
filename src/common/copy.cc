// common/copy.cc — see copy.h.
#include "common/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace shoal {

bool copy_avoids_rep_movsb(const void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  const uintptr_t gap = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return n > 2048 && gap != 0 && gap < 64;
#else
  (void)dst;
  (void)src;
  (void)n;
  return false;
#endif
}

void copy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (copy_avoids_rep_movsb(dst, src, n)) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, n - i);  // under 64 bytes: no rep movsb
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace shoal
