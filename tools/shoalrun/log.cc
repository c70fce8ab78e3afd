// shoalrun/log.cc — see log.h.
#include "log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace shoalrun {
namespace {

std::mutex g_output_mu;  // guards fds 1 and 2 of the launcher
std::atomic<bool> g_verbose{false};

}  // namespace

void write_all(int fd, const std::string& data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void write_locked(int fd, const std::string& data) {
  std::lock_guard<std::mutex> lock(g_output_mu);
  write_all(fd, data);
}

void log(const std::string& msg) {
  std::string line = "shoalrun: " + msg;
  if (line.empty() || line.back() != '\n') line += '\n';
  write_locked(STDERR_FILENO, line);
}

void vlog(const std::string& msg) {
  if (g_verbose.load(std::memory_order_relaxed)) log(msg);
}

void set_verbose(bool on) { g_verbose.store(on, std::memory_order_relaxed); }

bool verbose() { return g_verbose.load(std::memory_order_relaxed); }

}  // namespace shoalrun
