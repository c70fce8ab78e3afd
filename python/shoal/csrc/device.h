// device.h — how accelerator tensors (CUDA, or any device torch drives
// through c10's device-generic streams and events) reach shoal's host core
// and come back: per device, two side streams and a pool of pinned host
// buffers; per backend, the Issuer that hands operations to the core in call
// order once their data is on the host.
//
// Stream semantics (those of NCCL, which DDP and users rely on):
// - an operation sees everything queued on the caller's current stream
//   before the call: the copies down (device to host) run on the d2h stream
//   after an event recorded on the caller's stream at the call;
// - results are copied back (host to device) on the h2d stream, which waits
//   for that same event first (the caller may still be reading the output
//   tensor on its stream), then records the operation's done event;
//   work.wait() makes the caller's current stream wait for that event;
// - every device tensor an operation touches is recorded on the side stream
//   that uses it (the caching allocator's record_stream) and held until the
//   operation has completed.
// None of this is CUDA-specific: c10::Event, c10::Stream and the device's
// DeviceGuardImpl do it, so one build serves a CPU-only torch, a CUDA one and
// tests/fakegpu (the accelerator CI runs these semantics on).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace shoal::torch_adapter {

// Pinned host buffers for one device, pooled. Buffers are handed out as
// uint8 CPU tensors; when the last reference to one goes, it returns to the
// pool fenced by events on both side streams (a copy may still be reading or
// writing it), and is reused only once those have passed. The pool keeps at
// most `cap` bytes; acquire() may wait for room (the pipelined all_reduce
// keeps its pieces in flight within the cap) or go over it (an operation
// that needs one large buffer gets it, and it is freed, not kept, after).
class StagingPool {
 public:
  StagingPool(c10::Device device, c10::Stream d2h, c10::Stream h2d, size_t cap);
  ~StagingPool();

  // A host buffer of `bytes` (as `dtype`, 1-d). wait: block until the pool
  // has room (when something is in use) instead of going over the cap.
  at::Tensor acquire(size_t bytes, at::ScalarType dtype, bool wait);
  // A buffer only if one fits in the cap now; undefined otherwise.
  at::Tensor try_acquire(size_t bytes, at::ScalarType dtype);
  size_t cap() const { return cap_; }
  // Bytes handed out now, and the most ever (for tests and diagnostics).
  size_t in_use() const;
  size_t high_water() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  const size_t cap_;
};

// One accelerator device as a backend uses it.
struct DeviceSide {
  DeviceSide(c10::Device device, size_t chunk_bytes, size_t staging_bytes);

  c10::Device device;
  c10::Stream d2h, h2d;  // side streams: copies down, copies back
  size_t chunk_bytes;    // pipelined all_reduce piece (SHOAL_DEVICE_CHUNK_BYTES)
  StagingPool pool;      // SHOAL_DEVICE_STAGING_BYTES

  c10::Stream current() const;  // the calling thread's current stream
  // Makes `t`'s memory safe from reuse until the work queued on `s` so far has run.
  static void record_on(const at::Tensor& t, const c10::Stream& s);
};

// Hands operations to the communicator in the order the calls reached the
// backend. An operation whose data is on a device waits on this thread for
// its copies to reach the host, never on the caller's; everything behind it
// (CPU operations included) waits its turn. When nothing is queued, a job
// that may run inline runs on the calling thread at once.
class Issuer {
 public:
  using Job = std::function<void(bool ran_inline)>;
  Issuer() = default;
  ~Issuer();  // runs what is queued, then joins
  Issuer(const Issuer&) = delete;
  Issuer& operator=(const Issuer&) = delete;

  void submit(Job job, bool may_run_inline);

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // under mu_
  bool busy_ = false;     // under mu_: a job is running (here or inline)
  bool stop_ = false;     // under mu_
  std::thread thread_;    // started by the first queued job
};

}  // namespace shoal::torch_adapter
