// core/wiring.cc — a communicator's making: the knobs it reads once
// (init_common), the transports it wires for a root communicator (TCP, shared
// memory, the hybrid over them), a group split from a parent sharing them,
// and the executor thread it starts.
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "common/auth.h"
#include "common/env.h"
#include "common/process.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "transport/shm/shm_transport.h"

namespace shoal {

void CommunicatorImpl::init_common() {
  std::string spec = env::get("SHOAL_ALGO").value_or("");  // (no default)
  if (!opts_.algorithms.empty()) spec += (spec.empty() ? "" : ",") + opts_.algorithms;
  overrides_ = coll::Overrides::parse(spec);
  const int64_t segment = env::get_int("SHOAL_SEGMENT_BYTES").value();
  if (segment <= 0) throw InvalidArgument("SHOAL_SEGMENT_BYTES: must be > 0");
  tuning_.segment_bytes = opts_.segment_bytes ? opts_.segment_bytes : static_cast<size_t>(segment);
  const int64_t arena = env::get_int("SHOAL_SHM_ARENA_BYTES").value();
  if (arena != 0 && (arena < 4096 || arena > (int64_t{1} << 30))) {
    throw InvalidArgument("SHOAL_SHM_ARENA_BYTES: " + std::to_string(arena) +
                          " is out of range (0 to turn the arena off, else 4096 to 1073741824)");
  }
  shm_mode_ = env::get("SHOAL_SHM").value();
  if (shm_mode_ != "0" && shm_mode_ != "1" && shm_mode_ != "copy") {
    throw InvalidArgument("SHOAL_SHM: '" + shm_mode_ + "' is not one of 1, copy, 0");
  }
  if (shm_mode_ != "0") arena_bytes_ = static_cast<size_t>(arena);
  arena_reads_ = shm_mode_ == "1";

  int spin = opts_.spin_us;
  if (spin < 0) {
    spin = static_cast<int>(env::get_int("SHOAL_SPIN_US").value_or(-1));
  }
  if (spin < 0) {
    int64_t local = size_;
    if (const char* l = std::getenv("LOCAL_WORLD_SIZE")) local = std::atoll(l);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    spin = 200;
    spin_yield_ = local > cores;
  }
  spin_auto_ = opts_.spin_us < 0 && !env::get_int("SHOAL_SPIN_US");
  spin_us_ = spin;
}

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options opts)
    : rank_(rank), size_(size), opts_(std::move(opts)), store_(std::move(store)) {
  init_common();
  label_ = "shoal rank " + std::to_string(rank_);
  transport::tcp::TcpOptions t;
  t.rank = rank_;
  t.size = size_;
  t.socket_buffer = static_cast<int>(env::get_int("SHOAL_SOCKET_BUFFER").value());
  t.connect_timeout = opts_.timeout;
  t.lookup = [this](int peer) { return lookup(peer); };
  t.on_break = [this](std::exception_ptr e) { on_break(e); };
  t.on_lost = [this](int peer, const std::string& d) { return on_lost(peer, d); };
  roll_call_ = std::make_unique<core::RollCall>(store_, rank_, size_);
  auto check_abort = [this](transport::Clock::time_point deadline) { return while_blocked(deadline); };
  t.check_abort = check_abort;
  t.describe_fp = [this](const transport::Fingerprint& fp) { return describe(fp); };

  // The communicator's unique id: chosen by rank 0, so that connections from
  // another job or an earlier run on the same port are refused.
  if (rank_ == 0) {
    uint64_t uid = 0;
    std::FILE* f = std::fopen("/dev/urandom", "rb");
    if (!f || std::fread(&uid, sizeof(uid), 1, f) != 1) uid = static_cast<uint64_t>(getpid()) << 20;
    if (f) std::fclose(f);
    store_->set_str("uid", std::to_string(uid));
    t.job = uid;
  } else {
    t.job = std::stoull(store_->get_str("uid"));
  }
  // The job's secret, which every connection proves (docs/security.md):
  // SHOAL_SECRET, else one that rank 0 makes for this communicator and shares
  // through the store (which then guards it no better than the store itself).
  t.secret = auth::Secret::from_env();
  const std::string kFromEnv = "SHOAL_SECRET";
  if (rank_ == 0) {
    const bool from_env = !t.secret.empty();
    if (!from_env) t.secret = auth::Secret::random();
    store_->set_str("secret", from_env ? kFromEnv : t.secret.hex());
  } else {
    std::string shared = store_->get_str("secret");
    if ((shared == kFromEnv) != !t.secret.empty()) {
      throw InvalidArgument(std::string("SHOAL_SECRET: set on ") + (t.secret.empty() ? "rank 0" : "this rank") +
                            " but not on " + (t.secret.empty() ? "this rank" : "rank 0") +
                            "; every rank of a job needs the same one");
    }
    if (t.secret.empty()) t.secret = auth::Secret::from_hex(shared, "the communicator's secret in the store");
  }
  auth::Secret secret = t.secret;
  secret_ = secret;
  std::string host = opts_.advertise_host;
  t.bind_host = host;
  uint64_t job = t.job;
  auto tcp = std::make_unique<transport::tcp::TcpTransport>(std::move(t));
  tcp_ = tcp.get();

  // Ranks on this host (same host identity at the rendezvous) use shared memory.
  std::unique_ptr<transport::Transport> shm;
  host_id_ = env::get("SHOAL_HOST_ID").value_or(net::host_identity());
  if (shm_mode_ != "0" && size_ > 1) {
    transport::shm::ShmOptions so;
    so.rank = rank_;
    so.size = size_;
    so.job = job;
    so.secret = secret;
    so.cma_bytes = shm_mode_ == "copy" ? 0 : so.cma_bytes;
    so.peer_name = [this](int peer) { return lookup(peer).hostname; };
    so.is_local = [this](int peer) { return hybrid_->is_local(peer); };
    so.on_break = [this](std::exception_ptr e) { on_break(e); };
    so.on_lost = [this](int peer, const std::string& d) { return on_lost(peer, d); };
    so.describe_fp = [this](const transport::Fingerprint& fp) { return describe(fp); };
    shm = std::make_unique<transport::shm::ShmTransport>(std::move(so));
  }
  transport::HybridOptions ho;
  ho.is_local = [this](int peer) { return lookup(peer).host_id == host_id_; };
  ho.check_abort = check_abort;
  ho.peer_gone = [this](int peer) { return peer_gone(peer); };
  ho.timed_out = [this](const std::string& waiting) { return timed_out(waiting); };
  hybrid_ = std::make_shared<transport::HybridTransport>(std::move(tcp), std::move(shm), std::move(ho));
  std::vector<int> everyone(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) everyone[static_cast<size_t>(r)] = r;
  transport_ = std::make_unique<transport::ContextTransport>(hybrid_, 0, std::move(everyone), rank_);
  uid_ = job;
  if (size_ > 1) {
    store_->set_str("addr/" + std::to_string(rank_), host + " " + std::to_string(tcp_->listen_port()) +
                                                         " " + net::hostname() + " " + host_id_ + " " +
                                                         proc::self_token());
  }
  observer_ = std::make_unique<core::Observer>(observer_config(job, shm_mode_));
  driver_->lock().set_wake([h = std::weak_ptr<transport::HybridTransport>(hybrid_)] {
    if (auto t = h.lock()) t->wake();
  });
  start();
}

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Communicator> keep, CommunicatorImpl& parent,
                                   std::shared_ptr<Store> store, int rank, const std::vector<int>& members,
                                   Options opts)
    : rank_(rank), size_(static_cast<int>(members.size())), opts_(std::move(opts)), parent_(std::move(keep)),
      root_(parent.root_), store_(std::move(store)) {
  init_common();
  spin_us_ = parent.spin_us_;
  spin_yield_ = parent.spin_yield_;
  spin_auto_ = parent.spin_auto_;
  // The context id tells this group's messages apart on the shared
  // connections: the group's rank 0 draws it from the root's counter and
  // tells the others, with the member list they must agree on.
  std::ostringstream m;
  for (size_t i = 0; i < members.size(); ++i) m << (i ? "," : "") << members[i];
  uint64_t ctx;
  if (rank_ == 0) {
    ctx = static_cast<uint64_t>(root_->store_->add("group/last_ctx", 1));
    store_->set_str("ctx", std::to_string(ctx) + " " + m.str());
  } else {
    std::istringstream in(store_->get_str("ctx"));
    std::string theirs;
    in >> ctx >> theirs;
    if (theirs != m.str()) {
      throw InvalidArgument(parent.label_ + ": split: ranks: this rank has [" +
                            m.str() + "], the group's rank 0 has [" + theirs +
                            "]; every member must pass the same list");
    }
  }
  if (ctx == 0 || ctx > UINT32_MAX) throw InternalError("split: context id out of range");
  member_.ctx = static_cast<uint32_t>(ctx);
  std::vector<int> wire(members.size());
  for (size_t i = 0; i < members.size(); ++i) wire[i] = parent.transport_->to_wire(members[i]);
  hybrid_ = parent.hybrid_;
  transport_ = std::make_unique<transport::ContextTransport>(hybrid_, static_cast<uint32_t>(ctx), std::move(wire),
                                                             rank_);
  host_id_ = parent.host_id_;
  uid_ = root_->uid_ + ctx;
  label_ = "shoal rank " + std::to_string(root_->rank_) + " (group " + std::to_string(ctx) + " rank " +
           std::to_string(rank_) + ")";
  driver_->family = parent.driver_->family;
  roll_call_ = std::make_unique<core::RollCall>(store_, rank_, size_);
  observer_ = std::make_unique<core::Observer>(observer_config(uid_, shm_mode_));
  start();
}

void CommunicatorImpl::start() {
  driver_->impl = this;
  driver_->family->join(&member_);
  executor_ = std::thread([this] { run(); });
}

}  // namespace shoal
