// core/lowering.cc — Lowering (lowering.h).
#include "core/lowering.h"

#include "kernels/reduce.h"

namespace shoal::core {

using coll::Coll;

namespace {

// Elements of the buffer a reducing collective's input spans.
size_t input_elems(const Op& op, int size) {
  switch (op.coll) {
    case Coll::kReduceScatter: return op.args.count * static_cast<size_t>(size);
    case Coll::kReduceScatterv: {
      size_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    default: return op.args.count;
  }
}

size_t output_elems(const Op& op, int rank) {
  return op.coll == Coll::kReduceScatterv ? op.counts[static_cast<size_t>(rank)] : op.args.count;
}

}  // namespace

Lowering::Lowering(const Op& op, int size) : args_(op.args), size_(size) {
  coll::Args& a = args_;
  if (coll::is_reducing(op.coll)) {
    a.op = (op.user_op == ReduceOp::kAvg || op.user_op == ReduceOp::kPremulSum) ? ReduceOp::kSum : op.user_op;
    if (op.user_op == ReduceOp::kPremulSum) {
      const size_t n = input_elems(op, size);
      if (op.coll == Coll::kAllreduce) {
        kernels::scale(a.dt, a.recv, a.send, op.opts.scale, n);
        a.send = a.recv;
      } else {
        premul_.resize(n * a.elem());
        kernels::scale(a.dt, premul_.data(), a.send, op.opts.scale, n);
        a.send = premul_.data();
      }
    }
  }
  if (op.coll == Coll::kAllgatherv || op.coll == Coll::kReduceScatterv || op.coll == Coll::kAlltoallv) {
    a.counts = op.counts.data();
    a.displs = op.displs.data();
    a.send_counts = op.send_counts.empty() ? nullptr : op.send_counts.data();
    a.send_displs = op.send_displs.empty() ? nullptr : op.send_displs.data();
  }
}

void Lowering::finish(const Op& op, int rank) const {
  if (!coll::is_reducing(op.coll) || op.user_op != ReduceOp::kAvg) return;
  if (op.coll == Coll::kReduce && rank != args_.root) return;  // no output here
  kernels::divide(args_.dt, args_.recv, args_.recv, size_, output_elems(op, rank));
}

uint64_t fingerprint_count(const Op& op) {
  switch (op.coll) {
    case Coll::kAllgatherv:
    case Coll::kReduceScatterv: {
      uint64_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    case Coll::kAlltoallv: return 0;  // per-pair sizes are checked per message
    default: return op.args.count;
  }
}

bool moves_nothing(const Op& op) {
  // Ranks of an alltoallv may disagree on emptiness only when their peers
  // send them nothing as well; running the exchange anyway keeps everyone in step.
  return fingerprint_count(op) == 0 && op.coll != Coll::kBarrier && op.coll != Coll::kAlltoallv;
}

}  // namespace shoal::core
