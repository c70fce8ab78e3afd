// tests/cpp/harness.h — runs a function in N forked ranks over loopback.
//
// A helper process hosts a TcpStore on an ephemeral port; each child creates a
// Communicator against it, runs the body, and exits (with _exit, so the
// parent's objects copied by fork are never destroyed in the child). Output
// of every rank is captured; a child that runs past the job's timeout is
// killed. Inside a child, use SHOAL_CHECK / SHOAL_CHECK_EQ: a failure prints
// its location and the rank's context and makes the rank exit 1.
//
// A rank passes only if its body returned (or it left on purpose through
// test::leave): a child that exits 0 before that (an _exit or exit deep in
// the code under test) is reported by failures(), so a job can never pass
// with fewer ranks having run than it started.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shoal/communicator.h"
#include "shoal/store.h"

namespace shoal::test {

struct RankResult {
  int rank = 0;
  int exit_code = -1;  // -1 if killed by a signal
  int signal = 0;
  bool timed_out = false;
  bool finished = false;  // the body returned, or the rank called leave()
  std::string output;     // stdout and stderr, interleaved
};

struct JobOptions {
  Options comm;
  std::chrono::seconds timeout{180};
  std::map<std::string, std::string> env;  // set in every child before creating the communicator
  bool create_comm = true;                  // false: the body gets a null communicator
};

inline int& check_failures() {
  static int n = 0;
  return n;
}

// In a child: the write end of the pipe that tells the parent the rank finished.
inline int& finished_fd() {
  static int fd = -1;
  return fd;
}

inline void mark_finished() {
  char one = 1;
  if (finished_fd() >= 0 && ::write(finished_fd(), &one, 1) != 1) _exit(3);
}

// Ends a rank on purpose before its body returns (a rank that "dies" with
// its sockets closed by the kernel), counted as finished.
[[noreturn]] inline void leave(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  mark_finished();
  _exit(code);
}

#define SHOAL_CHECK(cond)                                                                \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "CHECK FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
      ++::shoal::test::check_failures();                                                 \
    }                                                                                    \
  } while (0)

#define SHOAL_CHECK_MSG(cond, msg)                                                       \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::ostringstream _o;                                                             \
      _o << msg;                                                                         \
      std::fprintf(stderr, "CHECK FAILED %s:%d: %s: %s\n", __FILE__, __LINE__, #cond,    \
                   _o.str().c_str());                                                    \
      ++::shoal::test::check_failures();                                                 \
    }                                                                                    \
  } while (0)

using Body = std::function<void(std::shared_ptr<Communicator>& comm, int rank, int size,
                                const std::shared_ptr<Store>& store)>;

// Hosts the job's store in a process of its own, so that this (the test)
// process stays single-threaded: forking while another thread holds an
// allocator lock deadlocks the child under AddressSanitizer. Returns the
// server's pid and port; the server exits when `keepalive` closes.
inline std::pair<pid_t, uint16_t> start_store_process(int* keepalive) {
  int portpipe[2], alive[2];
  if (pipe(portpipe) != 0 || pipe(alive) != 0) throw std::runtime_error("pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    ::close(portpipe[0]);
    ::close(alive[1]);
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.is_server = true;
    so.timeout = std::chrono::seconds(120);
    TcpStore server(so);
    uint16_t port = server.port();
    if (::write(portpipe[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    char c;
    while (::read(alive[0], &c, 1) > 0) {
    }
    _exit(0);  // the parent is done (or gone)
  }
  ::close(portpipe[1]);
  ::close(alive[0]);
  uint16_t port = 0;
  if (::read(portpipe[0], &port, sizeof(port)) != sizeof(port)) throw std::runtime_error("store process failed");
  ::close(portpipe[0]);
  *keepalive = alive[1];
  return {pid, port};
}

inline std::vector<RankResult> run_ranks(int n, const Body& body, JobOptions jo = {}) {
  int keepalive = -1;
  auto [store_pid, port] = start_store_process(&keepalive);
  std::fflush(stdout);
  std::fflush(stderr);

  std::vector<pid_t> pids(n);
  std::vector<int> fds(n), done(n);
  for (int r = 0; r < n; ++r) {
    int p[2], d[2];
    if (pipe(p) != 0 || pipe(d) != 0) throw std::runtime_error("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      ::close(p[0]);
      ::close(d[0]);
      finished_fd() = d[1];
      ::close(keepalive);
      dup2(p[1], 1);
      dup2(p[1], 2);
      ::close(p[1]);
      setvbuf(stdout, nullptr, _IOLBF, 0);
      for (auto& [k, v] : jo.env) setenv(k.c_str(), v.c_str(), 1);
      int code = 0;
      try {
        TcpStoreOptions co;
        co.host = "127.0.0.1";
        co.port = port;
        co.timeout = std::chrono::seconds(120);
        std::shared_ptr<Store> store = std::make_shared<TcpStore>(co);
        std::shared_ptr<Communicator> comm;
        if (jo.create_comm) comm = Communicator::create(store, r, n, jo.comm);
        body(comm, r, n, store);
        comm.reset();
        code = check_failures() ? 1 : 0;
        mark_finished();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: uncaught exception: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    ::close(p[1]);
    ::close(d[1]);
    pids[r] = pid;
    fds[r] = p[0];
    done[r] = d[0];
  }

  std::vector<RankResult> res(n);
  std::vector<bool> open(n, true), reaped(n, false);
  auto deadline = std::chrono::steady_clock::now() + jo.timeout;
  int left = n;
  while (left > 0) {
    std::vector<pollfd> pf;
    std::vector<int> who;
    for (int r = 0; r < n; ++r) {
      if (open[r]) {
        pf.push_back({fds[r], POLLIN, 0});
        who.push_back(r);
      }
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      for (int r = 0; r < n; ++r) {
        if (!reaped[r]) {
          res[r].timed_out = true;
          kill(pids[r], SIGKILL);
        }
      }
      deadline = now + std::chrono::seconds(10);
    }
    if (pf.empty()) break;
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count());
    ::poll(pf.data(), pf.size(), std::max(1, std::min(ms, 1000)));
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t k = ::read(pf[i].fd, buf, sizeof(buf));
      if (k > 0) {
        res[who[i]].output.append(buf, static_cast<size_t>(k));
      } else {
        open[who[i]] = false;
        ::close(pf[i].fd);
        --left;
      }
    }
  }
  ::close(keepalive);
  waitpid(store_pid, nullptr, 0);
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    res[r].rank = r;
    if (WIFEXITED(st)) res[r].exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) res[r].signal = WTERMSIG(st);
    char one = 0;
    res[r].finished = ::read(done[r], &one, 1) == 1;  // the child is gone: 0 (EOF) unless it wrote
    ::close(done[r]);
  }
  return res;
}

// A gtest-friendly summary: empty when every rank exited 0.
inline std::string failures(const std::vector<RankResult>& rs) {
  std::ostringstream o;
  for (const auto& r : rs) {
    if (r.exit_code == 0 && !r.timed_out && r.finished) continue;
    o << "rank " << r.rank << ": exit " << r.exit_code << " signal " << r.signal
      << (r.timed_out ? " TIMED OUT" : "")
      << (r.exit_code == 0 && !r.finished ? " before its body returned" : "") << "\n"
      << r.output.substr(0, 4000) << "\n";
  }
  return o.str();
}

}  // namespace shoal::test
