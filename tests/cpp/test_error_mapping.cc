// The table of how framework adapters report an ErrorCode (shoal/error_mapping.h,
// src/common/error_mapping.cc): an entry for every code, the categories the
// torch and TensorFlow adapters map, and the text error_message() appends.
#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <string>

#include "shoal/error_mapping.h"

namespace shoal {
namespace {

constexpr int kCodes = static_cast<int>(ErrorCode::kInternal) + 1;

TEST(ErrorMapping, EveryCodeHasItsOwnEntry) {
  std::set<std::string> names;
  for (int i = 0; i < kCodes; ++i) {
    const auto code = static_cast<ErrorCode>(i);
    const ErrorMapping& m = error_mapping(code);
    EXPECT_EQ(m.code, code) << error_code_name(code);
    ASSERT_NE(m.phrase, nullptr) << error_code_name(code);
    names.insert(error_code_name(code));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kCodes));  // the codes themselves are distinct
}

// What the adapters turn them into: the torch adapter raises RuntimeError for
// kInvalidArgument and DistBackendError for the rest; the TensorFlow adapter
// uses the status code of the same name (python/shoal/tensorflow/csrc/adapter.cc).
TEST(ErrorMapping, CategoriesAreWhatTheAdaptersExpect) {
  EXPECT_EQ(error_mapping(ErrorCode::kInvalidArgument).category, ErrorCategory::kInvalidArgument);
  EXPECT_EQ(error_mapping(ErrorCode::kTimeout).category, ErrorCategory::kDeadlineExceeded);
  EXPECT_EQ(error_mapping(ErrorCode::kPeerLost).category, ErrorCategory::kUnavailable);
  EXPECT_EQ(error_mapping(ErrorCode::kMismatch).category, ErrorCategory::kFailedPrecondition);
  EXPECT_EQ(error_mapping(ErrorCode::kAborted).category, ErrorCategory::kAborted);
  EXPECT_EQ(error_mapping(ErrorCode::kStore).category, ErrorCategory::kUnavailable);
  EXPECT_EQ(error_mapping(ErrorCode::kInternal).category, ErrorCategory::kInternal);
}

// Only bad input is the caller's fault: it alone may be raised as an argument error.
TEST(ErrorMapping, OnlyInvalidArgumentIsTheCallersFault) {
  for (int i = 0; i < kCodes; ++i) {
    const auto code = static_cast<ErrorCode>(i);
    EXPECT_EQ(error_mapping(code).category == ErrorCategory::kInvalidArgument, code == ErrorCode::kInvalidArgument)
        << error_code_name(code);
  }
}

TEST(ErrorMapping, CodeOutsideTheEnumIsInternal) {
  // As AbortRecord::decode can produce from a corrupt or newer record.
  const ErrorMapping& m = error_mapping(static_cast<ErrorCode>(kCodes + 5));
  EXPECT_EQ(m.code, ErrorCode::kInternal);
  EXPECT_EQ(m.category, ErrorCategory::kInternal);
  EXPECT_EQ(&error_mapping(static_cast<ErrorCode>(-1)), &error_mapping(ErrorCode::kInternal));
}

TEST(ErrorMapping, CategoryNamesAreDistinct) {
  const ErrorCategory all[] = {ErrorCategory::kInvalidArgument, ErrorCategory::kDeadlineExceeded,
                               ErrorCategory::kUnavailable,     ErrorCategory::kFailedPrecondition,
                               ErrorCategory::kAborted,         ErrorCategory::kInternal};
  std::set<std::string> names;
  for (ErrorCategory c : all) names.insert(error_category_name(c));
  EXPECT_EQ(names.size(), std::size(all));
  EXPECT_STREQ(error_category_name(ErrorCategory::kDeadlineExceeded), "deadline exceeded");
}

// The phrases torch's tooling looks for (docs/errors.md), exactly.
TEST(ErrorMessage, TimeoutCarriesTorchsPhrase) {
  EXPECT_EQ(error_message(TimeoutError("shoal rank 0: allreduce seq 2: timed out"), "torch"),
            "shoal rank 0: allreduce seq 2: timed out; torch: collective operation timeout (Timed out waiting for "
            "the peers)");
}

TEST(ErrorMessage, LostPeerNamesTheRankWhenKnown) {
  EXPECT_EQ(error_message(PeerLost("shoal rank 1: peer lost", 3), "torch"),
            "shoal rank 1: peer lost; torch: connection closed by peer rank 3");
  EXPECT_EQ(error_message(PeerLost("shoal rank 1: store host lost", -1), "torch"),
            "shoal rank 1: store host lost; torch: connection closed by peer");
}

TEST(ErrorMessage, WithoutALabelThePhraseStandsAlone) {
  EXPECT_EQ(error_message(PeerLost("x", 0)), "x; connection closed by peer rank 0");
  EXPECT_EQ(error_message(TimeoutError("x")), "x; collective operation timeout (Timed out waiting for the peers)");
}

TEST(ErrorMessage, CodesWithoutAPhraseKeepTheMessage) {
  EXPECT_EQ(error_message(InvalidArgument("bad root"), "torch"), "bad root");
  EXPECT_EQ(error_message(Mismatch("dtypes differ"), "torch"), "dtypes differ");
  EXPECT_EQ(error_message(Aborted("aborted"), "torch"), "aborted");
  EXPECT_EQ(error_message(StoreError("store gone"), "torch"), "store gone");
  EXPECT_EQ(error_message(InternalError("bug"), "torch"), "bug");
}

// An Error made with kPeerLost but not a PeerLost carries no rank (and is not read as one).
TEST(ErrorMessage, PlainErrorWithPeerLostCodeHasNoRank) {
  EXPECT_EQ(error_message(Error(ErrorCode::kPeerLost, "x")), "x; connection closed by peer");
}

}  // namespace
}  // namespace shoal
