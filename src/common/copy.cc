// common/copy.cc — see copy.h.
#include "common/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace shoal {

#if defined(__x86_64__)
namespace {

struct Plain {
  static void store(char* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
};
struct Stream {  // non-temporal; p must be 16-byte aligned
  static void store(char* p, __m128i v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); }
};

// Copies whole 64-byte blocks from offset i on; returns the offset after the last.
template <class Store>
size_t copy_blocks(char* d, const char* s, size_t i, size_t n) {
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    Store::store(d + i, a);
    Store::store(d + i + 16, b);
    Store::store(d + i + 32, c);
    Store::store(d + i + 48, e);
  }
  return i;
}

}  // namespace
#endif

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

void copy_large(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (copy_avoids_rep_movsb(dst, src, n)) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t i = copy_blocks<Plain>(d, s, 0, n);
    std::memcpy(d + i, s + i, n - i);  // under 64 bytes: no rep movsb
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

void copy_stream(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  if (n < 4096) {  // (also covers n < head)
    copy(dst, src, n);
    return;
  }
  std::memcpy(d, s, head);
  const size_t i = copy_blocks<Stream>(d, s, head, n);  // d + head is 16-byte aligned
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();
#else
  copy(dst, src, n);
#endif
}

}  // namespace shoal
