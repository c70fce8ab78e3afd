// shoalrun/process.cc — see process.h.
#include "process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

extern char** environ;

namespace shoalrun {
namespace {

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Async-signal-safe helpers for the forked child.
void child_write(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void child_reset_signals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    ::sigaction(s, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string stat;
    if (!std::getline(f, stat)) continue;
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 4 >= stat.size()) continue;
    // After ") ": state, then ppid.
    const char* p = stat.c_str() + paren + 2;
    while (*p && *p != ' ') ++p;
    const long ppid = std::strtol(p, nullptr, 10);
    if (ppid == parent) out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

[[noreturn]] void guardian_main(int rfd, const std::string& scratch_dir) {
  // Nothing to say and nothing to hold: the launcher's stdio may be pipes that
  // someone reads to EOF.
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    if (null_fd > 2) ::close(null_fd);
  }
  for (int s : forwarded_signals()) ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "shoalrun-guard", 0, 0, 0);
  std::set<pid_t> groups;
  std::string buf;
  char chunk[512];
  while (true) {
    const ssize_t n = ::read(rfd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      const std::string rec = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (rec.size() < 2) continue;
      const pid_t pg = static_cast<pid_t>(std::strtol(rec.c_str() + 1, nullptr, 10));
      if (pg <= 0) continue;
      if (rec[0] == '+') groups.insert(pg);
      if (rec[0] == '-') groups.erase(pg);
    }
  }
  for (pid_t pg : groups) ::kill(-pg, SIGKILL);
  if (!scratch_dir.empty()) {
    if (DIR* d = ::opendir(scratch_dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
        ::unlink((scratch_dir + "/" + e->d_name).c_str());
      }
      ::closedir(d);
    }
    ::rmdir(scratch_dir.c_str());
  }
  ::_exit(0);
}

}  // namespace

SpawnedWorker spawn_worker(const ExecSpec& spec) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(e));
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  const std::string exec_fail = "shoalrun: cannot execute '" + spec.path + "': errno ";
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: async-signal-safe calls only until execve.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (::getppid() != parent) ::_exit(128 + SIGKILL);  // the launcher is already gone
    child_reset_signals();
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execve(spec.path.c_str(), argv.data(), envp.data());
    const int e = errno;
    child_write(exec_fail.c_str());
    char num[16];
    int i = 15;
    num[i] = '\0';
    int v = e;
    do {
      num[--i] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0 && i > 0);
    child_write(num + i);
    child_write("\n");
    ::_exit(127);
  }
  const int fork_errno = errno;
  if (null_fd >= 0) ::close(null_fd);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (pid < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also from the parent, so that the group exists before any killpg
  ::fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  return SpawnedWorker{pid, out_pipe[0], err_pipe[0]};
}

void signal_worker(pid_t pid, int sig) {
  if (pid <= 0) return;
  if (::getpgid(pid) == pid) {
    ::kill(-pid, sig);
  } else {
    ::kill(pid, sig);
  }
}

int sweep_stray_children(pid_t keep, const std::vector<pid_t>& workers) {
  int killed = 0;
  for (int round = 0; round < 64; ++round) {
    std::vector<pid_t> stray;
    for (pid_t p : children_of(::getpid())) {
      bool skip = p == keep;
      for (pid_t w : workers) skip = skip || p == w;
      if (!skip) stray.push_back(p);
    }
    if (stray.empty()) break;
    for (pid_t p : stray) {
      ::kill(p, SIGKILL);
      ++killed;
    }
    for (pid_t p : stray) {
      int st;
      while (::waitpid(p, &st, 0) < 0 && errno == EINTR) {
      }
    }
  }
  return killed;
}

std::string find_executable(const std::string& name) {
  auto usable = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return usable(name) ? name : "";
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir.assign(1, '.');
    const std::string cand = dir + "/" + name;
    if (usable(cand)) return cand;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

Guardian::~Guardian() {
  if (fd_ >= 0) ::close(fd_);
}

void Guardian::start(const std::string& scratch_dir) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    ::close(p[1]);
    guardian_main(p[0], scratch_dir);
  }
  ::close(p[0]);
  pid_ = pid;
  fd_ = p[1];
}

void Guardian::send(char op, pid_t pgid) {
  if (fd_ < 0) return;
  const std::string rec = op + std::to_string(pgid) + "\n";  // < PIPE_BUF: one atomic write
  while (::write(fd_, rec.data(), rec.size()) < 0 && errno == EINTR) {
  }
}

void Guardian::track(pid_t pgid) { send('+', pgid); }

void Guardian::untrack(pid_t pgid) { send('-', pgid); }

void Guardian::stop() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (pid_ > 0) {
    int st;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

const std::vector<int>& forwarded_signals() {
  static const std::vector<int> sigs = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  return sigs;
}

bool is_terminating_signal(int sig) {
  return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT;
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

}  // namespace shoalrun
