#include "invariant_rules.hpp"

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "json_util.hpp"
#include "schema.hpp"
#include "rankscope/exchange.hpp"

namespace rankscope::detail {

const std::string* RankFact::find(std::string_view key) const {
  for (const auto& [k, v] : values) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

struct Rules {
  std::string_view check;
  std::vector<std::string_view> agree;  // every rank must hold the same value
  bool fingerprint = false;             // same data group: equal; different groups: distinct
};

const std::vector<Rules>& rules() {
  static const auto* r = new std::vector<Rules>{
      {"batch_math", {"micro_batch", "grad_accum", "data_parallel", "global_batch"}, false},
      {"epoch_batches", {"epoch", "batches"}, false},
      {"sampler", {"seed", "epoch", "shuffle", "num_indices"}, true},
      {"resume", {"id", "step", "consumed_samples", "optimizer_step", "global_batch", "config_hash"}, false},
      {"data", {}, true},
  };
  return *r;
}

int group_of(const RankFact& f) { return f.data_group >= 0 ? f.data_group : f.rank; }

// {"<value>":[ranks],...}: who holds which value.
void values_json(JsonWriter& w, const std::map<std::string, std::vector<int>>& by_value) {
  w.begin_object();
  for (const auto& [v, ranks] : by_value) w.array(v, ranks);
  w.end_object();
}

// One key's disagreement: who holds which value, and the reference value
// (the majority). With no strict majority (two ranks that differ, a 2-2
// split) nobody is the odd one out: every rank is named, no value is the
// reference, and the message says so instead of inventing a culprit.
struct Disagreement {
  std::string key;
  std::map<std::string, std::vector<int>> by_value;
  std::string ref;            // meaningless when tie
  bool tie = false;           // no value holds a strict majority
  std::vector<int> minority;  // every rank not holding ref (all of them on a tie), sorted
};

std::optional<Disagreement> disagreement(std::string_view key, const std::vector<const RankFact*>& facts) {
  Disagreement d;
  d.key = std::string(key);
  for (const RankFact* f : facts) {
    if (const std::string* v = f->find(key)) d.by_value[*v].push_back(f->rank);
  }
  if (d.by_value.size() < 2) return std::nullopt;
  for (auto& [v, ranks] : d.by_value) std::sort(ranks.begin(), ranks.end());
  std::size_t best = 0;
  int best_low = 0;
  for (const auto& [v, ranks] : d.by_value) {
    const int low = *std::min_element(ranks.begin(), ranks.end());
    if (ranks.size() > best || (ranks.size() == best && low < best_low)) {
      d.ref = v;
      best = ranks.size();
      best_low = low;
    }
  }
  std::size_t holders = 0;
  for (const auto& [v, ranks] : d.by_value) holders += ranks.size();
  d.tie = 2 * best <= holders;  // no majority: a tie names everyone
  for (const auto& [v, ranks] : d.by_value) {
    if (d.tie || v != d.ref) d.minority.insert(d.minority.end(), ranks.begin(), ranks.end());
  }
  std::sort(d.minority.begin(), d.minority.end());
  return d;
}

// Keys on which the same ranks disagree become one finding: one root cause
// (rank 2 loaded another checkpoint) reads as one verdict, not four.
void agree(std::string_view check, const std::vector<std::string_view>& keys,
           const std::vector<const RankFact*>& facts, std::string_view scope, std::vector<Finding>& out) {
  std::vector<Disagreement> all;
  for (std::string_view key : keys) {
    if (auto d = disagreement(key, facts)) all.push_back(std::move(*d));
  }
  std::vector<bool> used(all.size(), false);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (used[i]) continue;
    Finding f;
    f.check = std::string(check);
    f.ranks = all[i].minority;
    std::vector<std::string> whats, parts;
    fmt::memory_buffer values;
    JsonWriter w(values);
    w.begin_object();
    for (std::size_t j = i; j < all.size(); ++j) {
      if (used[j] || all[j].minority != f.ranks) continue;
      used[j] = true;
      const Disagreement& d = all[j];
      whats.push_back(d.key);
      std::string others;
      for (const auto& [v, ranks] : d.by_value) {
        if (d.tie || v != d.ref) {
          others += fmt::format("{}{} {} {}", others.empty() ? "" : "; ", format_ranks(ranks),
                                ranks.size() == 1 ? "has" : "have", v);
        }
      }
      if (d.tie) {
        parts.push_back(fmt::format("{} ({}: no majority says which is right)", d.key, others));
      } else {
        const auto& ref_ranks = d.by_value.at(d.ref);
        parts.push_back(fmt::format("{} ({}; {} {} {})", d.key, others, format_ranks(ref_ranks),
                                    ref_ranks.size() == 1 ? "has" : "have", d.ref));
      }
      w.key(d.key);
      values_json(w, d.by_value);
    }
    f.what = fmt::format("{}", fmt::join(whats, ","));
    f.message = fmt::format("{}: {}{} disagree{} on {}", check, scope, format_ranks(f.ranks),
                            f.ranks.size() == 1 ? "s" : "", fmt::join(parts, ", "));
    w.end_object();
    f.values_json = fmt::to_string(values);
    out.push_back(std::move(f));
  }
}

}  // namespace

std::vector<Finding> compare_facts(std::string_view check, const std::vector<RankFact>& facts) {
  std::vector<Finding> out;
  const auto it = std::find_if(rules().begin(), rules().end(), [&](const Rules& r) { return r.check == check; });
  if (it == rules().end() || facts.size() < 2) return out;
  std::vector<const RankFact*> all;
  for (const RankFact& f : facts) all.push_back(&f);
  std::sort(all.begin(), all.end(), [](const RankFact* a, const RankFact* b) { return a->rank < b->rank; });
  agree(check, it->agree, all, "", out);
  if (!it->fingerprint) return out;
  // Within a data group the fingerprints must agree...
  std::map<int, std::vector<const RankFact*>> groups;
  for (const RankFact* f : all) groups[group_of(*f)].push_back(f);
  for (const auto& [g, members] : groups) {
    if (members.size() > 1) agree(check, {"fingerprint"}, members, fmt::format("data group {}: ", g), out);
  }
  // ...and across groups they must differ: two groups reading the same shard.
  std::map<std::string, std::map<int, std::vector<int>>> by_fp;  // fingerprint -> group -> ranks
  for (const RankFact* f : all) {
    if (const std::string* v = f->find("fingerprint")) by_fp[*v][group_of(*f)].push_back(f->rank);
  }
  for (const auto& [fp, by_group] : by_fp) {
    if (by_group.size() < 2) continue;
    Finding f;
    f.check = std::string(check);
    f.what = "identical_shards";
    std::map<std::string, std::vector<int>> vals;
    for (const auto& [g, ranks] : by_group) {
      f.ranks.insert(f.ranks.end(), ranks.begin(), ranks.end());
      vals[fp].insert(vals[fp].end(), ranks.begin(), ranks.end());
    }
    std::sort(f.ranks.begin(), f.ranks.end());
    f.message = fmt::format("{}: {} read identical data (fingerprint {}) although they are in {} different data "
                            "groups: data-parallel ranks must read different shards",
                            check, format_ranks(f.ranks), fp, by_group.size());
    fmt::memory_buffer values;
    JsonWriter w(values);
    w.begin_object().key(schema::Field::kFingerprint);
    values_json(w, vals);
    w.end_object();
    f.values_json = fmt::to_string(values);
    out.push_back(std::move(f));
  }
  return out;
}

Attributes finding_attributes(const Finding& f) {
  Attributes a;
  a.add(schema::field_name(schema::Field::kCheck), std::string_view(f.check)).add(schema::field_name(schema::Field::kWhat), std::string_view(f.what));
  a.add_json(schema::field_name(schema::Field::kRanks), fmt::format("[{}]", fmt::join(f.ranks, ",")));
  if (!f.values_json.empty()) a.add_json(schema::field_name(schema::Field::kValues), f.values_json);
  return a;
}

}  // namespace rankscope::detail
