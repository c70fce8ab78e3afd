// The collective kernels: allreduce (fused), allgather (uneven first
// dimension), broadcast, alltoall, reduce-scatter, barrier.
#include <cstring>

#include "adapter.h"
#include "shoal/error.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace shoal_tf {
namespace {

using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Collectives run in the kernel's own thread when nothing is queued ahead of
// them (OpOptions::blocking): the caller waits for them anyway (the ops run one
// after the other, adapter.h), and a wait in the calling thread may spin
// where the communicator's executor thread would sleep and be woken. A
// second phase (after a size exchange) follows the same way from the first's
// completion. Sends and receives stay asynchronous.
shoal::OpOptions inline_options() {
  shoal::OpOptions o;
  o.blocking = true;
  return o;
}
const shoal::OpOptions kInline = inline_options();

shoal::ReduceOp reduce_attr(OpKernelConstruction* c) {
  std::string name;
  shoal::ReduceOp op = shoal::ReduceOp::kSum;
  auto st = c->GetAttr("reduce_op", &name);
  if (!st.ok()) {
    c->CtxFailure(__FILE__, __LINE__, st);
    return op;
  }
  shoal::parse_reduce_op(name, &op);  // the attribute's allowed values are all known
  return op;
}

// Checks the dtype of `t` (and that `op` applies to it); false after refusing the call.
bool element_type(const std::shared_ptr<Pending>& p, const Tensor& t, const std::string& arg, shoal::DataType* dt,
                  const shoal::ReduceOp* op = nullptr) {
  if (!to_shoal(t.dtype(), dt)) {
    p->expect(1);
    p->fail(absl::InvalidArgumentError(p->what() + ": " + arg + ": dtype " + tensorflow::DataTypeString(t.dtype()) +
                                       " is not supported"));
    return false;
  }
  std::string why;
  if (op && !shoal::reduce_supported(*dt, *op, &why)) {
    p->expect(1);
    p->fail(absl::InvalidArgumentError(p->what() + ": " + arg + ": " + why));
    return false;
  }
  return true;
}

void finish_on(const std::shared_ptr<Pending>& p, const shoal::WorkPtr& w) {
  when_done(w, [p](std::exception_ptr e) { p->finish(e); });
}

// Product of the dimensions after the first.
int64_t row_elems(const TensorShape& s) {
  int64_t n = 1;
  for (int i = 1; i < s.dims(); ++i) n *= s.dim_size(i);
  return n;
}

// ----------------------------------------------------------------- allreduce

class AllreduceOp : public Kernel {
 public:
  explicit AllreduceOp(OpKernelConstruction* c) : Kernel(c, "allreduce") {
    op_ = reduce_attr(c);
    OP_REQUIRES_OK(c, c->GetAttr("fusion_bytes", &fusion_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    tensorflow::OpInputList in;
    tensorflow::OpOutputList out;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->input_list("tensors", &in), done);
    OP_REQUIRES_OK_ASYNC(ctx, ctx->output_list("reduced", &out), done);
    const int n = in.size();
    std::vector<shoal::DataType> dts(n);
    std::vector<Tensor*> outs(n);
    for (int i = 0; i < n; ++i) {
      if (!element_type(p, in[i], "tensors[" + std::to_string(i) + "]", &dts[i], &op_)) return;
      // the input's buffer when nothing else holds it (in graph mode, a gradient): reduced in place
      OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({i}, i, in[i].shape(), &outs[i]), done);
    }
    // Buckets: runs of one dtype up to fusion_ bytes (a larger tensor alone).
    std::vector<std::vector<int>> buckets;
    size_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const size_t b = in[i].TotalBytes();
      if (buckets.empty() || dts[i] != dts[buckets.back().front()] ||
          bytes + b > static_cast<size_t>(std::max<int64_t>(fusion_, 1))) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().push_back(i);
      bytes += b;
    }
    p->expect(static_cast<int>(buckets.size()) + 1);  // + 1: this call, until everything is issued
    for (size_t k = 0; k < buckets.size(); ++k) {
      try {
        issue(ctx, c, p, in, outs, dts, buckets[k]);
      } catch (...) {
        for (size_t j = k; j < buckets.size(); ++j) p->finish(std::current_exception());
        break;
      }
    }
    p->finish(nullptr);
  }

 private:
  void issue(OpKernelContext* ctx, const std::shared_ptr<shoal::Communicator>& c, const std::shared_ptr<Pending>& p,
             const tensorflow::OpInputList& in, const std::vector<Tensor*>& outs,
             const std::vector<shoal::DataType>& dts, const std::vector<int>& idx) {
    const shoal::DataType dt = dts[idx.front()];
    if (idx.size() == 1) {
      const int i = idx.front();
      if (in[i].NumElements() == 0) return p->finish(nullptr);
      return finish_on(p, c->allreduce(data(in[i]), data(*outs[i]), in[i].NumElements(), dt, op_, kInline));
    }
    int64_t total = 0;
    for (int i : idx) total += in[i].NumElements();
    Tensor flat;
    auto st = ctx->allocate_temp(in[idx.front()].dtype(), TensorShape({total}), &flat);
    if (!st.ok()) return p->fail(absl_status(st));
    char* base = data(flat);
    size_t off = 0;
    std::vector<std::pair<char*, size_t>> back;
    for (int i : idx) {
      const size_t b = in[i].TotalBytes();
      if (b) std::memcpy(base + off, data(in[i]), b);
      back.emplace_back(data(*outs[i]), b);
      off += b;
    }
    auto w = c->allreduce(base, base, total, dt, op_, kInline);
    when_done(w, [p, flat, back = std::move(back)](std::exception_ptr e) {
      if (!e) {
        const char* src = data(flat);
        for (const auto& [dst, b] : back) {
          if (b) std::memcpy(dst, src, b);
          src += b;
        }
      }
      p->finish(e);
    });
  }

  shoal::ReduceOp op_;
  int64_t fusion_ = 0;
};

// ----------------------------------------------------------------- allgather

// What every rank tells the others before an allgather: its first dimension
// and what must agree (rank, the other dimensions, dtype).
struct ShapeHeader {
  int64_t v[4];  // dims, first dim, hash of the other dims, dtype
  static ShapeHeader of(const Tensor& t) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 1; i < t.dims(); ++i) h = (h ^ static_cast<uint64_t>(t.dim_size(i))) * 1099511628211ull;
    return {{t.dims(), t.dim_size(0), static_cast<int64_t>(h), static_cast<int64_t>(t.dtype())}};
  }
};

class AllgatherOp : public Kernel {
 public:
  explicit AllgatherOp(OpKernelConstruction* c) : Kernel(c, "allgather") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    const Tensor& in = ctx->input(0);
    shoal::DataType dt;
    if (!element_type(p, in, "tensor", &dt)) return;
    if (in.dims() < 1) return refuse(p, "tensor: allgather needs at least one dimension, got a scalar");
    struct State {
      ShapeHeader mine;
      std::vector<ShapeHeader> all;
    };
    auto s = std::make_shared<State>();
    s->mine = ShapeHeader::of(in);
    s->all.resize(c->size());
    p->expect(1);
    guarded(p, [&] {
      auto w = c->allgather(s->mine.v, s->all.data(), 4, shoal::DataType::kInt64, kInline);
      when_done(w, [p, s, c, ctx, in, dt](std::exception_ptr e) {
        if (e) return p->finish(e);
        int64_t rows = 0;
        std::vector<size_t> counts;
        for (size_t k = 0; k < s->all.size(); ++k) {
          const ShapeHeader& h = s->all[k];
          if (h.v[0] != s->mine.v[0] || h.v[2] != s->mine.v[2] || h.v[3] != s->mine.v[3]) {
            return p->fail(absl::InvalidArgumentError(
                p->what() + ": tensor: rank " + std::to_string(k) + "'s tensor (" + std::to_string(h.v[0]) +
                " dimensions, first " + std::to_string(h.v[1]) + ") differs from this rank's " + shape_text(in.shape()) +
                " " + tensorflow::DataTypeString(in.dtype()) +
                " beyond the first dimension or in dtype; only the first dimension may differ"));
          }
          rows += h.v[1];
          counts.push_back(static_cast<size_t>(h.v[1] * row_elems(in.shape())));
        }
        TensorShape shape = in.shape();
        shape.set_dim(0, rows);
        Tensor* out = nullptr;
        auto st = ctx->allocate_output(0, shape, &out);
        if (!st.ok()) return p->fail(absl_status(st));
        if (out->NumElements() == 0) return p->finish(nullptr);
        p->expect(1);
        guarded(p, [&] { finish_on(p, c->allgatherv(data(in), data(*out), counts, {}, dt, kInline)); });
        p->finish(nullptr);
      });
    });
  }
};

// ----------------------------------------------------------------- broadcast

class BroadcastOp : public Kernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* c) : Kernel(c, "broadcast") { OP_REQUIRES_OK(c, c->GetAttr("root", &root_)); }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    const Tensor& in = ctx->input(0);
    shoal::DataType dt;
    if (!element_type(p, in, "tensor", &dt)) return;
    if (root_ < 0 || root_ >= c->size()) {
      return refuse(p, "root: " + std::to_string(root_) + " is not a rank of a group of " + std::to_string(c->size()));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, in.shape(), &out), done);
    if (in.TotalBytes() && data(*out) != data(in)) std::memcpy(data(*out), data(in), in.TotalBytes());
    p->expect(1);
    guarded(p, [&] { finish_on(p, c->broadcast(data(*out), in.NumElements(), dt, static_cast<int>(root_), kInline)); });
  }

 private:
  int64_t root_ = 0;
};

// ----------------------------------------------------------------- alltoall

class AlltoallOp : public Kernel {
 public:
  explicit AlltoallOp(OpKernelConstruction* c) : Kernel(c, "alltoall") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    const Tensor& in = ctx->input(0);
    const Tensor& splits_t = ctx->input(1);
    shoal::DataType dt;
    if (!element_type(p, in, "tensor", &dt)) return;
    if (in.dims() < 1) return refuse(p, "tensor: alltoall needs at least one dimension, got a scalar");
    const int n = c->size();
    const int64_t rows = in.dim_size(0);
    auto send = std::make_shared<std::vector<int64_t>>(n);
    if (splits_t.NumElements() == 0) {
      if (rows % n) {
        return refuse(p, "tensor: the first dimension (" + std::to_string(rows) + ") does not divide into " +
                             std::to_string(n) + " equal parts; pass splits");
      }
      for (auto& x : *send) x = rows / n;
    } else {
      if (splits_t.dims() != 1 || splits_t.NumElements() != n) {
        return refuse(p, "splits: needs one entry per rank (" + std::to_string(n) + "), got shape " +
                             shape_text(splits_t.shape()));
      }
      auto v = splits_t.flat<int64_t>();
      int64_t sum = 0;
      for (int k = 0; k < n; ++k) {
        if (v(k) < 0) return refuse(p, "splits[" + std::to_string(k) + "] is negative (" + std::to_string(v(k)) + ")");
        (*send)[k] = v(k);
        sum += v(k);
      }
      if (sum != rows) {
        return refuse(p, "splits: sum to " + std::to_string(sum) + " but the first dimension is " + std::to_string(rows));
      }
    }
    Tensor* rsplits = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({n}), &rsplits), done);
    int64_t* recv = rsplits->flat<int64_t>().data();
    p->expect(1);
    guarded(p, [&] {
      auto w = c->alltoall(send->data(), recv, 1, shoal::DataType::kInt64, kInline);
      when_done(w, [p, c, ctx, in, dt, send, recv, n](std::exception_ptr e) {
        if (e) return p->finish(e);
        const int64_t row = row_elems(in.shape());
        int64_t total = 0;
        std::vector<size_t> sc(n), rc(n);
        for (int k = 0; k < n; ++k) {
          if (recv[k] < 0) return p->fail(absl::InternalError(p->what() + ": a negative split arrived"));
          sc[k] = static_cast<size_t>((*send)[k] * row);
          rc[k] = static_cast<size_t>(recv[k] * row);
          total += recv[k];
        }
        TensorShape shape = in.shape();
        shape.set_dim(0, total);
        Tensor* out = nullptr;
        auto st = ctx->allocate_output(0, shape, &out);
        if (!st.ok()) return p->fail(absl_status(st));
        p->expect(1);
        guarded(p, [&] { finish_on(p, c->alltoallv(data(in), sc, {}, data(*out), rc, {}, dt, kInline)); });
        p->finish(nullptr);
      });
    });
  }
};

// ----------------------------------------------------------------- reduce-scatter

class ReduceScatterOp : public Kernel {
 public:
  explicit ReduceScatterOp(OpKernelConstruction* c) : Kernel(c, "reduce_scatter") { op_ = reduce_attr(c); }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    const Tensor& in = ctx->input(0);
    shoal::DataType dt;
    if (!element_type(p, in, "tensor", &dt, &op_)) return;
    if (in.dims() < 1) return refuse(p, "tensor: reduce_scatter needs at least one dimension, got a scalar");
    const int n = c->size();
    const int64_t rows = in.dim_size(0), row = row_elems(in.shape());
    std::vector<size_t> counts(n);
    for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>((rows / n + (k < rows % n ? 1 : 0)) * row);
    TensorShape shape = in.shape();
    shape.set_dim(0, rows / n + (c->rank() < rows % n ? 1 : 0));
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, shape, &out), done);
    p->expect(1);
    guarded(p, [&] { finish_on(p, c->reduce_scatterv(data(in), data(*out), counts, dt, op_, kInline)); });
  }

 private:
  shoal::ReduceOp op_;
};

// ----------------------------------------------------------------- barrier

class BarrierOp : public Kernel {
 public:
  explicit BarrierOp(OpKernelConstruction* c) : Kernel(c, "barrier") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    p->expect(1);
    guarded(p, [&] { finish_on(p, c->barrier(kInline)); });
  }
};

}  // namespace

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("ShoalAllreduce").Device(DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("ShoalAllgather").Device(DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("ShoalBroadcast").Device(DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("ShoalAlltoall").Device(DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("ShoalReduceScatter").Device(DEVICE_CPU), ReduceScatterOp);
REGISTER_KERNEL_BUILDER(Name("ShoalBarrier").Device(DEVICE_CPU), BarrierOp);

}  // namespace shoal_tf
