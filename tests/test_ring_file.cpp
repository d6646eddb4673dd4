// The rings in shared memory (lib/core/persist/ring_file.hpp): what a SIGKILLed
// process recorded but had not yet written reaches its run log, a forked
// child cannot write into its parent's rings, a clean exit leaves no file,
// and an unusable RANKSCOPE_SHM_DIR says so and loses nothing else.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rankscope/rankscope.hpp"
#include "on_threads.hpp"
#include "ring_file.hpp"
#include "registry.hpp"
#include "ring_file_layout.hpp"
#include "run_log.hpp"
#include "rank_config.hpp"
#include "runtime_impl.hpp"
#include "summary.hpp"
#include "signal_helper_process.hpp"
#include "temp_dir.hpp"

namespace {
using namespace rankscope::test;  // the helpers of tests/*.hpp
namespace detail = rankscope::detail;
using LineKind = rankscope::schema::Kind;


// This test's own RANKSCOPE_SHM_DIR, for its helper and itself: no other
// process of the host (tests running beside it) recovers its helper's rings first.
struct OwnShmDir {
  std::string path;
  explicit OwnShmDir(const TempDir& tmp) : path(tmp.path + "/shm") {
    ::mkdir(path.c_str(), 0700);
    ::setenv("RANKSCOPE_SHM_DIR", path.c_str(), 1);
  }
  ~OwnShmDir() { ::unsetenv("RANKSCOPE_SHM_DIR"); }
};
bool ring_file_of(pid_t pid) {
  DIR* d = ::opendir(detail::ring_file_dir().c_str());
  if (d == nullptr) return false;
  bool found = false;
  const std::string prefix = std::to_string(pid) + "-";
  for (dirent* e; (e = ::readdir(d)) != nullptr;) found |= std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
  ::closedir(d);
  return found;
}
// Ring blocks this process's ring file has handed out so far.
std::uint32_t blocks_made() {
  const int fd = ::open(detail::ring_file_path().c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  void* m = ::mmap(nullptr, detail::kRingHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  const std::uint32_t made = static_cast<const detail::RingFileHeader*>(m)->blocks_made.load();
  ::munmap(m, detail::kRingHeaderBytes);
  ::close(fd);
  return made;
}
}  // namespace

TEST_CASE("a SIGKILLed rank's last records are recovered from its rings into its run log", "[ring_file][signals]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  SignalHelper h = spawn_signal_helper(tmp.path, "steps", shm.path.c_str());
  REQUIRE(h.pid > 0);
  const std::int64_t truth = park_steps_then_sigkill(h);
  (void)read_to_end(h.err);
  REQUIRE(ring_file_of(h.pid));  // what its rings held is still there
  auto before = rankscope::reader::summarize_run(tmp.path);
  REQUIRE(before.ok());
  INFO("truth " << truth << ", run log before recovery " << before->ranks.at(0).last_step);

  const auto got = detail::recover_orphaned_rings(tmp.path);
  REQUIRE(got.size() == 1);
  CHECK(got[0].rank == 5);
  CHECK(got[0].pid == h.pid);
  CHECK(got[0].records > 0);
  CHECK_FALSE(ring_file_of(h.pid));  // recovered once, then removed
  CHECK(detail::recover_orphaned_rings(tmp.path).empty());

  auto sum = rankscope::reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  const auto& r = sum->ranks.at(0);
  INFO("run log after recovery " << r.last_step << ", recovered " << r.recovered);
  CHECK(r.last_step >= truth - 1);  // the last step it finished: the one before it was killed in (or that one)
  CHECK(r.recovered == got[0].records);
  CHECK(r.unrecovered == 0);
  CHECK(r.bad_lines == 0);
  // The recovered lines read as the drained ones did: every step's forward phase, in order, and
  // every step end with its counts (the helper's step() loop: the next step begins at each end).
  std::int64_t last_forward = -1, step_ends = 0, last_begun = -1, bad_counts = 0, with_dur = 0;
  std::int64_t all_reduces = 0, waits = 0, wait_phases = 0;
  bool in_order = true;
  std::string disorder;
  auto read = rankscope::reader::read_run_log(tmp.path + "/rank-5.jsonl", [&](const rankscope::reader::LogEvent& e) {
    if (const auto* c = e.get<LineKind::kCollective>()) {  // recovered with its wait, as drained ones are
      ++all_reduces;
      waits += c->wait_phase == "ddp_all_reduce_wait" && c->wait > 0 && c->wait <= c->dur;
    }
    const auto* phase = e.get<LineKind::kPhase>();
    wait_phases += phase != nullptr && phase->name == "ddp_all_reduce_wait" && phase->depth == 1;
    if (phase != nullptr && phase->name == "forward") {
      if (in_order && e.step != last_forward + 1) {
        disorder = "forward of step " + std::to_string(e.step) + " after step " + std::to_string(last_forward) +
                   "'s, line " + std::to_string(e.line_no);
      }
      in_order &= e.step == last_forward + 1;
      last_forward = e.step;
    }
    if (const auto* end = e.get<LineKind::kStepEnd>()) {
      ++step_ends;
      with_dur += end->dur > 0;
      bad_counts += end->samples != 8 || end->tokens != (e.step % 3 == 0 ? 5'000'000'000 + e.step : e.step) ||
                    end->next_step != e.step + 1;
      if (end->next_step) last_begun = std::max(last_begun, *end->next_step);
    }
    CHECK(e.k != LineKind::kStepBegin);  // step 0 began with the process (step() does not begin it again)
  });
  REQUIRE(read.ok());
  CHECK(last_begun == truth);  // exact: the step it was killed in
  CHECK(bad_counts == 0);
  CHECK(all_reduces >= truth);
  CHECK(waits == all_reduces);
  CHECK(wait_phases == all_reduces);  // the reader's nested phase for each
  // All but step 0 (its beginning nobody marked) and the first recovered one (its
  // beginning was in the lines drained before the kill; the recovery reads the rings only).
  CHECK(with_dur >= step_ends - 2);
  INFO(disorder);
  CHECK(in_order);
  CHECK(last_forward >= truth - 1);  // the last one may still have been open
  CHECK(step_ends >= truth);
}

namespace {
// A run log holding `text`, and a ready commit naming `piece` written where the file ended at `from`.
struct PieceCase {
  TempDir tmp;
  std::string path = tmp.path + "/rank-0.jsonl";
  detail::RingCommit commit{};
  PieceCase(const std::string& text, std::int64_t from, const std::string& piece) {
    std::ofstream(path, std::ios::binary) << text;
    detail::describe_piece(commit, from, piece.data(), piece.size());
    commit.state.store(detail::kCommitReady);
  }
  bool landed() const { return detail::run_log_piece_landed(commit, path); }
};
std::string log_line(int step, const char* ts) {
  return std::string(R"({"ts":")") + ts + R"(","kind":"phase","step":)" + std::to_string(step) +
         R"J(,"name":"forward","src":"train.cpp:41 void loop()"})J" + "\n";
}
}  // namespace

// What a recoverer decides from a dead process's commit: a piece counts as
// written only when the whole of it is in the file where its length puts its end.
TEST_CASE("a run-log piece is found in the file by its head and tail and length", "[ring_file]") {
  const std::string before = log_line(1, "2026-11-29T20:00:00.000001Z");
  const std::string piece = log_line(2, "2026-11-29T20:00:00.000002Z") + log_line(3, "2026-11-29T20:00:00.000003Z");
  const auto from = static_cast<std::int64_t>(before.size());
  SECTION("written") { CHECK(PieceCase(before + piece, from, piece).landed()); }
  SECTION("written after an inline error line") {
    CHECK(PieceCase(before + R"({"kind":"log","level":"error"})" "\n" + piece, from, piece).landed());
  }
  SECTION("shorter than the bytes a commit keeps") {
    const std::string tiny = "{\"kind\":\"x\"}\n";
    CHECK(PieceCase(before + tiny, from, tiny).landed());
  }
  SECTION("not written, though the file's last line ends as the piece's does (the same source location)") {
    const std::string other = log_line(3, "2026-11-29T20:00:00.000009Z");  // the piece's last line, another time
    CHECK_FALSE(PieceCase(before + other, from, piece).landed());
    CHECK_FALSE(PieceCase(before + other + other + other, from, piece).landed());
  }
  SECTION("cut short by the kill") {
    CHECK_FALSE(PieceCase(before + piece.substr(0, piece.size() - 10), from, piece).landed());
  }
  SECTION("written before where the file ended") { CHECK_FALSE(PieceCase(piece + before, from, piece).landed()); }
  SECTION("not ready") {
    PieceCase c(before + piece, from, piece);
    c.commit.state.store(detail::kCommitPreparing);
    CHECK_FALSE(c.landed());
  }
}

// A SIGKILL can land after a run-log write(2) and before the rings learn its
// lines are in the file, or between the two pieces of one write: a recovery
// that started where the rings said then appended those lines again (seen
// in CI: the forward phases of steps 871-1253 twice). The helper kills itself
// exactly there, so this is the same on every machine.
TEST_CASE("a rank SIGKILLed in the middle of a run-log write has each line once after recovery", "[ring_file][signals]") {
  for (const char* mode : {"killed_between_pieces", "killed_after_write"}) {
    INFO(mode);
    TempDir tmp;
    OwnShmDir shm(tmp);
    SignalHelper h = spawn_signal_helper(tmp.path, mode, shm.path.c_str());
    REQUIRE(h.pid > 0);
    (void)read_to_end(h.out);  // until it dies
    h.out = -1;
    int status = 0;
    ::waitpid(h.pid, &status, 0);
    INFO(read_to_end(h.err));
    REQUIRE(WIFSIGNALED(status));
    REQUIRE(WTERMSIG(status) == SIGKILL);
    std::int64_t lines_before = 0;
    REQUIRE(rankscope::reader::read_run_log(tmp.path + "/rank-5.jsonl", [&](const rankscope::reader::LogEvent&) {
      ++lines_before;
    }).ok());
    // The killed write's first piece at least: a line ends in the second half of its 256 KiB.
    CHECK(std::filesystem::file_size(tmp.path + "/rank-5.jsonl") >= (128u << 10));
    const auto got = detail::recover_orphaned_rings(tmp.path);
    REQUIRE(got.size() == 1);
    CHECK(got[0].records > 0);
    // Every step's forward phase and step end exactly once, in order, from step 0 on.
    std::int64_t last_forward = -1, last_end = -1, lines_after = 0;
    std::string disorder;
    REQUIRE(rankscope::reader::read_run_log(tmp.path + "/rank-5.jsonl", [&](const rankscope::reader::LogEvent& e) {
      ++lines_after;
      const auto* phase = e.get<LineKind::kPhase>();
      if (phase != nullptr && phase->name == "forward") {
        if (disorder.empty() && e.step != last_forward + 1) {
          disorder = "forward of step " + std::to_string(e.step) + " after step " + std::to_string(last_forward) + "'s";
        }
        last_forward = e.step;
      }
      if (e.get<LineKind::kStepEnd>() != nullptr) {
        if (disorder.empty() && e.step != last_end + 1) {
          disorder = "end of step " + std::to_string(e.step) + " after step " + std::to_string(last_end) + "'s";
        }
        last_end = e.step;
      }
    }).ok());
    INFO("lines before recovery " << lines_before << ", after " << lines_after << ", last forward " << last_forward);
    CHECK(disorder.empty());
    CHECK(lines_after > lines_before);
    CHECK(last_forward >= last_end);
  }
}

// A terminating signal ends the run log's writes (its handler cannot format
// lines); the background thread's write under way then stops between pieces
// and its later drains write nothing. The rings must not be marked written past
// those lines: the recoverer (the launcher's, a peer's) brings them back.
TEST_CASE("the lines a terminating signal kept out of the run log are recovered from the rings", "[ring_file][signals]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  SignalHelper h = spawn_signal_helper(tmp.path, "writes_ended_mid_write", shm.path.c_str());
  REQUIRE(h.pid > 0);
  const std::string out = read_to_end(h.out);
  h.out = -1;
  int status = 0;
  ::waitpid(h.pid, &status, 0);
  INFO(out << read_to_end(h.err) << " exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  long long truth = -1;
  REQUIRE(std::sscanf(out.c_str(), "killed after step %lld", &truth) == 1);
  const auto got = detail::recover_orphaned_rings(tmp.path);
  REQUIRE(got.size() == 1);
  std::int64_t last_forward = -1, last_end = -1;
  std::string disorder;
  REQUIRE(rankscope::reader::read_run_log(tmp.path + "/rank-5.jsonl", [&](const rankscope::reader::LogEvent& e) {
    const auto* phase = e.get<LineKind::kPhase>();
    if (phase != nullptr && phase->name == "forward") {
      if (disorder.empty() && e.step != last_forward + 1) {
        disorder = "forward of step " + std::to_string(e.step) + " after step " + std::to_string(last_forward) + "'s";
      }
      last_forward = e.step;
    }
    if (e.get<LineKind::kStepEnd>() != nullptr) last_end = e.step;
  }).ok());
  CHECK(disorder.empty());
  CHECK(last_forward == truth);
  CHECK(last_end == truth);
}

TEST_CASE("a reader waits for another process recovering a dead rank's rings instead of reading without them",
          "[ring_file][signals]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  SignalHelper h = spawn_signal_helper(tmp.path, "steps", shm.path.c_str());
  REQUIRE(h.pid > 0);
  (void)park_steps_then_sigkill(h);
  (void)read_to_end(h.err);
  // Another recoverer (a peer's background thread) holds the dead file's lock
  // until the reader waits for it.
  std::string file;
  DIR* d = ::opendir(detail::ring_file_dir().c_str());
  REQUIRE(d != nullptr);
  for (dirent* e; (e = ::readdir(d)) != nullptr;) {
    if (std::strstr(e->d_name, ".rings") != nullptr) file = detail::ring_file_dir() + "/" + e->d_name;
  }
  ::closedir(d);
  REQUIRE_FALSE(file.empty());
  const int other = ::open(file.c_str(), O_RDWR);
  REQUIRE(::flock(other, LOCK_EX | LOCK_NB) == 0);
  const pid_t reader = static_cast<pid_t>(::syscall(SYS_gettid));
  std::thread release([other, reader] {
    // Released once the reader sleeps between its tries for the lock (the
    // kernel names the system call it is in): it did wait, whatever the
    // machine's speed. 60 s is a hang guard.
    const std::string syscall_file = "/proc/self/task/" + std::to_string(reader) + "/syscall";
    const std::string nanosleep = std::to_string(SYS_nanosleep) + " ", clock_nanosleep = std::to_string(SYS_clock_nanosleep) + " ";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      const std::string now = rankscope::test::slurp(syscall_file);
      if (now.rfind(nanosleep, 0) == 0 || now.rfind(clock_nanosleep, 0) == 0) break;
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::close(other);  // it gave up without recovering: the reader does it
  });
  const auto got = detail::recover_orphaned_rings(tmp.path);
  release.join();
  REQUIRE(got.size() == 1);
  CHECK(got[0].records > 0);
}

TEST_CASE("a SIGKILLed rank inside a collective - the recovered lines name its communicator", "[ring_file][signals]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  SignalHelper h = spawn_signal_helper(tmp.path, "blocked_in_collective", shm.path.c_str());
  REQUIRE(h.pid > 0);
  char buf[64];
  REQUIRE(::read(h.out, buf, sizeof(buf)) > 0);  // "blocked": ten all-reduces done, inside the all-gather
  ::kill(h.pid, SIGKILL);
  ::waitpid(h.pid, nullptr, 0);
  ::close(h.out);
  (void)read_to_end(h.err);
  REQUIRE(detail::recover_orphaned_rings(tmp.path).size() == 1);
  int all_reduces = 0;
  std::int64_t last_begun = -1;
  auto read = rankscope::reader::read_run_log(tmp.path + "/rank-5.jsonl", [&](const rankscope::reader::LogEvent& e) {
    if (const auto* c = e.get<LineKind::kCollective>()) all_reduces += c->op == "all_reduce" && c->comm == "world" && c->seq >= 1 && c->seq <= 10;
    if (e.k == LineKind::kStepBegin) last_begun = std::max(last_begun, e.step);
  });
  REQUIRE(read.ok());
  CHECK(all_reduces == 10);  // each once: from the log or from the rings, never both
  CHECK(last_begun == 10);   // the step it was killed in, inside the all-gather
  auto sum = rankscope::reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  CHECK(sum->ranks.at(0).last_step == 9);
}

TEST_CASE("a ring file another build wrote is left alone - never taken for empty and removed", "[ring_file]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  REQUIRE(::mkdir(detail::ring_file_dir().c_str(), 0700) == 0);
  const std::string path = detail::ring_file_dir() + "/1-1.rings";
  {  // an older layout: the right magic, another version, recording, pointing into this run
    std::vector<char> bytes(detail::kRingHeaderBytes, '\0');
    auto& h = *reinterpret_cast<detail::RingFileHeader*>(bytes.data());
    std::memcpy(h.magic, detail::kRingFileMagic, sizeof(h.magic));
    h.layout = detail::ring_layout();
    h.layout.version = 1;
    h.pid = 1;
    h.recording.store(1);
    const std::string log = tmp.path + "/rank-0.jsonl";
    std::memcpy(h.run_log, log.data(), log.size());
    std::FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
    std::fclose(std::fopen(log.c_str(), "w"));
  }
  CHECK(detail::recover_orphaned_rings(tmp.path).empty());
  CHECK(::access(path.c_str(), F_OK) == 0);  // still there, for a reader of its own build
}

TEST_CASE("a clean exit leaves no ring file", "[ring_file][signals]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  SignalHelper h = spawn_signal_helper(tmp.path, "usr1", shm.path.c_str());  // records, dumps, shuts down, exits 0
  REQUIRE(h.pid > 0);
  (void)read_to_end(h.out);
  (void)read_to_end(h.err);
  int status = 0;
  ::waitpid(h.pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(ring_file_of(h.pid));
  CHECK(detail::recover_orphaned_rings(tmp.path).empty());
}

TEST_CASE("an unusable RANKSCOPE_SHM_DIR is said once and the run log is written as before", "[ring_file][signals]") {
  TempDir tmp;
  const std::string not_a_dir = tmp.path + "/a-file";
  { std::FILE* f = std::fopen(not_a_dir.c_str(), "w"); REQUIRE(f != nullptr); std::fclose(f); }
  SignalHelper h = spawn_signal_helper(tmp.path, "steps", not_a_dir.c_str());
  REQUIRE(h.pid > 0);
  const std::int64_t truth = park_steps_then_sigkill(h);
  const std::string err = read_to_end(h.err);
  CHECK_THAT(err, Catch::Contains("cannot use the directory") && Catch::Contains("RANKSCOPE_SHM_DIR"));
  auto sum = rankscope::reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  CHECK(sum->ranks.at(0).last_step > 0);
  CHECK(sum->ranks.at(0).last_step <= truth);  // the position file still has the exact step
  CHECK(sum->ranks.at(0).position->step_begun == truth);
}

TEST_CASE("a forked child gets private copies of its parent's rings", "[ring_file][fork]") {
  TempDir tmp;
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(rankscope::init(cfg).ok());
  constexpr std::size_t kBytes = detail::kRingStateBytes + 64 * 64;  // a ring of 64 records
  constexpr std::size_t kRecord = detail::kRingStateBytes / 8 + 8;    // the second record's first word
  auto* block = static_cast<std::uint64_t*>(detail::ring_file_alloc(kBytes));
  REQUIRE(block != nullptr);  // this host has a /dev/shm
  block[0] = 1;        // the ThreadState page
  block[kRecord] = 2;  // a record
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const bool kept = block[0] == 1;  // the child still reads what was there (its thread's state)
    block[0] = 99;
    block[kRecord] = 99;
    ::_exit(kept ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(block[0] == 1);  // the parent's pages are untouched
  CHECK(block[kRecord] == 2);
  CHECK(detail::ring_file_release(block));
  rankscope::shutdown();
}

TEST_CASE("a ring block given back is handed out again with its pages - its state page reads as not made yet",
          "[ring_file]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(rankscope::init(cfg).ok());
  constexpr std::size_t kBytes = detail::kRingStateBytes + 64 * 64;
  auto* a = static_cast<std::uint64_t*>(detail::ring_file_alloc(kBytes));
  auto* b = static_cast<std::uint64_t*>(detail::ring_file_alloc(kBytes));
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  a[0] = 7;                                  // a ThreadState's first word (its records' mask, ...)
  a[detail::kRingStateBytes / 8] = 42;       // a record
  CHECK(detail::ring_file_release(a));
  auto* again = static_cast<std::uint64_t*>(detail::ring_file_alloc(kBytes));
  CHECK(again == a);
  CHECK(again[0] == 0);  // a rank killed before its new ThreadState is made recovers nothing stale
  CHECK(again[detail::kRingStateBytes / 8] == 42);  // its pages were kept, not freed and made again
  CHECK(detail::ring_file_release(again));
  CHECK(detail::ring_file_release(b));
  rankscope::shutdown();
}

TEST_CASE("threads that come and go every epoch reuse the rings of those that left - no new ring each",
          "[ring_file]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  cfg.drain_interval = std::chrono::milliseconds(1000);  // the longest: a dozen threads come and go in between
  REQUIRE(rankscope::init(cfg).ok());
  { RANKSCOPE_PHASE("main_thread"); }
  for (int epoch = 0; epoch < 12; ++epoch) {
    std::thread([] { RANKSCOPE_PHASE("loader_produce"); }).join();
    // In a trainer its exit wakes the background thread (or its next drain
    // comes): here flush() is that drain, which recycles the ring before the
    // next epoch's thread starts, however late the wake-up would have come.
    REQUIRE(rankscope::flush());
    CHECK_FALSE(detail::registry().has_retired());
  }
  const std::uint32_t made = blocks_made();
  rankscope::shutdown();
  CHECK(made >= 2);
  // The live threads' (this one's and the runtime's own), a loader's, one
  // awaiting its drain and up to four spares grown when a loader left with
  // none ready: at most 10 (15 without recycling).
  CHECK(made <= 10);
}

TEST_CASE("spare rings grown by the background thread serve new threads without a new block", "[ring_file]") {
  TempDir tmp;
  OwnShmDir shm(tmp);
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(rankscope::init(cfg).ok());
  { RANKSCOPE_PHASE("main_thread"); }
  REQUIRE(rankscope::flush());
  auto& reg = detail::registry();
  const std::size_t before = reg.spares();
  for (int i = 0; i < 6; ++i) reg.grow_spares(detail::Runtime::get().ring_capacity());
  // Bounded by kSpareRings (a thread of the runtime's own may take or give back one meanwhile).
  CHECK(reg.spares() <= 4);
  CHECK(reg.spares() >= 3);
  const std::uint32_t made = blocks_made();
  CHECK(made >= 4 - before);
  // Takes a spare: no new block. (Asked of the thread itself: the block count also moves when the
  // background thread grows a spare again, or when a thread of the runtime's own starts.)
  bool was_spare = false;
  std::thread([&] {
    RANKSCOPE_PHASE("loader_produce");
    was_spare = detail::ThreadRegistry::own_ring_was_spare();
  }).join();
  CHECK(was_spare);
  // Spares of another ring size (an earlier session's) no thread could take: given back.
  reg.grow_spares(detail::Runtime::get().ring_capacity() / 2);
  CHECK(reg.spares() <= 2);  // the one grown, and at most one of the runtime's own threads' rings
  REQUIRE(rankscope::flush());
  rankscope::shutdown();
  CHECK(rankscope::test::slurp(tmp.path + "/rank-0.jsonl").find(R"("name":"loader_produce")") != std::string::npos);
}

// Docker's default /dev/shm, 64 MiB and shared with the trainer's DataLoader workers, mounted in
// `tmp` for one test (root only: as another user the test says it was skipped; the Python
// tests/python/test_shm.py covers the same ground without root, in a user namespace).
struct SmallTmpfs {
  explicit SmallTmpfs(const TempDir& tmp) : path(tmp.path + "/shm") {
    if (::geteuid() != 0) {
      WARN("skipped: needs root to mount a small tmpfs");
      return;
    }
    REQUIRE(::mkdir(path.c_str(), 0700) == 0);
    REQUIRE(std::system(("mount -t tmpfs -o size=64m tmpfs " + path).c_str()) == 0);
    mounted = true;
  }
  ~SmallTmpfs() {
    if (mounted) (void)std::system(("umount -l " + path).c_str());  // lazily: this process still maps its ring file
    ::unsetenv("RANKSCOPE_SHM_DIR");
  }
  // `mib` MiB in `file` below the mount: what others took of it.
  void fill(const std::string& file, int mib) const {
    std::ofstream f(path + "/" + file, std::ios::binary);
    const std::string one(1 << 20, 'x');
    for (int i = 0; i < mib; ++i) f << one;
  }
  // One rank recording into `run_dir`, its rings in this tmpfs.
  rankscope::Config start_rank(const std::string& run_dir) const {
    ::setenv("RANKSCOPE_SHM_DIR", path.c_str(), 1);
    const rankscope::Config cfg = rankscope::test::rank_config(run_dir);
    REQUIRE(rankscope::init(cfg).ok());
    return cfg;
  }
  std::string path;
  bool mounted = false;
};

TEST_CASE("rings take at most a quarter of a small tmpfs / the run records on in private memory", "[ring_file]") {
  TempDir tmp;
  SmallTmpfs shm(tmp);
  if (!shm.mounted) return;
  const std::string& mnt = shm.path;
  const std::string ours = mnt + "/rankscope-" + std::to_string(::getuid());
  REQUIRE(::mkdir(ours.c_str(), 0700) == 0);
  shm.fill("rankscope-" + std::to_string(::getuid()) + "/others.rings", 8);  // what the other ranks' rings took
  const rankscope::Config cfg = shm.start_rank(tmp.path + "/run");
  // Three recording threads, as a trainer with a loader and a pin-memory thread has: 4 MiB each.
  on_threads(3, [](int) {
    for (int i = 0; i < 100; ++i) {
      RANKSCOPE_PHASE("work");
    }
  });
  REQUIRE(rankscope::flush());
  struct statvfs v {};
  REQUIRE(::statvfs(mnt.c_str(), &v) == 0);
  const std::uint64_t total = static_cast<std::uint64_t>(v.f_blocks) * v.f_frsize;
  const std::uint64_t avail = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  CHECK(total - avail <= total / 4);      // the three quarters the trainer keeps
  CHECK(blocks_made() >= 1);              // rings did go there while there was room (8 + 0.3 + 4 < 16 MiB)
  CHECK(blocks_made() < 4);               // ... not all of them
  const auto st = rankscope::stats();
  rankscope::shutdown();
  ::unsetenv("RANKSCOPE_SHM_DIR");
  CHECK(st.events_dropped == 0);
  const std::string log = rankscope::test::slurp(cfg.run_dir.value() + "/rank-0.jsonl");
  std::size_t works = 0;
  for (std::size_t at = log.find(R"("name":"work")"); at != std::string::npos; at = log.find(R"("name":"work")", at + 1)) ++works;
  CHECK(works == 300);  // every thread recorded, in the tmpfs or in private memory
}

TEST_CASE("a tmpfs the trainer has nearly filled gets no ring / the run records in private memory", "[ring_file]") {
  TempDir tmp;
  SmallTmpfs shm(tmp);
  if (!shm.mounted) return;
  const std::string& mnt = shm.path;
  shm.fill("torch_shm_batches", 50);  // the DataLoader's
  const rankscope::Config cfg = shm.start_rank(tmp.path + "/run");
  { RANKSCOPE_PHASE("work"); }
  REQUIRE(rankscope::flush());
  struct statvfs v {};
  REQUIRE(::statvfs(mnt.c_str(), &v) == 0);
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  rankscope::shutdown();
  ::unsetenv("RANKSCOPE_SHM_DIR");
  CHECK(free_bytes >= (14u << 20) - (64u << 10));  // what the trainer left free stays free
  CHECK(rankscope::test::slurp(cfg.run_dir.value() + "/rank-0.jsonl").find(R"("name":"work")") != std::string::npos);
}

