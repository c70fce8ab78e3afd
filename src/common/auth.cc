// common/auth.cc — see auth.h. Every primitive is libcrypto's.
#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <cctype>
#include <cstring>
#include <vector>

#include "common/env.h"
#include "shoal/error.h"

namespace shoal::auth {
namespace {

constexpr char kProofLabel[] = "shoal-auth-1";
constexpr char kSealLabel[] = "shoal-seal-1";
constexpr size_t kX25519Bytes = 32;
constexpr size_t kIvBytes = 12;
constexpr size_t kTagBytes = 16;

void put_le(std::vector<uint8_t>* b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

[[noreturn]] void crypto_failed(const char* what) {
  throw InternalError(std::string("libcrypto: ") + what + " failed");
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

Pkey x25519_generate() {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* k = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0 || EVP_PKEY_keygen(ctx.get(), &k) <= 0) {
    crypto_failed("X25519 key generation");
  }
  return Pkey(k);
}

std::array<uint8_t, kX25519Bytes> x25519_public(EVP_PKEY* k) {
  std::array<uint8_t, kX25519Bytes> pub{};
  size_t n = pub.size();
  if (EVP_PKEY_get_raw_public_key(k, pub.data(), &n) <= 0 || n != pub.size()) crypto_failed("X25519 public key");
  return pub;
}

// HKDF-SHA256 over the X25519 shared secret of `mine` and `theirs`, bound to
// both public keys and the context: the AES-256-GCM key of one sealing.
std::array<uint8_t, 32> seal_key(EVP_PKEY* mine, const uint8_t* theirs_pub, const uint8_t* ephemeral_pub,
                                 const uint8_t* recipient_pub, std::string_view context) {
  Pkey theirs(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, theirs_pub, kX25519Bytes));
  if (!theirs) throw InvalidArgument("not an X25519 public key");
  PkeyCtx dctx(EVP_PKEY_CTX_new(mine, nullptr));
  uint8_t shared[kX25519Bytes];
  size_t n = sizeof(shared);
  if (!dctx || EVP_PKEY_derive_init(dctx.get()) <= 0 || EVP_PKEY_derive_set_peer(dctx.get(), theirs.get()) <= 0 ||
      EVP_PKEY_derive(dctx.get(), shared, &n) <= 0 || n != sizeof(shared)) {
    throw InvalidArgument("X25519 key agreement failed (a degenerate public key?)");
  }
  // One buffer of its final size, filled in place (growing it by inserts
  // draws a false -Warray-bounds from GCC 12).
  const size_t label = sizeof(kSealLabel) - 1;
  std::vector<uint8_t> info(label + 2 * kX25519Bytes + context.size());
  std::memcpy(info.data(), kSealLabel, label);
  std::memcpy(info.data() + label, ephemeral_pub, kX25519Bytes);
  std::memcpy(info.data() + label + kX25519Bytes, recipient_pub, kX25519Bytes);
  if (!context.empty()) std::memcpy(info.data() + label + 2 * kX25519Bytes, context.data(), context.size());
  std::array<uint8_t, 32> key{};
  size_t klen = key.size();
  PkeyCtx kctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  if (!kctx || EVP_PKEY_derive_init(kctx.get()) <= 0 || EVP_PKEY_CTX_set_hkdf_md(kctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(kctx.get(), shared, static_cast<int>(sizeof(shared))) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(kctx.get(), info.data(), static_cast<int>(info.size())) <= 0 ||
      EVP_PKEY_derive(kctx.get(), key.data(), &klen) <= 0) {
    OPENSSL_cleanse(shared, sizeof(shared));
    crypto_failed("HKDF");
  }
  OPENSSL_cleanse(shared, sizeof(shared));
  return key;
}

}  // namespace

std::string to_hex(const uint8_t* p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

bool decode_hex(std::string_view h, std::vector<uint8_t>* out) {
  while (!h.empty() && std::isspace(static_cast<unsigned char>(h.front()))) h.remove_prefix(1);
  while (!h.empty() && std::isspace(static_cast<unsigned char>(h.back()))) h.remove_suffix(1);
  if (h.size() % 2 != 0) return false;
  out->resize(h.size() / 2);
  for (size_t i = 0; i < out->size(); ++i) {
    int hi = hex_value(h[2 * i]), lo = hex_value(h[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}


// ---- the secret ----------------------------------------------------------

Secret Secret::random() {
  Secret s;
  random_bytes(s.key_.data(), kSecretBytes);
  s.size_ = kSecretBytes;
  return s;
}

Secret Secret::from_hex(std::string_view hex, const std::string& what) {
  std::vector<uint8_t> b;
  if (!decode_hex(hex, &b)) {
    throw InvalidArgument(what + ": not a hex string (make one with: openssl rand -hex 32)");
  }
  if (b.size() < kMinSecretBytes || b.size() > kMaxSecretBytes) {
    throw InvalidArgument(what + ": " + std::to_string(b.size()) + " bytes; a secret has " +
                          std::to_string(kMinSecretBytes) + " to " + std::to_string(kMaxSecretBytes) +
                          " bytes (" + std::to_string(2 * kMinSecretBytes) + " to " +
                          std::to_string(2 * kMaxSecretBytes) + " hex digits; make one with: openssl rand -hex 32)");
  }
  Secret s;
  std::memcpy(s.key_.data(), b.data(), b.size());
  s.size_ = b.size();
  OPENSSL_cleanse(b.data(), b.size());
  return s;
}

Secret Secret::from_env() {
  auto v = env::get("SHOAL_SECRET");
  if (!v) return Secret();
  return from_hex(*v, "SHOAL_SECRET");
}

std::string Secret::hex() const { return to_hex(key_.data(), size_); }

// ---- primitives ----------------------------------------------------------

void random_bytes(void* out, size_t n) {
  if (n > 0 && RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1) crypto_failed("RAND_bytes");
}

Nonce fresh_nonce() {
  Nonce n;
  random_bytes(n.data(), n.size());
  return n;
}

Mac hmac(const Secret& key, const void* data, size_t n) {
  Mac m{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), static_cast<const unsigned char*>(data), n,
           m.data(), &len) == nullptr ||
      len != m.size()) {
    crypto_failed("HMAC-SHA256");
  }
  return m;
}

bool equal(const void* a, const void* b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

// ---- proofs --------------------------------------------------------------

Mac prove(const Secret& key, Role role, const Transcript& t) {
  std::vector<uint8_t> b(kProofLabel, kProofLabel + sizeof(kProofLabel) - 1);
  b.push_back(static_cast<uint8_t>(t.link));
  b.push_back(static_cast<uint8_t>(role));
  put_le(&b, t.job, 8);
  put_le(&b, t.from, 4);
  put_le(&b, t.to, 4);
  put_le(&b, t.size, 4);
  b.insert(b.end(), t.connector.begin(), t.connector.end());
  b.insert(b.end(), t.acceptor.begin(), t.acceptor.end());
  return hmac(key, b.data(), b.size());
}

bool verify(const Secret& key, Role role, const Transcript& t, const uint8_t* mac) {
  if (key.empty()) return false;
  Mac want = prove(key, role, t);
  return equal(want.data(), mac, want.size());
}

// ---- sealing the secret to another launcher -------------------------------

struct Recipient::Impl {
  Pkey key;
  std::array<uint8_t, kX25519Bytes> pub{};
};

Recipient::Recipient() : impl_(std::make_unique<Impl>()) {
  impl_->key = x25519_generate();
  impl_->pub = x25519_public(impl_->key.get());
}

Recipient::~Recipient() = default;

std::string Recipient::public_hex() const { return to_hex(impl_->pub.data(), impl_->pub.size()); }

std::string seal(const Secret& secret, std::string_view recipient_public_hex, std::string_view context) {
  std::vector<uint8_t> rpub;
  if (!decode_hex(recipient_public_hex, &rpub) || rpub.size() != kX25519Bytes) {
    throw InvalidArgument("not an X25519 public key: '" + std::string(recipient_public_hex.substr(0, 80)) + "'");
  }
  Pkey eph = x25519_generate();
  auto epub = x25519_public(eph.get());
  auto key = seal_key(eph.get(), rpub.data(), epub.data(), rpub.data(), context);
  uint8_t iv[kIvBytes];
  random_bytes(iv, sizeof(iv));
  std::vector<uint8_t> out(epub.begin(), epub.end());
  out.insert(out.end(), iv, iv + sizeof(iv));
  size_t at = out.size();
  out.resize(at + secret.size() + kTagBytes);
  CipherCtx c(EVP_CIPHER_CTX_new());
  int n = 0, m = 0;
  if (!c || EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, key.data(), iv) != 1 ||
      EVP_EncryptUpdate(c.get(), nullptr, &n, rpub.data(), static_cast<int>(rpub.size())) != 1 ||
      EVP_EncryptUpdate(c.get(), out.data() + at, &n, secret.data(), static_cast<int>(secret.size())) != 1 ||
      EVP_EncryptFinal_ex(c.get(), out.data() + at + n, &m) != 1 ||
      EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes),
                          out.data() + at + secret.size()) != 1) {
    OPENSSL_cleanse(key.data(), key.size());
    crypto_failed("AES-256-GCM encryption");
  }
  OPENSSL_cleanse(key.data(), key.size());
  return to_hex(out.data(), out.size());
}

Secret Recipient::open(std::string_view sealed_hex, std::string_view context) const {
  std::vector<uint8_t> in;
  if (!decode_hex(sealed_hex, &in) || in.size() < kX25519Bytes + kIvBytes + kMinSecretBytes + kTagBytes ||
      in.size() > kX25519Bytes + kIvBytes + kMaxSecretBytes + kTagBytes) {
    throw InvalidArgument("the sealed secret is malformed");
  }
  const uint8_t* epub = in.data();
  const uint8_t* iv = epub + kX25519Bytes;
  const uint8_t* ct = iv + kIvBytes;
  const size_t ct_len = in.size() - kX25519Bytes - kIvBytes - kTagBytes;
  uint8_t tag[kTagBytes];
  std::memcpy(tag, ct + ct_len, kTagBytes);
  auto key = seal_key(impl_->key.get(), epub, epub, impl_->pub.data(), context);
  std::vector<uint8_t> plain(ct_len);
  CipherCtx c(EVP_CIPHER_CTX_new());
  int n = 0, m = 0;
  bool ok = c && EVP_DecryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr, key.data(), iv) == 1 &&
            EVP_DecryptUpdate(c.get(), nullptr, &n, impl_->pub.data(), static_cast<int>(impl_->pub.size())) == 1 &&
            EVP_DecryptUpdate(c.get(), plain.data(), &n, ct, static_cast<int>(ct_len)) == 1 &&
            EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes), tag) == 1 &&
            EVP_DecryptFinal_ex(c.get(), plain.data() + n, &m) == 1;
  OPENSSL_cleanse(key.data(), key.size());
  if (!ok) {
    OPENSSL_cleanse(plain.data(), plain.size());
    throw InvalidArgument("the sealed secret fails its check (sealed for another key or context, or altered)");
  }
  Secret s = Secret::from_hex(to_hex(plain.data(), plain.size()), "the sealed secret");
  OPENSSL_cleanse(plain.data(), plain.size());
  return s;
}

}  // namespace shoal::auth
