// transport/view.cc — see view.h.
#include "transport/view.h"

#include <string>

#include "shoal/error.h"

namespace shoal::transport {

View::View(int size, int rank) : rank_(rank), size_(size) {}

View::View(int wire_size, int wire_rank, uint32_t ctx, std::vector<int> members, int rank)
    : ctx_(ctx), rank_(rank), size_(static_cast<int>(members.size())), members_(std::move(members)) {
  rank_of_.assign(static_cast<size_t>(wire_size), -1);
  for (size_t i = 0; i < members_.size(); ++i) {
    const int w = members_[i];
    if (w < 0 || w >= wire_size || rank_of_[static_cast<size_t>(w)] >= 0) {
      throw InvalidArgument("view: member " + std::to_string(w) + " out of range or repeated");
    }
    rank_of_[static_cast<size_t>(w)] = static_cast<int>(i);
    identity_ = identity_ && w == static_cast<int>(i);
  }
  identity_ = identity_ && size_ == wire_size;
  if (rank_ < 0 || rank_ >= size_ || members_[static_cast<size_t>(rank_)] != wire_rank) {
    throw InvalidArgument("view: this rank is not member " + std::to_string(rank_));
  }
}

int View::to_wire(int peer) const {
  if (identity_ || peer == kAnySource) return peer;
  if (peer < 0 || peer >= size_) return -1;
  return members_[static_cast<size_t>(peer)];
}

int View::from_wire(int wire_rank) const {
  if (identity_ || wire_rank < 0) return wire_rank;
  if (wire_rank >= static_cast<int>(rank_of_.size())) return -1;
  return rank_of_[static_cast<size_t>(wire_rank)];
}

// An any-source receive may match any rank of the transport that sends with
// this context id: only members do.
void View::stamp(Request& r) const {
  r.tag.ctx = ctx_;
  if (identity_) return;
  if (r.peer == kAnySource && r.kind == Request::Kind::kRecv) return;
  if (r.peer < 0 || r.peer >= size_) {
    throw InvalidArgument("peer: " + std::to_string(r.peer) + " is not a rank of this communicator");
  }
  r.peer = members_[static_cast<size_t>(r.peer)];
}

}  // namespace shoal::transport
