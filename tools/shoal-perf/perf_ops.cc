// shoal-perf: buffers, issue and verification for each collective.
#include "perf_ops.h"

#include "kernels/element.h"
#include "kernels/reference.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>

namespace shoal::perf {
namespace {

struct Geometry {
  size_t send = 0, recv = 0;  // elements of each buffer on this rank
  size_t per = 0;             // elements per rank block (or the whole count)
  double busfactor = 1;
};

std::vector<std::string> kOps = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                                 "alltoall", "gather", "scatter", "barrier", "sendrecv"};

using kernels::get_element;
using kernels::put_element;

// The value rank r contributes at element i: small integers, exact in every dtype.
double val(DataType dt, ReduceOp op, int r, size_t i) {
  if (dt == DataType::kBool) return static_cast<double>((static_cast<size_t>(r) + i) % 2);
  if (op == ReduceOp::kProd) return ((i + static_cast<size_t>(r)) % 3 == 0) ? 2 : 1;
  return static_cast<double>(r + 1 + static_cast<int>(i % 5));
}

// The reduction over all ranks of element i, as the collective should compute it.
double reduced(const Config& c, int n, size_t i, double scale) {
  double acc = val(c.dtype, c.redop, 0, i) * (c.redop == ReduceOp::kPremulSum ? scale : 1);
  for (int r = 1; r < n; ++r) {
    double v = val(c.dtype, c.redop, r, i) * (c.redop == ReduceOp::kPremulSum ? scale : 1);
    acc = kernels::reference_combine(c.dtype, c.redop, acc, v);
  }
  if (c.redop == ReduceOp::kAvg) acc = is_floating(c.dtype) ? acc / n : std::trunc(acc / n);
  return acc;
}

bool close_enough(DataType dt, double got, double want) {
  if (!is_floating(dt)) return got == want;
  double tol = (dt == DataType::kFloat16 || dt == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

Geometry geometry(const std::string& op, size_t bytes, size_t es, int n) {
  Geometry g;
  const double nn = n;
  if (op == "allreduce" || op == "broadcast" || op == "reduce" || op == "sendrecv") {
    g.per = bytes / es;
    g.send = g.recv = g.per;
    g.busfactor = op == "allreduce" ? 2 * (nn - 1) / nn : 1;
  } else {
    g.per = bytes / es / static_cast<size_t>(n);
    size_t total = g.per * static_cast<size_t>(n);
    g.busfactor = (nn - 1) / nn;
    if (op == "allgather" || op == "gather") {
      g.send = g.per;
      g.recv = total;
    } else if (op == "reduce_scatter" || op == "scatter") {
      g.send = total;
      g.recv = g.per;
    } else {  // alltoall
      g.send = g.recv = total;
    }
  }
  return g;
}

volatile uint8_t touch_sink;  // what --touch loaded, so that the loads stay

// --touch: one store into every cache line of the input (the value it holds)
// and one load from every line of the output.
void touch(std::vector<uint8_t>& send, const std::vector<uint8_t>& recv) {
  for (size_t i = 0; i < send.size(); i += 64) {
    volatile uint8_t* p = send.data() + i;
    *p = *p;
  }
  uint8_t sum = 0;
  for (size_t i = 0; i < recv.size(); i += 64) sum ^= static_cast<const volatile uint8_t*>(recv.data())[i];
  touch_sink = sum;
}

}  // namespace

std::vector<std::string> op_names() { return kOps; }

int run(Communicator& comm, const Config& c) {
  const int n = comm.size(), me = comm.rank();
  const size_t es = dtype_size(c.dtype);
  const double scale = 0.5;
  OpOptions oo;
  oo.algorithm = c.algo;
  oo.scale = scale;
  oo.blocking = !c.queued;  // like MPI's blocking collectives
  OpOptions untimed;  // --barrier's: the algorithm forced for the op is not the barrier's
  untimed.blocking = oo.blocking;

  if (me == 0) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    if (!c.json) {
      std::printf("# shoal-perf: %s, %d ranks, %s %s, iters %d, warmup %d, check %s, in place %s, algorithm %s, %s%s\n",
                  c.op.c_str(), n, std::string(dtype_name(c.dtype)).c_str(),
                  std::string(reduce_op_name(c.redop)).c_str(), c.iters, c.warmup, c.check ? "on" : "off",
                  c.inplace ? "yes" : "no", c.algo.empty() ? "auto" : c.algo.c_str(),
                  c.queued ? "queued" : "blocking", c.barrier ? ", barrier before each iteration" : "");
      std::printf("# host %s, %ld cores; time = median of per-iteration times, slowest rank\n", host,
                  sysconf(_SC_NPROCESSORS_ONLN));
      std::printf("#%14s %12s %9s %6s %12s %12s %12s %8s\n", "bytes", "count", "dtype", "redop", "time_us",
                  "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    std::fflush(stdout);
  }

  std::vector<size_t> sizes;
  if (c.op == "barrier") {
    sizes.push_back(0);
  } else {
    for (size_t b = std::max<size_t>(c.min_bytes, 1); b <= c.max_bytes;) {
      sizes.push_back(b);
      size_t nb = b * static_cast<size_t>(c.factor);
      if (nb <= b) break;
      b = nb;
    }
  }

  int exit_code = 0;
  for (size_t bytes : sizes) {
    Geometry g = geometry(c.op, bytes, es, n);
    if (c.op != "barrier" && g.per == 0) continue;
    std::vector<uint8_t> sendbuf(std::max<size_t>(g.send, 1) * es), recvbuf(std::max<size_t>(g.recv, 1) * es);
    auto fill = [&] {
      if (c.op == "broadcast") {
        for (size_t i = 0; i < g.recv; ++i) put_element(c.dtype, recvbuf.data(), i, me == c.root ? val(c.dtype, c.redop, me, i) : 0);
        return;
      }
      for (size_t i = 0; i < g.send; ++i) put_element(c.dtype, sendbuf.data(), i, val(c.dtype, c.redop, me, i));
      std::fill(recvbuf.begin(), recvbuf.end(), 0);
      if (c.inplace && (c.op == "allreduce" || c.op == "reduce")) {
        std::memcpy(recvbuf.data(), sendbuf.data(), g.send * es);
      }
    };
    const void* s = sendbuf.data();
    void* r = recvbuf.data();
    const int next = (me + 1) % n, prev = (me - 1 + n) % n;
    // One call per iteration, chosen here once: the timed region holds the
    // collective and nothing of the harness's own (no name compared per call).
    const void* in = (c.inplace && (c.op == "allreduce" || c.op == "reduce")) ? r : s;
    std::function<void()> issue;
    if (c.op == "allreduce") issue = [&] { comm.allreduce(in, r, g.per, c.dtype, c.redop, oo)->wait(); };
    else if (c.op == "broadcast") issue = [&] { comm.broadcast(r, g.per, c.dtype, c.root, oo)->wait(); };
    else if (c.op == "reduce") issue = [&] { comm.reduce(in, r, g.per, c.dtype, c.redop, c.root, oo)->wait(); };
    else if (c.op == "allgather") issue = [&] { comm.allgather(s, r, g.per, c.dtype, oo)->wait(); };
    else if (c.op == "reduce_scatter") issue = [&] { comm.reduce_scatter(s, r, g.per, c.dtype, c.redop, oo)->wait(); };
    else if (c.op == "alltoall") issue = [&] { comm.alltoall(s, r, g.per, c.dtype, oo)->wait(); };
    else if (c.op == "gather") issue = [&] { comm.gather(s, r, g.per, c.dtype, c.root, oo)->wait(); };
    else if (c.op == "scatter") issue = [&] { comm.scatter(s, r, g.per, c.dtype, c.root, oo)->wait(); };
    else if (c.op == "barrier") issue = [&] { comm.barrier(oo)->wait(); };
    else if (c.op == "sendrecv" && n > 1) {
      issue = [&] {
        auto rw = comm.recv(r, g.per, c.dtype, prev, 0);
        auto sw = comm.send(s, g.per, c.dtype, next, 0);
        sw->wait();
        rw->wait();
      };
    } else {
      issue = [] {};  // sendrecv alone: nothing to send
    }

    fill();
    for (int i = 0; i < c.warmup; ++i) {
      issue();
      if (c.inplace) fill();
    }
    std::vector<double> times;
    times.reserve(static_cast<size_t>(c.iters));
    for (int i = 0; i < c.iters; ++i) {
      if (c.touch) touch(sendbuf, recvbuf);
      if (c.barrier) comm.barrier(untimed)->wait();
      auto t0 = std::chrono::steady_clock::now();
      issue();
      auto t1 = std::chrono::steady_clock::now();
      times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      if (c.inplace) fill();
    }
    std::sort(times.begin(), times.end());
    double med = times[times.size() / 2];
    if (times.size() % 2 == 0) med = 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);

    // Verification on a fresh run.
    int64_t wrong = 0;
    if (c.check) {
      fill();
      issue();
      if (c.op == "allreduce" || (c.op == "reduce" && me == c.root)) {
        for (size_t i = 0; i < g.per; ++i) wrong += !close_enough(c.dtype, get_element(c.dtype, r, i), reduced(c, n, i, scale));
      } else if (c.op == "broadcast") {
        for (size_t i = 0; i < g.per; ++i) wrong += !close_enough(c.dtype, get_element(c.dtype, r, i), val(c.dtype, c.redop, c.root, i));
      } else if (c.op == "allgather" || (c.op == "gather" && me == c.root)) {
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < g.per; ++i)
            wrong += !close_enough(c.dtype, get_element(c.dtype, r, q * g.per + i), val(c.dtype, c.redop, q, i));
      } else if (c.op == "reduce_scatter") {
        for (size_t i = 0; i < g.per; ++i)
          wrong += !close_enough(c.dtype, get_element(c.dtype, r, i), reduced(c, n, me * g.per + i, scale));
      } else if (c.op == "alltoall") {
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < g.per; ++i)
            wrong += !close_enough(c.dtype, get_element(c.dtype, r, q * g.per + i), val(c.dtype, c.redop, q, me * g.per + i));
      } else if (c.op == "scatter") {
        for (size_t i = 0; i < g.per; ++i)
          wrong += !close_enough(c.dtype, get_element(c.dtype, r, i), val(c.dtype, c.redop, c.root, me * g.per + i));
      } else if (c.op == "sendrecv" && n > 1) {
        for (size_t i = 0; i < g.per; ++i) wrong += !close_enough(c.dtype, get_element(c.dtype, r, i), val(c.dtype, c.redop, prev, i));
      }
    }
    // Slowest rank's median, total wrong elements.
    double stats[2] = {med, static_cast<double>(wrong)}, maxed[2] = {0, 0};
    comm.allreduce(&stats[0], &maxed[0], 1, DataType::kFloat64, ReduceOp::kMax)->wait();
    comm.allreduce(&stats[1], &maxed[1], 1, DataType::kFloat64, ReduceOp::kSum)->wait();
    const double t = maxed[0];
    const int64_t wrong_total = static_cast<int64_t>(maxed[1]);
    if (wrong_total) exit_code = 1;
    const size_t count = c.op == "barrier" ? 0 : (g.per * (g.send > g.per || g.recv > g.per ? static_cast<size_t>(n) : 1));
    const size_t shown_bytes = count * es;
    const double algbw = t > 0 ? static_cast<double>(shown_bytes) / (t * 1e3) : 0;
    const double busbw = algbw * g.busfactor;
    if (me == 0) {
      if (c.json) {
        std::printf("{\"impl\": \"shoal\", \"op\": \"%s\", \"np\": %d, \"bytes\": %zu, \"count\": %zu, \"dtype\": \"%s\", "
                    "\"redop\": \"%s\", \"algo\": \"%s\", \"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %lld}\n",
                    c.op.c_str(), n, shown_bytes, count, std::string(dtype_name(c.dtype)).c_str(),
                    std::string(reduce_op_name(c.redop)).c_str(), c.algo.empty() ? "auto" : c.algo.c_str(), t,
                    algbw, busbw, static_cast<long long>(wrong_total));
      } else {
        std::printf(" %14zu %12zu %9s %6s %12.2f %12.3f %12.3f %8s\n", shown_bytes, count,
                    std::string(dtype_name(c.dtype)).c_str(), std::string(reduce_op_name(c.redop)).c_str(), t,
                    algbw, busbw, c.check ? std::to_string(wrong_total).c_str() : "N/A");
      }
      std::fflush(stdout);
    }
  }
  return exit_code;
}

}  // namespace shoal::perf
