// core/timeline.h — SHOAL_TIMELINE: a Chrome/Perfetto trace (JSON array
// format) of every operation of one communicator, one file per rank, to open
// in ui.perfetto.dev or chrome://tracing and see where the time went.
//
// Each collective is a complete ("X") event on the rank's "collectives"
// track, from when it started to run until it ended, with its sequence
// number, sizes, dtype, algorithm and peers as arguments; the time it sat in
// the queue before that is an async event ("queued"), and sends and receives
// are async events of their own. Timestamps are wall-clock microseconds, so
// the files of all ranks line up when opened together.
//
// Events are written as operations end (buffered; flush() pushes them to the
// file) and the destructor closes the JSON array, so the file is valid JSON
// once the communicator is gone; a file cut short by a crash still opens in
// the viewers, which accept a missing closing bracket.
//
// Thread-safety: add() and flush() may be called from any thread (mu_).
#pragma once

#include <cstdio>
#include <mutex>

#include "common/thread_annotations.h"
#include <string>

#include "core/flight_recorder.h"

namespace shoal::core {

class Timeline {
 public:
  // Creates (truncates) `path`; throws InvalidArgument naming SHOAL_TIMELINE
  // when it cannot.
  Timeline(std::string path, int rank, const std::string& comm_name);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  const std::string& path() const { return path_; }
  // An operation that ended (state done or failed).
  void add(const TraceEntry& e);
  void flush();

 private:
  void write(const std::string& event) REQUIRES(mu_);

  const std::string path_;
  const int rank_;
  Mutex mu_;
  std::FILE* f_ GUARDED_BY(mu_) = nullptr;
  bool first_ GUARDED_BY(mu_) = true;
  uint64_t next_async_ GUARDED_BY(mu_) = 1;  // ids pairing async begin/end events
};

// The file for rank `rank` of communicator `comm`: %r becomes the rank, %c
// the communicator's name, %p the process id. Without %r (and with more than
// one rank) "-rank<r>" is added before the extension, so that ranks sharing a
// file system never write the same file.
std::string timeline_path(const std::string& pattern, int rank, int size, const std::string& comm, long pid);

}  // namespace shoal::core
