// transport/handshake.h — how two ranks of a job prove to each other that
// they hold the job's secret before either believes a byte of the other.
// One handshake for every link: a TCP connection, a shared-memory channel,
// and the host arena's members (carried through the store).
//
// The connecting (lower) rank sends a Hello with a fresh nonce and its proof
// (auth::prove, Role::kConnector) over who it is, whom it means to reach and
// the link; the accepting rank checks it, cheapest check first, and answers
// with an Accept: its own fresh nonce and its proof over both nonces
// (Role::kAcceptor). Neither side believes anything of the other before the
// other's proof checks out (docs/security.md). Integers are in host byte
// order: a peer whose magic reads differently is refused. Pure functions:
// tests/fuzz/fuzz_handshake.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/auth.h"

namespace shoal::transport::handshake {

inline constexpr uint32_t kHelloMagic = 0x53484c48;   // "SHLH"
inline constexpr uint32_t kAcceptMagic = 0x53484c41;  // "SHLA"
inline constexpr uint16_t kVersion = 3;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kVersion;
  uint8_t link = 0;   // auth::Link
  uint8_t reserved = 0;
  uint64_t job = 0;   // the communicator's unique id, from the rendezvous
  uint32_t rank = 0;  // the connecting rank
  uint32_t size = 0;  // its world size
  uint32_t to = 0;    // the rank it means to reach
  uint32_t reserved2 = 0;
  uint64_t extra = 0;  // what the link adds (shared memory: the segment's size)
  uint8_t nonce[auth::kNonceBytes] = {};  // fresh for this connection
  uint8_t mac[auth::kMacBytes] = {};      // auth::prove(kConnector, ...) over the above
};
static_assert(sizeof(Hello) == 104);

// The accepting rank's answer: the first bytes it sends back.
struct Accept {
  uint32_t magic = kAcceptMagic;
  uint16_t version = kVersion;
  uint8_t link = 0;
  uint8_t reserved = 0;
  uint8_t nonce[auth::kNonceBytes] = {};  // the acceptor's, fresh
  uint8_t mac[auth::kMacBytes] = {};      // auth::prove(kAcceptor, ...) over both nonces
};
static_assert(sizeof(Accept) == 72);

// Who this end of a link is, to make and check hellos.
struct Identity {
  uint64_t job = 0;
  int rank = 0;
  int size = 1;
  const auth::Secret* secret = nullptr;
  auth::Link link = auth::Link::kTcp;
};

// The connector's Hello to rank `to`, with a fresh nonce and its proof.
Hello make_hello(const Identity& me, int to, uint64_t extra = 0);
// The acceptor's checks, cheapest first. check_hello_prefix looks at the
// first n bytes received (any n) so that a stranger is turned away before it
// has sent a whole hello. Each returns "" when the bytes pass, else why not.
std::string check_hello_prefix(const uint8_t* p, size_t n);
std::string check_hello(const Hello& h, const Identity& me);
// The acceptor's answer to a hello that passed check_hello.
Accept make_accept(const Hello& h, const Identity& me);
// The connector's check of the answer to the hello it sent (to `sent.to`).
std::string check_accept(const Accept& a, const Hello& sent, const Identity& me);

// A Hello or an Accept as hex and back (links that carry them as text: the
// arena, through the store). from_hex is false unless `s` is exactly one.
template <class T>
std::string to_hex(const T& m) {
  return auth::to_hex(reinterpret_cast<const uint8_t*>(&m), sizeof(m));
}
template <class T>
bool from_hex(const std::string& s, T* m);

}  // namespace shoal::transport::handshake
