// shoal/error.h — the typed errors of the public API (policy: docs/errors.md).
//
// Every error carries a human-readable message that already names the rank,
// the peer, the collective and its sequence number where they are known.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace shoal {

enum class ErrorCode {
  kInvalidArgument,  // bad input; detected before anything is sent
  kTimeout,          // an operation or rendezvous step ran past its deadline
  kPeerLost,         // a peer process died or its connection broke
  kMismatch,         // ranks disagree on a collective (kind, count, dtype, ...)
  kAborted,          // the communicator was aborted or destroyed by the user
  kStore,            // the rendezvous store failed or is unreachable
  kInternal,         // an invariant of shoal itself broke (a bug)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ErrorCode code() const noexcept { return code_; }
  // The ranks (of the communicator that raised it) this error blames: the
  // lost peer of a PeerLost, the ranks that did not answer the roll call of
  // a timeout. Empty when it blames no one. What Communicator::agree()
  // starts from.
  const std::vector<int>& suspects() const noexcept { return suspects_; }
  void set_suspects(std::vector<int> s) { suspects_ = std::move(s); }

 private:
  ErrorCode code_;
  std::vector<int> suspects_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& w) : Error(ErrorCode::kInvalidArgument, w) {}
};
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& w) : Error(ErrorCode::kTimeout, w) {}
};
class PeerLost : public Error {
 public:
  // `peer` is the rank that was lost (-1 when unknown, e.g. the store host).
  PeerLost(const std::string& w, int peer) : Error(ErrorCode::kPeerLost, w), peer_(peer) {
    if (peer >= 0) set_suspects({peer});
  }
  int peer() const noexcept { return peer_; }

 private:
  int peer_;
};
class Mismatch : public Error {
 public:
  explicit Mismatch(const std::string& w) : Error(ErrorCode::kMismatch, w) {}
};
class Aborted : public Error {
 public:
  explicit Aborted(const std::string& w) : Error(ErrorCode::kAborted, w) {}
};
class StoreError : public Error {
 public:
  explicit StoreError(const std::string& w) : Error(ErrorCode::kStore, w) {}
};
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& w) : Error(ErrorCode::kInternal, w) {}
};

}  // namespace shoal
