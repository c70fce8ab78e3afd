// Point-to-point kernels: ShoalSend sends a header (dtype, shape) and the
// bytes; ShoalRecv receives the header, allocates its output, then the bytes.
// A (peer, tag) pair carries one tensor at a time: the header travels under
// tag 2t and the bytes under 2t + 1.
//
// A send completes (its kernel calls done) once it is issued, as MPI_Isend
// returns: the tensor is kept alive until the bytes are gone, and a program
// whose ranks send to each other before receiving cannot deadlock.
// ShoalWaitSends waits for the group's sends issued so far and reports the
// first failure among them.
#include <algorithm>
#include <cstring>
#include <map>

#include "adapter.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace shoal_tf {
namespace {

using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int kMaxDims = 32;

// The sends in flight, per group.
struct InFlight {
  std::mutex mu;
  std::map<int64_t, std::vector<shoal::WorkPtr>> works;  // under mu

  void add(int64_t gid, shoal::WorkPtr w) {
    std::lock_guard<std::mutex> g(mu);
    auto& v = works[gid];
    v.erase(std::remove_if(v.begin(), v.end(), [](const shoal::WorkPtr& x) { return x->test() && !x->error(); }),
            v.end());
    v.push_back(std::move(w));
  }
  std::vector<shoal::WorkPtr> take(int64_t gid) {
    std::lock_guard<std::mutex> g(mu);
    std::vector<shoal::WorkPtr> out;
    out.swap(works[gid]);
    return out;
  }
};

InFlight& in_flight() {
  static InFlight* f = new InFlight;
  return *f;
}
constexpr int64_t kMaxTag = int64_t{1} << 61;

struct Header {
  int64_t v[2 + kMaxDims];  // dtype, dims, the dimensions
};

// Reads and checks the peer and tag inputs; false after refusing the call.
bool peer_and_tag(OpKernelContext* ctx, const std::shared_ptr<Pending>& p, const shoal::Communicator& c, int base,
                  int* peer, int64_t* tag) {
  const Tensor& pt = ctx->input(base);
  const Tensor& tt = ctx->input(base + 1);
  auto refuse = [&](const std::string& m) {
    p->expect(1);
    p->fail(absl::InvalidArgumentError(p->what() + ": " + m));
    return false;
  };
  if (pt.NumElements() != 1 || tt.NumElements() != 1) return refuse("peer and tag must be scalars");
  *peer = pt.flat<int32_t>()(0);
  *tag = tt.flat<int64_t>()(0);
  if (*peer < 0 || *peer >= c.size() || *peer == c.rank()) {
    return refuse("peer: " + std::to_string(*peer) + " is not another rank of a group of " + std::to_string(c.size()));
  }
  if (*tag < 0 || *tag >= kMaxTag) return refuse("tag: " + std::to_string(*tag) + " is outside [0, 2^61)");
  return true;
}

class SendOp : public Kernel {
 public:
  explicit SendOp(OpKernelConstruction* c) : Kernel(c, "send") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    const Tensor& in = ctx->input(0);
    int peer;
    int64_t tag;
    if (!peer_and_tag(ctx, p, *c, 1, &peer, &tag)) return;
    shoal::DataType dt;
    if (!to_shoal(in.dtype(), &dt)) {
      return refuse(p, "tensor: dtype " + tensorflow::DataTypeString(in.dtype()) + " is not supported");
    }
    if (in.dims() > kMaxDims) return refuse(p, "tensor: more than " + std::to_string(kMaxDims) + " dimensions");
    auto h = std::make_shared<Header>();
    std::memset(h.get(), 0, sizeof(Header));
    h->v[0] = in.dtype();
    h->v[1] = in.dims();
    for (int i = 0; i < in.dims(); ++i) h->v[2 + i] = in.dim_size(i);
    p->expect(1);
    try {
      // the header and the tensor stay alive until their bytes are gone
      Tensor keep = in;
      auto w = c->send(h->v, 2 + kMaxDims, shoal::DataType::kInt64, peer, 2 * tag);
      w->on_complete([h] {});
      in_flight().add(group_, w);
      if (in.NumElements()) {
        auto w2 = c->send(data(in), in.NumElements(), dt, peer, 2 * tag + 1);
        w2->on_complete([keep] {});
        in_flight().add(group_, w2);
      }
    } catch (...) {
      return p->finish(std::current_exception());
    }
    p->finish(nullptr);
  }
};

class WaitSendsOp : public Kernel {
 public:
  explicit WaitSendsOp(OpKernelConstruction* c) : Kernel(c, "wait_sends") {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    auto works = in_flight().take(group_);
    p->expect(static_cast<int>(works.size()) + 1);
    for (auto& w : works) when_done(w, [p](std::exception_ptr e) { p->finish(e); });
    p->finish(nullptr);
  }
};

class RecvOp : public Kernel {
 public:
  explicit RecvOp(OpKernelConstruction* c) : Kernel(c, "recv") { OP_REQUIRES_OK(c, c->GetAttr("T", &type_)); }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    std::shared_ptr<Pending> p;
    auto c = begin(ctx, done, &p);
    if (!c) return;
    int peer;
    int64_t tag;
    if (!peer_and_tag(ctx, p, *c, 0, &peer, &tag)) return;
    shoal::DataType dt;
    if (!to_shoal(type_, &dt)) return refuse(p, "T: dtype " + tensorflow::DataTypeString(type_) + " is not supported");
    auto h = std::make_shared<Header>();
    const auto type = type_;
    p->expect(1);
    guarded(p, [&] {
      auto w = c->recv(h->v, 2 + kMaxDims, shoal::DataType::kInt64, peer, 2 * tag);
      when_done(w, [p, h, c, ctx, peer, tag, dt, type](std::exception_ptr e) {
        if (e) return p->finish(e);
        if (h->v[0] != type) {
          return p->fail(absl::InvalidArgumentError(
              p->what() + ": rank " + std::to_string(peer) + " sent a " +
              tensorflow::DataTypeString(static_cast<tensorflow::DataType>(h->v[0])) + " tensor, this rank expects " +
              tensorflow::DataTypeString(type)));
        }
        TensorShape shape;
        for (int i = 0; i < h->v[1] && i < kMaxDims; ++i) shape.AddDim(h->v[2 + i]);
        Tensor* out = nullptr;
        auto st = ctx->allocate_output(0, shape, &out);
        if (!st.ok()) return p->fail(absl_status(st));
        if (out->NumElements()) {
          p->expect(1);
          guarded(p, [&] { finish_on_recv(p, c->recv(data(*out), out->NumElements(), dt, peer, 2 * tag + 1)); });
        }
        p->finish(nullptr);
      });
    });
  }

 private:
  static void finish_on_recv(const std::shared_ptr<Pending>& p, const shoal::WorkPtr& w) {
    when_done(w, [p](std::exception_ptr e) { p->finish(e); });
  }
  tensorflow::DataType type_;
};

}  // namespace

using tensorflow::DEVICE_CPU;
REGISTER_KERNEL_BUILDER(Name("ShoalSend").Device(DEVICE_CPU).HostMemory("peer").HostMemory("tag"), SendOp);
REGISTER_KERNEL_BUILDER(Name("ShoalWaitSends").Device(DEVICE_CPU), WaitSendsOp);
REGISTER_KERNEL_BUILDER(Name("ShoalRecv").Device(DEVICE_CPU).HostMemory("peer").HostMemory("tag"), RecvOp);

}  // namespace shoal_tf
