// One rank's run log digested event by event (summary_digest.hpp): its
// phases and steps, collectives, stalls, log gaps, errors, facts and
// violations, then its flight dump's collectives in flight.
#include "summary_digest.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/container/flat_hash_map.h"
#include "position.hpp"
#include "run_log.hpp"
#include "rankscope/collective.hpp"
#include "step_breakdown.hpp"

namespace rankscope::reader::digest {
namespace {

constexpr std::size_t kEvidenceChars = 400;

PhaseKind kind_from_name(std::string_view s) {
  for (int k = 0; k < kPhaseKindCount; ++k) {
    if (phase_kind_name(static_cast<PhaseKind>(k)) == s) return static_cast<PhaseKind>(k);
  }
  return PhaseKind::kOther;
}

EvidenceLine evidence(int rank, const LogEvent& e) {
  return {rank, e.line_no, std::string(e.raw.substr(0, kEvidenceChars)) + (e.raw.size() > kEvidenceChars ? "..." : "")};
}

std::uint64_t parse_fp(const std::string& hex) { return hex.empty() ? 0 : std::strtoull(hex.c_str(), nullptr, 16); }

// Collectives still in flight (or failed) at a flight-recorder dump. A stall
// line knows only (comm, seq) of what a rank waits in; the dump has its
// fingerprint, which is what shows a mismatch behind a hang.
void add_flight_dump(const std::string& path, const SummaryOptions& opts, int sessions, RankDigest& d) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (!is_regular_file(path) || p.load(path).get(doc) != simdjson::SUCCESS) return;
  // The reason speaks for the process that dumped: not for a later session
  // of a restarted rank (the file stays until the next dump overwrites it).
  std::string_view reason;
  std::int64_t pid = 0;
  const bool same_process = doc[schema::field_name(schema::Field::kPid)].get_int64().get(pid) != simdjson::SUCCESS || d.sum.pid == 0 || pid == d.sum.pid;
  if (same_process && doc[schema::field_name(schema::Field::kReason)].get_string().get(reason) == simdjson::SUCCESS) d.sum.dump_reason = std::string(reason);
  simdjson::dom::array arr;
  if (doc[schema::field_name(schema::Field::kCollectives)].get_array().get(arr) != simdjson::SUCCESS) return;
  std::map<std::string, absl::flat_hash_map<std::uint64_t, std::size_t>> known;  // comm -> seq -> index
  for (const auto& [comm, recs] : d.colls) {
    for (std::size_t i = 0; i < recs.size(); ++i) known[comm].emplace(recs[i].seq, i);
  }
  for (auto c : arr) {
    std::string_view state, comm, op, dtype, fp;
    std::uint64_t seq = 0, count = 0, t = 0;
    if (c[schema::field_name(schema::Field::kState)].get_string().get(state) || c[schema::field_name(schema::Field::kComm)].get_string().get(comm) || c[schema::field_name(schema::Field::kOp)].get_string().get(op) ||
        c[schema::field_name(schema::Field::kDtype)].get_string().get(dtype) || c[schema::field_name(schema::Field::kFingerprint)].get_string().get(fp) ||
        c[schema::field_name(schema::Field::kSeq)].get_uint64().get(seq) || c[schema::field_name(schema::Field::kCount)].get_uint64().get(count)) {
      continue;
    }
    if (c[schema::field_name(schema::Field::kT)].get_uint64().get(t) == simdjson::SUCCESS && (t < opts.since_ns || t > opts.until_ns)) continue;
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

// Folds one rank's events into its digest: called per line by the reader.
class RankDigester {
 public:
  RankDigester(int rank, const SummaryOptions& opts) : opts_(opts) { d_.sum.rank = rank; }

  void on_event(const LogEvent& e) {
    RankSummary& r = d_.sum;
    if (e.k == schema::Kind::kRunStart) {  // always read: sessions and host frame the rest
      on_run_start(e);
      goodput_.on_run_start(e.t);
      return;
    }
    if (e.t < opts_.since_ns || e.t > opts_.until_ns) return;
    if (r.first_t == 0) r.first_t = e.t;
    r.last_t = std::max(r.last_t, e.t);
    r.last_line = evidence(r.rank, e);
    goodput_.on_any(e.t);
    dispatch(e);
  }

  RankDigest finish(const absl::StatusOr<ReadResult>& res, const std::string& dump);
  // Communicator ids to names, as the rank's collective lines have them (the position file has ids).
  const std::map<std::int64_t, std::string>& comm_names() const { return comm_names_; }

 private:
  void dispatch(const LogEvent& e);
  void on_run_start(const LogEvent& e);
  void on_phase(const LogEvent& e);
  void on_step_end(const LogEvent& e);
  void on_scalars(const LogEvent& e);  // step_end's loss, grad_norm; a step_scalars line's too
  void on_stats(const LogEvent& e);
  void on_stall(const LogEvent& e);
  void on_stall_end(const LogEvent& e);
  void on_log_gap(const LogEvent& e);
  void on_exit(const LogEvent& e);
  void on_fact(const LogEvent& e);
  void on_resources(const LogEvent& e);

  std::string comm_key(const std::string& comm) const {
    return d_.sum.sessions > 1 ? fmt::format("{} (session {})", comm, d_.sum.sessions) : comm;
  }

  const SummaryOptions& opts_;
  RankDigest d_;
  rankscope::detail::StepBreakdownBuilder builder_;
  GoodputBuilder goodput_;
  std::map<std::pair<std::string, int>, CollectiveStat> coll_stats_;  // (op, size class): a few dozen at most
  std::vector<double> step_ms_, kind_ms_[kPhaseKindCount];
  std::map<std::int64_t, std::string> comm_names_;
  absl::flat_hash_map<std::string, double> name_ns_;  // time per phase name (the first kNamedPhasesKept)
  std::uint64_t last_phase_end_ = 0;
  std::optional<std::int64_t> threads_now_, comms_now_;
  std::uint64_t resource_stride_ = 1, resource_seen_ = 0;  // keep every stride-th interval snapshot
  bool restore_pending_ = false;
  std::uint64_t cut_by_kill_ = 0;  // `recovered` lines that ended a torn line
};

void RankDigester::dispatch(const LogEvent& e) {
  RankSummary& r = d_.sum;
  switch (e.k) {
    case schema::Kind::kPhase: on_phase(e); break;
    case schema::Kind::kStepBegin: builder_.on_step_begin(e.tid, e.step, e.mono); break;
    case schema::Kind::kStepEnd: on_step_end(e); break;
    case schema::Kind::kStepScalars: on_scalars(e); break;
    case schema::Kind::kCollective: {
      const bool ok = e.result == "ok";
      if (ok && e.bytes > 0) {
        CollectiveStat& c = coll_stats_[{e.op, static_cast<int>(std::bit_width(e.bytes)) - 1}];
        ++c.calls;
        c.bytes += e.bytes;
        c.seconds += static_cast<double>(e.dur) * 1e-9;
      }
      if (e.comm_id >= 0 && !comm_names_.contains(e.comm_id)) comm_names_.emplace(e.comm_id, e.comm);
      d_.colls[comm_key(e.comm)].push_back({e.seq, parse_fp(e.fingerprint), e.count, e.t,
                                            ok && !e.device_timing ? e.t + e.dur : 0, e.op, e.dtype,
                                            ok ? std::string("completed") : e.result});
      break;
    }
    case schema::Kind::kStats:
    case schema::Kind::kRunEnd: on_stats(e); break;
    case schema::Kind::kStall: on_stall(e); break;
    case schema::Kind::kStallEnd: on_stall_end(e); break;
    case schema::Kind::kLogStopped:
    case schema::Kind::kLogResumed: on_log_gap(e); break;
    case schema::Kind::kExit: on_exit(e); break;
    case schema::Kind::kSlowStep:
      ++r.slow_steps;
      r.last_slow_phase = e.grown_phase;
      if (r.slow_step_list.size() < kSlowStepsKept) r.slow_step_list.push_back({e.step, e.grown_phase});
      break;
    case schema::Kind::kLog:
      if ((e.level == "error" || e.level == "fatal") && r.errors++ == 0) {
        r.first_error_t = e.t;
        r.first_error = e.msg;
        r.first_error_line = evidence(r.rank, e);
      }
      break;
    case schema::Kind::kFact: on_fact(e); break;
    case schema::Kind::kNumerics:
      if (r.numerics.size() < RankSummary::kNumericsKept) {
        r.numerics.push_back({e.what, e.signal, e.step, e.t, e.value, e.median, e.msg, evidence(r.rank, e)});
      }
      break;
    case schema::Kind::kResources: on_resources(e); break;
    case schema::Kind::kStacks: r.stacks = StackRecord{e.what, e.step, e.t, e.native, e.python, evidence(r.rank, e)}; break;
    case schema::Kind::kViolation:
      d_.violations.push_back({r.rank, e.check, e.what, e.msg, e.level, e.values_json, e.ranks, e.step, e.t,
                               evidence(r.rank, e)});
      break;
    case schema::Kind::kRecovered:
      r.rings_recovered = true;
      r.recovered += e.count;
      r.unrecovered += e.seq;
      cut_by_kill_ += e.torn ? 1 : 0;
      break;
    case schema::Kind::kUnknown: ++r.unknown_kinds; break;
    default: break;
  }
}

void RankDigester::on_run_start(const LogEvent& e) {
  RankSummary& r = d_.sum;
  ++r.sessions;
  r.exit.reset();  // how a process ended is its last session's
  r.pid = e.pid;
  r.host = e.name;
  r.cpu_affinity = e.cpu_affinity;
  r.environment = e.fields;
  r.schema = std::max(r.schema, e.schema);
  r.ended_cleanly = false;
  r.restores.clear();
  restore_pending_ = false;
  threads_now_.reset();
  comms_now_.reset();
}

void RankDigester::on_phase(const LogEvent& e) {
  ++d_.sum.phases;
  const PhaseKind kind = kind_from_name(e.phase_kind);
  builder_.on_phase(e.tid, e.depth, kind, e.mono, e.dur);
  goodput_.on_phase(e.tid, e.depth, kind, e.t, e.dur);
  if (auto it = name_ns_.find(e.name); it != name_ns_.end()) {
    it->second += static_cast<double>(e.dur);
  } else if (name_ns_.size() < RankSummary::kNamedPhasesKept) {
    name_ns_.emplace(e.name, static_cast<double>(e.dur));
  }
  if (e.t + e.dur >= last_phase_end_) {
    last_phase_end_ = e.t + e.dur;
    d_.sum.last_phase = e.name;
  }
}

void RankDigester::on_scalars(const LogEvent& e) {
  RankSummary& r = d_.sum;
  if (e.loss) r.last_loss = e.loss;
  if (e.loss && !std::isfinite(*e.loss) && !r.first_bad_loss) {
    r.first_bad_loss = BadLossRecord{*e.loss, e.step, e.t, evidence(r.rank, e)};
  }
  if (e.grad_norm && !std::isfinite(*e.grad_norm) && !r.first_bad_grad_norm) {
    r.first_bad_grad_norm = BadLossRecord{*e.grad_norm, e.step, e.t, evidence(r.rank, e)};
  }
  // A step_scalars line comes after its step's step_end: into that step's block.
  if (e.k == schema::Kind::kStepScalars) r.series.add_scalars(e.step, {e.loss, e.lr, e.grad_norm});
}

void RankDigester::on_step_end(const LogEvent& e) {
  RankSummary& r = d_.sum;
  ++r.steps;
  if (r.first_step < 0) r.first_step = e.step;
  r.last_step = e.step;
  on_scalars(e);
  if (e.samples) r.samples += *e.samples;
  if (auto b = builder_.on_step_end(e.tid, e.mono)) {
    goodput_.on_step(e.tid, e.step, e.t, b->total_ns, b->by_kind_ns);
    step_ms_.push_back(static_cast<double>(b->total_ns) / 1e6);
    double ms[kPhaseKindCount];
    for (int k = 0; k < kPhaseKindCount; ++k) {
      ms[k] = static_cast<double>(b->by_kind_ns[k]) / 1e6;
      kind_ms_[k].push_back(ms[k]);
    }
    if (e.step >= 0) {
      r.series.add(e.step, ms, static_cast<double>(b->total_ns) / 1e6, static_cast<double>(e.samples.value_or(0)),
                   static_cast<double>(e.tokens.value_or(0)), {e.loss, e.lr, e.grad_norm});
    }
  }
  if (e.next_step) builder_.on_step_begin(e.tid, *e.next_step, e.mono);  // step(): no step_begin line of its own
}

// stats and run_end: the recorder's counters, threads and communicators
// (the first stats line after a restore samples them for that restore).
void RankDigester::on_stats(const LogEvent& e) {
  RankSummary& r = d_.sum;
  if (e.events_recorded) r.events_recorded = *e.events_recorded;
  if (e.events_dropped) r.events_dropped = *e.events_dropped;
  if (e.k == schema::Kind::kRunEnd) r.ended_cleanly = true;
  if (e.os_threads) threads_now_ = e.os_threads;
  if (e.communicators) comms_now_ = e.communicators;
  if (restore_pending_ && e.os_threads) {
    r.restores.back().os_threads = e.os_threads.value_or(-1);
    r.restores.back().communicators = e.communicators.value_or(-1);
    restore_pending_ = false;
  }
}

void RankDigester::on_stall(const LogEvent& e) {
  RankSummary& r = d_.sum;
  StallRecord s{e.t, e.t > e.dur ? e.t - e.dur : e.t, e.step, e.inside, e.name, e.op, e.comm, e.seq, false, 0,
                evidence(r.rank, e)};
  goodput_.on_stall(s.since);
  if (r.stalls++ == 0) r.first_stall = s;
  r.last_stall = s;
  if (!e.comm.empty() && e.seq != 0) {  // entered and never left: progress evidence
    d_.colls[comm_key(e.comm)].push_back({e.seq, 0, e.count, e.t, 0, e.op, "", "in flight"});
  }
}

void RankDigester::on_stall_end(const LogEvent& e) {
  goodput_.on_stall_end(e.t);
  for (auto* s : {&d_.sum.first_stall, &d_.sum.last_stall}) {
    if (*s && !(*s)->ended) {
      (*s)->ended = true;
      (*s)->stalled_ns = e.dur;
    }
  }
}

void RankDigester::on_log_gap(const LogEvent& e) {
  RankSummary& r = d_.sum;
  if (e.k == schema::Kind::kLogStopped) {
    if (!r.log_stopped) r.log_stopped = LogStopRecord{e.msg, e.step, e.t, false, 0, evidence(r.rank, e)};
  } else if (r.log_stopped) {
    r.log_stopped->resumed = true;
    r.log_stopped->lines_dropped = e.count;
  }
}

void RankDigester::on_exit(const LogEvent& e) {
  if (e.cause == "thread_exception") {  // the process went on: an error, not its end
    ++d_.sum.errors;
    return;
  }
  d_.sum.exit = ExitRecord{e.cause, e.exception, e.msg, e.step, e.t, evidence(d_.sum.rank, e)};
}

void RankDigester::on_resources(const LogEvent& e) {
  RankSummary& r = d_.sum;
  ResourcePoint p{e.t, e.step, e.what, e.numbers};
  r.last_resources = p;
  if (e.what == "interval" && resource_seen_++ % resource_stride_ != 0) return;
  r.resources.push_back(std::move(p));
  if (r.resources.size() >= RankSummary::kResourcesKept) {  // halve: every other one, stalls kept
    std::vector<ResourcePoint> kept;
    for (std::size_t i = 0; i < r.resources.size(); ++i) {
      if (i % 2 == 0 || r.resources[i].reason != "interval") kept.push_back(std::move(r.resources[i]));
    }
    r.resources = std::move(kept);
    resource_stride_ *= 2;
  }
}

void RankDigester::on_fact(const LogEvent& e) {
  RankSummary& r = d_.sum;
  FactRecord f{r.rank, std::max(r.sessions - 1, 0), e.name, 0, e.step, -1, e.t, {}};
  for (const auto& [k, v] : e.fields) {
    if (k == schema::field_name(schema::Field::kSeq)) f.seq = std::strtoll(v.c_str(), nullptr, 10);
    else if (k == schema::field_name(schema::Field::kDataGroup)) f.data_group = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    else f.values.emplace_back(k, v);
  }
  if (e.name == "resume") {
    if (r.restores.empty() && threads_now_) r.restores.push_back({-1, *threads_now_, comms_now_.value_or(-1)});
    r.restores.push_back({e.step, -1, -1});
    restore_pending_ = true;
  }
  d_.facts.push_back(std::move(f));
}

RankDigest RankDigester::finish(const absl::StatusOr<ReadResult>& res, const std::string& dump) {
  RankSummary& r = d_.sum;
  if (!res.ok()) {
    d_.status = res.status();
    return std::move(d_);
  }
  std::error_code ec;
  if (std::filesystem::exists(dump, ec)) add_flight_dump(dump, opts_, r.sessions, d_);
  r.lines = res->lines;
  // A line cut by the kill, ended when its rings were recovered, is the torn tail it was, not a corrupt line.
  r.bad_lines = res->bad_lines - std::min(res->bad_lines, cut_by_kill_);
  r.torn_tail = res->torn_tail || cut_by_kill_ > 0;
  r.bytes = res->bytes;
  r.goodput = goodput_.finish();
  for (auto& [key, c] : coll_stats_) {
    c.op = key.first;
    c.size_log2 = key.second;
    r.collective_stats.push_back(std::move(c));
  }
  r.median_step_ms = median_in_place(step_ms_);
  for (int k = 0; k < kPhaseKindCount; ++k) r.median_kind_ms[k] = median_in_place(kind_ms_[k]);
  r.median_collective_ms = r.median_kind_ms[static_cast<int>(PhaseKind::kCollective)];
  for (const auto& [name, ns] : name_ns_) {
    r.phase_ms_per_step.emplace_back(name, r.steps > 0 ? ns / 1e6 / static_cast<double>(r.steps) : 0.0);
  }
  std::sort(r.phase_ms_per_step.begin(), r.phase_ms_per_step.end());
  for (const auto& [comm, recs] : d_.colls) {
    for (const auto& c : recs) {
      if (c.seq > r.last_seq || (c.seq == r.last_seq && comm < r.last_comm)) {
        r.last_seq = c.seq;
        r.last_comm = comm;
      }
    }
  }
  return std::move(d_);
}

}  // namespace

namespace {
// rank-<R>.position, when the run log's last session wrote it (its pid).
std::optional<PositionRecord> read_position(const std::string& log_path, std::int64_t pid,
                                           const std::map<std::int64_t, std::string>& comm_names) {
  if (log_path.size() < 6 || !log_path.ends_with(".jsonl")) return std::nullopt;
  const std::string path = log_path.substr(0, log_path.size() - 6) + ".position";
  if (!is_regular_file(path)) return std::nullopt;  // a FIFO would block the read
  std::ifstream in(path, std::ios::binary);
  using rankscope::detail::PositionPage;
  char buf[sizeof(PositionPage)];
  if (!in.read(buf, sizeof(buf))) return std::nullopt;  // absent, or cut short
  // The page's fields, copied out by offset (its atomics have their values' layout).
  const auto field = [&]<typename T>(std::size_t offset, T) {
    T v;
    std::memcpy(&v, buf + offset, sizeof(T));
    return v;
  };
  if (std::memcmp(buf, rankscope::detail::kPositionMagic, sizeof(rankscope::detail::kPositionMagic)) != 0 ||
      field(offsetof(PositionPage, pid), std::int64_t{}) != pid) {
    return std::nullopt;
  }
  const double ns_per_tick = field(offsetof(PositionPage, ns_per_tick), 0.0);
  const std::uint64_t anchor_ticks = field(offsetof(PositionPage, anchor_ticks), std::uint64_t{}),
                      anchor_wall = field(offsetof(PositionPage, anchor_wall_ns), std::uint64_t{});
  const auto wall = [&](std::uint64_t ticks) -> std::uint64_t {
    if (anchor_wall == 0 || !(ns_per_tick > 0 && ns_per_tick < 1e6)) return 0;
    return static_cast<std::uint64_t>(static_cast<double>(anchor_wall) +
                                      (static_cast<double>(ticks) - static_cast<double>(anchor_ticks)) * ns_per_tick);
  };
  PositionRecord r;
  r.step_begun = field(offsetof(PositionPage, step_begun), std::int64_t{});
  r.step_ended = field(offsetof(PositionPage, step_ended), std::int64_t{});
  r.begun_t = wall(field(offsetof(PositionPage, begun_ticks), std::uint64_t{}));
  r.ended_t = wall(field(offsetof(PositionPage, ended_ticks), std::uint64_t{}));
  using rankscope::detail::PositionCollective;
  std::vector<std::pair<std::uint64_t, PositionRecord::InFlight>> issued;  // by flight id
  for (std::size_t i = 0; i < rankscope::detail::kPositionCollectives; ++i) {
    const std::size_t at = offsetof(PositionPage, collectives) + i * sizeof(PositionCollective);
    const auto id_state = field(at + offsetof(PositionCollective, id_state), std::uint64_t{});
    if ((id_state & 0xff) != 1 || (id_state >> 8) == 0) continue;  // empty, or it completed
    const auto comm_id = field(at + offsetof(PositionCollective, comm_id), std::uint32_t{});
    const auto op_dtype = field(at + offsetof(PositionCollective, op_dtype), std::uint16_t{});
    PositionRecord::InFlight f;
    f.op = std::string(collective_op_name(static_cast<CollectiveOp>(op_dtype & 0xff)));
    const auto name = comm_names.find(comm_id);
    f.comm = name != comm_names.end() ? name->second : fmt::format("comm {}", comm_id);
    f.seq = field(at + offsetof(PositionCollective, seq), std::uint64_t{});
    f.count = field(at + offsetof(PositionCollective, count), std::uint64_t{});
    f.t = wall(field(at + offsetof(PositionCollective, issue_ticks), std::uint64_t{}));
    f.step = field(at + offsetof(PositionCollective, step), std::int64_t{});
    issued.emplace_back(id_state >> 8, std::move(f));
  }
  std::sort(issued.begin(), issued.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [id, f] : issued) r.in_flight.push_back(std::move(f));
  return r;
}
}  // namespace

RankDigest digest_rank(const std::string& path, const std::string& dump, int rank, const SummaryOptions& opts) {
  RankDigester digester(rank, opts);
  const auto res = read_run_log(path, [&](const LogEvent& e) { digester.on_event(e); });
  RankDigest d = digester.finish(res, dump);
  if (d.status.ok() && d.sum.pid != 0) d.sum.position = read_position(path, d.sum.pid, digester.comm_names());
  return d;
}

}  // namespace rankscope::reader::digest
