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
#include <variant>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/container/flat_hash_map.h"
#include "position.hpp"
#include "run_log.hpp"
#include "rankscope/collective.hpp"
#include "step_breakdown.hpp"

namespace rankscope::reader::digest {
namespace {

using schema::Field;
using schema::Kind;
using schema::Line;

constexpr std::size_t kEvidenceChars = 400;

// `out` made the evidence of line e; into its own string, so a line after line
// (the last line of every rank) costs a copy, not an allocation.
void set_evidence(EvidenceLine& out, int rank, const LogEvent& e) {
  out.rank = rank;
  out.line = e.line_no;
  out.text.assign(e.raw.substr(0, kEvidenceChars));
  if (e.raw.size() > kEvidenceChars) out.text += "...";
}

EvidenceLine evidence(int rank, const LogEvent& e) {
  EvidenceLine out;
  set_evidence(out, rank, e);
  return out;
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
    if (const auto* start = e.get<Kind::kRunStart>()) {  // always read: sessions and host frame the rest
      on_run_start(*start);
      goodput_.on_run_start(e.t);
      return;
    }
    if (e.t < opts_.since_ns || e.t > opts_.until_ns) return;
    if (r.first_t == 0) r.first_t = e.t;
    r.last_t = std::max(r.last_t, e.t);
    set_evidence(r.last_line, r.rank, e);
    goodput_.on_any(e.t);
    dispatch(e);
  }

  RankDigest finish(const absl::StatusOr<ReadResult>& res, const std::string& dump);
  // Communicator ids to names, as the rank's collective lines have them (the position file has ids).
  const std::map<std::int64_t, std::string>& comm_names() const { return comm_names_; }

 private:
  void dispatch(const LogEvent& e);  // defined after the handlers it instantiates
  void on_run_start(const Line<Kind::kRunStart>& l);
  void note_resumed(std::int64_t step);
  std::uint64_t stalls_at_session_start_ = 0;
  // A handler per kind the digest reads is a specialization of this (below);
  // the other kinds are skipped, and a kind this build does not know is counted.
  template <Kind K>
  void on(const LogEvent&, const Line<K>&) {}
  void on(const LogEvent&, const std::monostate&) { ++d_.sum.unknown_kinds; }
  template <Kind K>  // step_end's loss, grad_norm; a step_scalars line's too
  void on_scalars(const LogEvent& e, const Line<K>& l);
  template <Kind K>  // stats, run_end
  void on_stats(const Line<K>& l);

  // The union of the collectives seen since the last step end, inside [from, to]; then forgets them.
  double comm_in_step(std::uint64_t from, std::uint64_t to) {
    std::sort(comm_spans_.begin(), comm_spans_.end());
    double ns = 0;
    std::uint64_t reached = from;
    for (auto [a, b] : comm_spans_) {
      a = std::max(a, reached);
      b = std::min(b, to);
      if (b > a) {
        ns += static_cast<double>(b - a);
        reached = b;
      }
    }
    comm_spans_.clear();
    return ns;
  }
  static constexpr std::size_t kCommSpansKept = 4096;  // per step: FSDP2 issues a few per layer

  std::string comm_key(const std::string& comm) const {
    return d_.sum.sessions > 1 ? fmt::format("{} (session {})", comm, d_.sum.sessions) : comm;
  }

  const SummaryOptions& opts_;
  RankDigest d_;
  rankscope::detail::StepBreakdownBuilder builder_;
  GoodputBuilder goodput_;
  std::map<std::pair<std::string, int>, CollectiveStat> coll_stats_;  // (op, size class): a few dozen at most
  std::vector<double> step_ms_, kind_ms_[kPhaseKindCount];
  // Collectives in flight (issue to completion, wall ns) and collective phases since the last step
  // end: each step's communication, overlapped with its compute or not, is their union inside the
  // step, so it is never less than the exposed part (the collective phases).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> comm_spans_;
  std::vector<double> comm_ms_;
  double overlapped_comm_ns_ = 0;
  std::map<std::int64_t, std::string> comm_names_;
  absl::flat_hash_map<std::string, double> name_ns_;  // time per phase name (the first kNamedPhasesKept)
  // The host time of the outermost phases of the step being read, by kind (the breakdown counts a
  // device-timed phase at its device time; a GPU run shows the host's beside it).
  // The same breakdown at host time (the summary's host table), kept once a
  // phase was device-timed: the step-marking thread's top-level phases only.
  detail::StepBreakdownBuilder host_builder_;
  std::vector<double> host_kind_ms_[kPhaseKindCount];
  std::uint64_t last_phase_end_ = 0;
  std::optional<std::int64_t> threads_now_, comms_now_;
  std::uint64_t resource_stride_ = 1, resource_seen_ = 0;  // keep every stride-th interval snapshot
  bool restore_pending_ = false;
  std::uint64_t cut_by_kill_ = 0;  // `recovered` lines that ended a torn line
};

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kSlowStep>& l) {
  RankSummary& r = d_.sum;
  ++r.slow_steps;
  r.last_slow_phase = l.grown_phase;
  if (r.slow_step_list.size() < kSlowStepsKept) r.slow_step_list.push_back({e.step, l.grown_phase});
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kLog>& l) {
  RankSummary& r = d_.sum;
  if ((l.level == Level::kError || l.level == Level::kFatal) && r.errors++ == 0) {
    r.first_error_t = e.t;
    r.first_error = l.msg;
    r.first_error_line = evidence(r.rank, e);
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kNumerics>& l) {
  RankSummary& r = d_.sum;
  if (r.numerics.size() < RankSummary::kNumericsKept) {
    r.numerics.push_back({l.what, l.signal, e.step, e.t, l.value, l.median, l.msg, evidence(r.rank, e)});
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStacks>& l) {
  d_.sum.stacks = StackRecord{l.reason, e.step, e.t, l.native, l.python, evidence(d_.sum.rank, e)};
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kViolation>& l) {
  const int rank = d_.sum.rank;
  d_.violations.push_back({rank, l.check, l.what, l.msg, l.values.text, l.level, l.ranks, e.step, e.t, evidence(rank, e)});
}

template <>
void RankDigester::on(const LogEvent&, const Line<Kind::kRecovered>& l) {
  RankSummary& r = d_.sum;
  r.rings_recovered = true;
  r.recovered += l.records;
  r.unrecovered += l.unresolved;
  cut_by_kill_ += l.torn ? 1 : 0;
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kCollective>& l) {
  const bool ok = l.result == CollectiveResult::kOk;
  if (ok && l.bytes > 0) {
    CollectiveStat& c = coll_stats_[{l.op, static_cast<int>(std::bit_width(l.bytes)) - 1}];
    ++c.calls;
    c.bytes += l.bytes;
    c.seconds += static_cast<double>(l.dur) * 1e-9;
  }
  if (ok && l.dur > 0 && comm_spans_.size() < kCommSpansKept) comm_spans_.emplace_back(e.t, e.t + l.dur);
  if (l.comm_id && *l.comm_id >= 0 && !comm_names_.contains(*l.comm_id)) comm_names_.emplace(*l.comm_id, l.comm);
  const bool device_timed = l.timing == "device";
  d_.colls[comm_key(l.comm)].push_back({l.seq, parse_fp(l.fingerprint), l.count, e.t, ok && !device_timed ? e.t + l.dur : 0,
                                        l.op, l.dtype,
                                        ok ? std::string("completed") : std::string(collective_result_name(l.result))});
}

void RankDigester::on_run_start(const Line<Kind::kRunStart>& l) {
  RankSummary& r = d_.sum;
  if (r.sessions > 0 && r.ended_sessions.size() < RankSummary::kSessionsKept) {  // how the attempt before ended
    SessionEnding end{"no trace", "", r.last_step, r.last_t, r.last_line, -1};
    if (r.exit) {
      end = {r.exit->cause, r.exit->message, r.exit->step, r.exit->t, r.exit->line, -1};
    } else if (r.stalls > stalls_at_session_start_ && r.last_stall && !r.last_stall->ended) {
      end = {"stall", r.last_stall->inside, r.last_stall->step, r.last_stall->t, r.last_stall->line, -1};
    } else if (r.ended_cleanly) {
      end.how = "run_end";
    }
    r.ended_sessions.push_back(std::move(end));
  }
  stalls_at_session_start_ = r.stalls;
  ++r.sessions;
  r.exit.reset();  // how a process ended is its last session's
  r.pid = l.pid;
  r.host = l.host;
  r.cpu_affinity = l.environment.cpu_affinity;
  r.environment = l.environment.flat;
  r.schema = std::max(r.schema, l.schema);
  r.ended_cleanly = false;
  r.restores.clear();
  restore_pending_ = false;
  threads_now_.reset();
  comms_now_.reset();
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kPhase>& l) {
  ++d_.sum.phases;
  if (l.dev) ++d_.sum.device_timed_phases;
  const std::uint64_t work = l.dev.value_or(l.dur);  // on a GPU the work took the device's time
  builder_.on_phase(e.tid, l.depth, l.phase_kind, e.mono, work);
  if (d_.sum.device_timed_phases > 0) host_builder_.on_phase(e.tid, l.depth, l.phase_kind, e.mono, l.dur);
  goodput_.on_phase(e.tid, l.depth, l.phase_kind, e.t, work);
  if (l.phase_kind == PhaseKind::kCollective && work > 0 && comm_spans_.size() < kCommSpansKept) {
    comm_spans_.emplace_back(e.t, e.t + work);  // waiting in a collective is communicating, too
  }
  if (auto it = name_ns_.find(l.name); it != name_ns_.end()) {
    it->second += static_cast<double>(l.dur);
  } else if (name_ns_.size() < RankSummary::kNamedPhasesKept) {
    name_ns_.emplace(l.name, static_cast<double>(l.dur));
  }
  if (e.t + l.dur >= last_phase_end_) {
    last_phase_end_ = e.t + l.dur;
    d_.sum.last_phase = l.name;
  }
}

template <Kind K>
void RankDigester::on_scalars(const LogEvent& e, const Line<K>& l) {
  RankSummary& r = d_.sum;
  if (l.loss) r.last_loss = l.loss;
  if (l.loss && !std::isfinite(*l.loss) && !r.first_bad_loss) {
    r.first_bad_loss = BadLossRecord{*l.loss, e.step, e.t, evidence(r.rank, e)};
  }
  if (l.grad_norm && !std::isfinite(*l.grad_norm) && !r.first_bad_grad_norm) {
    r.first_bad_grad_norm = BadLossRecord{*l.grad_norm, e.step, e.t, evidence(r.rank, e)};
  }
  // A step_scalars line comes after its step's step_end: into that step's block.
  if constexpr (K == Kind::kStepScalars) r.series.add_scalars(e.step, {l.loss, l.lr, l.grad_norm});
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStepEnd>& l) {
  RankSummary& r = d_.sum;
  note_resumed(e.step);
  ++r.steps;
  if (r.first_step < 0) r.first_step = e.step;
  r.last_step = e.step;
  on_scalars(e, l);
  if (l.samples) r.samples += *l.samples;
  if (auto b = builder_.on_step_end(e.tid, e.mono)) {
    goodput_.on_step(e.tid, e.step, e.t, b->total_ns, b->by_kind_ns);
    step_ms_.push_back(static_cast<double>(b->total_ns) / 1e6);
    double ms[kPhaseKindCount];
    for (int k = 0; k < kPhaseKindCount; ++k) {
      ms[k] = static_cast<double>(b->by_kind_ns[k]) / 1e6;
      kind_ms_[k].push_back(ms[k]);
    }
    const double in_flight_ns = comm_in_step(e.t - std::min<std::uint64_t>(e.t, b->total_ns), e.t);
    comm_ms_.push_back(in_flight_ns / 1e6);
    overlapped_comm_ns_ += std::max(0.0, in_flight_ns - static_cast<double>(b->by_kind_ns[static_cast<int>(PhaseKind::kCollective)]));
    if (e.step >= 0) {
      r.series.add(e.step, ms, static_cast<double>(b->total_ns) / 1e6, static_cast<double>(l.samples.value_or(0)),
                   static_cast<double>(l.tokens.value_or(0)), {l.loss, l.lr, l.grad_norm});
    }
  }
  if (auto h = host_builder_.on_step_end(e.tid, e.mono); h && r.device_timed_phases > 0) {
    for (int k = 0; k < kPhaseKindCount; ++k) host_kind_ms_[k].push_back(static_cast<double>(h->by_kind_ns[k]) / 1e6);
  }
  if (l.next_step) {  // step(): no step_begin line of its own
    builder_.on_step_begin(e.tid, *l.next_step, e.mono);
    host_builder_.on_step_begin(e.tid, *l.next_step, e.mono);
  }
}

// stats and run_end: the recorder's counters, threads and communicators
// (the first stats line after a restore samples them for that restore).
template <Kind K>
void RankDigester::on_stats(const Line<K>& l) {
  RankSummary& r = d_.sum;
  if (l.events_recorded) r.events_recorded = *l.events_recorded;
  if (l.events_dropped) r.events_dropped = *l.events_dropped;
  if constexpr (K == Kind::kRunEnd) r.ended_cleanly = true;
  if (l.os_threads) threads_now_ = l.os_threads;
  if (l.communicators) comms_now_ = l.communicators;
  if (restore_pending_ && l.os_threads) {
    r.restores.back().os_threads = l.os_threads.value_or(-1);
    r.restores.back().communicators = l.communicators.value_or(-1);
    restore_pending_ = false;
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStall>& l) {
  RankSummary& r = d_.sum;
  const schema::FirstInFlight& c = l.in_flight;
  StallRecord s{e.t, e.t > l.dur ? e.t - l.dur : e.t, e.step, l.inside, l.open_phases.name, c.op, c.comm, c.seq, false, 0,
                evidence(r.rank, e)};
  s.on_device = c.on_device;
  s.issued_step = c.step;
  goodput_.on_stall(s.since);
  if (r.stalls++ == 0) r.first_stall = s;
  r.last_stall = s;
  if (!c.comm.empty() && c.seq != 0) {  // entered and never left: progress evidence
    d_.colls[comm_key(c.comm)].push_back({c.seq, 0, c.count, e.t, 0, c.op, "", "in flight"});
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStallEnd>& l) {
  goodput_.on_stall_end(e.t);
  for (auto* s : {&d_.sum.first_stall, &d_.sum.last_stall}) {
    if (*s && !(*s)->ended) {
      (*s)->ended = true;
      (*s)->stalled_ns = l.dur;
    }
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kLogStopped>& l) {
  RankSummary& r = d_.sum;
  if (!r.log_stopped) r.log_stopped = LogStopRecord{l.error, e.step, e.t, false, 0, evidence(r.rank, e)};
}

template <>
void RankDigester::on(const LogEvent&, const Line<Kind::kLogResumed>& l) {
  RankSummary& r = d_.sum;
  if (r.log_stopped) {
    r.log_stopped->resumed = true;
    r.log_stopped->lines_dropped = l.lines_dropped;
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kExit>& l) {
  if (l.cause == "thread_exception") {  // the process went on: an error, not its end
    ++d_.sum.errors;
    return;
  }
  d_.sum.exit = ExitRecord{l.cause, l.exception, l.msg, e.step, e.t, evidence(d_.sum.rank, e), l.exit_status.value_or(0)};
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kXid>& l) {
  RankSummary& r = d_.sum;
  if (r.xid_count++ < RankSummary::kXidsKept) {
    r.xids.push_back({l.gpu, l.code, l.action, l.msg, e.step, e.t, evidence(r.rank, e)});
  }
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kEvaluation>& l) {
  RankSummary& r = d_.sum;
  if (r.evaluations.size() < RankSummary::kEvaluationsKept) r.evaluations.push_back({l.name, e.step, l.loss});
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kResources>& l) {
  RankSummary& r = d_.sum;
  ResourcePoint p{e.t, e.step, l.reason, {}};
  schema::for_each_member(l, [&p]<typename T>(Field f, const T& v) {
    if constexpr (std::is_same_v<T, std::optional<double>>) {
      if (v) p.values.emplace_back(f, *v);
    }
  });
  r.last_resources = p;
  if (l.reason == "interval" && resource_seen_++ % resource_stride_ != 0) return;
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

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kFact>& l) {
  RankSummary& r = d_.sum;
  FactRecord f{r.rank, std::max(r.sessions - 1, 0), l.name, 0, e.step, -1, e.t, {}};
  for (const auto& [k, v] : l.fields.items) {
    if (k == schema::field_name(Field::kSeq)) f.seq = std::strtoll(v.c_str(), nullptr, 10);
    else if (k == schema::field_name(Field::kDataGroup)) f.data_group = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
    else f.values.emplace_back(k, v);
  }
  if (l.name == "resume") {
    if (r.restores.empty() && threads_now_) r.restores.push_back({-1, *threads_now_, comms_now_.value_or(-1)});
    r.restores.push_back({e.step, -1, -1});
    restore_pending_ = true;
  }
  d_.facts.push_back(std::move(f));
}

// The first step of an attempt after a restart: where it resumed.
void RankDigester::note_resumed(std::int64_t step) {
  auto& ended = d_.sum.ended_sessions;
  if (!ended.empty() && ended.back().resumed_step < 0 && step >= 0) ended.back().resumed_step = step;
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStepBegin>&) {
  note_resumed(e.step);
  builder_.on_step_begin(e.tid, e.step, e.mono);
  host_builder_.on_step_begin(e.tid, e.step, e.mono);
}

template <>
void RankDigester::on(const LogEvent& e, const Line<Kind::kStepScalars>& l) {
  on_scalars(e, l);
}

template <>
void RankDigester::on(const LogEvent&, const Line<Kind::kStats>& l) {
  on_stats(l);
}

template <>
void RankDigester::on(const LogEvent&, const Line<Kind::kRunEnd>& l) {
  on_stats(l);
}

void RankDigester::dispatch(const LogEvent& e) {
  std::visit([&](const auto& l) { on(e, l); }, e.body);
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
  r.goodput.overlapped_comm_seconds = overlapped_comm_ns_ * 1e-9;
  r.median_comm_ms = median_in_place(comm_ms_);
  for (auto& [key, c] : coll_stats_) {
    c.op = key.first;
    c.size_log2 = key.second;
    r.collective_stats.push_back(std::move(c));
  }
  r.median_step_ms = median_in_place(step_ms_);
  for (int k = 0; k < kPhaseKindCount; ++k) r.median_kind_ms[k] = median_in_place(kind_ms_[k]);
  for (int k = 0; k < kPhaseKindCount; ++k) r.median_host_kind_ms[k] = median_in_place(host_kind_ms_[k]);
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
