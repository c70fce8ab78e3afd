// transport/handshake.cc — the handshake's messages, made and checked
// (handshake.h).
#include "transport/handshake.h"

#include <cstring>
#include <vector>

namespace shoal::transport::handshake {
namespace {

const char* link_name(uint8_t link) {
  switch (static_cast<auth::Link>(link)) {
    case auth::Link::kTcp: return "a TCP connection";
    case auth::Link::kShm: return "a shared-memory channel";
    case auth::Link::kStore: return "the store";
    case auth::Link::kArena: return "the shared-memory arena";
  }
  return "an unknown link";
}

// What both proofs of one handshake are about (auth.h).
auth::Transcript transcript(const Hello& h) {
  auth::Transcript t;
  t.link = static_cast<auth::Link>(h.link);
  t.job = h.job;
  t.from = h.rank;
  t.to = h.to;
  t.size = h.size;
  std::memcpy(t.connector.data(), h.nonce, sizeof(h.nonce));
  return t;
}

constexpr const char* kNoProof =
    "it did not prove the job's secret (a different SHOAL_SECRET, or not a rank of this job)";

}  // namespace

Hello make_hello(const Identity& me, int to, uint64_t extra) {
  Hello h;
  h.link = static_cast<uint8_t>(me.link);
  h.job = me.job;
  h.rank = static_cast<uint32_t>(me.rank);
  h.size = static_cast<uint32_t>(me.size);
  h.to = static_cast<uint32_t>(to);
  h.extra = extra;
  auth::Nonce n = auth::fresh_nonce();
  std::memcpy(h.nonce, n.data(), n.size());
  auth::Mac m = auth::prove(*me.secret, auth::Role::kConnector, transcript(h));
  std::memcpy(h.mac, m.data(), m.size());
  return h;
}

std::string check_hello_prefix(const uint8_t* p, size_t n) {
  if (n >= sizeof(uint32_t)) {
    uint32_t magic;
    std::memcpy(&magic, p + offsetof(Hello, magic), sizeof(magic));
    if (magic != kHelloMagic) return "not a shoal hello (bad magic)";
  }
  if (n >= offsetof(Hello, version) + sizeof(uint16_t)) {
    uint16_t version;
    std::memcpy(&version, p + offsetof(Hello, version), sizeof(version));
    if (version != kVersion) {
      return "protocol version " + std::to_string(version) + ", expected " + std::to_string(kVersion) +
             " (another shoal release?)";
    }
  }
  return "";
}

std::string check_hello(const Hello& h, const Identity& me) {
  std::string bad = check_hello_prefix(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
  if (!bad.empty()) return bad;
  if (h.link != static_cast<uint8_t>(me.link)) {
    return std::string("a hello for ") + link_name(h.link) + ", not " + link_name(static_cast<uint8_t>(me.link));
  }
  if (h.job != me.job) return "it belongs to another job or communicator";
  if (h.size != static_cast<uint32_t>(me.size) || h.rank >= h.size || static_cast<int>(h.rank) >= me.rank) {
    return "bad rank " + std::to_string(h.rank) + " of " + std::to_string(h.size);
  }
  if (h.to != static_cast<uint32_t>(me.rank)) return "it means to reach rank " + std::to_string(h.to);
  if (me.secret == nullptr || !auth::verify(*me.secret, auth::Role::kConnector, transcript(h), h.mac)) {
    return kNoProof;
  }
  return "";
}

Accept make_accept(const Hello& h, const Identity& me) {
  Accept a;
  a.link = h.link;
  auth::Transcript t = transcript(h);
  t.acceptor = auth::fresh_nonce();
  std::memcpy(a.nonce, t.acceptor.data(), t.acceptor.size());
  auth::Mac m = auth::prove(*me.secret, auth::Role::kAcceptor, t);
  std::memcpy(a.mac, m.data(), m.size());
  return a;
}

std::string check_accept(const Accept& a, const Hello& sent, const Identity& me) {
  if (a.magic != kAcceptMagic) return "not a shoal answer (bad magic)";
  if (a.version != kVersion) return "protocol version " + std::to_string(a.version);
  if (a.link != sent.link) return std::string("an answer for ") + link_name(a.link);
  auth::Transcript t = transcript(sent);
  std::memcpy(t.acceptor.data(), a.nonce, sizeof(a.nonce));
  if (me.secret == nullptr || !auth::verify(*me.secret, auth::Role::kAcceptor, t, a.mac)) return kNoProof;
  return "";
}

template <class T>
bool from_hex(const std::string& s, T* m) {
  std::vector<uint8_t> b;
  if (!auth::decode_hex(s, &b) || b.size() != sizeof(T)) return false;
  std::memcpy(m, b.data(), sizeof(T));
  return true;
}
template bool from_hex<Hello>(const std::string&, Hello*);
template bool from_hex<Accept>(const std::string&, Accept*);

}  // namespace shoal::transport::handshake
