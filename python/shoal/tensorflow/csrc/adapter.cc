// The process's communicators for the TensorFlow ops and the C functions
// shoal.tensorflow calls through ctypes (init, groups, shutdown).
#include "adapter.h"

#include <cstdlib>
#include <cstring>
#include <map>

#include "shoal/error.h"
#include "shoal/error_mapping.h"
#include "shoal/store.h"

namespace shoal_tf {
namespace {

struct Registry {
  std::mutex mu;
  std::shared_ptr<shoal::Store> store;                           // the world's rendezvous store
  std::vector<std::shared_ptr<shoal::Communicator>> groups;      // [0]: the world
  std::map<std::string, int> made;                               // member list -> how many made
  std::string error;                                             // the last C call's error
};

Registry& reg() {
  static Registry* r = new Registry;  // never destroyed: kernels may outlive interpreter teardown
  return *r;
}

int fail(const std::string& msg) {
  reg().error = msg;
  return -1;
}

}  // namespace

std::shared_ptr<shoal::Communicator> group(int64_t id, std::string* why) {
  Registry& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.groups.empty()) {
    *why = "shoal.tensorflow is not initialised: call shoal.tensorflow.init() (or smdistributed's init()) first";
    return nullptr;
  }
  if (id < 0 || id >= static_cast<int64_t>(r.groups.size()) || !r.groups[id]) {
    *why = "group " + std::to_string(id) + " is not a group of this process";
    return nullptr;
  }
  return r.groups[id];
}

bool to_shoal(tensorflow::DataType t, shoal::DataType* out) {
  using tensorflow::DataType;
  switch (t) {
    case DataType::DT_HALF: *out = shoal::DataType::kFloat16; return true;
    case DataType::DT_BFLOAT16: *out = shoal::DataType::kBFloat16; return true;
    case DataType::DT_FLOAT: *out = shoal::DataType::kFloat32; return true;
    case DataType::DT_DOUBLE: *out = shoal::DataType::kFloat64; return true;
    case DataType::DT_INT8: *out = shoal::DataType::kInt8; return true;
    case DataType::DT_UINT8: *out = shoal::DataType::kUInt8; return true;
    case DataType::DT_INT32: *out = shoal::DataType::kInt32; return true;
    case DataType::DT_INT64: *out = shoal::DataType::kInt64; return true;
    case DataType::DT_BOOL: *out = shoal::DataType::kBool; return true;
    default: return false;
  }
}

namespace {

// The TensorFlow status code of each category of shoal::error_mapping.
absl::Status status_of(shoal::ErrorCategory category, const std::string& msg) {
  switch (category) {
    case shoal::ErrorCategory::kInvalidArgument: return absl::InvalidArgumentError(msg);
    case shoal::ErrorCategory::kDeadlineExceeded: return absl::DeadlineExceededError(msg);
    case shoal::ErrorCategory::kUnavailable: return absl::UnavailableError(msg);
    case shoal::ErrorCategory::kFailedPrecondition: return absl::FailedPreconditionError(msg);
    case shoal::ErrorCategory::kAborted: return absl::AbortedError(msg);
    case shoal::ErrorCategory::kInternal: break;
  }
  return absl::InternalError(msg);
}

}  // namespace

absl::Status to_status(std::exception_ptr e, const std::string& what) {
  try {
    std::rethrow_exception(e);
  } catch (const shoal::Error& x) {
    return status_of(shoal::error_mapping(x.code()).category, what + ": " + shoal::error_message(x));
  } catch (const std::exception& x) {
    return absl::InternalError(what + ": " + x.what());
  } catch (...) {
    return absl::InternalError(what + ": unknown error");
  }
}

std::string shape_text(const tensorflow::TensorShape& s) {
  std::string out = "[";
  for (int i = 0; i < s.dims(); ++i) out += (i ? ", " : "") + std::to_string(s.dim_size(i));
  return out + "]";
}

void Pending::fail(const absl::Status& s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (status_.ok()) status_ = s;
  }
  if (left_.fetch_sub(1) == 1) {
    ctx_->SetStatus(tf_status(status_));
    done_();
  }
}

void Pending::finish(std::exception_ptr err) {
  if (err) {
    fail(to_status(err, what_));
    return;
  }
  if (left_.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> g(mu_);
    if (!status_.ok()) ctx_->SetStatus(tf_status(status_));
    done_();
  }
}

void when_done(const shoal::WorkPtr& w, std::function<void(std::exception_ptr)> fn) {
  shoal::Work* raw = w.get();  // alive while it runs its own completion hooks
  w->on_complete([raw, fn = std::move(fn)] { fn(raw->error()); });
}

}  // namespace shoal_tf

// ----------------------------------------------------------------- the C API
using shoal_tf::reg;

#define SHOAL_TF_API __attribute__((visibility("default")))

extern "C" {

// The message of the last failed call of this API.
SHOAL_TF_API const char* shoal_tf_error() { return reg().error.c_str(); }

// Joins the world from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0
// hosts the store, or the launcher with TORCHELASTIC_USE_AGENT_STORE=True).
// 0 on success (also when already initialised), -1 on error.
SHOAL_TF_API int shoal_tf_init(int rank, int size, const char* addr, int port, double timeout_s) {
  shoal_tf::Registry& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.groups.empty()) return 0;
  try {
    // TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store (shoalrun's default), every rank connects
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    const bool agent_store = agent && std::string(agent) == "True";
    shoal::TcpStoreOptions so;
    so.host = addr && *addr ? addr : "127.0.0.1";
    so.port = static_cast<uint16_t>(port);
    so.is_server = rank == 0 && !agent_store;
    shoal::Options o;
    if (timeout_s > 0) {
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
      so.timeout = o.timeout;
    }
    o.store_host_rank = agent_store ? -1 : 0;
    o.name = "tf";
    r.store = std::make_shared<shoal::TcpStore>(so);
    r.groups.push_back(shoal::Communicator::create(r.store, rank, size, o));
    return 0;
  } catch (const std::exception& e) {
    r.store.reset();
    return shoal_tf::fail(std::string("shoal.tensorflow.init (rank ") + std::to_string(rank) + "): " + e.what());
  }
}

// A group of the world's ranks `ranks[0..n)` (called by those ranks only, with
// the same list, in the same order as the other groups). Its id, or -1.
SHOAL_TF_API int shoal_tf_new_group(const int* ranks, int n) {
  shoal_tf::Registry& r = reg();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.groups.empty()) return shoal_tf::fail("shoal.tensorflow.new_group: call init() first");
  std::vector<int> members(ranks, ranks + n);
  std::string key;
  for (int x : members) key += std::to_string(x) + ",";
  const int nth = r.made[key]++;
  try {
    shoal::Options o;
    o.name = "tf/g" + key + "#" + std::to_string(nth);
    auto store = std::make_shared<shoal::PrefixStore>(o.name, r.store);
    r.groups.push_back(r.groups[0]->split(members, store, o));
    return static_cast<int>(r.groups.size()) - 1;
  } catch (const std::exception& e) {
    return shoal_tf::fail(std::string("shoal.tensorflow.new_group: ") + e.what());
  }
}

// Rank and size of group `id` (-1 if there is no such group).
SHOAL_TF_API int shoal_tf_group_rank(int id) {
  std::string why;
  auto c = shoal_tf::group(id, &why);
  return c ? c->rank() : shoal_tf::fail(why);
}

SHOAL_TF_API int shoal_tf_group_size(int id) {
  std::string why;
  auto c = shoal_tf::group(id, &why);
  return c ? c->size() : shoal_tf::fail(why);
}

// Breaks every communicator (pending operations fail with Aborted) and drops them.
SHOAL_TF_API void shoal_tf_shutdown(const char* reason) {
  shoal_tf::Registry& r = reg();
  std::vector<std::shared_ptr<shoal::Communicator>> gone;
  {
    std::lock_guard<std::mutex> g(r.mu);
    gone.swap(r.groups);
    r.made.clear();
  }
  for (auto it = gone.rbegin(); it != gone.rend(); ++it) {
    if (*it && reason && *reason) (*it)->abort(reason);
  }
  gone.clear();
  std::lock_guard<std::mutex> g(r.mu);
  r.store.reset();
}

}  // extern "C"
