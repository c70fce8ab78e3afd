// core/wiring.cc — a communicator's making: the knobs it reads once
// (init_common), the transports it wires for a root communicator (TCP, shared
// memory, the hybrid over them), a group split from a parent sharing them,
// and its scheduler, started last.
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "common/auth.h"
#include "common/env.h"
#include "common/net.h"
#include "common/process.h"
#include "core/communicator_impl.h"
#include "core/errors.h"
#include "core/host_table.h"
#include "core/stall_inspector.h"
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
  const std::string stream = env::get("SHOAL_SHM_STREAM").value();
  if (stream != "auto" && stream != "0" && stream != "1") {
    throw InvalidArgument("SHOAL_SHM_STREAM: '" + stream + "' is not one of auto, 0, 1");
  }
  tcp_congestion_ = env::get("SHOAL_TCP_CONGESTION").value();
  if (tcp_congestion_ != "auto" && tcp_congestion_ != "system") {
    const std::string why = net::congestion_refusal(tcp_congestion_);
    if (!why.empty()) {
      throw InvalidArgument("SHOAL_TCP_CONGESTION: '" + tcp_congestion_ + "' cannot be set on this rank's sockets: " +
                            why + "; use one of those, auto or system");
    }
  }
  using Mode = coll::arena::SlotStores::Mode;
  slot_stores_ = stream == "auto" ? Mode::kAuto : stream == "1" ? Mode::kStreamed : Mode::kCached;

  int spin = opts_.spin_us;
  if (spin < 0) spin = static_cast<int>(env::get_int("SHOAL_SPIN_US").value_or(-1));
  spin_auto_ = spin < 0;
  spin_us_ = spin_auto_ ? 200 : spin;
}

namespace core {

namespace {

// The communicator's unique id: chosen by rank 0, so that connections from
// another job or an earlier run on the same port are refused.
uint64_t publish_job(Store& store) {
  uint64_t uid = 0;
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  if (!f || std::fread(&uid, sizeof(uid), 1, f) != 1) uid = static_cast<uint64_t>(getpid()) << 20;
  if (f) std::fclose(f);
  store.set_str("uid", std::to_string(uid));
  return uid;
}

// The job's secret, which every connection proves (docs/security.md):
// SHOAL_SECRET, else one that rank 0 makes for this communicator and shares
// through the store (which then guards it no better than the store itself).
// `fresh`: a shrunk communicator's; with SHOAL_SECRET, rank 0 adds a salt
// ("SHOAL_SECRET <salt>") and the secret is HMAC(SHOAL_SECRET, salt), so that
// no rank of the old communicator that is not in the new one can prove it
// by knowing the job's secret and the old communicator's id alone.
auth::Secret salted(const auth::Secret& secret, const std::string& salt) {
  const std::string msg = "shoal shrunk communicator " + salt;
  const auth::Mac m = auth::hmac(secret, msg.data(), msg.size());
  return auth::Secret::from_hex(auth::to_hex(m.data(), m.size()), "the shrunk communicator's secret");
}

const std::string kFromEnv = "SHOAL_SECRET";

auth::Secret publish_secret(Store& store, bool fresh) {
  auth::Secret secret = auth::Secret::from_env();
  const bool from_env = !secret.empty();
  if (!from_env) secret = auth::Secret::random();
  std::string salt;
  if (from_env && fresh) {
    uint8_t b[16];
    auth::random_bytes(b, sizeof(b));
    salt = auth::to_hex(b, sizeof(b));
  }
  store.set_str("secret", from_env ? kFromEnv + (salt.empty() ? "" : " " + salt) : secret.hex());
  return salt.empty() ? secret : salted(secret, salt);
}

// A rank other than 0: the secret, from what rank 0 published as "secret".
auth::Secret learn_secret(std::string shared) {
  const auth::Secret secret = auth::Secret::from_env();
  std::string salt;
  if (shared.rfind(kFromEnv + " ", 0) == 0) {
    salt = shared.substr(kFromEnv.size() + 1);
    shared = kFromEnv;
  }
  if (!salt.empty() && !secret.empty()) return salted(secret, salt);
  if ((shared == kFromEnv) != !secret.empty()) {
    throw InvalidArgument(std::string("SHOAL_SECRET: set on ") + (secret.empty() ? "rank 0" : "this rank") +
                          " but not on " + (secret.empty() ? "this rank" : "rank 0") +
                          "; every rank of a job needs the same one");
  }
  return secret.empty() ? auth::Secret::from_hex(shared, "the communicator's secret in the store") : secret;
}

}  // namespace

Wired wire(Store& store, int rank, int size, const Options& opts, const std::string& shm_mode,
           const std::string& tcp_congestion, const HostInfo& host, JobLiveness& live,
           bool fresh_secret) {
  Wired w;
  if (rank == 0) {
    w.job = publish_job(store);
    w.secret = publish_secret(store, fresh_secret);
  } else {  // both of rank 0's keys in one request (it sets "secret" last)
    live.wait_published(0, "secret");
    const std::vector<Bytes> v = store.multi_get({"uid", "secret"});
    w.job = std::stoull(std::string(v[0].begin(), v[0].end()));
    w.secret = learn_secret(std::string(v[1].begin(), v[1].end()));
  }
  transport::tcp::TcpOptions t;
  t.rank = rank;
  t.size = size;
  t.job = w.job;
  t.secret = w.secret;
  t.bind_host = opts.advertise_host;
  t.socket_buffer = static_cast<int>(env::get_int("SHOAL_SOCKET_BUFFER").value());
  t.congestion = tcp_congestion;
  t.connect_timeout = opts.timeout;
  t.liveness = &live;
  auto tcp = std::make_unique<transport::tcp::TcpTransport>(std::move(t));
  w.tcp = tcp.get();
  // Ranks on this host (same host identity at the rendezvous) use shared memory.
  std::unique_ptr<transport::Channel> shm;
  if (shm_mode != "0" && size > 1) {
    transport::shm::ShmOptions so;
    so.rank = rank;
    so.size = size;
    so.job = w.job;
    so.secret = w.secret;
    so.cma_bytes = shm_mode == "copy" ? 0 : so.cma_bytes;
    so.liveness = &live;
    shm = std::make_unique<transport::shm::ShmTransport>(std::move(so));
  }
  transport::HybridOptions ho;
  ho.liveness = &live;
  const auto warn = stall_warn_setting();
  if (warn.count() > 0) {
    ho.report_every = std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(warn));
  }
  w.hybrid = std::make_shared<transport::HybridTransport>(std::move(tcp), std::move(shm), std::move(ho));
  if (size > 1) {
    store.set_str("addr/" + std::to_string(rank), opts.advertise_host + " " + std::to_string(w.tcp->listen_port()) +
                                                     " " + net::hostname() + " " + host.id + " " +
                                                     proc::self_token());
    join_host_table(store, size, store, [](int r) { return r; });
  }
  return w;
}

}  // namespace core

std::string CommunicatorImpl::rank_name(int r) const {
  const int64_t job = job_rank(r);
  // (Negative job ranks are a framework's own keys, not ranks to name: torchft's.)
  if (job == r || job < 0) return "rank " + std::to_string(r);
  return "rank " + std::to_string(job) + " (group rank " + std::to_string(r) + ")";
}

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Store> store, int rank, int size, Options opts,
                                   bool fresh_secret, const std::vector<std::string>* processes,
                                   std::vector<int64_t> job_ranks)
    : rank_(rank),
      size_(size),
      opts_(std::move(opts)),
      job_ranks_(std::move(job_ranks)),
      store_(std::move(store)),
      host_(core::HostInfo::here(size)),
      view_(size, rank),
      sched_(*this, std::make_shared<core::Family>()) {
  init_common();
  crowded_ = host_.crowded(host_.local_ranks);
  label_ = "shoal " + rank_name(rank_);
  live_ = std::make_unique<core::JobLiveness>(*this);
  if (processes) live_->seed_processes(*processes);
  core::Wired w =
      core::wire(*store_, rank_, size_, opts_, shm_mode_, tcp_congestion_, host_, *live_, fresh_secret);
  uid_ = w.job;
  secret_ = w.secret;
  hybrid_ = std::move(w.hybrid);
  observer_ = std::make_unique<core::Observer>(observer_config(uid_, shm_mode_));
  sched_.drive().set_wake([h = std::weak_ptr<transport::HybridTransport>(hybrid_)] {
    if (auto t = h.lock()) t->wake();
  });
  start();
}

CommunicatorImpl::CommunicatorImpl(std::shared_ptr<Communicator> keep, CommunicatorImpl& parent,
                                   std::shared_ptr<Store> store, int rank, const std::vector<int>& members,
                                   Options opts)
    : rank_(rank), size_(static_cast<int>(members.size())), opts_(std::move(opts)), parent_(std::move(keep)),
      root_(parent.root_),
      store_(std::move(store)),
      host_(parent.host_),
      view_(size_, rank),
      sched_(*this, parent.sched_.family_ptr()) {
  init_common();
  spin_us_ = parent.spin_us_;
  spin_auto_ = parent.spin_auto_;
  crowded_ = host_.crowded(host_.local_ranks);
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
  std::vector<int> wire(members.size());
  for (size_t i = 0; i < members.size(); ++i) wire[i] = parent.view_.to_wire(members[i]);
  if (size_ > 1) {
    core::join_host_table(*store_, size_, *root_->store_, [&](int i) { return wire[static_cast<size_t>(i)]; });
  }
  hybrid_ = parent.hybrid_;
  view_ = transport::View(hybrid_->size(), hybrid_->rank(), static_cast<uint32_t>(ctx), std::move(wire), rank_);
  uid_ = root_->uid_ + ctx;
  label_ = "shoal rank " + std::to_string(root_->job_rank(root_->rank_)) + " (group " + std::to_string(ctx) + " rank " +
           std::to_string(rank_) + ")";
  live_ = std::make_unique<core::JobLiveness>(*this);
  observer_ = std::make_unique<core::Observer>(observer_config(uid_, shm_mode_));
  start();
}

void CommunicatorImpl::start() { sched_.start(*observer_, view_.ctx(), spin_us_); }

}  // namespace shoal
