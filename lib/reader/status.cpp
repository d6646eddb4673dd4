#include "status.hpp"

#include <sys/stat.h>

#include <time.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/strings/str_cat.h"
#include "json_util.hpp"
#include "process_identity.hpp"
#include "rankscope/exchange.hpp"
#include "run_log.hpp"
#include "schema.hpp"

namespace rankscope::reader {
namespace {

std::uint64_t wall_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}
double secs(std::uint64_t ns) { return static_cast<double>(ns) / 1e9; }
constexpr std::int64_t kMaxWorldSize = 1 << 20;
using schema::Field;

template <typename T>
T get(simdjson::dom::element e, Field key, T fallback) {
  T v;
  if (e[schema::field_name(key)].get(v) == simdjson::SUCCESS) return v;
  return fallback;
}

// The file's modification time (the writer's kernel clock, or the file server's): the
// liveness of a heartbeat whose own time cannot be trusted.
std::uint64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
}

// A heartbeat's time further ahead than this is a clock that runs ahead (or garbage), not skew.
constexpr std::uint64_t kClockAheadNs = 2'000'000'000ull;

// On the rank's own host and in its pid namespace (a container's pids are
// another's), the process itself says whether it is gone: no such pid, or a
// pid now held by a process that started at another time. Elsewhere only the
// heartbeat's age can tell (3 intervals).
bool process_gone(simdjson::dom::element doc, const RankHeartbeat& hb) {
  const std::uint64_t start = get<std::uint64_t>(doc, Field::kPidStart, 0);
  const std::string_view ns = get<std::string_view>(doc, Field::kPidNs, "");
  if (start == 0 || ns.empty() || hb.pid <= 0) return false;
  static const std::string own_ns = detail::pid_namespace("self");
  static const std::string own_host = [] {
    char buf[256] = {};
    return ::gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string();
  }();
  if (ns != own_ns || hb.host != own_host) return false;
  const auto now_start = detail::process_start_ticks(static_cast<long>(hb.pid));
  return !now_start || *now_start != start;
}

// False only when there is no file. A file that says nothing usable (not JSON, no liveness
// time) is present and `unreadable`: never taken for alive, nor for dead.
bool parse(const std::string& path, std::uint64_t now, RankHeartbeat& hb) {
  if (!is_regular_file(path)) return false;
  hb.present = true;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.load(path).get(doc) != simdjson::SUCCESS || !doc.is_object()) {
    hb.unreadable = "not a JSON object";
    hb.state = "unknown";
    return true;
  }
  hb.rank = static_cast<int>(get<std::int64_t>(doc, Field::kRank, -1));
  hb.state = std::string(get<std::string_view>(doc, Field::kState, "unknown"));
  // Bounds a writer keeps (settings.hpp: intervals of 10 ms and more); garbage is read as the defaults.
  hb.interval_ns = get<std::uint64_t>(doc, Field::kIntervalNs, 1'000'000'000);
  if (hb.interval_ns < 10'000'000ull || hb.interval_ns > 3'600'000'000'000ull) hb.interval_ns = 1'000'000'000;
  hb.stall_timeout_ns = get<std::uint64_t>(doc, Field::kStallTimeoutNs, 300'000'000'000ull);
  if (hb.stall_timeout_ns < hb.interval_ns || hb.stall_timeout_ns > 30 * 86'400'000'000'000ull) hb.stall_timeout_ns = 300'000'000'000ull;
  const std::uint64_t live = get<std::uint64_t>(doc, Field::kLivenessWallNs, 0);
  const std::uint64_t prog = get<std::uint64_t>(doc, Field::kProgressWallNs, 0);
  if (live == 0) {
    hb.unreadable = "no liveness time";
    return true;
  }
  if (live > now + kClockAheadNs) {
    // Dated in the future: its clock runs ahead. Fresh is what the file's own time says; progress
    // keeps its distance from liveness as the rank wrote them.
    hb.clock_ahead_ns = live - now;
    const std::uint64_t written = mtime_ns(path);
    hb.liveness_age_ns = now > written ? now - written : 0;
    hb.progress_age_ns = hb.liveness_age_ns + (live > prog ? live - prog : 0);
  } else {
    hb.liveness_age_ns = now > live ? now - live : 0;
    hb.progress_age_ns = now > prog ? now - prog : 0;
  }
  hb.step = get<std::int64_t>(doc, Field::kStep, 0);
  hb.pid = get<std::int64_t>(doc, Field::kPid, 0);
  hb.last_step_ns = get<std::uint64_t>(doc, Field::kLastStepNs, 0);
  hb.usual_step_ns = get<std::uint64_t>(doc, Field::kUsualStepNs, 0);
  hb.host = std::string(get<std::string_view>(doc, Field::kHost, ""));
  hb.inside = std::string(get<std::string_view>(doc, Field::kInside, ""));
  hb.exit_cause = std::string(get<std::string_view>(doc, Field::kExitCause, ""));
  hb.signal = std::string(get<std::string_view>(doc, Field::kSignal, ""));
  hb.exit_status = get<std::int64_t>(doc, Field::kExitStatus, 0);
  hb.alive = hb.state != "exited" && hb.state != "failed" && hb.liveness_age_ns < 3 * hb.interval_ns;
  if (hb.alive && process_gone(doc, hb)) {
    hb.alive = false;
    hb.process_gone = true;
  }
  simdjson::dom::array arr;
  if (doc[schema::field_name(Field::kOpenPhases)].get_array().get(arr) == simdjson::SUCCESS) {
    for (auto ph : arr) {
      hb.phases.push_back({std::string(get<std::string_view>(ph, Field::kName, "")),
                           std::string(get<std::string_view>(ph, Field::kPhaseKind, "")), get<std::int64_t>(ph, Field::kTid, 0),
                           get<std::uint64_t>(ph, Field::kAgeNs, 0)});
    }
  }
  if (doc[schema::field_name(Field::kInFlight)].get_array().get(arr) == simdjson::SUCCESS) {
    for (auto c : arr) {
      hb.in_flight.push_back({std::string(get<std::string_view>(c, Field::kOp, "")),
                              std::string(get<std::string_view>(c, Field::kComm, "")), get<std::uint64_t>(c, Field::kSeq, 0),
                              get<std::uint64_t>(c, Field::kAgeNs, 0), get<std::int64_t>(c, Field::kStep, -1),
                              get<bool>(c, Field::kOnDevice, false)});
    }
  }
  simdjson::dom::element log;
  if (doc[schema::field_name(Field::kRunLog)].get(log) == simdjson::SUCCESS) {
    hb.run_log_error = std::string(get<std::string_view>(log, Field::kError, "write error"));
    hb.run_log_since_step = get<std::int64_t>(log, Field::kSinceStep, -1);
    hb.run_log_lines_dropped = get<std::uint64_t>(log, Field::kLinesDropped, 0);
  }
  // The file's ages are as of its writing; the live ones grow since.
  return true;
}

std::string innermost(const RankHeartbeat& h) {
  if (h.phases.empty()) return "no open phase";
  const auto& p = h.phases.back();
  return fmt::format("{} ({:.1f} s)", p.name, secs(p.age_ns));
}

const RankHeartbeat& at(const StatusReport& r, int rank) { return r.ranks[static_cast<std::size_t>(rank)]; }

// A signal someone sends to stop a job, as opposed to a crash's.
bool is_stop_signal(std::string_view sig) { return sig == "SIGTERM" || sig == "SIGINT" || sig == "SIGHUP"; }

// Ranks whose last heartbeat says failed: how, the worst first (a crash, an
// exception, then a stop that someone sent).
std::string failed_verdict(const StatusReport& r, const std::vector<int>& failed) {
  std::vector<int> crashed, raised, exited, stopped;
  std::string crash_signal, stop_signal;
  for (int f : failed) {
    const auto& h = at(r, f);
    if (h.exit_cause == "exit_status") {
      exited.push_back(f);
    } else if (h.exit_cause != "signal") {
      raised.push_back(f);
    } else if (is_stop_signal(h.signal)) {
      stopped.push_back(f);
      if (stop_signal.empty()) stop_signal = h.signal;
    } else {
      crashed.push_back(f);
      if (crash_signal.empty()) crash_signal = h.signal;
    }
  }
  const auto ranks = [](const std::vector<int>& v) { return fmt::format("rank{} {}", v.size() > 1 ? "s" : "", join_ranks(v)); };
  if (!crashed.empty()) return fmt::format("{} died of {}: crash", ranks(crashed), crash_signal);
  if (!raised.empty()) return fmt::format("{} failed: uncaught exception", ranks(raised));
  if (!exited.empty()) return fmt::format("{} failed: a nonzero exit status", ranks(exited));
  if (stopped.size() == r.ranks.size()) {
    return fmt::format("stopped: all {} ranks by {} (the scheduler, the launcher or a person; not a crash)",
                       stopped.size(), stop_signal);
  }
  return fmt::format("{} stopped by {} (not a crash)", ranks(stopped), stop_signal);
}

// The ranks by what their heartbeats say, the worst state first.
struct RankStates {
  std::vector<int> dead, stalled, slow, exited, failed, missing, unreadable;
};

RankStates states_of(const StatusReport& r) {
  RankStates s;
  for (const auto& h : r.ranks) {
    if (!h.present) s.missing.push_back(h.rank);
    else if (!h.unreadable.empty()) s.unreadable.push_back(h.rank);
    else if (h.state == "exited") s.exited.push_back(h.rank);
    else if (h.state == "failed") s.failed.push_back(h.rank);
    else if (!h.alive) s.dead.push_back(h.rank);
    else if (h.stalled()) s.stalled.push_back(h.rank);
    else if (h.state == "slow") s.slow.push_back(h.rank);
  }
  return s;
}

void dead_findings(StatusReport& r, const RankStates& s) {
  for (int m : s.missing) r.findings.push_back(fmt::format("rank {}: no heartbeat file: never started, or no run log", m));
  for (int u : s.unreadable) {
    r.findings.push_back(fmt::format("rank {}: its heartbeat file is unreadable ({}): alive or not is unknown; its run "
                                     "log says what it did (rankscope triage)",
                                     u, at(r, u).unreadable));
  }
  for (const auto& h : r.ranks) {
    if (h.clock_ahead_ns == 0) continue;
    r.findings.push_back(fmt::format("rank {}: its heartbeat is dated {:.1f} s in the future (the clock of {} runs "
                                     "ahead): its ages are read from the file's modification time",
                                     h.rank, secs(h.clock_ahead_ns), h.host.empty() ? "its host" : h.host));
  }
  for (int f : s.failed) {
    const auto& h = at(r, f);
    if (h.exit_cause == "signal") {
      r.findings.push_back(is_stop_signal(h.signal)
                               ? fmt::format("rank {} was STOPPED by {} at step {} (pid {} on {}): sent by the scheduler "
                                             "(time limit, scancel, preemption), the launcher or a person, not a crash",
                                             f, h.signal, h.step, h.pid, h.host)
                               : fmt::format("rank {} DIED of {} at step {} (pid {} on {}): a crash; its stacks and "
                                             "flight dump say where (rankscope stacks, triage)",
                                             f, h.signal, h.step, h.pid, h.host));
      continue;
    }
    if (h.exit_cause == "exit_status") {
      r.findings.push_back(fmt::format("rank {} FAILED: it exited with status {} at step {} (pid {} on {}), no uncaught "
                                       "exception: the program ended itself (sys.exit, exit()); its own output says why",
                                       f, h.exit_status, h.step, h.pid, h.host));
      continue;
    }
    r.findings.push_back(fmt::format("rank {} FAILED: it exited after an uncaught {} at step {} (pid {} on {}); the "
                                     "exception and its traceback are its run log's exit line (rankscope triage)",
                                     f, h.exit_cause == "terminate" ? "C++ exception (std::terminate)" : "exception",
                                     h.step, h.pid, h.host));
  }
  for (int d : s.dead) {
    const auto& h = at(r, d);
    r.findings.push_back(fmt::format(
        "rank {} is NOT ALIVE: {} (pid {} on {}), at step {}, inside: {} -> crash, OOM kill "
        "or node failure; check the scheduler's log and dmesg on {}",
        d, h.process_gone ? fmt::format("its process is gone (last heartbeat {:.1f} s ago)", secs(h.liveness_age_ns))
                          : fmt::format("last heartbeat {:.1f} s ago", secs(h.liveness_age_ns)),
        h.pid, h.host, h.step, h.inside, h.host));
  }
}

// A stream-ordered collective the host left at once: the GPU is where it waits.
std::string on_device_words(const InFlight& f) {
  return f.on_device ? fmt::format(": on the GPU (enqueued in step {}; the host returned and waits for its GPU)", f.step)
                     : "";
}

// Who holds everyone up? A stalled rank outside any collective (blocked),
// while others wait in one, is the culprit; else the rank(s) behind on a sequence.
void stalled_findings(StatusReport& r, const std::vector<int>& blocked, const std::vector<int>& waiting) {
  for (int b : blocked) {
    const auto& h = at(r, b);
    r.findings.push_back(fmt::format("rank {} is alive with no progress for {:.1f} s, blocked in {} outside any "
                                     "collective (step {})",
                                     b, secs(h.progress_age_ns), innermost(h), h.step));
  }
  if (waiting.empty()) return;
  std::map<std::string, std::map<std::uint64_t, std::vector<int>>> by_comm;
  for (int w : waiting) {
    const auto& f = at(r, w).in_flight.front();
    by_comm[f.comm][f.seq].push_back(w);
  }
  for (const auto& [comm, seqs] : by_comm) {
    for (const auto& [seq, ranks] : seqs) {
      const auto& f = at(r, ranks.front()).in_flight.front();
      r.findings.push_back(fmt::format("rank{} {} wait{} in {} seq {} on '{}' ({:.1f} s){}", ranks.size() > 1 ? "s" : "",
                                       join_ranks(ranks), ranks.size() > 1 ? "" : "s", f.op, seq, comm,
                                       secs(f.age_ns), on_device_words(f)));
    }
    if (seqs.size() > 1 && blocked.empty()) {
      r.findings.push_back(fmt::format("ranks {} are behind on '{}': they did not reach seq {}",
                                       join_ranks(seqs.begin()->second), comm, seqs.rbegin()->first));
    }
  }
}

std::string hang_culprit(const StatusReport& r, const std::vector<int>& blocked, const std::vector<int>& waiting) {
  if (!blocked.empty()) {
    return fmt::format("rank {} is blocked in {}{}", join_ranks(blocked), innermost(at(r, blocked.front())),
                       waiting.empty() ? "" : fmt::format(" while rank{} {} wait in a collective",
                                                          waiting.size() > 1 ? "s" : "", join_ranks(waiting)));
  }
  if (waiting.empty()) return "";
  std::map<std::string, std::set<std::uint64_t>> seqs;
  for (int w : waiting) {
    const auto& f = at(r, w).in_flight.front();
    seqs[f.comm].insert(f.seq);
  }
  const auto& [comm, set] = *seqs.begin();
  if (set.size() == 1 && waiting.size() == r.ranks.size()) {
    return fmt::format("every rank is inside the same collective (seq {} on '{}') and none finishes: a "
                       "communication-level hang (network, NCCL, a dead peer)",
                       *set.begin(), comm);
  }
  std::vector<int> behind;
  for (int w : waiting) {
    if (at(r, w).in_flight.front().seq == *set.begin()) behind.push_back(w);
  }
  return fmt::format("rank{} {} {} behind on '{}' (seq {})", behind.size() > 1 ? "s" : "", join_ranks(behind),
                     behind.size() > 1 ? "are" : "is", comm, *set.begin());
}

std::string hang_verdict(StatusReport& r, const std::vector<int>& stalled) {
  std::vector<int> waiting, blocked;
  for (int s : stalled) (at(r, s).in_flight.empty() ? blocked : waiting).push_back(s);
  stalled_findings(r, blocked, waiting);
  return fmt::format("HANG: alive, no progress (deadlock or blocked I/O): {}", hang_culprit(r, blocked, waiting));
}

std::string slow_verdict(StatusReport& r, const std::vector<int>& slow) {
  for (int s : slow) {
    const auto& h = at(r, s);
    r.findings.push_back(fmt::format("rank {}: last step {:.1f} ms vs usual {:.1f} ms ({:.1f}x)", s,
                                     secs(h.last_step_ns) * 1e3, secs(h.usual_step_ns) * 1e3,
                                     h.usual_step_ns ? static_cast<double>(h.last_step_ns) / h.usual_step_ns : 0.0));
  }
  return fmt::format("SLOW, not a hang: progress is moving; rank{} {} slower than usual", slow.size() > 1 ? "s" : "",
                     join_ranks(slow));
}

// Run logs that stopped (a full disk): findings, and a note on the verdict.
std::vector<int> log_stop_findings(StatusReport& r) {
  std::vector<int> log_stopped;
  for (const auto& h : r.ranks) {
    if (h.run_log_error.empty()) continue;
    log_stopped.push_back(h.rank);
    r.findings.push_back(fmt::format("rank {}: run log stopped at step {}: {} ({} lines dropped so far); training goes on",
                                     h.rank, h.run_log_since_step, h.run_log_error, h.run_log_lines_dropped));
  }
  if (!log_stopped.empty()) {
    r.verdict += fmt::format("; run log of rank{} {} stopped: {}", log_stopped.size() > 1 ? "s" : "",
                             join_ranks(log_stopped), at(r, log_stopped.front()).run_log_error);
  }
  return log_stopped;
}

void classify(StatusReport& r) {
  const RankStates s = states_of(r);
  const int n = static_cast<int>(r.ranks.size());
  dead_findings(r, s);
  if (!s.stalled.empty()) {
    r.verdict = hang_verdict(r, s.stalled);
  } else if (!s.failed.empty()) {
    r.verdict = failed_verdict(r, s.failed);
  } else if (!s.dead.empty()) {
    r.verdict = fmt::format("rank{} {} not alive: crash, OOM or node issue", s.dead.size() > 1 ? "s" : "", join_ranks(s.dead));
  } else if (!s.slow.empty()) {
    r.verdict = slow_verdict(r, s.slow);
  } else if (!s.exited.empty() && s.exited.size() == r.ranks.size()) {
    r.verdict = fmt::format("finished: all {} ranks exited cleanly", n);
  } else {
    r.verdict = fmt::format("healthy: {} of {} ranks alive and making progress",
                            n - static_cast<int>(s.exited.size() + s.missing.size() + s.unreadable.size()), n);
    if (!s.unreadable.empty()) {
      r.verdict += fmt::format("; rank{} {} unknown (heartbeat unreadable)", s.unreadable.size() > 1 ? "s" : "",
                               join_ranks(s.unreadable));
    }
  }
  if (!s.dead.empty() && !s.stalled.empty()) {
    r.verdict += fmt::format(" (and rank{} {} not alive)", s.dead.size() > 1 ? "s" : "", join_ranks(s.dead));
  }
  const std::vector<int> log_stopped = log_stop_findings(r);
  r.exit_code =
      (s.dead.empty() && s.stalled.empty() && s.slow.empty() && s.missing.empty() && s.failed.empty() &&
       s.unreadable.empty() && log_stopped.empty())
          ? 0
          : 1;
}

}  // namespace

absl::StatusOr<StatusReport> read_status(const std::string& run_dir, std::uint64_t now) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return absl::NotFoundError(absl::StrCat("'", run_dir, "' is not a run directory"));
  if (now == 0) now = wall_now();
  StatusReport r;
  r.run_dir = run_dir;
  {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (is_regular_file(schema::run_json_path(run_dir)) && p.load(schema::run_json_path(run_dir)).get(doc) == simdjson::SUCCESS) {
      const std::int64_t w = get<std::int64_t>(doc, Field::kWorldSize, 0);
      r.world_size = w > 0 && w <= kMaxWorldSize ? static_cast<int>(w) : 0;  // else: not a world size
    }
  }
  std::map<int, RankHeartbeat> found;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto rank = schema::rank_of_heartbeat(name);
    if (!rank) continue;
    RankHeartbeat hb;
    if (parse(entry.path().string(), now, hb)) found[*rank] = hb;
  }
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat("no rank-<R>.heartbeat.json in '", run_dir, "' (is rankscope running there?)"));
  }
  const int world = std::max(r.world_size, found.rbegin()->first + 1);
  for (int k = 0; k < world; ++k) {
    RankHeartbeat hb;
    hb.rank = k;
    if (auto it = found.find(k); it != found.end()) {
      hb = it->second;
      hb.rank = k;  // the file name says which rank it is, whatever its content claims
    }
    r.ranks.push_back(hb);
  }
  classify(r);
  return r;
}

std::string format_status(const StatusReport& r) {
  std::string o = fmt::format("run {}  ranks {}\n", r.run_dir, r.ranks.size());
  o += fmt::format("{:>4}  {:<5}  {:>12}  {:>6}  {:<8}  {}\n", "rank", "alive", "progress age", "step", "state", "inside");
  for (const auto& h : r.ranks) {
    if (!h.present) {
      o += fmt::format("{:>4}  {:<5}  {:>12}  {:>6}  {:<8}  {}\n", h.rank, "?", "-", "-", "missing", "no heartbeat file");
      continue;
    }
    if (!h.unreadable.empty()) {
      o += fmt::format("{:>4}  {:<5}  {:>12}  {:>6}  {:<8}  {}\n", h.rank, "?", "-", "-", "unknown",
                       "heartbeat unreadable: " + h.unreadable);
      continue;
    }
    o += fmt::format("{:>4}  {:<5}  {:>12}  {:>6}  {:<8}  {}\n", h.rank,
                     h.state == "exited" || h.state == "failed" ? "-" : (h.alive ? "yes" : "NO"),
                     fmt::format("{:.1f} s", secs(h.progress_age_ns)), h.step,
                     h.alive || h.state == "exited" || h.state == "failed" ? h.state : "dead", h.inside);
  }
  o += "verdict: " + r.verdict + "\n";
  for (const auto& f : r.findings) o += "  - " + f + "\n";
  return o;
}

std::string format_status_json(const StatusReport& r) {
  detail::JsonWriter w;
  w.begin_object().field("schema", "rankscope.status/1").field("run_dir", r.run_dir);
  w.field("verdict", r.verdict).field("exit_code", r.exit_code);
  w.array("findings", r.findings).key("ranks").begin_array();
  for (const auto& h : r.ranks) {
    w.begin_object().field("rank", h.rank).field("present", h.present).field("alive", h.alive).field("process_gone", h.process_gone);
    w.field("stalled", h.stalled()).field("state", h.state).field("step", h.step);
    w.field("liveness_age_ns", h.liveness_age_ns).field("progress_age_ns", h.progress_age_ns).field("pid", h.pid);
    w.field("host", h.host).field("inside", h.inside);
    if (!h.unreadable.empty()) w.field("unreadable", h.unreadable);
    if (h.clock_ahead_ns != 0) w.field("clock_ahead_ns", h.clock_ahead_ns);
    if (!h.run_log_error.empty()) {
      w.key("run_log").begin_object().field("error", h.run_log_error).field("since_step", h.run_log_since_step);
      w.field("lines_dropped", h.run_log_lines_dropped).end_object();
    }
    w.end_object();
  }
  return w.end_array().end_object().take();
}

}  // namespace rankscope::reader
