// call.h — one c10d call of the shoal backend: its argument checks and its
// staging (backend.cc says what each call does).
//
// Every argument is checked on the calling thread, naming it, before
// anything is queued; tensors shoal cannot use directly (non-contiguous ones,
// lists that must be one buffer) are staged into contiguous buffers (pack)
// and copied back when the operation has completed (unpack, copy-back).
//
// Device tensors (device.h): all tensors of one call are on one device, the
// one the group uses on this rank. Every tensor the core reads gets a host
// staging buffer filled on the device's d2h stream after the caller's
// current stream (planned here, queued at launch); every tensor it writes
// gets one copied back on the h2d stream at completion. The same staging
// calls (in, inout, out, scratch, pack, put, unpack) serve both: on the CPU
// they copy only what is not contiguous.
// Element types: reductions need a type shoal's kernels know (float16,
// bfloat16, float32, float64, int8, uint8, int32, int64, bool; complex as
// pairs of reals for sum/avg/premul_sum). Data movement takes any dtype:
// types shoal does not know travel as bytes.
//
// A Call lives on the calling thread for one c10d call; not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {


inline std::optional<DataType> native_dtype(at::ScalarType st) {
  switch (st) {
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default: return std::nullopt;
  }
}

// The real type a complex type is a pair of.
inline std::optional<DataType> complex_parts(at::ScalarType st) {
  switch (st) {
    case at::kComplexHalf: return DataType::kFloat16;
    case at::kComplexFloat: return DataType::kFloat32;
    case at::kComplexDouble: return DataType::kFloat64;
    default: return std::nullopt;
  }
}

// "float32", "int16", ... as torch spells them in Python (torch.<name>).
inline std::string dtype_str(at::ScalarType st) { return std::string(c10::getDtypeNames(st).first); }

inline std::string join(const std::vector<int>& v) {
  std::ostringstream o;
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  return o.str();
}

inline std::string idx(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }
inline std::string idx(const char* name, size_t i, size_t j) {
  return idx(name, i) + "[" + std::to_string(j) + "]";
}

// Whether the caller waits for the result before going on: PyTorch 2.7 and
// newer say so in the options (`async_op=False` in Python); older ones do not,
// and the operation is queued as before.
template <class O, class = void>
struct HasAsyncOp : std::false_type {};
template <class O>
struct HasAsyncOp<O, std::void_t<decltype(std::declval<const O&>().asyncOp)>> : std::true_type {};
template <class O>
inline bool synchronous(const O& opts) {
  if constexpr (HasAsyncOp<O>::value) {
    return !opts.asyncOp;
  } else {
    return false;
  }
}



// How a tensor travels: shoal element type and elements per torch element.
struct Elem {
  DataType dt = DataType::kUInt8;
  size_t factor = 1;
  size_t count(const at::Tensor& t) const { return static_cast<size_t>(t.numel()) * factor; }
  size_t count(int64_t numel) const { return static_cast<size_t>(numel) * factor; }
};

// The shoal operations of a call, issued later (possibly on the Issuer's
// thread): everything they use is captured by value.
using Issue = std::function<std::vector<WorkPtr>(Communicator&, const OpOptions&)>;

// Builds one c10d call: checks, staging, the shoal operations, the work.
class Call {
 public:
  Call(ShoalBackend& be, const char* coll, c10d::OpType type, std::chrono::milliseconds timeout,
       bool collective = true)
      : be_(be), coll_(coll), type_(type), collective_(collective), comm_(be.comm()),
        oo_(be.op_options(timeout)) {
    if (!comm_) fail("backend", "this process group's shoal backend was shut down");
  }
  // A collective with c10d's options: their timeout, and whether the caller
  // waits at once (then a small collective runs in the calling thread).
  template <class O>
  Call(ShoalBackend& be, const char* coll, c10d::OpType type, const O& opts)
      : Call(be, coll, type, opts.timeout) {
    oo_.blocking = synchronous(opts);
  }

  [[noreturn]] void fail(const std::string& arg, const std::string& what) const {
    TORCH_CHECK(false, "shoal rank ", be_.getRank(), ": ", coll_, ": ", arg, ": ", what);
  }

  int rank() const { return be_.getRank(); }
  int size() const { return be_.getSize(); }
  OpOptions& oo() { return oo_; }
  // The device side when the call's tensors are on a device, else null.
  const std::shared_ptr<DeviceSide>& device() const { return device_; }

  void one(const char* arg, const std::vector<at::Tensor>& v) const {
    if (v.size() != 1) {
      fail(arg, "expected exactly one tensor (one per process), got " + std::to_string(v.size()));
    }
  }
  void list_len(const std::string& arg, size_t got, size_t want, const char* what) const {
    if (got != want) {
      fail(arg, "has " + std::to_string(got) + " entries, expected " + std::to_string(want) + " (" +
                    what + ")");
    }
  }

  void tensor(const std::string& arg, const at::Tensor& t) {
    if (!t.defined()) fail(arg, "undefined tensor");
    if (t.layout() != at::kStrided) {
      fail(arg, "only dense (strided) tensors are supported, got layout " + c10::str(t.layout()));
    }
    const c10::Device d = t.device();
    if (placed_) {
      if (d != *placed_) {
        fail(arg, "tensor is on " + d.str() + " but " + placed_arg_ + " is on " + placed_->str() +
                      " (all tensors of one call must be on one device)");
      }
      return;
    }
    if (d.is_meta()) {
      fail(arg, "tensor is on the meta device, which holds no data (shoal takes cpu tensors and those of an "
                "accelerator such as cuda)");
    }
    if (!d.is_cpu()) {
      std::string why;
      device_ = be_.device_side(d, &why);
      if (!device_) fail(arg, why);
    }
    placed_ = d;
    placed_arg_ = arg;
  }
  // `t` must have ref's dtype (and numel, when `numel` >= 0).
  void like(const std::string& arg, const at::Tensor& t, const std::string& ref_arg, const at::Tensor& ref,
            int64_t numel = -1) {
    tensor(arg, t);
    if (t.scalar_type() != ref.scalar_type()) {
      fail(arg, "dtype " + dtype_str(t.scalar_type()) + " differs from " + ref_arg + "'s " +
                    dtype_str(ref.scalar_type()) + " (all tensors of one call must share a dtype)");
    }
    if (numel >= 0 && t.numel() != numel) {
      fail(arg, "has " + std::to_string(t.numel()) + " elements, expected " + std::to_string(numel));
    }
  }
  // A list with one tensor per rank of the group, each of ref's dtype.
  // Returns true when every entry also has ref's element count.
  bool per_rank_list(const char* arg, const std::vector<at::Tensor>& list, const char* ref_arg,
                     const at::Tensor& ref) {
    list_len(arg, list.size(), static_cast<size_t>(size()), "one tensor per rank of the group");
    bool even = true;
    for (size_t r = 0; r < list.size(); ++r) {
      like(idx(arg, r), list[r], ref_arg, ref);
      even = even && list[r].numel() == ref.numel();
    }
    return even;
  }
  void root(int64_t root, const char* arg = "root") const {
    if (root < 0 || root >= size()) {
      fail(arg, std::to_string(root) + " is out of range for a group of " + std::to_string(size()) + " ranks");
    }
  }
  // A rooted collective's one tensor (broadcast, reduce): checks the list,
  // the root and c10d's root_tensor, and returns the tensor, itself checked.
  const at::Tensor& rooted_one(const std::vector<at::Tensor>& tensors, int64_t root_rank, int64_t root_tensor) {
    one("tensors", tensors);
    root(root_rank);
    if (root_tensor != 0) fail("root_tensor", "must be 0 (one tensor per process)");
    tensor("tensor", tensors[0]);
    return tensors[0];
  }

  // Data movement: any dtype.
  Elem move_elem(const at::Tensor& t) const {
    if (auto dt = native_dtype(t.scalar_type())) return Elem{*dt, 1};
    return Elem{DataType::kUInt8, static_cast<size_t>(t.element_size())};
  }

  // Reductions: maps the op (and its premul factor) and checks it fits the dtype.
  ReduceOp reduce_op(const c10d::ReduceOp& op) {
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return ReduceOp::kSum;
      case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
      case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
      case c10d::ReduceOp::MIN: return ReduceOp::kMin;
      case c10d::ReduceOp::MAX: return ReduceOp::kMax;
      case c10d::ReduceOp::BAND: return ReduceOp::kBand;
      case c10d::ReduceOp::BOR: return ReduceOp::kBor;
      case c10d::ReduceOp::BXOR: return ReduceOp::kBxor;
      case c10d::ReduceOp::PREMUL_SUM: {
        auto* sup = dynamic_cast<PreMulSumFactor*>(op.supplement_.get());
        if (!sup) fail("op", "PREMUL_SUM without its factor (make it with torch.distributed._make_nccl_premul_sum)");
        if (sup->tensor_factor.defined()) {
          const at::Tensor& f = sup->tensor_factor;
          if (!f.defined() || f.numel() != 1) fail("op (premul_sum factor)", "must be a one-element tensor");
          oo_.scale = f.item<double>();  // on any device: its value, read now
        } else {
          oo_.scale = sup->double_factor;
        }
        return ReduceOp::kPremulSum;
      }
      default: fail("op", "unknown reduce op " + std::to_string(static_cast<int>(op.op_)));
    }
  }
  Elem reduce_elem(const std::string& arg, const at::Tensor& t, ReduceOp op) const {
    const std::string opname(reduce_op_name(op));
    const std::string tname = dtype_str(t.scalar_type());
    Elem e;
    if (auto dt = native_dtype(t.scalar_type())) {
      e = Elem{*dt, 1};
    } else if (auto parts = complex_parts(t.scalar_type())) {
      if (op != ReduceOp::kSum && op != ReduceOp::kAvg && op != ReduceOp::kPremulSum) {
        fail(arg, "op " + opname + " is not defined for complex dtype " + tname + " (only sum, avg, premul_sum)");
      }
      e = Elem{*parts, 2};
    } else {
      fail(arg, "dtype " + tname + " cannot be reduced by shoal (supported: float16, bfloat16, float32, "
                "float64, int8, uint8, int32, int64, bool, complex)");
    }
    if (std::string why; !reduce_supported(e.dt, op, &why)) {
      fail("op", (why.rfind("op: ", 0) == 0 ? why.substr(4) : why) + " (tensor dtype " + tname + ")");
    }
    return e;
  }

  // A tensor the call writes must not have elements that share memory (an
  // expand()ed view): the copy back into it would fail only after the data
  // had gone out, leaving this rank out of step with the others.
  void writable(const std::string& arg, const at::Tensor& t) const {
    if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
      fail(arg, "its elements share memory (an expand()ed view or similar), so results cannot be written "
                "to it; pass a tensor of its own (e.g. .clone())");
    }
  }

  // Staging. in(): read-only input; inout(): read then overwritten; out():
  // written only. What the core gets is contiguous host memory: the tensor
  // itself when it is, else a copy (of its values, for in/inout), copied back
  // at completion (after the custom finishers) for inout/out.
  at::Tensor in(const at::Tensor& t) {
    if (!device_) {
      at::Tensor c = t.contiguous();
      keep_.push_back(c);
      return c;
    }
    at::Tensor h = host_like(t);
    put(h, t);
    return h;
  }
  at::Tensor inout(const at::Tensor& t, const std::string& arg) { return written(t, arg, true); }
  at::Tensor out(const at::Tensor& t, const std::string& arg) { return written(t, arg, false); }
  // A flat buffer the core works in, of like's dtype.
  at::Tensor scratch(int64_t numel, const at::Tensor& like) {
    at::Tensor c = device_ ? device_->pool.acquire(static_cast<size_t>(numel) * like.element_size(),
                                                   like.scalar_type(), false)
                           : at::empty({numel}, like.options().memory_format(at::MemoryFormat::Contiguous));
    keep_.push_back(c);
    return c;
  }
  // Fills `dst` (host staging, e.g. a view of a scratch) with `src`'s values
  // before the operation: at once on the CPU, on the d2h stream on a device.
  void put(const at::Tensor& dst, const at::Tensor& src) {
    if (!device_) {
      dst.copy_(src);
      return;
    }
    keep_.push_back(src);
    keep_.push_back(dst);
    downs_.emplace_back(dst, src);
  }
  // Packs tensors (any strides) one after the other into a new flat buffer.
  at::Tensor pack(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
    int64_t total = 0;
    for (auto& t : ts) total += t.numel();
    at::Tensor flat = scratch(total, like);
    int64_t off = 0;
    for (auto& t : ts) {
      put(flat.narrow(0, off, t.numel()).view(t.sizes()), t);
      off += t.numel();
    }
    return flat;
  }
  // The mirror of pack(): at completion, copies `flat`'s consecutive pieces
  // into `ts` (any strides), in order.
  void unpack(const at::Tensor& flat, std::vector<at::Tensor> ts) {
    for (auto& t : ts) written_.push_back(t);
    on_success([flat, ts] {
      int64_t off = 0;
      for (auto t : ts) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()), /*non_blocking=*/true);
        off += t.numel();
      }
    });
  }
  // The tensors a profiler event of this call shows as its inputs (default:
  // the outputs, which are also the inputs of in-place collectives).
  void profile(std::vector<at::Tensor> inputs) { profiled_ = std::move(inputs); }

  // Work at completion (copies into `targets`, which the call writes).
  void on_success(std::function<void()> fn, const std::vector<at::Tensor>& targets = {}) {
    for (auto& t : targets) written_.push_back(t);
    finishers_.push_back(std::move(fn));
  }

  // Queues the shoal operations `issue` returns and hands back the work.
  c10::intrusive_ptr<c10d::Work> launch(std::vector<at::Tensor> outputs, Issue issue);
  // all_reduce of one contiguous device tensor in pieces (device_allreduce.cc).
  c10::intrusive_ptr<c10d::Work> launch_pipelined_allreduce(const at::Tensor& t, const Elem& e, ReduceOp op);

 private:
  // A tensor the operation writes: itself when contiguous on the host, else
  // a contiguous host buffer (holding its values when `read`) that is
  // copied back at completion.
  at::Tensor written(const at::Tensor& t, const std::string& arg, bool read) {
    if (!device_ && t.is_contiguous()) {
      keep_.push_back(t);
      return t;
    }
    writable(arg, t);
    at::Tensor c;
    if (device_) {
      c = host_like(t);
      if (read) put(c, t);
    } else {
      c = read ? t.contiguous() : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    }
    keep_.push_back(c);
    keep_.push_back(t);
    copy_back_.emplace_back(t, c);
    return c;
  }
  // A contiguous host staging buffer shaped like `t`.
  at::Tensor host_like(const at::Tensor& t) {
    return device_->pool.acquire(static_cast<size_t>(t.numel()) * t.element_size(), t.scalar_type(), false)
        .view(t.sizes());
  }
  c10::intrusive_ptr<ShoalWork> make_work(std::vector<at::Tensor> outputs, std::shared_ptr<c10::Event> ready);

  ShoalBackend& be_;
  const char* coll_;
  c10d::OpType type_;
  bool collective_;
  std::shared_ptr<Communicator> comm_;
  OpOptions oo_;
  std::optional<c10::Device> placed_;  // the device of the call's first tensor
  std::string placed_arg_;
  std::shared_ptr<DeviceSide> device_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> finishers_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_;  // (user tensor, staging)
  std::vector<std::pair<at::Tensor, at::Tensor>> downs_;      // (host staging, device source)
  std::vector<at::Tensor> written_;                           // device tensors finishers write
  std::optional<std::vector<at::Tensor>> profiled_;
};

}  // namespace shoal::torch_adapter
