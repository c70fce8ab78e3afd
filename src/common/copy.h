// common/copy.h — memcpy without a slow path of `rep movsb`.
//
// glibc copies blocks above about 2 KiB with `rep movsb`. On some AMD EPYC
// parts (bench/results/copy-alignment names the one measured), it runs 15-40 times
// slower when the destination lies a few bytes (1 to ~31) after the source
// modulo a 4 KiB page: 1-3 GB/s instead of 30-40
// (bench/results/copy-alignment). Buffers from malloc sit 16 bytes into a
// page and shared-memory slots at the start of one, so copying a slot into
// a user's buffer hits exactly that case. copy() uses a vector loop there
// and memcpy everywhere else.
#pragma once

#include <cstddef>
#include <cstring>

namespace shoal {

// copy() of a block that may be large enough for `rep movsb`.
void copy_large(void* dst, const void* src, size_t n);

// memcpy(dst, src, n); the ranges must not overlap.
inline void copy(void* dst, const void* src, size_t n) {
  if (n <= 2048) {  // below glibc's `rep movsb` threshold: memcpy, inline
    std::memcpy(dst, src, n);
    return;
  }
  copy_large(dst, src, n);
}

// memcpy(dst, src, n) with non-temporal stores: the destination's lines go
// to memory without being read first or kept in the cache. For outputs
// larger than the cache that the caller will not read again soon (the
// result of a large collective): a normal store reads every line before it
// writes it, a third more memory traffic. Ends with a store fence, so a
// release store after it (an arrival) publishes the data.
void copy_stream(void* dst, const void* src, size_t n);

// Whether copy() takes its own loop for this pair (for tests).
bool copy_avoids_rep_movsb(const void* dst, const void* src, size_t n);

}  // namespace shoal
