// collectives/arena/host_arena.h — one shared segment for all ranks of a
// communicator that live on one host, for collectives that work directly on
// shared buffers (src/collectives/*_shared.cc).
//
// Layout: a header page; the member table; one control block per rank, of
// two 128-byte lines, one per round parity (each holds, in its first cache
// line, the rank's arrival counter for rounds of that parity, the operation
// and the CPU of the round, rank 0's CopyChoice proposals, and kInlineBytes
// of data; in its second, kNearBytes of data), and a third line with the
// number of ranks asleep on each counter; then per rank two data slots of
// `slot_bytes` each.
//
// Rounds: an operation is one or more rounds (a large one is cut into
// slot-sized pieces). Every rank counts rounds alike, so round k uses
// control line k % 2 and slot buffer k % 2 on every rank. In round k a rank
// announces phase 1 (its data is in its slot) and phase 2 (its share of the
// result is in its slot) by storing 2k+1 and 2k+2 in the counter of line
// k % 2; a rank waits for a phase of every peer, or of one. Every round
// includes a wait for phase 1 of every peer, so a rank that enters round
// k+2 knows all peers have left round k: the line and the buffer it is
// about to overwrite are no longer read (double buffering). A round of at
// most kInlineBytes per rank keeps its data in the control line: one cache
// line moves per peer instead of two; one of at most kNearBytes in the
// line's second cache line, which the adjacent-line prefetcher fetches
// with the first (slot(r, bytes)).
//
// Waiting spins for `spin_us`, then sleeps on the peer's counter (a futex
// on shared memory; the arriving side wakes sleepers only when some are
// registered). How the spin treats the core is set per operation (Spin):
// a caller that runs its operation itself holds it, giving it away between
// polls only while the peer's thread is queued on it (read from /proc every
// 25 us from 50 us on, through a descriptor open for that wait only: each
// rank keeps the thread that runs its rounds in the member table); the
// executor holds it 10 us, then gives it away between polls; with more
// ranks than cores every wait gives it away. While asleep it looks, every
// `abort_poll_ms`, at the communicator's abort record and at whether the
// peer's process is gone.
//
// Single-copy reads: where the kernel lets every rank read every other
// rank's memory (process_vm_readv; probe_reads() tries, and the
// communicator agrees on one answer for all ranks), a rank may publish the
// address of its own buffer in its line for the round (publish()) and the
// others copy straight out of it (read()), or the address of its output,
// marked as this round's, and the others copy into it (write(), which the
// kernel allows where it allows the reads): one copy instead of two
// through a slot, for the *_shared_cma algorithms and the claimed
// allreduce. Each rank's pid and the address of
// its own mapping of the segment (what probe_reads() reads back) are in a
// table after the header.
//
// The segment is an anonymous memfd made by the host's first rank; the
// others open it through /proc/<pid>/fd/<fd> while that rank holds it open,
// so it has no name anywhere and the kernel frees it when the last rank
// unmaps it, also after SIGKILL.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "collectives/arena/copy_choice.h"
#include "collectives/arena/slot_stores.h"
#include "common/process.h"
#include "transport/liveness.h"
#include "transport/transport.h"

namespace shoal::coll::arena {

using transport::Clock;
using transport::Fingerprint;
using transport::LazyDeadline;


class HostArena {
 public:
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // Rank 0: makes the segment for `size` ranks. Null (and `why`) on failure.
  static std::unique_ptr<HostArena> create(int rank, int size, uint64_t job, size_t slot_bytes,
                                           std::string* why);
  // "<pid> <fd>": where the other ranks find it (while this one keeps it open).
  std::string where() const;
  // The others: opens and maps the segment rank 0 made, checking it is the
  // one of this job.
  static std::unique_ptr<HostArena> attach(int rank, int size, uint64_t job, const std::string& where,
                                           std::string* why);
  // Once every rank has it mapped: the descriptor is no longer needed.
  void close_fd();

  // What the arena asks while a rank waits for its peers (in this
  // communicator's ranks): broken, check_abort and peer_gone every
  // abort_poll_ms, order_check for a peer that has not arrived, timed_out at
  // the deadline, describe for mismatches. Must outlive the arena.
  void set_liveness(transport::Liveness* live, int abort_poll_ms = 250) {
    live_ = live ? live : &transport::Liveness::none();
    abort_poll_ms_ = abort_poll_ms;
  }
  // How a wait spins before it sleeps (set per operation:
  // CommunicatorImpl::set_arena_spin; until then 200 us, kShare).
  enum class Spin {
    kHold,   // holds the core; gives it away between polls only while the peer is queued on it
    kShare,  // holds it for 10 us, then gives it away between polls
    kYield,  // gives it away between polls from the start
  };
  void set_spin(int us, Spin how) {
    spin_us_ = us;
    spin_ = how;
  }

  // Single-copy reads (see the top of this file). Tries to read the
  // segment's header through every peer's own mapping: "" when that worked
  // for all of them, else why not (naming the first peer that failed). When
  // that peer's process has no memory left (it has exited, or is exiting:
  // ESRCH), its rank goes to *gone, else -1.
  std::string probe_reads(int* gone = nullptr) const;
  // Whether every rank's probe_reads() worked (set by the communicator).
  void set_reads(bool on) { reads_ = on; }
  bool reads() const { return reads_; }
  // Before arrive(1): the buffer that peers may read() in this round, and
  // the one they may write() to (if any), in this rank's line (the round's
  // inline data; only for rounds whose slots are not inline).
  void publish(const void* buf, void* out = nullptr);
  // Copies `n` bytes at `off` in the buffer `peer` published this round
  // (after waiting for its phase 1) to `dst`. Throws PeerLost when the
  // peer's process is gone, else an InternalError naming it.
  void read(int peer, void* dst, size_t n, size_t off = 0);
  // Copies `n` bytes from `src` to `off` in the output buffer `peer`
  // published this round (process_vm_writev, which the kernel allows
  // wherever it allows the reads). False, writing nothing, when the peer
  // has left the operation (leave_writes()): its memory may be reused by
  // then. Throws as read().
  bool write(int peer, size_t off, const void* src, size_t n);
  // A rank that leaves a round whose output it published (on an error,
  // before every peer's phase 2): from here on no peer's write() starts,
  // and it waits up to `bound` for those under way to end, so that nothing
  // lands in its memory once the error has reached its caller.
  void leave_writes(Clock::duration bound);
  // Work shared out within one operation: the next of its pieces 0 ..
  // total-1 that no rank has claimed yet, from a counter common to all
  // ranks, in *piece; false when none is left. Every rank claims until it
  // gets false, exactly once per operation, and waits for every peer's
  // phase 2 before its next operation: so every rank knows where the
  // counter stands for the next one without resetting it.
  bool claim(uint64_t total, uint64_t* piece);

  struct Member;  // a rank's entry in the member table (host_arena.cc)

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // How this rank writes its slots (slot_stores.h).
  SlotStores& stores() { return stores_; }
  // Rank 0's timing of allgather's two ways (copy_choice.h), and the
  // proposals it made when it began the last round this rank has waited
  // for it in: what every rank's next allgather follows.
  CopyChoice& copies() { return copies_; }
  uint32_t agreed_copies() const { return agreed_copies_; }

  // Starts the next round of operation `seq` (every rank passes the same
  // `seq` and `fp`; a peer that does not is a Mismatch once seen).
  void begin(uint64_t seq, const Fingerprint& fp);
  // Rank r's slot of the current round.
  char* slot(int r) const {
    return data_ + (static_cast<size_t>(r) * 2 + parity()) * slot_bytes_;
  }
  // Rank r's buffer for `bytes` bytes per rank in the current round (every
  // rank passes the same): in its control line when they fit, so that a
  // peer fetches one cache line for the arrival and the data together;
  // else slot(r).
  char* slot(int r, size_t bytes) const {
    if (bytes <= kInlineBytes) return line_at(r) + kInlineOffset;
    if (bytes <= kNearBytes) return line_at(r) + kNearOffset;
    return slot(r);
  }
  // What a Spin::kHold wait looks at: whether the thread that began
  // `peer`'s last round is queued on this thread's CPU (true also when
  // that cannot be read, as with no round begun yet), through `w`, the
  // wait's look at the peer's thread (opened on the first call).
  bool peer_queued_here(int peer, proc::TaskWatch& w) const;
  static constexpr size_t kInlineBytes = 24;
  // A round of at most kNearBytes per rank keeps its data in the second
  // cache line of the rank's control line, which the adjacent-line
  // prefetcher fetches along with the first.
  static constexpr size_t kNearBytes = 64, kNearOffset = 64;
  // A rank's control block: two lines, 128 bytes apart (not neighbours for
  // the adjacent-line prefetcher); its data at kInlineOffset in the line.
  static constexpr size_t kLineBytes = 128, kInlineOffset = 40;
  // Two lines, then the line of sleepers (Sleepers).
  static constexpr size_t kSleepersOffset = 2 * kLineBytes, kControlBytes = 3 * kLineBytes;
  // Announces `phase` (1 or 2) of the current round.
  void arrive(int phase);
  // Waits until every peer (or `peer`) has announced `phase` of the current
  // round. Throws the communicator's cause, PeerLost, Mismatch, or the
  // timed_out error at `deadline`.
  void wait_all(int phase, const LazyDeadline& deadline);
  void wait_one(int peer, int phase, const LazyDeadline& deadline);
  // Whether `peer` has announced `phase` of the current round, without
  // waiting (a wait_one() for it still follows before its data is used).
  bool arrived(int peer, int phase) const;
  // The ranks asleep on rank r's counter of the current round (registered
  // to be woken by its next arrival).
  uint32_t asleep_on(int r) const { return waiters(r).load(std::memory_order_relaxed); }
  // How this rank's sleeps on a peer's counter ended: woken by the peer's
  // arrival, or at the end of a slice (the peer did not wake it).
  struct Sleeps {
    uint64_t woken = 0, slices_out = 0;
  };
  const Sleeps& sleeps() const { return sleeps_; }
  // The pid rank `r` wrote when it mapped the segment (0 if it has not).
  int64_t member_pid(int r) const;

 private:
  struct Line;
  struct Sleepers;
  struct Control;
  Member& member(int r) const;
  char* control_at(int r) const { return ctl_base_ + static_cast<size_t>(r) * kControlBytes; }  // rank r's block
  size_t parity() const { return static_cast<size_t>((round_ - 1) & 1); }  // of the current round
  char* line_at(int r) const { return control_at(r) + parity() * kLineBytes; }  // rank r's line of this round
  Line& line(int r) const { return *reinterpret_cast<Line*>(line_at(r)); }
  // The ranks asleep on rank r's counter of the current round's parity.
  std::atomic<uint32_t>& waiters(int r) const;
  // The flag value that announces `phase` (1 or 2) of the current round.
  uint32_t flag_of(int phase) const {
    return static_cast<uint32_t>(2 * (round_ - 1) + static_cast<uint64_t>(phase));
  }
  HostArena(int rank, int size, size_t slot_bytes, void* map, size_t map_bytes, int fd);
  void sleep_on(int peer, uint32_t target, const LazyDeadline& deadline);
  void wait_beside(int peer, uint32_t target, const LazyDeadline& deadline);  // the peer shares this CPU
  void check_peer(int peer);
  void reached_peer(int peer, int phase);  // after a wait for `peer`
  [[noreturn]] void fail_wait(int peer, uint32_t target);
  void remote_copy(int peer, bool write, void* local, size_t off, size_t n);
  // After a copy from or to a live `peer` failed: the cause of the
  // operation's failure that made the peer leave it, once seen (another
  // rank gone, a published cause), else null after a few abort polls.
  std::exception_ptr cause_of_leaving(int peer);
  struct WriteGuard;  // in a rank's line for a round it publishes an output in
  WriteGuard& guard(int r) const;

  int rank_, size_;
  size_t slot_bytes_;
  void* map_;
  size_t map_bytes_;
  int fd_;
  char* members_ = nullptr;
  char* ctl_base_ = nullptr;
  char* data_ = nullptr;
  uint64_t round_ = 0;  // rounds begun (the current one is round_ - 1)
  uint64_t seq_ = 0;
  Fingerprint fp_;
  int spin_us_ = 200;
  Spin spin_ = Spin::kShare;
  int cpu_ = -1;  // the CPU this rank began its current round on
  int tid_ = 0;   // the thread in this rank's member entry
  proc::CpuSharing sharing_;  // when a rank beside its peer moves
  Sleeps sleeps_;
  bool reads_ = false;
  SlotStores stores_;
  CopyChoice copies_;
  uint32_t agreed_copies_ = 0;
  uint64_t claims_base_ = 0;  // the claim counter where this operation's pieces start
  transport::Liveness* live_ = &transport::Liveness::none();
  int abort_poll_ms_ = 250;
};

}  // namespace shoal::coll::arena
