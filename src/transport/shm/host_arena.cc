// transport/shm/host_arena.cc — see host_arena.h.
#include "transport/shm/host_arena.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <sstream>

#include "common/process.h"
#include "shoal/error.h"

namespace shoal::transport::shm {
namespace {

constexpr uint32_t kArenaMagic = 0x53484152;  // "SHAR"
constexpr uint32_t kArenaVersion = 2;  // 2: the control block notes the CPU
constexpr size_t kPage = 4096;
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
// Spinning holds the core for this long, then yields it between polls.
constexpr auto kYieldAfter = std::chrono::microseconds(10);
// A waiter whose peer shares its CPU yields it for this long, then sleeps.
constexpr auto kSameCpuYield = std::chrono::microseconds(20);
// After this many waits in a row for a peer on its own CPU, a rank moves to
// another CPU of its affinity mask; it tries again only after this many more.
constexpr int kSameCpuMoveAfter = 16;
constexpr int kSameCpuMoveAgain = 4096;

struct ArenaHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t job;
  uint64_t size;
  uint64_t slot_bytes;
};

size_t page_up(size_t n) { return (n + kPage - 1) & ~(kPage - 1); }

// Counters are 32-bit (a futex word) and compared modulo 2^32: ranks are
// never more than one round apart.
bool reached(uint32_t v, uint32_t target) { return static_cast<int32_t>(v - target) >= 0; }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, ts, nullptr, 0);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

struct alignas(128) HostArena::Control {
  std::atomic<uint32_t> flag{0};     // 2k + phase of the rank's last arrival (mod 2^32)
  std::atomic<uint32_t> waiters{0};  // ranks asleep on `flag`
  struct OpId {
    uint64_t seq;
    Fingerprint fp;
  } op[2];  // the operation of the rank's round k, at k % 2 (written before phase 1)
  std::atomic<int32_t> cpu{-1};  // the CPU the rank ran on when it began its last round
};

namespace {

struct Layout {
  size_t ctl_off, data_off, slot, total;
};

Layout layout(int size, size_t slot_bytes) {
  Layout l;
  l.ctl_off = kPage;
  l.data_off = l.ctl_off + page_up(static_cast<size_t>(size) * 128);
  l.slot = page_up(slot_bytes);
  l.total = l.data_off + static_cast<size_t>(size) * 2 * l.slot;
  return l;
}

}  // namespace

HostArena::HostArena(int rank, int size, size_t slot_bytes, void* map, size_t map_bytes, int fd)
    : rank_(rank), size_(size), slot_bytes_(slot_bytes), map_(map), map_bytes_(map_bytes), fd_(fd) {
  Layout l = layout(size, slot_bytes);
  ctl_base_ = static_cast<char*>(map) + l.ctl_off;
  data_ = static_cast<char*>(map) + l.data_off;
  slot_bytes_ = l.slot;
  static_assert(sizeof(Control) == 128);
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
  for (int r = 0; r < size; ++r) new (static_cast<char*>(m) + l.ctl_off + static_cast<size_t>(r) * 128) Control();
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

HostArena::Control& HostArena::ctl(int r) const {
  return *reinterpret_cast<Control*>(ctl_base_ + static_cast<size_t>(r) * 128);
}

char* HostArena::slot(int r) const {
  const size_t buf = static_cast<size_t>((round_ - 1) & 1);
  return data_ + (static_cast<size_t>(r) * 2 + buf) * slot_bytes_;
}

void HostArena::begin(uint64_t seq, const Fingerprint& fp) {
  seq_ = seq;
  fp_ = fp;
  Control::OpId& id = ctl(rank_).op[round_ & 1];
  id.seq = seq;
  id.fp = fp;
  cpu_ = sched_getcpu();
  ctl(rank_).cpu.store(cpu_, std::memory_order_relaxed);
  ++round_;
}

void HostArena::arrive(int phase) {
  Control& c = ctl(rank_);
  // seq_cst: the store is ordered before the look at `waiters` (a sleeper
  // registers, then looks at the counter: one of the two sees the other).
  c.flag.store(static_cast<uint32_t>(2 * (round_ - 1) + static_cast<uint64_t>(phase)), std::memory_order_seq_cst);
  if (c.waiters.load(std::memory_order_seq_cst) != 0) futex(&c.flag, FUTEX_WAKE, INT_MAX, nullptr);
}

void HostArena::wait_all(int phase, Clock::time_point deadline) {
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) wait_one(q, phase, deadline);
  }
}

void HostArena::wait_one(int peer, int phase, Clock::time_point deadline) {
  const uint32_t target = static_cast<uint32_t>(2 * (round_ - 1) + static_cast<uint64_t>(phase));
  Control& c = ctl(peer);
  uint32_t v = c.flag.load(std::memory_order_acquire);
  if (!reached(v, target)) {
    if (cpu_ >= 0 && c.cpu.load(std::memory_order_relaxed) == cpu_) {
      wait_beside(peer, target, deadline);
      if (phase == 1) check_peer(peer);
      return;
    }
    same_cpu_waits_ = std::min(same_cpu_waits_, 0);
    Clock::time_point until{}, yield_from{};
    bool yielding = spin_yield_;
    for (unsigned i = 1;; ++i) {
      if (yielding) {
        sched_yield();
      } else {
        cpu_relax();
      }
      v = c.flag.load(std::memory_order_acquire);
      if (reached(v, target)) break;
      if ((i & 63) == 0) {
        if (hooks_.broken) {
          if (auto e = hooks_.broken()) std::rethrow_exception(e);
        }
        const auto now = Clock::now();
        if (i == 64) {  // the first look at the clock starts both windows
          until = now + std::chrono::microseconds(spin_us_);
          yield_from = now + kYieldAfter;
          continue;
        }
        // The peer may be waiting for this very core (the scheduler puts a
        // woken rank beside its waker): give it the core between polls.
        if (now >= yield_from) yielding = true;
        if (now >= until) {
          sleep_on(peer, target, deadline);
          v = c.flag.load(std::memory_order_acquire);
          break;
        }
      }
    }
  }
  if (phase == 1) check_peer(peer);
}

// A peer that began its round on this very CPU cannot arrive while this
// rank holds it (the scheduler keeps two ranks together for a while after a
// fork or a wake-up, on a machine with idle cores too): give the CPU away at
// once, and sleep if that does not bring the peer soon. Still together after
// many rounds while there are cores enough, the higher rank of the two moves
// (once in a while at most).
void HostArena::wait_beside(int peer, uint32_t target, Clock::time_point deadline) {
  if (++same_cpu_waits_ == kSameCpuMoveAfter && !spin_yield_ && rank_ > peer && proc::move_off_cpu(cpu_)) {
    same_cpu_waits_ = -kSameCpuMoveAgain;
  }
  const Control& c = ctl(peer);
  const auto give_up = Clock::now() + kSameCpuYield;
  do {
    sched_yield();
    if (reached(c.flag.load(std::memory_order_acquire), target)) return;
  } while (Clock::now() < give_up);
  sleep_on(peer, target, deadline);
}

// The peer has entered this round (or the next): its operation for this
// round stays in op[round % 2] until it begins round + 2, which it cannot
// before this rank arrives in round + 1.
void HostArena::check_peer(int peer) {
  const Control::OpId& id = ctl(peer).op[(round_ - 1) & 1];
  if (id.seq == seq_ && id.fp == fp_) return;
  auto describe = [&](const Fingerprint& f) {
    return hooks_.describe_fp ? hooks_.describe_fp(f) : std::string("an operation");
  };
  throw Mismatch("collective mismatch with rank " + std::to_string(peer) +
                 " in shared memory: this rank runs seq " + std::to_string(seq_) + " " + describe(fp_) +
                 ", rank " + std::to_string(peer) + " runs seq " + std::to_string(id.seq) + " " +
                 describe(id.fp));
}

void HostArena::sleep_on(int peer, uint32_t target, Clock::time_point deadline) {
  Control& c = ctl(peer);
  const auto poll = std::chrono::milliseconds(hooks_.abort_poll_ms);
  auto next_check = Clock::now() + poll;
  for (;;) {
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = c.flag.load(std::memory_order_seq_cst);
    if (!reached(v, target)) {
      timespec ts{0, std::chrono::duration_cast<std::chrono::nanoseconds>(kSleepSlice).count()};
      futex(&c.flag, FUTEX_WAIT, v, &ts);  // EAGAIN, ETIMEDOUT and EINTR all mean: look again
    }
    c.waiters.fetch_sub(1, std::memory_order_relaxed);
    if (reached(c.flag.load(std::memory_order_acquire), target)) return;
    if (hooks_.broken) {
      if (auto e = hooks_.broken()) std::rethrow_exception(e);
    }
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + poll;
      if (hooks_.check_abort) {
        if (auto e = hooks_.check_abort()) std::rethrow_exception(e);
      }
      if (hooks_.peer_gone) {
        if (auto e = hooks_.peer_gone(peer)) std::rethrow_exception(e);
      }
      if (hooks_.order_check) {
        if (auto e = hooks_.order_check(peer)) std::rethrow_exception(e);
      }
    }
    if (now >= deadline) fail_wait(peer, target);
  }
}

void HostArena::fail_wait(int peer, uint32_t target) {
  const int phase = (target & 1) ? 1 : 2;
  std::string waiting = "rank " + std::to_string(peer) + " to reach phase " + std::to_string(phase) +
                        " of a shared-memory round of seq " + std::to_string(seq_) +
                        (hooks_.describe_fp ? " (" + hooks_.describe_fp(fp_) + ")" : std::string());
  if (hooks_.timed_out) std::rethrow_exception(hooks_.timed_out(waiting));
  throw TimeoutError("timed out waiting for " + waiting);
}

}  // namespace shoal::transport::shm
