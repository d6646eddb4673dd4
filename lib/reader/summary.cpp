#include "summary.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "json_util.hpp"
#include "parallel.hpp"
#include "rankscope/exchange.hpp"
#include "summary_digest.hpp"

namespace rankscope::reader {
namespace {

using digest::CollRec;
using digest::median_in_place;
using digest::RankDigest;

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
    return static_cast<double>(median_in_place(diffs)) / 1e6;
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
        std::erase_if(groups, [](const auto& g) { return g.first.empty(); });
        std::stable_sort(groups.begin(), groups.end(),
                         [](const auto& a, const auto& b) { return a.first.size() < b.first.size(); });
        for (const auto& [ranks, rec] : groups) {
          k.mismatch_detail.push_back(
              fmt::format("{}: {} count={} {} ({})", format_ranks(ranks), rec->op, rec->count, rec->dtype, rec->state));
        }
        // The odd ones out: every rank outside the one largest group. With no
        // single largest (2 ranks, a 2-2 split) no majority says which side is
        // right: every rank is named rather than one picked.
        const bool majority = groups.size() == 1 || groups.back().first.size() > groups[groups.size() - 2].first.size();
        k.mismatch_no_majority = !majority;
        // A tie of two sides, broken by the history they agreed on: a training
        // loop repeats its collectives, so the side issuing one this
        // communicator had issued before (same fingerprint: op, count, dtype) is
        // going on as before, and the side issuing one never seen changed.
        std::size_t changed = groups.size();
        if (!majority && groups.size() == 2) {
          const Comm& comm = c;  // a structured binding cannot be captured before C++20's P1091 (clang 15)
          const auto seen = [&comm](std::uint64_t fp) {
            std::size_t n = 0;
            for (const auto& [seq, r] : comm.seqs) n += seq < comm.mismatch_seq && r.rec.fp == fp;
            return n;
          };
          const std::size_t seen0 = seen(groups[0].second->fp), seen1 = seen(groups[1].second->fp);
          if ((seen0 == 0) != (seen1 == 0)) {
            changed = seen0 == 0 ? 0 : 1;
            const auto& as_before = groups[1 - changed];
            k.mismatch_no_majority = false;
            k.mismatch_by_history = fmt::format(
                "by the history before it: {}'s {} count={} {} was never issued on '{}' before seq {}; {}'s had been, "
                "{} time(s)",
                format_ranks(groups[changed].first), groups[changed].second->op, groups[changed].second->count,
                groups[changed].second->dtype, name, c.mismatch_seq, format_ranks(as_before.first),
                std::max(seen0, seen1));
          }
        }
        for (std::size_t i = 0; i < groups.size(); ++i) {
          if (changed < groups.size() ? i != changed : majority && i + 1 == groups.size()) continue;
          k.mismatch_minority.insert(k.mismatch_minority.end(), groups[i].first.begin(), groups[i].first.end());
        }
        std::sort(k.mismatch_minority.begin(), k.mismatch_minority.end());
        if (!groups.empty()) {  // on the clock of the smallest group's (or the changed side's) first rank
          const auto& g = changed < groups.size() ? groups[changed] : groups.front();
          k.mismatch_t = g.second->t;
          k.mismatch_t_rank = g.first.front();
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
    if (r.schema > schema::kRunLogVersion) {
      s.warnings.push_back(fmt::format("rank {}: run-log schema {} (this reader knows {}): newer fields are ignored",
                                       r.rank, r.schema, schema::kRunLogVersion));
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

// run.json: the world size (to name missing ranks) and the start time.
void read_run_json(const std::string& run_dir, RunSummary& out) {
  std::error_code ec;
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  std::int64_t w = 0;
  if (is_regular_file(schema::run_json_path(run_dir)) && p.load(schema::run_json_path(run_dir)).get(doc) == simdjson::SUCCESS) {
    if (doc[schema::field_name(schema::Field::kWorldSize)].get_int64().get(w) == simdjson::SUCCESS) {
      if (w > 0 && w <= (1 << 20)) out.world_size = static_cast<int>(w);
      else out.warnings.push_back(fmt::format("run.json: world_size {} is not a world size; ignored", w));
    }
    if (doc[schema::field_name(schema::Field::kStartTimeNs)].get_uint64().get(out.start_time_ns) != simdjson::SUCCESS) out.start_time_ns = 0;
  } else if (std::filesystem::exists(schema::run_json_path(run_dir), ec)) {
    out.warnings.push_back("run.json is unreadable: world size unknown, missing ranks cannot be named");
  }
}

struct RankFile {
  int rank;
  std::string path;
  std::uint64_t bytes;
};

// The run's rank-<R>.jsonl files, by rank.
std::vector<RankFile> rank_files(const std::string& run_dir) {
  std::error_code ec;
  std::vector<RankFile> files;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto parsed = schema::rank_of_run_log(name);
    if (!parsed) continue;
    files.push_back({*parsed, entry.path().string(), static_cast<std::uint64_t>(entry.file_size(ec))});
  }
  std::sort(files.begin(), files.end(), [](const RankFile& a, const RankFile& b) { return a.rank < b.rank; });
  return files;
}

// Every file digested and merged, the reference rank's first (every other
// rank's clock is compared with it), then the rest on up to opts.threads threads.
std::vector<RankDigest> digest_files(const std::string& run_dir, const std::vector<RankFile>& files,
                                     const SummaryOptions& opts, CollectiveMerger& merger) {
  SummaryOptions::Progress progress{0, files.size(), 0, 0};
  for (const auto& f : files) progress.bytes_total += f.bytes;
  std::mutex progress_mu;
  std::vector<RankDigest> digests(files.size());
  auto work = [&](std::size_t i) {
    digests[i] = digest::digest_rank(files[i].path, schema::flight_path(run_dir, files[i].rank), files[i].rank, opts);
    RankDigest& d = digests[i];
    if (d.status.ok()) d.sum.clock_offset_ms = merger.merge(files[i].rank, d.colls);
    if (d.status.ok()) d.sum.torch_flight = read_torch_flight(schema::torch_flight_path(run_dir, files[i].rank), d.sum.pid);
    d.colls.clear();
    if (opts.progress) {
      std::lock_guard<std::mutex> lock(progress_mu);
      ++progress.files_done;
      progress.bytes_done += files[i].bytes;
      opts.progress(progress);
    }
  };
  work(0);
  if (digests[0].status.ok()) digests[0].sum.clock_offset_ms = 0.0;
  parallel_for(1, files.size(), opts.threads > 0 ? static_cast<unsigned>(opts.threads) : 0u, work);
  return digests;
}

// The digests' ranks, facts and violations into the summary; an unreadable
// file is a warning, the other ranks stay.
void collect(std::vector<RankDigest>& digests, RunSummary& out) {
  for (auto& d : digests) {
    if (!d.status.ok()) {
      out.warnings.push_back(fmt::format("rank {}: {}", d.sum.rank, std::string(d.status.message())));
      continue;
    }
    out.facts.insert(out.facts.end(), std::make_move_iterator(d.facts.begin()), std::make_move_iterator(d.facts.end()));
    out.violations.insert(out.violations.end(), std::make_move_iterator(d.violations.begin()),
                          std::make_move_iterator(d.violations.end()));
    out.ranks.push_back(std::move(d.sum));
  }
}

// Clock skew per host (median of its ranks' offsets against the reference).
void add_clock_skew(RunSummary& out) {
  std::map<std::string, std::vector<double>> by_host;
  for (const auto& r : out.ranks) {
    if (r.clock_offset_ms) by_host[r.host].push_back(*r.clock_offset_ms);
  }
  for (auto& [host, offs] : by_host) {
    const int n = static_cast<int>(offs.size());
    const double m = median_in_place(offs);
    if (std::fabs(m) > RunSummary::kSkewReportMs) out.skew.push_back({host, m, n});
  }
}

}  // namespace

std::uint64_t run_start_time(const std::string& run_dir) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  std::uint64_t t = 0;
  if (is_regular_file(schema::run_json_path(run_dir)) && p.load(schema::run_json_path(run_dir)).get(doc) == simdjson::SUCCESS &&
      doc[schema::field_name(schema::Field::kStartTimeNs)].get_uint64().get(t) != simdjson::SUCCESS) {
    t = 0;
  }
  return t;
}

absl::StatusOr<RunSummary> summarize_run(const std::string& run_dir, const SummaryOptions& opts) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("'", run_dir, "' is not a run directory"));
  }
  RunSummary out;
  out.run_dir = run_dir;
  read_run_json(run_dir, out);
  const std::vector<RankFile> files = rank_files(run_dir);
  if (files.empty()) return absl::NotFoundError(absl::StrCat("no rank-<R>.jsonl files in '", run_dir, "'"));
  CollectiveMerger merger(files.front().rank);
  out.reference_rank = files.front().rank;
  std::vector<RankDigest> digests = digest_files(run_dir, files, opts, merger);
  collect(digests, out);
  if (out.ranks.empty()) return absl::DataLossError(absl::StrCat("no readable rank log in '", run_dir, "'"));
  for (int rk = 0; rk < out.world_size; ++rk) {
    if (std::none_of(out.ranks.begin(), out.ranks.end(), [&](const auto& r) { return r.rank == rk; })) {
      out.missing_ranks.push_back(rk);
    }
  }
  out.communicators = merger.checks();
  add_clock_skew(out);
  add_warnings(out);
  return out;
}

void PhaseSeries::coarsen_to(std::int64_t b) {
  while (block_steps < b) {
    // Pairs of blocks (2i, 2i+1) merge into block i; the absolute index
    // decides the pairing, so every rank's blocks still line up.
    // Steps are never negative (add() takes only those), so neither are indices.
    std::vector<Block> merged;
    const std::int64_t first = first_block / 2;
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      const auto to = static_cast<std::size_t>((first_block + static_cast<std::int64_t>(j)) / 2 - first);
      if (merged.size() <= to) merged.resize(to + 1);
      merged[to].merge(blocks[j]);
    }
    blocks = std::move(merged);
    first_block = first;
    block_steps *= 2;
  }
}

void PhaseSeries::Block::merge(const Block& o) {
  for (int k = 0; k < kPhaseKindCount; ++k) ms[k] += o.ms[k];
  total_ms += o.total_ms;
  samples += o.samples;
  tokens += o.tokens;
  steps += o.steps;
  loss += o.loss;
  lr += o.lr;
  grad_norm += o.grad_norm;
  loss_n += o.loss_n;
  lr_n += o.lr_n;
  grad_norm_n += o.grad_norm_n;
}

PhaseSeries::Block& PhaseSeries::block_for(std::int64_t step) {
  if (blocks.empty()) first_block = step / block_steps;
  // A step before the first block (a restart that went back further): widen
  // the blocks until it fits in front, bounded like the rest.
  while (step / block_steps < first_block &&
         static_cast<std::size_t>(first_block - step / block_steps) + blocks.size() > kMaxBlocks) {
    coarsen_to(block_steps * 2);
  }
  if (step / block_steps < first_block) {
    blocks.insert(blocks.begin(), static_cast<std::size_t>(first_block - step / block_steps), Block{});
    first_block = step / block_steps;
  }
  while (static_cast<std::size_t>(step / block_steps - first_block) >= kMaxBlocks) coarsen_to(block_steps * 2);
  const auto j = static_cast<std::size_t>(step / block_steps - first_block);
  if (j >= blocks.size()) blocks.resize(j + 1);
  return blocks[j];
}

void PhaseSeries::Block::put(const Scalars& s) {
  auto one = [](const std::optional<double>& v, float& sum, std::uint32_t& n) {
    if (v) sum += static_cast<float>(*v), ++n;
  };
  one(s.loss, loss, loss_n);
  one(s.lr, lr, lr_n);
  one(s.grad_norm, grad_norm, grad_norm_n);
}

void PhaseSeries::add(std::int64_t step, const double (&ms)[kPhaseKindCount], double total_ms, double samples,
                      double tokens, const Scalars& scalars) {
  if (step < 0) return;
  Block& b = block_for(step);
  for (int k = 0; k < kPhaseKindCount; ++k) b.ms[k] += static_cast<float>(ms[k]);
  b.total_ms += static_cast<float>(total_ms);
  b.samples += static_cast<float>(samples);
  b.tokens += static_cast<float>(tokens);
  ++b.steps;
  b.put(scalars);
}

void PhaseSeries::add_scalars(std::int64_t step, const Scalars& scalars) {
  // Only into a block that holds steps (the step_end came first): a late value
  // must not reshape the series (a block made, the series coarsened).
  if (step < 0 || blocks.empty()) return;
  const std::int64_t j = step / block_steps - first_block;
  if (j >= 0 && j < static_cast<std::int64_t>(blocks.size()) && blocks[static_cast<std::size_t>(j)].steps > 0) {
    blocks[static_cast<std::size_t>(j)].put(scalars);
  }
}

}  // namespace rankscope::reader
