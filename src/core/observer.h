// core/observer.h — what a communicator tells about itself, behind the few
// hooks the executor calls: the flight recorder (SHOAL_TRACE_BUFFER, dumped
// on a failure or SIGUSR1), the timeline (SHOAL_TIMELINE), SHOAL_DEBUG lines
// and the stall inspector (SHOAL_STALL_WARN). docs/observability.md.
//
// Threads: enqueued() runs on the caller thread under the queue's lock; the
// other hooks on the thread driving the communicator (under the drive lock),
// one at a time. A thread of the observer's own (started only when something
// needs it) does the periodic work: stall checks, SIGUSR1 dumps, timeline
// flushes. Every hook is a few stores when the features are at their
// defaults; none touches the store.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "common/thread_annotations.h"
#include <string>
#include <thread>
#include <vector>

#include "collectives/coll.h"
#include "collectives/registry.h"
#include "core/debug_log.h"
#include "core/flight_recorder.h"
#include "core/stall_inspector.h"
#include "core/timeline.h"
#include "shoal/store.h"

namespace shoal {

struct Op;

namespace core {

// What an operation carries for the observer (a member of Op).
struct OpTrace {
  uint64_t id = 0;  // the flight recorder's entry
  // Runs as it is issued (Observer::started_now): its entry is made once,
  // when it runs (running()), or when it ends without having run.
  bool unrecorded = false;
  int64_t enqueued_us = 0;
  int64_t started_us = 0;
};

struct ObserverConfig {
  int rank = 0;
  int size = 1;
  std::string comm_name;  // "c0", or Options::name
  uint64_t comm_id = 0;   // the communicator's unique id (the same on every rank)
  std::shared_ptr<Store> store;                 // the communicator's (prefixed)
  const coll::Overrides* overrides = nullptr;   // to tell forced algorithms
  std::function<bool(int peer)> is_local;       // messages to `peer` use shared memory
  std::string settings;                         // for the INFO line: "shm=1, ..."
};

class Observer {
 public:
  // Reads SHOAL_DEBUG, SHOAL_TRACE_BUFFER, SHOAL_TRACE_DIR, SHOAL_TIMELINE and
  // SHOAL_STALL_WARN (InvalidArgument naming a malformed one).
  explicit Observer(ObserverConfig cfg);
  ~Observer();
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  void enqueued(Op& op);
  void started(Op& op);
  // Both at one reading of the clock: an operation that runs as it is
  // issued (CommunicatorImpl::run_now).
  void started_now(Op& op);
  // A collective whose algorithm is chosen and about to run in `ctx`.
  void running(Op& op, coll::Ctx& ctx);
  // Any end of an operation: done (err null) or failed.
  void finished(Op& op, std::exception_ptr err);
  // The communicator broke with `cause`: dumps the recorder once (not for
  // aborts, which are local decisions).
  void broke(std::exception_ptr cause);
  // A SHOAL_DEBUG=INFO line about the communicator.
  void info(const std::string& text) const {
    if (log_.info()) log_.line(DebugLevel::kInfo, text);
  }

  // Writes the recorder to dump_path() (atomically: a temporary file renamed).
  // Returns false when the recorder is off or the file cannot be written.
  bool dump(const std::string& reason, const std::string& error = "");
  std::string dump_path() const;

 private:
  void enqueued_at(Op& op, int64_t now_ns, bool record);
  void record_running(Op& op);  // the flight recorder's entry for an unrecorded operation
  void started_at(Op& op, int64_t now_ns);
  void watch(uint64_t signals);  // the thread; `signals`: SIGUSR1s counted before it was made
  Progress progress() const;
  int64_t wall_us_at(int64_t steady_ns) const;
  int64_t now_ns() const;  // CLOCK_MONOTONIC, coarse unless precise_

  const ObserverConfig cfg_;
  DebugLog log_;
  FlightRecorder recorder_;
  std::string dump_dir_;
  std::unique_ptr<Timeline> timeline_;
  std::unique_ptr<StallInspector> stall_;
  bool precise_ = false;  // microsecond timestamps (timeline, TRACE); else the coarse clock

  // Progress of the collectives, for the stall inspector.
  std::atomic<uint64_t> issued_{0}, started_{0}, ended_{0};
  std::atomic<uint8_t> started_coll_{0};
  std::atomic<int64_t> started_at_ns_{0}, changed_at_ns_{0};  // steady clock
  std::atomic<int64_t> wall_offset_ns_{0};  // wall clock minus steady clock

  // The peers of the running collective, noted by its Ctx (one bit per rank).
  std::unique_ptr<std::atomic<uint64_t>[]> peer_bits_;
  size_t peer_words_ = 0;
  uint64_t peers_of_ = 0;   // the entry id the bits belong to (driving thread)
  TraceEntry scratch_;      // driving thread only: reused to record an end
  bool told_communicator_ = false;  // driving thread only: the INFO lines are out
  std::atomic<bool> dumped_{false};
  std::mutex dump_mu_;  // one dump at a time

  Mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stop_ GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;
};

}  // namespace core
}  // namespace shoal
