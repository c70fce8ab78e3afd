// transport/tcp/frame.cc — making and checking the connection handshake of
// the TCP transport (frame.h). Pure functions: tests/fuzz/fuzz_tcp_handshake.cc.
#include "transport/tcp/frame.h"

namespace shoal::transport::tcp {
namespace {

auth::Transcript transcript(const Hello& h) {
  auth::Transcript t;
  t.link = auth::Link::kTcp;
  t.job = h.job;
  t.from = h.rank;
  t.to = h.to;
  t.size = h.size;
  std::memcpy(t.connector.data(), h.nonce, sizeof(h.nonce));
  return t;
}

}  // namespace

Hello make_hello(const Identity& me, int to) {
  Hello h;
  h.job = me.job;
  h.rank = static_cast<uint32_t>(me.rank);
  h.size = static_cast<uint32_t>(me.size);
  h.to = static_cast<uint32_t>(to);
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
    if (version != kProtocolVersion) {
      return "protocol version " + std::to_string(version) + ", expected " + std::to_string(kProtocolVersion) +
             " (another shoal release?)";
    }
  }
  return "";
}

std::string check_hello(const Hello& h, const Identity& me) {
  std::string bad = check_hello_prefix(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
  if (!bad.empty()) return bad;
  if (h.job != me.job) return "it belongs to another job or communicator";
  if (h.size != static_cast<uint32_t>(me.size) || h.rank >= h.size || static_cast<int>(h.rank) >= me.rank) {
    return "bad rank " + std::to_string(h.rank) + " of " + std::to_string(h.size);
  }
  if (h.to != static_cast<uint32_t>(me.rank)) return "it means to reach rank " + std::to_string(h.to);
  if (me.secret == nullptr || !auth::verify(*me.secret, auth::Role::kConnector, transcript(h), h.mac)) {
    return "it did not prove the job's secret (a different SHOAL_SECRET, or not a rank of this job)";
  }
  return "";
}

Accept make_accept(const Hello& h, const Identity& me) {
  Accept a;
  auth::Transcript t = transcript(h);
  t.acceptor = auth::fresh_nonce();
  std::memcpy(a.nonce, t.acceptor.data(), t.acceptor.size());
  auth::Mac m = auth::prove(*me.secret, auth::Role::kAcceptor, t);
  std::memcpy(a.mac, m.data(), m.size());
  return a;
}

std::string check_accept(const Accept& a, const Hello& sent, const Identity& me) {
  if (a.magic != kAcceptMagic) return "not a shoal answer (bad magic)";
  if (a.version != kProtocolVersion) return "protocol version " + std::to_string(a.version);
  auth::Transcript t = transcript(sent);
  std::memcpy(t.acceptor.data(), a.nonce, sizeof(a.nonce));
  if (me.secret == nullptr || !auth::verify(*me.secret, auth::Role::kAcceptor, t, a.mac)) {
    return "it did not prove the job's secret (a different SHOAL_SECRET, or not a rank of this job)";
  }
  return "";
}

}  // namespace shoal::transport::tcp
