// transport/matching.h — the matching rules every transport shares (see the
// "Matching" paragraph of transport.h): which posted receive an arriving
// message belongs to, and the errors when the ranks disagree.
//
// Pure functions over the transport's queues; the transport supplies how to
// name the peer and render a Fingerprint, and raises what they return.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <sstream>
#include <string>

#include "shoal/error.h"
#include "transport/liveness.h"
#include "transport/transport.h"

namespace shoal::transport {

inline bool tag_less(const Tag& a, const Tag& b) {
  return a.seq != b.seq ? a.seq < b.seq : a.step < b.step;
}

inline std::string describe_tag(const Tag& t) {
  std::ostringstream o;
  if (t.ctx) o << "group " << t.ctx << " ";
  if (t.space == Space::kP2P) {
    o << "p2p tag " << t.seq;
  } else {
    o << "seq " << t.seq << " step " << t.step;
  }
  return o.str();
}

// Removes and returns the first receive in `q` posted for `tag`, else null.
inline Request* take_posted(std::deque<Request*>& q, const Tag& tag) {
  for (auto it = q.begin(); it != q.end(); ++it) {
    if ((*it)->tag == tag) {
      Request* r = *it;
      q.erase(it);
      return r;
    }
  }
  return nullptr;
}

// Removes `r` from `q` if it is there (a cancelled receive).
inline bool erase_posted(std::deque<Request*>& q, const Request* r) {
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (*it == r) {
      q.erase(it);
      return true;
    }
  }
  return false;
}

// The message a peer sent (its header as the transport parsed it).
struct Arrival {
  int peer;
  Tag tag;
  Fingerprint fp;
  uint64_t length;
};

// Checks a message against the receive it matched: null if it fits, else
// the Mismatch to raise (no byte of the payload has been written yet).
// `name(peer)` describes the peer ("rank 3 (host ...)"); called only on error.
template <class Name>
std::exception_ptr check_matched(const Request& r, const Arrival& m, Liveness& live, Name&& name) {
  auto describe = [&](const Fingerprint& f) { return live.describe(f); };
  if (r.check_fp && !(r.fp == m.fp)) {
    const std::string who = std::to_string(m.peer);
    return std::make_exception_ptr(Mismatch("collective mismatch with " + name(m.peer) + " at " +
                                            describe_tag(m.tag) + ": this rank runs " + describe(r.fp) +
                                            ", rank " + who + " runs " + describe(m.fp)));
  }
  if (r.len != m.length) {
    const std::string who = std::to_string(m.peer);
    return std::make_exception_ptr(Mismatch(
        "message size mismatch with " + name(m.peer) + " at " + describe_tag(m.tag) +
        ": this rank expects " + std::to_string(r.len) + " bytes, rank " + who + " sent " +
        std::to_string(m.length) + " (this rank: " + describe(r.fp) + "; rank " + who + ": " + describe(m.fp) + ")"));
  }
  return nullptr;
}

// A collective message nobody has asked for yet. If this rank already waits
// for an earlier message from the same peer (the first collective receive in
// `recvq`), the peer has moved past it: the ranks disagree on the sequence of
// collectives. So they do when the message belongs to another of the
// communicators sharing the connection (another `ctx`): their collectives
// run one at a time, in the order each rank issued them, so the peer issued
// them in another order than this rank (docs/torch.md, "Groups"). Returns
// that Mismatch, else null (the message waits).
template <class Name>
std::exception_ptr check_order(const std::deque<Request*>& recvq, const Arrival& m, Liveness& live, Name&& name) {
  auto describe = [&](const Fingerprint& f) { return live.describe(f); };
  for (const Request* r : recvq) {
    if (r->tag.space != Space::kCollective) continue;
    if (r->tag.ctx != m.tag.ctx) {
      return std::make_exception_ptr(Mismatch(
          "collective order mismatch with " + name(m.peer) + ": this rank waits for " + describe_tag(r->tag) +
          " (" + describe(r->fp) + "), rank " + std::to_string(m.peer) + " sent " +
          describe_tag(m.tag) + " (" + describe(m.fp) +
          ") first; communicators that share connections must issue their collectives in the same "
          "order on every rank (or give the group its own connections: SHOAL_GROUP_CONNECTIONS=own)"));
    }
    if (tag_less(r->tag, m.tag) || (r->tag.seq == m.tag.seq && r->check_fp && !(r->fp == m.fp))) {
      return std::make_exception_ptr(Mismatch(
          "collective mismatch with " + name(m.peer) + ": this rank waits for " + describe_tag(r->tag) +
          " of " + describe(r->fp) + ", rank " + std::to_string(m.peer) + " sent " +
          describe_tag(m.tag) + " of " + describe(m.fp)));
    }
    break;
  }
  return nullptr;
}

// The message for a buffered P2P message whose size differs from the receive.
inline std::exception_ptr size_mismatch(const std::string& peer_name, const Tag& tag, size_t want,
                                        size_t got) {
  return std::make_exception_ptr(Mismatch("message size mismatch with " + peer_name + " on " +
                                          describe_tag(tag) + ": expected " + std::to_string(want) +
                                          " bytes, the peer sent " + std::to_string(got)));
}

}  // namespace shoal::transport
