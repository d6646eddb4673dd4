// Triage from resource snapshots (resources.hpp): critical GPU errors as
// findings, and evidence for the others - a hung rank whose GPU is busy at
// low power is spinning in a communication kernel, not computing; a rank that
// vanished while its host ran out of memory was likely OOM-killed; a
// straggler whose GPU throttles is slow because of its hardware; a rank slow
// or stuck while its host was under I/O, memory or CPU pressure, or while its
// host retransmitted TCP segments or its NIC or RDMA port counted errors, was
// held up by its node or its link; one whose GPU's PCIe or NVLink links retried,
// by its device. A GPU's uncorrectable ECC errors are a finding of their own.
#include <algorithm>
#include <cmath>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "absl/strings/str_join.h"

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

// The shape of a rank's resident memory over its snapshots: a steady ramp
// (a leak: it never comes back down), periodic spikes that come back (host
// staging - a checkpoint's copy, an evaluation pass), or neither.
struct MemoryShape {
  enum Kind { kNeither, kRamp, kSpikes } kind = kNeither;
  double first = 0, last = 0, peak = 0, usual = 0;  // bytes; usual: the median
  double per_hour = 0;                              // the ramp's rate
  int spikes = 0;
  const ResourcePoint* from = nullptr;
  const ResourcePoint* to = nullptr;
};
MemoryShape memory_shape(const RankSummary& r) {
  std::vector<const ResourcePoint*> pts;
  for (const auto& p : r.resources) {
    if (p.get(F::kRssBytes)) pts.push_back(&p);
  }
  if (r.last_resources && r.last_resources->get(F::kRssBytes) && (pts.empty() || r.last_resources->t > pts.back()->t)) {
    pts.push_back(&*r.last_resources);
  }
  MemoryShape m;
  if (pts.size() < 6) return m;
  std::vector<double> v;
  for (const ResourcePoint* p : pts) v.push_back(*p->get(F::kRssBytes));
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  m.first = v.front();
  m.last = v.back();
  m.peak = sorted.back();
  m.usual = sorted[sorted.size() / 2];
  m.from = pts.front();
  m.to = pts.back();
  constexpr double kMiB512 = 512.0 * 1024 * 1024;
  // A ramp: up by a fifth and 512 MiB, rising between most snapshots, the last third entirely
  // above the first, and still rising in the second half (a warm-up that grows the caches and
  // then levels off is not a leak).
  const std::size_t third = v.size() / 3;
  int rising = 0;
  for (std::size_t i = 1; i < v.size(); ++i) rising += v[i] > v[i - 1];
  const bool still_rising = v.back() - v[v.size() / 2] >= 0.25 * (v.back() - v.front());
  const double first_max = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(third));
  const double last_min = *std::min_element(v.end() - static_cast<std::ptrdiff_t>(third), v.end());
  const double hours = static_cast<double>(m.to->t - m.from->t) / 3.6e12;
  if (m.last >= 1.2 * m.first && m.last - m.first >= kMiB512 && rising >= 0.6 * static_cast<double>(v.size() - 1) &&
      last_min > first_max && still_rising && hours > 0) {
    m.kind = MemoryShape::kRamp;
    m.per_hour = (m.last - m.first) / hours;
    return m;
  }
  // Spikes: up by half and 512 MiB over the usual, at least twice, and back by the end.
  const double bar = std::max(1.5 * m.usual, m.usual + kMiB512);
  bool above = false;
  for (double x : v) {
    if (x >= bar && !above) ++m.spikes;
    above = x >= bar;
  }
  if (m.spikes >= 2 && m.last <= 1.25 * m.usual) m.kind = MemoryShape::kSpikes;
  return m;
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
  const MemoryShape shape = memory_shape(r);
  std::string own;
  if (shape.kind == MemoryShape::kRamp) {
    own = fmt::format(", its own resident memory grew steadily {} -> {} ({}/h: a leak)", gib(shape.first), gib(shape.last),
                      gib(shape.per_hour));
  } else if (shape.kind == MemoryShape::kSpikes) {
    own = fmt::format(", its own resident memory spiked {} times to as much as {} and came back to {} (host staging: a "
                      "checkpoint's copy, an evaluation pass)", shape.spikes, gib(shape.peak), gib(shape.usual));
  } else if (rss && rss0 && *rss > *rss0) {
    own = fmt::format(", its own resident memory grew {} -> {}", gib(*rss0), gib(*rss));
  }
  return fmt::format("rank {}: likely killed by the OOM killer: {} by its last snapshot{}", r.rank, host, own);
}

// A rank's snapshots from `step` on (a hang's or stall's: its last), the worst
// value of `f` among them.
std::optional<double> worst_from(const RankSummary& r, std::int64_t step, F f) {
  std::optional<double> worst;
  for (const auto& p : r.resources) {
    if (p.step < step) continue;
    if (const auto v = p.get(f); v && (!worst || *v > *worst)) worst = v;
  }
  if (const ResourcePoint* end = at_end(r); end != nullptr) {
    if (const auto v = end->get(f); v && (!worst || *v > *worst)) worst = v;
  }
  return worst;
}

// Pressure stall information past these is a node holding its tasks up (avg10,
// 0-1): I/O 20 % some or 5 % full; memory 10 % some or 2 % full; CPU 50 % some.
struct Pressure {
  const char* what;   // "I/O"
  F some, full;       // full: F::kCount where the kernel has none (cpu)
  double some_bar, full_bar;
  const char* waited;  // "waited on I/O"
  const char* next;
};
constexpr Pressure kPressures[] = {
    {"I/O", F::kPsiIo, F::kPsiIoFull, 0.20, 0.05, "waited on I/O",
     "its disk may have held it up (a checkpoint write, swapping, another job's I/O): look at what writes on"},
    {"memory", F::kPsiMem, F::kPsiMemFull, 0.10, 0.02, "waited for memory",
     "reclaim or swapping may have held it up: look at what uses the memory of"},
    {"CPU", F::kPsiCpu, F::kCount, 0.50, 0.0, "waited for a CPU",
     "its cores are oversubscribed (data-loader workers, another job): look at what runs on"},
};

std::vector<std::string> pressure_evidence(const RunSummary& s, const RankSummary& r, std::int64_t step) {
  std::vector<std::string> out;
  const std::string host = r.host.empty() ? std::string("its host") : r.host;
  const bool other_hosts =
      std::any_of(s.ranks.begin(), s.ranks.end(), [&](const RankSummary& o) { return o.host != r.host; });
  for (const Pressure& p : kPressures) {
    const auto some = worst_from(r, step, p.some);
    const auto full = p.full == F::kCount ? std::nullopt : worst_from(r, step, p.full);
    if (!(some && *some >= p.some_bar) && !(full && *full >= p.full_bar)) continue;
    double others = 0;  // the other hosts, for contrast
    for (const auto& o : s.ranks) {
      if (o.host != r.host) others = std::max(others, worst_from(o, step, p.some).value_or(0));
    }
    std::string detail;
    if (p.some == F::kPsiIo) {
      const auto dirty = worst_from(r, step, F::kMemDirty), wb = worst_from(r, step, F::kMemWriteback);
      const auto blocked = worst_from(r, step, F::kProcsBlocked);
      if (dirty || wb) detail += fmt::format(", {} dirty + {} writeback", gib(dirty.value_or(0)), gib(wb.value_or(0)));
      if (blocked && *blocked > 0) detail += fmt::format(", {:.0f} process(es) blocked on I/O", *blocked);
    }
    out.push_back(fmt::format(
        "rank {}'s host {} was under {} pressure from step {}: some task {} {:.0f} % of the last 10 s (PSI {} some "
        "avg10{}){}{}; {} {}",
        r.rank, host, p.what, step, p.waited, 100 * some.value_or(0),
        p.some == F::kPsiIo ? "io" : p.some == F::kPsiMem ? "memory" : "cpu",
        full ? fmt::format("; every task {:.0f} %", 100 * *full) : std::string(), detail,
        other_hosts ? fmt::format(", the other ranks' hosts at most {:.0f} %", 100 * others) : std::string(), p.next,
        host));
  }
  return out;
}

// "a", "a and b", "a, b and c".
std::string and_list(const std::vector<std::string>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

// Counters a rank's snapshots carry from `step` on: the increase of each
// since the last snapshot before it (or the first one), to the last.
struct Increase {
  const ResourcePoint* base = nullptr;
  const ResourcePoint* last = nullptr;
  double of(F f) const {
    if (base == nullptr || last == nullptr) return 0;
    const auto a = base->get(f), b = last->get(f);
    return a && b && *b >= *a ? *b - *a : 0.0;
  }
  explicit operator bool() const { return base != nullptr && last != nullptr && base != last; }
};
Increase increase_from(const RankSummary& r, std::int64_t step) {
  std::vector<const ResourcePoint*> points;
  for (const auto& p : r.resources) points.push_back(&p);
  if (r.last_resources && (points.empty() || r.last_resources->t > points.back()->t)) points.push_back(&*r.last_resources);
  Increase inc;
  for (const ResourcePoint* p : points) {
    if (p->step < step) inc.base = p;
    else inc.last = p;
  }
  if (inc.base == nullptr && !points.empty() && points.front() != inc.last) inc.base = points.front();
  return inc;
}

// A degraded link or a congested path under its collectives (gloo and NCCL's
// socket transport run over TCP, NCCL's IB/RoCE transport over RDMA), from
// `step` on: 1 % of the TCP segments retransmitted (and 50 at least) or 5
// retransmission timeouts; 10 NIC errors; 10 RDMA port errors, a link that went
// down, or 10 RDMA transport retries. Drops and congestion notifications alone
// are a busy network, not a broken one: they are only said alongside.
std::string link_evidence(const RankSummary& r, std::int64_t step) {
  const Increase inc = increase_from(r, step);
  if (!inc) return {};
  const double sent = inc.of(F::kTcpOutSegs), retrans = inc.of(F::kTcpRetransSegs), timeouts = inc.of(F::kTcpTimeouts);
  const double nic_errors = inc.of(F::kNetErrors), drops = inc.of(F::kNetDrops);
  const double port_errors = inc.of(F::kRdmaPortErrors), downed = inc.of(F::kRdmaLinkDowned);
  const double retries = inc.of(F::kRdmaRetries), cnp = inc.of(F::kRdmaCnp);
  std::vector<std::string> what;
  if ((retrans >= 50 && retrans >= 0.01 * sent) || timeouts >= 5) {
    what.push_back(fmt::format("retransmitted {:.1f} % of its TCP segments ({:.0f} of {:.0f}; {:.0f} retransmission "
                               "timeout(s))", sent > 0 ? 100 * retrans / sent : 0.0, retrans, sent, timeouts));
  }
  if (nic_errors >= 10) what.push_back(fmt::format("counted {:.0f} NIC error(s)", nic_errors));
  const bool rdma = port_errors >= 10 || downed >= 1 || retries >= 10;
  if (downed >= 1) what.push_back(fmt::format("had an RDMA link go down {:.0f} time(s)", downed));
  if (port_errors >= 10) what.push_back(fmt::format("counted {:.0f} RDMA port error(s) (symbol, receive, integrity)", port_errors));
  if (retries >= 10) what.push_back(fmt::format("made {:.0f} RDMA transport retries (ACK timeouts, out of sequence)", retries));
  if (what.empty()) return {};
  if (drops >= 1) what.push_back(fmt::format("dropped {:.0f} packet(s)", drops));
  if (cnp >= 1) what.push_back(fmt::format("saw {:.0f} congestion notification(s)", cnp));
  const std::string said = and_list(what);
  const std::string host = r.host.empty() ? std::string("its host") : r.host;
  return fmt::format("rank {}'s host {} {} from step {} - a degraded link or a congested path under its collectives: "
                     "check {}",
                     r.rank, host, said, step,
                     rdma ? "its HCA port and cable (ibstat, perfquery -x, the switch port's error counters)"
                          : "its NIC and switch port (ethtool -S, the switch's error counters)");
}

// The GPU's own links: PCIe replays (the link layer resending), NVLink CRC,
// replay and recovery errors, corrected ECC errors climbing (a cell wearing
// out, a precursor of uncorrectable ones) - a slow device, not a slow program.
std::string gpu_link_evidence(const RankSummary& r, std::int64_t step) {
  const Increase inc = increase_from(r, step);
  if (!inc) return {};
  const double replays = inc.of(F::kGpuPcieReplays), nvlink = inc.of(F::kGpuNvlinkErrors);
  const double corrected = inc.of(F::kGpuEccCorrected);
  std::vector<std::string> what;
  if (replays >= 100) what.push_back(fmt::format("{:.0f} PCIe replays", replays));
  if (nvlink >= 10) what.push_back(fmt::format("{:.0f} NVLink errors (CRC, replay, recovery)", nvlink));
  if (corrected >= 100) what.push_back(fmt::format("{:.0f} corrected ECC errors", corrected));
  if (what.empty()) return {};
  const std::string said = and_list(what);
  const int gpu = static_cast<int>(inc.last->get(F::kGpu).value_or(-1));
  return fmt::format("rank {}'s GPU {}{} counted {} from step {}: its links or memory are failing and retrying - have the "
                     "node checked (nvidia-smi -q -d PCIE,ECC; nvidia-smi nvlink -e) and drain it if they keep rising",
                     r.rank, gpu, r.host.empty() ? "" : fmt::format(" on {}", r.host), said, step);
}

// A rank's typical value of `f`: the median of its periodic snapshots (start,
// stall and end ones describe moments, not the run).
std::optional<double> typical(const RankSummary& r, F f) {
  std::vector<double> v;
  for (const auto& p : r.resources) {
    if (p.reason != "interval") continue;
    if (const auto x = p.get(f)) v.push_back(*x);
  }
  if (v.empty()) return std::nullopt;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// The odd GPU out: a rank whose GPU ran at a clearly lower SM clock (15 %) or
// hotter (10 °C) than the median of the other ranks' GPUs - a slower device,
// whether or not NVML gave a throttle reason.
std::string odd_gpu_evidence(const RunSummary& s, const RankSummary& r) {
  const auto clock = typical(r, F::kGpuSmClock), temp = typical(r, F::kGpuTemp);
  if (!clock && !temp) return {};
  std::vector<double> clocks, temps;
  for (const auto& o : s.ranks) {
    if (o.rank == r.rank) continue;
    if (const auto c = typical(o, F::kGpuSmClock)) clocks.push_back(*c);
    if (const auto t = typical(o, F::kGpuTemp)) temps.push_back(*t);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  std::vector<std::string> what;
  if (clock && !clocks.empty() && *clock <= 0.85 * median(clocks)) {
    what.push_back(fmt::format("SM clock {:.2f} GHz against the others' {:.2f} GHz", *clock / 1e9, median(clocks) / 1e9));
  }
  if (temp && !temps.empty() && *temp >= median(temps) + 10) {
    what.push_back(fmt::format("{:.0f} °C against {:.0f} °C", *temp, median(temps)));
  }
  if (what.empty()) return {};
  const std::size_t peers = std::max(clocks.size(), temps.size());
  const ResourcePoint* last = at_end(r);
  const int gpu = last != nullptr ? static_cast<int>(last->get(F::kGpu).value_or(-1)) : -1;
  const std::string host = r.host.empty() ? std::string("its node") : r.host;
  return fmt::format("rank {}'s GPU {}{} is the odd one out: {} (medians over the run; the others: {} GPU(s)) - a slower "
                     "device, not a slower program: look at {}'s cooling and power (nvidia-smi -q -d "
                     "CLOCK,TEMPERATURE,PERFORMANCE) and cordon it if it persists",
                     r.rank, gpu, r.host.empty() ? "" : fmt::format(" on {}", r.host), absl::StrJoin(what, ", "), peers,
                     host);
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

namespace {
// The XID that decides what to do with the node: a reboot before a drain
// before an unknown code before the program's own fault.
int xid_severity(std::string_view action) {
  return action == "reboot" ? 3 : action == "drain" ? 2 : action == "application" ? 0 : 1;
}

// From the rank's `xid` lines: the code, what it means (the writer's words,
// from NVIDIA's catalog) and the next step on this node.
Finding xid_finding(const RankSummary& r) {
  const XidRecord* worst = &r.xids.front();
  std::map<std::uint64_t, int> codes;
  for (const auto& x : r.xids) {
    ++codes[x.code];
    if (xid_severity(x.action) > xid_severity(worst->action)) worst = &x;
  }
  // "XID 79 on GPU 1: the GPU fell off the bus ...: reboot the node" -> what follows the first ": ".
  std::string_view what = worst->message;
  if (const auto colon = what.find(": "); colon != std::string_view::npos) what.remove_prefix(colon + 2);
  const std::string host = r.host.empty() ? std::string("its host") : r.host;
  std::string next, next_step;
  if (worst->action == "reboot" || worst->action == "drain") {
    next = fmt::format(" ({}) before relaunching on it", host);
    next_step = worst->action == "reboot"
                    ? fmt::format("reboot {} before relaunching on it; drain it if the XID comes back", host)
                    : fmt::format("drain {} and have its GPU checked (dcgmi diag -r 3) before relaunching on it", host);
  } else if (worst->action == "application") {
    next = "; do not drain the node: fix the program (compute-sanitizer names the bad access)";
    next_step = "fix the program, not the node: run the failing step under compute-sanitizer to name the bad access";
  } else {
    next = fmt::format("; nvidia-smi -q and the kernel log of {} say more", host);
  }
  Finding f{FindingKind::kGpuError, {r.rank},
            fmt::format("rank {}: its GPU {} reported XID {} at step {}: {}{}", r.rank, worst->gpu, worst->code,
                        worst->step, what, next),
            {}, aligned(r, worst->t), worst->step, {worst->line}, next_step};
  std::string all;
  for (const auto& [code, n] : codes) {
    all += fmt::format("{}XID {}{}", all.empty() ? "" : ", ", code, n > 1 ? fmt::format(" x{}", n) : "");
  }
  f.evidence.push_back(fmt::format("{} critical XID error(s) on rank {}'s GPU: {}{}", r.xid_count, r.rank, all,
                                   r.xid_count > r.xids.size() ? " (the first 8 read)" : ""));
  return f;
}
}  // namespace

namespace {
// Uncorrectable ECC errors that appeared during the run (the volatile count
// since the driver loaded rose between two snapshots): the GPU's memory lost
// data - the run's results from then on are suspect and the node is to be
// drained. Empty when the count never rose.
std::string ecc_rise(const RankSummary& r, const ResourcePoint** onset) {
  std::optional<double> before;
  double first = 0, now = 0;
  auto visit = [&](const ResourcePoint& p) {
    const auto v = p.get(F::kGpuEcc);
    if (!v) return;
    if (!before) first = *v;
    else if (*v > *before && *onset == nullptr) *onset = &p;
    before = v;
    now = *v;
  };
  for (const auto& p : r.resources) visit(p);
  if (r.last_resources && (r.resources.empty() || r.last_resources->t > r.resources.back().t)) visit(*r.last_resources);
  if (*onset == nullptr) return {};
  return fmt::format("{:.0f} uncorrectable ECC error(s) on rank {}'s GPU during the run ({:.0f} -> {:.0f}, the volatile "
                     "count since the driver loaded)", now - first, r.rank, first, now);
}
}  // namespace

void gpu_error_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (const auto& r : in.sum.ranks) {
    const ResourcePoint* ecc_onset = nullptr;
    const std::string ecc = ecc_rise(r, &ecc_onset);
    if (!r.xids.empty()) {
      out.push_back(xid_finding(r));
      if (!ecc.empty()) out.back().evidence.push_back(ecc);
      continue;
    }
    if (!ecc.empty()) {
      const std::string host = r.host.empty() ? std::string("its host") : r.host;
      Finding f{FindingKind::kGpuError, {r.rank},
                fmt::format("rank {}: its GPU {} counted uncorrectable ECC errors by step {}: its memory lost data, so "
                            "what the rank computed since is suspect; drain the node ({}), have the GPU reset or "
                            "replaced, and resume from a checkpoint saved before",
                            r.rank, static_cast<int>(ecc_onset->get(F::kGpu).value_or(-1)), ecc_onset->step, host),
                {ecc}, ecc_onset->t, ecc_onset->step, {},
                fmt::format("drain {}, have the GPU reset or replaced, and resume from a checkpoint saved before step {}",
                            host, ecc_onset->step)};
      out.push_back(std::move(f));
      continue;
    }
    // A log without xid lines (older): the resource snapshots' count.
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

void memory_ramp_rule(const TriageInput& in, std::vector<Finding>& out) {
  std::vector<int> ranks;
  std::vector<std::string> evidence;
  const RankSummary* worst = nullptr;
  MemoryShape worst_shape;
  for (const auto& r : in.sum.ranks) {
    const MemoryShape m = memory_shape(r);
    if (m.kind != MemoryShape::kRamp) continue;
    ranks.push_back(r.rank);
    if (evidence.size() < 8) {
      evidence.push_back(fmt::format("rank {}: resident memory {} at step {} -> {} at step {}, rising between most "
                                     "snapshots ({}/h)", r.rank, gib(m.first), m.from->step, gib(m.last), m.to->step,
                                     gib(m.per_hour)));
    }
    if (worst == nullptr || m.per_hour > worst_shape.per_hour) worst = &r, worst_shape = m;
  }
  if (worst == nullptr) return;
  std::string runway;
  if (const auto avail = worst_shape.to->get(F::kMemAvailable); avail && worst_shape.per_hour > 0) {
    runway = fmt::format("; at this rate its host's {} available run out in ~{:.1f} h", gib(*avail),
                         *avail / worst_shape.per_hour);
  }
  out.push_back({FindingKind::kResourceGrowth, ranks,
                 fmt::format("{}: resident memory grows steadily - rank {} {} -> {} from step {} to step {} ({}/h): a "
                             "leak (tensors kept across steps, such as a loss history that holds the graph - keep "
                             "loss.item(); a cache that never evicts){}",
                             format_ranks(ranks), worst->rank, gib(worst_shape.first), gib(worst_shape.last),
                             worst_shape.from->step, worst_shape.to->step, gib(worst_shape.per_hour), runway),
                 evidence, worst_shape.from->t, worst_shape.from->step, {}});
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
      if (f.kind == FindingKind::kStraggler || f.kind == FindingKind::kSlowSteps || f.kind == FindingKind::kThroughput) {
        if (std::string why = odd_gpu_evidence(s, *r); !why.empty()) f.evidence.push_back(std::move(why));
      }
      // Held up by its node or its link: a slow or stuck rank, from where it began.
      const bool slow_or_stuck = f.kind == FindingKind::kStraggler || f.kind == FindingKind::kSlowSteps ||
                                 f.kind == FindingKind::kStall || f.kind == FindingKind::kHang ||
                                 f.kind == FindingKind::kThroughput || f.kind == FindingKind::kDeadRank;
      if (slow_or_stuck) {
        const std::int64_t from = std::max<std::int64_t>(f.step, 0);
        for (std::string& why : pressure_evidence(s, *r, from)) f.evidence.push_back(std::move(why));
        if (std::string why = link_evidence(*r, from); !why.empty()) f.evidence.push_back(std::move(why));
        if (std::string why = gpu_link_evidence(*r, from); !why.empty()) f.evidence.push_back(std::move(why));
      }
    }
  }
}

}  // namespace rankscope::reader::rules
