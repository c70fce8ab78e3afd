// call.h — one c10d call of the shoal backend: its argument checks and its
// staging (backend.cc says what each call does; the bodies are in call.cc,
// how a Call reaches the core in launch.cc, the pipelined device all_reduce
// in allreduce_pipelined.cc).
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

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend.h"

namespace shoal::torch_adapter {

// The shoal element type of a torch dtype shoal's kernels know, else nullopt.
std::optional<DataType> native_dtype(at::ScalarType st);
// The real type a complex type is a pair of.
std::optional<DataType> complex_parts(at::ScalarType st);
// "float32", "int16", ... as torch spells them in Python (torch.<name>).
std::string dtype_str(at::ScalarType st);
// "1, 2, 5".
std::string join(const std::vector<int>& v);
// "name[i]" and "name[i][j]": an entry of a list argument, for messages.
std::string idx(const char* name, size_t i);
std::string idx(const char* name, size_t i, size_t j);

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

// How a tensor travels: shoal element type and elements per torch element.
struct Elem {
  DataType dt = DataType::kUInt8;
  size_t factor = 1;
  size_t count(const at::Tensor& t) const { return count(t.numel()); }
  size_t count(int64_t numel) const { return static_cast<size_t>(numel) * factor; }
};

// The shoal operations of a call, issued later (possibly on the Issuer's
// thread): everything they use is captured by value.
using Issue = std::function<std::vector<WorkPtr>(Communicator&, const OpOptions&)>;

// Builds one c10d call: checks, staging, the shoal operations, the work.
class Call {
 public:
  // Fails (RuntimeError) when the backend was shut down.
  Call(ShoalBackend& be, const char* coll, c10d::OpType type, std::chrono::milliseconds timeout,
       bool collective = true);
  // A collective with c10d's options: their timeout, and whether the caller
  // waits at once (then a small collective runs in the calling thread).
  template <class O>
  Call(ShoalBackend& be, const char* coll, c10d::OpType type, const O& opts)
      : Call(be, coll, type, opts.timeout) {
    oo_.blocking = synchronous(opts);
  }

  // Raises RuntimeError "shoal rank R: <coll>: <arg>: <what>".
  [[noreturn]] void fail(const std::string& arg, const std::string& what) const;

  int rank() const;
  int size() const;
  OpOptions& oo() { return oo_; }
  // The device side when the call's tensors are on a device, else null.
  const std::shared_ptr<DeviceSide>& device() const { return device_; }

  // ---- argument checks (each fails naming `arg`)
  // `v` holds exactly one tensor.
  void one(const char* arg, const std::vector<at::Tensor>& v) const;
  void list_len(const std::string& arg, size_t got, size_t want, const char* what) const;
  // A dense tensor on the call's one device (the first one checked sets it).
  void tensor(const std::string& arg, const at::Tensor& t);
  // `t` must have ref's dtype (and numel, when `numel` >= 0).
  void like(const std::string& arg, const at::Tensor& t, const std::string& ref_arg, const at::Tensor& ref,
            int64_t numel = -1);
  // A list with one tensor per rank of the group, each of ref's dtype.
  // Returns true when every entry also has ref's element count.
  bool per_rank_list(const char* arg, const std::vector<at::Tensor>& list, const char* ref_arg,
                     const at::Tensor& ref);
  void root(int64_t root, const char* arg = "root") const;
  // A rooted collective's one tensor (broadcast, reduce): checks the list,
  // the root and c10d's root_tensor, and returns the tensor, itself checked.
  const at::Tensor& rooted_one(const std::vector<at::Tensor>& tensors, int64_t root_rank, int64_t root_tensor);
  // A tensor the call writes must not have elements that share memory (an
  // expand()ed view): the copy back into it would fail only after the data
  // had gone out, leaving this rank out of step with the others.
  void writable(const std::string& arg, const at::Tensor& t) const;

  // ---- element types
  // Data movement: any dtype.
  Elem move_elem(const at::Tensor& t) const;
  // Reductions: maps the op (and its premul factor, into oo()) and checks it fits the dtype.
  ReduceOp reduce_op(const c10d::ReduceOp& op);
  Elem reduce_elem(const std::string& arg, const at::Tensor& t, ReduceOp op) const;

  // ---- staging. in(): read-only input; inout(): read then overwritten;
  // out(): written only. What the core gets is contiguous host memory: the
  // tensor itself when it is, else a copy (of its values, for in/inout),
  // copied back at completion (after the custom finishers) for inout/out.
  at::Tensor in(const at::Tensor& t);
  at::Tensor inout(const at::Tensor& t, const std::string& arg) { return written(t, arg, true); }
  at::Tensor out(const at::Tensor& t, const std::string& arg) { return written(t, arg, false); }
  // A flat buffer the core works in, of like's dtype.
  at::Tensor scratch(int64_t numel, const at::Tensor& like);
  // Fills `dst` (host staging, e.g. a view of a scratch) with `src`'s values
  // before the operation: at once on the CPU, on the d2h stream on a device.
  void put(const at::Tensor& dst, const at::Tensor& src);
  // Packs tensors (any strides) one after the other into a new flat buffer.
  at::Tensor pack(const std::vector<at::Tensor>& ts, const at::Tensor& like);
  // The mirror of pack(): at completion, copies `flat`'s consecutive pieces
  // into `ts` (any strides), in order.
  void unpack(const at::Tensor& flat, std::vector<at::Tensor> ts);
  // The tensors a profiler event of this call shows as its inputs (default:
  // the outputs, which are also the inputs of in-place collectives).
  void profile(std::vector<at::Tensor> inputs) { profiled_ = std::move(inputs); }
  // Work at completion (copies into `targets`, which the call writes).
  void on_success(std::function<void()> fn, const std::vector<at::Tensor>& targets = {});

  // ---- the work
  // Queues the shoal operations `issue` returns and hands back the work (launch.cc).
  c10::intrusive_ptr<c10d::Work> launch(std::vector<at::Tensor> outputs, Issue issue);
  // all_reduce of one contiguous device tensor in pieces (allreduce_pipelined.cc).
  c10::intrusive_ptr<c10d::Work> launch_pipelined_allreduce(const at::Tensor& t, const Elem& e, ReduceOp op);

 private:
  // A tensor the operation writes: itself when contiguous on the host, else
  // a contiguous host buffer (holding its values when `read`) that is
  // copied back at completion.
  at::Tensor written(const at::Tensor& t, const std::string& arg, bool read);
  // A contiguous host staging buffer shaped like `t`.
  at::Tensor host_like(const at::Tensor& t);
  // The work of this call, started, holding what the call keeps and finishes (launch.cc).
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
