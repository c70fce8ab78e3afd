// backend.cc — the shoal c10d backend: its life (the communicator under it,
// groups, timeouts, shutdown), point-to-point and barriers. The collectives
// are in backend_collectives.cc; each c10d call is built with a Call
// (call.h): arguments checked, tensors staged, shoal operations queued, and
// a ShoalWork returned that completes when they have.
#include "backend.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "call.h"
#include "common/env.h"
#include "shoal/error_mapping.h"
#include "shoal/error.h"
#include "store_adapter.h"

namespace shoal::torch_adapter {
namespace {

// Internal point-to-point tags live above any tag a torch user can pass (int).
constexpr int64_t kMonitoredBarrierTag = int64_t{1} << 40;

std::string join(const std::vector<int64_t>& v) {
  std::vector<int> i(v.begin(), v.end());
  return shoal::torch_adapter::join(i);
}

}  // namespace

// ---------------------------------------------------------------- lifecycle

ShoalBackend::ShoalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           BackendConfig cfg)
    : c10d::Backend(rank, size), cfg_(std::move(cfg)), default_timeout_ms_(0) {
  shoal::Options o;
  o.timeout = cfg_.timeout;
  // PyTorch hands each group (and device) a store under its own prefix.
  o.name = "torch";
  o.advertise_host = cfg_.advertise_host;
  o.store_host_rank = cfg_.store_host_rank;
  o.own_connections = cfg_.own_connections;
  try {
    // Split from an earlier communicator holding the group when one can be
    // (shared connections), else made afresh: the core decides.
    comm_ = Communicator::create_or_split(std::make_shared<C10dStore>(store), rank, size, cfg_.global_ranks, o);
  } catch (const shoal::Error& e) {
    raise_refusal(e, "shoal: creating the " + cfg_.name + " backend: ");
  }
  completer_ = std::make_unique<Completer>();
  issuer_ = std::make_unique<Issuer>();
  init();
}

ShoalBackend::ShoalBackend(std::shared_ptr<Communicator> comm, BackendConfig cfg)
    : c10d::Backend(comm->rank(), comm->size()), cfg_(std::move(cfg)), comm_(std::move(comm)), default_timeout_ms_(0) {
  completer_ = std::make_unique<Completer>();
  issuer_ = std::make_unique<Issuer>();
  init();
}

ShoalBackend::~ShoalBackend() {
  issuer_.reset();  // hands what is queued to the core first
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

std::shared_ptr<DeviceSide> ShoalBackend::device_side(const c10::Device& d, std::string* why) {
  if (!c10::impl::hasDeviceGuardImpl(d.type())) {
    *why = "tensor is on " + d.str() + ", a device this torch cannot drive (no streams or events for it)";
    return nullptr;
  }
  std::lock_guard<std::mutex> g(device_mu_);
  if (device_) {
    if (device_->device == d) return device_;
    *why = "tensor is on " + d.str() + ", but this process group works on " + device_->device.str() +
           " on this rank (one device per rank and group, set by its first operation on a device; "
           "call torch.cuda.set_device(local_rank) before creating the group, or make one group per device)";
    return nullptr;
  }
  auto knob = [](const char* name) {
    const int64_t v = env::get_int(name).value_or(0);
    TORCH_CHECK(v > 0, "shoal: ", name, " must be a positive number of bytes, got ", v);
    return static_cast<size_t>(v);
  };
  device_ = std::make_shared<DeviceSide>(d, knob("SHOAL_DEVICE_CHUNK_BYTES"), knob("SHOAL_DEVICE_STAGING_BYTES"));
  uses_device_.store(true, std::memory_order_release);
  return device_;
}

std::optional<ShoalBackend::StagingStats> ShoalBackend::staging_stats() {
  std::lock_guard<std::mutex> g(device_mu_);
  if (!device_) return std::nullopt;
  return StagingStats{device_->device.str(), device_->pool.cap(), device_->pool.in_use(), device_->pool.high_water()};
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
  auto err = c ? c->error() : nullptr;
  if (!err) return c10d::ErrorType::SUCCESS;
  try {
    std::rethrow_exception(err);
  } catch (const shoal::Error& e) {
    switch (error_mapping(e.code()).category) {
      case ErrorCategory::kDeadlineExceeded: return c10d::ErrorType::TIMEOUT;
      case ErrorCategory::kUnavailable: return c10d::ErrorType::REMOTE_ERROR;
      default: return c10d::ErrorType::COMM_ERROR;
    }
  } catch (...) {
    return c10d::ErrorType::COMM_ERROR;
  }
}

void ShoalBackend::abort() { abort("aborted through torch.distributed (process group abort)"); }

void ShoalBackend::abort(const std::string& reason) {
  if (auto c = comm()) c->abort(reason);
}

std::vector<int> ShoalBackend::suspects() const {
  auto c = comm();
  auto err = c ? c->error() : nullptr;
  if (!err) return {};
  try {
    std::rethrow_exception(err);
  } catch (const shoal::Error& e) {
    return e.suspects();
  } catch (...) {
    return {};
  }
}

std::vector<int> ShoalBackend::agree(std::chrono::milliseconds window, std::vector<int> suspects) {
  auto c = comm();
  TORCH_CHECK(c, "shoal rank ", getRank(), ": agree: the backend was shut down");
  AgreeOptions o;
  o.window = window;
  o.suspects = std::move(suspects);
  try {
    return c->agree(o).members;
  } catch (const shoal::Error& e) {
    raise_refusal(e);
  }
}

#if SHOAL_TORCH_AT_LEAST(13)
c10::intrusive_ptr<c10d::Backend> ShoalBackend::shrink(const std::vector<int64_t>& ranks_to_exclude, int,
                                                       const c10::intrusive_ptr<Options>&) {
  auto c = comm();
  TORCH_CHECK(c, "shoal rank ", getRank(), ": shrink: the backend was shut down");
  AgreeOptions o;
  for (int64_t r : ranks_to_exclude) o.suspects.push_back(static_cast<int>(r));
  std::vector<int> want;
  for (int r = 0; r < getSize(); ++r) {
    if (std::find(ranks_to_exclude.begin(), ranks_to_exclude.end(), r) == ranks_to_exclude.end()) want.push_back(r);
  }
  std::shared_ptr<Communicator> fresh;
  try {
    Membership m = c->agree(o);
    if (m.members != want) {
      C10_THROW_ERROR(DistBackendError, "shoal rank " + std::to_string(getRank()) + ": shrink: the survivors agreed on ranks [" +
                                            join(m.members) + "], not the [" + join(want) +
                                            "] that excluding [" + join(ranks_to_exclude) + "] leaves");
    }
    fresh = c->shrink(m);
  } catch (const shoal::Error& e) {
    raise_refusal(e, "shoal rank " + std::to_string(getRank()) + ": shrink: ");
  }
  BackendConfig cfg = cfg_;
  if (!cfg.global_ranks.empty()) {
    std::vector<int64_t> global;
    for (int r : want) global.push_back(cfg.global_ranks[static_cast<size_t>(r)]);
    cfg.global_ranks = std::move(global);
  }
  auto host = std::find(want.begin(), want.end(), cfg.store_host_rank);
  cfg.store_host_rank = host == want.end() ? -1 : static_cast<int>(host - want.begin());
  auto be = c10::make_intrusive<ShoalBackend>(std::move(fresh), std::move(cfg));
  be->default_timeout_ms_ = default_timeout_ms_.load();
  {
    std::lock_guard<std::mutex> g(mu_);
    comm_.reset();  // this group is done: its calls now fail as after shutdown
  }
  return be;
}
#endif

c10::intrusive_ptr<ShoalBackend> ShoalBackend::grow(const c10::intrusive_ptr<c10d::Store>& lobby, int joiners,
                                                    std::chrono::milliseconds timeout) {
  auto c = comm();
  TORCH_CHECK(c, "shoal rank ", getRank(), ": grow: the backend was shut down");
  GrowOptions o;
  o.joiners = joiners;
  o.timeout = timeout;
  std::shared_ptr<Communicator> grown;
  try {
    grown = c->grow(std::make_shared<C10dStore>(lobby), o);
  } catch (const shoal::Error& e) {
    raise_refusal(e);
  }
  if (!grown) return {};
  BackendConfig cfg = cfg_;
  cfg.global_ranks.clear();
  auto be = c10::make_intrusive<ShoalBackend>(std::move(grown), std::move(cfg));
  be->default_timeout_ms_ = default_timeout_ms_.load();
  {
    std::lock_guard<std::mutex> g(mu_);
    comm_.reset();  // this group is done: its calls now fail as after shutdown
  }
  return be;
}

uint64_t ShoalBackend::comm_id() const {
  auto c = comm();
  TORCH_CHECK(c, "shoal rank ", getRank(), ": comm_id: the backend was shut down");
  return c->id();
}

c10::intrusive_ptr<ShoalBackend> ShoalBackend::join_grown(const c10::intrusive_ptr<c10d::Store>& lobby, BackendConfig cfg,
                                                    std::chrono::milliseconds timeout) {
  shoal::Options o;
  o.timeout = cfg.timeout;
  o.name = "torch";
  o.advertise_host = cfg.advertise_host;
  o.store_host_rank = cfg.store_host_rank;
  GrowOptions g;
  g.timeout = timeout;
  std::shared_ptr<Communicator> comm;
  try {
    comm = Communicator::join(std::make_shared<C10dStore>(lobby), o, g);
  } catch (const shoal::Error& e) {
    raise_refusal(e);
  }
  cfg.global_ranks.clear();
  return c10::make_intrusive<ShoalBackend>(std::move(comm), std::move(cfg));
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
  return c.launch({tensors[0]}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.send(b.data_ptr(), e.count(b), e.dt, dst, tag, oo)};
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
  return c.launch({tensors[0]}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.recv(b.data_ptr(), e.count(b), e.dt, src, tag, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call c(*this, "recv", c10d::OpType::RECVANYSOURCE, c10d::kUnsetTimeout, false);
  c.one("tensors", tensors);
  c.tensor("tensor", tensors[0]);
  if (tag < 0) c.fail("tag", "must be >= 0, got " + std::to_string(tag));
  Elem e = c.move_elem(tensors[0]);
  at::Tensor b = c.out(tensors[0], "tensor");
  return c.launch({tensors[0]}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.recv(b.data_ptr(), e.count(b), e.dt, kAnySource, tag, oo)};
  });
}

// ---------------------------------------------------------------- barriers

c10::intrusive_ptr<c10d::Work> ShoalBackend::barrier(const c10d::BarrierOptions& opts) {
  Call c(*this, "barrier", c10d::OpType::BARRIER, opts);
  return c.launch({}, [=](Communicator& comm, const OpOptions& oo) { return std::vector<WorkPtr>{comm.barrier(oo)}; });
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
  // The barrier keeps its own deadline (wait_for below). A receive it gives
  // up on stays posted, so its sends and receives get no deadline of their
  // own: one that expired later would break the communicator (and every
  // group sharing its connections) long after the barrier failed. A late
  // token completes it; the communicator's end fails it.
  shoal::OpOptions lingering;
  lingering.timeout = std::chrono::hours(24 * 365);
  auto rethrow = [&](const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, std::string("shoal rank ") + std::to_string(getRank()) +
                                          ": monitored_barrier: " + e.what());
  };
  try {
    if (getRank() != 0) {
      auto s = comm->send(token->data() + getRank(), 1, DataType::kUInt8, 0, tag, lingering);
      auto r = comm->recv(token->data(), 1, DataType::kUInt8, 0, tag, lingering);
      s->wait();
      if (!r->wait_for(timeout)) {
        r->on_complete([token] {});  // the buffer outlives the receive
        C10_THROW_ERROR(DistBackendError,
                        "shoal rank " + std::to_string(getRank()) +
                            ": monitored_barrier: rank 0 did not release the barrier within " +
                            std::to_string(timeout.count()) + " ms (torch: Rank " + std::to_string(getRank()) +
                            " successfully reached monitoredBarrier, but received errors while waiting for "
                            "send/recv from rank 0)");
      }
      return;
    }
    std::vector<WorkPtr> recvs(W);
    for (int r = 1; r < W; ++r) recvs[r] = comm->recv(token->data() + r, 1, DataType::kUInt8, r, tag, lingering);
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
      const std::string ms = std::to_string(timeout.count());
      const bool many = late.size() > 1;
      C10_THROW_ERROR(DistBackendError,
                      "shoal rank 0: monitored_barrier: rank" + std::string(many ? "s " : " ") + join(late) +
                          (many ? " have" : " has") + " not reached the barrier within " + ms + " ms" +
                          (wait_all_ranks ? "" : " (the first one found; pass wait_all_ranks=True for all)") +
                          " (torch: " + (many ? "Ranks " : "Rank ") + join(late) +
                          " failed to pass monitoredBarrier in " + ms + " ms" +
                          (timeout.count() == 0 ? "; Rank 0 timed out in monitoredBarrier after 0 ms" : "") + ")");
    }
    std::vector<WorkPtr> acks;
    for (int r = 1; r < W; ++r) acks.push_back(comm->send(token->data(), 1, DataType::kUInt8, r, tag, lingering));
    for (auto& a : acks) a->wait();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow(e);
  }
}

}  // namespace shoal::torch_adapter
