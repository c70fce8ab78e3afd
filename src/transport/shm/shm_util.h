// transport/shm/shm_util.h — small helpers shared by the shared-memory
// transport's files (shm_transport.cc, shm_connect.cc).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace shoal::transport::shm {

inline std::string errno_text(int e) { return std::string(strerror(e)); }

// The abstract-namespace address of a rank's socket (no file anywhere).
inline sockaddr_un abstract_address(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  size_t n = std::min(name.size(), sizeof(a.sun_path) - 2);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

}  // namespace shoal::transport::shm
