// common/process.cc — see process.h.
#include "common/process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "common/net.h"

namespace shoal::proc {
namespace {

std::string pid_namespace() {
  struct stat st{};
  if (::stat("/proc/self/ns/pid", &st) != 0) return "";
  return std::to_string(static_cast<unsigned long long>(st.st_ino));
}

// State letter and start time (fields 3 and 22 of /proc/<pid>/stat); false
// when the process does not exist.
bool read_stat(const std::string& pid, char* state, std::string* start) {
  std::ifstream f("/proc/" + pid + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return false;
  // The command name (field 2) is in parentheses and may hold spaces.
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> *state;
  for (int i = 4; i <= 22 && rest >> field; ++i) {
    if (i == 22) {
      *start = field;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string self_token() { return token_of(getpid()); }

std::string token_of(int64_t pid) {
  std::string boot = net::boot_id(), ns = pid_namespace();
  char state = 0;
  std::string start;
  if (pid <= 0 || boot.empty() || ns.empty() || !read_stat(std::to_string(pid), &state, &start)) return "";
  return boot + "/" + ns + "/" + std::to_string(pid) + "/" + start;
}

namespace {

// Positions of the three '/' of a token; false if it is not one.
bool split(const std::string& token, size_t* s1, size_t* s2, size_t* s3) {
  *s1 = token.find('/');
  *s2 = *s1 == std::string::npos ? *s1 : token.find('/', *s1 + 1);
  *s3 = *s2 == std::string::npos ? *s2 : token.find('/', *s2 + 1);
  return *s3 != std::string::npos;
}

}  // namespace

std::string pid_of(const std::string& token) {
  size_t s1, s2, s3;
  return split(token, &s1, &s2, &s3) ? token.substr(s2 + 1, s3 - s2 - 1) : "";
}

int64_t local_pid(const std::string& token) {
  size_t s1, s2, s3;
  if (!split(token, &s1, &s2, &s3)) return 0;
  if (token.substr(0, s1) != net::boot_id() || token.substr(s1 + 1, s2 - s1 - 1) != pid_namespace()) return 0;
  int64_t pid = 0;
  const std::string_view digits(token.data() + s2 + 1, s3 - s2 - 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  return ec == std::errc() && end == digits.data() + digits.size() && pid > 0 ? pid : 0;
}

Liveness probe(const std::string& token) {
  const int64_t pid = local_pid(token);
  if (pid == 0) return Liveness::kUnknown;
  char state = 0;
  std::string start;
  if (!read_stat(std::to_string(pid), &state, &start)) return Liveness::kGone;
  if (start != token.substr(token.rfind('/') + 1)) return Liveness::kGone;  // the pid was reused
  if (state == 'Z' || state == 'X') return Liveness::kGone;
  return Liveness::kAlive;
}

bool move_off_cpu(int cpu) {
  cpu_set_t mask, others;
  if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(mask), &mask) != 0) return false;
  others = mask;
  CPU_CLR(cpu, &others);
  if (CPU_COUNT(&others) == 0 || sched_setaffinity(0, sizeof(others), &others) != 0) return false;
  sched_setaffinity(0, sizeof(mask), &mask);
  return true;
}

bool parse_task_stat(std::string_view line, char* state, int* cpu) {
  // The command name (field 2) is in parentheses and may hold anything.
  const size_t close = line.rfind(')');
  if (close == std::string_view::npos) return false;
  std::string_view rest = line.substr(close + 1);
  auto next = [&rest](std::string_view* field) {
    const size_t b = rest.find_first_not_of(' ');
    if (b == std::string_view::npos) return false;
    const size_t e = rest.find(' ', b);
    *field = rest.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b);
    rest = e == std::string_view::npos ? std::string_view() : rest.substr(e);
    return true;
  };
  std::string_view field;
  if (!next(&field) || field.size() != 1) return false;
  const char s = field[0];
  for (int i = 4; i <= 39; ++i) {
    if (!next(&field)) return false;
  }
  int c = -1;
  const auto [end, err] = std::from_chars(field.data(), field.data() + field.size(), c);
  if (err != std::errc() || end != field.data() + field.size() || c < 0) return false;
  *state = s;
  *cpu = c;
  return true;
}

int this_tid() {
  static thread_local const int tid = static_cast<int>(gettid());
  return tid;
}

void TaskWatch::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool TaskWatch::watch(int64_t pid, int tid) {
  if (pid == pid_ && tid == tid_) return fd_ >= 0;
  close();
  pid_ = pid;
  tid_ = tid;
  if (pid <= 0 || tid <= 0) return false;
  const std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat";
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  return fd_ >= 0;
}

int TaskWatch::runnable_on(int cpu) const {
  if (fd_ < 0) return -1;
  char buf[1024];
  const ssize_t n = pread(fd_, buf, sizeof(buf), 0);
  char state = 0;
  int at = -1;
  if (n <= 0 || !parse_task_stat(std::string_view(buf, static_cast<size_t>(n)), &state, &at)) return -1;
  return state == 'R' && at == cpu ? 1 : 0;
}

}  // namespace shoal::proc
