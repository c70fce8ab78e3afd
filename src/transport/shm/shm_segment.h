// transport/shm/shm_segment.h — the shared-memory layout of one channel
// between two ranks on the same host, and its lock-free rings.
//
// A channel joins side 0 (the lower rank, which creates the segment) and
// side 1. The segment is an anonymous memfd passed over the channel's Unix
// socket, so it has no name in any file system and cannot leak: the kernel
// frees it when the last of the two processes unmaps it, also after SIGKILL.
//
// Layout: a Header, then per direction d (data written by side d):
//   - a byte ring (`RingCtl` + `ring_bytes` of data) carrying frames: a
//     ShmFrame, then for a kStream frame its `length` payload bytes, streamed
//     in as space frees up;
//   - a completion ring (`FinRing`) of 64-bit cookies: side d acknowledges
//     that it has read the payload of a kRts message the other side sent.
// Every ring has exactly one producer and one consumer (single-producer,
// single-consumer): positions only grow; the producer publishes `tail` with
// release after writing, the consumer publishes `head` after reading.
//
// Waking a sleeper: a side about to block sets sleeping[side], issues a full
// fence, then looks at every ring once more; a side that changes any ring
// (produces, consumes or acknowledges) issues a full fence, then if the other
// side's flag is set clears it and writes one byte to the Unix socket (the
// doorbell). Either the sleeper sees the change or the writer sees the flag.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/copy.h"
#include "transport/transport.h"

namespace shoal::transport::shm {

inline constexpr uint32_t kSegMagic = 0x53484d53;    // "SHMS"
inline constexpr uint32_t kFrameMagic = 0x53484d46;  // "SHMF"
inline constexpr uint16_t kVersion = 2;  // of the segment's layout
inline constexpr size_t kFinSlots = 1024;

// A channel opens with the handshake (transport/handshake.h, link kShm):
// side 0's Hello goes with the memfd attached, its `extra` the segment's
// size; the segment is mapped only once the proof checks out. Side 1's
// Accept goes first on the Unix socket, before any doorbell; side 0 reads
// no frame of side 1 before it checks out.

enum class FrameKind : uint8_t {
  kStream = 1,  // `length` payload bytes follow in the ring
  kRts = 2,     // the payload stays in the sender's memory at `addr`; the
                // receiver reads it with process_vm_readv and acknowledges
                // `cookie` in its FinRing
};

struct ShmFrame {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t space = 0;
  uint16_t reserved = 0;
  uint32_t step = 0;
  uint32_t ctx = 0;
  uint64_t seq = 0;
  uint64_t length = 0;
  Fingerprint fp;
  uint64_t addr = 0;
  uint64_t cookie = 0;

  Tag tag() const { return Tag{static_cast<Space>(space), seq, step, ctx}; }
};
static_assert(sizeof(ShmFrame) == 64);

struct alignas(64) Padded64 {
  std::atomic<uint64_t> v{0};
};
struct alignas(64) Padded32 {
  std::atomic<uint32_t> v{0};
};

struct RingCtl {
  Padded64 tail;  // bytes produced (producer writes)
  Padded64 head;  // bytes consumed (consumer writes)
};

struct FinRing {
  Padded64 tail;
  Padded64 head;
  uint64_t slots[kFinSlots];
};

struct SideInfo {
  std::atomic<uint64_t> pid{0};
  std::atomic<uint64_t> seg_addr{0};  // where this side mapped the segment
  // Set by this side once it has read the other side's memory with
  // process_vm_readv: the other side may then send kRts frames to it.
  std::atomic<uint32_t> can_read_peer{0};
  // Set when this side's transport breaks or closes, before its pending sends fail:
  // a buffer read after that may already be freed, so the reader discards it.
  std::atomic<uint32_t> broken{0};
};

struct alignas(64) Header {
  uint32_t magic = kSegMagic;
  uint16_t version = kVersion;
  uint16_t reserved = 0;
  uint64_t job = 0;
  uint64_t ring_bytes = 0;  // a power of two
  SideInfo side[2];
  Padded32 sleeping[2];
  RingCtl ring[2];  // ring[d]: data written by side d
  FinRing fin[2];   // fin[d]: acknowledgements written by side d
};

inline size_t segment_bytes(size_t ring_bytes) {
  size_t h = (sizeof(Header) + 4095) & ~size_t{4095};
  return h + 2 * ring_bytes;
}

// A view of the mapped segment from one side.
class Segment {
 public:
  Segment() = default;
  Segment(void* base, size_t ring_bytes, int side)
      : hdr_(static_cast<Header*>(base)), ring_bytes_(ring_bytes), side_(side) {
    size_t h = (sizeof(Header) + 4095) & ~size_t{4095};
    data_[0] = static_cast<uint8_t*>(base) + h;
    data_[1] = data_[0] + ring_bytes;
  }
  Header* hdr() const { return hdr_; }
  int side() const { return side_; }
  int other() const { return 1 - side_; }

  // ---- the outgoing byte ring (this side produces) ----
  size_t tx_space() const {
    RingCtl& r = hdr_->ring[side_];
    uint64_t t = r.tail.v.load(std::memory_order_relaxed);
    uint64_t h = r.head.v.load(std::memory_order_acquire);
    return ring_bytes_ - static_cast<size_t>(t - h);
  }
  // Copies n <= tx_space() bytes in and publishes them.
  void tx_write(const void* src, size_t n) {
    RingCtl& r = hdr_->ring[side_];
    uint64_t t = r.tail.v.load(std::memory_order_relaxed);
    copy_in(data_[side_], t, src, n);
    r.tail.v.store(t + n, std::memory_order_release);
  }

  // ---- the incoming byte ring (the other side produces) ----
  size_t rx_avail() const {
    RingCtl& r = hdr_->ring[other()];
    uint64_t t = r.tail.v.load(std::memory_order_acquire);
    uint64_t h = r.head.v.load(std::memory_order_relaxed);
    return static_cast<size_t>(t - h);
  }
  // Copies n <= rx_avail() bytes out and frees their space.
  void rx_read(void* dst, size_t n) {
    RingCtl& r = hdr_->ring[other()];
    uint64_t h = r.head.v.load(std::memory_order_relaxed);
    copy_out(data_[other()], h, dst, n);
    r.head.v.store(h + n, std::memory_order_release);
  }

  // ---- acknowledgements ----
  bool fin_push(uint64_t cookie) {
    FinRing& f = hdr_->fin[side_];
    uint64_t t = f.tail.v.load(std::memory_order_relaxed);
    if (t - f.head.v.load(std::memory_order_acquire) >= kFinSlots) return false;
    f.slots[t % kFinSlots] = cookie;
    f.tail.v.store(t + 1, std::memory_order_release);
    return true;
  }
  bool fin_pop(uint64_t* cookie) {
    FinRing& f = hdr_->fin[other()];
    uint64_t h = f.head.v.load(std::memory_order_relaxed);
    if (h == f.tail.v.load(std::memory_order_acquire)) return false;
    *cookie = f.slots[h % kFinSlots];
    f.head.v.store(h + 1, std::memory_order_release);
    return true;
  }
  bool fin_pending() const {
    FinRing& f = hdr_->fin[other()];
    return f.head.v.load(std::memory_order_relaxed) != f.tail.v.load(std::memory_order_acquire);
  }

  // ---- sleeping ----
  void set_sleeping() {
    hdr_->sleeping[side_].v.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  // After changing any ring: true if the other side must be woken.
  bool take_peer_sleeping() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    auto& s = hdr_->sleeping[other()].v;
    return s.load(std::memory_order_relaxed) != 0 && s.exchange(0, std::memory_order_relaxed) != 0;
  }

 private:
  void copy_in(uint8_t* ring, uint64_t pos, const void* src, size_t n) {
    size_t off = static_cast<size_t>(pos & (ring_bytes_ - 1));
    size_t first = n < ring_bytes_ - off ? n : ring_bytes_ - off;
    copy(ring + off, src, first);
    if (n > first) copy(ring, static_cast<const uint8_t*>(src) + first, n - first);
  }
  void copy_out(const uint8_t* ring, uint64_t pos, void* dst, size_t n) const {
    size_t off = static_cast<size_t>(pos & (ring_bytes_ - 1));
    size_t first = n < ring_bytes_ - off ? n : ring_bytes_ - off;
    copy(dst, ring + off, first);
    if (n > first) copy(static_cast<uint8_t*>(dst) + first, ring, n - first);
  }

  Header* hdr_ = nullptr;
  size_t ring_bytes_ = 0;
  int side_ = 0;
  uint8_t* data_[2] = {nullptr, nullptr};
};

}  // namespace shoal::transport::shm
