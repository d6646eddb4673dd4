#include "summary.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "json_util.hpp"
#include "rankscope/exchange.hpp"
#include "step_breakdown.hpp"

namespace rankscope::reader {
namespace {

constexpr std::size_t kEvidenceChars = 400;

PhaseKind kind_from_name(std::string_view s) {
  for (int k = 0; k < kPhaseKindCount; ++k) {
    if (phase_kind_name(static_cast<PhaseKind>(k)) == s) return static_cast<PhaseKind>(k);
  }
  return PhaseKind::kOther;
}

template <typename T>
T median(std::vector<T>& v) {
  if (v.empty()) return T{};
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

EvidenceLine evidence(int rank, const LogEvent& e) {
  return {rank, e.line_no, std::string(e.raw.substr(0, kEvidenceChars)) + (e.raw.size() > kEvidenceChars ? "..." : "")};
}

// One collective as one rank saw it. fp == 0: known only from a stall's
// in-flight list (no fingerprint), used for progress, not for comparison.
struct CollRec {
  std::uint64_t seq = 0, fp = 0, count = 0, t = 0, end_t = 0;
  std::string op, dtype, state;
};

struct RankDigest {
  RankSummary sum;
  std::map<std::string, std::vector<CollRec>> colls;  // communicator -> what this rank issued
  std::vector<FactRecord> facts;
  std::vector<ViolationRecord> violations;
  absl::Status status;
};

std::uint64_t parse_fp(const std::string& hex) { return hex.empty() ? 0 : std::strtoull(hex.c_str(), nullptr, 16); }

// Collectives still in flight (or failed) at a flight-recorder dump.
// Collectives still in flight (or failed) at a flight-recorder dump. A stall
// line knows only (comm, seq) of what a rank waits in; the dump has its
// fingerprint, which is what shows a mismatch behind a hang.
void add_flight_dump(const std::string& path, const SummaryOptions& opts, int sessions, RankDigest& d) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.load(path).get(doc) != simdjson::SUCCESS) return;
  // The reason speaks for the process that dumped: not for a later session
  // of a restarted rank (the file stays until the next dump overwrites it).
  std::string_view reason;
  std::int64_t pid = 0;
  const bool same_process = doc["pid"].get_int64().get(pid) != simdjson::SUCCESS || d.sum.pid == 0 || pid == d.sum.pid;
  if (same_process && doc["reason"].get_string().get(reason) == simdjson::SUCCESS) d.sum.dump_reason = std::string(reason);
  simdjson::dom::array arr;
  if (doc["collectives"].get_array().get(arr) != simdjson::SUCCESS) return;
  std::map<std::string, absl::flat_hash_map<std::uint64_t, std::size_t>> known;  // comm -> seq -> index
  for (const auto& [comm, recs] : d.colls) {
    for (std::size_t i = 0; i < recs.size(); ++i) known[comm].emplace(recs[i].seq, i);
  }
  for (auto c : arr) {
    std::string_view state, comm, op, dtype, fp;
    std::uint64_t seq = 0, count = 0, t = 0;
    if (c["state"].get_string().get(state) || c["comm"].get_string().get(comm) || c["op"].get_string().get(op) ||
        c["dtype"].get_string().get(dtype) || c["fingerprint"].get_string().get(fp) ||
        c["seq"].get_uint64().get(seq) || c["count"].get_uint64().get(count)) {
      continue;
    }
    if (c["t"].get_uint64().get(t) == simdjson::SUCCESS && (t < opts.since_ns || t > opts.until_ns)) continue;
    // The dump belongs to the rank's latest session, as the stall lines do.
    const std::string key = sessions > 1 ? fmt::format("{} (session {})", comm, sessions) : std::string(comm);
    CollRec rec{seq, parse_fp(std::string(fp)), count, t, 0, std::string(op), std::string(dtype),
                state == "issued" ? "in flight" : std::string(state)};
    std::vector<CollRec>& recs = d.colls[key];
    auto [it, fresh] = known[key].emplace(seq, recs.size());
    if (fresh) {
      recs.push_back(std::move(rec));
    } else if (recs[it->second].fp == 0) {
      recs[it->second] = std::move(rec);  // the stall's record, now with its fingerprint
    }  // else the run log already has it, completed
  }
}

RankDigest digest_rank(const std::string& path, const std::string& dump, int rank, const SummaryOptions& opts) {
  RankDigest d;
  RankSummary& r = d.sum;
  r.rank = rank;
  detail::StepBreakdownBuilder builder;
  std::vector<double> step_ms, kind_ms[kPhaseKindCount];
  std::uint64_t last_phase_end = 0;
  std::optional<std::int64_t> threads_now, comms_now;
  bool restore_pending = false;
  auto comm_key = [&](const std::string& comm) {
    return r.sessions > 1 ? fmt::format("{} (session {})", comm, r.sessions) : comm;
  };
  auto res = read_run_log(path, [&](const LogEvent& e) {
    if (e.k == schema::Kind::kRunStart) {  // always read: sessions and host frame the rest
      ++r.sessions;
      r.pid = e.pid;
      r.host = e.name;
      r.cpu_affinity = e.cpu_affinity;
      r.schema = std::max(r.schema, e.schema);
      r.ended_cleanly = false;
      r.restores.clear();
      restore_pending = false;
      threads_now.reset();
      comms_now.reset();
      return;
    }
    if (e.t < opts.since_ns || e.t > opts.until_ns) return;
    if (r.first_t == 0) r.first_t = e.t;
    r.last_t = std::max(r.last_t, e.t);
    r.last_line = evidence(rank, e);
    switch (e.k) {
    case schema::Kind::kPhase: {
      ++r.phases;
      builder.on_phase(e.tid, e.depth, kind_from_name(e.phase_kind), e.mono, e.dur);
      if (e.t + e.dur >= last_phase_end) {
        last_phase_end = e.t + e.dur;
        r.last_phase = e.name;
      }
      break;
    }
    case schema::Kind::kStepBegin: {
      builder.on_step_begin(e.tid, e.step, e.mono);
      break;
    }
    case schema::Kind::kStepEnd: {
      ++r.steps;
      if (r.first_step < 0) r.first_step = e.step;
      r.last_step = e.step;
      if (e.loss) r.last_loss = e.loss;
      if (e.loss && !std::isfinite(*e.loss) && !r.first_bad_loss) {
        r.first_bad_loss = BadLossRecord{*e.loss, e.step, e.t, evidence(rank, e)};
      }
      if (e.samples) r.samples += *e.samples;
      if (auto b = builder.on_step_end(e.tid, e.mono)) {
        step_ms.push_back(static_cast<double>(b->total_ns) / 1e6);
        for (int k = 0; k < kPhaseKindCount; ++k) kind_ms[k].push_back(static_cast<double>(b->by_kind_ns[k]) / 1e6);
      }
      break;
    }
    case schema::Kind::kCollective: {
      const bool ok = e.result == "ok";
      d.colls[comm_key(e.comm)].push_back({e.seq, parse_fp(e.fingerprint), e.count, e.t,
                                           ok && !e.device_timing ? e.t + e.dur : 0, e.op, e.dtype,
                                           ok ? std::string("completed") : e.result});
      break;
    }
    case schema::Kind::kStats:
    case schema::Kind::kRunEnd: {
      if (e.events_recorded) r.events_recorded = *e.events_recorded;
      if (e.events_dropped) r.events_dropped = *e.events_dropped;
      if (e.k == schema::Kind::kRunEnd) r.ended_cleanly = true;
      if (e.os_threads) threads_now = e.os_threads;
      if (e.communicators) comms_now = e.communicators;
      if (restore_pending && e.os_threads) {
        r.restores.back().os_threads = e.os_threads.value_or(-1);
        r.restores.back().communicators = e.communicators.value_or(-1);
        restore_pending = false;
      }
      break;
    }
    case schema::Kind::kStall: {
      StallRecord s{e.t, e.t > e.dur ? e.t - e.dur : e.t, e.step, e.inside, e.name, e.op, e.comm, e.seq, false, 0,
                    evidence(rank, e)};
      if (r.stalls++ == 0) r.first_stall = s;
      r.last_stall = s;
      if (!e.comm.empty() && e.seq != 0) {  // entered and never left: progress evidence
        d.colls[comm_key(e.comm)].push_back({e.seq, 0, e.count, e.t, 0, e.op, "", "in flight"});
      }
      break;
    }
    case schema::Kind::kStallEnd: {
      for (auto* s : {&r.first_stall, &r.last_stall}) {
        if (*s && !(*s)->ended) {
          (*s)->ended = true;
          (*s)->stalled_ns = e.dur;
        }
      }
      break;
    }
    case schema::Kind::kLogStopped: {
      if (!r.log_stopped) r.log_stopped = LogStopRecord{e.msg, e.step, e.t, false, 0, evidence(rank, e)};
      break;
    }
    case schema::Kind::kLogResumed: {
      if (r.log_stopped) {
        r.log_stopped->resumed = true;
        r.log_stopped->lines_dropped = e.count;
      }
      break;
    }
    case schema::Kind::kSlowStep: {
      ++r.slow_steps;
      r.last_slow_phase = e.grown_phase;
      break;
    }
    case schema::Kind::kLog: {
      if ((e.level == "error" || e.level == "fatal") && r.errors++ == 0) {
        r.first_error_t = e.t;
        r.first_error = e.msg;
        r.first_error_line = evidence(rank, e);
      }
      break;
    }
    case schema::Kind::kFact: {
      FactRecord f{rank, std::max(r.sessions - 1, 0), e.name, 0, e.step, -1, e.t, {}};
      for (const auto& [k, v] : e.fields) {
        if (k == "seq") f.seq = std::strtoll(v.c_str(), nullptr, 10);
        else if (k == "data_group") f.data_group = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
        else f.values.emplace_back(k, v);
      }
      if (e.name == "resume") {
        if (r.restores.empty() && threads_now) r.restores.push_back({-1, *threads_now, comms_now.value_or(-1)});
        r.restores.push_back({e.step, -1, -1});
        restore_pending = true;
      }
      d.facts.push_back(std::move(f));
      break;
    }
    case schema::Kind::kViolation: {
      d.violations.push_back({rank, e.check, e.what, e.msg, e.level, e.values_json, e.ranks, e.step, e.t,
                              evidence(rank, e)});
      break;
    }
    case schema::Kind::kUnknown: {
      ++r.unknown_kinds;
      break;
    }
    default:
      break;
    }
  });
  if (!res.ok()) {
    d.status = res.status();
    return d;
  }
  std::error_code ec;
  if (std::filesystem::exists(dump, ec)) add_flight_dump(dump, opts, r.sessions, d);
  r.lines = res->lines;
  r.bad_lines = res->bad_lines;
  r.torn_tail = res->torn_tail;
  r.bytes = res->bytes;
  r.median_step_ms = median(step_ms);
  for (int k = 0; k < kPhaseKindCount; ++k) r.median_kind_ms[k] = median(kind_ms[k]);
  r.median_collective_ms = r.median_kind_ms[static_cast<int>(PhaseKind::kCollective)];
  for (const auto& [comm, recs] : d.colls) {
    for (const auto& c : recs) {
      if (c.seq > r.last_seq || (c.seq == r.last_seq && comm < r.last_comm)) {
        r.last_seq = c.seq;
        r.last_comm = comm;
      }
    }
  }
  return d;
}

// The cross-rank collective table, merged one rank at a time: per sequence
// number only the first fingerprint seen, so memory is O(sequence numbers)
// per communicator, whatever the rank count.
class CollectiveMerger {
 public:
  explicit CollectiveMerger(int reference_rank) : ref_(reference_rank) {}

  // Folds in one rank; returns its clock offset against the reference (ms).
  std::optional<double> merge(int rank, const std::map<std::string, std::vector<CollRec>>& colls) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::int64_t> diffs;
    for (const auto& [name, recs] : colls) {
      Comm& c = comms_[name];
      std::uint64_t last = 0;
      bool deviated = false;
      for (const CollRec& rec : recs) {
        last = std::max(last, rec.seq);
        auto [it, inserted] = c.seqs.try_emplace(rec.seq, Ref{rec, rank});
        if (inserted) continue;
        Ref& ref = it->second;
        if (ref.rec.fp == 0 && rec.fp != 0) {  // first real fingerprint for this seq
          ref = Ref{rec, rank};
          continue;
        }
        if (rank != ref_ && ref.rank == ref_ && rec.end_t != 0 && ref.rec.end_t != 0) {
          diffs.push_back(static_cast<std::int64_t>(rec.end_t - ref.rec.end_t));
        }
        if (deviated || rec.fp == 0 || ref.rec.fp == 0 || rec.fp == ref.rec.fp) continue;
        deviated = true;  // only its first deviation matters
        if (c.mismatch_seq == 0 || rec.seq < c.mismatch_seq) {
          c.mismatch_seq = rec.seq;
          c.deviants.clear();
        }
        if (rec.seq == c.mismatch_seq) {
          auto& g = c.deviants[rec.fp];
          g.first = rec;
          g.second.push_back(rank);
        }
      }
      c.last.emplace_back(rank, last);
    }
    if (diffs.empty()) return std::nullopt;
    return static_cast<double>(median(diffs)) / 1e6;
  }

  std::vector<CommunicatorCheck> checks() {
    std::vector<CommunicatorCheck> out;
    for (auto& [name, c] : comms_) {
      CommunicatorCheck k;
      k.comm = name;
      std::sort(c.last.begin(), c.last.end());
      for (const auto& [rank, seq] : c.last) k.max_seq = std::max(k.max_seq, seq);
      for (const auto& [rank, seq] : c.last) {
        k.ranks.push_back(rank);
        if (seq < k.max_seq) k.behind.emplace_back(rank, seq);
      }
      if (c.mismatch_seq != 0) {
        k.mismatch_seq = c.mismatch_seq;
        const Ref& ref = c.seqs.at(c.mismatch_seq);
        std::set<int> deviant;
        std::vector<std::pair<std::vector<int>, const CollRec*>> groups;
        for (auto& [fp, g] : c.deviants) {
          std::sort(g.second.begin(), g.second.end());
          deviant.insert(g.second.begin(), g.second.end());
          groups.emplace_back(g.second, &g.first);
        }
        std::vector<int> agree;  // reached the seq and matched the first fingerprint seen
        for (const auto& [rank, seq] : c.last) {
          if (seq >= c.mismatch_seq && !deviant.contains(rank)) agree.push_back(rank);
        }
        groups.emplace_back(agree, &ref.rec);
        std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
        for (const auto& [ranks, rec] : groups) {
          if (ranks.empty()) continue;
          k.mismatch_detail.push_back(
              fmt::format("{}: {} count={} {} ({})", format_ranks(ranks), rec->op, rec->count, rec->dtype, rec->state));
        }
        if (!groups.empty()) {
          k.mismatch_minority = groups.front().first;
          k.mismatch_t = groups.front().second->t;
        }
      }
      out.push_back(std::move(k));
    }
    return out;
  }

 private:
  struct Ref {
    CollRec rec;
    int rank;
  };
  struct Comm {
    absl::flat_hash_map<std::uint64_t, Ref> seqs;
    std::vector<std::pair<int, std::uint64_t>> last;  // rank -> highest seq reached
    std::uint64_t mismatch_seq = 0;
    std::map<std::uint64_t, std::pair<CollRec, std::vector<int>>> deviants;  // at mismatch_seq, by fingerprint
  };

  std::mutex mu_;
  int ref_;
  std::map<std::string, Comm> comms_;
};

// "0-3,8" -> {0, 1, 2, 3, 8}, sorted, each once; empty if it does not parse
// or names more than 65,536 CPUs (a hostile line must not allocate much).
std::vector<int> parse_cpu_list(std::string_view list) {
  constexpr int kMaxCpu = 65535;
  std::vector<int> out;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view part = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    const char* const end = part.data() + part.size();
    int lo = 0, hi = 0;
    auto [p, ec] = std::from_chars(part.data(), end, lo);
    if (ec != std::errc()) return {};
    hi = lo;
    if (p != end) {
      if (*p != '-') return {};
      auto [q, ec2] = std::from_chars(p + 1, end, hi);
      if (ec2 != std::errc() || q != end) return {};
    }
    if (lo < 0 || hi < lo || hi > kMaxCpu || out.size() + static_cast<std::size_t>(hi - lo) >= kMaxCpu + 1u) return {};
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// CPU binding that makes ranks of one host compete for cores: more ranks on a
// set of CPUs than it has (ranks pinned to the same core, or unpinned ranks
// oversubscribing a small host or container), and ranks pinned to sets that
// overlap without being the same (a launcher's binding arithmetic gone
// wrong). Ranks sharing a set at least as large as their number (unpinned on
// a big host, or one container's cpuset) are fine and not reported.
void add_binding_warnings(RunSummary& s) {
  std::map<std::string, std::map<std::vector<int>, std::vector<int>>> by_host;  // host -> CPU set -> its ranks
  std::map<std::vector<int>, std::string> text;  // CPU set -> as the rank logged it
  for (const auto& r : s.ranks) {
    std::vector<int> cpus = parse_cpu_list(r.cpu_affinity);
    if (cpus.empty()) continue;
    text.emplace(cpus, r.cpu_affinity);
    by_host[r.host][std::move(cpus)].push_back(r.rank);
  }
  for (const auto& [host, sets] : by_host) {
    for (const auto& [cpus, ranks] : sets) {
      if (cpus.size() >= ranks.size()) continue;
      s.warnings.push_back(fmt::format("host {}: {} share CPU{} {} ({} ranks on {} CPU{})", host, format_ranks(ranks),
                                       cpus.size() == 1 ? "" : "s", text[cpus], ranks.size(), cpus.size(),
                                       cpus.size() == 1 ? "" : "s"));
    }
    std::set<int> overlapping;
    std::string which;
    for (auto a = sets.begin(); a != sets.end(); ++a) {
      for (auto b = std::next(a); b != sets.end(); ++b) {
        std::vector<int> both;
        std::set_intersection(a->first.begin(), a->first.end(), b->first.begin(), b->first.end(),
                              std::back_inserter(both));
        if (both.empty()) continue;
        for (const auto* side : {&*a, &*b}) {
          for (int rank : side->second) {
            if (overlapping.insert(rank).second) {
              which += fmt::format("{}rank {} on {}", which.empty() ? "" : ", ", rank, text[side->first]);
            }
          }
        }
      }
    }
    if (!overlapping.empty()) {
      s.warnings.push_back(fmt::format("host {}: {} are pinned to overlapping CPUs ({}): they compete for the same "
                                       "cores (check the launcher's CPU binding)",
                                       host, format_ranks(std::vector<int>(overlapping.begin(), overlapping.end())),
                                       which));
    }
  }
}

void add_warnings(RunSummary& s) {
  for (const auto& r : s.ranks) {
    if (r.bad_lines) s.warnings.push_back(fmt::format("rank {}: {} corrupt line(s) skipped", r.rank, r.bad_lines));
    if (r.torn_tail) s.warnings.push_back(fmt::format("rank {}: torn last line: the log ends inside a line (killed mid-write?)", r.rank));
    if (r.unknown_kinds) {
      s.warnings.push_back(fmt::format("rank {}: {} line(s) of unknown kinds ignored", r.rank, r.unknown_kinds));
    }
    if (r.schema > 1) {
      s.warnings.push_back(fmt::format("rank {}: run-log schema {} (this reader knows 1): newer fields are ignored",
                                       r.rank, r.schema));
    }
    if (r.events_dropped) {
      s.warnings.push_back(fmt::format("rank {}: {} event(s) dropped by the recorder (ring full): its phase and step "
                                       "numbers undercount",
                                       r.rank, r.events_dropped));
    }
  }
  if (!s.missing_ranks.empty()) {
    s.warnings.push_back(fmt::format("{}: no run log (expected from world_size {})", format_ranks(s.missing_ranks),
                                     s.world_size));
  }
  add_binding_warnings(s);
}

}  // namespace

std::uint64_t run_start_time(const std::string& run_dir) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  std::uint64_t t = 0;
  if (p.load(schema::run_json_path(run_dir)).get(doc) == simdjson::SUCCESS &&
      doc["start_time_ns"].get_uint64().get(t) != simdjson::SUCCESS) {
    t = 0;
  }
  return t;
}

absl::StatusOr<RunSummary> summarize_run(const std::string& run_dir, const SummaryOptions& opts) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("'", run_dir, "' is not a run directory"));
  }
  RunSummary out;
  out.run_dir = run_dir;
  {
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    std::int64_t w = 0;
    if (p.load(schema::run_json_path(run_dir)).get(doc) == simdjson::SUCCESS) {
      if (doc["world_size"].get_int64().get(w) == simdjson::SUCCESS) {
        if (w > 0 && w <= (1 << 20)) out.world_size = static_cast<int>(w);
        else out.warnings.push_back(fmt::format("run.json: world_size {} is not a world size; ignored", w));
      }
      if (doc["start_time_ns"].get_uint64().get(out.start_time_ns) != simdjson::SUCCESS) out.start_time_ns = 0;
    } else if (fs::exists(schema::run_json_path(run_dir), ec)) {
      out.warnings.push_back("run.json is unreadable: world size unknown, missing ranks cannot be named");
    }
  }
  struct File {
    int rank;
    std::string path;
    std::uint64_t bytes;
  };
  std::vector<File> files;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    const auto parsed = schema::rank_of_run_log(name);
    if (!parsed) continue;
    rank = *parsed;
    files.push_back({rank, entry.path().string(), static_cast<std::uint64_t>(entry.file_size(ec))});
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no rank-<R>.jsonl files in '", run_dir, "'"));
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.rank < b.rank; });

  SummaryOptions::Progress progress{0, files.size(), 0, 0};
  for (const auto& f : files) progress.bytes_total += f.bytes;
  std::mutex progress_mu;
  CollectiveMerger merger(files.front().rank);
  out.reference_rank = files.front().rank;
  std::vector<RankDigest> digests(files.size());
  auto work = [&](std::size_t i) {
    digests[i] = digest_rank(files[i].path, schema::flight_path(run_dir, files[i].rank),
                             files[i].rank, opts);
    RankDigest& d = digests[i];
    if (d.status.ok()) d.sum.clock_offset_ms = merger.merge(files[i].rank, d.colls);
    d.colls.clear();
    if (opts.progress) {
      std::lock_guard<std::mutex> lock(progress_mu);
      ++progress.files_done;
      progress.bytes_done += files[i].bytes;
      opts.progress(progress);
    }
  };
  work(0);  // the reference rank first: every other rank's clock is compared with it
  if (digests[0].status.ok()) digests[0].sum.clock_offset_ms = 0.0;
  std::atomic<std::size_t> next{1};
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t n_threads = std::min<std::size_t>(opts.threads > 0 ? opts.threads : hw, files.size() - 1);
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < n_threads; ++t) {
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < files.size();) work(i);
    });
  }
  for (auto& t : pool) t.join();

  for (auto& d : digests) {
    if (!d.status.ok()) {  // unreadable file: say so, keep the other ranks
      out.warnings.push_back(fmt::format("rank {}: {}", d.sum.rank, std::string(d.status.message())));
      continue;
    }
    out.facts.insert(out.facts.end(), std::make_move_iterator(d.facts.begin()), std::make_move_iterator(d.facts.end()));
    out.violations.insert(out.violations.end(), std::make_move_iterator(d.violations.begin()),
                          std::make_move_iterator(d.violations.end()));
    out.ranks.push_back(std::move(d.sum));
  }
  if (out.ranks.empty()) return absl::DataLossError(absl::StrCat("no readable rank log in '", run_dir, "'"));
  for (int rk = 0; rk < out.world_size; ++rk) {
    if (std::none_of(out.ranks.begin(), out.ranks.end(), [&](const auto& r) { return r.rank == rk; })) {
      out.missing_ranks.push_back(rk);
    }
  }
  out.communicators = merger.checks();

  // Clock skew per host (median of its ranks' offsets against the reference).
  std::map<std::string, std::vector<double>> by_host;
  for (const auto& r : out.ranks) {
    if (r.clock_offset_ms) by_host[r.host].push_back(*r.clock_offset_ms);
  }
  for (auto& [host, offs] : by_host) {
    const int n = static_cast<int>(offs.size());
    const double m = median(offs);
    if (std::fabs(m) > RunSummary::kSkewReportMs) out.skew.push_back({host, m, n});
  }
  add_warnings(out);
  return out;
}

}  // namespace rankscope::reader
