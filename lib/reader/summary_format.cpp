// `rankscope summary`'s report as text and as JSON, its exit code, and the
// evidence-line format every report quotes. The summary itself: summary.cpp.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "absl/strings/str_cat.h"
#include "json_util.hpp"
#include "schema.hpp"
#include "summary.hpp"

namespace rankscope::reader {

std::string format_evidence(const EvidenceLine& e) {
  return e ? absl::StrCat(schema::run_log_name(e.rank), ":", e.line, ": ", e.text) : std::string();
}

const RankSummary* evaluating_rank(const RunSummary& s) {
  for (const auto& r : s.ranks) {
    if (!r.evaluations.empty()) return &r;
  }
  return nullptr;
}

std::string format_evaluations(const RunSummary& s) {
  const RankSummary* r = evaluating_rank(s);
  if (r == nullptr) return {};
  std::vector<std::string> names;
  for (const auto& e : r->evaluations) {
    if (std::find(names.begin(), names.end(), e.name) == names.end()) names.push_back(e.name);
  }
  std::string o;
  for (const auto& name : names) {
    const EvaluationRecord *first = nullptr, *last = nullptr, *best = nullptr;
    std::size_t n = 0;
    for (const auto& e : r->evaluations) {
      if (e.name != name) continue;
      ++n;
      if (first == nullptr) first = &e;
      last = &e;
      if (best == nullptr || e.loss < best->loss) best = &e;  // a NaN is never the best
    }
    o += fmt::format("evaluation '{}' (rank {}, {} evaluation(s)): loss {:.4g} at step {}", name, r->rank, n,
                     first->loss, first->step);
    if (n > 1) o += fmt::format(" -> {:.4g} at step {}; best {:.4g} at step {}", last->loss, last->step, best->loss, best->step);
    o += "\n";
  }
  return o;
}

std::string format_summary(const RunSummary& s) {
  std::string o = fmt::format("run {}  world_size={}  ranks with logs={}\n", s.run_dir, s.world_size, s.ranks.size());
  o += fmt::format("{:>4} {:>6} {:>11} {:>9} | {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>8} | {:>9} {:>8} {:>7}\n",
                   "rank", "steps", "step range", "step ms", "loader", "forward", "backward", "optim", "ckpt", "coll",
                   "other", "in-flight", "last loss", "events", "dropped");
  for (const auto& r : s.ranks) {
    const auto& k = r.median_kind_ms;
    o += fmt::format("{:>4} {:>6} {:>11} {:>9.2f} | {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} | {:>8.2f} | {:>9} {:>8} {:>7}{}\n",
                     r.rank, r.steps, fmt::format("{}..{}", r.first_step, r.last_step), r.median_step_ms,
                     k[static_cast<int>(PhaseKind::kLoaderWait)], k[static_cast<int>(PhaseKind::kForward)],
                     k[static_cast<int>(PhaseKind::kBackward)], k[static_cast<int>(PhaseKind::kOptimizer)],
                     k[static_cast<int>(PhaseKind::kCheckpoint)], k[static_cast<int>(PhaseKind::kCollective)],
                     k[static_cast<int>(PhaseKind::kOther)], r.median_comm_ms,
                     r.last_loss ? fmt::format("{:.4f}", *r.last_loss) : std::string("-"), r.events_recorded,
                     r.events_dropped,
                     std::string(r.ended_cleanly ? "" : "  (no run_end: still running or died)") +
                         (r.torn_tail ? "  (torn last line)" : "") +
                         (r.bad_lines ? fmt::format("  ({} corrupt lines skipped)", r.bad_lines) : ""));
  }
  o += "(step ms and phase columns are per-step medians; phases by kind: loader wait, forward, backward, optimizer,\n"
       " checkpoint, collectives (the step waiting in them: exposed), other = step time outside those; in-flight = time\n"
       " a collective was in flight, issue to completion, exposed or overlapped with compute as FSDP2's and DDP's are)\n";
  bool device = false;
  for (const auto& r : s.ranks) device = device || r.device_timed_phases > 0;
  if (device) {  // the host only launched those phases' work: its own time, beside the device's above
    o += "(phases timed on the GPU count their device time, from CUDA events around them; the host's own time of\n"
         " the same phases, launching their work:)\n";
    o += fmt::format("{:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  host ms\n", "rank", "loader", "forward",
                     "backward", "optim", "ckpt", "coll", "other");
    for (const auto& r : s.ranks) {
      if (r.device_timed_phases == 0) continue;
      const auto& k = r.median_host_kind_ms;
      o += fmt::format("{:>4} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f}\n", r.rank,
                       k[static_cast<int>(PhaseKind::kLoaderWait)], k[static_cast<int>(PhaseKind::kForward)],
                       k[static_cast<int>(PhaseKind::kBackward)], k[static_cast<int>(PhaseKind::kOptimizer)],
                       k[static_cast<int>(PhaseKind::kCheckpoint)], k[static_cast<int>(PhaseKind::kCollective)],
                       k[static_cast<int>(PhaseKind::kOther)]);
    }
  }
  for (const auto& c : s.communicators) {
    if (c.mismatch_seq != 0) {
      o += fmt::format("collectives on '{}': MISMATCH at seq {}: ranks issued different collectives\n", c.comm,
                       c.mismatch_seq);
      for (const auto& d : c.mismatch_detail) o += "  " + d + "\n";
    } else {
      o += fmt::format("collectives on '{}': {} per rank, sequence numbers and fingerprints agree on {} ranks\n",
                       c.comm, c.max_seq, c.ranks.size());
    }
    for (const auto& [rank, seq] : c.behind) {
      o += fmt::format("  rank {} stopped at seq {} of {} on '{}'\n", rank, seq, c.max_seq, c.comm);
    }
  }
  o += format_evaluations(s);
  for (const auto& k : s.skew) {
    o += fmt::format("clock: host {} is {:+.1f} ms off rank {}'s clock ({} rank(s), from collective ends)\n", k.host,
                     k.offset_ms, s.reference_rank, k.ranks);
  }
  for (const auto& w : s.warnings) o += "warning: " + w + "\n";
  return o;
}

int summary_exit_code(const RunSummary& s) {
  bool findings = !s.missing_ranks.empty();
  for (const auto& c : s.communicators) findings |= c.mismatch_seq != 0 || !c.behind.empty();
  return findings ? 1 : 0;
}

std::string format_summary_json(const RunSummary& s) {
  detail::JsonWriter w;
  w.begin_object().field("schema", "rankscope.summary/1").field("run_dir", s.run_dir).field("world_size", s.world_size);
  w.array("missing_ranks", s.missing_ranks).key("ranks").begin_array();
  for (const auto& r : s.ranks) {
    w.begin_object().field("rank", r.rank).field("steps", r.steps).field("first_step", r.first_step);
    w.field("last_step", r.last_step).key("median_step_ms").fixed(r.median_step_ms, 3);
    w.field("events_recorded", r.events_recorded).field("events_dropped", r.events_dropped);
    w.field("ended_cleanly", r.ended_cleanly).field("torn_tail", r.torn_tail).field("bad_lines", r.bad_lines);
    w.key("median_phase_ms").begin_object();
    for (int k = 0; k < kPhaseKindCount; ++k) {
      w.key(phase_kind_name(static_cast<PhaseKind>(k))).fixed(r.median_kind_ms[k], 3);
    }
    w.end_object();
    w.key("median_comm_in_flight_ms").fixed(r.median_comm_ms, 3);
    w.field("device_timed_phases", r.device_timed_phases);
    if (r.device_timed_phases > 0) {
      w.key("median_host_phase_ms").begin_object();
      for (int k = 0; k < kPhaseKindCount; ++k) {
        w.key(phase_kind_name(static_cast<PhaseKind>(k))).fixed(r.median_host_kind_ms[k], 3);
      }
      w.end_object();
    }
    if (r.log_stopped) {
      w.key("run_log_stopped").begin_object().field("error", r.log_stopped->error).field("step", r.log_stopped->step);
      w.field("resumed", r.log_stopped->resumed).end_object();
    }
    w.end_object();
  }
  w.end_array().key("communicators").begin_array();
  for (const auto& c : s.communicators) {
    w.begin_object().field("comm", c.comm).field("max_seq", c.max_seq).array("ranks", c.ranks);
    w.field("mismatch_seq", c.mismatch_seq).key("behind").begin_array();
    for (const auto& [rank, seq] : c.behind) w.begin_object().field("rank", rank).field("seq", seq).end_object();
    w.end_array().end_object();
  }
  w.end_array().key("evaluations").begin_array();
  if (const RankSummary* r = evaluating_rank(s)) {
    for (const auto& e : r->evaluations) {
      w.begin_object().field("rank", r->rank).field("name", e.name).field("step", e.step).field("loss", e.loss).end_object();
    }
  }
  return w.end_array().end_object().take();
}

}  // namespace rankscope::reader
