// transport/context_transport.h — one communicator's view of a transport
// that several communicators share: a parent and the groups split from it
// (Communicator::split), so that a group reuses its parent's connections
// instead of making its own.
//
// The view numbers ranks as its communicator does (rank i of the group is
// members[i] of the transport) and stamps every message with the
// communicator's context id (Tag::ctx), so that messages of different
// communicators never match each other. A posted Request keeps the
// transport's numbering in `peer` and `source` (from_wire() turns them back);
// error messages therefore name ranks as the transport's owner (the root
// communicator: in torch, the global ranks) numbers them.
//
// Threading: as for any Transport, one thread drives at a time: the
// communicators sharing the transport share one DriveLock (core).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/hybrid_transport.h"

namespace shoal::transport {

class ContextTransport final : public Transport {
 public:
  // `members[i]`: the transport's rank of this view's rank i; `rank`: this
  // process's rank in the view. Identity numbering and ctx 0 for the root.
  ContextTransport(std::shared_ptr<HybridTransport> inner, uint32_t ctx, std::vector<int> members, int rank);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void post_send(Request* r) override;
  void post_recv(Request* r) override;
  void wait(Request* const* reqs, size_t n, Clock::time_point deadline) override {
    inner_->wait(reqs, n, deadline);
  }
  bool poll() override { return inner_->poll(); }
  void poll_wait(Clock::time_point until) override { inner_->poll_wait(until); }
  void wake() override { inner_->wake(); }
  void set_spin_us(int us) override { inner_->set_spin_us(us); }
  void set_spin_yield(bool yield) { inner_->set_spin_yield(yield); }
  int event_fd() const override { return inner_->event_fd(); }
  bool arm() override { return inner_->arm(); }
  bool cancel(Request* r) override { return inner_->cancel(r); }
  std::string pending_summary(Request* const* reqs, size_t n) const override {
    return inner_->pending_summary(reqs, n);
  }
  void abort(std::exception_ptr cause) override { inner_->abort(std::move(cause)); }
  std::exception_ptr broken() const override { return inner_->broken(); }
  std::string describe_peer(int peer) const override { return inner_->describe_peer(to_wire(peer)); }
  bool heard_from(int peer) const override { return inner_->heard_from(to_wire(peer)); }
  std::exception_ptr gone_silently(int peer) { return inner_->gone_silently(to_wire(peer)); }
  bool is_local(int peer) const { return inner_->is_local(to_wire(peer)); }

  uint32_t ctx() const { return ctx_; }
  // This view's rank `peer` in the transport's numbering, and back (-1 for
  // a rank outside the view; kAnySource stays).
  int to_wire(int peer) const;
  int from_wire(int wire_rank) const;
  HybridTransport& inner() { return *inner_; }
  const std::shared_ptr<HybridTransport>& shared() const { return inner_; }

 private:
  std::shared_ptr<HybridTransport> inner_;
  const uint32_t ctx_;
  const std::vector<int> members_;
  std::vector<int> rank_of_;  // transport rank -> view rank, -1 if not a member
  const int rank_;
  const bool identity_;
};

}  // namespace shoal::transport
