// fakegpu.cc — a test-only accelerator for CI machines without a GPU: torch's
// PrivateUse1 device, renamed "fakegpu" by tests/python/fakegpu.py.
//
// It has what shoal's device path relies on in a real GPU, and nothing more:
// - streams that run their work asynchronously, each on a worker thread of
//   its own, in the order it was queued; events recorded on one stream and
//   waited for on another (c10::Event works on it);
// - a caching allocator with CUDA's reuse rule: a freed block is handed out
//   again at once to an allocation on the stream it was allocated on, and
//   to no other stream; a block recorded on other streams
//   (recordDataPtrOnStream, i.e. Tensor.record_stream) is reused only after
//   the work queued on those streams before the free has run;
// - copies to and from host memory (and within the device) queued on the
//   current stream, waited for unless non_blocking, optionally delayed by a
//   transfer latency (set_transfer_delay_ms) so that a missing stream wait
//   shows up as a wrong value, not as a lucky race;
// - fill_ as an asynchronous kernel, and slow_fill_ (sleep, then fill) to
//   stand for a long producer kernel.
// Views are native (as on a GPU); every other operator runs through torch's
// CPU fallback (device memory is host memory here), after the work queued on
// the current stream.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace fakegpu {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr int kDevices = 2;
constexpr int kPoolStreams = 4;  // ids 1..4: the global pool; 0: the default stream

// ---------------------------------------------------------------- streams

class Worker {
 public:
  Worker() : thread_([this] { run(); }) {}
  void push(std::function<void()> fn) {
    std::lock_guard<std::mutex> g(mu_);
    q_.push_back(std::move(fn));
    ++queued_;
    cv_.notify_all();
  }
  bool idle() {
    std::lock_guard<std::mutex> g(mu_);
    return done_ == queued_;
  }
  void drain() {
    std::unique_lock<std::mutex> g(mu_);
    const uint64_t n = queued_;
    cv_.wait(g, [&] { return done_ >= n; });
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return !q_.empty(); });
        fn = std::move(q_.front());
        q_.pop_front();
      }
      fn();
      std::lock_guard<std::mutex> g(mu_);
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  uint64_t queued_ = 0, done_ = 0;
  std::thread thread_;  // never joined: streams live as long as the process
};

std::mutex g_streams_mu;
std::map<std::pair<int, int64_t>, Worker*> g_streams;  // (device, stream id)
std::atomic<int64_t> g_next_stream{kPoolStreams + 1};
std::atomic<int> g_pool_rr{0};

Worker& worker(int device, int64_t id) {
  std::lock_guard<std::mutex> g(g_streams_mu);
  auto& w = g_streams[{device, id}];
  if (!w) w = new Worker();  // leaked on purpose (see above)
  return *w;
}
Worker& worker(const c10::Stream& s) { return worker(s.device_index(), s.id()); }

thread_local int t_device = 0;
thread_local int64_t t_stream[kDevices] = {0, 0};

c10::Stream make_stream(int device, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(device)), id);
}
c10::Stream current_stream(int device) { return make_stream(device, t_stream[device]); }

// An event: records are numbered; a record is done when its stream reached it.
struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  void wait_for(uint64_t n) {
    std::unique_lock<std::mutex> g(mu);
    cv.wait(g, [&] { return completed >= n; });
  }
};

std::shared_ptr<Event> record_on(const c10::Stream& s, std::shared_ptr<Event> e = nullptr) {
  if (!e) e = std::make_shared<Event>();
  uint64_t n;
  {
    std::lock_guard<std::mutex> g(e->mu);
    n = ++e->recorded;
  }
  worker(s).push([e, n] {
    std::lock_guard<std::mutex> g(e->mu);
    e->completed = std::max(e->completed, n);
    e->cv.notify_all();
  });
  return e;
}
bool done(const std::shared_ptr<Event>& e) {
  std::lock_guard<std::mutex> g(e->mu);
  return e->completed >= e->recorded;
}

// ---------------------------------------------------------------- allocator

struct Block {
  size_t size = 0;
  int device = 0;
  int64_t stream = 0;                       // allocated on
  std::vector<c10::Stream> used_on;         // recordDataPtrOnStream
  std::vector<std::shared_ptr<Event>> fences;  // set at free: work on used_on before the free
};

class Allocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const int dev = t_device;
    const int64_t stream = t_stream[dev];
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {  // newest first
        Block& b = blocks_[*it];
        if (b.size == n && b.device == dev && b.stream == stream &&
            std::all_of(b.fences.begin(), b.fences.end(), done)) {
          p = *it;
          free_.erase(std::next(it).base());
          b.fences.clear();
          b.used_on.clear();
          break;
        }
      }
      if (!p) {
        p = std::malloc(std::max<size_t>(n, 1));
        TORCH_CHECK(p, "fakegpu: out of memory allocating ", n, " bytes");
        blocks_[p] = Block{n, dev, stream, {}, {}};
      }
    }
    return {p, p, &Allocator::free_block, c10::Device(kType, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &Allocator::free_block; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }

  void record(void* p, const c10::Stream& s) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = blocks_.find(p);
    if (it != blocks_.end() && s.id() != it->second.stream) it->second.used_on.push_back(s);
  }

  static Allocator& get();

 private:
  static void free_block(void* p) {
    Allocator& a = get();
    std::lock_guard<std::mutex> g(a.mu_);
    Block& b = a.blocks_.at(p);
    for (auto& s : b.used_on) b.fences.push_back(record_on(s));
    a.free_.push_back(p);
  }
  std::mutex mu_;
  std::unordered_map<void*, Block> blocks_;
  std::vector<void*> free_;
};

Allocator& Allocator::get() {
  static Allocator* a = new Allocator();
  return *a;
}

// "Pinned" host memory: plain host memory the hooks can tell apart.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = std::malloc(std::max<size_t>(n, 1));
    TORCH_CHECK(p, "fakegpu: out of pinned memory");
    {
      std::lock_guard<std::mutex> g(mu_);
      ptrs_[p] = n;
    }
    return {p, p, &PinnedAllocator::release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::release; }
  void copy_data(void* dst, const void* src, std::size_t count) const override { std::memcpy(dst, src, count); }
  bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = ptrs_.upper_bound(const_cast<void*>(p));
    if (it == ptrs_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }
  static PinnedAllocator& get() {
    static PinnedAllocator* a = new PinnedAllocator();
    return *a;
  }

 private:
  static void release(void* p) {
    {
      std::lock_guard<std::mutex> g(get().mu_);
      get().ptrs_.erase(p);
    }
    std::free(p);
  }
  std::mutex mu_;
  std::map<void*, size_t> ptrs_;
};

// ---------------------------------------------------------------- device guard

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, static_cast<c10::DeviceIndex>(t_device)); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType && d.index() >= 0 && d.index() < kDevices, "fakegpu: no device ", d);
    t_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < kDevices) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return current_stream(index(d)); }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(index(d), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return make_stream(index(d), 1 + (g_pool_rr++ % kPoolStreams));
  }
  c10::Stream getNewStream(c10::Device d, int) const override { return make_stream(index(d), g_next_stream++); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = current_stream(s.device_index());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }

  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    auto* holder = static_cast<std::shared_ptr<Event>*>(*event);
    if (!holder) {
      holder = new std::shared_ptr<Event>(std::make_shared<Event>());
      *event = holder;
    }
    record_on(s, *holder);
  }
  void block(void* event, const c10::Stream& s) const override {
    if (!event) return;
    auto e = *static_cast<std::shared_ptr<Event>*>(event);
    uint64_t n;
    {
      std::lock_guard<std::mutex> g(e->mu);
      n = e->recorded;
    }
    if (n == 0) return;
    worker(s).push([e, n] { e->wait_for(n); });
  }
  bool queryEvent(void* event) const override {
    return !event || done(*static_cast<std::shared_ptr<Event>*>(event));
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    auto e = *static_cast<std::shared_ptr<Event>*>(event);
    uint64_t n;
    {
      std::lock_guard<std::mutex> g(e->mu);
      n = e->recorded;
    }
    e->wait_for(n);
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<std::shared_ptr<Event>*>(event);
  }
  bool queryStream(const c10::Stream& s) const override { return worker(s).idle(); }
  void synchronizeStream(const c10::Stream& s) const override { worker(s).drain(); }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    std::vector<Worker*> ws;
    {
      std::lock_guard<std::mutex> g(g_streams_mu);
      for (auto& [k, w] : g_streams) {
        if (k.first == d) ws.push_back(w);
      }
    }
    for (auto* w : ws) w->drain();
  }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    Allocator::get().record(p.get(), s);
  }

 private:
  static int index(c10::Device d) { return d.has_index() ? d.index() : t_device; }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDevices; }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(t_device); }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_device = d; }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kType, 0); }
  bool isPinnedPtr(const void* p) const override { return PinnedAllocator::get().is_pinned(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &PinnedAllocator::get(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t n) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    const size_t old = impl->nbytes();
    c10::DataPtr fresh = n > 0 ? Allocator::get().allocate(n) : c10::DataPtr(nullptr, impl->device());
    if (n > 0 && old > 0) {
      worker(current_stream(t_device)).drain();
      std::memcpy(fresh.get(), impl->data(), std::min(old, n));
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(n);
  }
};

// ---------------------------------------------------------------- kernels

std::atomic<int> g_transfer_delay_ms{0};

// A CPU tensor over the same memory (device memory is host memory here).
at::Tensor host_alias(void* data, at::IntArrayRef sizes, at::IntArrayRef strides, at::ScalarType dt) {
  return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dt).device(c10::kCPU));
}

struct View {
  void* data;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dt;
  explicit View(const at::Tensor& t)
      : data(t.data_ptr()), sizes(t.sizes().vec()), strides(t.strides().vec()), dt(t.scalar_type()) {}
  at::Tensor host() const { return host_alias(data, sizes, strides, dt); }
};

int device_of(const at::Tensor& a, const at::Tensor& b) {
  return a.device().type() == kType ? a.device().index() : b.device().index();
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.sizes() == dst.sizes(), "fakegpu: _copy_from: sizes differ");
  const bool crosses = self.device().type() != dst.device().type();
  const int dev = device_of(self, dst);
  // Raw pointers only, as a real kernel has: lifetimes are the caller's.
  View src(self), out(dst);
  const int delay = crosses ? g_transfer_delay_ms.load() : 0;
  auto& w = worker(current_stream(dev));
  w.push([src, out, delay] {
    if (delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    out.host().copy_(src.host());
  });
  // As CUDA: a copy with host memory waits unless non_blocking; one within
  // the device is ordered by the stream only.
  if (crosses && !non_blocking) w.drain();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) const_cast<at::Tensor&>(dst).resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Tensor& fill_kernel(at::Tensor& self, const c10::Scalar& value, int64_t sleep_ms) {
  View v(self);
  worker(current_stream(self.device().index())).push([v, value, sleep_ms] {
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    v.host().fill_(value);
  });
  return self;
}
at::Tensor& fill_(at::Tensor& self, const c10::Scalar& value) { return fill_kernel(self, value, 0); }

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard g(device);
  return at::detail::empty_generic(size, &Allocator::get(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard g(device);
  return at::detail::empty_strided_generic(size, stride, &Allocator::get(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, at::IntArrayRef size, std::optional<at::MemoryFormat> fmt) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const size_t need = static_cast<size_t>(impl->numel() + impl->storage_offset()) * self.itemsize();
  const c10::Storage& st = impl->storage();
  if (need > st.nbytes()) {
    c10::OptionalDeviceGuard g(self.device());
    worker(current_stream(self.device().index())).drain();
    c10::DataPtr fresh = Allocator::get().allocate(need);
    if (st.nbytes() > 0) std::memcpy(fresh.get(), st.data(), st.nbytes());
    const_cast<c10::Storage&>(st).set_data_ptr_noswap(std::move(fresh));
    const_cast<c10::Storage&>(st).set_nbytes(need);
  }
  if (fmt && *fmt != at::MemoryFormat::Preserve) impl->empty_tensor_restride(*fmt);
  return self;
}

at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}
at::Tensor view(const at::Tensor& self, at::IntArrayRef size) { return at::native::view(self, size); }
at::Tensor reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

void record_stream(at::Tensor& self, c10::Stream s) { Allocator::get().record(self.storage().data_ptr().get(), s); }

// Every other operator: on the host, once the current stream has caught up.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  worker(current_stream(t_device)).drain();
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view_as_real", at::native::view_as_real);
  m.impl("view_as_complex", at::native::view_as_complex);
  m.impl("resize_", resize_);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("fill_.Scalar", fill_);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>()); }
// torch.autocast("fakegpu") runs: every operator passes through the autocast key unchanged (no
// kernel casts to half here; a real accelerator registers its casting policy).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

struct Registrar {
  Registrar() {
    static Hooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
};

}  // namespace
}  // namespace fakegpu

PYBIND11_MODULE(_fakegpu, m) {
  static fakegpu::Registrar registrar;
  m.def("set_transfer_delay_ms", [](int ms) { fakegpu::g_transfer_delay_ms = ms; },
        "Delay every copy between host and device memory by `ms` (a slow link).");
  m.def(
      "slow_fill_",
      [](at::Tensor t, double value, int64_t ms) { fakegpu::fill_kernel(t, value, ms); },
      "Queues a kernel on the current stream that sleeps `ms` then fills `t` with `value`.");
  m.def(
      "is_pinned_ptr", [](const at::Tensor& t) { return fakegpu::PinnedAllocator::get().is_pinned(t.data_ptr()); },
      "Whether a host tensor's memory came from fakegpu's pinned allocator.");
}
