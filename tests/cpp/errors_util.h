// tests/cpp/errors_util.h — looking at the errors a test provokes: run a
// call and keep what it throws, then read its message and code.
#pragma once

#include <time.h>

#include <cstdint>
#include <exception>
#include <string>

#include "shoal/error.h"

namespace shoal::test {

inline int64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Runs `fn`, returning what it throws (or a null pointer).
template <typename F>
std::exception_ptr capture(F&& fn) {
  try {
    fn();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

inline std::string message(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

inline ErrorCode code(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.code();
  } catch (...) {
  }
  return ErrorCode::kInternal;
}

}  // namespace shoal::test
