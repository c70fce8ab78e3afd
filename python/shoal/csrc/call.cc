// call.cc — the argument checks and the staging of a Call (call.h).
#include "call.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace shoal::torch_adapter {

std::optional<DataType> native_dtype(at::ScalarType st) {
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

std::optional<DataType> complex_parts(at::ScalarType st) {
  switch (st) {
    case at::kComplexHalf: return DataType::kFloat16;
    case at::kComplexFloat: return DataType::kFloat32;
    case at::kComplexDouble: return DataType::kFloat64;
    default: return std::nullopt;
  }
}

std::string dtype_str(at::ScalarType st) { return std::string(c10::getDtypeNames(st).first); }

std::string join(const std::vector<int>& v) {
  std::ostringstream o;
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  return o.str();
}

std::string idx(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }
std::string idx(const char* name, size_t i, size_t j) { return idx(name, i) + "[" + std::to_string(j) + "]"; }

// ---------------------------------------------------------------- checks

Call::Call(ShoalBackend& be, const char* coll, c10d::OpType type, std::chrono::milliseconds timeout,
           bool collective)
    : be_(be), coll_(coll), type_(type), collective_(collective), comm_(be.comm()),
      oo_(be.op_options(timeout)) {
  if (!comm_) fail("backend", "this process group's shoal backend was shut down");
}

void Call::fail(const std::string& arg, const std::string& what) const {
  TORCH_CHECK(false, "shoal rank ", be_.getRank(), ": ", coll_, ": ", arg, ": ", what);
}

int Call::rank() const { return be_.getRank(); }
int Call::size() const { return be_.getSize(); }

void Call::one(const char* arg, const std::vector<at::Tensor>& v) const {
  if (v.size() != 1) {
    fail(arg, "expected exactly one tensor (one per process), got " + std::to_string(v.size()));
  }
}

void Call::list_len(const std::string& arg, size_t got, size_t want, const char* what) const {
  if (got != want) {
    fail(arg, "has " + std::to_string(got) + " entries, expected " + std::to_string(want) + " (" + what + ")");
  }
}

void Call::tensor(const std::string& arg, const at::Tensor& t) {
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

void Call::like(const std::string& arg, const at::Tensor& t, const std::string& ref_arg, const at::Tensor& ref,
                int64_t numel) {
  tensor(arg, t);
  if (t.scalar_type() != ref.scalar_type()) {
    fail(arg, "dtype " + dtype_str(t.scalar_type()) + " differs from " + ref_arg + "'s " +
                  dtype_str(ref.scalar_type()) + " (all tensors of one call must share a dtype)");
  }
  if (numel >= 0 && t.numel() != numel) {
    fail(arg, "has " + std::to_string(t.numel()) + " elements, expected " + std::to_string(numel));
  }
}

bool Call::per_rank_list(const char* arg, const std::vector<at::Tensor>& list, const char* ref_arg,
                         const at::Tensor& ref) {
  list_len(arg, list.size(), static_cast<size_t>(size()), "one tensor per rank of the group");
  bool even = true;
  for (size_t r = 0; r < list.size(); ++r) {
    like(idx(arg, r), list[r], ref_arg, ref);
    even = even && list[r].numel() == ref.numel();
  }
  return even;
}

void Call::root(int64_t root, const char* arg) const {
  if (root < 0 || root >= size()) {
    fail(arg, std::to_string(root) + " is out of range for a group of " + std::to_string(size()) + " ranks");
  }
}

const at::Tensor& Call::rooted_one(const std::vector<at::Tensor>& tensors, int64_t root_rank, int64_t root_tensor) {
  one("tensors", tensors);
  root(root_rank);
  if (root_tensor != 0) fail("root_tensor", "must be 0 (one tensor per process)");
  tensor("tensor", tensors[0]);
  return tensors[0];
}

void Call::writable(const std::string& arg, const at::Tensor& t) const {
  if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
    fail(arg, "its elements share memory (an expand()ed view or similar), so results cannot be written "
              "to it; pass a tensor of its own (e.g. .clone())");
  }
}

// ---------------------------------------------------------------- element types

Elem Call::move_elem(const at::Tensor& t) const {
  if (auto dt = native_dtype(t.scalar_type())) return Elem{*dt, 1};
  return Elem{DataType::kUInt8, static_cast<size_t>(t.element_size())};
}

ReduceOp Call::reduce_op(const c10d::ReduceOp& op) {
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

Elem Call::reduce_elem(const std::string& arg, const at::Tensor& t, ReduceOp op) const {
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

// ---------------------------------------------------------------- staging

at::Tensor Call::in(const at::Tensor& t) {
  if (!device_) {
    at::Tensor c = t.contiguous();
    keep_.push_back(c);
    return c;
  }
  at::Tensor h = host_like(t);
  put(h, t);
  return h;
}

at::Tensor Call::scratch(int64_t numel, const at::Tensor& like) {
  at::Tensor c = device_ ? device_->pool.acquire(static_cast<size_t>(numel) * like.element_size(),
                                                 like.scalar_type(), false)
                         : at::empty({numel}, like.options().memory_format(at::MemoryFormat::Contiguous));
  keep_.push_back(c);
  return c;
}

void Call::put(const at::Tensor& dst, const at::Tensor& src) {
  if (!device_) {
    dst.copy_(src);
    return;
  }
  keep_.push_back(src);
  keep_.push_back(dst);
  downs_.emplace_back(dst, src);
}

at::Tensor Call::pack(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
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

void Call::unpack(const at::Tensor& flat, std::vector<at::Tensor> ts) {
  for (auto& t : ts) written_.push_back(t);
  on_success([flat, ts] {
    int64_t off = 0;
    for (auto t : ts) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()), /*non_blocking=*/true);
      off += t.numel();
    }
  });
}

void Call::on_success(std::function<void()> fn, const std::vector<at::Tensor>& targets) {
  for (auto& t : targets) written_.push_back(t);
  finishers_.push_back(std::move(fn));
}

at::Tensor Call::written(const at::Tensor& t, const std::string& arg, bool read) {
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

at::Tensor Call::host_like(const at::Tensor& t) {
  return device_->pool.acquire(static_cast<size_t>(t.numel()) * t.element_size(), t.scalar_type(), false)
      .view(t.sizes());
}

}  // namespace shoal::torch_adapter
