// shoalrun/output.h — the workers' output, one whole line at a time.
//
// Each worker's stdout and stderr arrive on pipes; complete lines go, as each
// stream's Route says, to the launcher's stdout/stderr prefixed with the rank
// ("[3]: ..."), and/or without prefix to <log_dir>/rank_<rank>.log; lines
// that contain one of the duplicate filters are also appended to
// <log_dir>/filtered_stdout.log or filtered_stderr.log (torchrun's
// --duplicate-std*-filters). A line is written in one piece under the
// launcher's output lock, so lines never interleave mid-line; a line longer
// than 64 KiB is cut into 64 KiB lines, and a last line without a newline is
// completed when its pipe closes. The last lines of each rank are kept for the
// failure summary. Main thread only.
#pragma once

#include <poll.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

namespace shoalrun {

class OutputMux {
 public:
  struct Config {
    std::string log_dir;    // where the files of Route::*_file and the filtered copies go
    int restart_count = 0;  // written as a marker into the log files on restarts
    std::vector<std::string> stdout_filters, stderr_filters;
  };
  // Where one worker's streams go (torchrun's --redirects, --tee and
  // --local-ranks-filter, worked out per local rank by the caller).
  struct Route {
    bool out_console = true, out_file = false;
    bool err_console = true, err_file = false;
  };

  explicit OutputMux(Config cfg) : cfg_(std::move(cfg)) {}
  ~OutputMux();
  OutputMux(const OutputMux&) = delete;
  OutputMux& operator=(const OutputMux&) = delete;

  // Takes ownership of the two read ends. Throws std::runtime_error when the
  // rank's log file cannot be opened.
  void add(int rank, int out_fd, int err_fd, Route route);
  void append_pollfds(std::vector<pollfd>* fds) const;
  // Reads what `fd` has (after poll said so) and emits the complete lines.
  void handle(int fd);
  bool any_open() const;
  // Emits pending partial lines and closes every pipe (after the drain timeout).
  void close_all();
  // The last lines of `rank` (both streams, oldest first).
  std::vector<std::string> tail(int rank) const;

 private:
  struct Stream {
    int rank = -1;
    bool is_err = false;
    bool console = true;
    bool file = false;
    std::string partial;
  };
  void emit(const Stream& s, const std::vector<std::string>& lines);
  void close_stream(int fd);

  Config cfg_;
  std::map<int, Stream> streams_;                      // by fd
  std::map<int, int> log_fds_;                         // rank -> file
  std::map<int, std::deque<std::string>> tails_;       // rank -> last lines
  int filtered_fds_[2] = {-1, -1};                     // filtered_stdout.log, filtered_stderr.log
};

}  // namespace shoalrun
