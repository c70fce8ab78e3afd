// core/flight_recorder.h — the last N operations of one communicator, kept
// for post-mortems: what each rank was doing when a job hung or broke.
//
// A fixed ring of entries, written when an operation is queued, starts and
// ends, and read whole by snapshot() (the executor on a failure, the observer
// thread on SIGUSR1). An id names an entry; once the ring has wrapped past
// it, updates to that id are ignored. The ring holds a power of two of
// entries, at least the capacity, so that an id finds its slot with a mask:
// a division by the capacity, twice per operation, was a measurable part of
// a small collective (snapshot() still returns the last `capacity` only).
//
// Thread-safety: every method may be called from any thread; each takes mu_
// (a spin lock: common/spin_lock.h) for a few stores (it never allocates once
// every slot has been used at its largest, and never does I/O under the lock).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/spin_lock.h"

namespace shoal::core {

enum class OpState : uint8_t { kQueued, kRunning, kDone, kFailed };
const char* op_state_name(OpState s);

// What the recorder keeps of one operation.
struct TraceEntry {
  uint64_t id = 0;         // 1, 2, ... in queue order; 0: an empty slot
  uint64_t seq = 0;        // the collective's sequence number; 0 for send/recv
  uint8_t coll = 0;        // coll::Coll
  uint8_t dtype = 0;       // DataType
  int redop = -1;          // ReduceOp as the caller gave it; -1: not a reduction
  int root = -1;           // rooted collectives; -1 otherwise
  int peer = -1;           // send/recv: the peer (-1: any source)
  int64_t tag = -1;        // send/recv: the user's tag
  uint64_t count = 0;      // elements, as every rank sees the collective
  uint64_t bytes = 0;      // bytes of this rank's buffer that the operation moves
  std::string_view algo;   // the algorithm (names live in the registry, forever)
  std::vector<int> peers;  // ranks it exchanged messages with (known once it ended)
  OpState state = OpState::kQueued;
  int64_t enqueued_us = 0;  // wall clock, microseconds since the epoch
  int64_t started_us = 0;   // 0: not started
  int64_t ended_us = 0;     // 0: not ended
  std::string error;        // why it failed
};

class FlightRecorder {
 public:
  // capacity 0: everything is a no-op and snapshot() is empty.
  explicit FlightRecorder(size_t capacity);

  size_t capacity() const { return capacity_; }

  // Records a queued operation (its id and state are set here); returns the id.
  uint64_t enqueued(const TraceEntry& e);
  // Records an operation that is running already (one that runs as it is
  // issued goes in once), written in place by `fill(entry)` under the lock:
  // everything but the id, which is set here, and what only its end tells
  // (cleared here). Returns the id.
  template <class Fill>
  uint64_t add_running(Fill&& fill) {
    SpinLockGuard g(mu_);
    if (ring_.empty()) return 0;
    const uint64_t id = next_id_++;
    TraceEntry& slot = ring_[id & mask_];
    slot.id = id;
    slot.state = OpState::kRunning;
    slot.ended_us = 0;
    slot.peers.clear();  // (clear() keeps the capacity of the slot's strings and vectors)
    slot.error.clear();
    fill(slot);
    return id;
  }
  void started(uint64_t id, int64_t now_us, std::string_view algo);
  // The end of an operation: copies what is known only now (state, end
  // time, error, algorithm, peers) from `e` into the entry e.id.
  void ended(const TraceEntry& e);
  // The same from its parts, without a TraceEntry to fill and copy: `error`
  // is empty when there is none.
  void ended(uint64_t id, OpState state, int64_t started_us, int64_t ended_us, std::string_view algo,
             std::string_view error, const std::vector<int>& peers);

  // The entries still held, oldest first.
  std::vector<TraceEntry> snapshot() const;

 private:
  TraceEntry* find(uint64_t id) REQUIRES(mu_);

  mutable SpinLock mu_;
  const size_t capacity_;
  std::vector<TraceEntry> ring_ GUARDED_BY(mu_);  // capacity_ rounded up to a power of two
  const uint64_t mask_;                           // ring_.size() - 1
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

// One JSON object (a line of a dump) per entry, and the names used in it.
std::string trace_entry_json(const TraceEntry& e);

}  // namespace shoal::core
