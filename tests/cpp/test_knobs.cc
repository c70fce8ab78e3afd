// test_knobs.cc — one table of SHOAL_* knobs (common/env.cc): the code takes
// its defaults from it, docs/knobs.md shows exactly it, and every knob the
// sources read is in it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "shoal/error.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> listed() {
  int n = 0;
  const env::Knob* k = env::knobs(&n);
  std::set<std::string> names;
  for (int i = 0; i < n; ++i) names.insert(k[i].name);
  return names;
}

TEST(Knobs, DocsTableIsTheTable) {
  const std::string doc = read_file(fs::path(SHOAL_SOURCE_DIR) / "docs" / "knobs.md");
  const std::string begin = "<!-- knobs table: rendered from src/common/env.cc by `shoal-perf --knobs`; do not edit by hand -->\n";
  const std::string end = "<!-- end of knobs table -->";
  const auto b = doc.find(begin);
  const auto e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/knobs.md lacks the line: " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/knobs.md lacks the line: " << end;
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), env::markdown_table())
      << "docs/knobs.md's table differs from src/common/env.cc: replace it with `build/bin/shoal-perf --knobs`";
}

TEST(Knobs, UnsetKnobsHaveTheTablesDefault) {
  ::unsetenv("SHOAL_SEGMENT_BYTES");
  ::unsetenv("SHOAL_ALGO");
  EXPECT_EQ(env::get("SHOAL_SEGMENT_BYTES"), std::optional<std::string>("524288"));
  EXPECT_EQ(env::get_int("SHOAL_SEGMENT_BYTES"), std::optional<int64_t>(524288));
  EXPECT_FALSE(env::is_set("SHOAL_SEGMENT_BYTES"));
  EXPECT_EQ(env::get("SHOAL_ALGO"), std::nullopt);  // no default
  ::setenv("SHOAL_SEGMENT_BYTES", "4096", 1);
  EXPECT_EQ(env::get_int("SHOAL_SEGMENT_BYTES"), std::optional<int64_t>(4096));
  EXPECT_TRUE(env::is_set("SHOAL_SEGMENT_BYTES"));
  ::unsetenv("SHOAL_SEGMENT_BYTES");
  EXPECT_THROW(env::get("SHOAL_NOT_A_KNOB"), Error);
}

// Every SHOAL_ name the library, the tools, the torch extension, the Python
// packages and the wheel's build read from the environment is in the table
// (the names shoalrun sets for its workers are documented beside it, not
// read as knobs).
TEST(Knobs, EveryKnobTheSourcesReadIsListed) {
  const std::set<std::string> set_by_shoalrun = {"SHOAL_RESTART_COUNT", "SHOAL_ERROR_FILE"};
  const std::regex read(
      R"((getenv|env::get|env::get_int|env::is_set|environ\.get|environ\[|environ\.setdefault)\s*\(?\s*["'](SHOAL_[A-Z0-9_]+))");
  const std::set<std::string> names = listed();
  std::vector<fs::path> sources = {fs::path(SHOAL_SOURCE_DIR) / "setup.py"};
  for (const char* dir : {"src", "tools", "python"}) {
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(SHOAL_SOURCE_DIR) / dir)) {
      const auto ext = entry.path().extension();
      if (entry.is_regular_file() && (ext == ".cc" || ext == ".h" || ext == ".py")) sources.push_back(entry.path());
    }
  }
  int files = 0, reads = 0;
  for (const auto& path : sources) {
    ++files;
    const std::string text = read_file(path);
    for (std::sregex_iterator it(text.begin(), text.end(), read), end; it != end; ++it) {
      const std::string name = (*it)[2];
      ++reads;
      if (set_by_shoalrun.count(name)) continue;
      EXPECT_TRUE(names.count(name)) << path << " reads " << name << ", which src/common/env.cc does not list";
    }
  }
  EXPECT_GT(files, 100);
  EXPECT_GT(reads, 15);  // the pattern does find the reads
}

}  // namespace
}  // namespace shoal
