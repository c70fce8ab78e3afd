// core/observer.cc — the hooks, the dump file, SIGUSR1 and the observer's
// thread.
#include "core/observer.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>

#include "common/env.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/json_text.h"

namespace shoal::core {
namespace {

using coll::Coll;

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using coll::is_p2p;
using coll::is_reducing;
using coll::is_rooted;

// The element count every rank agrees on (as in the message fingerprint;
// alltoallv, which has none, gets what this rank sends).
uint64_t agreed_count(const Op& op) {
  uint64_t t = 0;
  switch (op.coll) {
    case Coll::kAllgatherv:
    case Coll::kReduceScatterv:
      for (size_t c : op.counts) t += c;
      return t;
    case Coll::kAlltoallv:
      for (size_t c : op.send_counts) t += c;
      return t;
    default: return op.args.count;
  }
}

// What is known of `op` when it is queued.
void fill_entry(TraceEntry& e, const Op& op) {
  e.seq = op.seq;
  e.coll = static_cast<uint8_t>(op.coll);
  e.dtype = static_cast<uint8_t>(op.args.dt);
  e.redop = is_reducing(op.coll) ? static_cast<int>(op.user_op) : -1;
  e.root = is_rooted(op.coll) ? op.args.root : -1;
  e.peer = is_p2p(op.coll) ? op.peer : -1;
  e.tag = is_p2p(op.coll) ? op.tag : -1;
  e.count = agreed_count(op);
  e.bytes = e.count * dtype_size(op.args.dt);
  e.algo = op.algo ? op.algo->name : std::string_view();
}

std::string first_line(std::exception_ptr err) {
  try {
    std::rethrow_exception(err);
  } catch (const std::exception& x) {
    std::string s = x.what();
    return s.substr(0, s.find('\n'));
  } catch (...) {
  }
  return "unknown error";
}

const char* dump_reason(std::exception_ptr cause, bool* dump) {
  *dump = true;
  try {
    std::rethrow_exception(cause);
  } catch (const Error& e) {
    switch (e.code()) {
      case ErrorCode::kTimeout: return "timeout";
      case ErrorCode::kPeerLost: return "peer_lost";
      case ErrorCode::kMismatch: return "mismatch";
      case ErrorCode::kStore: return "store";
      case ErrorCode::kAborted: *dump = false; return "aborted";
      default: return "error";
    }
  } catch (...) {
  }
  return "error";
}

// SIGUSR1: counted here, read by every observer thread. The handler only
// bumps a lock-free counter (async-signal-safe), then hands the signal on to
// the handler that was installed before.
std::atomic<uint64_t> g_dump_requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
struct sigaction g_previous_usr1;

void on_sigusr1(int sig, siginfo_t* info, void* uctx) {
  g_dump_requests.fetch_add(1, std::memory_order_relaxed);
  const struct sigaction& p = g_previous_usr1;
  if (p.sa_flags & SA_SIGINFO) {
    if (p.sa_sigaction) p.sa_sigaction(sig, info, uctx);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    p.sa_handler(sig);
  }
}

void install_sigusr1_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigusr1;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &g_previous_usr1);
  });
}

// Paths of the timelines this process writes, so that two communicators
// never write one file.
Mutex g_timeline_mu;
std::set<std::string> g_timeline_paths GUARDED_BY(g_timeline_mu);

std::string claim_timeline_path(std::string path, const std::string& comm) {
  MutexLock g(g_timeline_mu);
  if (!g_timeline_paths.insert(path).second) {
    size_t slash = path.rfind('/');
    size_t dot = path.rfind('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = path.size();
    path.insert(dot, "-" + comm);
    g_timeline_paths.insert(path);
  }
  return path;
}

}  // namespace

Observer::Observer(ObserverConfig cfg)
    : cfg_(std::move(cfg)),
      log_(cfg_.rank, parse_debug_level(env::get("SHOAL_DEBUG").value())),
      recorder_(static_cast<size_t>([] {
        int64_t n = env::get_int("SHOAL_TRACE_BUFFER").value();
        if (n < 0 || n > (int64_t{1} << 24)) throw InvalidArgument("SHOAL_TRACE_BUFFER: must be in [0, 16777216]");
        return n;
      }())),
      dump_dir_(env::get("SHOAL_TRACE_DIR").value()) {
  if (auto pattern = env::get("SHOAL_TIMELINE")) {
    std::string path = timeline_path(*pattern, cfg_.rank, cfg_.size, cfg_.comm_name, static_cast<long>(getpid()));
    timeline_ = std::make_unique<Timeline>(claim_timeline_path(path, cfg_.comm_name), cfg_.rank, cfg_.comm_name);
  }
  auto warn = stall_warn_setting();
  if (warn.count() > 0 && cfg_.size > 1) {
    stall_ = std::make_unique<StallInspector>(cfg_.store, cfg_.rank, cfg_.size, warn);
  }
  precise_ = timeline_ || log_.trace();
  peer_words_ = (static_cast<size_t>(cfg_.size) + 63) / 64;
  peer_bits_ = std::make_unique<std::atomic<uint64_t>[]>(peer_words_);
  changed_at_ns_.store(steady_ns());
  wall_offset_ns_.store(wall_us() * 1000 - steady_ns());
  if (recorder_.capacity() > 0) install_sigusr1_once();
  // The requests counted so far are not this observer's: a SIGUSR1 from
  // now on is, also one that comes before the thread first looks.
  const uint64_t signals = g_dump_requests.load();
  if (recorder_.capacity() > 0 || timeline_ || stall_) watcher_ = std::thread([this, signals] { watch(signals); });
}

Observer::~Observer() {
  {
    MutexLock g(watch_mu_);
    stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

// One clock read per hook, and of the kernel's coarse clock (a few ms
// resolution, 15-30 ns to read here against 60-150 ns for the precise one)
// unless a timeline or TRACE lines need microseconds. Wall time is derived
// from it with an offset the observer's thread refreshes.
int64_t Observer::now_ns() const {
  timespec ts;
  clock_gettime(precise_ ? CLOCK_MONOTONIC : CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t Observer::wall_us_at(int64_t steady) const {
  return (steady + wall_offset_ns_.load(std::memory_order_relaxed)) / 1000;
}

void Observer::enqueued(Op& op) { enqueued_at(op, now_ns(), true); }
void Observer::started(Op& op) { started_at(op, now_ns()); }

void Observer::started_now(Op& op) {
  const int64_t now = now_ns();
  enqueued_at(op, now, false);
  started_at(op, now);
  op.trace.unrecorded = recorder_.capacity() != 0;
}

void Observer::enqueued_at(Op& op, int64_t now, bool record) {
  if (!is_p2p(op.coll)) issued_.store(op.seq, std::memory_order_relaxed);
  op.trace.enqueued_us = wall_us_at(now);
  if (!record || recorder_.capacity() == 0) return;
  TraceEntry e;
  fill_entry(e, op);
  e.enqueued_us = op.trace.enqueued_us;
  op.trace.id = recorder_.enqueued(e);
}

void Observer::record_running(Op& op) {
  op.trace.id = recorder_.add_running([&](TraceEntry& e) {
    fill_entry(e, op);
    e.enqueued_us = op.trace.enqueued_us;
    e.started_us = op.trace.started_us;
  });
  op.trace.unrecorded = false;
}

void Observer::started_at(Op& op, int64_t now) {
  op.trace.started_us = wall_us_at(now);
  if (!is_p2p(op.coll)) {
    started_coll_.store(static_cast<uint8_t>(op.coll), std::memory_order_relaxed);
    started_at_ns_.store(now, std::memory_order_relaxed);
    changed_at_ns_.store(now, std::memory_order_relaxed);
    started_.store(op.seq, std::memory_order_release);
    return;  // recorded as running with its algorithm, in running()
  }
  if (op.trace.id) recorder_.started(op.trace.id, op.trace.started_us, {});
}

void Observer::running(Op& op, coll::Ctx& ctx) {
  if (log_.info()) {
    if (!told_communicator_) {
      told_communicator_ = true;
      std::ostringstream h;
      h << "communicator " << cfg_.comm_name << " (id " << std::hex << cfg_.comm_id << std::dec << "): rank "
        << cfg_.rank << " of " << cfg_.size << "; " << cfg_.settings;
      log_.communicator(h.str(), ctx.topology(), cfg_.is_local);
    }
    const bool forced = !op.opts.algorithm.empty() ||
                        (cfg_.overrides && cfg_.overrides->by_coll[static_cast<int>(op.coll)] != nullptr);
    log_.algorithm(op.coll, agreed_count(op) * dtype_size(op.args.dt), op.algo->name, forced);
  }
  if (recorder_.capacity() == 0 && !timeline_ && !log_.trace()) return;
  if (op.trace.id) {
    recorder_.started(op.trace.id, op.trace.started_us, op.algo->name);
  } else if (op.trace.unrecorded) {
    record_running(op);
  }
  for (size_t i = 0; i < peer_words_; ++i) peer_bits_[i].store(0, std::memory_order_relaxed);
  ctx.note_peers(peer_bits_.get());
  peers_of_ = op.trace.id ? op.trace.id : op.seq;
}

void Observer::finished(Op& op, std::exception_ptr err) {
  const int64_t now = now_ns();
  if (op.trace.unrecorded) record_running(op);  // ended without running (count 0, or failed before)
  if (!is_p2p(op.coll) && op.seq > ended_.load(std::memory_order_relaxed)) {
    changed_at_ns_.store(now, std::memory_order_relaxed);
    ended_.store(op.seq, std::memory_order_release);
  }
  if (recorder_.capacity() == 0 && !timeline_ && !log_.trace()) return;
  TraceEntry& e = scratch_;
  e.algo = op.algo ? op.algo->name : std::string_view();
  e.id = op.trace.id;
  e.enqueued_us = op.trace.enqueued_us;
  e.started_us = op.trace.started_us;
  e.ended_us = wall_us_at(now);
  e.state = err ? OpState::kFailed : OpState::kDone;
  if (err) {
    e.error = first_line(err);
  } else {
    e.error.clear();
  }
  e.peers.clear();
  if (is_p2p(op.coll)) {
    int p = op.req && op.req->source >= 0 ? op.req->source : op.peer;
    if (p >= 0) e.peers.push_back(p);
  } else if (peers_of_ == (op.trace.id ? op.trace.id : op.seq)) {
    for (size_t w = 0; w < peer_words_; ++w) {
      for (uint64_t bits = peer_bits_[w].load(std::memory_order_relaxed); bits; bits &= bits - 1) {
        e.peers.push_back(static_cast<int>(w * 64) + std::countr_zero(bits));
      }
    }
    peers_of_ = 0;
  }
  if (e.id) recorder_.ended(e.id, e.state, e.started_us, e.ended_us, e.algo, e.error, e.peers);
  if (!timeline_ && !log_.trace()) return;
  fill_entry(e, op);  // the whole entry, for the timeline and TRACE lines
  if (timeline_) timeline_->add(e);
  log_.operation(e);
}

void Observer::broke(std::exception_ptr cause) {
  bool want = false;
  const char* reason = dump_reason(cause, &want);
  if (!want || recorder_.capacity() == 0 || dumped_.exchange(true)) return;
  if (dump(reason, first_line(cause))) {
    std::string line = "shoal rank " + std::to_string(cfg_.rank) + ": flight recorder written to " + dump_path() +
                       " (read the dumps of all ranks with shoal-trace)\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

std::string Observer::dump_path() const {
  char id[24];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(cfg_.comm_id));
  return dump_dir_ + "/shoal-trace-" + id + "-rank" + std::to_string(cfg_.rank) + ".jsonl";
}

bool Observer::dump(const std::string& reason, const std::string& error) {
  if (recorder_.capacity() == 0) return false;
  std::lock_guard<std::mutex> g(dump_mu_);  // the executor and the observer's thread share the file
  std::vector<TraceEntry> entries = recorder_.snapshot();
  const Progress p = progress();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char id[24];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(cfg_.comm_id));
  std::ostringstream o;
  o << "{\"shoal_trace\":1,\"comm\":\"" << id << "\",\"name\":" << json_quote(cfg_.comm_name)
    << ",\"rank\":" << cfg_.rank << ",\"size\":" << cfg_.size << ",\"reason\":" << json_quote(reason)
    << ",\"host\":" << json_quote(host) << ",\"pid\":" << getpid() << ",\"time_us\":" << wall_us()
    << ",\"issued\":" << p.issued << ",\"started\":" << p.started << ",\"ended\":" << p.ended
    << ",\"capacity\":" << recorder_.capacity();
  if (!error.empty()) o << ",\"error\":" << json_quote(error);
  if (stall_) {
    // Where the other ranks said they were (their progress records), for
    // the ranks that leave no dump of their own.
    o << ",\"progress\":[";
    auto all = stall_->read_all(p);
    for (size_t r = 0; r < all.size(); ++r) {
      o << (r ? "," : "");
      if (!all[r]) {
        o << "null";
        continue;
      }
      o << "{\"issued\":" << all[r]->issued << ",\"started\":" << all[r]->started << ",\"ended\":" << all[r]->ended
        << ",\"op\":" << json_quote(coll::coll_name(static_cast<Coll>(all[r]->coll))) << "}";
    }
    o << "]";
  }
  o << "}\n";
  for (const auto& e : entries) o << trace_entry_json(e) << "\n";
  const std::string text = o.str();
  const std::string path = dump_path();
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

Progress Observer::progress() const {
  Progress p;
  p.ended = ended_.load(std::memory_order_acquire);
  p.started = started_.load(std::memory_order_acquire);
  p.issued = issued_.load(std::memory_order_relaxed);
  p.coll = started_coll_.load(std::memory_order_relaxed);
  return p;
}

void Observer::watch(uint64_t signals) {
  const auto period = stall_ ? stall_->period() : std::chrono::nanoseconds(std::chrono::milliseconds(500));
  MutexLock g(watch_mu_);
  for (;;) {
    const auto until = std::chrono::steady_clock::now() + period;
    while (!stop_ && g.wait_until(watch_cv_, until)) {
    }
    if (stop_) return;
    g.unlock();
    if (uint64_t s = g_dump_requests.load(); s != signals && recorder_.capacity() > 0) {
      signals = s;
      if (dump("signal")) {
        std::string line = "shoal rank " + std::to_string(cfg_.rank) + ": SIGUSR1: flight recorder written to " +
                           dump_path() + "\n";
        std::fwrite(line.data(), 1, line.size(), stderr);
      }
    }
    if (stall_) {
      using SC = std::chrono::steady_clock;
      auto at = [](int64_t ns) { return SC::time_point(std::chrono::nanoseconds(ns)); };
      stall_->tick(progress(), at(changed_at_ns_.load()), at(started_at_ns_.load()), SC::now());
    }
    if (timeline_) timeline_->flush();
    wall_offset_ns_.store(wall_us() * 1000 - steady_ns(), std::memory_order_relaxed);  // follows NTP's steps
    g.lock();
  }
}

}  // namespace core

namespace shoal {

// The communicator's side of the observer: who it is and the settings the
// INFO line reports.
core::ObserverConfig CommunicatorImpl::observer_config(uint64_t id, const std::string& shm_mode) {
  core::ObserverConfig c;
  c.rank = rank_;
  c.size = size_;
  c.comm_name = opts_.name.empty() ? "unnamed" : opts_.name;
  c.comm_id = id;
  c.store = store_;
  c.overrides = &overrides_;
  c.is_local = [this](int peer) { return hybrid_->is_local(view_.to_wire(peer)); };
  std::ostringstream s;
  s << "SHOAL_SHM=" << shm_mode << ", spin " << spin_us_ << " us when a caller drives, segment "
    << tuning_.segment_bytes << " B, timeout " << std::chrono::duration<double>(opts_.timeout).count() << " s";
  c.settings = s.str();
  return c;
}

}  // namespace shoal
