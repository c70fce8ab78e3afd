// core/timeline.cc — Chrome trace events for ended operations.
#include "core/timeline.h"

#include <cerrno>
#include <cstring>
#include <sstream>

#include "collectives/coll.h"
#include "core/json_text.h"
#include "shoal/error.h"
#include "shoal/types.h"

namespace shoal::core {
namespace {

constexpr int kCollectiveTid = 1;
constexpr int kP2PTid = 2;

std::string args_json(const TraceEntry& e) {
  const auto c = static_cast<coll::Coll>(e.coll);
  std::ostringstream o;
  o << "{\"seq\":" << e.seq << ",\"count\":" << e.count << ",\"bytes\":" << e.bytes
    << ",\"dtype\":" << json_quote(dtype_name(static_cast<DataType>(e.dtype)));
  if (e.redop >= 0) o << ",\"redop\":" << json_quote(reduce_op_name(static_cast<ReduceOp>(e.redop)));
  if (e.root >= 0) o << ",\"root\":" << e.root;
  if (c == coll::Coll::kSend || c == coll::Coll::kRecv) o << ",\"peer\":" << e.peer << ",\"tag\":" << e.tag;
  if (!e.algo.empty()) o << ",\"algo\":" << json_quote(e.algo);
  o << ",\"peers\":[";
  for (size_t i = 0; i < e.peers.size(); ++i) o << (i ? "," : "") << e.peers[i];
  o << "],\"state\":" << json_quote(op_state_name(e.state));
  if (e.started_us > 0) o << ",\"queued_us\":" << (e.started_us - e.enqueued_us);
  if (!e.error.empty()) o << ",\"error\":" << json_quote(e.error);
  o << "}";
  return o.str();
}

// An async begin/end pair (overlapping spans: queueing, sends, receives).
std::string async_event(char ph, const std::string& name, const char* cat, uint64_t id, int64_t ts, int pid,
                        int tid) {
  std::ostringstream o;
  o << "{\"name\":" << json_quote(name) << ",\"cat\":\"" << cat << "\",\"ph\":\"" << ph << "\",\"id\":" << id
    << ",\"ts\":" << ts << ",\"pid\":" << pid << ",\"tid\":" << tid << "}";
  return o.str();
}

}  // namespace

Timeline::Timeline(std::string path, int rank, const std::string& comm_name) : path_(std::move(path)), rank_(rank) {
  f_ = std::fopen(path_.c_str(), "w");
  if (!f_) {
    throw InvalidArgument("SHOAL_TIMELINE: cannot create '" + path_ + "': " + std::strerror(errno));
  }
  std::fputs("[\n", f_);
  write("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
        ",\"args\":{\"name\":" + json_quote("shoal rank " + std::to_string(rank_) + " (" + comm_name + ")") + "}}");
  write("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) +
        ",\"args\":{\"sort_index\":" + std::to_string(rank_) + "}}");
  write("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" +
        std::to_string(kCollectiveTid) + ",\"args\":{\"name\":\"collectives\"}}");
  write("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" +
        std::to_string(kP2PTid) + ",\"args\":{\"name\":\"send/recv\"}}");
}

Timeline::~Timeline() {
  MutexLock g(mu_);
  if (!f_) return;
  std::fputs("\n]\n", f_);
  std::fclose(f_);
  f_ = nullptr;
}

void Timeline::write(const std::string& event) {
  if (!first_) std::fputs(",\n", f_);
  first_ = false;
  std::fputs(event.c_str(), f_);
}

void Timeline::add(const TraceEntry& e) {
  const auto c = static_cast<coll::Coll>(e.coll);
  const bool p2p = c == coll::Coll::kSend || c == coll::Coll::kRecv;
  std::string name(coll::coll_name(c));
  MutexLock g(mu_);
  if (!f_) return;
  if (p2p) {
    if (e.started_us == 0) return;
    std::string label = name + (c == coll::Coll::kSend ? " to " : " from ") +
                        (e.peer < 0 ? std::string("any") : std::to_string(e.peer)) + " tag " + std::to_string(e.tag);
    const uint64_t id = next_async_++;
    write(async_event('b', label, "p2p", id, e.started_us, rank_, kP2PTid));
    write(async_event('e', label, "p2p", id, e.ended_us, rank_, kP2PTid));
    return;
  }
  if (e.started_us == 0) return;  // failed before it could start: nothing ran
  if (e.started_us > e.enqueued_us) {
    std::string label = name + " seq " + std::to_string(e.seq) + " queued";
    const uint64_t id = next_async_++;
    write(async_event('b', label, "queued", id, e.enqueued_us, rank_, kCollectiveTid));
    write(async_event('e', label, "queued", id, e.started_us, rank_, kCollectiveTid));
  }
  std::ostringstream o;
  o << "{\"name\":" << json_quote(name) << ",\"cat\":\"collective\",\"ph\":\"X\",\"ts\":" << e.started_us
    << ",\"dur\":" << (e.ended_us - e.started_us) << ",\"pid\":" << rank_ << ",\"tid\":" << kCollectiveTid
    << ",\"args\":" << args_json(e) << "}";
  write(o.str());
}

void Timeline::flush() {
  MutexLock g(mu_);
  if (f_) std::fflush(f_);
}

std::string timeline_path(const std::string& pattern, int rank, int size, const std::string& comm, long pid) {
  std::string out;
  bool has_rank = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char k = pattern[i + 1];
      if (k == 'r') {
        out += std::to_string(rank);
        has_rank = true;
        ++i;
        continue;
      }
      if (k == 'c') {
        out += comm;
        ++i;
        continue;
      }
      if (k == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  if (!has_rank && size > 1) {
    size_t slash = out.rfind('/');
    size_t dot = out.rfind('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) dot = out.size();
    out.insert(dot, "-rank" + std::to_string(rank));
  }
  return out;
}

}  // namespace shoal::core
