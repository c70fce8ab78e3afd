// transport/tcp/frame.h — the wire format of the TCP transport.
//
// A connection starts with the handshake (transport/handshake.h): one Hello
// from the connecting (lower) rank and one Accept back, each carrying its
// sender's proof of the job's secret. Each side believes no frame of the
// other before the other's proof checks out. Then the connection carries a
// stream of frames in both directions: a fixed 48-byte FrameHeader followed
// by `length` payload bytes, in host byte order (the handshake refuses a
// peer whose byte order differs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "transport/handshake.h"
#include "transport/transport.h"

namespace shoal::transport::tcp {

inline constexpr uint32_t kFrameMagic = 0x53484c46;  // "SHLF"

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
