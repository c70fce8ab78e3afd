// shoal-perf — the collective benchmark, printing what nccl-tests prints.
//
//   shoal-perf --op allreduce --np 2 -b 8 -e 256M -f 2 --dtype float32
//              --iters 20 --warmup 5 --check [--format json]
//
// With --np it spawns that many local ranks itself (re-executing this binary,
// the parent hosts the rendezvous store); without it, it joins a job started
// by a launcher through RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT. Rank 0
// prints a header, then one row per size: bytes, count, dtype, redop, the
// median time of one operation (the slowest rank's median), algbw, busbw
// (nccl-tests' factors) and the number of wrong elements.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/registry.h"
#include "common/env.h"
#include "kernels/reduce.h"
#include "perf_ops.h"
#include "shoal/communicator.h"
#include "shoal/store.h"

namespace {

using shoal::perf::Config;

size_t parse_size(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) throw CLI::ValidationError(flag, "'" + s + "' is not a size");
  std::string suf(end);
  double mult = 1;
  if (suf == "K" || suf == "k" || suf == "KiB") mult = 1024.0;
  else if (suf == "M" || suf == "m" || suf == "MiB") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "g" || suf == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!suf.empty()) throw CLI::ValidationError(flag, "unknown suffix '" + suf + "' in '" + s + "'");
  // Checked before the conversion: a negative, NaN or huge double has no size_t.
  if (!(v >= 0) || v * mult > 0x1p50) {
    throw CLI::ValidationError(flag, "'" + s + "' is not a size from 0 to 1P bytes");
  }
  return static_cast<size_t>(v * mult);
}

// Spawns `np` children running this binary as ranks; returns the exit code.
int spawn(int np, const std::vector<std::string>& argv_tail) {
  shoal::TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.is_server = true;
  shoal::TcpStore store(so);
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    // Everything the child needs is built before fork: the store's thread
    // runs in this process, so the child must not allocate before exec.
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), argv_tail.begin(), argv_tail.end());
    args.insert(args.end(), {"--rank", std::to_string(r), "--world", std::to_string(np),
                             "--store-port", std::to_string(store.port())});
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      execv("/proc/self/exe", cargs.data());
      std::perror("shoal-perf: exec");
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  int left = np;
  while (left > 0) {
    int st = 0;
    pid_t p = wait(&st);
    if (p < 0) break;
    --left;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code != 0 && rc == 0) {
      rc = code;
      int rank = static_cast<int>(std::find(pids.begin(), pids.end(), p) - pids.begin());
      std::fprintf(stderr, "shoal-perf: rank %d failed (exit %d); stopping the others\n", rank, code);
      for (pid_t q : pids) {
        if (q != p) kill(q, SIGTERM);
      }
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"shoal-perf: benchmark shoal's collectives (nccl-tests style)"};
  Config cfg;
  std::string minb = "8", maxb = "256M", dtype = "float32", redop = "sum", format = "text";
  int np = 0, rank = -1, world = 0, store_port = 0;
  app.add_option("--op", cfg.op, "allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall, gather, scatter, barrier, sendrecv")
      ->check(CLI::IsMember(shoal::perf::op_names()));
  app.add_option("--np", np, "spawn this many local ranks (otherwise join through RANK/WORLD_SIZE/MASTER_*)")
      ->check(CLI::Range(1, 1024));
  app.add_option("-b,--minbytes", minb, "smallest size (bytes, K/M/G suffixes)");
  app.add_option("-e,--maxbytes", maxb, "largest size");
  app.add_option("-f,--stepfactor", cfg.factor, "size multiplier between rows")->check(CLI::Range(2, 1024));
  app.add_option("--dtype", dtype, "float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool");
  app.add_option("--redop", redop, "sum, prod, min, max, avg, premul_sum, band, bor, bxor");
  app.add_option("--root", cfg.root, "root rank of rooted collectives")->check(CLI::Range(0, 1023));
  app.add_option("--iters", cfg.iters, "timed iterations per size")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", cfg.warmup, "untimed iterations per size")->check(CLI::Range(0, 1000000));
  app.add_flag("--check", cfg.check, "verify results and count wrong elements");
  app.add_flag("--inplace", cfg.inplace, "run in place where the collective allows it");
  app.add_flag("--queued", cfg.queued,
               "issue each operation asynchronously and wait on it (the path of async callers) instead "
               "of as a blocking call, which runs small operations in the calling thread");
  app.add_flag("--barrier", cfg.barrier,
               "precede each timed iteration with an untimed barrier, as bench/compare/peers' Gloo and MPI "
               "runs do (otherwise iterations run back to back, and a rank late from the last one "
               "shows in the next one's time)");
  app.add_flag("--touch", cfg.touch,
               "before each timed iteration (untimed) every rank rewrites its input in place and reads "
               "its output, as a training step writes what it sends and reads what it received: the "
               "data then sits in the caches where a step leaves it, not where the last call did");
  app.add_option("--algo", cfg.algo, "force an algorithm by name (see docs/algorithms.md)");
  app.add_option("--format", format, "text or json")->check(CLI::IsMember({"text", "json"}));
  app.add_option("--rank", rank)->group("");  // internal: set by --np spawning
  app.add_option("--world", world)->group("");
  app.add_option("--store-port", store_port)->group("");
  bool knobs = false;
  app.add_flag("--knobs", knobs, "print the table of SHOAL_* knobs (docs/knobs.md's, in markdown) and exit");
  CLI11_PARSE(app, argc, argv);
  if (knobs) {
    std::fputs(shoal::env::markdown_table().c_str(), stdout);
    return 0;
  }

  try {
    cfg.min_bytes = parse_size("-b", minb);
    cfg.max_bytes = parse_size("-e", maxb);
  } catch (const CLI::ValidationError& e) {
    std::fprintf(stderr, "shoal-perf: %s\n", e.what());
    return 2;
  }
  if (cfg.max_bytes < cfg.min_bytes) {
    std::fprintf(stderr, "shoal-perf: -e (%zu) is smaller than -b (%zu)\n", cfg.max_bytes, cfg.min_bytes);
    return 2;
  }
  if (!shoal::parse_dtype(dtype, &cfg.dtype)) {
    std::fprintf(stderr, "shoal-perf: --dtype: unknown dtype '%s'\n", dtype.c_str());
    return 2;
  }
  if (!shoal::parse_reduce_op(redop, &cfg.redop)) {
    std::fprintf(stderr, "shoal-perf: --redop: unknown op '%s'\n", redop.c_str());
    return 2;
  }
  if (cfg.op != "barrier" && cfg.max_bytes == 0) {
    std::fprintf(stderr, "shoal-perf: -e: 0 bytes leaves no size to measure\n");
    return 2;
  }
  // What the library would refuse at the first operation, refused here, before
  // any rank starts (and with the flag's name).
  const bool reduces = cfg.op == "allreduce" || cfg.op == "reduce" || cfg.op == "reduce_scatter";
  const char* why = nullptr;
  if (reduces && !shoal::kernels::supported(cfg.dtype, cfg.redop, &why)) {
    std::string w = why ? why : "not supported";
    if (w.rfind("op: ", 0) == 0) w.erase(0, 4);
    std::fprintf(stderr, "shoal-perf: --redop %s: %s\n", redop.c_str(), w.c_str());
    return 2;
  }
  if (!cfg.algo.empty()) {
    shoal::coll::Coll coll;
    if (cfg.op == "sendrecv" || !shoal::coll::parse_coll(cfg.op, &coll)) {
      std::fprintf(stderr, "shoal-perf: --algo: %s has no algorithms to choose from\n", cfg.op.c_str());
      return 2;
    }
    if (!shoal::coll::find_algorithm(coll, cfg.algo)) {
      std::string known;
      for (auto* a : shoal::coll::algorithms(coll)) known += (known.empty() ? "" : ", ") + std::string(a->name);
      std::fprintf(stderr, "shoal-perf: --algo %s: not an algorithm of %s (known: %s)\n", cfg.algo.c_str(),
                   cfg.op.c_str(), known.c_str());
      return 2;
    }
  }
  cfg.json = format == "json";

  if (np > 0 && rank < 0) {
    // Parent: re-run ourselves as np ranks with the same options.
    std::vector<std::string> tail;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--np") {
        ++i;
        continue;
      }
      if (a.rfind("--np=", 0) == 0) continue;
      tail.push_back(a);
    }
    return spawn(np, tail);
  }

  try {
    std::shared_ptr<shoal::Communicator> comm;
    if (rank >= 0) {
      shoal::TcpStoreOptions so;
      so.host = "127.0.0.1";
      so.port = static_cast<uint16_t>(store_port);
      auto store = std::make_shared<shoal::TcpStore>(so);
      comm = shoal::Communicator::create(store, rank, world);
    } else {
      comm = shoal::Communicator::from_env();
    }
    if (cfg.root >= comm->size()) {
      std::fprintf(stderr, "shoal-perf: --root %d is out of range for %d ranks\n", cfg.root, comm->size());
      return 2;
    }
    return shoal::perf::run(*comm, cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-perf: %s\n", e.what());
    return 1;
  }
}
