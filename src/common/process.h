// common/process.h — who a process is, so that a rank on the same machine can
// tell whether a peer's process still exists without any message from it.
//
// A token names a process by boot id, pid namespace, pid and start time (in
// clock ticks since boot), so a reused pid or a process in another pid
// namespace (containers that share a network namespace) is never mistaken
// for the peer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shoal::proc {

// This process's token, "<boot id>/<pid ns inode>/<pid>/<start time>", or ""
// when /proc does not tell (then nobody can probe this process).
std::string self_token();

// The token of process `pid` of this machine and pid namespace, as
// self_token() in that process would say it, or "" when it does not exist.
std::string token_of(int64_t pid);

enum class Liveness { kAlive, kGone, kUnknown };

// kGone when `token` names a process of this machine and pid namespace that
// has exited (or is a zombie); kUnknown when the token is empty or names a
// process elsewhere; kAlive otherwise. Reads /proc only: no signal is sent.
Liveness probe(const std::string& token);

// The pid field of a token ("" if it has none), for messages.
std::string pid_of(const std::string& token);

// The pid of the process `token` names when it is of this machine and pid
// namespace (a pid this process can look up in /proc), else 0.
int64_t local_pid(const std::string& token);

// Moves the calling thread off CPU `cpu` to another CPU of its affinity
// mask, then gives it its mask back (it stays where it was moved until the
// scheduler balances it). False, and nothing changed, when the mask has no
// other CPU. For two ranks that the scheduler keeps on one CPU while others
// are idle (collectives/arena/host_arena.cc).
bool move_off_cpu(int cpu);

// The state letter (field 3: 'R' running or queued to run, 'S' asleep, ...)
// and the CPU (field 39: where it runs, is queued, or last ran) of a line of
// /proc/<pid>/task/<tid>/stat; false if `line` is not one.
bool parse_task_stat(std::string_view line, char* state, int* cpu);

// This thread's id (gettid, read once per thread).
int this_tid();

// One thread of a process of this machine, watched through its
// /proc/<pid>/task/<tid>/stat, open while the watch lives: a look is one
// pread (about 2 us). For a rank that waits for a peer while holding its
// core: whether the peer is queued on that very core, behind the waiter
// (collectives/arena).
class TaskWatch {
 public:
  TaskWatch() = default;
  TaskWatch(const TaskWatch&) = delete;
  TaskWatch& operator=(const TaskWatch&) = delete;
  ~TaskWatch() { close(); }

  // Watches thread `tid` of process `pid` (opening its stat when either
  // changed); false when it cannot be opened.
  bool watch(int64_t pid, int tid);
  // 1 if the thread is running or queued on `cpu`, 0 if not, -1 when that
  // cannot be read.
  int runnable_on(int cpu) const;

 private:
  void close();
  int64_t pid_ = 0;
  int tid_ = 0;
  int fd_ = -1;
};

// When a rank that waits for a peer sharing its CPU should move (the caller
// moves, with move_off_cpu). Two ranks on one CPU take turns on it at every
// step while another core may be idle; the scheduler put them there (a woken
// thread goes beside its waker) and keeps busy threads where they are, and it
// may put them back together soon after a move. So: move once `kMoveAfter`
// waits in a row found the peer beside; after a move, let a hold-off of such
// waits pass before the next one, doubling it (up to kMaxHoldoff) while moves
// are undone soon; once a move held (kHeld waits found the peer apart), the
// next one comes without hold-off (bench/results/slow-starts-2ranks).
class CpuSharing {
 public:
  static constexpr int kMoveAfter = 2;
  static constexpr int kFirstHoldoff = 2;
  static constexpr int kMaxHoldoff = 4096;
  static constexpr int kHeld = 1024;

  // A wait that found the peer on another CPU.
  void apart() {
    streak_ = 0;
    if (apart_ < kHeld) ++apart_;
  }
  // A wait that found the peer on this thread's CPU. Calls `move` (which
  // returns whether the thread moved) when it is time and `may_move`;
  // returns whether it moved.
  template <class Move>
  bool beside(bool may_move, Move&& move) {
    if (apart_ >= kHeld) {  // the last move held (or there was none)
      holdoff_ = 0;
      next_ = kFirstHoldoff;
    }
    if (holdoff_ > 0) {
      --holdoff_;
      return false;
    }
    if (!may_move || ++streak_ < kMoveAfter) return false;
    streak_ = 0;
    apart_ = 0;
    if (!move()) {  // no other CPU to go to: do not ask again soon
      holdoff_ = kMaxHoldoff;
      return false;
    }
    holdoff_ = next_;
    next_ = next_ * 2 > kMaxHoldoff ? kMaxHoldoff : next_ * 2;
    return true;
  }

  // The hold-off the next move will set (for tests).
  int next_holdoff() const { return next_; }

 private:
  int streak_ = 0;            // waits in a row that found the peer beside
  int holdoff_ = 0;           // beside waits to pass before the next move
  int next_ = kFirstHoldoff;  // the hold-off after the next move
  int apart_ = kHeld;         // waits that found the peer apart since the last move (saturating)
};

}  // namespace shoal::proc
