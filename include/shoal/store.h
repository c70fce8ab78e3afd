// shoal/store.h — the rendezvous key-value store.
//
// A Store is how ranks find each other: they publish their addresses and wait
// for the others'. Implementations must be safe to call from several threads at
// once. Values are opaque byte strings.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shoal {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Blocks until `key` exists or the store's timeout passes (TimeoutError).
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 if absent) and
  // returns the new value. The value is stored as decimal text, so get() of
  // that key returns e.g. "42".
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Blocks until every key exists; TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool remove(const std::string& key) = 0;
  // The values of `keys`, in their order; blocks until every key exists or
  // the store's timeout passes (TimeoutError), as c10d's multiGet. One
  // request to a TcpStore, where reading n keys one get() at a time costs n
  // round trips; the default calls get() for each key.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys);
  // Atomically: when `key` holds `expected` (or is absent and `expected` is
  // empty), stores `desired`. Returns what `key` holds afterwards (`desired`
  // when the swap happened, else the value that stayed; empty when the key
  // is absent and `expected` was not empty), as c10d's compareSet. The
  // agreement on who survives a fault (Communicator::agree) needs it; a
  // store without it throws InvalidArgument (the default).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired);

  virtual std::chrono::milliseconds timeout() const = 0;
  virtual void set_timeout(std::chrono::milliseconds t) = 0;

  // Convenience for text values.
  void set_str(const std::string& key, const std::string& v) { set(key, Bytes(v.begin(), v.end())); }
  std::string get_str(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // 0: the server picks a free port (see TcpStore::port())
  bool is_server = false;         // true: this process hosts the store
  int expected_clients = -1;      // informational; -1 when unknown
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // How long a client keeps retrying to connect to a server that is not up yet.
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(10)};
  // The job's secret in hex (docs/security.md); empty: SHOAL_SECRET when set,
  // else none. With one, the server accepts only clients that prove it, and
  // a client only a server that proves it.
  std::string secret;
  // How long the handshake may take: the server drops a connection that has
  // not finished it by then (a silent stranger), and a client gives up on a
  // server that has not answered. Tests set it short.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
};

// A store served over TCP. The server (is_server) runs an epoll thread owned by
// this object and is itself also a client of its own store.
//
// Thread-safe, but calls on one TcpStore object are serialised over its one
// connection: a get()/wait() blocked on a missing key holds the object, so that
// key must be set through another TcpStore (another process or object).
// Errors: TimeoutError when a call runs past its timeout (the object stays
// usable; it reconnects on the next call); StoreError naming host:port when the
// connection to the server is lost (final: every later call fails the same
// way) or the server reports an error (e.g. ADD on a non-integer value);
// InvalidArgument for a key over 4 KiB or a value over 64 MiB. A timeout of 0
// or less times out at once. The constructor connects, retrying until
// connect_timeout. The destructor stops the server (clients blocked on it get
// StoreError) and never throws. A forked child must make its own TcpStore; it
// may destroy its copy of the parent's (the parent's server keeps running).
class TcpStore : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& opts);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds t) override;

  uint16_t port() const;  // the port actually bound (server) or connected to
  const std::string& host() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Namespaces every key of `base` under "<prefix>/". Shares `base`.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  std::chrono::milliseconds timeout() const override;
  void set_timeout(std::chrono::milliseconds t) override;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace shoal
