// core/json_text.h — the little JSON the observability files write: quoted
// strings. (Readers use nlohmann-json; writers stay dependency-free.)
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace shoal::core {

// `s` as a JSON string literal, quotes included.
inline std::string json_quote(std::string_view s) {
  std::string o;
  o.reserve(s.size() + 2);
  o += '"';
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          o += buf;
        } else {
          o += c;
        }
    }
  }
  o += '"';
  return o;
}

}  // namespace shoal::core
