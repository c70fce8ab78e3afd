// rendezvous/tcp_store_server.h — the TcpStore server: one epoll thread.
//
// Owns a listening socket, an epoll instance, an eventfd to wake the thread,
// and every client connection. All store state (the key-value map, parked
// GET/WAIT requests, per-connection buffers) is touched only by the thread, so
// it needs no lock. Non-blocking throughout: a slow or vanished client never
// stalls the others. Protocol: store_protocol.h. A connection is served only
// once its handshake is done (the job's secret proved both ways when the
// server has one); one that fails it, or does not finish it within
// TcpStoreOptions::handshake_timeout, is closed and logged on stderr with
// its address.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/net.h"
#include "rendezvous/store_protocol.h"

namespace shoal::detail {

class StoreServer {
 public:
  // Listens on host:port ("" = every interface; port 0 = ephemeral) and starts
  // the thread. Throws the net errors if the address cannot be bound.
  // `secret`: the job's, which every client must prove (empty: none).
  StoreServer(const std::string& host, uint16_t port, const auth::Secret& secret,
              std::chrono::milliseconds handshake_timeout);
  // Stops the thread and closes every socket; clients see their connection
  // close. Never throws.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  enum class Parked : uint8_t { kNone, kGet, kWait, kMultiGet };
  struct Conn {
    net::Fd fd;
    std::string from;  // the client's address, for messages
    store_proto::ServerHandshake hs{nullptr};
    Bytes in;             // in[in_pos, in_len) is received, not yet parsed
    size_t in_pos = 0;
    size_t in_len = 0;
    Bytes out;            // out[out_pos, size) is waiting to be sent, then
    size_t out_pos = 0;   // value[value_pos, size): a GET reply's payload,
    std::shared_ptr<const Bytes> value;  // shared with data_, not copied
    size_t value_pos = 0;
    bool sending() const { return out_pos < out.size() || value != nullptr; }
    bool want_out = false;  // EPOLLOUT registered
    Parked parked = Parked::kNone;
    std::string get_key;               // kGet: the key to answer with
    std::vector<std::string> get_keys;  // kMultiGet: the keys to answer with, in order
    std::vector<std::string> waiting;  // keys this connection is registered under
    size_t missing = 0;                // registered keys not yet set
  };
  enum class ReadResult { kOk, kEof, kDrop };

  void run() noexcept;
  void accept_all();
  void on_event(uint64_t id, uint32_t events);
  ReadResult read_some(Conn& c);
  bool flush(uint64_t id, Conn& c);
  void pump(uint64_t id);
  bool shake(uint64_t id, Conn& c);
  void reject(const Conn& c, const std::string& why);
  int expire_handshakes();  // returns the epoll timeout until the next deadline
  bool handle(uint64_t id, Conn& c, const store_proto::Request& req);
  std::vector<std::string> missing(const std::vector<std::string_view>& keys) const;
  void park(uint64_t id, Conn& c, Parked kind, std::vector<std::string> missing_keys);
  bool multi_get(uint64_t id, Conn& c);
  void notify(const std::string& key);
  void reply_value(Conn& c, std::shared_ptr<const Bytes> v);
  void close_conn(uint64_t id);
  Conn* find(uint64_t id);

  net::Fd listen_;
  net::Fd epoll_;
  net::Fd wake_;  // eventfd: written by the destructor to stop the thread
  uint16_t port_ = 0;
  auth::Secret secret_;
  std::chrono::milliseconds handshake_timeout_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Owned by the thread.
  bool listen_paused_ = false;  // out of descriptors: listener off until a connection closes
  uint64_t next_id_ = 16;  // ids below are reserved for the listener and the eventfd
  std::unordered_map<uint64_t, Conn> conns_;
  // Values are immutable once stored; a SET replaces the pointer, so replies
  // still being sent keep the old value alive.
  std::unordered_map<std::string, std::shared_ptr<const Bytes>> data_;
  std::unordered_map<std::string, std::unordered_set<uint64_t>> waiters_;  // key -> parked conns
  std::vector<uint64_t> to_pump_;  // connections woken by notify(), parsed after the current event
  // Connections mid-handshake, by deadline (accept order); stale entries are skipped.
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> handshakes_;
};

}  // namespace shoal::detail
