// test_collectives.cc — every collective against a reference computed here,
// over world sizes {1,2,3,4,5,7,8}, counts {0,1,2,7,1023,65537,(1<<20)+3},
// every dtype x op, in place and out of place, with every algorithm forced.
//
// Values are small integers chosen so that every dtype represents every
// partial result exactly: integer results are compared exactly, and so are
// float results except AVG (one rounding of sum/n: 1e-2 relative for 16-bit
// floats, 1e-6 otherwise).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/coll.h"
#include "collectives/registry.h"
#include "harness.h"
#include "kernels/element.h"
#include "kernels/reference.h"

namespace shoal {
namespace {

using kernels::get_element;
using kernels::put_element;
using test::run_ranks;

const int kWorlds[] = {1, 2, 3, 4, 5, 7, 8};

// The sweep's breadth. The dtype x op x count matrix runs once per build, on
// the default transports (the shared arena and shared memory). The shm_copy.
// and tcp. runs (tests/cpp/CMakeLists.txt) set SHOAL_SHM to copy or 0: there
// the matrix keeps every count, algorithm and world size (what a transport
// can get wrong: segment and slot boundaries, message order) but only two
// dtypes of different widths and two ops, since the reduction kernels are
// the same whatever carried the bytes.
bool transport_sweep() {
  const char* v = std::getenv("SHOAL_SHM");
  return v != nullptr && *v != '\0' && std::string(v) != "1";
}

template <typename T>
std::vector<T> breadth(std::initializer_list<T> all, std::initializer_list<T> transport) {
  return transport_sweep() ? std::vector<T>(transport) : std::vector<T>(all);
}
const size_t kSmallCounts[] = {0, 1, 2, 7, 1023};
const size_t kLargeCounts[] = {65537, (size_t{1} << 20) + 3};

const DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                              DataType::kFloat64, DataType::kInt8,     DataType::kUInt8,
                              DataType::kInt32,   DataType::kInt64,    DataType::kBool};

bool valid(DataType dt, ReduceOp op) { return reduce_supported(dt, op); }

// What rank r contributes at element i, for op.
double value(DataType dt, ReduceOp op, int r, size_t i) {
  if (dt == DataType::kBool) return static_cast<double>((i * 3 + static_cast<size_t>(r)) % 2);
  if (op == ReduceOp::kProd) {
    size_t k = i + static_cast<size_t>(r);
    if (k % 5 == 0) return 2;
    if (k % 3 == 0 && dt != DataType::kUInt8) return -1;
    return 1;
  }
  if (op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) {
    return static_cast<double>((i * 37 + static_cast<size_t>(r) * 11) & 0x7f);
  }
  double v = static_cast<double>((static_cast<size_t>(r) * 7 + i * 3) % 11);
  return dt == DataType::kUInt8 ? v : v - 5;
}

constexpr double kScale = 0.5;

double reduced(DataType dt, ReduceOp op, int n, size_t i) {
  double f = op == ReduceOp::kPremulSum ? kScale : 1.0;
  double acc = value(dt, op, 0, i) * f;
  for (int r = 1; r < n; ++r) acc = kernels::reference_combine(dt, op, acc, value(dt, op, r, i) * f);
  if (op == ReduceOp::kAvg) acc = is_floating(dt) ? acc / n : std::trunc(acc / n);
  return acc;
}

// The reference stored in dt, read back: exactly what a correct result holds.
double as_stored(DataType dt, double v) {
  uint8_t buf[8];
  put_element(dt, buf, 0, v);
  return get_element(dt, buf, 0);
}

bool same(DataType dt, ReduceOp op, double got, double want) {
  want = as_stored(dt, want);
  if (got == want) return true;
  if (op != ReduceOp::kAvg || !is_floating(dt)) return false;
  double tol = (dt == DataType::kFloat16 || dt == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

struct Buf {
  DataType dt;
  std::vector<uint8_t> bytes;
  Buf(DataType d, size_t n) : dt(d), bytes(std::max<size_t>(n, 1) * dtype_size(d), 0xEE) {}
  void* data() { return bytes.data(); }
  double at(size_t i) const { return get_element(dt, bytes.data(), i); }
  void set(size_t i, double v) { put_element(dt, bytes.data(), i, v); }
};

// Every algorithm of `c`; the *_shared(_cma) ones need the shared arena, which
// the variants of this suite with messages only turn off (SHOAL_SHM=0 or
// SHOAL_SHM_ARENA_BYTES=0; a forced one then fails on every rank:
// Arena.ForcedWithoutArenaFailsOnEveryRank).
std::vector<std::string> algos(coll::Coll c) {
  const char* shm = std::getenv("SHOAL_SHM");
  const char* arena = std::getenv("SHOAL_SHM_ARENA_BYTES");
  const bool no_arena = (shm && std::string(shm) == "0") || (arena && std::string(arena) == "0");
  std::vector<std::string> out;
  for (auto* a : coll::algorithms(c)) {
    if (no_arena && a->name.substr(0, 6) == "shared") continue;
    out.emplace_back(a->name);
  }
  return out;
}

int g_errors_reported = 0;
#define EXPECT_ELEM(cond, what)                                                         \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      if (g_errors_reported++ < 10) SHOAL_CHECK_MSG(cond, what);                        \
      else ++::shoal::test::check_failures();                                           \
    }                                                                                   \
  } while (0)

// ---- allreduce / reduce -----------------------------------------------------

void check_allreduce(Communicator& c, const std::string& algo, DataType dt, ReduceOp op, size_t count,
                     bool in_place, int root /* -1: allreduce */) {
  const int n = c.size(), me = c.rank();
  Buf send(dt, count), recv(dt, count);
  for (size_t i = 0; i < count; ++i) send.set(i, value(dt, op, me, i));
  if (in_place) recv.bytes = send.bytes;
  OpOptions o;
  o.algorithm = algo;
  o.scale = kScale;
  const void* in = in_place ? recv.data() : send.data();
  if (root < 0) {
    c.allreduce(in, recv.data(), count, dt, op, o)->wait();
  } else {
    c.reduce(in, recv.data(), count, dt, op, root, o)->wait();
  }
  std::string ctx = std::string(root < 0 ? "allreduce " : "reduce ") + algo + " " +
                    std::string(dtype_name(dt)) + " " + std::string(reduce_op_name(op)) +
                    " n=" + std::to_string(n) + " count=" + std::to_string(count) +
                    (in_place ? " in-place" : "");
  if (root < 0 || me == root) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_ELEM(same(dt, op, recv.at(i), reduced(dt, op, n, i)),
                  ctx << " rank " << me << " i=" << i << " got " << recv.at(i) << " want "
                      << reduced(dt, op, n, i));
    }
  }
  if (!in_place) {
    for (size_t i = 0; i < count; ++i) {
      EXPECT_ELEM(send.at(i) == as_stored(dt, value(dt, op, me, i)), ctx << " modified send at " << i);
    }
  }
}

void sweep_reduce(int n, coll::Coll which) {
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    for (const auto& algo : algos(which)) {
      int root = which == coll::Coll::kReduce ? (n - 1) : -1;
      for (DataType dt : kAllTypes) {
        if (transport_sweep() && dt != DataType::kFloat32 && dt != DataType::kBFloat16) continue;
        for (int o = 0; o < kNumReduceOps; ++o) {
          auto op = static_cast<ReduceOp>(o);
          if (!valid(dt, op)) continue;
          if (transport_sweep() && op != ReduceOp::kSum && op != ReduceOp::kMax) continue;
          for (size_t count : kSmallCounts) {
            for (bool ip : {false, true}) check_allreduce(*c, algo, dt, op, count, ip, root);
          }
        }
      }
      // Large counts on a representative subset.
      const auto big = breadth<std::pair<DataType, ReduceOp>>({{DataType::kFloat32, ReduceOp::kSum},
                                                               {DataType::kBFloat16, ReduceOp::kSum},
                                                               {DataType::kFloat16, ReduceOp::kMax},
                                                               {DataType::kInt64, ReduceOp::kAvg},
                                                               {DataType::kUInt8, ReduceOp::kBxor}},
                                                              {{DataType::kFloat32, ReduceOp::kSum},
                                                               {DataType::kBFloat16, ReduceOp::kMax}});
      for (size_t count : kLargeCounts) {
        for (auto [dt, op] : big) check_allreduce(*c, algo, dt, op, count, count % 2 == 1 && dt == DataType::kFloat32, root);
      }
      (void)me;
    }
  });
  EXPECT_EQ(test::failures(res), "") << "world size " << n;
}

class WorldSize : public ::testing::TestWithParam<int> {};

TEST_P(WorldSize, Allreduce) { sweep_reduce(GetParam(), coll::Coll::kAllreduce); }
TEST_P(WorldSize, Reduce) { sweep_reduce(GetParam(), coll::Coll::kReduce); }

// ---- data movement collectives ---------------------------------------------

// Element i of rank r's contribution, distinct across ranks and positions.
double tagval(int r, size_t i) { return static_cast<double>((static_cast<size_t>(r) * 13 + i) % 101); }

double stored(DataType dt, double v) { return as_stored(dt, v); }

TEST_P(WorldSize, BroadcastGatherScatterAllgather) {
  const int n = GetParam();
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
    counts.insert(counts.end(), std::begin(kLargeCounts), std::end(kLargeCounts));
    for (DataType dt : breadth<DataType>({DataType::kFloat32, DataType::kFloat16, DataType::kInt64, DataType::kUInt8,
                                          DataType::kBool},
                                         {DataType::kFloat32, DataType::kUInt8})) {
      for (size_t count : counts) {
        if (count > 70000 && dt != DataType::kFloat32 && dt != DataType::kUInt8) continue;
        const int root = static_cast<int>(count % static_cast<size_t>(n));
        std::string base = std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " count=" +
                           std::to_string(count) + " root=" + std::to_string(root);
        for (const auto& algo : algos(coll::Coll::kBroadcast)) {
          Buf b(dt, count);
          for (size_t i = 0; i < count; ++i) b.set(i, me == root ? tagval(root, i) : 0);
          OpOptions o;
          o.algorithm = algo;
          c->broadcast(b.data(), count, dt, root, o)->wait();
          for (size_t i = 0; i < count; ++i) {
            EXPECT_ELEM(b.at(i) == stored(dt, tagval(root, i)), "broadcast " << algo << " " << base << " i=" << i);
          }
        }
        for (const auto& algo : algos(coll::Coll::kAllgather)) {
          for (bool ip : {false, true}) {
            Buf s(dt, count), r(dt, count * n);
            for (size_t i = 0; i < count; ++i) s.set(i, tagval(me, i));
            const void* in = s.data();
            if (ip) {
              std::memcpy(r.bytes.data() + count * dtype_size(dt) * me, s.bytes.data(), count * dtype_size(dt));
              in = r.bytes.data() + count * dtype_size(dt) * me;
            }
            OpOptions o;
            o.algorithm = algo;
            c->allgather(in, r.data(), count, dt, o)->wait();
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < count; ++i)
                EXPECT_ELEM(r.at(q * count + i) == stored(dt, tagval(q, i)),
                            "allgather " << algo << " " << base << (ip ? " in-place" : "") << " block " << q << " i=" << i);
          }
        }
        for (const auto& algo : algos(coll::Coll::kGather)) {
          Buf s(dt, count), r(dt, count * n);
          for (size_t i = 0; i < count; ++i) s.set(i, tagval(me, i));
          OpOptions o;
          o.algorithm = algo;
          c->gather(s.data(), me == root ? r.data() : nullptr, count, dt, root, o)->wait();
          if (me == root) {
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < count; ++i)
                EXPECT_ELEM(r.at(q * count + i) == stored(dt, tagval(q, i)),
                            "gather " << algo << " " << base << " block " << q << " i=" << i);
          }
        }
        for (const auto& algo : algos(coll::Coll::kScatter)) {
          Buf s(dt, count * n), r(dt, count);
          if (me == root) {
            for (int q = 0; q < n; ++q)
              for (size_t i = 0; i < count; ++i) s.set(q * count + i, tagval(q, i));
          }
          OpOptions o;
          o.algorithm = algo;
          c->scatter(me == root ? s.data() : nullptr, r.data(), count, dt, root, o)->wait();
          for (size_t i = 0; i < count; ++i)
            EXPECT_ELEM(r.at(i) == stored(dt, tagval(me, i)), "scatter " << algo << " " << base << " i=" << i);
        }
      }
    }
  });
  EXPECT_EQ(test::failures(res), "") << "world size " << n;
}

TEST_P(WorldSize, ReduceScatterAlltoallAndV) {
  const int n = GetParam();
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    std::vector<size_t> counts(std::begin(kSmallCounts), std::end(kSmallCounts));
    counts.push_back(65537);
    for (size_t count : counts) {
      for (DataType dt : breadth<DataType>({DataType::kFloat32, DataType::kBFloat16, DataType::kInt32, DataType::kBool},
                                           {DataType::kFloat32, DataType::kBFloat16})) {
        for (ReduceOp op : breadth<ReduceOp>({ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg, ReduceOp::kPremulSum,
                                              ReduceOp::kBxor},
                                             {ReduceOp::kSum, ReduceOp::kMax})) {
          if (!valid(dt, op)) continue;
          std::string base = std::string(dtype_name(dt)) + " " + std::string(reduce_op_name(op)) +
                             " n=" + std::to_string(n) + " count=" + std::to_string(count);
          Buf s(dt, count * n), r(dt, count);
          for (size_t i = 0; i < count * n; ++i) s.set(i, value(dt, op, me, i));
          OpOptions o;
          o.scale = kScale;
          for (const auto& algo : algos(coll::Coll::kReduceScatter)) {
            o.algorithm = algo;
            std::fill(r.bytes.begin(), r.bytes.end(), uint8_t{0xA5});
            c->reduce_scatter(s.data(), r.data(), count, dt, op, o)->wait();
            for (size_t i = 0; i < count; ++i)
              EXPECT_ELEM(same(dt, op, r.at(i), reduced(dt, op, n, me * count + i)),
                          "reduce_scatter " << algo << " " << base << " i=" << i << " got " << r.at(i));
          }
          o.algorithm.clear();
          // Variable counts: rank q receives count + q elements (rank 0 maybe none).
          std::vector<size_t> rc(n);
          for (int q = 0; q < n; ++q) rc[q] = (count + static_cast<size_t>(q)) % (count + 2);
          size_t total = std::accumulate(rc.begin(), rc.end(), size_t{0});
          size_t off = std::accumulate(rc.begin(), rc.begin() + me, size_t{0});
          Buf sv(dt, total), rv(dt, rc[me]);
          for (size_t i = 0; i < total; ++i) sv.set(i, value(dt, op, me, i));
          c->reduce_scatterv(sv.data(), rv.data(), rc, dt, op, o)->wait();
          for (size_t i = 0; i < rc[me]; ++i)
            EXPECT_ELEM(same(dt, op, rv.at(i), reduced(dt, op, n, off + i)),
                        "reduce_scatterv " << base << " i=" << i << " got " << rv.at(i));
        }
      }
      for (DataType dt : {DataType::kFloat32, DataType::kInt8}) {
        std::string base = std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " count=" + std::to_string(count);
        for (bool ip : {false, true}) {
          Buf s(dt, count * n), r(dt, count * n);
          // Block for rank q: tagval(me * n + q, i).
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i) s.set(q * count + i, tagval(me * n + q, i));
          if (ip) r.bytes = s.bytes;
          c->alltoall(ip ? r.data() : s.data(), r.data(), count, dt)->wait();
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              EXPECT_ELEM(r.at(q * count + i) == stored(dt, tagval(q * n + me, i)),
                          "alltoall " << base << (ip ? " in-place" : "") << " from " << q << " i=" << i);
        }
        // alltoallv: rank a sends (a + b + count) % 5 elements to rank b.
        auto cnt = [&](int a, int b) { return (static_cast<size_t>(a + b) + count) % 5 * (count > 100 ? 97 : 1); };
        std::vector<size_t> sc(n), rcv(n);
        for (int q = 0; q < n; ++q) {
          sc[q] = cnt(me, q);
          rcv[q] = cnt(q, me);
        }
        size_t st = std::accumulate(sc.begin(), sc.end(), size_t{0}), rt = std::accumulate(rcv.begin(), rcv.end(), size_t{0});
        Buf s(dt, st), r(dt, rt);
        size_t off = 0;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < sc[q]; ++i) s.set(off++, tagval(me * n + q, i));
        c->alltoallv(s.data(), sc, {}, r.data(), rcv, {}, dt)->wait();
        off = 0;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < rcv[q]; ++i, ++off)
            EXPECT_ELEM(r.at(off) == stored(dt, tagval(q * n + me, i)), "alltoallv " << base << " from " << q << " i=" << i);
        // allgatherv: rank q contributes (q + count) % 4 elements.
        std::vector<size_t> gc(n);
        for (int q = 0; q < n; ++q) gc[q] = (static_cast<size_t>(q) + count) % 4 * (count > 100 ? 101 : 1);
        size_t gt = std::accumulate(gc.begin(), gc.end(), size_t{0});
        Buf gs(dt, gc[me]), gr(dt, gt);
        for (size_t i = 0; i < gc[me]; ++i) gs.set(i, tagval(me, i));
        c->allgatherv(gs.data(), gr.data(), gc, {}, dt)->wait();
        off = 0;
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < gc[q]; ++i, ++off)
            EXPECT_ELEM(gr.at(off) == stored(dt, tagval(q, i)), "allgatherv " << base << " from " << q << " i=" << i);
      }
    }
    c->barrier()->wait();
  });
  EXPECT_EQ(test::failures(res), "") << "world size " << n;
}

TEST_P(WorldSize, SendRecvAndAnySource) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  auto res = run_ranks(n, [&](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    const int next = (me + 1) % n, prev = (me - 1 + n) % n;
    for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, size_t{1} << 20}) {
      std::vector<float> out(count), in(count, -1);
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<float>(me * 1000 + static_cast<int>(i % 1000));
      // Receive posted after the send on every rank: must not deadlock.
      auto sw = c->send(out.data(), count, DataType::kFloat32, next, 7);
      auto rw = c->recv(in.data(), count, DataType::kFloat32, prev, 7);
      rw->wait();
      sw->wait();
      for (size_t i = 0; i < count; ++i)
        EXPECT_ELEM(in[i] == static_cast<float>(prev * 1000 + static_cast<int>(i % 1000)), "sendrecv i=" << i);
    }
    // Tags may be received in another order than sent.
    if (me == 0) {
      int64_t a = 1, b = 2;
      auto w1 = c->send(&a, 1, DataType::kInt64, 1, 1);
      auto w2 = c->send(&b, 1, DataType::kInt64, 1, 2);
      w1->wait();
      w2->wait();
    } else if (me == 1) {
      int64_t x = 0, y = 0;
      c->recv(&y, 1, DataType::kInt64, 0, 2)->wait();
      c->recv(&x, 1, DataType::kInt64, 0, 1)->wait();
      SHOAL_CHECK(x == 1 && y == 2);
    }
    // Any source: rank 0 collects one message from every other rank.
    if (me == 0) {
      std::vector<int> seen(n, 0);
      for (int k = 1; k < n; ++k) {
        int32_t v = -1;
        auto w = c->recv(&v, 1, DataType::kInt32, kAnySource, 9);
        w->wait();
        SHOAL_CHECK_MSG(w->source() == v, "source " << w->source() << " value " << v);
        if (v > 0 && v < n) seen[v]++;
      }
      for (int k = 1; k < n; ++k) SHOAL_CHECK(seen[k] == 1);
    } else {
      int32_t v = me;
      c->send(&v, 1, DataType::kInt32, 0, 9)->wait();
    }
    c->barrier()->wait();
  });
  EXPECT_EQ(test::failures(res), "") << "world size " << n;
}

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSize, ::testing::ValuesIn(kWorlds),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace shoal
