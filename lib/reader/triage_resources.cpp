// Triage from resource snapshots (resources.hpp): critical GPU errors as
// findings, and evidence for the others - a hung rank whose GPU is busy at
// low power is spinning in a communication kernel, not computing; a rank that
// vanished while its host ran out of memory was likely OOM-killed; a
// straggler whose GPU throttles is slow because of its hardware.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "rankscope/exchange.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {
using F = schema::Field;

const RankSummary* rank_of(const RunSummary& s, int rank) {
  for (const auto& r : s.ranks) {
    if (r.rank == rank) return &r;
  }
  return nullptr;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024)); }

// NVML clock-event reasons that slow a GPU down for its own reasons (not idle, not app clocks).
std::string throttle_names(std::uint64_t bits) {
  static constexpr std::pair<std::uint64_t, const char*> kReasons[] = {
      {0x4, "power cap"}, {0x8, "hardware slowdown"}, {0x20, "software thermal"}, {0x40, "hardware thermal"},
      {0x80, "power brake"}};
  std::string out;
  for (const auto& [bit, name] : kReasons) {
    if (bits & bit) out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  }
  return out;
}

// The snapshot that describes a rank at its end: its stall snapshot if it has one, else its last.
const ResourcePoint* at_end(const RankSummary& r) {
  for (auto it = r.resources.rbegin(); it != r.resources.rend(); ++it) {
    if (it->reason == "stall") return &*it;
  }
  return r.last_resources ? &*r.last_resources : nullptr;
}

// A rank that vanished while its host ran out of memory, or while the host's
// available memory was falling fast (snapshots are ~30 s apart: the last one
// may predate the kill), was likely OOM-killed.
std::string oom_evidence(const RankSummary& r, const ResourcePoint& last) {
  const auto avail = last.get(F::kMemAvailable), total = last.get(F::kMemTotal), rss = last.get(F::kRssBytes);
  if (!avail || !total || *total <= 0) return {};
  const ResourcePoint* first = r.resources.empty() ? nullptr : &r.resources.front();
  const std::optional<double> avail0 = first ? first->get(F::kMemAvailable) : std::nullopt;
  const std::optional<double> rss0 = first ? first->get(F::kRssBytes) : std::nullopt;
  const bool low = *avail < 0.1 * *total;
  const bool falling = avail0 && *avail0 - *avail >= 0.25 * *total && *avail < 0.25 * *total;
  if (!low && !falling) return {};
  const std::string host = avail0 && *avail0 > *avail
                               ? fmt::format("its host's available memory fell {} -> {} (of {})", gib(*avail0), gib(*avail), gib(*total))
                               : fmt::format("its host had {} of {} memory available", gib(*avail), gib(*total));
  return fmt::format("rank {}: likely killed by the OOM killer: {} by its last snapshot{}", r.rank, host,
                     rss && rss0 && *rss > *rss0 ? fmt::format(", its own resident memory grew {} -> {}", gib(*rss0), gib(*rss)) : "");
}

std::uint64_t throttle_bits(const RankSummary& r) {
  std::uint64_t bits = 0;
  for (const auto& q : r.resources) bits |= static_cast<std::uint64_t>(q.get(F::kGpuThrottle).value_or(0));
  return bits;
}

// A straggler whose GPU throttles is slow because of its hardware; when the
// other throttling GPUs share its host, the node (cooling, power) is the cause.
std::string throttle_evidence(const RunSummary& s, const RankSummary& r, const ResourcePoint& last) {
  const std::string why = throttle_names(throttle_bits(r));
  if (why.empty()) return {};
  std::vector<int> same_host, elsewhere;
  for (const auto& o : s.ranks) {
    if (o.rank == r.rank || throttle_names(throttle_bits(o)).empty()) continue;
    (o.host == r.host ? same_host : elsewhere).push_back(o.rank);
  }
  std::string node;
  if (!same_host.empty() && elsewhere.empty()) {
    node = fmt::format("; every other throttling GPU ({}) is on the same host: look at that node's cooling and power",
                       format_ranks(same_host));
  }
  return fmt::format("rank {}: its GPU {}{} throttled its clocks ({}){}", r.rank, static_cast<int>(last.get(F::kGpu).value_or(-1)),
                     r.host.empty() ? "" : fmt::format(" on {}", r.host), why, node);
}
}  // namespace

void gpu_error_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (const auto& r : in.sum.ranks) {
    const ResourcePoint* first = nullptr;
    for (const auto& p : r.resources) {
      if (p.get(F::kGpuXid).value_or(0) > 0) {
        first = &p;
        break;
      }
    }
    if (first == nullptr && r.last_resources && r.last_resources->get(F::kGpuXid).value_or(0) > 0) first = &*r.last_resources;
    if (first == nullptr) continue;
    const double n = r.last_resources ? r.last_resources->get(F::kGpuXid).value_or(1) : 1;
    Finding f{FindingKind::kGpuError, {r.rank},
              fmt::format("rank {}: its GPU {} reported {:.0f} critical XID error(s), the first by step {}: a GPU or "
                          "driver fault (nvidia-smi -q and the kernel log name the XID); replace or reset the GPU "
                          "before relaunching",
                          r.rank, static_cast<int>(first->get(F::kGpu).value_or(-1)), n, first->step),
              {}, first->t, first->step, {}};
    out.push_back(std::move(f));
  }
}

void add_resource_evidence(const TriageInput& in, std::vector<Finding>& findings) {
  const RunSummary& s = in.sum;
  std::vector<double> powers;
  for (const auto& r : s.ranks) {
    for (const auto& p : r.resources) {
      if (p.reason == "interval") {
        if (auto w = p.get(F::kGpuPower)) powers.push_back(*w);
      }
    }
  }
  // A computing GPU's power: the 90th percentile of the run's snapshots (a
  // median would be pulled down by the ranks that spent the run waiting).
  std::sort(powers.begin(), powers.end());
  const double usual_power = powers.empty() ? 0 : powers[powers.size() * 9 / 10];
  for (Finding& f : findings) {
    if (f.kind == FindingKind::kHang || f.kind == FindingKind::kStall) {
      // The ranks waiting in a collective keep their GPUs busy spinning, at low power.
      std::string spinning;
      int n = 0;
      for (const auto& r : s.ranks) {
        const ResourcePoint* p = at_end(r);
        const auto util = p ? p->get(F::kGpuUtil) : std::nullopt, power = p ? p->get(F::kGpuPower) : std::nullopt;
        if (util && power && *util >= 0.9 && usual_power > 0 && *power < 0.5 * usual_power && n++ < 8) {
          spinning += fmt::format("{}rank {} ({:.0f} % at {:.0f} W)", spinning.empty() ? "" : ", ", r.rank, 100 * *util, *power);
        }
      }
      if (n > 0) {
        f.evidence.push_back(fmt::format("GPUs busy at low power when the ranks stopped (a computing GPU of this run: {:.0f} W): {}{} - "
                                         "a kernel spinning, as a collective waiting for a peer does, not computing",
                                         usual_power, spinning, n > 8 ? fmt::format(" and {} more", n - 8) : ""));
      }
    }
    for (int rank : f.ranks) {
      const RankSummary* r = rank_of(s, rank);
      const ResourcePoint* p = r != nullptr ? at_end(*r) : nullptr;
      if (p == nullptr) continue;
      if (f.kind == FindingKind::kDeadRank) {
        if (std::string why = oom_evidence(*r, *p); !why.empty()) f.evidence.push_back(std::move(why));
      }
      if (f.kind == FindingKind::kStraggler) {
        if (std::string why = throttle_evidence(s, *r, *p); !why.empty()) f.evidence.push_back(std::move(why));
      }
    }
  }
}

}  // namespace rankscope::reader::rules
