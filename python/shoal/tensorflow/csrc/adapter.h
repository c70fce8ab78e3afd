// The TensorFlow adapter's shared pieces: the process's communicators (by
// group id), TF <-> shoal types, and the completion of an asynchronous kernel.
//
// Ordering: the ops are stateful, so inside tf.function TensorFlow's automatic
// control dependencies run them in program order, one after the other (each
// starts once the previous one called done); eagerly they run in program order
// anyway. Every rank therefore issues its collectives in the same order, as the
// communicator requires, and a kernel may issue its second phase (the payload
// after a size exchange) from the completion of its first.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "shoal/communicator.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace shoal_tf {

// The communicator of group `id` (0: the world), or null with `why` set.
std::shared_ptr<shoal::Communicator> group(int64_t id, std::string* why);

// shoal's element type of a TF dtype; false if shoal has none.
bool to_shoal(tensorflow::DataType t, shoal::DataType* out);
// A shoal failure as a TF status, its code by the error's category in
// shoal::error_mapping (InvalidArgument, DeadlineExceeded, Unavailable for a
// lost peer, Aborted, ...), its message shoal::error_message prefixed with `what`.
absl::Status to_status(std::exception_ptr e, const std::string& what);
// The status for TensorFlow: its Status is absl::Status from TF 2.13 on, a
// class of its own (tsl::Status, made from a code and a message) before.
inline tensorflow::Status tf_status(const absl::Status& s) {
  if (s.ok()) return tensorflow::Status();
  return tensorflow::Status(static_cast<decltype(tensorflow::Status().code())>(s.code()), s.message());
}
// And back: a TensorFlow status (of allocate_output, ...) as absl::Status.
template <typename S>
absl::Status absl_status(const S& s) {
  if constexpr (std::is_same_v<S, absl::Status>) {
    return s;
  } else {
    return s.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(s.code()), s.error_message());
  }
}

inline char* data(const tensorflow::Tensor& t) { return const_cast<char*>(t.tensor_data().data()); }

// One kernel invocation in flight: `parts` pieces of work complete, each may
// fail; the last calls done with the first failure. Holds the tensors the
// pieces read and write until then.
class Pending {
 public:
  Pending(tensorflow::OpKernelContext* ctx, tensorflow::AsyncOpKernel::DoneCallback done, std::string what)
      : ctx_(ctx), done_(std::move(done)), what_(std::move(what)) {}
  tensorflow::OpKernelContext* ctx() const { return ctx_; }
  const std::string& what() const { return what_; }
  void keep(const tensorflow::Tensor& t) { keep_.push_back(t); }
  // Expect `n` more completions before done.
  void expect(int n) { left_.fetch_add(n); }
  // One piece finished (err null: success).
  void finish(std::exception_ptr err);
  void fail(const absl::Status& s);

 private:
  tensorflow::OpKernelContext* ctx_;
  tensorflow::AsyncOpKernel::DoneCallback done_;
  std::string what_;
  std::vector<tensorflow::Tensor> keep_;
  std::atomic<int> left_{0};
  std::mutex mu_;
  absl::Status status_;  // under mu_
};

// Runs `fn` when `w` completes (with the error, null on success). `fn` runs
// on the thread that completes it and must only copy and issue.
void when_done(const shoal::WorkPtr& w, std::function<void(std::exception_ptr)> fn);

// Calls `issue` (which starts operations and arranges p->finish), turning a
// synchronous throw (bad arguments) into the kernel's status.
template <class F>
void guarded(const std::shared_ptr<Pending>& p, F&& issue) {
  try {
    issue();
  } catch (...) {
    p->finish(std::current_exception());
  }
}

// The base of every kernel: its group attribute and the start of a call.
class Kernel : public tensorflow::AsyncOpKernel {
 public:
  Kernel(tensorflow::OpKernelConstruction* c, const char* name) : AsyncOpKernel(c), name_(name) {
    OP_REQUIRES_OK(c, c->GetAttr("group", &group_));
  }

 protected:
  // The group's communicator and the call's Pending ("shoal.<op> (rank r)"
  // names every error), or null after failing the call.
  std::shared_ptr<shoal::Communicator> begin(tensorflow::OpKernelContext* ctx, const DoneCallback& done,
                                             std::shared_ptr<Pending>* p) {
    std::string why;
    auto c = group(group_, &why);
    if (!c) {
      ctx->SetStatus(tf_status(absl::FailedPreconditionError(std::string("shoal.") + name_ + ": " + why)));
      done();
      return nullptr;
    }
    *p = std::make_shared<Pending>(ctx, done, std::string("shoal.") + name_ + " (rank " + std::to_string(c->rank()) +
                                                  (group_ ? " of group " + std::to_string(group_) : "") + ")");
    return c;
  }
  // Fails the call with InvalidArgument before anything was issued.
  static void refuse(const std::shared_ptr<Pending>& p, const std::string& msg) {
    p->expect(1);
    p->fail(absl::InvalidArgumentError(p->what() + ": " + msg));
  }

  const char* name_;
  int64_t group_ = 0;
};

std::string shape_text(const tensorflow::TensorShape& s);

}  // namespace shoal_tf
