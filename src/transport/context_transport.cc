// transport/context_transport.cc — see context_transport.h.
#include "transport/context_transport.h"

#include "shoal/error.h"

namespace shoal::transport {

namespace {
bool is_identity(const std::vector<int>& m, int n) {
  if (static_cast<int>(m.size()) != n) return false;
  for (int i = 0; i < n; ++i) {
    if (m[static_cast<size_t>(i)] != i) return false;
  }
  return true;
}
}  // namespace

ContextTransport::ContextTransport(std::shared_ptr<HybridTransport> inner, uint32_t ctx, std::vector<int> members,
                                   int rank)
    : inner_(std::move(inner)), ctx_(ctx), members_(std::move(members)), rank_(rank),
      identity_(is_identity(members_, inner_->size())) {
  rank_of_.assign(static_cast<size_t>(inner_->size()), -1);
  for (size_t i = 0; i < members_.size(); ++i) {
    int w = members_[i];
    if (w < 0 || w >= inner_->size() || rank_of_[static_cast<size_t>(w)] >= 0) {
      throw InvalidArgument("context transport: member " + std::to_string(w) + " out of range or repeated");
    }
    rank_of_[static_cast<size_t>(w)] = static_cast<int>(i);
  }
  if (rank_ < 0 || rank_ >= size() || members_[static_cast<size_t>(rank_)] != inner_->rank()) {
    throw InvalidArgument("context transport: this rank is not member " + std::to_string(rank_));
  }
}

int ContextTransport::to_wire(int peer) const {
  if (identity_ || peer == kAnySource) return peer;
  if (peer < 0 || peer >= size()) return -1;
  return members_[static_cast<size_t>(peer)];
}

int ContextTransport::from_wire(int wire_rank) const {
  if (identity_ || wire_rank < 0) return wire_rank;
  if (wire_rank >= static_cast<int>(rank_of_.size())) return -1;
  return rank_of_[static_cast<size_t>(wire_rank)];
}

void ContextTransport::post_send(Request* r) {
  if (!identity_ && (r->peer < 0 || r->peer >= size())) {
    throw InvalidArgument("peer: " + std::to_string(r->peer) + " is not a rank of this communicator");
  }
  r->peer = to_wire(r->peer);
  r->tag.ctx = ctx_;
  inner_->post_send(r);
}

// An any-source receive may match any rank of the transport that sends with
// this context id: only members do.
void ContextTransport::post_recv(Request* r) {
  if (!identity_ && r->peer != kAnySource && (r->peer < 0 || r->peer >= size())) {
    throw InvalidArgument("peer: " + std::to_string(r->peer) + " is not a rank of this communicator");
  }
  r->peer = to_wire(r->peer);
  r->tag.ctx = ctx_;
  inner_->post_recv(r);
}

}  // namespace shoal::transport
