// The run directory is the user's (lib/core/persist/run_dir.hpp): its modes, another
// user's directory refused, no file written through a planted symbolic link,
// a killed predecessor's temporaries removed.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "capture_sink.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/rankscope.hpp"
#include "run_dir.hpp"
#include "rank_config.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {

mode_t mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

struct ScopedUmask {
  explicit ScopedUmask(mode_t m) : old(::umask(m)) {}
  ~ScopedUmask() { ::umask(old); }
  mode_t old;
};

Config rank0_in(const std::string& dir) {
  Config c = rank_config(dir);
  c.context.run_id = "run-dir-test";
  return c;
}

constexpr uid_t kNobody = 65534;

// The name write_file_atomic writes to before it renames.
std::string temporary_of(const std::string& file) { return file + ".tmp." + std::to_string(::getpid()); }
// Giving a file to another user takes root: elsewhere a test says it was skipped, and why.
bool running_as_root(const char* to_do) {
  if (::geteuid() == 0) return true;
  WARN("skipped: needs root to " << to_do);
  return false;
}
}  // namespace

TEST_CASE("the run directory is made 0750 and its files 0640 / RANKSCOPE_DIR_MODE changes both", "[run_dir]") {
  ScopedUmask umask(022);
  TempDir tmp;
  {
    const std::string dir = tmp.path + "/runs/one";
    test::ScopedRuntime rt(rank0_in(dir));
    { RANKSCOPE_PHASE("x"); }
    REQUIRE(flush());
    CHECK(mode_of(tmp.path + "/runs") == 0750);  // parents made on the way too
    CHECK(mode_of(dir) == 0750);
    for (const char* f : {"/rank-0.jsonl", "/rank-0.position", "/run.json"}) CHECK(mode_of(dir + f) == 0640);
  }
  {
    ScopedEnv mode("RANKSCOPE_DIR_MODE", "700");
    const std::string dir = tmp.path + "/private";
    test::ScopedRuntime rt(rank0_in(dir));
    REQUIRE(flush());
    CHECK(mode_of(dir) == 0700);
    CHECK(mode_of(dir + "/rank-0.jsonl") == 0600);
  }
  for (const char* bad : {"640", "8", "abc", "1777"}) {
    ScopedEnv mode("RANKSCOPE_DIR_MODE", bad);
    const absl::Status st = init(rank0_in(tmp.path + "/bad"));
    shutdown();
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("RANKSCOPE_DIR_MODE='" + std::string(bad) + "'"));
  }
}

TEST_CASE("a run directory another user owns is refused unless RANKSCOPE_SHARED_DIR=1", "[run_dir]") {
  if (!running_as_root("give a directory to another user")) return;
  TempDir tmp;
  const std::string dir = tmp.path + "/theirs";
  REQUIRE(::mkdir(dir.c_str(), 0777) == 0);
  REQUIRE(::chown(dir.c_str(), kNobody, kNobody) == 0);
  const absl::Status st = init(rank0_in(dir));
  shutdown();
  REQUIRE_FALSE(st.ok());
  const std::string msg(st.message());
  CHECK_THAT(msg, Catch::Contains("belongs to") && Catch::Contains("(uid 65534)") &&
                      Catch::Contains("RANKSCOPE_SHARED_DIR=1"));
  CHECK_FALSE(std::filesystem::exists(dir + "/rank-0.jsonl"));  // nothing written there
  ScopedEnv shared("RANKSCOPE_SHARED_DIR", "1");
  test::ScopedRuntime rt(rank0_in(dir));
  REQUIRE(flush());
  CHECK(std::filesystem::exists(dir + "/rank-0.jsonl"));
}

// Another local user who can write the run directory (a shared one) plants a link to one of
// your files under a name rankscope writes: a symbolic link, or a hard link (a second name of
// the same file). And a FIFO under such a name would block an open for writing until read.
TEST_CASE("planted links are not written through / the victim's files stay as they were", "[run_dir]") {
  const auto [plant, refusal] = GENERATE(table<int (*)(const char*, const char*), const char*>({
      {::symlink, "symbolic link"},
      {::link, "no hard link"},
  }));
  INFO(refusal);
  TempDir tmp;
  const std::string dir = tmp.path + "/run", victim = tmp.path + "/victim";
  REQUIRE(::mkdir(dir.c_str(), 0750) == 0);
  {
    std::ofstream(victim) << "precious\n";
  }
  SECTION("the run log: init fails and says why") {
    REQUIRE(plant(victim.c_str(), (dir + "/rank-0.jsonl").c_str()) == 0);
    const absl::Status st = init(rank0_in(dir));
    shutdown();
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("rank-0.jsonl") && Catch::Contains(refusal));
  }
  SECTION("the position file: neither truncated nor mapped, the run goes on") {
    REQUIRE(plant(victim.c_str(), (dir + "/rank-0.position").c_str()) == 0);
    test::ScopedRuntime rt(rank0_in(dir));
    { RANKSCOPE_PHASE("x"); }
    REQUIRE(flush());
  }
  SECTION("a temporary of a durable file or of a spare (rewritten every second): ours, the link left alone") {
    for (const bool durable : {true, false}) {
      const std::string file = dir + (durable ? "/run.json" : "/rank-0.heartbeat.json");
      REQUIRE(plant(victim.c_str(), temporary_of(file).c_str()) == 0);
      REQUIRE(write_file_atomic(file, "{}\n", durable).ok());
      CHECK(slurp(file) == "{}\n");
    }
  }
  CHECK(slurp(victim) == "precious\n");
}

TEST_CASE("a FIFO planted under a temporary's name is replaced / the write does not block", "[run_dir]") {
  TempDir tmp;
  const std::string hb = tmp.path + "/rank-0.heartbeat.json";
  REQUIRE(::mkfifo(temporary_of(hb).c_str(), 0600) == 0);
  REQUIRE(write_file_atomic(hb, "{}\n", /*durable=*/false).ok());  // before: blocked in open(2) for ever
  CHECK(slurp(hb) == "{}\n");
}

// The run directory renamed away and its path made a symbolic link to somewhere else while the
// rank runs: its files keep going to the directory that was checked, through its descriptor.
TEST_CASE("files go to the run directory that was checked / not to a link put at its path later", "[run_dir]") {
  TempDir tmp;
  const std::string dir = tmp.path + "/run", moved = tmp.path + "/run.moved", elsewhere = tmp.path + "/elsewhere";
  REQUIRE(::mkdir(elsewhere.c_str(), 0700) == 0);
  test::ScopedRuntime rt(rank0_in(dir));
  REQUIRE(::rename(dir.c_str(), moved.c_str()) == 0);
  REQUIRE(::symlink(elsewhere.c_str(), dir.c_str()) == 0);
  REQUIRE(write_file_atomic(dir + "/probe.json", "{}\n", /*durable=*/false).ok());  // as heartbeats are written
  REQUIRE(write_file_atomic(dir + "/run.json", "{\"a\":1}\n", /*durable=*/true).ok());
  CHECK(slurp(moved + "/probe.json") == "{}\n");
  CHECK(slurp(moved + "/run.json") == "{\"a\":1}\n");
  CHECK(std::filesystem::is_empty(elsewhere));
}

TEST_CASE("another user's file under a run-directory name is not written to", "[run_dir]") {
  if (!running_as_root("give a file to another user")) return;
  TempDir tmp;
  const std::string dir = tmp.path + "/run";
  REQUIRE(::mkdir(dir.c_str(), 0750) == 0);
  const std::string planted = dir + "/rank-0.jsonl";
  {
    std::ofstream(planted) << "theirs\n";
  }
  REQUIRE(::chown(planted.c_str(), kNobody, kNobody) == 0);
  const absl::Status st = init(rank0_in(dir));
  shutdown();
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("not a regular file of this user's"));
  CHECK(slurp(planted) == "theirs\n");
}

TEST_CASE("a killed predecessor's temporaries are removed at start / others' and our own are kept", "[run_dir]") {
  TempDir tmp;
  const std::string dir = tmp.path;
  const std::string self = std::to_string(::getpid());
  for (const std::string& f : std::vector<std::string>{"rank-0.heartbeat.json.tmp.123456", "rank-0.flight.json.tmp.777",
                                                       "run.json.tmp.42", "rank-1.heartbeat.json.tmp.123456",
                                                       "rank-0.heartbeat.json.tmp." + self, "rank-0.jsonl"}) {
    std::ofstream(dir + "/" + f) << "x";
  }
  CHECK(detail::remove_stale_temporaries(dir, 0) == 3);
  CHECK_FALSE(std::filesystem::exists(dir + "/rank-0.heartbeat.json.tmp.123456"));
  CHECK_FALSE(std::filesystem::exists(dir + "/rank-0.flight.json.tmp.777"));
  CHECK_FALSE(std::filesystem::exists(dir + "/run.json.tmp.42"));
  CHECK(std::filesystem::exists(dir + "/rank-1.heartbeat.json.tmp.123456"));  // another rank's
  CHECK(std::filesystem::exists(dir + "/rank-0.heartbeat.json.tmp." + self));  // this process's spare
  CHECK(std::filesystem::exists(dir + "/rank-0.jsonl"));
}
