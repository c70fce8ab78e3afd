// collectives/shared_rounds.cc — see shared_rounds.h.
#include "collectives/arena/shared_rounds.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives/patterns/partition.h"
#include "common/copy.h"
#include "kernels/reduce.h"
#include "shoal/error.h"

namespace shoal::coll {

namespace {

// The last-level cache of this CPU as the kernel reports it ("32768K"), else
// 0. Preferred to sysconf(_SC_LEVEL3_CACHE_SIZE): in a virtual machine glibc
// reads CPUID, which may describe the host's whole package (e.g. 320 MiB on a
// 2-vCPU guest whose kernel says 32 MiB).
size_t kernel_l3_bytes() {
  std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
  if (!f) return 0;
  unsigned long long n = 0;
  char unit = 0;
  const int got = std::fscanf(f, "%llu%c", &n, &unit);
  std::fclose(f);
  if (got < 1) return 0;
  if (unit == 'K') n <<= 10;
  if (unit == 'M') n <<= 20;
  return static_cast<size_t>(n);
}

}  // namespace

bool streams(size_t output_bytes, int ranks) {
  static const size_t cache = [] {
    size_t l3 = kernel_l3_bytes();
    if (l3 == 0) {
      const long c = sysconf(_SC_LEVEL3_CACHE_SIZE);
      l3 = c > 0 ? static_cast<size_t>(c) : size_t{32} << 20;
    }
    return l3;
  }();
  return output_bytes * static_cast<size_t>(ranks) >= cache;
}

void copy_out(void* dst, const void* src, size_t n, bool stream) {
  if (stream) {
    copy_stream(dst, src, n);
  } else {
    copy(dst, src, n);
  }
}

coll::arena::HostArena& arena_of(Ctx& c, Coll coll, const char* algo) {
  if (auto* a = c.arena()) return *a;
  throw InvalidArgument(std::string(coll_name(coll)) + ": algorithm '" + algo +
                        "' needs every rank of the communicator on one host with shared "
                        "memory on (SHOAL_SHM not 0, SHOAL_SHM_ARENA_BYTES not 0)");
}

coll::arena::HostArena& reading_arena_of(Ctx& c, Coll coll, const char* algo) {
  auto& arena = arena_of(c, coll, algo);
  if (arena.reads()) return arena;
  throw InvalidArgument(std::string(coll_name(coll)) + ": algorithm '" + algo +
                        "' needs single-copy reads between the ranks of this host, which "
                        "are off (SHOAL_SHM=copy, or the kernel refused process_vm_readv: SHOAL_DEBUG=INFO says "
                        "which)");
}

void reduce_all(const Args& a, char* dst, const char* const* srcs, int n, size_t len) {
  if (n == 1) {
    if (dst != srcs[0]) copy(dst, srcs[0], len * a.elem());
    return;
  }
  // (dt, op) and the buffers were checked when the operation was issued.
  kernels::reduce_unchecked(a.dt, a.op, dst, srcs[0], srcs[1], len);
  for (int q = 2; q < n; ++q) kernels::reduce_unchecked(a.dt, a.op, dst, dst, srcs[q], len);
}

void reduce_in_rounds(Ctx& c, const Args& a, Coll coll, int root) {
  const int n = c.size(), me = c.rank();
  const size_t es = a.elem();
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const bool wants = root < 0 || me == root;
  if (n == 1) {
    if (!a.in_place()) copy(out, in, a.count * es);
    return;
  }
  auto& arena = arena_of(c, coll);
  auto& stores = arena.stores();
  const size_t per_round = slot_elems(arena, es);
  const bool stream = streams(a.count * es, n);
  RankPtrs srcs(n), slice(n);
  for (size_t off = 0; off < a.count; off += per_round) {
    const size_t len = std::min(per_round, a.count - off);
    char* dst = out + off * es;
    c.begin_round();
    for (int q = 0; q < n; ++q) srcs[q] = arena.slot(q, len * es);
    copy_out(arena.slot(me, len * es), in + off * es, len * es, stores.begin(len * es));
    arena.arrive(1);
    arena.wait_all(1, c.lazy_deadline());
    if (len * es * static_cast<size_t>(n) <= kSharedOnePhaseBytes) {  // (not a timed round: too small)
      if (wants) reduce_all(a, dst, srcs.data(), n, len);
      continue;
    }
    const patterns::Range mine = patterns::block(len, n, me);
    char* own = arena.slot(me, len * es) + mine.off * es;
    slice[0] = own;
    for (int q = 0, k = 1; q < n; ++q) {
      if (q != me) slice[k++] = srcs[q] + mine.off * es;
    }
    reduce_all(a, own, slice.data(), n, mine.len);
    arena.arrive(2);
    if (wants) {
      arena.wait_all(2, c.lazy_deadline());
      for (int q = 0; q < n; ++q) {
        const patterns::Range b = patterns::block(len, n, q);
        copy_out(dst + b.off * es, srcs[q] + b.off * es, b.len * es, stream);
      }
    }
    stores.end();
  }
}

size_t slot_elems(const coll::arena::HostArena& arena, size_t es, size_t parts) {
  const size_t n = arena.slot_bytes() / (es * parts);
  return n ? n : 1;
}

}  // namespace shoal::coll
