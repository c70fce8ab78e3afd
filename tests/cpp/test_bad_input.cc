// test_bad_input.cc — bad input never goes out (issue 6).
//
// A table of the bad arguments a user can pass to every entry point of the
// C++ API: every Communicator method, Communicator::create / from_env, and the
// stores. Each must throw InvalidArgument from the call itself with a message
// naming the rank, the collective and the argument; none may crash; and none
// may send anything: in a job of three ranks only rank 0 makes the bad calls,
// between two good collectives, and the good ones still match on every rank
// and keep consecutive sequence numbers (a bad call consumes no sequence
// number and puts no frame on the wire, or the other ranks would see a
// mismatch). Calls after abort() or after a peer was lost fail fast.
//
// Calls after destruction cannot be written: a Communicator lives in a
// shared_ptr and its methods need the object. What can outlive it is a Work
// handle, whose wait() then reports Aborted (test_faults.cc covers an
// operation pending at destruction; here, a completed one stays readable).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/net.h"
#include "harness.h"

namespace shoal {
namespace {

using test::JobOptions;
using test::run_ranks;

constexpr DataType f32 = DataType::kFloat32;
constexpr ReduceOp kSum = ReduceOp::kSum;
constexpr size_t kHuge = std::numeric_limits<size_t>::max();  // e.g. a negative int cast to size_t
const auto kBadDtype = static_cast<DataType>(42);
const auto kBadOp = static_cast<ReduceOp>(99);

// Buffers for the calls: a and b are separate, 1024 floats each.
struct Bufs {
  std::vector<float> a = std::vector<float>(1024, 1.0f), b = std::vector<float>(1024, 0.0f);
};

struct BadCall {
  const char* coll;    // the collective named in the message
  const char* arg;     // the argument named in the message
  const char* detail;  // a substring of what follows
  std::function<void(Communicator&, Bufs&)> call;
};

OpOptions algo(const char* name) {
  OpOptions o;
  o.algorithm = name;
  return o;
}

// Rank 0's bad calls in a job of three ranks (rank 0 is the root where one matters).
std::vector<BadCall> table() {
  using V = std::vector<size_t>;
  return {
      // ---- allreduce
      {"allreduce", "send", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.allreduce(nullptr, m.b.data(), 4, f32, kSum); }},
      {"allreduce", "recv", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), nullptr, 4, f32, kSum); }},
      {"allreduce", "dtype", "unknown value 42",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, kBadDtype, kSum); }},
      {"allreduce", "op", "unknown value 99",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, f32, kBadOp); }},
      {"allreduce", "op", "bitwise op 'band' is not defined for float32",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, f32, ReduceOp::kBand); }},
      {"allreduce", "op", "premul_sum needs a floating dtype",
       [](Communicator& c, Bufs& m) {
         c.allreduce(m.a.data(), m.b.data(), 4, DataType::kInt32, ReduceOp::kPremulSum);
       }},
      {"allreduce", "op", "avg is not defined for bool",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, DataType::kBool, ReduceOp::kAvg); }},
      {"allreduce", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.a.data() + 1, 4, f32, kSum); }},
      {"allreduce", "count", "more than",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), kHuge, f32, kSum); }},
      {"allreduce", "algorithm", "unknown algorithm 'bogus'",
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, f32, kSum, algo("bogus")); }},
      {"allreduce", "algorithm", "unknown algorithm 'chain'",  // broadcast's, not allreduce's
       [](Communicator& c, Bufs& m) { c.allreduce(m.a.data(), m.b.data(), 4, f32, kSum, algo("chain")); }},
      // ---- broadcast
      {"broadcast", "root", "3 is out of range for 3 ranks",
       [](Communicator& c, Bufs& m) { c.broadcast(m.a.data(), 4, f32, 3); }},
      {"broadcast", "root", "-1 is out of range for 3 ranks",
       [](Communicator& c, Bufs& m) { c.broadcast(m.a.data(), 4, f32, -1); }},
      {"broadcast", "buf", "null pointer with count 4",
       [](Communicator& c, Bufs&) { c.broadcast(nullptr, 4, f32, 0); }},
      {"broadcast", "dtype", "unknown value 42",
       [](Communicator& c, Bufs& m) { c.broadcast(m.a.data(), 4, kBadDtype, 0); }},
      {"broadcast", "count", "more than",
       [](Communicator& c, Bufs& m) { c.broadcast(m.a.data(), kHuge / 2, f32, 0); }},
      {"broadcast", "algorithm", "unknown algorithm 'ring'",
       [](Communicator& c, Bufs& m) { c.broadcast(m.a.data(), 4, f32, 0, algo("ring")); }},
      // ---- reduce
      {"reduce", "root", "7 is out of range for 3 ranks",
       [](Communicator& c, Bufs& m) { c.reduce(m.a.data(), m.b.data(), 4, f32, kSum, 7); }},
      {"reduce", "send", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.reduce(nullptr, m.b.data(), 4, f32, kSum, 0); }},
      {"reduce", "recv", "null pointer with count 4",  // on the root
       [](Communicator& c, Bufs& m) { c.reduce(m.a.data(), nullptr, 4, f32, kSum, 0); }},
      {"reduce", "op", "bitwise op 'bxor' is not defined for float64",
       [](Communicator& c, Bufs& m) { c.reduce(m.a.data(), m.b.data(), 2, DataType::kFloat64, ReduceOp::kBxor, 0); }},
      {"reduce", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.reduce(m.a.data() + 2, m.a.data(), 4, f32, kSum, 0); }},
      {"reduce", "count", "more than",
       [](Communicator& c, Bufs& m) { c.reduce(m.a.data(), m.b.data(), kHuge / 3, f32, kSum, 0); }},
      // ---- allgather
      {"allgather", "send", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.allgather(nullptr, m.b.data(), 4, f32); }},
      {"allgather", "recv", "null pointer with count 12",
       [](Communicator& c, Bufs& m) { c.allgather(m.a.data(), nullptr, 4, f32); }},
      {"allgather", "recv", "overlaps send",  // inside recv, but not this rank's block
       [](Communicator& c, Bufs& m) { c.allgather(m.b.data() + 1, m.b.data(), 4, f32); }},
      {"allgather", "count", "more than",  // count * 3 ranks overflows
       [](Communicator& c, Bufs& m) { c.allgather(m.a.data(), m.b.data(), kHuge / 2, f32); }},
      {"allgather", "dtype", "unknown value 42",
       [](Communicator& c, Bufs& m) { c.allgather(m.a.data(), m.b.data(), 4, kBadDtype); }},
      // ---- allgatherv
      {"allgatherv", "recv_counts", "has 2 entries, expected one per rank (3)",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.a.data(), m.b.data(), V{1, 1}, {}, f32); }},
      {"allgatherv", "displs", "has 1 entries, expected one per rank (3)",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.a.data(), m.b.data(), V{1, 1, 1}, V{0}, f32); }},
      {"allgatherv", "send", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.allgatherv(nullptr, m.b.data(), V{4, 1, 1}, {}, f32); }},
      {"allgatherv", "recv", "null pointer with count 6",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.a.data(), nullptr, V{4, 1, 1}, {}, f32); }},
      {"allgatherv", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.b.data() + 1, m.b.data(), V{4, 1, 1}, {}, f32); }},
      {"allgatherv", "recv_counts", "add up to more elements of float32 than any buffer can hold",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.a.data(), m.b.data(), V{1, kHuge, 1}, {}, f32); }},
      {"allgatherv", "displs", "more than",
       [](Communicator& c, Bufs& m) { c.allgatherv(m.a.data(), m.b.data(), V{1, 1, 1}, V{0, kHuge, 2}, f32); }},
      // ---- reduce_scatter
      {"reduce_scatter", "send", "null pointer with count 12",
       [](Communicator& c, Bufs& m) { c.reduce_scatter(nullptr, m.b.data(), 4, f32, kSum); }},
      {"reduce_scatter", "recv", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.reduce_scatter(m.a.data(), nullptr, 4, f32, kSum); }},
      {"reduce_scatter", "recv", "cannot run in place",
       [](Communicator& c, Bufs& m) { c.reduce_scatter(m.a.data(), m.a.data(), 4, f32, kSum); }},
      {"reduce_scatter", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.reduce_scatter(m.a.data(), m.a.data() + 8, 4, f32, kSum); }},
      {"reduce_scatter", "op", "premul_sum needs a floating dtype",
       [](Communicator& c, Bufs& m) {
         c.reduce_scatter(m.a.data(), m.b.data(), 4, DataType::kInt64, ReduceOp::kPremulSum);
       }},
      {"reduce_scatter", "count", "more than",
       [](Communicator& c, Bufs& m) { c.reduce_scatter(m.a.data(), m.b.data(), kHuge / 3 + 1, f32, kSum); }},
      // ---- reduce_scatterv
      {"reduce_scatterv", "recv_counts", "has 4 entries, expected one per rank (3)",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(m.a.data(), m.b.data(), V{1, 1, 1, 1}, f32, kSum); }},
      {"reduce_scatterv", "send", "null pointer with count 6",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(nullptr, m.b.data(), V{2, 2, 2}, f32, kSum); }},
      {"reduce_scatterv", "recv", "null pointer with count 2",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(m.a.data(), nullptr, V{2, 2, 2}, f32, kSum); }},
      {"reduce_scatterv", "recv", "cannot run in place",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(m.a.data(), m.a.data(), V{2, 2, 2}, f32, kSum); }},
      {"reduce_scatterv", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(m.a.data(), m.a.data() + 1, V{2, 2, 2}, f32, kSum); }},
      {"reduce_scatterv", "op", "bitwise op 'bor' is not defined for float16",
       [](Communicator& c, Bufs& m) {
         c.reduce_scatterv(m.a.data(), m.b.data(), V{2, 2, 2}, DataType::kFloat16, ReduceOp::kBor);
       }},
      {"reduce_scatterv", "recv_counts", "add up to more elements of float32 than any buffer can hold",
       [](Communicator& c, Bufs& m) { c.reduce_scatterv(m.a.data(), m.b.data(), V{2, kHuge - 1, 2}, f32, kSum); }},
      // ---- alltoall
      {"alltoall", "send", "null pointer with count 6",
       [](Communicator& c, Bufs& m) { c.alltoall(nullptr, m.b.data(), 2, f32); }},
      {"alltoall", "recv", "null pointer with count 6",
       [](Communicator& c, Bufs& m) { c.alltoall(m.a.data(), nullptr, 2, f32); }},
      {"alltoall", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.alltoall(m.a.data(), m.a.data() + 3, 2, f32); }},
      {"alltoall", "count", "more than",
       [](Communicator& c, Bufs& m) { c.alltoall(m.a.data(), m.b.data(), kHuge / 4, f32); }},
      // ---- alltoallv
      {"alltoallv", "send_counts", "has 2 entries, expected one per rank (3)",
       [](Communicator& c, Bufs& m) { c.alltoallv(m.a.data(), V{1, 1}, {}, m.b.data(), V{1, 1, 1}, {}, f32); }},
      {"alltoallv", "recv_counts", "has 4 entries",
       [](Communicator& c, Bufs& m) { c.alltoallv(m.a.data(), V{1, 1, 1}, {}, m.b.data(), V{1, 1, 1, 1}, {}, f32); }},
      {"alltoallv", "send_displs", "has 1 entries",
       [](Communicator& c, Bufs& m) { c.alltoallv(m.a.data(), V{1, 1, 1}, V{0}, m.b.data(), V{1, 1, 1}, {}, f32); }},
      {"alltoallv", "recv_displs", "has 2 entries",
       [](Communicator& c, Bufs& m) {
         c.alltoallv(m.a.data(), V{1, 1, 1}, {}, m.b.data(), V{1, 1, 1}, V{0, 1}, f32);
       }},
      {"alltoallv", "send_counts", "this rank sends itself 2 elements but expects 1",
       [](Communicator& c, Bufs& m) { c.alltoallv(m.a.data(), V{2, 1, 1}, {}, m.b.data(), V{1, 1, 1}, {}, f32); }},
      {"alltoallv", "send", "null pointer with count 3",
       [](Communicator& c, Bufs& m) { c.alltoallv(nullptr, V{1, 1, 1}, {}, m.b.data(), V{1, 1, 1}, {}, f32); }},
      {"alltoallv", "recv", "null pointer with count 3",
       [](Communicator& c, Bufs& m) { c.alltoallv(m.a.data(), V{1, 1, 1}, {}, nullptr, V{1, 1, 1}, {}, f32); }},
      {"alltoallv", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) {
         c.alltoallv(m.a.data(), V{2, 2, 2}, {}, m.a.data() + 1, V{2, 2, 2}, {}, f32);
       }},
      {"alltoallv", "send_counts", "add up to more elements of float32 than any buffer can hold",
       [](Communicator& c, Bufs& m) {
         c.alltoallv(m.a.data(), V{1, kHuge, 1}, {}, m.b.data(), V{1, 1, 1}, {}, f32);
       }},
      {"alltoallv", "recv_displs", "more than",
       [](Communicator& c, Bufs& m) {
         c.alltoallv(m.a.data(), V{1, 1, 1}, {}, m.b.data(), V{1, 1, 1}, V{0, 1, kHuge}, f32);
       }},
      // ---- gather
      {"gather", "root", "3 is out of range for 3 ranks",
       [](Communicator& c, Bufs& m) { c.gather(m.a.data(), m.b.data(), 4, f32, 3); }},
      {"gather", "send", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.gather(nullptr, m.b.data(), 4, f32, 0); }},
      {"gather", "recv", "null pointer with count 12",  // on the root
       [](Communicator& c, Bufs& m) { c.gather(m.a.data(), nullptr, 4, f32, 0); }},
      {"gather", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.gather(m.b.data() + 2, m.b.data(), 4, f32, 0); }},
      {"gather", "count", "more than",
       [](Communicator& c, Bufs& m) { c.gather(m.a.data(), m.b.data(), kHuge / 8, f32, 0); }},
      // ---- scatter
      {"scatter", "root", "-2 is out of range for 3 ranks",
       [](Communicator& c, Bufs& m) { c.scatter(m.a.data(), m.b.data(), 4, f32, -2); }},
      {"scatter", "recv", "null pointer with count 4",
       [](Communicator& c, Bufs& m) { c.scatter(m.a.data(), nullptr, 4, f32, 0); }},
      {"scatter", "send", "null pointer with count 12",  // on the root
       [](Communicator& c, Bufs& m) { c.scatter(nullptr, m.b.data(), 4, f32, 0); }},
      {"scatter", "recv", "overlaps send",
       [](Communicator& c, Bufs& m) { c.scatter(m.a.data(), m.a.data() + 1, 4, f32, 0); }},
      {"scatter", "count", "more than",
       [](Communicator& c, Bufs& m) { c.scatter(m.a.data(), m.b.data(), kHuge / 8, f32, 0); }},
      // ---- barrier
      {"barrier", "algorithm", "unknown algorithm 'ring'",
       [](Communicator& c, Bufs&) { c.barrier(algo("ring")); }},
      // ---- send / recv
      {"send", "peer", "0 is not another rank of 3",
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), 1, f32, 0); }},
      {"send", "peer", "3 is not another rank of 3",
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), 1, f32, 3); }},
      {"send", "peer", "-1 is not another rank of 3",  // kAnySource is for receives only
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), 1, f32, kAnySource); }},
      {"send", "tag", "must be >= 0, got -3",
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), 1, f32, 1, -3); }},
      {"send", "buf", "null pointer with count 2",
       [](Communicator& c, Bufs&) { c.send(nullptr, 2, f32, 1); }},
      {"send", "dtype", "unknown value 42",
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), 1, kBadDtype, 1); }},
      {"send", "count", "more than",
       [](Communicator& c, Bufs& m) { c.send(m.a.data(), kHuge, f32, 1); }},
      {"recv", "peer", "5 is not another rank of 3",
       [](Communicator& c, Bufs& m) { c.recv(m.b.data(), 1, f32, 5); }},
      {"recv", "peer", "-2 is not another rank of 3",
       [](Communicator& c, Bufs& m) { c.recv(m.b.data(), 1, f32, -2); }},
      {"recv", "peer", "0 is not another rank of 3",
       [](Communicator& c, Bufs& m) { c.recv(m.b.data(), 1, f32, 0); }},
      {"recv", "tag", "must be >= 0, got -1",
       [](Communicator& c, Bufs& m) { c.recv(m.b.data(), 1, f32, 1, -1); }},
      {"recv", "buf", "null pointer with count 1",
       [](Communicator& c, Bufs&) { c.recv(nullptr, 1, f32, kAnySource); }},
      {"recv", "count", "more than",
       [](Communicator& c, Bufs& m) { c.recv(m.b.data(), kHuge / 2, f32, 1); }},
  };
}

// The message a bad call raised ("" if it raised none or another type).
std::string invalid_argument_of(const std::function<void()>& fn, std::string* other) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    *other = e.what();
  }
  return "";
}

TEST(BadInput, EveryMethodNamesTheArgumentAndSendsNothing) {
  auto res = run_ranks(3, [](std::shared_ptr<Communicator>& c, int me, int n, const auto&) {
    // A good collective before: seq 1.
    int64_t x = me + 1;
    auto w1 = c->allreduce(&x, &x, 1, DataType::kInt64, kSum);
    w1->wait();
    SHOAL_CHECK(x == 6 && w1->seq() == 1);
    if (me == 0) {
      Bufs m;
      const std::vector<float> a0 = m.a, b0 = m.b;
      for (const auto& bc : table()) {
        std::string other;
        std::string msg = invalid_argument_of([&] { bc.call(*c, m); }, &other);
        const std::string head = "shoal rank 0: " + std::string(bc.coll) + ": " + bc.arg + ": ";
        SHOAL_CHECK_MSG(msg.rfind(head, 0) == 0,
                        bc.coll << " " << bc.arg << " (" << bc.detail << "): expected a message starting '"
                                << head << "', got '" << msg << "'" << (other.empty() ? "" : " / other error: ")
                                << other);
        SHOAL_CHECK_MSG(msg.find(bc.detail) != std::string::npos,
                        bc.coll << " " << bc.arg << ": expected '" << bc.detail << "' in '" << msg << "'");
      }
      // No buffer was touched.
      SHOAL_CHECK(m.a == a0 && m.b == b0);
    }
    // A good collective after: still in step, next sequence number, right result.
    std::vector<int32_t> v(n), out(n);
    for (int i = 0; i < n; ++i) v[i] = me * 10 + i;
    auto w2 = c->alltoall(v.data(), out.data(), 1, DataType::kInt32);
    w2->wait();
    SHOAL_CHECK_MSG(w2->seq() == 2, "a bad call consumed a sequence number: seq " << w2->seq());
    for (int i = 0; i < n; ++i) SHOAL_CHECK(out[i] == i * 10 + me);
    // Point-to-point in step too (a bad send would have been matched here).
    float y = static_cast<float>(me);
    if (me == 0) {
      c->send(&y, 1, f32, 1, 0)->wait();
    } else if (me == 1) {
      float z = -1;
      c->recv(&z, 1, f32, 0, 0)->wait();
      SHOAL_CHECK(z == 0.0f);
    }
    c->barrier()->wait();
    SHOAL_CHECK(c->error() == nullptr);
  });
  EXPECT_EQ(test::failures(res), "");
}

// ---- after abort, after a peer is lost ----------------------------------------

// Every method, with good arguments for rank 0 of two ranks.
std::vector<std::pair<const char*, std::function<WorkPtr(Communicator&, Bufs&)>>> every_method() {
  using V = std::vector<size_t>;
  return {
      {"allreduce", [](Communicator& c, Bufs& m) { return c.allreduce(m.a.data(), m.b.data(), 4, f32, kSum); }},
      {"broadcast", [](Communicator& c, Bufs& m) { return c.broadcast(m.a.data(), 4, f32, 0); }},
      {"reduce", [](Communicator& c, Bufs& m) { return c.reduce(m.a.data(), m.b.data(), 4, f32, kSum, 0); }},
      {"allgather", [](Communicator& c, Bufs& m) { return c.allgather(m.a.data(), m.b.data(), 4, f32); }},
      {"allgatherv", [](Communicator& c, Bufs& m) { return c.allgatherv(m.a.data(), m.b.data(), V{2, 3}, {}, f32); }},
      {"reduce_scatter", [](Communicator& c, Bufs& m) { return c.reduce_scatter(m.a.data(), m.b.data(), 4, f32, kSum); }},
      {"reduce_scatterv",
       [](Communicator& c, Bufs& m) { return c.reduce_scatterv(m.a.data(), m.b.data(), V{1, 2}, f32, kSum); }},
      {"alltoall", [](Communicator& c, Bufs& m) { return c.alltoall(m.a.data(), m.b.data(), 4, f32); }},
      {"alltoallv",
       [](Communicator& c, Bufs& m) { return c.alltoallv(m.a.data(), V{1, 2}, {}, m.b.data(), V{1, 3}, {}, f32); }},
      {"gather", [](Communicator& c, Bufs& m) { return c.gather(m.a.data(), m.b.data(), 4, f32, 0); }},
      {"scatter", [](Communicator& c, Bufs& m) { return c.scatter(m.a.data(), m.b.data(), 4, f32, 0); }},
      {"barrier", [](Communicator& c, Bufs&) { return c.barrier(); }},
      {"send", [](Communicator& c, Bufs& m) { return c.send(m.a.data(), 4, f32, 1, 7); }},
      {"recv", [](Communicator& c, Bufs& m) { return c.recv(m.b.data(), 4, f32, 1, 7); }},
  };
}

int64_t ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}

TEST(BadInput, EveryMethodFailsFastAfterAbort) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto& store) {
    if (me == 1) {
      store->get("rank0_done");  // takes part in nothing
      return;
    }
    Bufs m;
    c->abort("the user stopped the job");
    for (auto& [name, call] : every_method()) {
      auto t0 = std::chrono::steady_clock::now();
      std::string msg;
      bool aborted = false;
      try {
        call(*c, m)->wait();
      } catch (const Aborted& e) {
        aborted = true;
        msg = e.what();
      } catch (const std::exception& e) {
        msg = e.what();
      }
      SHOAL_CHECK_MSG(aborted, name << ": expected Aborted, got '" << msg << "'");
      SHOAL_CHECK_MSG(msg.find(std::string("shoal rank 0: ") + name) == 0, name << ": " << msg);
      SHOAL_CHECK_MSG(msg.find("the user stopped the job") != std::string::npos, name << ": " << msg);
      SHOAL_CHECK_MSG(ms_since(t0) < 1000, name << ": took " << ms_since(t0) << " ms to fail");
    }
    // Bad input is still reported as such (argument checks come first).
    std::string other;
    std::string msg = invalid_argument_of([&] { c->broadcast(m.a.data(), 4, f32, 9); }, &other);
    SHOAL_CHECK_MSG(msg.find("broadcast: root: 9") != std::string::npos, msg << other);
    store->set_str("rank0_done", "1");
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(BadInput, EveryMethodFailsFastAfterAPeerIsLost) {
  auto res = run_ranks(2, [](std::shared_ptr<Communicator>& c, int me, int, const auto&) {
    float x = 1;
    c->allreduce(&x, &x, 1, f32, kSum)->wait();  // connected
    if (me == 1) test::leave(0);                  // gone, sockets closed by the kernel
    SHOAL_CHECK(x == 2.0f);
    Bufs m;
    // The first operation finds the peer gone; every later one fails at once.
    std::string first;
    try {
      c->barrier()->wait();
    } catch (const PeerLost& e) {
      first = e.what();
    }
    SHOAL_CHECK_MSG(first.find("peer lost: rank 1") != std::string::npos, "first: " << first);
    for (auto& [name, call] : every_method()) {
      auto t0 = std::chrono::steady_clock::now();
      std::string msg;
      bool lost = false;
      try {
        call(*c, m)->wait();
      } catch (const PeerLost& e) {
        lost = e.peer() == 1;
        msg = e.what();
      } catch (const std::exception& e) {
        msg = e.what();
      }
      SHOAL_CHECK_MSG(lost, name << ": expected PeerLost naming rank 1, got '" << msg << "'");
      SHOAL_CHECK_MSG(ms_since(t0) < 1000, name << ": took " << ms_since(t0) << " ms to fail");
    }
  });
  EXPECT_EQ(test::failures(res), "");
}

TEST(BadInput, WorkOutlivesItsCommunicator) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  auto c = Communicator::create(store, 0, 1);
  float x = 3;
  auto w = c->allreduce(&x, &x, 1, f32, kSum);
  w->wait();
  c.reset();
  EXPECT_TRUE(w->test());
  EXPECT_NO_THROW(w->wait());
  EXPECT_EQ(w->error(), nullptr);
  EXPECT_EQ(x, 3.0f);
}

// ---- creating communicators -----------------------------------------------------

struct BadCreate {
  const char* expect;  // names the argument
  std::function<void(const std::shared_ptr<Store>&)> call;
};

TEST(BadInput, CreateNamesTheArgument) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  auto opts = [](auto f) {
    Options o;
    f(o);
    return o;
  };
  std::vector<BadCreate> cases = {
      {"store: null", [](auto&) { Communicator::create(nullptr, 0, 2); }},
      {"size: must be >= 1, got 0", [](auto& s) { Communicator::create(s, 0, 0); }},  // an empty communicator
      {"size: must be >= 1, got -3", [](auto& s) { Communicator::create(s, 0, -3); }},
      {"rank: 2 is out of range for size 2", [](auto& s) { Communicator::create(s, 2, 2); }},
      {"rank: -1 is out of range for size 2", [](auto& s) { Communicator::create(s, -1, 2); }},
      {"timeout: must be > 0",
       [&](auto& s) { Communicator::create(s, 0, 1, opts([](Options& o) { o.timeout = std::chrono::milliseconds(0); })); }},
      {"timeout: must be > 0",
       [&](auto& s) { Communicator::create(s, 0, 1, opts([](Options& o) { o.timeout = std::chrono::milliseconds(-5); })); }},
      {"'allreduce' is not of the form collective=algorithm",
       [&](auto& s) { Communicator::create(s, 0, 1, opts([](Options& o) { o.algorithms = "allreduce"; })); }},
      {"unknown collective 'frobnicate'",
       [&](auto& s) { Communicator::create(s, 0, 1, opts([](Options& o) { o.algorithms = "frobnicate=ring"; })); }},
      {"unknown algorithm 'tree' for allreduce (known: ring",
       [&](auto& s) { Communicator::create(s, 0, 1, opts([](Options& o) { o.algorithms = "allreduce=tree"; })); }},
  };
  for (auto& bc : cases) {
    std::string other;
    std::string msg = invalid_argument_of([&] { bc.call(store); }, &other);
    EXPECT_NE(msg.find(bc.expect), std::string::npos) << "expected '" << bc.expect << "', got '" << msg << "' "
                                                      << other;
  }
  // Nothing was published for any of them: the next good communicator is c0.
  EXPECT_FALSE(store->check({"shoal/c0/uid"})) << "a rejected create wrote to the store";
}

TEST(BadInput, BadEnvironmentKnobsAreNamed) {
  TcpStoreOptions so;
  so.is_server = true;
  auto store = std::make_shared<TcpStore>(so);
  struct Case {
    const char* var;
    const char* value;
    const char* expect;
  };
  for (const Case& k : {Case{"SHOAL_SHM", "maybe", "SHOAL_SHM: 'maybe'"},
                        Case{"SHOAL_TIMEOUT_S", "0", "SHOAL_TIMEOUT_S: must be > 0"},
                        Case{"SHOAL_ALGO", "allreduce=nope", "SHOAL_ALGO: unknown algorithm 'nope'"},
                        Case{"SHOAL_SEGMENT_BYTES", "0", "SHOAL_SEGMENT_BYTES: must be > 0"},
                        Case{"SHOAL_TCP_CONGESTION", "no-such-cc",
                             "SHOAL_TCP_CONGESTION: 'no-such-cc' cannot be set on this rank's sockets: this "
                             "kernel has no such algorithm"}}) {
    setenv(k.var, k.value, 1);
    std::string other;
    std::string msg = invalid_argument_of([&] { Communicator::create(store, 0, 2); }, &other);
    unsetenv(k.var);
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.var << "=" << k.value << ": got '" << msg << "' " << other;
  }
}

// from_env: every variable is named; a bad one fails before any connection is
// tried (a rank that is not 0 would otherwise wait minutes for a store).
TEST(BadInput, FromEnvNamesTheVariable) {
  struct Case {
    const char *rank, *world, *addr, *port;
    const char* expect;
  };
  const Case cases[] = {
      {nullptr, "2", "127.0.0.1", "1", "RANK: not set"},
      {"1", nullptr, "127.0.0.1", "1", "WORLD_SIZE: not set"},
      {"one", "2", "127.0.0.1", "1", "RANK: 'one' is not a non-negative integer"},
      {"-1", "2", "127.0.0.1", "1", "RANK: '-1'"},
      {"1", "2x", "127.0.0.1", "1", "WORLD_SIZE: '2x'"},
      {"2", "2", "127.0.0.1", "1", "RANK: 2 is out of range for WORLD_SIZE 2"},
      {"1", "0", "127.0.0.1", "1", "WORLD_SIZE: must be at least 1, got 0"},
      {"1", "2", "127.0.0.1", "70000", "MASTER_PORT: 70000 is not a port"},
      {"1", "2", "127.0.0.1", "0", "MASTER_PORT: 0 is not a port"},
      {"1", "2", "127.0.0.1", "http", "MASTER_PORT: 'http'"},
  };
  for (const auto& k : cases) {
    auto set = [](const char* n, const char* v) { v ? setenv(n, v, 1) : unsetenv(n); };
    set("RANK", k.rank);
    set("WORLD_SIZE", k.world);
    set("MASTER_ADDR", k.addr);
    set("MASTER_PORT", k.port);
    auto t0 = std::chrono::steady_clock::now();
    std::string other;
    std::string msg = invalid_argument_of([] { Communicator::from_env(); }, &other);
    EXPECT_NE(msg.find(k.expect), std::string::npos) << "expected '" << k.expect << "', got '" << msg << "' " << other;
    EXPECT_LT(ms_since(t0), 2000) << k.expect << ": tried to connect first";
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
}

// ---- stores ---------------------------------------------------------------------

TEST(BadInput, StoresNameTheArgument) {
  TcpStoreOptions so;
  so.is_server = true;
  TcpStore server(so);
  auto expect_invalid = [](const char* what, const std::function<void()>& fn, const char* expect) {
    std::string other;
    std::string msg = invalid_argument_of(fn, &other);
    EXPECT_NE(msg.find(expect), std::string::npos) << what << ": expected '" << expect << "', got '" << msg
                                                   << "' " << other;
  };
  expect_invalid("client without a port", [] {
    TcpStoreOptions c;
    c.port = 0;
    TcpStore s(c);
  }, "port 0 is valid only with is_server");
  expect_invalid("secret not hex", [] {
    TcpStoreOptions c;
    c.is_server = true;
    c.secret = "not-hex!";
    TcpStore s(c);
  }, "TcpStoreOptions::secret");
  expect_invalid("key too long", [&] { server.set_str(std::string(5000, 'k'), "v"); }, "key of 5000 bytes");
  expect_invalid("key too long (get)", [&] { server.get(std::string(5000, 'k')); }, "key of 5000 bytes");
  expect_invalid("value too big", [&] { server.set("k", Bytes((64u << 20) + 1)); }, "exceeds the");
  expect_invalid("prefix store without base", [] { PrefixStore p("x", nullptr); }, "needs a base store");
  // A second server on a port in use: StoreError naming host:port, not a crash.
  TcpStoreOptions dup;
  dup.is_server = true;
  dup.port = server.port();
  try {
    TcpStore s(dup);
    ADD_FAILURE() << "a second server bound the same port";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(server.port())), std::string::npos) << e.what();
  }
  // The store still works after all of it.
  server.set_str("k", "v");
  EXPECT_EQ(server.get_str("k"), "v");
}

}  // namespace
}  // namespace shoal
