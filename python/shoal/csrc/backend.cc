// backend.cc — every c10d collective mapped onto shoal::Communicator.
//
// Each call: (1) checks every argument on the calling thread, naming it,
// before anything is queued; (2) stages tensors shoal cannot use directly
// (non-contiguous ones, lists that must be one buffer); (3) queues one shoal
// operation (sometimes a few) and returns a ShoalWork that completes when
// they have, after copying results into the caller's tensors.
//
// Lists of tensors (allgather/gather/scatter/reduce_scatter/alltoall with
// lists, and the *_coalesced ops) are flattened into one contiguous buffer and
// moved with ONE shoal collective, then unflattened at completion: one
// sequence number, one fingerprint check, one round of latency. Lists whose
// tensors differ in size use the v-variants (allgatherv, reduce_scatterv,
// alltoallv).
//
// Element types: reductions need a type shoal's kernels know (float16,
// bfloat16, float32, float64, int8, uint8, int32, int64, bool; complex as
// pairs of reals for sum/avg/premul_sum). Data movement takes any dtype: types
// shoal does not know travel as bytes.
#include "backend.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <type_traits>
#include <utility>

#include "common/env.h"
#include "shoal/error.h"
#include "store_adapter.h"

namespace shoal::torch_adapter {
namespace {

// Internal point-to-point tags live above any tag a torch user can pass (int).
constexpr int64_t kMonitoredBarrierTag = int64_t{1} << 40;

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

// The real type a complex type is a pair of.
std::optional<DataType> complex_parts(at::ScalarType st) {
  switch (st) {
    case at::kComplexHalf: return DataType::kFloat16;
    case at::kComplexFloat: return DataType::kFloat32;
    case at::kComplexDouble: return DataType::kFloat64;
    default: return std::nullopt;
  }
}

// "float32", "int16", ... as torch spells them in Python (torch.<name>).
std::string dtype_str(at::ScalarType st) { return std::string(c10::getDtypeNames(st).first); }

std::string join(const std::vector<int>& v) {
  std::ostringstream o;
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  return o.str();
}

std::string idx(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }
std::string idx(const char* name, size_t i, size_t j) {
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
bool synchronous(const O& opts) {
  if constexpr (HasAsyncOp<O>::value) {
    return !opts.asyncOp;
  } else {
    return false;
  }
}

}  // namespace

// How a tensor travels: shoal element type and elements per torch element.
struct Elem {
  DataType dt = DataType::kUInt8;
  size_t factor = 1;
  size_t count(const at::Tensor& t) const { return static_cast<size_t>(t.numel()) * factor; }
  size_t count(int64_t numel) const { return static_cast<size_t>(numel) * factor; }
};

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

  void tensor(const std::string& arg, const at::Tensor& t) const {
    if (!t.defined()) fail(arg, "undefined tensor");
    if (t.layout() != at::kStrided) {
      fail(arg, "only dense (strided) tensors are supported, got layout " + c10::str(t.layout()));
    }
    if (!t.device().is_cpu()) {
      fail(arg, "tensor is on " + t.device().str() + ", but the shoal backend is registered for cpu tensors");
    }
  }
  // `t` must have ref's dtype (and numel, when `numel` >= 0).
  void like(const std::string& arg, const at::Tensor& t, const std::string& ref_arg, const at::Tensor& ref,
            int64_t numel = -1) const {
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
                     const at::Tensor& ref) const {
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
        auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
        if (!sup) fail("op", "PREMUL_SUM without its factor (make it with torch.distributed._make_nccl_premul_sum)");
        if (sup->tensor_factor.defined()) {
          tensor("op (premul_sum factor)", sup->tensor_factor);
          oo_.scale = sup->tensor_factor.item<double>();
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
    const bool floating = is_floating(e.dt);
    if ((op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor) && floating) {
      fail("op", "bitwise " + opname + " needs an integer or bool dtype, got " + tname);
    }
    if (op == ReduceOp::kPremulSum && !floating) fail("op", "premul_sum needs a floating dtype, got " + tname);
    if (op == ReduceOp::kAvg && e.dt == DataType::kBool) fail("op", "avg is not defined for bool");
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
  // written only. Non-contiguous tensors get a contiguous copy; results are
  // copied back at completion (after the custom finishers).
  at::Tensor in(const at::Tensor& t) {
    at::Tensor c = t.contiguous();
    keep_.push_back(c);
    return c;
  }
  at::Tensor inout(const at::Tensor& t, const std::string& arg) {
    if (t.is_contiguous()) {
      keep_.push_back(t);
      return t;
    }
    writable(arg, t);
    at::Tensor c = t.contiguous();
    keep_.push_back(c);
    copy_back_.emplace_back(t, c);
    return c;
  }
  at::Tensor out(const at::Tensor& t, const std::string& arg) {
    if (t.is_contiguous()) {
      keep_.push_back(t);
      return t;
    }
    writable(arg, t);
    at::Tensor c = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    keep_.push_back(c);
    copy_back_.emplace_back(t, c);
    return c;
  }
  at::Tensor scratch(int64_t numel, const at::Tensor& like) {
    at::Tensor c = at::empty({numel}, like.options().memory_format(at::MemoryFormat::Contiguous));
    keep_.push_back(c);
    return c;
  }
  // Packs tensors (any strides) one after the other into a new flat buffer.
  at::Tensor pack(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
    int64_t total = 0;
    for (auto& t : ts) total += t.numel();
    at::Tensor flat = scratch(total, like);
    int64_t off = 0;
    for (auto& t : ts) {
      flat.narrow(0, off, t.numel()).view(t.sizes()).copy_(t);
      off += t.numel();
    }
    return flat;
  }
  void on_success(std::function<void()> fn) { finishers_.push_back(std::move(fn)); }

  // Queues the shoal operations `issue` returns and hands back the work.
  c10::intrusive_ptr<c10d::Work> launch(std::vector<at::Tensor> outputs,
                                        const std::function<std::vector<WorkPtr>(Communicator&)>& issue) {
    std::vector<WorkPtr> works;
    try {
      works = issue(*comm_);
    } catch (const shoal::InvalidArgument& e) {
      TORCH_CHECK(false, e.what());
    } catch (const shoal::Error& e) {
      C10_THROW_ERROR(DistBackendError, e.what());
    }
    // Counted only once the operation is queued (a call the core refused, e.g.
    // for overlapping buffers, counts nothing), so that ranks agree.
    const uint64_t seq = collective_ ? ++be_.seq_ : 0;
    auto work = c10::make_intrusive<ShoalWork>(rank(), type_, std::move(outputs), seq);
    for (auto& t : keep_) work->keep(std::move(t));
    for (auto& f : finishers_) work->on_success(std::move(f));
    for (auto& [user, staged] : copy_back_) {
      work->on_success([user = user, staged = staged]() mutable { user.copy_(staged); });
    }
    ShoalWork::start(work, std::move(works), be_.completer_->queue());
    return work;
  }

 private:
  ShoalBackend& be_;
  const char* coll_;
  c10d::OpType type_;
  bool collective_;
  std::shared_ptr<Communicator> comm_;
  OpOptions oo_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> finishers_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_;
};

// ---------------------------------------------------------------- lifecycle

namespace {

// The communicators this process created afresh (not split), with their
// global ranks, in creation order: a later group whose ranks they all hold
// is split from the first of them and reuses its connections.
struct Root {
  std::weak_ptr<Communicator> comm;
  std::vector<int64_t> global_ranks;
};
std::mutex g_roots_mu;
std::vector<Root> g_roots;  // GUARDED_BY(g_roots_mu)

bool share_connections() {
  const std::string s = shoal::env::get("SHOAL_GROUP_CONNECTIONS").value();
  if (s == "shared") return true;
  if (s == "own") return false;
  throw shoal::InvalidArgument("SHOAL_GROUP_CONNECTIONS: '" + s + "' is not one of shared, own");
}

}  // namespace

// A group's communicator: split from the first live root communicator that
// holds all its ranks, else a fresh one, which becomes a root. The group's
// rank 0 decides (a broken root, or SHOAL_GROUP_CONNECTIONS=own there, means
// fresh) and tells the others through the group's store; they find the same
// root (roots are created in the same order on every rank, and each member
// holds every root that holds the group).
std::shared_ptr<Communicator> ShoalBackend::make_communicator(const std::shared_ptr<shoal::Store>& store, int rank,
                                                              int size, const shoal::Options& o) {
  std::vector<int64_t> ranks = cfg_.global_ranks;
  if (ranks.empty()) {
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  }
  std::shared_ptr<Communicator> parent;
  std::vector<int> members;
  {
    std::lock_guard<std::mutex> g(g_roots_mu);
    g_roots.erase(std::remove_if(g_roots.begin(), g_roots.end(), [](const Root& r) { return r.comm.expired(); }),
                  g_roots.end());
    for (const Root& root : g_roots) {
      members.clear();
      for (int64_t gr : ranks) {
        auto it = std::find(root.global_ranks.begin(), root.global_ranks.end(), gr);
        if (it == root.global_ranks.end()) break;
        members.push_back(static_cast<int>(it - root.global_ranks.begin()));
      }
      if (members.size() == ranks.size() && (parent = root.comm.lock())) break;
    }
  }
  const std::string kKey = "shoal/connections";
  bool split = false;
  if (size > 1 || parent) {
    if (rank == 0) {
      try {
        split = share_connections() && parent && !parent->error();
      } catch (const shoal::InvalidArgument& e) {
        store->set_str(kKey, std::string("error ") + e.what());  // the others would wait for the answer
        throw;
      }
      store->set_str(kKey, split ? "shared" : "own");
    } else {
      (void)share_connections();  // a bad value here is this rank's own error, before any wait
      const std::string answer = store->get_str(kKey);
      if (answer.rfind("error ", 0) == 0) throw shoal::InvalidArgument("the group's rank 0: " + answer.substr(6));
      split = answer == "shared";
      if (split && !parent) {
        throw shoal::InvalidArgument(
            "the group's rank 0 splits it from a communicator this rank does not have (groups created in "
            "another order on different ranks?)");
      }
    }
  }
  if (split) return parent->split(members, store, o);  // blocks until the group's rank 0 has split
  auto comm = Communicator::create(store, rank, size, o);
  std::lock_guard<std::mutex> g(g_roots_mu);
  g_roots.push_back(Root{comm, ranks});
  return comm;
}

ShoalBackend::ShoalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           BackendConfig cfg)
    : c10d::Backend(rank, size), cfg_(std::move(cfg)), default_timeout_ms_(0) {
  shoal::Options o;
  o.timeout = cfg_.timeout;
  // PyTorch hands each group (and device) a store under its own prefix.
  o.name = "torch";
  o.advertise_host = cfg_.advertise_host;
  o.store_host_rank = cfg_.store_host_rank;
  try {
    comm_ = make_communicator(std::make_shared<C10dStore>(store), rank, size, o);
  } catch (const shoal::InvalidArgument& e) {
    TORCH_CHECK(false, "shoal: creating the ", cfg_.name, " backend: ", e.what());
  } catch (const shoal::Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("shoal: creating the ") + cfg_.name + " backend: " + e.what());
  }
  completer_ = std::make_unique<Completer>();
  init();
}

ShoalBackend::~ShoalBackend() {
  std::shared_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> g(mu_);
    comm.swap(comm_);
  }
  comm.reset();       // aborts what is still queued; their works fail (Aborted)
  completer_.reset();  // drains the completions, then joins
}

std::shared_ptr<Communicator> ShoalBackend::comm() const {
  std::lock_guard<std::mutex> g(mu_);
  return comm_;
}

// c10d's options carry kUnsetTimeout (-1 ms) when the caller gave none: then
// the group's (setTimeout), else the communicator's. Any other value is the
// caller's, 0 included (fail at once, as Gloo does); a negative one is refused
// by the core's argument check.
std::optional<std::chrono::milliseconds> ShoalBackend::resolve_timeout(std::chrono::milliseconds timeout) const {
  if (timeout != c10d::kUnsetTimeout) return timeout;
  if (int64_t d = default_timeout_ms_.load(); d > 0) return std::chrono::milliseconds(d);
  return std::nullopt;
}

OpOptions ShoalBackend::op_options(std::chrono::milliseconds timeout) const {
  OpOptions o;
  o.timeout = resolve_timeout(timeout);
  return o;
}

void ShoalBackend::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "shoal: setTimeout: timeout must be > 0");
  default_timeout_ms_ = timeout.count();
}

void ShoalBackend::setSequenceNumberForGroup() { seq_ = 0; }
uint64_t ShoalBackend::getSequenceNumberForGroup() { return seq_; }

c10d::ErrorType ShoalBackend::getError() {
  auto c = comm();
  return c && c->error() ? c10d::ErrorType::COMM_ERROR : c10d::ErrorType::SUCCESS;
}

void ShoalBackend::abort() {
  if (auto c = comm()) c->abort("aborted through torch.distributed (process group abort)");
}

void ShoalBackend::shutdown() {
  std::shared_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> g(mu_);
    comm.swap(comm_);
  }
}

std::string ShoalBackend::comm_error() const {
  auto c = comm();
  if (!c || !c->error()) return "";
  try {
    std::rethrow_exception(c->error());
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// ---------------------------------------------------------------- reductions

c10::intrusive_ptr<c10d::Work> ShoalBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  Call c(*this, "allreduce", c10d::OpType::ALLREDUCE, opts);
  c.one("tensors", tensors);
  const at::Tensor& t = tensors[0];
  c.tensor("tensor", t);
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensor", t, op);
  at::Tensor b = c.inout(t, "tensor");
  return c.launch({t}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.allreduce(b.data_ptr(), b.data_ptr(), e.count(b), e.dt, op, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Call c(*this, "allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, opts);
  if (tensors.empty()) c.fail("tensors", "empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    c.like(idx("tensors", i), tensors[i], "tensors[0]", tensors[0]);
    c.writable(idx("tensors", i), tensors[i]);
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensors[0]", tensors[0], op);
  at::Tensor flat = c.pack(tensors, tensors[0]);
  std::vector<at::Tensor> outs = tensors;
  c.on_success([outs, flat] {
    int64_t off = 0;
    for (auto t : outs) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  });
  return c.launch(tensors, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.allreduce(flat.data_ptr(), flat.data_ptr(), e.count(flat), e.dt, op, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  Call c(*this, "reduce", c10d::OpType::REDUCE, opts);
  c.one("tensors", tensors);
  c.root(opts.rootRank);
  if (opts.rootTensor != 0) c.fail("root_tensor", "must be 0 (one tensor per process)");
  const at::Tensor& t = tensors[0];
  c.tensor("tensor", t);
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensor", t, op);
  at::Tensor b = c.inout(t, "tensor");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({t}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.reduce(b.data_ptr(), b.data_ptr(), e.count(b), e.dt, op, root, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  if (input.numel() != output.numel() * getSize()) {
    c.fail("input", "has " + std::to_string(input.numel()) + " elements, expected group size (" +
                        std::to_string(getSize()) + ") x output's " + std::to_string(output.numel()));
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("input", input, op);
  // The output may be a view into the input (its own block): shoal's
  // reduce-scatter cannot run in place, so the input is copied then.
  at::Tensor in = output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : c.in(input);
  if (output.is_alias_of(input)) c.in(in);
  at::Tensor out = c.out(output, "output");
  return c.launch({output}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{
        comm.reduce_scatter(in.data_ptr(), out.data_ptr(), e.count(out), e.dt, op, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter", c10d::OpType::REDUCE_SCATTER, opts);
  c.one("output_tensors", outputs);
  c.list_len("input_tensor_lists", inputs.size(), 1, "one list per process");
  const at::Tensor& o = outputs[0];
  c.tensor("output", o);
  auto& in = inputs[0];
  const bool even = c.per_rank_list("input_list", in, "output", o);
  if (in[getRank()].numel() != o.numel()) {
    c.fail("output", "has " + std::to_string(o.numel()) + " elements but this rank's input_list entry has " +
                         std::to_string(in[getRank()].numel()));
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("output", o, op);
  at::Tensor send = c.pack(in, o);
  at::Tensor out = c.out(o, "output");
  std::vector<size_t> counts;
  for (auto& t : in) counts.push_back(e.count(t));
  return c.launch({o}, [&](Communicator& comm) {
    if (even) {
      return std::vector<WorkPtr>{
          comm.reduce_scatter(send.data_ptr(), out.data_ptr(), e.count(out), e.dt, op, c.oo())};
    }
    return std::vector<WorkPtr>{comm.reduce_scatterv(send.data_ptr(), out.data_ptr(), counts, e.dt, op, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter_tensor_coalesced", c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, opts);
  if (inputs.empty()) c.fail("inputs", "empty list");
  c.list_len("outputs", outputs.size(), inputs.size(), "one output per input");
  const int W = getSize();
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("inputs", i), inputs[i], "inputs[0]", inputs[0]);
    c.like(idx("outputs", i), outputs[i], "inputs[0]", inputs[0]);
    c.writable(idx("outputs", i), outputs[i]);
    if (inputs[i].numel() != outputs[i].numel() * W) {
      c.fail(idx("inputs", i), "has " + std::to_string(inputs[i].numel()) + " elements, expected group size (" +
                                   std::to_string(W) + ") x outputs[" + std::to_string(i) + "]'s " +
                                   std::to_string(outputs[i].numel()));
    }
    S += outputs[i].numel();
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("inputs[0]", inputs[0], op);
  // send: for each rank r, the r-th block of every input, in list order.
  at::Tensor send = c.scratch(S * W, inputs[0]);
  {
    int64_t off = 0;
    for (int r = 0; r < W; ++r) {
      for (auto& t : inputs) {
        const int64_t n = t.numel() / W;
        send.narrow(0, off, n).copy_(t.reshape({-1}).narrow(0, r * n, n));
        off += n;
      }
    }
  }
  at::Tensor recv = c.scratch(S, inputs[0]);
  std::vector<at::Tensor> outs = outputs;
  c.on_success([outs, recv] {
    int64_t off = 0;
    for (auto t : outs) {
      t.copy_(recv.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  });
  return c.launch(outputs, [&](Communicator& comm) {
    return std::vector<WorkPtr>{
        comm.reduce_scatter(send.data_ptr(), recv.data_ptr(), e.count(recv), e.dt, op, c.oo())};
  });
}

// ---------------------------------------------------------------- data movement

c10::intrusive_ptr<c10d::Work> ShoalBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  Call c(*this, "broadcast", c10d::OpType::BROADCAST, opts);
  c.one("tensors", tensors);
  c.root(opts.rootRank);
  if (opts.rootTensor != 0) c.fail("root_tensor", "must be 0 (one tensor per process)");
  const at::Tensor& t = tensors[0];
  c.tensor("tensor", t);
  Elem e = c.move_elem(t);
  at::Tensor b = getRank() == opts.rootRank ? c.in(t) : c.out(t, "tensor");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({t}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.broadcast(b.data_ptr(), e.count(b), e.dt, root, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_into_tensor", c10d::OpType::_ALLGATHER_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  if (output.numel() != input.numel() * getSize()) {
    c.fail("output", "has " + std::to_string(output.numel()) + " elements, expected group size (" +
                         std::to_string(getSize()) + ") x input's " + std::to_string(input.numel()));
  }
  Elem e = c.move_elem(input);
  at::Tensor out = c.out(output, "output");
  // In place when the input is this rank's block of the output.
  at::Tensor in = output.is_contiguous() && output.is_alias_of(input) && input.is_contiguous() ? input : c.in(input);
  return c.launch({output}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.allgather(in.data_ptr(), out.data_ptr(), e.count(in), e.dt, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather", c10d::OpType::ALLGATHER, opts);
  c.one("input_tensors", inputs);
  c.list_len("output_tensor_lists", outputs.size(), 1, "one list per process");
  const at::Tensor& t = inputs[0];
  c.tensor("input", t);
  auto& outs = outputs[0];
  const bool even = c.per_rank_list("output_list", outs, "input", t);
  for (size_t r = 0; r < outs.size(); ++r) c.writable(idx("output_list", r), outs[r]);
  if (outs[getRank()].numel() != t.numel()) {
    c.fail(idx("output_list", getRank()), "has " + std::to_string(outs[getRank()].numel()) +
                                              " elements, but this rank's input has " + std::to_string(t.numel()));
  }
  Elem e = c.move_elem(t);
  at::Tensor in = c.in(t);
  int64_t total = 0;
  std::vector<size_t> counts;
  for (auto& o : outs) {
    counts.push_back(e.count(o));
    total += o.numel();
  }
  at::Tensor recv = c.scratch(total, t);
  std::vector<at::Tensor> dst = outs;
  c.on_success([dst, recv] {
    int64_t off = 0;
    for (auto o : dst) {
      o.copy_(recv.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
  return c.launch(outs, [&](Communicator& comm) {
    if (even) {
      return std::vector<WorkPtr>{comm.allgather(in.data_ptr(), recv.data_ptr(), e.count(in), e.dt, c.oo())};
    }
    return std::vector<WorkPtr>{comm.allgatherv(in.data_ptr(), recv.data_ptr(), counts, {}, e.dt, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, opts);
  if (inputs.empty()) c.fail("input_tensor_list", "empty list");
  const int W = getSize();
  c.list_len("output_tensor_lists", outputs.size(), W, "one list per rank of the group");
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("input_tensor_list", i), inputs[i], "input_tensor_list[0]", inputs[0]);
    S += inputs[i].numel();
  }
  std::vector<at::Tensor> flat_outs;
  for (int r = 0; r < W; ++r) {
    c.list_len(idx("output_tensor_lists", r), outputs[r].size(), inputs.size(), "one tensor per input");
    for (size_t i = 0; i < inputs.size(); ++i) {
      c.like(idx("output_tensor_lists", r, i), outputs[r][i], "input_tensor_list[0]", inputs[0], inputs[i].numel());
      c.writable(idx("output_tensor_lists", r, i), outputs[r][i]);
      flat_outs.push_back(outputs[r][i]);
    }
  }
  Elem e = c.move_elem(inputs[0]);
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(S * W, inputs[0]);
  c.on_success([flat_outs, recv] {
    int64_t off = 0;
    for (auto o : flat_outs) {
      o.copy_(recv.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
  return c.launch(flat_outs, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.allgather(send.data_ptr(), recv.data_ptr(), e.count(send), e.dt, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_into_tensor_coalesced", c10d::OpType::COALESCED, opts);
  if (inputs.empty()) c.fail("inputs", "empty list");
  c.list_len("outputs", outputs.size(), inputs.size(), "one output per input");
  const int W = getSize();
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("inputs", i), inputs[i], "inputs[0]", inputs[0]);
    c.like(idx("outputs", i), outputs[i], "inputs[0]", inputs[0], inputs[i].numel() * W);
    c.writable(idx("outputs", i), outputs[i]);
    S += inputs[i].numel();
  }
  Elem e = c.move_elem(inputs[0]);
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(S * W, inputs[0]);
  std::vector<at::Tensor> outs = outputs;
  const int64_t SS = S;
  c.on_success([outs, recv, W, SS] {
    int64_t off = 0;  // offset of input i inside one rank's block
    for (auto o : outs) {
      const int64_t n = o.numel() / W;
      at::Tensor blocks = recv.view({W, SS}).narrow(1, off, n);  // [W, n]
      if (o.is_contiguous()) {
        o.view({W, n}).copy_(blocks);
      } else {
        o.copy_(blocks.reshape(o.sizes()));
      }
      off += n;
    }
  });
  return c.launch(outputs, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.allgather(send.data_ptr(), recv.data_ptr(), e.count(send), e.dt, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  Call c(*this, "gather", c10d::OpType::GATHER, opts);
  c.root(opts.rootRank);
  c.one("input_tensors", inputs);
  const at::Tensor& t = inputs[0];
  c.tensor("input", t);
  const bool is_root = getRank() == opts.rootRank;
  std::vector<at::Tensor> dst;
  if (is_root) {
    c.list_len("gather_list", outputs.size(), 1, "one list on the root");
    dst = outputs[0];
    c.list_len("gather_list", dst.size(), getSize(), "one tensor per rank of the group");
    for (size_t r = 0; r < dst.size(); ++r) {
      c.like(idx("gather_list", r), dst[r], "input", t, t.numel());
      c.writable(idx("gather_list", r), dst[r]);
    }
  }
  Elem e = c.move_elem(t);
  at::Tensor in = c.in(t);
  at::Tensor recv;
  if (is_root) {
    recv = c.scratch(t.numel() * getSize(), t);
    c.on_success([dst, recv] {
      int64_t off = 0;
      for (auto o : dst) {
        o.copy_(recv.narrow(0, off, o.numel()).view(o.sizes()));
        off += o.numel();
      }
    });
  }
  const int root = static_cast<int>(opts.rootRank);
  return c.launch(dst, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.gather(in.data_ptr(), recv.defined() ? recv.data_ptr() : nullptr,
                                            e.count(in), e.dt, root, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  Call c(*this, "scatter", c10d::OpType::SCATTER, opts);
  c.root(opts.rootRank);
  c.one("output_tensors", outputs);
  const at::Tensor& o = outputs[0];
  c.tensor("output", o);
  const bool is_root = getRank() == opts.rootRank;
  at::Tensor send;
  if (is_root) {
    c.list_len("scatter_list", inputs.size(), 1, "one list on the root");
    auto& src = inputs[0];
    c.list_len("scatter_list", src.size(), getSize(), "one tensor per rank of the group");
    for (size_t r = 0; r < src.size(); ++r) c.like(idx("scatter_list", r), src[r], "output", o, o.numel());
    send = c.pack(src, o);
  }
  Elem e = c.move_elem(o);
  at::Tensor out = c.out(o, "output");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({o}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.scatter(send.defined() ? send.data_ptr() : nullptr, out.data_ptr(),
                                             e.count(out), e.dt, root, c.oo())};
  });
}

namespace {

// Element counts per rank for alltoall_base's split sizes (rows of dim 0).
std::vector<size_t> split_counts(const Call& c, const char* arg, const at::Tensor& t,
                                 const std::vector<int64_t>& splits, int W, const Elem& e) {
  std::vector<size_t> counts(W);
  if (t.dim() == 0) c.fail(arg, "a 0-dim tensor cannot be split");
  const int64_t rows = t.size(0);
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  if (splits.empty()) {
    if (rows % W != 0) {
      c.fail(arg, "dim 0 (" + std::to_string(rows) + ") does not split equally into " + std::to_string(W) +
                      " ranks; pass split sizes");
    }
    for (int r = 0; r < W; ++r) counts[r] = e.count(rows / W * row);
    return counts;
  }
  const std::string sarg = std::string(arg) + "_split_sizes";
  if (splits.size() != static_cast<size_t>(W)) {
    c.fail(sarg, "has " + std::to_string(splits.size()) + " entries, expected one per rank (" + std::to_string(W) + ")");
  }
  int64_t sum = 0;
  for (int r = 0; r < W; ++r) {
    if (splits[r] < 0) c.fail(sarg, "entry " + std::to_string(r) + " is negative (" + std::to_string(splits[r]) + ")");
    sum += splits[r];
    counts[r] = e.count(splits[r] * row);
  }
  if (sum != rows) {
    c.fail(sarg, "sums to " + std::to_string(sum) + " but " + arg + " has " + std::to_string(rows) + " rows (dim 0)");
  }
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ShoalBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_split_sizes,
                                                           std::vector<int64_t>& input_split_sizes,
                                                           const c10d::AllToAllOptions& opts) {
  Call c(*this, "alltoall_base", c10d::OpType::ALLTOALL_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  const int W = getSize();
  Elem e = c.move_elem(input);
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    if (input.numel() % W != 0) {
      c.fail("input", std::to_string(input.numel()) + " elements do not split equally into " + std::to_string(W) +
                          " ranks; pass split sizes");
    }
    if (output.numel() != input.numel()) {
      c.fail("output", "has " + std::to_string(output.numel()) + " elements, expected " +
                           std::to_string(input.numel()) + " like the input (equal splits)");
    }
    at::Tensor in = output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : input.contiguous();
    c.in(in);
    at::Tensor out = c.out(output, "output");
    return c.launch({output}, [&](Communicator& comm) {
      return std::vector<WorkPtr>{comm.alltoall(in.data_ptr(), out.data_ptr(), e.count(in) / W, e.dt, c.oo())};
    });
  }
  std::vector<size_t> sc = split_counts(c, "input", input, input_split_sizes, W, e);
  std::vector<size_t> rc = split_counts(c, "output", output, output_split_sizes, W, e);
  at::Tensor in = output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : input.contiguous();
  c.in(in);
  at::Tensor out = c.out(output, "output");
  return c.launch({output}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.alltoallv(in.data_ptr(), sc, {}, out.data_ptr(), rc, {}, e.dt, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  Call c(*this, "alltoall", c10d::OpType::ALLTOALL, opts);
  const int W = getSize();
  c.list_len("input_tensor_list", inputs.size(), W, "one tensor per rank of the group");
  c.list_len("output_tensor_list", outputs.size(), W, "one tensor per rank of the group");
  for (int r = 0; r < W; ++r) {
    c.like(idx("input_tensor_list", r), inputs[r], "input_tensor_list[0]", inputs[0]);
    c.like(idx("output_tensor_list", r), outputs[r], "input_tensor_list[0]", inputs[0]);
    c.writable(idx("output_tensor_list", r), outputs[r]);
  }
  Elem e = c.move_elem(inputs[0]);
  std::vector<size_t> sc, rc;
  int64_t total = 0;
  for (int r = 0; r < W; ++r) {
    sc.push_back(e.count(inputs[r]));
    rc.push_back(e.count(outputs[r]));
    total += outputs[r].numel();
  }
  if (sc[getRank()] != rc[getRank()]) {
    c.fail(idx("output_tensor_list", getRank()), "has " + std::to_string(outputs[getRank()].numel()) +
                                                     " elements but this rank sends itself " +
                                                     std::to_string(inputs[getRank()].numel()));
  }
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(total, inputs[0]);
  std::vector<at::Tensor> dst = outputs;
  c.on_success([dst, recv] {
    int64_t off = 0;
    for (auto o : dst) {
      o.copy_(recv.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  });
  return c.launch(outputs, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.alltoallv(send.data_ptr(), sc, {}, recv.data_ptr(), rc, {}, e.dt, c.oo())};
  });
}

// ---------------------------------------------------------------- point to point

c10::intrusive_ptr<c10d::Work> ShoalBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  Call c(*this, "send", c10d::OpType::SEND, c10d::kUnsetTimeout, false);
  c.one("tensors", tensors);
  c.tensor("tensor", tensors[0]);
  if (dst < 0 || dst >= getSize() || dst == getRank()) {
    c.fail("dst", std::to_string(dst) + " is not another rank of this group of " + std::to_string(getSize()));
  }
  if (tag < 0) c.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Elem e = c.move_elem(tensors[0]);
  at::Tensor b = c.in(tensors[0]);
  return c.launch({tensors[0]}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.send(b.data_ptr(), e.count(b), e.dt, dst, tag, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  Call c(*this, "recv", c10d::OpType::RECV, c10d::kUnsetTimeout, false);
  c.one("tensors", tensors);
  c.tensor("tensor", tensors[0]);
  if (src < 0 || src >= getSize() || src == getRank()) {
    c.fail("src", std::to_string(src) + " is not another rank of this group of " + std::to_string(getSize()));
  }
  if (tag < 0) c.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Elem e = c.move_elem(tensors[0]);
  at::Tensor b = c.out(tensors[0], "tensor");
  return c.launch({tensors[0]}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.recv(b.data_ptr(), e.count(b), e.dt, src, tag, c.oo())};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call c(*this, "recv", c10d::OpType::RECVANYSOURCE, c10d::kUnsetTimeout, false);
  c.one("tensors", tensors);
  c.tensor("tensor", tensors[0]);
  if (tag < 0) c.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Elem e = c.move_elem(tensors[0]);
  at::Tensor b = c.out(tensors[0], "tensor");
  return c.launch({tensors[0]}, [&](Communicator& comm) {
    return std::vector<WorkPtr>{comm.recv(b.data_ptr(), e.count(b), e.dt, kAnySource, tag, c.oo())};
  });
}

// ---------------------------------------------------------------- barriers

c10::intrusive_ptr<c10d::Work> ShoalBackend::barrier(const c10d::BarrierOptions& opts) {
  Call c(*this, "barrier", c10d::OpType::BARRIER, opts);
  return c.launch({}, [&](Communicator& comm) { return std::vector<WorkPtr>{comm.barrier(c.oo())}; });
}

// Rank 0 waits for a token from every other rank, up to the timeout, and names
// the ranks that did not send one; then releases them. The waits do not break
// the communicator: a late rank's token is still received later.
void ShoalBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  auto comm = this->comm();
  TORCH_CHECK(comm, "shoal rank ", getRank(), ": monitored_barrier: the backend was shut down");
  const auto timeout = resolve_timeout(opts.timeout).value_or(cfg_.timeout);
  TORCH_CHECK(timeout.count() >= 0, "shoal rank ", getRank(), ": monitored_barrier: timeout: must be >= 0 ms, got ",
              timeout.count(), " ms");
  const int64_t tag = kMonitoredBarrierTag + static_cast<int64_t>(monitored_barrier_count_++);
  const int W = getSize();
  if (W == 1) return;
  auto token = std::make_shared<std::vector<uint8_t>>(W, 1);
  auto rethrow = [&](const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, std::string("shoal rank ") + std::to_string(getRank()) +
                                          ": monitored_barrier: " + e.what());
  };
  try {
    if (getRank() != 0) {
      auto s = comm->send(token->data() + getRank(), 1, DataType::kUInt8, 0, tag);
      auto r = comm->recv(token->data(), 1, DataType::kUInt8, 0, tag);
      s->wait();
      if (!r->wait_for(timeout)) {
        r->on_complete([token] {});  // the buffer outlives the receive
        C10_THROW_ERROR(DistBackendError, "shoal rank " + std::to_string(getRank()) +
                                              ": monitored_barrier: rank 0 did not release the barrier within " +
                                              std::to_string(timeout.count()) + " ms");
      }
      return;
    }
    std::vector<WorkPtr> recvs(W);
    for (int r = 1; r < W; ++r) recvs[r] = comm->recv(token->data() + r, 1, DataType::kUInt8, r, tag);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<int> late;
    for (int r = 1; r < W; ++r) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (!recvs[r]->wait_for(std::max(left, std::chrono::milliseconds(0)))) {
        late.push_back(r);
        recvs[r]->on_complete([token] {});
        if (!wait_all_ranks) break;
      }
    }
    if (!late.empty()) {
      for (int r = late.back() + 1; r < W; ++r) recvs[r]->on_complete([token] {});
      C10_THROW_ERROR(DistBackendError,
                      "shoal rank 0: monitored_barrier: rank" + std::string(late.size() > 1 ? "s " : " ") +
                          join(late) + (late.size() > 1 ? " have" : " has") + " not reached the barrier within " +
                          std::to_string(timeout.count()) + " ms" +
                          (wait_all_ranks ? "" : " (the first one found; pass wait_all_ranks=True for all)"));
    }
    std::vector<WorkPtr> acks;
    for (int r = 1; r < W; ++r) acks.push_back(comm->send(token->data(), 1, DataType::kUInt8, r, tag));
    for (auto& a : acks) a->wait();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow(e);
  }
}

}  // namespace shoal::torch_adapter
