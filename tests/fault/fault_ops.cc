// fault_ops.cc — the operations of a shoal-fault trial (fault_ops.h).
#include "fault_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "collectives/registry.h"
#include "kernels/element.h"
#include "kernels/reference.h"
#include "shoal/error.h"

namespace shoal::fault {

using coll::Coll;

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

namespace {

const char* kind_name(Kind k) {
  static const char* names[] = {"allreduce", "broadcast", "reduce", "allgather", "allgatherv",
                                "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv",
                                "gather", "scatter", "barrier", "sendrecv"};
  return names[static_cast<int>(k)];
}
Coll coll_of(Kind k) {
  static const Coll c[] = {Coll::kAllreduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllgather,
                           Coll::kAllgatherv, Coll::kReduceScatter, Coll::kReduceScatterv,
                           Coll::kAlltoall, Coll::kAlltoallv, Coll::kGather, Coll::kScatter,
                           Coll::kBarrier, Coll::kSend};
  return c[static_cast<int>(k)];
}
bool reduces(Kind k) {
  return k == Kind::kAllreduce || k == Kind::kReduce || k == Kind::kReduceScatter ||
         k == Kind::kReduceScatterv;
}

bool valid_op(DataType dt, ReduceOp op) { return reduce_supported(dt, op); }

constexpr double kScale = 0.5;

// What rank r contributes at element i of a reduction (small integers: every
// sum, product and average is exact or rounded once).
double value(const Spec& s, uint64_t seed, int r, size_t i) {
  uint64_t h = mix(seed ^ mix(s.id * 131 + static_cast<uint64_t>(r)) ^ (i * 0x9E3779B97F4A7C15ull));
  if (s.dt == DataType::kBool) return static_cast<double>(h & 1);
  if (s.op == ReduceOp::kProd) {
    if (s.dt == DataType::kUInt8) return static_cast<double>(1 + h % 2);
    static const double p[] = {1, 2, -1};
    return p[h % 3];
  }
  if (s.op == ReduceOp::kBand || s.op == ReduceOp::kBor || s.op == ReduceOp::kBxor) {
    return static_cast<double>(h & 0x7f);
  }
  double v = static_cast<double>(h % 11);
  return s.dt == DataType::kUInt8 ? v : v - 5;
}

double reduced(const Spec& s, uint64_t seed, int n, size_t i) {
  const double f = s.op == ReduceOp::kPremulSum ? kScale : 1.0;
  double acc = value(s, seed, 0, i) * f;
  for (int r = 1; r < n; ++r) acc = kernels::reference_combine(s.dt, s.op, acc, value(s, seed, r, i) * f);
  if (s.op == ReduceOp::kAvg) acc = is_floating(s.dt) ? acc / n : std::trunc(acc / n);
  return acc;
}

bool same(const Spec& s, double got, double want) {
  uint8_t b[8];
  kernels::put_element(s.dt, b, 0, want);
  want = kernels::get_element(s.dt, b, 0);
  if (got == want) return true;
  if (s.op != ReduceOp::kAvg || !is_floating(s.dt)) return false;
  double tol = (s.dt == DataType::kFloat16 || s.dt == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// The bytes rank `src` sends to rank `dst` in a data-movement operation.
void pattern(uint8_t* p, size_t bytes, uint64_t seed, uint64_t id, int src, int dst) {
  const uint64_t k = mix(seed ^ mix(id * 977 + static_cast<uint64_t>(src) * 64 + static_cast<uint64_t>(dst)));
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w = mix(k + i);
    std::memcpy(p + i, &w, 8);
  }
  uint64_t w = mix(k + i);
  std::memcpy(p + i, &w, bytes - i);
}

constexpr size_t kGuard = 64;   // bytes after every output that nothing may write
constexpr uint8_t kFill = 0xEE;

// An output buffer of `bytes` followed by a guard zone.
struct Out {
  std::vector<uint8_t> v;
  size_t bytes;
  explicit Out(size_t b) : v(b + kGuard, kFill), bytes(b) {}
  uint8_t* data() { return v.data(); }
  bool guard_intact() const {
    for (size_t i = bytes; i < v.size(); ++i) {
      if (v[i] != kFill) return false;
    }
    return true;
  }
};

}  // namespace

std::string run_op(Communicator& c, const Spec& s, uint64_t seed) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(s.dt), cnt = s.count;
  OpOptions o;
  o.algorithm = s.algo;
  o.scale = kScale;
  std::ostringstream bad;
  int reported = 0;
  auto wrong = [&](const std::string& what) {
    if (reported++ < 3) bad << what << "; ";
  };
  auto check_reduced = [&](const uint8_t* got, size_t count, size_t offset) {
    for (size_t i = 0; i < count; ++i) {
      double g = kernels::get_element(s.dt, got, i), w = reduced(s, seed, n, offset + i);
      if (!same(s, g, w)) {
        wrong("element " + std::to_string(offset + i) + ": got " + std::to_string(g) + ", want " +
              std::to_string(w));
      }
    }
  };
  auto fill_values = [&](uint8_t* p, size_t count, size_t offset) {
    for (size_t i = 0; i < count; ++i) kernels::put_element(s.dt, p, i, value(s, seed, me, offset + i));
  };
  auto check_bytes = [&](const uint8_t* got, size_t bytes, int src, int dst, const char* what) {
    std::vector<uint8_t> want(bytes);
    pattern(want.data(), bytes, seed, s.id, src, dst);
    if (bytes && std::memcmp(got, want.data(), bytes) != 0) {
      wrong(std::string(what) + " from rank " + std::to_string(src) + " differs");
    }
  };
  auto packed = [](const std::vector<size_t>& counts, size_t from, size_t stride, size_t len) {
    std::vector<size_t> v;
    for (size_t k = 0; k < len; ++k) v.push_back(counts[from + k * stride]);
    return v;
  };

  switch (s.kind) {
    case Kind::kAllreduce: {
      Out out(cnt * es);
      std::vector<uint8_t> in(cnt * es + 1);
      fill_values(s.in_place ? out.data() : in.data(), cnt, 0);
      const void* src = s.in_place ? out.data() : in.data();
      c.allreduce(src, out.data(), cnt, s.dt, s.op, o)->wait();
      check_reduced(out.data(), cnt, 0);
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kReduce: {
      Out out(cnt * es);
      std::vector<uint8_t> in(cnt * es + 1);
      fill_values(s.in_place ? out.data() : in.data(), cnt, 0);
      const void* src = s.in_place ? out.data() : in.data();
      c.reduce(src, me == s.root ? out.data() : nullptr, cnt, s.dt, s.op, s.root, o)->wait();
      if (me == s.root) check_reduced(out.data(), cnt, 0);
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kBroadcast: {
      Out buf(cnt * es);
      if (me == s.root) pattern(buf.data(), cnt * es, seed, s.id, s.root, 0);
      c.broadcast(buf.data(), cnt, s.dt, s.root, o)->wait();
      check_bytes(buf.data(), cnt * es, s.root, 0, "broadcast");
      if (!buf.guard_intact()) wrong("wrote past the buffer");
      break;
    }
    case Kind::kAllgather: {
      const size_t b = cnt * es;
      Out out(b * n);
      std::vector<uint8_t> in(b + 1);
      uint8_t* mine = s.in_place ? out.data() + b * me : in.data();
      pattern(mine, b, seed, s.id, me, 0);
      c.allgather(mine, out.data(), cnt, s.dt, o)->wait();
      for (int r = 0; r < n; ++r) check_bytes(out.data() + b * r, b, r, 0, "allgather block");
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kAllgatherv: {
      size_t total = 0;
      std::vector<size_t> off;
      for (size_t k : s.counts) {
        off.push_back(total);
        total += k;
      }
      Out out(total * es);
      std::vector<uint8_t> in(s.counts[me] * es + 1);
      uint8_t* mine = s.in_place ? out.data() + off[me] * es : in.data();
      pattern(mine, s.counts[me] * es, seed, s.id, me, 0);
      c.allgatherv(mine, out.data(), s.counts, {}, s.dt, o)->wait();
      for (int r = 0; r < n; ++r) check_bytes(out.data() + off[r] * es, s.counts[r] * es, r, 0, "allgatherv block");
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<uint8_t> in(cnt * es * n + 1);
      fill_values(in.data(), cnt * n, 0);
      Out out(cnt * es);
      c.reduce_scatter(in.data(), out.data(), cnt, s.dt, s.op, o)->wait();
      check_reduced(out.data(), cnt, cnt * me);
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kReduceScatterv: {
      size_t total = 0, my_off = 0;
      for (int r = 0; r < n; ++r) {
        if (r == me) my_off = total;
        total += s.counts[r];
      }
      std::vector<uint8_t> in(total * es + 1);
      fill_values(in.data(), total, 0);
      Out out(s.counts[me] * es);
      c.reduce_scatterv(in.data(), out.data(), s.counts, s.dt, s.op, o)->wait();
      check_reduced(out.data(), s.counts[me], my_off);
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kAlltoall: {
      const size_t b = cnt * es;
      std::vector<uint8_t> in(b * n + 1);
      Out out(b * n);
      uint8_t* src = s.in_place ? out.data() : in.data();  // in place: send == recv
      for (int d = 0; d < n; ++d) pattern(src + b * d, b, seed, s.id, me, d);
      c.alltoall(src, out.data(), cnt, s.dt, o)->wait();
      for (int r = 0; r < n; ++r) check_bytes(out.data() + b * r, b, r, me, "alltoall block");
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kAlltoallv: {
      const size_t un = static_cast<size_t>(n), um = static_cast<size_t>(me);
      auto sc = packed(s.counts, um * un, 1, un);  // what I send to each
      auto rc = packed(s.counts, um, un, un);      // what each sends me
      size_t st = 0, rt = 0;
      for (size_t k : sc) st += k;
      for (size_t k : rc) rt += k;
      std::vector<uint8_t> in(st * es + 1);
      for (int d = 0, off = 0; d < n; off += static_cast<int>(sc[d]), ++d) {
        pattern(in.data() + off * es, sc[d] * es, seed, s.id, me, d);
      }
      Out out(rt * es);
      c.alltoallv(in.data(), sc, {}, out.data(), rc, {}, s.dt, o)->wait();
      for (int r = 0, off = 0; r < n; off += static_cast<int>(rc[r]), ++r) {
        check_bytes(out.data() + off * es, rc[r] * es, r, me, "alltoallv block");
      }
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kGather: {
      const size_t b = cnt * es;
      Out out(me == s.root ? b * n : 0);
      std::vector<uint8_t> in(b + 1);
      uint8_t* mine = (s.in_place && me == s.root) ? out.data() + b * me : in.data();
      pattern(mine, b, seed, s.id, me, s.root);
      c.gather(mine, me == s.root ? out.data() : nullptr, cnt, s.dt, s.root, o)->wait();
      if (me == s.root) {
        for (int r = 0; r < n; ++r) check_bytes(out.data() + b * r, b, r, s.root, "gather block");
      }
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kScatter: {
      const size_t b = cnt * es;
      std::vector<uint8_t> in(me == s.root ? b * n + 1 : 1);
      if (me == s.root) {
        for (int d = 0; d < n; ++d) pattern(in.data() + b * d, b, seed, s.id, s.root, d);
      }
      Out out(b);
      c.scatter(me == s.root ? in.data() : nullptr, out.data(), cnt, s.dt, s.root, o)->wait();
      check_bytes(out.data(), b, s.root, me, "scatter block");
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
    case Kind::kBarrier:
      c.barrier(o)->wait();
      break;
    case Kind::kSendRecv: {
      // A ring shift: everyone sends to the next rank, receives from the previous.
      const int to = (me + 1) % n, from = (me + n - 1) % n;
      const size_t b = cnt * es;
      std::vector<uint8_t> in(b + 1);
      pattern(in.data(), b, seed, s.id, me, to);
      Out out(b);
      OpOptions po;
      auto ws = c.send(in.data(), cnt, s.dt, to, s.tag, po);
      auto wr = c.recv(out.data(), cnt, s.dt, from, s.tag, po);
      ws->wait();
      wr->wait();
      check_bytes(out.data(), b, from, me, "recv");
      if (!out.guard_intact()) wrong("wrote past the output");
      break;
    }
  }
  return bad.str();
}

std::string Spec::describe() const {
  std::ostringstream o;
  o << "op " << id << " " << kind_name(kind) << " " << dtype_name(dt);
  if (reduces(kind)) o << " " << reduce_op_name(op);
  o << " count " << count << " root " << root << (in_place ? " in-place" : "")
    << " algo '" << algo << "'";
  if (!counts.empty()) {
    o << " counts";
    for (size_t c : counts) o << " " << c;
  }
  return o.str();
}

Spec Sequence::next() {
  Spec s;
  s.id = id_++;
  s.kind = static_cast<Kind>(g_() % kNumKinds);
  s.dt = static_cast<DataType>(g_() % kNumDataTypes);
  if (reduces(s.kind)) {
    do {
      s.op = static_cast<ReduceOp>(g_() % kNumReduceOps);
    } while (!valid_op(s.dt, s.op));
  }
  const size_t es = dtype_size(s.dt);
  const size_t n = static_cast<size_t>(n_);
  // How many blocks of `count` one rank's biggest buffer holds.
  size_t blocks = 1;
  switch (s.kind) {
    case Kind::kAllgather: case Kind::kReduceScatter: case Kind::kAlltoall:
    case Kind::kGather: case Kind::kScatter: case Kind::kAllgatherv:
    case Kind::kReduceScatterv: case Kind::kAlltoallv:
      blocks = n;
      break;
    default:
      break;
  }
  s.count = draw_count(max_bytes_ / (es * blocks));
  s.root = static_cast<int>(g_() % n);
  s.in_place = g_() % 3 == 0;
  if (s.kind == Kind::kAllgatherv || s.kind == Kind::kReduceScatterv) {
    for (size_t r = 0; r < n; ++r) s.counts.push_back(draw_count(s.count));
  } else if (s.kind == Kind::kAlltoallv) {
    for (size_t r = 0; r < n * n; ++r) s.counts.push_back(draw_count(s.count));
  }
  if (s.kind != Kind::kSendRecv) {
    auto algos = coll::algorithms(coll_of(s.kind));
    // The shared-arena algorithms need shared memory (off in TCP trials).
    const char* shm = std::getenv("SHOAL_SHM");
    if (shm && std::string(shm) == "0") {
      algos.erase(std::remove_if(algos.begin(), algos.end(), [](const coll::Algorithm* a) { return a->name.substr(0, 6) == "shared"; }),
                  algos.end());
    }
    size_t k = g_() % (algos.size() + 1);
    if (k < algos.size()) s.algo = std::string(algos[k]->name);
  }
  s.tag = static_cast<int64_t>(g_() % 1000);
  return s;
}

size_t Sequence::draw_count(size_t max) {
  if (max == 0 || g_() % 10 == 0) return 0;
  double u = static_cast<double>(g_() >> 11) * 0x1p-53;
  return std::clamp<size_t>(static_cast<size_t>(std::exp(u * std::log(static_cast<double>(max) + 1))),
                            1, max);
}

}  // namespace shoal::fault
