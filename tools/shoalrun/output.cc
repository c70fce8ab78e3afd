// shoalrun/output.cc — see output.h.
#include "output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "log.h"

namespace shoalrun {
namespace {

constexpr size_t kMaxLine = 64 * 1024;
constexpr size_t kTailLines = 20;
constexpr size_t kTailLineChars = 400;

}  // namespace

OutputMux::~OutputMux() {
  for (auto& [fd, s] : streams_) ::close(fd);
  for (auto& [rank, fd] : log_fds_) ::close(fd);
  for (int fd : filtered_fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void OutputMux::add(int rank, int out_fd, int err_fd, Route route) {
  streams_[out_fd] = Stream{rank, false, route.out_console, route.out_file, {}};
  streams_[err_fd] = Stream{rank, true, route.err_console, route.err_file, {}};
  tails_[rank].clear();
  if ((route.out_file || route.err_file) && log_fds_.count(rank) == 0) {
    const std::string path = cfg_.log_dir + "/rank_" + std::to_string(rank) + ".log";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
    log_fds_[rank] = fd;
    if (cfg_.restart_count > 0) {
      write_all(fd, "--- shoalrun: restart " + std::to_string(cfg_.restart_count) + " ---\n");
    }
  }
}

void OutputMux::append_pollfds(std::vector<pollfd>* fds) const {
  for (const auto& [fd, s] : streams_) fds->push_back(pollfd{fd, POLLIN, 0});
}

bool OutputMux::any_open() const { return !streams_.empty(); }

void OutputMux::emit(const Stream& s, const std::vector<std::string>& lines) {
  if (lines.empty()) return;
  auto& tail = tails_[s.rank];
  for (const auto& l : lines) {
    tail.push_back(l.size() > kTailLineChars ? l.substr(0, kTailLineChars) + "..." : l);
    if (tail.size() > kTailLines) tail.pop_front();
  }
  if (s.console) {
    std::string prefix(1, '[');
    prefix.append(std::to_string(s.rank)).append("]: ");
    std::string batch;
    for (const auto& l : lines) batch += prefix + l + "\n";
    write_locked(s.is_err ? STDERR_FILENO : STDOUT_FILENO, batch);
  }
  auto it = log_fds_.find(s.rank);
  if (s.file && it != log_fds_.end()) {
    std::string batch;
    for (const auto& l : lines) batch += l + "\n";
    write_all(it->second, batch);
  }
  const auto& filters = s.is_err ? cfg_.stderr_filters : cfg_.stdout_filters;
  if (filters.empty()) return;
  std::string batch;
  for (const auto& l : lines) {
    for (const auto& f : filters) {
      if (l.find(f) != std::string::npos) {
        batch.append(1, '[').append(std::to_string(s.rank)).append("]: ").append(l).append(1, '\n');
        break;
      }
    }
  }
  if (batch.empty()) return;
  int& fd = filtered_fds_[s.is_err ? 1 : 0];
  if (fd == -2) return;  // could not be opened: said once
  if (fd < 0) {
    const std::string path = cfg_.log_dir + (s.is_err ? "/filtered_stderr.log" : "/filtered_stdout.log");
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      log("cannot open " + path + ": " + std::strerror(errno));
      fd = -2;
      return;
    }
  }
  write_all(fd, batch);
}

void OutputMux::handle(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  char buf[65536];
  // A few reads at most, so that one chatty worker cannot starve the others.
  for (int i = 0; i < 4; ++i) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      close_stream(fd);
      return;
    }
    s.partial.append(buf, static_cast<size_t>(n));
    std::vector<std::string> lines;
    size_t start = 0;
    while (true) {
      const size_t nl = s.partial.find('\n', start);
      if (nl == std::string::npos) break;
      lines.push_back(s.partial.substr(start, nl - start));
      start = nl + 1;
    }
    s.partial.erase(0, start);
    while (s.partial.size() >= kMaxLine) {
      lines.push_back(s.partial.substr(0, kMaxLine));
      s.partial.erase(0, kMaxLine);
    }
    emit(s, lines);
    if (static_cast<size_t>(n) < sizeof(buf)) return;
  }
}

void OutputMux::close_stream(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return;
  if (!it->second.partial.empty()) emit(it->second, {it->second.partial});
  ::close(fd);
  streams_.erase(it);
}

void OutputMux::close_all() {
  while (!streams_.empty()) {
    const int fd = streams_.begin()->first;
    // Whatever is still buffered in the pipe, then the partial line.
    handle(fd);
    close_stream(fd);
  }
}

std::vector<std::string> OutputMux::tail(int rank) const {
  auto it = tails_.find(rank);
  if (it == tails_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

}  // namespace shoalrun
