// common/auth.h — the job's secret and the HMAC-SHA256 proofs with which the
// two ends of every connection show each other that they hold it.
//
// All of shoal's cryptography is in this file and auth.cc, over OpenSSL's
// libcrypto: random bytes (RAND_bytes), HMAC-SHA256, constant-time comparison
// (CRYPTO_memcmp), and, for shoalrun, sealing the secret to another node's
// X25519 key (ECDH, then AES-256-GCM). The protocols that use it and the
// threat model are in docs/security.md.
//
// Value types and free functions; thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shoal::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
inline constexpr size_t kSecretBytes = 32;     // what Secret::random() makes
inline constexpr size_t kMinSecretBytes = 16;  // what a user-given secret must have at least
inline constexpr size_t kMaxSecretBytes = 64;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// The job's secret: 16 to 64 bytes, written as hex (SHOAL_SECRET). Empty
// means none.
class Secret {
 public:
  Secret() = default;
  static Secret random();
  // Parses hex digits (surrounding white space is ignored). Throws
  // InvalidArgument naming `what` when malformed or of the wrong length.
  static Secret from_hex(std::string_view hex, const std::string& what = "secret");
  // SHOAL_SECRET when set, else none. Throws InvalidArgument when malformed.
  static Secret from_env();

  bool empty() const { return size_ == 0; }
  const uint8_t* data() const { return key_.data(); }
  size_t size() const { return size_; }
  std::string hex() const;

 private:
  std::array<uint8_t, kMaxSecretBytes> key_{};
  size_t size_ = 0;
};

// Lower-case hex of n bytes, and back (surrounding white space ignored;
// false when malformed).
std::string to_hex(const uint8_t* p, size_t n);
bool decode_hex(std::string_view h, std::vector<uint8_t>* out);

// Cryptographically random bytes; throws InternalError when the generator fails.
void random_bytes(void* out, size_t n);
Nonce fresh_nonce();

// HMAC-SHA256 of `data` under the secret (exposed for tests).
Mac hmac(const Secret& key, const void* data, size_t n);
// Constant-time equality of two byte ranges of length n.
bool equal(const void* a, const void* b, size_t n);

// Which kind of connection a proof is for: a proof made for one kind is
// worthless on another.
enum class Link : uint8_t { kTcp = 1, kShm = 2, kStore = 3, kArena = 4 };
// Which end made the proof: the connecting or the accepting one. A proof is
// never valid for the other role, so an answer cannot be reflected back.
enum class Role : uint8_t { kConnector = 1, kAcceptor = 2 };

// What a proof is about. Both ends build it from what they know themselves
// and from what the other end said; any difference makes the proof fail.
struct Transcript {
  Link link = Link::kTcp;
  uint64_t job = 0;   // the communicator's unique id (0 for the store)
  uint32_t from = 0;  // the connecting rank (0 for the store)
  uint32_t to = 0;    // the accepting rank (0 for the store)
  uint32_t size = 0;  // the world size (0 for the store)
  Nonce connector{};  // the connecting end's fresh nonce
  Nonce acceptor{};   // the accepting end's (all zero in a proof made before it is known)
};

Mac prove(const Secret& key, Role role, const Transcript& t);
// Constant time in the content of `mac`. False when the key is empty.
bool verify(const Secret& key, Role role, const Transcript& t, const uint8_t* mac);

// ---- Handing the secret to another node (shoalrun without --secret-file).
// The receiving launcher makes a Recipient and publishes its public key; the
// launcher that made the secret seals it to that key with a fresh key pair
// of its own (X25519), binding `context`; only the Recipient can open it,
// and any change to the sealed text makes open() throw.
class Recipient {
 public:
  Recipient();  // a fresh X25519 key pair
  ~Recipient();
  Recipient(const Recipient&) = delete;
  Recipient& operator=(const Recipient&) = delete;

  std::string public_hex() const;
  // Throws InvalidArgument when `sealed` is malformed or fails its check.
  Secret open(std::string_view sealed_hex, std::string_view context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws InvalidArgument when `recipient_public_hex` is not an X25519 key.
std::string seal(const Secret& secret, std::string_view recipient_public_hex, std::string_view context);

}  // namespace shoal::auth
