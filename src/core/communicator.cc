// core/communicator.cc — the public Communicator: argument checks (all of
// them before anything is queued, so bad input never reaches the wire) and
// enqueueing.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>

#include "core/communicator_impl.h"
#include "kernels/reduce.h"

namespace shoal {

using coll::Coll;

namespace {

class Checker {
 public:
  Checker(const std::string& who, Coll c) : who_(who), coll_(c) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& what) const {
    throw InvalidArgument(who_ + ": " +
                          std::string(coll::coll_name(coll_)) + ": " + arg + ": " + what);
  }
  void buffer(const char* arg, const void* p, size_t count) const {
    if (count > 0 && p == nullptr) fail(arg, "null pointer with count " + std::to_string(count));
  }
  void dtype(DataType dt) const {
    if (static_cast<int>(dt) >= kNumDataTypes) {
      fail("dtype", "unknown value " + std::to_string(static_cast<int>(dt)));
    }
  }
  void reduce_op(DataType dt, ReduceOp op) const {
    if (static_cast<int>(op) >= kNumReduceOps) {
      fail("op", "unknown value " + std::to_string(static_cast<int>(op)));
    }
    const char* why = nullptr;
    if (!kernels::supported(dt, op, &why)) {
      std::string w = why ? why : "not supported for this dtype";
      if (w.rfind("op: ", 0) == 0) w.erase(0, 4);  // the kernels' reason names the argument already
      fail("op", w);
    }
  }
  // `count` elements of dt, `blocks` times over, must fit in memory (a
  // negative count cast to size_t is the usual way to get past that).
  void count(const char* arg, size_t count, size_t blocks, DataType dt) const {
    size_t bytes = 0;  // (no division on the path of every call)
    if (__builtin_mul_overflow(count, dtype_size(dt), &bytes) || __builtin_mul_overflow(bytes, blocks, &bytes) ||
        bytes > kMaxBytes) {
      fail(arg, std::to_string(count) + " elements of " + std::string(dtype_name(dt)) +
                    (blocks > 1 ? " for each of " + std::to_string(blocks) + " ranks" : "") +
                    " is more than any buffer can hold");
    }
  }
  // So must their sum (the packed layout), and each block's end when
  // displacements are given.
  void counts(const char* arg, const std::vector<size_t>& v, DataType dt) const {
    size_t sum = 0;
    for (size_t c : v) {
      if (c > kMaxBytes / dtype_size(dt) - sum) {
        fail(arg, "the entries add up to more elements of " + std::string(dtype_name(dt)) +
                      " than any buffer can hold");
      }
      sum += c;
    }
  }
  void ends(const char* arg, const std::vector<size_t>& counts, const std::vector<size_t>& displs,
            DataType dt) const {
    const size_t max = kMaxBytes / dtype_size(dt);
    for (size_t i = 0; i < counts.size() && i < displs.size(); ++i) {
      if (displs[i] > max || counts[i] > max - displs[i]) {
        fail(arg, "entry " + std::to_string(i) + " (" + std::to_string(displs[i]) + ") plus its count (" +
                      std::to_string(counts[i]) + ") is more than any buffer can hold");
      }
    }
  }
  void root(int root, int size) const {
    if (root < 0 || root >= size) {
      fail("root", std::to_string(root) + " is out of range for " + std::to_string(size) + " ranks");
    }
  }
  void vec(const char* arg, const std::vector<size_t>& v, int size) const {
    if (v.size() != static_cast<size_t>(size)) {
      fail(arg, "has " + std::to_string(v.size()) + " entries, expected one per rank (" +
                    std::to_string(size) + ")");
    }
  }
  // Partial overlap of two byte ranges (exact aliasing is in place).
  void no_overlap(const void* a, size_t an, const void* b, size_t bn) const {
    if (!a || !b || an == 0 || bn == 0 || a == b) return;
    auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    if (x < y + bn && y < x + an) fail("recv", "overlaps send without being the same buffer");
  }

 private:
  static constexpr size_t kMaxBytes = static_cast<size_t>(PTRDIFF_MAX);
  const std::string& who_;  // the communicator's label, which outlives the call
  Coll coll_;
};

// Packed displacements when none are given; checks given ones fit `total`.
std::vector<size_t> displacements(const Checker& ck, const char* arg, const std::vector<size_t>& counts,
                                  std::vector<size_t> displs, int size) {
  if (displs.empty()) {
    displs.resize(counts.size());
    size_t off = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      displs[i] = off;
      off += counts[i];
    }
    return displs;
  }
  ck.vec(arg, displs, size);
  return displs;
}

size_t extent(const std::vector<size_t>& counts, const std::vector<size_t>& displs) {
  size_t e = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i]) e = std::max(e, displs[i] + counts[i]);
  }
  return e;
}

}  // namespace

Communicator::Communicator(std::unique_ptr<CommunicatorImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank_; }
int Communicator::size() const { return impl_->size_; }
void Communicator::abort(const std::string& reason) { impl_->abort(reason); }
std::exception_ptr Communicator::error() const { return impl_->error(); }
uint64_t Communicator::id() const { return impl_->uid(); }

namespace {

// On the caller's stack: an operation that runs at once is never allocated
// (CommunicatorImpl::enqueue moves it to the heap only to queue it).
Op make_op(Coll c, const OpOptions& o) {
  Op op;
  op.coll = c;
  op.opts = o;
  return op;
}

}  // namespace

// Chooses the algorithm at issue time, so that a bad forced name is an
// argument error of the call.
static WorkPtr submit(CommunicatorImpl& impl, Op&& op) {
  if (op.opts.timeout && op.opts.timeout->count() < 0) {
    Checker(impl.label(), op.coll)
        .fail("timeout", "must be >= 0 ms (leave it unset for the communicator's), got " +
                             std::to_string(op.opts.timeout->count()) + " ms");
  }
  if (op.coll != Coll::kSend && op.coll != Coll::kRecv) {
    if (!op.opts.algorithm.empty()) {
      op.algo = coll::find_algorithm(op.coll, op.opts.algorithm);
      if (!op.algo) {
        Checker(impl.label(), op.coll).fail("algorithm", "unknown algorithm '" + op.opts.algorithm + "'");
      }
    }  // otherwise chosen when it runs, from the size and the topology
  }
  return impl.enqueue(std::move(op));
}

WorkPtr Communicator::allreduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                                const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kAllreduce);
  ck.dtype(dt);
  ck.count("count", count, 1, dt);
  ck.reduce_op(dt, op);
  ck.buffer("send", send, count);
  ck.buffer("recv", recv, count);
  ck.no_overlap(send, count * dtype_size(dt), recv, count * dtype_size(dt));
  Op p = make_op(Coll::kAllreduce, o);
  p.args = coll::Args{send, recv, count, dt, op};
  p.user_op = op;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::broadcast(void* buf, size_t count, DataType dt, int root, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kBroadcast);
  ck.dtype(dt);
  ck.count("count", count, 1, dt);
  ck.root(root, size());
  ck.buffer("buf", buf, count);
  Op p = make_op(Coll::kBroadcast, o);
  p.args = coll::Args{buf, buf, count, dt};
  p.args.root = root;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::reduce(const void* send, void* recv, size_t count, DataType dt, ReduceOp op,
                             int root, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kReduce);
  ck.dtype(dt);
  ck.count("count", count, 1, dt);
  ck.reduce_op(dt, op);
  ck.root(root, size());
  ck.buffer("send", send, count);
  if (rank() == root) {
    ck.buffer("recv", recv, count);
    ck.no_overlap(send, count * dtype_size(dt), recv, count * dtype_size(dt));
  }
  Op p = make_op(Coll::kReduce, o);
  p.args = coll::Args{send, rank() == root ? recv : nullptr, count, dt, op};
  p.args.root = root;
  p.user_op = op;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::allgather(const void* send, void* recv, size_t count, DataType dt,
                                const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kAllgather);
  ck.dtype(dt);
  ck.count("count", count, static_cast<size_t>(size()), dt);
  ck.buffer("send", send, count);
  ck.buffer("recv", recv, count * size());
  const size_t es = dtype_size(dt);
  // In place: send is this rank's block of recv (or recv itself).
  const char* own = static_cast<const char*>(recv) + count * es * rank();
  if (send != recv && send != own) ck.no_overlap(send, count * es, recv, count * es * size());
  Op p = make_op(Coll::kAllgather, o);
  p.args = coll::Args{send == own ? recv : send, recv, count, dt};
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::allgatherv(const void* send, void* recv, std::vector<size_t> recv_counts,
                                 std::vector<size_t> displs, DataType dt, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kAllgatherv);
  ck.dtype(dt);
  ck.vec("recv_counts", recv_counts, size());
  ck.counts("recv_counts", recv_counts, dt);
  displs = displacements(ck, "displs", recv_counts, std::move(displs), size());
  ck.ends("displs", recv_counts, displs, dt);
  const size_t mine = recv_counts[rank()];
  const size_t ext = extent(recv_counts, displs);
  ck.buffer("send", send, mine);
  ck.buffer("recv", recv, ext);
  Op p = make_op(Coll::kAllgatherv, o);
  const size_t es = dtype_size(dt);
  const char* own = static_cast<const char*>(recv) + displs[rank()] * es;
  // In place: send is this rank's block of recv (or recv itself).
  if (send != recv && send != own) ck.no_overlap(send, mine * es, recv, ext * es);
  p.args = coll::Args{send == own ? recv : send, recv, mine, dt};
  p.counts = std::move(recv_counts);
  p.displs = std::move(displs);
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::reduce_scatter(const void* send, void* recv, size_t count, DataType dt,
                                     ReduceOp op, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kReduceScatter);
  ck.dtype(dt);
  ck.count("count", count, static_cast<size_t>(size()), dt);
  ck.reduce_op(dt, op);
  ck.buffer("send", send, count * size());
  ck.buffer("recv", recv, count);
  const size_t es = dtype_size(dt);
  ck.no_overlap(send, count * es * size(), recv, count * es);
  if (send == recv && size() > 1 && count > 0) {
    ck.fail("recv", "reduce_scatter cannot run in place (recv is smaller than send)");
  }
  Op p = make_op(Coll::kReduceScatter, o);
  p.args = coll::Args{send, recv, count, dt, op};
  p.user_op = op;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::reduce_scatterv(const void* send, void* recv, std::vector<size_t> recv_counts,
                                      DataType dt, ReduceOp op, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kReduceScatterv);
  ck.dtype(dt);
  ck.reduce_op(dt, op);
  ck.vec("recv_counts", recv_counts, size());
  ck.counts("recv_counts", recv_counts, dt);
  auto displs = displacements(ck, "displs", recv_counts, {}, size());
  const size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  ck.buffer("send", send, total);
  ck.buffer("recv", recv, recv_counts[rank()]);
  const size_t es = dtype_size(dt);
  ck.no_overlap(send, total * es, recv, recv_counts[rank()] * es);
  if (send == recv && size() > 1 && total > 0) {
    ck.fail("recv", "reduce_scatterv cannot run in place");
  }
  Op p = make_op(Coll::kReduceScatterv, o);
  p.args = coll::Args{send, recv, recv_counts[rank()], dt, op};
  p.user_op = op;
  p.counts = std::move(recv_counts);
  p.displs = std::move(displs);
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::alltoall(const void* send, void* recv, size_t count, DataType dt,
                               const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kAlltoall);
  ck.dtype(dt);
  ck.count("count", count, static_cast<size_t>(size()), dt);
  ck.buffer("send", send, count * size());
  ck.buffer("recv", recv, count * size());
  const size_t bytes = count * dtype_size(dt) * size();
  ck.no_overlap(send, bytes, recv, bytes);
  Op p = make_op(Coll::kAlltoall, o);
  p.args = coll::Args{send, recv, count, dt};
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::alltoallv(const void* send, std::vector<size_t> send_counts,
                                std::vector<size_t> send_displs, void* recv,
                                std::vector<size_t> recv_counts, std::vector<size_t> recv_displs,
                                DataType dt, const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kAlltoallv);
  ck.dtype(dt);
  ck.vec("send_counts", send_counts, size());
  ck.vec("recv_counts", recv_counts, size());
  ck.counts("send_counts", send_counts, dt);
  ck.counts("recv_counts", recv_counts, dt);
  send_displs = displacements(ck, "send_displs", send_counts, std::move(send_displs), size());
  recv_displs = displacements(ck, "recv_displs", recv_counts, std::move(recv_displs), size());
  ck.ends("send_displs", send_counts, send_displs, dt);
  ck.ends("recv_displs", recv_counts, recv_displs, dt);
  const size_t es = dtype_size(dt);
  const size_t sext = extent(send_counts, send_displs), rext = extent(recv_counts, recv_displs);
  ck.buffer("send", send, sext);
  ck.buffer("recv", recv, rext);
  if (send_counts[rank()] != recv_counts[rank()]) {
    ck.fail("send_counts", "this rank sends itself " + std::to_string(send_counts[rank()]) +
                               " elements but expects " + std::to_string(recv_counts[rank()]));
  }
  if (send != recv) ck.no_overlap(send, sext * es, recv, rext * es);
  Op p = make_op(Coll::kAlltoallv, o);
  p.args = coll::Args{send, recv, 0, dt};
  p.counts = std::move(recv_counts);
  p.displs = std::move(recv_displs);
  p.send_counts = std::move(send_counts);
  p.send_displs = std::move(send_displs);
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::gather(const void* send, void* recv, size_t count, DataType dt, int root,
                             const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kGather);
  ck.dtype(dt);
  ck.count("count", count, static_cast<size_t>(size()), dt);
  ck.root(root, size());
  ck.buffer("send", send, count);
  const size_t es = dtype_size(dt);
  if (rank() == root) {
    ck.buffer("recv", recv, count * size());
    const char* own = static_cast<const char*>(recv) + count * es * rank();
    if (send != recv && send != own) ck.no_overlap(send, count * es, recv, count * es * size());
    if (send == own) send = recv;
  }
  Op p = make_op(Coll::kGather, o);
  p.args = coll::Args{send, rank() == root ? recv : nullptr, count, dt};
  p.args.root = root;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::scatter(const void* send, void* recv, size_t count, DataType dt, int root,
                              const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kScatter);
  ck.dtype(dt);
  ck.count("count", count, static_cast<size_t>(size()), dt);
  ck.root(root, size());
  ck.buffer("recv", recv, count);
  const size_t es = dtype_size(dt);
  if (rank() == root) {
    ck.buffer("send", send, count * size());
    const char* own = static_cast<const char*>(send) + count * es * rank();
    if (recv != send && recv != own) ck.no_overlap(send, count * es * size(), recv, count * es);
  }
  Op p = make_op(Coll::kScatter, o);
  p.args = coll::Args{rank() == root ? send : nullptr, recv, count, dt};
  p.args.root = root;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::barrier(const OpOptions& o) {
  Op p = make_op(Coll::kBarrier, o);
  p.args = coll::Args{nullptr, nullptr, 0, DataType::kUInt8};
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::send(const void* buf, size_t count, DataType dt, int peer, int64_t tag,
                           const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kSend);
  ck.dtype(dt);
  ck.count("count", count, 1, dt);
  ck.buffer("buf", buf, count);
  if (peer < 0 || peer >= size() || peer == rank()) {
    ck.fail("peer", std::to_string(peer) + " is not another rank of " + std::to_string(size()));
  }
  if (tag < 0) ck.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Op p = make_op(Coll::kSend, o);
  p.args = coll::Args{buf, nullptr, count, dt};
  p.peer = peer;
  p.tag = tag;
  return submit(*impl_, std::move(p));
}

WorkPtr Communicator::recv(void* buf, size_t count, DataType dt, int peer, int64_t tag,
                           const OpOptions& o) {
  Checker ck(impl_->label(), Coll::kRecv);
  ck.dtype(dt);
  ck.count("count", count, 1, dt);
  ck.buffer("buf", buf, count);
  if (peer != kAnySource && (peer < 0 || peer >= size() || peer == rank())) {
    ck.fail("peer", std::to_string(peer) + " is not another rank of " + std::to_string(size()));
  }
  if (tag < 0) ck.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Op p = make_op(Coll::kRecv, o);
  p.args = coll::Args{nullptr, buf, count, dt};
  p.peer = peer;
  p.tag = tag;
  return submit(*impl_, std::move(p));
}

}  // namespace shoal
