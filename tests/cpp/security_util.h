// security_util.h — what the security tests share (test_security.cc,
// test_handshake.cc): two secrets, the short stranger timeout, and a wait
// for a socket's other end to close.
#pragma once

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <string>

#include "harness.h"

namespace shoal::test_security {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kKeyA[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
constexpr char kKeyB[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
// The handshake and hello timeouts of the stores and transports made here:
// short, so that a silent stranger is dropped within the test (10 s by default).
constexpr auto kStrangerTimeout = std::chrono::milliseconds(1000);

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Sets SHOAL_SECRET for the lifetime of the object (this process and what it forks).
class ScopedSecret {
 public:
  explicit ScopedSecret(const char* hex) { setenv("SHOAL_SECRET", hex, 1); }
  ~ScopedSecret() { unsetenv("SHOAL_SECRET"); }
};

// True once `fd` reads EOF or a reset (the other end closed it); false if it
// is still open at the deadline. Data that arrives first is discarded.
inline bool closed_by_peer(int fd, Clock::time_point deadline, const std::function<void()>& drive = nullptr) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int ms = drive ? 20 : static_cast<int>(std::max<int64_t>(
                              0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    if (::poll(&p, 1, ms) > 0) {
      char buf[256];
      ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      continue;
    }
    if (Clock::now() >= deadline) return false;
    if (drive) drive();
  }
}

}  // namespace shoal::test_security
