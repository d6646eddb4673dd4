// The RANKSCOPE_* variables (lib/core/config/settings_table.hpp) against the docs and
// the sources: each is documented with its default, each refused value is an
// init() error naming the variable, and nothing reads a variable the table
// does not list.
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "rankscope/rankscope.hpp"
#include "settings_table.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using detail::kEnvSpecs;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
const std::string kRoot = RANKSCOPE_SOURCE_DIR;

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The table row of docs/configuration.md that names `name` (a backquoted
// name, not a prefix of a longer one), or "".
std::string doc_row(const std::string& doc, const std::string& name) {
  std::istringstream in(doc);
  const std::regex named("`" + name + "([^A-Z0-9_]|$)");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("|", 0) == 0 && std::regex_search(line, named)) return line;
  }
  return "";
}

// The last cell of a markdown table row.
std::string last_cell(const std::string& row) {
  const auto end = row.find_last_of('|');
  const auto begin = row.find_last_of('|', end - 1);
  return trim(row.substr(begin + 1, end - begin - 1));
}

template <typename Fn>
void for_each_source(Fn fn) {
  for (const char* dir : {"lib", "include", "bindings"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(kRoot + "/" + dir)) {
      const auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp" || ext == ".h" || ext == ".py")) {
        fn(std::filesystem::relative(e.path(), kRoot).string(), slurp(e.path().string()));
      }
    }
  }
}
}  // namespace

TEST_CASE("settings: every variable is in docs/configuration.md with its default", "[settings]") {
  const std::string doc = slurp(kRoot + "/docs/configuration.md");
  REQUIRE_FALSE(doc.empty());
  for (const auto& s : kEnvSpecs) {
    INFO(s.name);
    const std::string row = doc_row(doc, std::string(s.name));
    REQUIRE_FALSE(row.empty());
    if (!s.documented_default.empty()) CHECK_THAT(last_cell(row), Catch::StartsWith(std::string(s.documented_default)));
  }
}

TEST_CASE("settings: the sources read no RANKSCOPE_ variable the table lacks, and only through it", "[settings]") {
  std::set<std::string> known;
  for (const auto& s : kEnvSpecs) known.emplace(s.name);
  // Build options and macros share the prefix; they are not environment variables.
  const std::regex variable(R"(["'](RANKSCOPE_[A-Z0-9_]+)["'])");
  const std::regex not_env("RANKSCOPE_(WITH|HAVE|BUILD|SANITIZE|VERSION|SCHEMA|SOURCE|FAKE|REPORT|CHARTJS)(_.*)?");
  int files = 0;
  std::set<std::string> seen;
  for_each_source([&](const std::string& path, const std::string& text) {
    ++files;
    for (std::sregex_iterator it(text.begin(), text.end(), variable), end; it != end; ++it) {
      const std::string name = (*it)[1];
      if (std::regex_match(name, not_env)) continue;
      seen.insert(name);
      INFO(path << " reads " << name);
      CHECK(known.count(name) == 1);
    }
    if (path.rfind("lib/", 0) == 0 && path != "lib/core/config/settings_table.cpp") {
      INFO(path);
      CHECK(text.find("getenv(\"RANKSCOPE_") == std::string::npos);  // through env_raw(), so the table stays whole
    }
  });
  CHECK(files > 100);
  CHECK(seen.size() >= 25);  // the scan finds the variables at all
}

TEST_CASE("settings: each refused value fails init() with an error naming the variable", "[settings]") {
  for (const auto& s : kEnvSpecs) {
    if (s.refused.empty()) continue;
    const std::string name(s.name), value(s.refused);
    INFO(name << "=" << value);
    TempDir tmp;
    ScopedEnv bad(name.c_str(), value.c_str());
    Config cfg;
    cfg.run_dir = tmp.path;
    const absl::Status st = init(cfg);
    if (st.ok()) shutdown();
    CHECK_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains(name));
  }
}
