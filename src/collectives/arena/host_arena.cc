// collectives/arena/host_arena.cc — see host_arena.h.
#include "collectives/arena/host_arena.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/spin_lock.h"
#include "common/yield_gauge.h"
#include "shoal/error.h"

namespace shoal::coll::arena {
namespace {

constexpr uint32_t kArenaMagic = 0x53484152;  // "SHAR"
constexpr uint32_t kArenaVersion = 7;  // 7: the sleepers in a line of their own
constexpr size_t kPage = 4096;
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
// Longer than a store can wait in a store buffer (a cache-line transfer,
// well under a microsecond): see sleep_on().
constexpr auto kStoreSettle = std::chrono::microseconds(2);
// Spinning holds the core for this long; then Spin::kShare gives it away
// between polls. Spin::kHold first looks whether the peer is queued on it
// (peer_queued_here()) after kFirstLook, then again every kLookEvery: a
// look opens the peer's /proc entry for the wait (a few µs), which a wait
// for a peer that is simply a little behind should not pay.
constexpr auto kYieldAfter = std::chrono::microseconds(10);
constexpr auto kFirstLook = std::chrono::microseconds(50);
constexpr auto kLookEvery = std::chrono::microseconds(25);
// A waiter whose peer shares its CPU yields it for this long, then sleeps.
constexpr auto kSameCpuYield = std::chrono::microseconds(20);

struct ArenaHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t job;
  uint64_t size;
  uint64_t slot_bytes;
};

// The counter HostArena::claim() takes pieces from: in the header page, on a
// cache line of its own.
constexpr size_t kClaimsOffset = 64;

size_t page_up(size_t n) { return (n + kPage - 1) & ~(kPage - 1); }

// Counters are 32-bit (a futex word) and compared modulo 2^32: ranks are
// never more than one round apart.
bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// What a rank publishes about its rounds of one parity: round k uses
// line[k % 2]. Everything a peer reads of a small round (the arrival, the
// operation it belongs to, the CPU, the data) is in this one cache line, so
// a small round costs one line fetched per peer and one taken back.
struct alignas(HostArena::kLineBytes) HostArena::Line {  // 128: no neighbour for the adjacent-line prefetcher
  std::atomic<uint32_t> flag{0};  // 2k + phase of the rank's last arrival in a round of this parity
  uint32_t unused = 0;
  std::atomic<int32_t> cpu{-1};   // the CPU the rank ran on when it began the round
  uint32_t copies = 0;            // rank 0: its CopyChoice proposals when it began the round
  uint64_t seq = 0;  // the operation of the round (written before phase 1)
  Fingerprint fp;
  char data[kInlineBytes];  // the rank's slot for a round of at most kInlineBytes
  char near[kNearBytes];    // ... and for one of at most kNearBytes
};

// The ranks asleep on a rank's `flag`, per parity: written only by a peer
// that goes to sleep, so the line stays in the arriving rank's cache, and
// arrive()'s look at it does not wait for the control line that the rank's
// own stores are taking back from the peers that read it.
struct alignas(HostArena::kLineBytes) HostArena::Sleepers {
  std::atomic<uint32_t> waiters[2] = {0, 0};
};

struct HostArena::Control {
  Line line[2];
  Sleepers sleepers;
};

// Written once by each rank when it maps the segment.
struct HostArena::Member {
  int64_t pid = 0;
  uint64_t map = 0;  // the address of the segment in that rank's own memory
  std::atomic<int32_t> tid{0};  // the thread that began the rank's last round
};

namespace {

struct Layout {
  size_t members_off, ctl_off, data_off, slot, total;
};

Layout layout(int size, size_t slot_bytes) {
  Layout l;
  l.members_off = kPage;
  l.ctl_off = l.members_off + page_up(static_cast<size_t>(size) * sizeof(HostArena::Member));
  l.data_off = l.ctl_off + page_up(static_cast<size_t>(size) * HostArena::kControlBytes);
  l.slot = page_up(slot_bytes);
  l.total = l.data_off + static_cast<size_t>(size) * 2 * l.slot;
  return l;
}

}  // namespace

HostArena::HostArena(int rank, int size, size_t slot_bytes, void* map, size_t map_bytes, int fd)
    : rank_(rank), size_(size), slot_bytes_(slot_bytes), map_(map), map_bytes_(map_bytes), fd_(fd) {
  Layout l = layout(size, slot_bytes);
  members_ = static_cast<char*>(map) + l.members_off;
  ctl_base_ = static_cast<char*>(map) + l.ctl_off;
  data_ = static_cast<char*>(map) + l.data_off;
  slot_bytes_ = l.slot;
  static_assert(offsetof(Line, data) + kInlineBytes == 64, "a control line is one cache line");
  static_assert(offsetof(Line, data) == kInlineOffset && sizeof(Line) == kLineBytes);
  static_assert(offsetof(Line, near) == kNearOffset);
  static_assert(sizeof(Control) == kControlBytes);
  static_assert(offsetof(Control, sleepers) == kSleepersOffset);
  Member& me = member(rank);
  me.pid = getpid();
  me.map = reinterpret_cast<uintptr_t>(map);
}

HostArena::Member& HostArena::member(int r) const {
  return reinterpret_cast<Member*>(members_)[r];
}

int64_t HostArena::member_pid(int r) const { return member(r).pid; }

std::atomic<uint32_t>& HostArena::waiters(int r) const {
  return reinterpret_cast<Sleepers*>(control_at(r) + kSleepersOffset)->waiters[parity()];
}

HostArena::~HostArena() {
  if (map_) munmap(map_, map_bytes_);
  close_fd();
}

void HostArena::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::unique_ptr<HostArena> HostArena::create(int rank, int size, uint64_t job, size_t slot_bytes,
                                             std::string* why) {
  Layout l = layout(size, slot_bytes);
  int fd = memfd_create("shoal-arena", MFD_CLOEXEC);
  if (fd < 0) {
    *why = "memfd_create: " + errno_text();
    return nullptr;
  }
  if (ftruncate(fd, static_cast<off_t>(l.total)) != 0) {
    *why = "ftruncate to " + std::to_string(l.total) + " bytes: " + errno_text();
    ::close(fd);
    return nullptr;
  }
  void* m = mmap(nullptr, l.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) {
    *why = "mmap of " + std::to_string(l.total) + " bytes: " + errno_text();
    ::close(fd);
    return nullptr;
  }
  auto* h = static_cast<ArenaHeader*>(m);
  h->magic = kArenaMagic;
  h->version = kArenaVersion;
  h->job = job;
  h->size = static_cast<uint64_t>(size);
  h->slot_bytes = slot_bytes;
  static_assert(sizeof(ArenaHeader) <= kClaimsOffset);
  new (static_cast<char*>(m) + kClaimsOffset) std::atomic<uint64_t>(0);
  for (int r = 0; r < size; ++r) new (static_cast<char*>(m) + l.ctl_off + static_cast<size_t>(r) * HostArena::kControlBytes) Control();
  return std::unique_ptr<HostArena>(new HostArena(rank, size, slot_bytes, m, l.total, fd));
}

std::string HostArena::where() const { return std::to_string(getpid()) + " " + std::to_string(fd_); }

std::unique_ptr<HostArena> HostArena::attach(int rank, int size, uint64_t job, const std::string& where,
                                             std::string* why) {
  std::istringstream in(where);
  long pid = 0, fdn = -1;
  if (!(in >> pid >> fdn) || pid <= 0 || fdn < 0) {
    *why = "bad location '" + where + "'";
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fdn);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = "open " + path + ": " + errno_text();
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kPage)) {
    *why = path + " is not a shoal arena (size " + std::to_string(st.st_size) + ")";
    ::close(fd);
    return nullptr;
  }
  const size_t total = static_cast<size_t>(st.st_size);
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);  // the mapping keeps the memory
  if (m == MAP_FAILED) {
    *why = "mmap " + path + ": " + errno_text();
    return nullptr;
  }
  const auto* h = static_cast<const ArenaHeader*>(m);
  if (h->magic != kArenaMagic || h->version != kArenaVersion || h->job != job ||
      h->size != static_cast<uint64_t>(size) || layout(size, h->slot_bytes).total != total) {
    *why = path + " is not this communicator's arena";
    munmap(m, total);
    return nullptr;
  }
  return std::unique_ptr<HostArena>(new HostArena(rank, size, h->slot_bytes, m, total, -1));
}

void HostArena::begin(uint64_t seq, const Fingerprint& fp) {
  seq_ = seq;
  fp_ = fp;
  ++round_;
  Line& l = line(rank_);
  l.seq = seq;
  l.fp = fp;
  cpu_ = sched_getcpu();
  l.cpu.store(cpu_, std::memory_order_relaxed);
  if (const int tid = proc::this_tid(); tid != tid_) {  // a peer's look at where this rank is
    member(rank_).tid.store(tid, std::memory_order_relaxed);
    tid_ = tid;
  }
  if (rank_ == 0) {
    agreed_copies_ = copies_.proposals();
    l.copies = agreed_copies_;
  }
}

void HostArena::arrive(int phase) {
  Line& c = line(rank_);
  // A release store, not seq_cst: a locked store would hold this rank until
  // the line came back from the peers that read it last round, a good part
  // of a small round (bench/results/arena-round). So the look at `waiters`
  // may pass the store: a rank registering to sleep just then may not be
  // woken, and sleep_on() makes up for that.
  c.flag.store(flag_of(phase), std::memory_order_release);
  if (waiters(rank_).load(std::memory_order_relaxed) != 0) futex(&c.flag, FUTEX_WAKE, INT_MAX, nullptr);
}

void HostArena::wait_all(int phase, const LazyDeadline& deadline) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) wait_one(q, phase, deadline);
  }
}

bool HostArena::arrived(int peer, int phase) const {
  return reached(line(peer).flag.load(std::memory_order_acquire), flag_of(phase));
}

void HostArena::wait_one(int peer, int phase, const LazyDeadline& deadline) {
  const uint32_t target = flag_of(phase);
  Line& c = line(peer);
  uint32_t v = c.flag.load(std::memory_order_acquire);
  if (!reached(v, target)) {
    if (cpu_ >= 0 && c.cpu.load(std::memory_order_relaxed) == cpu_) {
      wait_beside(peer, target, deadline);
      reached_peer(peer, phase);
      return;
    }
    sharing_.apart();
    // A crowded host's wait gives the core away from the start, unless its
    // yields were found to hand it to other work for a time slice: then it
    // sleeps at once (YieldGauge).
    YieldGauge& gauge = YieldGauge::here();
    if (spin_ == Spin::kYield && !gauge.spin()) {
      sleep_on(peer, target, deadline);
      reached_peer(peer, phase);
      return;
    }
    Clock::time_point until{}, look_at{};
    bool yielding = false;  // Spin::kShare and kHold, when they give the core away
    proc::TaskWatch watch;  // open for this wait only: a rank keeps no descriptor
    for (unsigned i = 1;; ++i) {
      if (spin_ == Spin::kYield) {
        if (!gauge.yield()) {
          sleep_on(peer, target, deadline);
          break;
        }
      } else if (yielding) {
        sched_yield();
      } else {
        cpu_relax();
      }
      v = c.flag.load(std::memory_order_acquire);
      if (reached(v, target)) {
        if (spin_ == Spin::kYield) gauge.quiet();
        break;
      }
      if ((i & 63) == 0) {
        if (auto e = live_->broken()) std::rethrow_exception(e);
        const auto now = Clock::now();
        if (i == 64) {  // the first look at the clock starts both windows
          until = now + std::chrono::microseconds(spin_us_);
          look_at = now + (spin_ == Spin::kHold ? kFirstLook : kYieldAfter);
          continue;
        }
        // Holding the core keeps the peer from arriving only when the peer
        // is queued on it (a woken thread goes beside its waker; a runnable
        // one may be balanced onto a busy core): give it away between polls
        // while it is. A core given away otherwise goes to whatever else is
        // runnable here, for a whole time slice.
        if (spin_ == Spin::kShare && now >= look_at) yielding = true;
        if (spin_ == Spin::kHold && now >= look_at) {
          yielding = peer_queued_here(peer, watch);
          look_at = now + kLookEvery;
        }
        if (now >= until) {
          sleep_on(peer, target, deadline);
          v = c.flag.load(std::memory_order_acquire);
          break;
        }
      }
    }
  }
  reached_peer(peer, phase);
}

// The peer has announced `phase` of this round, so whatever it wrote into
// its line when it began the round is visible here.
void HostArena::reached_peer(int peer, int phase) {
  if (phase == 1) check_peer(peer);
  if (peer == 0) agreed_copies_ = line(0).copies;
}

bool HostArena::peer_queued_here(int peer, proc::TaskWatch& w) const {
  const Member& m = member(peer);
  w.watch(m.pid, m.tid.load(std::memory_order_relaxed));
  return w.runnable_on(sched_getcpu()) != 0;  // when it cannot tell: as if it were
}

// A peer that began its round on this very CPU cannot arrive while this
// rank holds it (the scheduler keeps two ranks together for a while after a
// fork or a wake-up, on a machine with idle cores too): give the CPU away at
// once, and sleep if that does not bring the peer soon. Still together after
// two rounds while there are cores enough, the higher rank of the two moves
// (proc::CpuSharing: less often while the scheduler keeps putting it back).
void HostArena::wait_beside(int peer, uint32_t target, const LazyDeadline& deadline) {
  sharing_.beside(spin_ != Spin::kYield && rank_ > peer, [this] { return proc::move_off_cpu(cpu_); });
  const Line& c = line(peer);
  // On a crowded host, while yields hand the core to other work for a time
  // slice, sleep at once (YieldGauge), as wait_one() does.
  const bool crowded = spin_ == Spin::kYield;
  YieldGauge& gauge = YieldGauge::here();
  if (!crowded || gauge.spin()) {
    const auto give_up = Clock::now() + kSameCpuYield;
    do {
      const bool go_on = crowded ? gauge.yield() : (sched_yield(), true);
      if (reached(c.flag.load(std::memory_order_acquire), target)) return;
      if (!go_on) break;
    } while (Clock::now() < give_up);
  }
  sleep_on(peer, target, deadline);
}

// The peer has entered this round (or the next): its operation for this
// round stays in its line of this round's parity until it begins round + 2,
// which it cannot before this rank arrives in round + 1.
void HostArena::check_peer(int peer) {
  const Line& id = line(peer);
  if (id.seq == seq_ && id.fp == fp_) return;
  auto describe = [&](const Fingerprint& f) { return live_->describe(f); };
  throw Mismatch("collective mismatch with rank " + std::to_string(peer) +
                 " in shared memory: this rank runs seq " + std::to_string(seq_) + " " + describe(fp_) +
                 ", rank " + std::to_string(peer) + " runs seq " + std::to_string(id.seq) + " " +
                 describe(id.fp));
}

void HostArena::sleep_on(int peer, uint32_t target, const LazyDeadline& deadline) {
  Line& c = line(peer);
  std::atomic<uint32_t>& asleep = waiters(peer);
  const auto poll = std::chrono::milliseconds(abort_poll_ms_);
  auto next_check = Clock::now() + poll;
  for (;;) {
    asleep.fetch_add(1, std::memory_order_seq_cst);
    // The peer may have looked at `waiters` before this registration, with
    // its arrival still in its store buffer (arrive()): not woken, this rank
    // must see the arrival itself. A buffered store lands within a cache
    // line's transfer, so the counter is watched for a while longer before
    // the futex's own look at it (and the futex sleeps one slice at most).
    uint32_t v = c.flag.load(std::memory_order_seq_cst);
    for (const auto settled = Clock::now() + kStoreSettle; !reached(v, target) && Clock::now() < settled;) {
      cpu_relax();
      v = c.flag.load(std::memory_order_seq_cst);
    }
    if (!reached(v, target)) {
      timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kSleepSlice).count()};
      // EAGAIN, ETIMEDOUT and EINTR all mean: look again.
      if (futex(&c.flag, FUTEX_WAIT, v, &ts) == 0) {
        ++sleeps_.woken;
      } else if (errno == ETIMEDOUT) {
        ++sleeps_.slices_out;
      }
    }
    asleep.fetch_sub(1, std::memory_order_relaxed);
    if (reached(c.flag.load(std::memory_order_acquire), target)) return;
    if (auto e = live_->broken()) std::rethrow_exception(e);
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + poll;
      if (auto e = live_->check_abort(deadline.get())) std::rethrow_exception(e);
      if (auto e = live_->peer_gone(peer)) std::rethrow_exception(e);
      if (auto e = live_->order_check(peer)) std::rethrow_exception(e);
    }
    if (now >= deadline.get()) fail_wait(peer, target);
  }
}

// ---- single-copy reads ----------------------------------------------------

namespace {

// Up to `n` bytes at `addr` in process `pid` to `dst`: process_vm_readv's
// result.
ssize_t read_remote(int64_t pid, uint64_t addr, void* dst, size_t n) {
  iovec local{dst, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
}

}  // namespace

std::string HostArena::probe_reads(int* gone) const {
  if (gone) *gone = -1;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const Member& m = member(q);
    ArenaHeader theirs{};
    const ssize_t n = read_remote(m.pid, m.map, &theirs, sizeof(theirs));
    if (n < 0) {
      if (errno == ESRCH && gone) *gone = q;
      return "process_vm_readv of rank " + std::to_string(q) + ": " + errno_text();
    }
    if (n != static_cast<ssize_t>(sizeof(theirs)) || std::memcmp(&theirs, map_, sizeof(theirs)) != 0) {
      return "process_vm_readv of rank " + std::to_string(q) + " read something other than the arena";
    }
  }
  return "";
}

// Who may write into a rank's output this round, in the line's second cache
// line (the data of a small round, which a round with an output in the
// rank's own memory does not have): writers count themselves in before they
// look at `left`, the rank that leaves sets `left` before it counts them, so
// that (both sequentially consistent) either the writer sees `left` or the
// rank sees the writer and waits for it.
struct HostArena::WriteGuard {
  std::atomic<uint32_t> writers{0};
  std::atomic<uint32_t> left{0};
  uint64_t round = 0;  // kOutputMark ^ the round's seq: an output was published for this round
};

namespace {
// What makes a guard's `round` unlike anything else a line may hold (a
// slot round's inline data, a guard of an earlier round).
constexpr uint64_t kOutputMark = 0x6f75747075742121;  // "output!!"
}  // namespace

HostArena::WriteGuard& HostArena::guard(int r) const {
  static_assert(sizeof(WriteGuard) <= kNearBytes);
  return *reinterpret_cast<WriteGuard*>(line(r).near);
}

void HostArena::publish(const void* buf, void* out) {
  const uint64_t addr[2] = {reinterpret_cast<uintptr_t>(buf), reinterpret_cast<uintptr_t>(out)};
  static_assert(sizeof(addr) <= kInlineBytes);
  std::memcpy(line(rank_).data, addr, sizeof(addr));
  if (out) new (line(rank_).near) WriteGuard{.round = kOutputMark ^ seq_};  // read by peers only after arrive(1)
}

void HostArena::leave_writes(Clock::duration bound) {
  WriteGuard& g = guard(rank_);
  g.left.store(1, std::memory_order_seq_cst);
  const auto until = Clock::now() + bound;
  while (g.writers.load(std::memory_order_seq_cst) != 0 && Clock::now() < until) sched_yield();
}

void HostArena::read(int peer, void* dst, size_t n, size_t off) { remote_copy(peer, false, dst, off, n); }

bool HostArena::write(int peer, size_t off, const void* src, size_t n) {
  WriteGuard& g = guard(peer);
  // A peer that published no output this round (it runs another way of
  // the operation) has something else where the address would be: writing
  // there would land in whatever memory that names.
  if (g.round != (kOutputMark ^ seq_)) {
    throw InternalError("rank " + std::to_string(peer) + " published no output to write to for seq " +
                        std::to_string(seq_) + " (the ranks run different algorithms)");
  }
  g.writers.fetch_add(1, std::memory_order_seq_cst);
  const bool open = g.left.load(std::memory_order_seq_cst) == 0;
  try {
    if (open) remote_copy(peer, true, const_cast<void*>(src), off, n);
  } catch (...) {
    g.writers.fetch_sub(1, std::memory_order_release);
    throw;
  }
  g.writers.fetch_sub(1, std::memory_order_release);
  return open;
}

// A rank leaves an operation before its peers are done with its buffers
// only when the operation failed for it: a rank died, or another published
// a cause. That cause is what this rank must report too (a rank that
// named the peer whose buffer went away would blame a live one), and it may
// take an abort poll or two to be seen here.
std::exception_ptr HostArena::cause_of_leaving(int peer) {
  const auto poll = std::chrono::milliseconds(std::max(abort_poll_ms_, 1));
  const auto until = Clock::now() + 4 * poll;
  for (;;) {
    if (auto e = live_->broken()) return e;
    if (auto e = live_->check_abort(until)) return e;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || q == peer) continue;
      if (auto e = live_->peer_gone(q)) return e;
    }
    if (Clock::now() >= until) return nullptr;
    std::this_thread::sleep_for(std::min(poll / 10, std::chrono::milliseconds(25)));  // no event to wait on
  }
}

void HostArena::remote_copy(int peer, bool write, void* local, size_t off, size_t n) {
  uint64_t addr = 0;
  std::memcpy(&addr, line(peer).data + (write ? sizeof(addr) : 0), sizeof(addr));
  addr += off;
  const auto pid = static_cast<pid_t>(member(peer).pid);
  char* at = static_cast<char*>(local);
  while (n > 0) {
    iovec mine{at, n};
    iovec theirs{reinterpret_cast<void*>(addr), n};
    const ssize_t done = write ? process_vm_writev(pid, &mine, 1, &theirs, 1, 0)
                               : process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (done <= 0) {
      const int err = done < 0 ? errno : EIO;
      if (auto e = live_->peer_gone(peer)) std::rethrow_exception(e);
      if (err == EFAULT) {  // its buffer is gone: it left the operation
        if (auto e = cause_of_leaving(peer)) std::rethrow_exception(e);
      }
      const std::string what = std::string(write ? "writing to" : "reading") + " rank " + std::to_string(peer) +
                               "'s buffer (" + (write ? "process_vm_writev" : "process_vm_readv") + ", seq " +
                               std::to_string(seq_) + "): " + std::strerror(err);
      if (err == ESRCH) {  // gone, or a zombie: no memory left to copy
        std::rethrow_exception(live_->lost(peer, live_->name(peer), "its process is gone (" + what + ")"));
      }
      throw InternalError(what);
    }
    at += done;
    addr += static_cast<uint64_t>(done);
    n -= static_cast<size_t>(done);
  }
}

bool HostArena::claim(uint64_t total, uint64_t* piece) {
  auto* counter = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map_) + kClaimsOffset);
  const uint64_t got = counter->fetch_add(1, std::memory_order_relaxed) - claims_base_;
  if (got < total) {
    *piece = got;
    return true;
  }
  // Every rank has made its one failing claim of the last operation before
  // any makes one of this: the counter now ends at base + total + size.
  claims_base_ += total + static_cast<uint64_t>(size_);
  return false;
}

void HostArena::fail_wait(int peer, uint32_t target) {
  const int phase = (target & 1) ? 1 : 2;
  std::string waiting = live_->name(peer) + " to reach phase " + std::to_string(phase) +
                        " of a shared-memory round of seq " + std::to_string(seq_) +
                        " (" + live_->describe(fp_) + ")";
  std::rethrow_exception(live_->timed_out(waiting));
}

}  // namespace shoal::coll::arena
