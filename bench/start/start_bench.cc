// start_bench.cc — the start of a job of N ranks on one machine: rendezvous,
// address exchange and the first collective, with what each costs the store.
//
//   build/bin/shoal-start-bench [--ranks 64,256,1024] [--per-host 8] [--repeats 1]
//                               [--collective allreduce|barrier|none] [--algo SPEC]
//                               [--store launcher|tcpstore] [--out DIR]
//
// One process hosts the store and does nothing else, so that its CPU time
// is the store's whole cost: shoalrun's workers' store (`launcher`, what a
// job under shoalrun uses) or a TcpStore server (`tcpstore`, what
// Communicator::from_env's rank 0 hosts), both with the job's secret. The
// ranks are threads, `--per-host` to a process; each process stands for one
// host (its own SHOAL_HOST_ID and LOCAL_WORLD_SIZE). Every rank does what a
// rank of a real job does, through the same calls: it connects its own
// TcpStore client (the handshake proves SHOAL_SECRET), makes its communicator
// with Communicator::create (the job id, the secret, its address), runs a
// first collective of one float (the topology is read, the algorithm's
// connections are made) and a second (connected). Its store calls go through
// a CountingStore (counting_store.h).
//
// Prints, per run: the time from the common start until every rank had its
// store connection, its communicator, its first and second collective; the
// store requests and bytes per rank in creation and in the first collective;
// the peers whose address a rank read (the connections it made or accepted);
// the store process's CPU time, per rank and per request; the load average.
// With --out, one JSON line per start is appended to DIR/rows.jsonl
// (summarize.py turns them into a baseline's summary.json).
// SHOAL_SPIN_US defaults to 0 here: with hundreds of ranks per core a
// spinning wait only measures how the spinners share the two cores.
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "counting_store.h"
#include "shoal/communicator.h"
#include "shoal/error.h"
#include "workers_store.h"

namespace {

using shoal::bench::CountingStore;
using shoal::bench::StoreCounts;

struct Config {
  std::vector<int> ranks{64, 256, 1024};
  int per_host = 8;
  int repeats = 1;
  std::string collective = "allreduce";
  std::string algo;
  std::string store = "launcher";
  std::string out;  // a folder: one JSON line per start appended to <out>/rows.jsonl
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// What one rank reports to the parent, written whole into a pipe (under
// PIPE_BUF, so records of different processes never interleave).
struct Record {
  int32_t rank = -1;
  int32_t ok = 0;
  int64_t t_store = 0, t_created = 0, t_first = 0, t_second = 0;  // CLOCK_MONOTONIC ns
  StoreCounts create, first;
  char error[256] = {};
};
static_assert(sizeof(Record) <= PIPE_BUF, "a record must be written atomically");

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

StoreCounts minus(StoreCounts a, StoreCounts b) {
  return {a.requests - b.requests, a.bytes - b.bytes, a.addr_gets - b.addr_gets};
}

bool write_full(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads n bytes, giving up after `timeout_ms` without any.
bool read_full(int fd, void* p, size_t n, int timeout_ms) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int r = ::poll(&pf, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t got = ::read(fd, b, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    b += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

void run_collective(shoal::Communicator& c, const Config& cfg, int n) {
  if (cfg.collective == "barrier") {
    c.barrier()->wait();
    return;
  }
  float x = 1, y = 0;
  c.allreduce(&x, &y, 1, shoal::DataType::kFloat32, shoal::ReduceOp::kSum)->wait();
  if (y != static_cast<float>(n)) throw shoal::InternalError("allreduce: got " + std::to_string(y));
}

// One rank, as a thread of a host process; the communicator stays in *keep.
void run_rank(int rank, int n, uint16_t port, const Config& cfg, Record* rec,
              std::shared_ptr<shoal::Communicator>* keep) {
  rec->rank = rank;
  try {
    shoal::TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = port;
    so.timeout = cfg.timeout;
    so.connect_timeout = cfg.timeout;
    auto store = std::make_shared<CountingStore>(std::make_shared<shoal::TcpStore>(so));
    rec->t_store = now_ns();
    shoal::Options o;
    o.name = "start";
    o.advertise_host = "127.0.0.1";
    o.timeout = cfg.timeout;
    o.algorithms = cfg.algo;
    auto comm = shoal::Communicator::create(store, rank, n, o);
    rec->t_created = now_ns();
    rec->create = store->counts();
    if (cfg.collective != "none") {
      run_collective(*comm, cfg, n);
      rec->t_first = now_ns();
      rec->first = minus(store->counts(), rec->create);
      run_collective(*comm, cfg, n);
      rec->t_second = now_ns();
    }
    *keep = std::move(comm);
    rec->ok = 1;
  } catch (const std::exception& e) {
    std::snprintf(rec->error, sizeof(rec->error), "%s", e.what());
  }
}

// A host process: its ranks wait for the go byte, run, and report; the
// process then waits for the parent to close `quit` and leaves without
// destroying anything (a peer may still be finishing its collective).
[[noreturn]] void host_main(int first, int count, int n, uint16_t port, const Config& cfg, int ready, int go,
                            int results, int quit) {
  std::vector<Record> recs(static_cast<size_t>(count));
  std::vector<std::shared_ptr<shoal::Communicator>> keep(static_cast<size_t>(count));
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return started; });
      }
      run_rank(first + i, n, port, cfg, &recs[static_cast<size_t>(i)], &keep[static_cast<size_t>(i)]);
    });
  }
  char b = 'r';
  write_full(ready, &b, 1);
  if (!read_full(go, &b, 1, -1)) _exit(2);
  {
    std::lock_guard<std::mutex> l(mu);
    started = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  for (const auto& r : recs) write_full(results, &r, sizeof(r));
  while (::read(quit, &b, 1) > 0 || errno == EINTR) {
  }
  _exit(0);
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    r = fds[0];
    w = fds[1];
  }
};

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

template <class F>
std::vector<int64_t> sorted(const std::vector<Record>& recs, F f) {
  std::vector<int64_t> v;
  for (const auto& r : recs) v.push_back(f(r));
  std::sort(v.begin(), v.end());
  return v;
}

double mean(const std::vector<int64_t>& v) {
  double s = 0;
  for (int64_t x : v) s += static_cast<double>(x);
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

void loadavg(double* a) {
  if (getloadavg(a, 3) != 3) a[0] = a[1] = a[2] = -1;
}

// One start of n ranks; prints its row. False on a failure.
bool run_start(int n, const Config& cfg) {
  double load_before[3];
  loadavg(load_before);
  Pipe port_pipe, server_quit;
  const pid_t server = ::fork();
  if (server == 0) {
    std::unique_ptr<shoal::TcpStore> tcp;
    std::unique_ptr<shoalrun::WorkersStore> launcher;
    uint16_t port = 0;
    if (cfg.store == "launcher") {
      launcher = std::make_unique<shoalrun::WorkersStore>("127.0.0.1", 0, shoal::auth::Secret::from_env());
      port = launcher->port();
    } else {
      shoal::TcpStoreOptions so;
      so.host = "127.0.0.1";
      so.is_server = true;
      so.timeout = cfg.timeout;
      tcp = std::make_unique<shoal::TcpStore>(so);
      port = tcp->port();
    }
    write_full(port_pipe.w, &port, sizeof(port));
    char b;
    ::close(server_quit.w);
    while (::read(server_quit.r, &b, 1) > 0 || errno == EINTR) {
    }
    _exit(0);
  }
  ::close(server_quit.r);
  uint16_t port = 0;
  if (!read_full(port_pipe.r, &port, sizeof(port), 30000)) {
    std::fprintf(stderr, "the store process did not start\n");
    return false;
  }
  const int hosts = (n + cfg.per_host - 1) / cfg.per_host;
  Pipe ready, go, results, quit;
  std::vector<pid_t> pids;
  for (int h = 0; h < hosts; ++h) {
    const int first = h * cfg.per_host;
    const int count = std::min(cfg.per_host, n - first);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(quit.w);
      ::setenv("SHOAL_HOST_ID", ("start-bench-host-" + std::to_string(h)).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(count).c_str(), 1);
      host_main(first, count, n, port, cfg, ready.w, go.r, results.w, quit.r);
    }
    pids.push_back(pid);
  }
  ::close(quit.r);
  bool ok = true;
  for (int h = 0; h < hosts && ok; ++h) {
    char b;
    ok = read_full(ready.r, &b, 1, 60000);
  }
  const int64_t t0 = now_ns();
  std::vector<char> gos(static_cast<size_t>(hosts), 'g');
  write_full(go.w, gos.data(), gos.size());
  std::vector<Record> recs(static_cast<size_t>(n));
  for (int i = 0; i < n && ok; ++i) {
    Record r;
    ok = read_full(results.r, &r, sizeof(r), static_cast<int>(cfg.timeout.count()) + 60000);
    if (ok && r.rank >= 0 && r.rank < n) recs[static_cast<size_t>(r.rank)] = r;
  }
  ::close(quit.w);
  if (!ok) {
    for (pid_t p : pids) ::kill(p, SIGKILL);
  }
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  ::close(server_quit.w);
  int status = 0;
  rusage ru{};
  ::wait4(server, &status, 0, &ru);
  for (int fd : {port_pipe.r, port_pipe.w, ready.r, ready.w, go.r, go.w, results.r, results.w}) ::close(fd);
  double load_after[3];
  loadavg(load_after);
  if (!ok) {
    std::fprintf(stderr, "n=%d: a host process did not report (crashed or hung)\n", n);
    return false;
  }
  int failed = 0;
  for (const auto& r : recs) {
    if (r.ok) continue;
    if (failed++ < 5) std::fprintf(stderr, "n=%d rank %d: %s\n", n, r.rank, r.error);
  }
  if (failed > 0) {
    std::fprintf(stderr, "n=%d: %d ranks failed\n", n, failed);
    return false;
  }
  const bool coll = cfg.collective != "none";
  const auto store_done = sorted(recs, [&](const Record& r) { return r.t_store - t0; });
  const auto created = sorted(recs, [&](const Record& r) { return r.t_created - t0; });
  const auto firsts = sorted(recs, [&](const Record& r) { return r.t_first - t0; });
  const auto seconds = sorted(recs, [&](const Record& r) { return r.t_second - t0; });
  const auto first_own = sorted(recs, [&](const Record& r) { return r.t_first - r.t_created; });
  const auto second_own = sorted(recs, [&](const Record& r) { return r.t_second - r.t_first; });
  const auto creq = sorted(recs, [](const Record& r) { return r.create.requests; });
  const auto cbytes = sorted(recs, [](const Record& r) { return r.create.bytes; });
  const auto freq = sorted(recs, [](const Record& r) { return r.first.requests; });
  const auto fbytes = sorted(recs, [](const Record& r) { return r.first.bytes; });
  const auto peers = sorted(recs, [](const Record& r) { return r.first.addr_gets; });
  const double server_cpu_us =
      static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
  double requests = 0;
  for (const auto& r : recs) requests += static_cast<double>(r.create.requests + (coll ? r.first.requests : 0));
  std::printf("| %d | %d | %.0f | %.0f | %s | %s | %.1f / %lld | %.0f / %lld | %s | %s | %s | %.0f | %.1f | %.1f | "
              "%.1f-%.1f |\n",
              n, hosts, ms(store_done.back()), ms(created.back()),
              coll ? std::to_string(static_cast<long long>(ms(firsts.back()))).c_str() : "-",
              coll ? std::to_string(static_cast<long long>(ms(seconds.back()))).c_str() : "-", mean(creq),
              static_cast<long long>(creq.back()), mean(cbytes), static_cast<long long>(cbytes.back()),
              coll ? (std::to_string(mean(freq)).substr(0, 5) + " / " + std::to_string(freq.back())).c_str() : "-",
              coll ? (std::to_string(static_cast<long long>(mean(fbytes))) + " / " + std::to_string(fbytes.back())).c_str()
                   : "-",
              coll ? (std::to_string(mean(peers)).substr(0, 4) + " / " + std::to_string(peers.back())).c_str() : "-",
              server_cpu_us / 1000, server_cpu_us / n, requests > 0 ? server_cpu_us / requests : 0, load_before[0],
              load_after[0]);
  if (!cfg.out.empty()) {
    std::filesystem::create_directories(cfg.out);
    if (std::FILE* f = std::fopen((cfg.out + "/rows.jsonl").c_str(), "a")) {
      auto mid = [](const std::vector<int64_t>& v) { return v.empty() ? 0.0 : ms(v[v.size() / 2]); };
      std::fprintf(f,
                   "{\"store\": \"%s\", \"collective\": \"%s\", \"ranks\": %d, \"hosts\": %d, "
                   "\"stores_ms\": %.1f, \"created_ms\": %.1f, \"first_ms\": %.1f, \"second_ms\": %.1f, "
                   "\"first_own_median_ms\": %.2f, \"second_own_median_ms\": %.2f, "
                   "\"create_requests_mean\": %.2f, \"create_requests_max\": %lld, \"create_bytes_mean\": %.0f, "
                   "\"first_requests_mean\": %.2f, \"first_requests_max\": %lld, \"first_bytes_mean\": %.0f, "
                   "\"peers_mean\": %.2f, \"store_cpu_ms\": %.1f, \"store_cpu_us_per_rank\": %.1f, "
                   "\"store_cpu_us_per_request\": %.2f, \"load_before\": %.2f, \"load_after\": %.2f}\n",
                   cfg.store.c_str(), cfg.collective.c_str(), n, hosts, ms(store_done.back()), ms(created.back()),
                   coll ? ms(firsts.back()) : 0.0, coll ? ms(seconds.back()) : 0.0, coll ? mid(first_own) : 0.0,
                   coll ? mid(second_own) : 0.0, mean(creq), static_cast<long long>(creq.back()), mean(cbytes),
                   mean(freq), static_cast<long long>(freq.back()), mean(fbytes), mean(peers), server_cpu_us / 1000,
                   server_cpu_us / n, requests > 0 ? server_cpu_us / requests : 0, load_before[0], load_after[0]);
      std::fclose(f);
    }
  }
  if (coll) {
    std::printf("    first collective per rank: median %.1f ms, p90 %.1f; second: median %.2f ms, p90 %.2f\n",
                ms(first_own[first_own.size() / 2]), ms(first_own[first_own.size() * 9 / 10]),
                ms(second_own[second_own.size() / 2]), ms(second_own[second_own.size() * 9 / 10]));
  }
  std::fflush(stdout);
  return true;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    v.push_back(std::stoi(s.substr(at, comma - at)));
    at = comma + 1;
  }
  return v;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: shoal-start-bench [--ranks 64,256,1024] [--per-host 8] [--repeats 1]\n"
               "                         [--collective allreduce|barrier|none] [--algo SPEC] [--store launcher|tcpstore]\n"
               "                         [--timeout-s 120] [--out DIR]\n",
               why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("shoal-start-bench: the start of an N-rank job on one machine");
    if (i + 1 >= argc) usage(("missing a value after " + a).c_str());
    const std::string v = argv[++i];
    if (a == "--ranks") {
      cfg.ranks = parse_list(v);
    } else if (a == "--per-host") {
      cfg.per_host = std::stoi(v);
    } else if (a == "--repeats") {
      cfg.repeats = std::stoi(v);
    } else if (a == "--collective") {
      cfg.collective = v;
      if (v != "allreduce" && v != "barrier" && v != "none") usage("--collective: allreduce, barrier or none");
    } else if (a == "--store") {
      cfg.store = v;
      if (v != "launcher" && v != "tcpstore") usage("--store: launcher or tcpstore");
    } else if (a == "--out") {
      cfg.out = v;
    } else if (a == "--algo") {
      cfg.algo = v;
    } else if (a == "--timeout-s") {
      cfg.timeout = std::chrono::seconds(std::stoi(v));
    } else {
      usage(("unknown option " + a).c_str());
    }
  }
  if (cfg.per_host < 1) usage("--per-host: must be >= 1");
  for (int n : cfg.ranks) {
    if (n < 2) usage("--ranks: each must be >= 2");
  }
  ::setenv("SHOAL_SPIN_US", "0", 0);
  // The job's secret, as shoalrun sets it: every store connection proves it.
  if (!std::getenv("SHOAL_SECRET")) ::setenv("SHOAL_SECRET", "5ea1ed0f5ea1ed0f5ea1ed0f5ea1ed0f5ea1ed0f5ea1ed0f5ea1ed0f5ea1ed0f", 1);
  std::printf("| ranks | hosts | all stores connected (ms) | all created (ms) | all first collective (ms) | "
              "all second (ms) | create: requests / rank (mean / max) | create: bytes / rank (mean / max) | "
              "first: requests / rank (mean / max) | first: bytes / rank (mean / max) | first: peers read / rank "
              "(mean / max) | store CPU (ms) | store CPU / rank (us) | store CPU / request (us) | load 1-min "
              "before-after |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  std::fflush(stdout);
  bool ok = true;
  for (int n : cfg.ranks) {
    for (int k = 0; k < cfg.repeats; ++k) ok = run_start(n, cfg) && ok;
  }
  return ok ? 0 : 1;
}
