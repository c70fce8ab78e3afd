// fuzz_store_server — libFuzzer target: what the TcpStore server does with
// the bytes of one connection, short of the sockets (store_protocol.h): the
// handshake (ServerHandshake), then frame splitting (next_frame) and request
// parsing (parse_request), the requests applied to a small key-value model.
//
// Input: one mode byte, then the connection's bytes. Mode bit 0: the server
// has a secret; bit 1: the client's hello and proof are made valid here (so
// that the request parser is reached behind an authenticated handshake);
// bits 2-4: the bytes arrive in chunks of 1 << k. Invariants: nothing
// crashes, leaks or reads past the input; with a secret, no request is
// parsed unless the proof was made with it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "rendezvous/store_protocol.h"

using namespace shoal;
using namespace shoal::store_proto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auth::Secret key =
      auth::Secret::from_hex("a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90");
  static const auth::Secret none;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const bool server_has = mode & 1, make_valid = mode & 2;
  const size_t chunk = size_t{1} << ((mode >> 2) & 7);
  Bytes in(data + 1, data + size);

  ServerHandshake hs(server_has ? &key : &none);
  if (make_valid) {  // the first kHelloBytes become a real hello
    auth::Nonce nonce;
    Bytes hello = client_hello(server_has ? key : none, &nonce);
    if (in.size() < hello.size()) in.resize(hello.size());
    std::memcpy(in.data(), hello.data(), hello.size());
  }

  Bytes out;
  std::string why;
  size_t pos = 0, avail = 0;
  bool proof_fixed = false;
  while (!hs.done()) {
    avail = std::min(in.size(), avail + chunk);
    size_t used = 0;
    auto step = hs.feed(in.data() + pos, avail - pos, &used, &out, &why);
    pos += used;
    if (step == ServerHandshake::Step::kRefuse) return 0;
    if (step == ServerHandshake::Step::kDone) break;
    if (make_valid && server_has && hs.answered() && !proof_fixed && out.size() >= kAnswerBytes) {
      // Answer the server's nonce with a valid proof in place of the next bytes.
      Bytes proof;
      auth::Nonce mine;
      std::memcpy(mine.data(), in.data() + 8, mine.size());
      if (!check_answer(out.data(), key, mine, &proof).empty()) __builtin_trap();  // our own server refused
      if (in.size() < pos + proof.size()) in.resize(pos + proof.size());
      std::memcpy(in.data() + pos, proof.data(), proof.size());
      proof_fixed = true;
    }
    if (avail == in.size() && step == ServerHandshake::Step::kMore) return 0;  // the client went quiet
  }
  // A server with a secret is done only after a valid proof: one not made
  // here would be a forgery.
  if (server_has && !proof_fixed) __builtin_trap();

  std::map<std::string, std::string> model;
  while (pos < in.size()) {
    const uint8_t* body = nullptr;
    size_t len = 0, used = 0;
    auto st = next_frame(in.data() + pos, in.size() - pos, &body, &len, &used);
    if (st != FrameStatus::kOk) break;
    pos += used;
    Request req;
    if (!parse_request(body, len, &req)) break;  // the server closes the connection here
    if (body + len > in.data() + in.size()) __builtin_trap();
    switch (req.cmd) {
      case Cmd::kSet: model[std::string(req.key)] = std::string(req.value); break;
      case Cmd::kGet: (void)model.count(std::string(req.key)); break;
      case Cmd::kAdd: model[std::string(req.key)] = std::to_string(req.delta); break;
      case Cmd::kCheck:
      case Cmd::kWait:
      case Cmd::kMultiGet:
        for (auto k : req.keys) (void)model.count(std::string(k));
        break;
      case Cmd::kDelete: model.erase(std::string(req.key)); break;
      case Cmd::kCompareSet: {
        auto it = model.find(std::string(req.key));
        if (it == model.end() ? req.expected.empty() : it->second == req.expected) {
          model[std::string(req.key)] = std::string(req.value);
        }
        break;
      }
    }
  }
  return 0;
}
