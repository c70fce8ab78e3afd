// transport/tcp/frame.h — the wire format of the TCP transport.
//
// A connection starts with one Hello from the connecting (lower) rank, then
// carries a stream of frames in both directions: a fixed 48-byte FrameHeader
// followed by `length` payload bytes. Integers are in host byte order: the
// transport refuses peers whose Hello has a different byte-order marker.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/transport.h"

namespace shoal::transport::tcp {

inline constexpr uint32_t kHelloMagic = 0x53484c48;  // "SHLH"
inline constexpr uint32_t kFrameMagic = 0x53484c46;  // "SHLF"
inline constexpr uint16_t kProtocolVersion = 1;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint16_t version = kProtocolVersion;
  uint16_t reserved = 0;
  uint64_t job = 0;   // the communicator's unique id, from the rendezvous
  uint32_t rank = 0;  // the connecting rank
  uint32_t size = 0;  // its world size
};
static_assert(sizeof(Hello) == 24);

enum class FrameKind : uint8_t { kData = 1 };

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = static_cast<uint8_t>(FrameKind::kData);
  uint8_t space = 0;
  uint16_t reserved = 0;
  uint32_t step = 0;
  uint32_t pad = 0;
  uint64_t seq = 0;
  uint64_t length = 0;
  Fingerprint fp;

  Tag tag() const { return Tag{static_cast<Space>(space), seq, step}; }
};
static_assert(sizeof(Fingerprint) == 16);
static_assert(sizeof(FrameHeader) == 48);

inline FrameHeader make_header(const Request& r) {
  FrameHeader h;
  h.space = static_cast<uint8_t>(r.tag.space);
  h.step = r.tag.step;
  h.seq = r.tag.seq;
  h.length = r.len;
  h.fp = r.fp;
  return h;
}

}  // namespace shoal::transport::tcp
