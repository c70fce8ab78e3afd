// core/flight_recorder.cc — the ring of recent operations and its JSON form.
#include "core/flight_recorder.h"

#include <bit>
#include <mutex>
#include <sstream>

#include "collectives/coll.h"
#include "core/json_text.h"
#include "shoal/types.h"

namespace shoal::core {

const char* op_state_name(OpState s) {
  switch (s) {
    case OpState::kQueued: return "queued";
    case OpState::kRunning: return "running";
    case OpState::kDone: return "done";
    case OpState::kFailed: return "failed";
  }
  return "unknown";
}

FlightRecorder::FlightRecorder(size_t capacity)
    : capacity_(capacity), ring_(capacity ? std::bit_ceil(capacity) : 0), mask_(capacity ? ring_.size() - 1 : 0) {}

TraceEntry* FlightRecorder::find(uint64_t id) {
  if (ring_.empty() || id == 0) return nullptr;
  TraceEntry& e = ring_[id & mask_];
  return e.id == id ? &e : nullptr;
}

uint64_t FlightRecorder::enqueued(const TraceEntry& e) {
  SpinLockGuard g(mu_);
  if (ring_.empty()) return 0;
  uint64_t id = next_id_++;
  TraceEntry& slot = ring_[id & mask_];
  // Field by field, so that the slot keeps the capacity of its strings.
  slot.id = id;
  slot.seq = e.seq;
  slot.coll = e.coll;
  slot.dtype = e.dtype;
  slot.redop = e.redop;
  slot.root = e.root;
  slot.peer = e.peer;
  slot.tag = e.tag;
  slot.count = e.count;
  slot.bytes = e.bytes;
  slot.algo = e.algo;
  slot.peers.clear();
  slot.state = OpState::kQueued;
  slot.enqueued_us = e.enqueued_us;
  slot.started_us = 0;
  slot.ended_us = 0;
  slot.error.clear();
  return id;
}

void FlightRecorder::started(uint64_t id, int64_t now_us, std::string_view algo) {
  SpinLockGuard g(mu_);
  if (TraceEntry* e = find(id)) {
    e->state = OpState::kRunning;
    e->started_us = now_us;
    e->algo = algo;
  }
}

void FlightRecorder::ended(const TraceEntry& e) {
  ended(e.id, e.state, e.started_us, e.ended_us, e.algo, e.error, e.peers);
}

void FlightRecorder::ended(uint64_t id, OpState state, int64_t started_us, int64_t ended_us, std::string_view algo,
                           std::string_view error, const std::vector<int>& peers) {
  SpinLockGuard g(mu_);
  TraceEntry* slot = find(id);
  if (!slot) return;
  slot->state = state;
  slot->started_us = started_us;
  slot->ended_us = ended_us;
  slot->algo = algo;
  if (!error.empty() || !slot->error.empty()) slot->error.assign(error);
  slot->peers.assign(peers.begin(), peers.end());
}

std::vector<TraceEntry> FlightRecorder::snapshot() const {
  SpinLockGuard g(mu_);
  std::vector<TraceEntry> out;
  if (ring_.empty()) return out;
  const uint64_t n = capacity_;
  const uint64_t first = next_id_ > n ? next_id_ - n : 1;
  for (uint64_t id = first; id < next_id_; ++id) {
    const TraceEntry& e = ring_[id & mask_];
    if (e.id == id) out.push_back(e);
  }
  return out;
}

std::string trace_entry_json(const TraceEntry& e) {
  const auto c = static_cast<coll::Coll>(e.coll);
  const bool p2p = c == coll::Coll::kSend || c == coll::Coll::kRecv;
  std::ostringstream o;
  o << "{\"id\":" << e.id << ",\"seq\":" << e.seq << ",\"op\":" << json_quote(coll::coll_name(c))
    << ",\"count\":" << e.count << ",\"bytes\":" << e.bytes
    << ",\"dtype\":" << json_quote(dtype_name(static_cast<DataType>(e.dtype)));
  if (e.redop >= 0) o << ",\"redop\":" << json_quote(reduce_op_name(static_cast<ReduceOp>(e.redop)));
  if (e.root >= 0) o << ",\"root\":" << e.root;
  if (p2p) o << ",\"peer\":" << e.peer << ",\"tag\":" << e.tag;
  if (!e.algo.empty()) o << ",\"algo\":" << json_quote(e.algo);
  o << ",\"peers\":[";
  for (size_t i = 0; i < e.peers.size(); ++i) o << (i ? "," : "") << e.peers[i];
  o << "],\"state\":" << json_quote(op_state_name(e.state)) << ",\"enqueued_us\":" << e.enqueued_us
    << ",\"started_us\":" << e.started_us << ",\"ended_us\":" << e.ended_us;
  if (!e.error.empty()) o << ",\"error\":" << json_quote(e.error);
  o << "}";
  return o.str();
}

}  // namespace shoal::core
