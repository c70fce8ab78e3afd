// transport/tcp/frame.h — the wire format of the TCP transport.
//
// A connection starts with one Hello from the connecting (lower) rank, which
// carries its proof of the job's secret, and one Accept back from the
// accepting rank, which carries that rank's proof, bound to the connector's
// nonce (docs/security.md). Each side believes no frame of the other before
// the other's proof checks out. Then the connection carries a stream of
// frames in both directions: a fixed 48-byte FrameHeader followed by
// `length` payload bytes. Integers are in host byte order: the transport
// refuses peers whose Hello has a different byte-order marker (the magic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/auth.h"
#include "transport/transport.h"

namespace shoal::transport::tcp {

inline constexpr uint32_t kHelloMagic = 0x53484c48;   // "SHLH"
inline constexpr uint32_t kAcceptMagic = 0x53484c41;  // "SHLA"
inline constexpr uint32_t kFrameMagic = 0x53484c46;   // "SHLF"
inline constexpr uint16_t kProtocolVersion = 2;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kProtocolVersion;
  uint16_t reserved = 0;
  uint64_t job = 0;   // the communicator's unique id, from the rendezvous
  uint32_t rank = 0;  // the connecting rank
  uint32_t size = 0;  // its world size
  uint32_t to = 0;    // the rank it means to reach
  uint32_t reserved2 = 0;
  uint8_t nonce[auth::kNonceBytes] = {};  // fresh for this connection
  uint8_t mac[auth::kMacBytes] = {};      // auth::prove(kConnector, ...) over the above
};
static_assert(sizeof(Hello) == 96);

// The accepting rank's answer: the first bytes it sends on the connection.
struct Accept {
  uint32_t magic = kAcceptMagic;
  uint16_t version = kProtocolVersion;
  uint16_t reserved = 0;
  uint8_t nonce[auth::kNonceBytes] = {};  // the acceptor's, fresh
  uint8_t mac[auth::kMacBytes] = {};      // auth::prove(kAcceptor, ...) over both nonces
};
static_assert(sizeof(Accept) == 72);

// Who this end of a connection is, to make and check hellos.
struct Identity {
  uint64_t job = 0;
  int rank = 0;
  int size = 1;
  const auth::Secret* secret = nullptr;
};

// The connector's Hello to rank `to`, with a fresh nonce and its proof.
Hello make_hello(const Identity& me, int to);
// The acceptor's checks, cheapest first. check_hello_prefix looks at the
// first n bytes received (any n) so that a stranger is turned away before it
// has sent a whole hello. Each returns "" when the bytes pass, else why not.
std::string check_hello_prefix(const uint8_t* p, size_t n);
std::string check_hello(const Hello& h, const Identity& me);
// The acceptor's answer to a hello that passed check_hello.
Accept make_accept(const Hello& h, const Identity& me);
// The connector's check of the answer to the hello it sent (to `sent.to`).
std::string check_accept(const Accept& a, const Hello& sent, const Identity& me);

enum class FrameKind : uint8_t { kData = 1 };

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = static_cast<uint8_t>(FrameKind::kData);
  uint8_t space = 0;
  uint16_t reserved = 0;
  uint32_t step = 0;
  uint32_t ctx = 0;
  uint64_t seq = 0;
  uint64_t length = 0;
  Fingerprint fp;

  Tag tag() const { return Tag{static_cast<Space>(space), seq, step, ctx}; }
};
static_assert(sizeof(Fingerprint) == 16);
static_assert(sizeof(FrameHeader) == 48);

// nullptr when the header may be believed as far as it goes (the receiver
// still checks tag, fingerprint and length against its receives), else why not.
inline const char* check_frame_header(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return "malformed frame header (bad magic)";
  if (h.kind != static_cast<uint8_t>(FrameKind::kData)) return "malformed frame header (unknown kind)";
  if (h.space > static_cast<uint8_t>(Space::kP2P)) return "malformed frame header (unknown tag space)";
  return nullptr;
}

inline FrameHeader make_header(const Request& r) {
  FrameHeader h;
  h.space = static_cast<uint8_t>(r.tag.space);
  h.step = r.tag.step;
  h.ctx = r.tag.ctx;
  h.seq = r.tag.seq;
  h.length = r.len;
  h.fp = r.fp;
  return h;
}

}  // namespace shoal::transport::tcp
