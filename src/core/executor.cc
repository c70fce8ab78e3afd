// core/executor.cc — the communicator's executor thread: runs queued
// operations in order, lowers reduce ops, and turns failures into the
// communicator-wide broken state.
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
#include "kernels/reduce.h"
#include "transport/shm/shm_transport.h"

namespace shoal {

using coll::Coll;
using transport::Clock;

namespace {

constexpr auto kDeferHandoff = std::chrono::microseconds(200);

bool is_reducing(Coll c) {
  return c == Coll::kAllreduce || c == Coll::kReduce || c == Coll::kReduceScatter ||
         c == Coll::kReduceScatterv;
}

// Elements of the buffer a reducing collective's input spans.
size_t input_elems(const Op& op, int size) {
  switch (op.coll) {
    case Coll::kReduceScatter: return op.args.count * static_cast<size_t>(size);
    case Coll::kReduceScatterv: {
      size_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    default: return op.args.count;
  }
}

size_t output_elems(const Op& op, int rank) {
  switch (op.coll) {
    case Coll::kReduceScatterv: return op.counts[static_cast<size_t>(rank)];
    default: return op.args.count;
  }
}

// Total element count of the operation, the same on every rank.
uint64_t fingerprint_count(const Op& op) {
  switch (op.coll) {
    case Coll::kAllgatherv:
    case Coll::kReduceScatterv: {
      uint64_t t = 0;
      for (size_t c : op.counts) t += c;
      return t;
    }
    case Coll::kAlltoallv: return 0;  // per-pair sizes are checked per message
    default: return op.args.count;
  }
}

}  // namespace

std::string CommunicatorImpl::prefix(const Op& op) const {
  std::ostringstream o;
  o << label_ << ": " << coll::coll_name(op.coll);
  if (op.seq) o << " seq " << op.seq;
  o << ": ";
  return o.str();
}

std::string CommunicatorImpl::describe(const transport::Fingerprint& fp) const {
  std::ostringstream o;
  o << coll::coll_name(static_cast<Coll>(fp.coll)) << "(count=" << fp.count << ", "
    << dtype_name(static_cast<DataType>(fp.dtype));
  Coll c = static_cast<Coll>(fp.coll);
  if (is_reducing(c)) o << ", " << reduce_op_name(static_cast<ReduceOp>(fp.op));
  if (c == Coll::kBroadcast || c == Coll::kReduce || c == Coll::kGather || c == Coll::kScatter) {
    o << ", root=" << fp.root;
  }
  if (const coll::Algorithm* algo = coll::algorithm_by_id(fp.algo)) o << ", algorithm " << algo->name;
  o << ")";
  return o.str();
}

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

bool Driver::help(const Work& waiting) {
  std::unique_lock<core::DriveLock> d(lock(), std::try_to_lock);
  if (!d.owns_lock() || !impl) return false;
  return impl->drain(true, &waiting);
}

CommunicatorImpl::~CommunicatorImpl() {
  bool pending;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
    // A group shares its parent's transport: break it only to stop what runs.
    pending = in_transport() || (root_ == this && !queue_.empty());
  }
  driver_->family->stop(&member_);
  if (pending) {
    transport_->abort(std::make_exception_ptr(
        Aborted(label_ + ": communicator destroyed")));
  }
  cv_.notify_all();
  transport_->wake();
  if (executor_.joinable()) executor_.join();
  std::lock_guard<core::DriveLock> d(driver_->lock());  // waits for a caller still driving
  driver_->impl = nullptr;
  driver_->family->leave(&member_);
}

// Which ranks share a host, from the addresses every rank published (read
// once, on first use: every rank computes the same answer).
const coll::Topology& CommunicatorImpl::topology() {
  if (!topo_.host_of.empty()) return topo_;
  std::vector<std::string> ids(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) ids[static_cast<size_t>(r)] = r == rank_ ? host_id_ : lookup(r).host_id;
  topo_ = coll::patterns::make_topology(ids);
  // Ranks in other network namespaces of the same kernel count too (same
  // boot id).
  const std::string boot = net::boot_id();
  int here = 0;
  for (const auto& id : ids) here += boot.empty() ? id == host_id_ : id.find(boot) != std::string::npos;
  crowded_ = here > sysconf(_SC_NPROCESSORS_ONLN);
  // Spinning pays only while every rank of this machine has a core.
  if (spin_auto_) spin_yield_ = crowded_;
  return topo_;
}

transport::tcp::PeerAddress CommunicatorImpl::lookup(int peer) {
  if (root_ != this) return root_->lookup(transport_->to_wire(peer));
  std::string v = store_->get_str("addr/" + std::to_string(peer));
  std::istringstream in(v);
  transport::tcp::PeerAddress a;
  in >> a.host >> a.port >> a.hostname >> a.host_id >> a.process;
  return a;
}

// A peer whose process on this machine has exited, though no socket of ours
// to it said so (it died before connecting to this rank): lost.
std::exception_ptr CommunicatorImpl::peer_gone(int peer) {
  std::string token;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (processes_.empty()) processes_.resize(static_cast<size_t>(size_));
    token = processes_[static_cast<size_t>(peer)];
  }
  if (token.empty()) {
    try {
      token = lookup(peer).process;
    } catch (const Error&) {
      return nullptr;  // the store is gone: check_abort's business
    }
    if (token.empty()) token = "-";  // not probeable; do not ask again
    std::lock_guard<std::mutex> g(mu_);
    processes_[static_cast<size_t>(peer)] = token;
  }
  if (proc::probe(token == "-" ? "" : token) != proc::Liveness::kGone) return nullptr;
  return on_lost(peer, "its process (pid " + proc::pid_of(token) + " on this machine) has exited");
}

// A wait reached its deadline: call the roll, so that the error names the
// ranks the job waits for (roll_call.h), not just the peer this rank waited
// for, which may itself be waiting for them.
std::exception_ptr CommunicatorImpl::timed_out(const std::string& waiting) {
  // A group's waits are the shared transport's: the root's ranks answer its roll.
  if (root_ != this) return root_->timed_out(waiting);
  // A rank that failed first has said why; ranks that left after it would
  // not answer the roll either.
  if (auto first = abort_record()) return first;
  auto silent = roll_call_->silent();
  std::string msg = "timed out waiting for " + waiting;  // also when no roll call was made
  if (silent && !silent->empty()) {
    msg = "timed out: " + core::describe_silent(*silent) +
          " a roll call before the deadline (stopped, hung, or busy outside this communicator); rank " +
          std::to_string(rank_) + " was waiting for " + waiting;
  } else if (silent) {
    msg += "; every rank answered a roll call, so all are alive and waiting in shoal (operations that "
           "do not match across ranks?)";
  }
  return std::make_exception_ptr(TimeoutError(msg));
}

// Another rank's published cause (see on_break), or null.
std::exception_ptr CommunicatorImpl::abort_record() {
  if (root_ != this) return root_->abort_record();
  try {
    if (store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(store_->get_str("abort"));
      if (rec && rec->detector != rank_) return rec->to_error();
    }
  } catch (...) {
  }
  return nullptr;
}

// Called every abort poll while this rank is blocked in shoal (the root's
// communicator): answers a roll call, publishes which operation of the
// family it is blocked in (for order_check on its peers), and returns
// another rank's published cause, if any.
std::exception_ptr CommunicatorImpl::while_blocked(transport::Clock::time_point deadline) {
  if (root_ != this) return root_->while_blocked(deadline);
  roll_call_->poll(deadline);  // blocked in shoal: answer a roll call, or call one near the deadline
  auto& fam = *driver_->family;
  if (fam.size() > 1) {
    const std::string pos = std::to_string(fam.current_ctx()) + " " + std::to_string(fam.current_seq());
    if (pos != published_pos_) {
      try {
        store_->set_str("pos/" + std::to_string(rank_), pos);
        published_pos_ = pos;
      } catch (const Error&) {
      }
    }
  }
  return abort_record();
}

namespace {
std::string position(uint64_t ctx, uint64_t seq) {
  return (ctx ? "group " + std::to_string(ctx) + " " : std::string()) + "seq " + std::to_string(seq);
}
}  // namespace

// This rank waits for `peer` to join an operation that `peer` has not
// started (an arrival in the shared arena). If `peer` is blocked in an
// operation of another communicator of the family that this rank has not
// started, the two ranks issued them in different orders: neither can go on.
std::exception_ptr CommunicatorImpl::order_check(int peer) {
  auto& fam = *driver_->family;
  if (fam.size() <= 1) return nullptr;
  const int wire = transport_->to_wire(peer);
  uint64_t ctx = 0, seq = 0, mine = 0;
  try {
    const std::string key = "pos/" + std::to_string(wire);
    if (!root_->store_->check({key})) return nullptr;
    std::istringstream in(root_->store_->get_str(key));
    if (!(in >> ctx >> seq)) return nullptr;
  } catch (const Error&) {
    return nullptr;
  }
  if (ctx == member_.ctx || !fam.started_in(static_cast<uint32_t>(ctx), &mine) || mine >= seq) return nullptr;
  return std::make_exception_ptr(Mismatch(
      "collective order mismatch with rank " + std::to_string(wire) + ": this rank waits for it in " +
      position(member_.ctx, fam.current_seq()) + ", rank " + std::to_string(wire) + " waits in " +
      position(ctx, seq) + ", which this rank has not started; communicators that share connections must issue "
      "their collectives in the same order on every rank (or give the group its own connections: "
      "SHOAL_GROUP_CONNECTIONS=own)"));
}

void CommunicatorImpl::on_break(std::exception_ptr cause) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!broken_) broken_ = cause;
  }
  // Publish the first cause, so that ranks that only see this rank's sockets
  // close can name the real culprit.
  try {
    core::AbortRecord rec = core::AbortRecord::from(cause, rank_);
    if (rec.code == ErrorCode::kAborted) return;  // a local decision, not a job fault
    if (!store_->check({"abort"})) store_->set_str("abort", rec.encode());
  } catch (...) {
  }
}

std::exception_ptr CommunicatorImpl::on_lost(int peer, const std::string& detail) {
  std::string who = hybrid_ ? hybrid_->describe_peer(peer) : "rank " + std::to_string(peer);
  try {
    if (store_->check({"abort"})) {
      auto rec = core::AbortRecord::decode(store_->get_str("abort"));
      if (rec && rec->detector != rank_) return rec->to_error();
    }
  } catch (const Error&) {
    int host = opts_.store_host_rank;
    if (host >= 0 && host != rank_ && host != peer) {
      return std::make_exception_ptr(
          PeerLost("peer lost: rank " + std::to_string(host) +
                       " (it hosts the rendezvous store, which is unreachable; the connection to " +
                       who + " closed too)",
                   host));
    }
  }
  return std::make_exception_ptr(PeerLost("peer lost: " + who + ": " + detail, peer));
}

std::exception_ptr CommunicatorImpl::error() const {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (broken_) return broken_;
  }
  return hybrid_ ? hybrid_->broken() : nullptr;  // broken through a group that shares it
}

void CommunicatorImpl::abort(const std::string& reason) {
  auto cause = std::make_exception_ptr(Aborted(label_ + ": aborted: " + reason));
  bool running;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!broken_) broken_ = cause;
    running = in_transport();
  }
  // A group shares its parent's transport: while none of its operations is
  // in the transport, breaking the group alone is enough (what is queued
  // fails when its turn comes); one that is must be stopped, and with it
  // everything that shares the connections.
  if (root_ == this || running) transport_->abort(cause);
  cv_.notify_all();
}

WorkPtr CommunicatorImpl::enqueue(Op&& op) {
  const bool p2p = op.coll == Coll::kSend || op.coll == Coll::kRecv;
  const bool blocking = op.opts.blocking && !p2p;  // a blocking send could never meet its receive
  WorkPtr w;
  std::unique_lock<core::DriveLock> drive(driver_->lock(), std::defer_lock);
  bool now = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) throw Aborted(prefix(op) + "the communicator is being destroyed");
    // A blocking collective with nothing queued ahead of it runs right here,
    // in the calling thread: no hand-off to the executor and back (two futex
    // wake-ups and an eventfd write, more than a small collective costs on a
    // busy host). try_lock only: elsewhere the drive lock is taken before mu_.
    if (!p2p) op.seq = next_seq_++;
    const bool was_empty = queue_.empty();
    // (Not before an earlier operation of a group sharing the transport.)
    if (blocking && was_empty && !busy_.load() && driver_->family->my_turn(&member_)) (void)drive.try_lock();
    // Alone in its family with nothing in flight, it need not pass through
    // the queue at all (run_now), nor leave the caller's stack.
    now = drive.owns_lock() && driver_->family->size() <= 1 && inflight_count_.load() == 0 && !broken_;
    if (now) {
      busy_.store(true, std::memory_order_release);  // mu_ orders it for abort()
      w = done_work(op.seq);
    } else {
      auto queued = std::make_unique<Op>(std::move(op));
      queued->ticket = driver_->family->draw(&member_, was_empty);
      queued->work = std::make_shared<Work>(queued->seq);
      if (!drive.owns_lock()) queued->work->set_helper([d = driver_](const Work& w) { return d->help(w); });
      observer_->enqueued(*queued);
      w = queued->work;
      queue_.push_back(std::move(queued));
    }
  }
  if (now) {
    run_now(op, *w);
    return w;
  }
  if (drive.owns_lock()) {
    drain(true);  // runs the queue, which starts with this operation
    drive.unlock();
  } else {
    cv_.notify_one();
    transport_->wake();
  }
  if (blocking) {  // done already when it ran here (unless the communicator is stopping)
    try {
      w->wait();
    } catch (...) {  // the Work keeps the error for the caller's wait()
    }
  }
  return w;
}

// The Work for an operation that run_now() completes before returning: the
// last one again when its caller has let go of it (a small collective's
// allocation, mutex and condition variable are a fair share of its cost).
WorkPtr CommunicatorImpl::done_work(uint64_t seq) {
  if (done_work_ && done_work_.use_count() == 1) {
    done_work_->reset(seq);
  } else {
    done_work_ = std::make_shared<Work>(seq);
  }
  return done_work_;
}

// A blocking collective of an idle communicator, alone in its family (see
// enqueue): it runs here, under the drive lock the caller holds, as the
// queue would run it, minus the queue.
void CommunicatorImpl::run_now(Op& op, Work& work) {
  transport_->set_spin_us(spin_us_);
  transport_->set_spin_yield(spin_yield_);
  observer_->started_now(op);
  execute(op, work, true);  // enqueue() found it unbroken; `work` is not shared yet
  busy_.store(false, std::memory_order_release);
}

void CommunicatorImpl::fail_all(std::exception_ptr cause) {
  observer_->broke(cause);  // dumps the flight recorder before anyone sees the error (not for aborts)
  for (auto& op : inflight_p2p_) {
    observer_->finished(*op, cause);
    op->work->finish(core::with_context(cause, prefix(*op)));
  }
  inflight_p2p_.clear();
  inflight_count_.store(0);
}

bool CommunicatorImpl::drain(bool inline_caller, const Work* waiting) {
  bool progressed = false;
  turn_blocked_ = false;
  transport_->set_spin_us(inline_caller ? spin_us_ : 0);
  transport_->set_spin_yield(spin_yield_);
  for (;;) {
    std::unique_ptr<Op> op;
    bool wake_executor;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_ || queue_.empty()) break;
      if (!driver_->family->my_turn(&member_)) {  // a group's earlier operation goes first
        turn_blocked_ = true;
        break;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      driver_->family->advance(&member_, queue_.empty() ? core::Family::kNone : queue_.front()->ticket);
      busy_.store(true);
      wake_executor = deferring_;
    }
    if (wake_executor) cv_.notify_all();  // it deferred to us: it may go back to sleep
    execute(*op, *op->work);
    progressed = true;
    busy_.store(false);
  }
  if (!inflight_p2p_.empty()) {
    size_t before = inflight_p2p_.size();
    progress_p2p(Clock::now());
    const bool more = waiting && spin_us_ > 0 && !waiting->test() && spin_p2p(*waiting);
    progressed = progressed || more || inflight_p2p_.size() != before;
  }
  if (!inflight_p2p_.empty() && !has_inflight_.load()) {
    // Hand the in-flight sends and receives to the executor thread.
    {
      std::lock_guard<std::mutex> g(mu_);
      has_inflight_.store(true);
    }
    cv_.notify_one();
  } else if (inflight_p2p_.empty()) {
    has_inflight_.store(false);
  }
  return progressed;
}

// The caller waits for a send or receive in flight: drive the transport here
// for up to spin_us_, as a collective's wait does, rather than sleep at once
// while the executor thread blocks in epoll (each of the two wake-ups that
// costs is tens of microseconds on a virtual machine). Stops early when new
// operations are queued (returns true then: drain() must be called again).
bool CommunicatorImpl::spin_p2p(const Work& waiting) {
  const auto until = Clock::now() + std::chrono::microseconds(spin_us_);
  for (unsigned i = 1; !inflight_p2p_.empty() && !waiting.test(); ++i) {
    progress_p2p(Clock::now());
    if (i % 16 == 0) {
      if (Clock::now() >= until || driver_->lock().contended()) return false;
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return false;
      if (!queue_.empty()) return true;
    }
    if (spin_yield_) sched_yield();
  }
  return false;
}

void CommunicatorImpl::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      // Sleep until there is work: queued operations, or sends and receives
      // in flight that need progress (unless the communicator is broken).
      cv_.wait(g, [&] { return stop_ || !queue_.empty() || (has_inflight_.load() && !broken_); });
      if (stop_) break;  // whatever is queued fails below
      // A caller that waits for its operation right away runs it itself
      // (Work::wait), saving two thread hand-offs; give it the chance before
      // taking the operation. Operations nobody waits for start at most
      // kDeferHandoff later.
      if (!queue_.empty() && !has_inflight_.load()) {
        deferring_ = true;
        cv_.wait_for(g, kDeferHandoff, [&] { return stop_ || queue_.empty(); });
        deferring_ = false;
        if (stop_) break;
        if (queue_.empty()) continue;
      }
    }
    std::unique_lock<core::DriveLock> d(driver_->lock());
    drain(false);
    if (turn_blocked_) {
      // Another communicator of the family has an earlier operation: let
      // its thread drive, and come back when this one's turn has come.
      d.unlock();
      driver_->family->wait_turn(&member_);
      continue;
    }
    if (inflight_p2p_.empty()) continue;
    bool idle;
    {
      std::lock_guard<std::mutex> g(mu_);
      idle = queue_.empty() && !stop_;
    }
    if (!idle) continue;
    // Idle with receives or sends in flight: progress them.
    progress_p2p(Clock::now() + std::chrono::milliseconds(200));
    has_inflight_.store(!inflight_p2p_.empty());
  }
  // Stopping: whatever is left fails.
  auto cause = std::make_exception_ptr(Aborted("communicator destroyed"));
  std::deque<std::unique_ptr<Op>> rest;
  {
    std::lock_guard<std::mutex> g(mu_);
    rest.swap(queue_);
  }
  driver_->family->advance(&member_, core::Family::kNone);
  for (auto& op : rest) op->work->finish(core::with_context(cause, prefix(*op)));
  std::lock_guard<core::DriveLock> d(driver_->lock());
  fail_all(cause);
  has_inflight_.store(false);
}

void CommunicatorImpl::mark_broken(std::exception_ptr e) {
  std::lock_guard<std::mutex> g(mu_);
  if (!broken_) broken_ = e;
}

void CommunicatorImpl::progress_p2p(Clock::time_point until) {
  try {
    if (until <= Clock::now()) {
      transport_->poll();
    } else {
      transport_->poll_wait(until);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    mark_broken(e);
    fail_all(e);
  }
}

void CommunicatorImpl::reap_p2p() {
  if (inflight_p2p_.empty()) return;
  const auto now = Clock::now();
  // Now and then, ask whether a peer that an unfinished send or receive waits
  // for has died without a word (collectives ask in the transport's wait).
  const bool probe = now >= next_liveness_probe_;
  if (probe) next_liveness_probe_ = now + std::chrono::milliseconds(250);
  for (auto it = inflight_p2p_.begin(); it != inflight_p2p_.end();) {
    Op& op = **it;
    if (op.req->complete) {
      observer_->finished(op, nullptr);
      op.work->finish(nullptr, transport_->from_wire(op.req->source));
      it = inflight_p2p_.erase(it);
      inflight_count_.store(inflight_p2p_.size());
      continue;
    }
    if (probe) roll_call_->poll(op.deadline);
    if (now >= op.deadline) {
      // Like a collective's timeout: the transport is broken (the message may
      // be half sent) and the cause is published for the other ranks.
      transport::Request* one[1] = {op.req.get()};
      transport_->abort(core::with_context(timed_out(transport_->pending_summary(one, 1)),
                                           label_ + ": " + std::string(coll::coll_name(op.coll)) + " (tag " +
                                               std::to_string(op.tag) + "): "));
      transport_->poll();  // throws the cause, after publishing it
    }
    if (probe && op.peer >= 0) {
      if (auto gone = transport_->gone_silently(op.peer)) {
        transport_->abort(gone);
        transport_->poll();  // throws the cause, after publishing it
      }
    }
    ++it;
  }
}

void CommunicatorImpl::execute(Op& op, Work& work, bool now) {
  auto finish = [&](std::exception_ptr e) {
    if (now) {
      work.finish_unshared(std::move(e));
    } else {
      work.finish(std::move(e));
    }
  };
  std::exception_ptr broken;
  if (!now) {
    std::lock_guard<std::mutex> g(mu_);
    broken = broken_;
  }
  if (broken) {
    observer_->finished(op, broken);
    finish(core::with_context(broken, prefix(op)));
    return;
  }
  if (!now) observer_->started(op);  // run_now() said so
  try {
    if (op.coll == Coll::kSend || op.coll == Coll::kRecv) {
      post_p2p(op);
    } else {
      driver_->family->running(&member_, op.seq);
      run_collective(op);
      observer_->finished(op, nullptr);
      finish(nullptr);
    }
    reap_p2p();
  } catch (...) {
    auto e = std::current_exception();
    mark_broken(e);
    // The transport is broken already for transport errors; anything else
    // thrown mid-collective leaves ranks out of step, so break it too.
    if (!transport_->broken()) {
      try {
        transport_->abort(e);
        transport_->poll();
      } catch (...) {
      }
    }
    observer_->finished(op, e);
    observer_->broke(e);
    finish(core::with_context(e, prefix(op)));
    fail_all(e);
  }
}

void CommunicatorImpl::post_p2p(Op& op) {
  auto r = std::make_unique<transport::Request>();
  r->kind = op.coll == Coll::kSend ? transport::Request::Kind::kSend : transport::Request::Kind::kRecv;
  r->peer = op.peer;
  r->tag = transport::Tag{transport::Space::kP2P, static_cast<uint64_t>(op.tag), 0};
  r->fp.coll = static_cast<uint8_t>(Coll::kSend);
  r->fp.dtype = static_cast<uint8_t>(op.args.dt);
  r->fp.count = op.args.count;
  r->buf = op.coll == Coll::kSend ? const_cast<void*>(op.args.send) : op.args.recv;
  r->len = op.args.count * op.args.elem();
  op.req = std::move(r);
  if (op.coll == Coll::kSend) {
    transport_->post_send(op.req.get());
  } else {
    transport_->post_recv(op.req.get());
  }
  // Ownership moves to the in-flight list; the queue's unique_ptr is released
  // by the caller of execute() going out of scope, so take a fresh one.
  auto owned = std::make_unique<Op>();
  owned->coll = op.coll;
  owned->seq = op.seq;
  owned->work = op.work;
  owned->req = std::move(op.req);
  owned->peer = op.peer;
  owned->tag = op.tag;
  owned->args = op.args;
  owned->trace = op.trace;
  owned->deadline = Clock::now() + op.opts.timeout.value_or(opts_.timeout);
  inflight_p2p_.push_back(std::move(owned));
  inflight_count_.store(inflight_p2p_.size());
}

void CommunicatorImpl::run_collective(Op& op) {
  coll::Args a = op.args;
  const size_t es = a.elem();
  transport::Fingerprint fp;
  fp.coll = static_cast<uint8_t>(op.coll);
  fp.dtype = static_cast<uint8_t>(a.dt);
  fp.op = is_reducing(op.coll) ? static_cast<uint8_t>(op.user_op) : 0;
  fp.root = static_cast<uint32_t>(a.root);
  fp.count = fingerprint_count(op);

  // Count 0 everywhere: nothing to move (the barrier always runs).
  bool empty = fp.count == 0 && op.coll != Coll::kBarrier && op.coll != Coll::kAlltoallv;
  if (op.coll == Coll::kAlltoallv) {
    empty = true;
    for (size_t i = 0; i < op.counts.size(); ++i) {
      if (op.counts[i] || op.send_counts[i]) empty = false;
    }
    // Ranks may disagree on emptiness only when their peers send them
    // nothing as well; running the exchange anyway keeps everyone in step.
    empty = false;
  }
  if (empty) return;

  // Lower AVG and PREMUL_SUM to SUM.
  std::vector<uint8_t> premul;
  if (is_reducing(op.coll)) {
    a.op = (op.user_op == ReduceOp::kAvg || op.user_op == ReduceOp::kPremulSum) ? ReduceOp::kSum
                                                                                 : op.user_op;
    if (op.user_op == ReduceOp::kPremulSum) {
      size_t n = input_elems(op, size_);
      if (op.coll == Coll::kAllreduce) {
        kernels::scale(a.dt, a.recv, a.send, op.opts.scale, n);
        a.send = a.recv;
      } else {
        premul.resize(n * es);
        kernels::scale(a.dt, premul.data(), a.send, op.opts.scale, n);
        a.send = premul.data();
      }
    }
  }
  if (op.coll == Coll::kAllgatherv || op.coll == Coll::kReduceScatterv || op.coll == Coll::kAlltoallv) {
    a.counts = op.counts.data();
    a.displs = op.displs.data();
    a.send_counts = op.send_counts.empty() ? nullptr : op.send_counts.data();
    a.send_displs = op.send_displs.empty() ? nullptr : op.send_displs.data();
  }

  const auto timeout = op.opts.timeout.value_or(opts_.timeout);
  const coll::Topology& topo = topology();
  if (!arena_checked_) setup_arena(Clock::now() + timeout);  // within this operation's time
  if (!op.algo) op.algo = &chosen(op.coll, a, topo);
  fp.algo = coll::algorithm_id(*op.algo);
  coll::Ctx ctx(*transport_, op.seq, fp, timeout, scratch_, tuning_, topo, arena_.get());
  observer_->running(op, ctx);
  op.algo->fn(ctx, a);

  if (is_reducing(op.coll) && op.user_op == ReduceOp::kAvg) {
    bool has_output = op.coll != Coll::kReduce || rank_ == a.root;
    if (has_output) kernels::divide(a.dt, a.recv, a.recv, size_, output_elems(op, rank_));
  }
}

// select(), remembered per collective for the last element count and type:
// the rest of what the choice depends on is fixed once the arena is settled.
const coll::Algorithm& CommunicatorImpl::chosen(Coll c, const coll::Args& a, const coll::Topology& topo) {
  Chosen& m = chosen_[static_cast<size_t>(c)];
  if (!m.algo || m.count != a.count || m.dt != a.dt) {
    const coll::ArenaCaps caps{arena_ != nullptr, arena_ && arena_->reads(), crowded_};
    m = {a.count, a.dt, &coll::select(c, a, size_, overrides_, topo, caps)};
  }
  return *m.algo;
}

}  // namespace shoal
