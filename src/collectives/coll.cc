// collectives/coll.cc — Ctx's primitives and the collective names.
#include "collectives/coll.h"

#include <array>

namespace shoal::coll {

namespace {
constexpr std::array<std::string_view, kNumColls> kNames = {
    "none",      "allreduce",      "broadcast", "reduce",    "allgather",
    "allgatherv", "reduce_scatter", "reduce_scatterv", "alltoall", "alltoallv",
    "gather",    "scatter",        "barrier",   "send",      "recv"};
}  // namespace

std::string_view coll_name(Coll c) {
  auto i = static_cast<size_t>(c);
  return i < kNames.size() ? kNames[i] : "unknown";
}

bool parse_coll(std::string_view s, Coll* out) {
  for (size_t i = 1; i < kNames.size(); ++i) {
    if (kNames[i] == s) {
      *out = static_cast<Coll>(i);
      return true;
    }
  }
  return false;
}

void* Scratch::get(size_t bytes, int slot) {
  auto& v = slots_[slot];
  if (v.size() < bytes) v.resize(bytes);
  return v.data();
}

void Ctx::isend(Request& r, int peer, uint32_t step, const void* buf, size_t bytes) {
  r.kind = Request::Kind::kSend;
  r.peer = peer;
  r.tag = transport::Tag{transport::Space::kCollective, seq_, step};
  r.fp = fp_;
  r.buf = const_cast<void*>(buf);
  r.len = bytes;
  note_peer(peer);
  view_.stamp(r);
  t_.post_send(&r);
}

void Ctx::irecv(Request& r, int peer, uint32_t step, void* buf, size_t bytes) {
  r.kind = Request::Kind::kRecv;
  r.peer = peer;
  r.tag = transport::Tag{transport::Space::kCollective, seq_, step};
  r.fp = fp_;
  r.buf = buf;
  r.len = bytes;
  note_peer(peer);
  view_.stamp(r);
  t_.post_recv(&r);
}

void Ctx::wait(Request& r) {
  Request* rs[1] = {&r};
  t_.wait(rs, 1, deadline_.get());
}

void Ctx::wait_all(Request* const* rs, size_t n) { t_.wait(rs, n, deadline_.get()); }

void Ctx::send(int peer, uint32_t step, const void* buf, size_t bytes) {
  Request r;
  isend(r, peer, step, buf, bytes);
  wait(r);
}

void Ctx::recv(int peer, uint32_t step, void* buf, size_t bytes) {
  Request r;
  irecv(r, peer, step, buf, bytes);
  wait(r);
}

void Ctx::sendrecv(int to, const void* sbuf, size_t sbytes, int from, void* rbuf, size_t rbytes,
                   uint32_t step) {
  Request rr, sr;
  irecv(rr, from, step, rbuf, rbytes);
  isend(sr, to, step, sbuf, sbytes);
  wait(rr, sr);
}

}  // namespace shoal::coll
