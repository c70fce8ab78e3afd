// device.cc — the staging pool, a device's side streams, and the Issuer
// (device.h says what each is for).
#include "device.h"

#include "backend.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace shoal::torch_adapter {
namespace {

constexpr size_t kRound = 4096;

size_t round_up(size_t n) { return std::max(kRound, (n + kRound - 1) / kRound * kRound); }

// Pinned where the device's torch can pin, else ordinary host memory.
at::Tensor host_bytes(size_t n) {
  const auto opts = at::TensorOptions().dtype(at::kByte).device(c10::kCPU);
  try {
    return at::empty({static_cast<int64_t>(n)}, opts.pinned_memory(true));
  } catch (const c10::Error&) {
    return at::empty({static_cast<int64_t>(n)}, opts);
  }
}

}  // namespace

// ---------------------------------------------------------------- StagingPool

struct StagingPool::State : std::enable_shared_from_this<StagingPool::State> {
  struct Block {
    at::Tensor mem;
    std::vector<std::shared_ptr<c10::Event>> fences;  // copies that may still use it
    bool settled() const {
      return std::all_of(fences.begin(), fences.end(), [](const auto& e) { return e->query(); });
    }
    void settle() const {
      for (auto& e : fences) e->synchronize();
    }
  };

  c10::Device device;
  c10::Stream d2h, h2d;
  size_t cap;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Block> free;  // under mu, oldest first
  size_t free_bytes = 0, in_use = 0, high_water = 0;  // under mu
  bool closed = false;                                 // under mu

  State(c10::Device d, c10::Stream a, c10::Stream b, size_t c) : device(d), d2h(a), h2d(b), cap(c) {}

  // Index of the smallest free block of at least n bytes (and at most 2n), or -1.
  int fit(size_t n) const {
    int best = -1;
    for (size_t i = 0; i < free.size(); ++i) {
      const size_t s = free[i].mem.numel();
      if (s >= n && s <= 2 * n && (best < 0 || s < static_cast<size_t>(free[best].mem.numel()))) {
        best = static_cast<int>(i);
      }
    }
    return best;
  }
  Block take(int i) {
    Block b = std::move(free[i]);
    free.erase(free.begin() + i);
    free_bytes -= b.mem.numel();
    in_use += b.mem.numel();
    high_water = std::max(high_water, in_use);
    return b;
  }
  at::Tensor wrap(at::Tensor mem, size_t bytes, at::ScalarType dtype) {
    const int64_t n = static_cast<int64_t>(bytes / c10::elementSize(dtype));
    auto self = shared_from_this();
    return at::from_blob(
        mem.data_ptr(), {n}, [self, mem](void*) { self->give_back(mem); },
        at::TensorOptions().dtype(dtype).device(c10::kCPU));
  }
  void give_back(const at::Tensor& mem) {
    Block b{mem, {}};
    for (const c10::Stream& s : {d2h, h2d}) {
      auto e = std::make_shared<c10::Event>(s.device_type());
      e->record(s);
      b.fences.push_back(std::move(e));
    }
    std::unique_lock<std::mutex> g(mu);
    in_use -= mem.numel();
    if (!closed && free_bytes + in_use + mem.numel() <= cap) {
      free_bytes += mem.numel();
      free.push_back(std::move(b));
      g.unlock();
    } else {
      g.unlock();
      b.settle();  // then freed with `b`
    }
    cv.notify_all();
  }
};

StagingPool::StagingPool(c10::Device device, c10::Stream d2h, c10::Stream h2d, size_t cap)
    : state_(std::make_shared<State>(device, d2h, h2d, cap)), cap_(cap) {}

StagingPool::~StagingPool() {
  std::vector<State::Block> free;
  {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->closed = true;
    free.swap(state_->free);
    state_->free_bytes = 0;
  }
  for (auto& b : free) b.settle();
}

at::Tensor StagingPool::acquire(size_t bytes, at::ScalarType dtype, bool wait) {
  const size_t n = round_up(bytes);
  State& s = *state_;
  std::unique_lock<std::mutex> g(s.mu);
  auto allocate = [&] {
    s.in_use += n;
    s.high_water = std::max(s.high_water, s.in_use);
    g.unlock();
    try {
      return s.wrap(host_bytes(n), bytes, dtype);
    } catch (...) {
      std::lock_guard<std::mutex> g2(s.mu);
      s.in_use -= n;
      throw;
    }
  };
  for (;;) {
    const int i = s.fit(n);
    if (i >= 0 && s.free[i].settled()) return s.wrap(s.take(i).mem, bytes, dtype);
    if (s.in_use + s.free_bytes + n <= s.cap) return allocate();
    if (i >= 0) {  // over the cap: wait for the copies still using a fitting buffer
      State::Block b = s.take(i);
      g.unlock();
      b.settle();
      return s.wrap(std::move(b.mem), bytes, dtype);
    }
    if (!s.free.empty()) {  // over the cap with idle buffers that do not fit: let the oldest go
      State::Block old = s.take(0);
      s.in_use -= old.mem.numel();
      g.unlock();
      old.settle();
      old = {};
      g.lock();
      continue;
    }
    if (!wait || s.in_use == 0) return allocate();  // one operation's need, over the cap
    s.cv.wait(g);
  }
}

at::Tensor StagingPool::try_acquire(size_t bytes, at::ScalarType dtype) {
  const size_t n = round_up(bytes);
  State& s = *state_;
  {
    std::lock_guard<std::mutex> g(s.mu);
    const int i = s.fit(n);
    if (i >= 0 && s.free[i].settled()) return s.wrap(s.take(i).mem, bytes, dtype);
    if (s.in_use + s.free_bytes + n > s.cap) return {};
  }
  return acquire(bytes, dtype, true);
}

size_t StagingPool::in_use() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->in_use;
}

size_t StagingPool::high_water() const {
  std::lock_guard<std::mutex> g(state_->mu);
  return state_->high_water;
}

// ---------------------------------------------------------------- DeviceSide

namespace {
c10::Stream pool_stream(c10::Device d) {
  return c10::impl::VirtualGuardImpl(d.type()).getStreamFromGlobalPool(d, /*isHighPriority=*/false);
}
}  // namespace

DeviceSide::DeviceSide(c10::Device dev, size_t chunk, size_t staging)
    : device(dev),
      d2h(pool_stream(dev)),
      h2d(pool_stream(dev)),
      chunk_bytes(chunk),
      pool(dev, d2h, h2d, std::max(staging, 2 * chunk)) {}

c10::Stream DeviceSide::current() const { return c10::impl::VirtualGuardImpl(device.type()).getStream(device); }

void DeviceSide::record_on(const at::Tensor& t, const c10::Stream& s) {
  if (!t.defined() || !t.has_storage()) return;
  c10::impl::VirtualGuardImpl(s.device_type()).recordDataPtrOnStream(t.storage().data_ptr(), s);
}

// ---------------------------------------------------------------- Issuer

Issuer::~Issuer() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Issuer::submit(Job job, bool may_run_inline) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!(may_run_inline && jobs_.empty() && !busy_)) {
      Activity::begin();  // ended once the job has run and is gone
      jobs_.push_back(std::move(job));
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      cv_.notify_all();
      return;
    }
    busy_ = true;
  }
  struct Done {
    Issuer* self;
    ~Done() {
      {
        std::lock_guard<std::mutex> g(self->mu_);
        self->busy_ = false;
      }
      self->cv_.notify_all();
    }
  } done{this};
  job(true);
}

void Issuer::run() {
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    cv_.wait(g, [&] { return (!jobs_.empty() && !busy_) || (stop_ && jobs_.empty() && !busy_); });
    if (jobs_.empty()) return;
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    g.unlock();
    job(false);  // jobs catch their own errors
    job = nullptr;
    Activity::end();
    g.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace shoal::torch_adapter
