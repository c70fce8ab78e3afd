// fuzz_handshake — libFuzzer target: the handshake checks of every link
// (transport/handshake.h): check_hello_prefix on every prefix of the input,
// check_hello on it as a Hello, check_accept on what follows as an Accept.
//
// Input: one mode byte, then the bytes. Mode bit 7 re-signs the hello with
// the job's secret (so that the checks behind the proof are reached); bits
// 0-2 pick the receiving rank; bits 3-4 the link it arrives on (TCP, shared
// memory, the arena). Invariants: nothing crashes or leaks; a hello that was
// not re-signed never passes (forging a proof is out of reach); a re-signed
// one that passes gets an answer that its sender accepts.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/auth.h"
#include "transport/handshake.h"

using namespace shoal;
using namespace shoal::transport::handshake;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auth::Secret key =
      auth::Secret::from_hex("5f1b3c7a9e2d4f6081a3c5e7092b4d6f8193a5c7e90b2d4f6a8c0e1f3b5d7f92");
  static const auth::Link kLinks[4] = {auth::Link::kTcp, auth::Link::kShm, auth::Link::kArena, auth::Link::kTcp};
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  ++data;
  --size;
  const auth::Link link = kLinks[(mode >> 3) & 3];
  const Identity me{0x0123456789abcdefULL, 1 + (mode & 7), 9, &key, link};

  for (size_t n = 0; n <= size && n <= sizeof(Hello); ++n) (void)check_hello_prefix(data, n);

  Hello h;
  std::memset(&h, 0, sizeof(h));
  std::memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
  // The sender as the hello says it is, on the link the hello names.
  const Identity sender{h.job, static_cast<int>(h.rank), static_cast<int>(h.size), &key,
                        static_cast<auth::Link>(h.link)};
  const bool signed_by_us = mode & 0x80;
  if (signed_by_us) {
    // Keep the fuzzer's identity fields, give it a valid proof for them.
    Hello fresh = make_hello(sender, static_cast<int>(h.to), h.extra);
    std::memcpy(h.nonce, fresh.nonce, sizeof(h.nonce));
    std::memcpy(h.mac, fresh.mac, sizeof(h.mac));
  }
  const std::string verdict = check_hello(h, me);
  if (verdict.empty()) {
    if (!signed_by_us) __builtin_trap();  // a forged proof passed
    const Accept a = make_accept(h, me);
    if (!check_accept(a, h, sender).empty()) __builtin_trap();  // our own answer refused
  }

  if (size >= sizeof(Hello) + sizeof(Accept)) {
    Accept a;
    std::memcpy(&a, data + sizeof(Hello), sizeof(a));
    if (check_accept(a, h, sender).empty()) __builtin_trap();  // a forged answer passed
  }
  return 0;
}
