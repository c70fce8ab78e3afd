// shoalrun/log.h — the launcher's own messages and the one lock on its output.
//
// Every write to the launcher's stdout or stderr (its own messages and the
// workers' prefixed lines) goes through write_locked(), so that no two lines
// ever interleave mid-line, whichever thread writes them. Thread-safe.
#pragma once

#include <string>

namespace shoalrun {

// Writes all of `data` to `fd` under the output lock (partial writes and EINTR
// retried; errors such as EPIPE are ignored: the launcher's own output going
// away must not stop the job).
// Writes all of `data` to `fd` (retrying on EINTR; gives up on other errors).
void write_all(int fd, const std::string& data);
void write_locked(int fd, const std::string& data);

// "shoalrun: <msg>\n" on stderr. Multi-line messages are written in one piece.
void log(const std::string& msg);
// The same, only when --verbose was given.
void vlog(const std::string& msg);
void set_verbose(bool on);
bool verbose();

}  // namespace shoalrun
