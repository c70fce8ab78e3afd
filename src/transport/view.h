// transport/view.h — one communicator's view of a transport that several
// communicators share: a parent and the groups split from it
// (Communicator::split), so that a group reuses its parent's connections
// instead of making its own.
//
// The view numbers ranks as its communicator does (rank i of the group is
// members[i] of the transport) and stamps every message with the
// communicator's context id (Tag::ctx), so that messages of different
// communicators never match each other. A stamped Request keeps the
// transport's numbering in `peer` and `source` (from_wire() turns them
// back); error messages therefore name ranks as the transport's owner (the
// root communicator: in torch, the global ranks) numbers them. The root's
// view is the identity with context 0: stamping costs it nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace shoal::transport {

class View {
 public:
  // The whole transport of `size` ranks, as its owner numbers it.
  View(int size, int rank);
  // `members[i]`: the transport's rank of this view's rank i; `rank`: this
  // process's rank in the view, `wire_rank` in the transport's `wire_size`.
  View(int wire_size, int wire_rank, uint32_t ctx, std::vector<int> members, int rank);

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint32_t ctx() const { return ctx_; }
  // This view's rank `peer` in the transport's numbering, and back (-1 for
  // a rank outside the view; kAnySource stays).
  int to_wire(int peer) const;
  int from_wire(int wire_rank) const;
  // Readies a request of this view for the transport: its peer in the
  // transport's numbering (InvalidArgument for one outside the view), its
  // tag with this view's context.
  void stamp(Request& r) const;

 private:
  uint32_t ctx_ = 0;
  int rank_ = 0;
  int size_ = 1;
  bool identity_ = true;
  std::vector<int> members_;  // empty for the identity
  std::vector<int> rank_of_;  // transport rank -> view rank, -1 if not a member
};

}  // namespace shoal::transport
