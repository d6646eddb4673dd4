// rankscope_synth_run: writes a synthetic run directory in the run-log schema
// (run.json, rank-<R>.jsonl, heartbeat files) with any number of ranks and
// steps, about 10 events per rank per step, and optional injected faults.
// Used by the triage scale benchmark and by tests that need more ranks than
// this machine can run for real.
//
//   rankscope_synth_run --dir D --ranks 1024 --steps 1000 [--straggler R:STEP]
//     [--hang R:STEP] [--dead R:STEP] [--mismatch R:STEP] [--seed-rank R]
//     [--skew NODE:MS] [--comm-hang STEP] [--corrupt R] [--ranks-per-node 8] [--resources-every STEPS]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace {

struct Fault {
  int rank = -1;
  long step = -1;
};

bool parse_fault(const std::string& s, Fault& f) {
  return s.empty() || std::sscanf(s.c_str(), "%d:%ld", &f.rank, &f.step) == 2;
}

std::uint64_t fnv(std::string_view s, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

struct Options {
  std::string dir;
  int ranks = 4, ranks_per_node = 8, seed_rank = -1, corrupt = -1;
  long steps = 100;
  Fault straggler, hang, dead, mismatch, skew;  // skew: rank = node, step = milliseconds
  long comm_hang = -1;                          // every rank enters this step's all-reduce; none leaves
  double straggler_factor = 3.0;                // the straggler's forward, x the others'
  double noise = 0.0;                           // log-normal sigma on every compute phase, per rank and step
  std::uint64_t noise_seed = 0;
  long resources_every = 0;                     // a resource snapshot every this many steps (0: none)
};

class RankWriter {
 public:
  RankWriter(const Options& o, int rank, std::uint64_t t0, std::vector<std::uint64_t>& slowest)
      : o_(o), rank_(rank), mono_(1'000'000'000'000ull), slowest_(slowest) {
    const int node = rank / o.ranks_per_node;
    skew_ns_ = node == o.skew.rank ? o.skew.step * 1'000'000 : 0;
    wall0_ = t0 + skew_ns_;
    f_ = std::fopen(fmt::format("{}/rank-{}.jsonl", o.dir, rank).c_str(), "w");
  }
  ~RankWriter() {
    if (f_) std::fclose(f_);
  }
  bool ok() const { return f_ != nullptr; }

  // Returns the step it stopped at (steps = finished).
  void run() {
    line("run_start", 0, fmt::format(",\"schema\":1,\"version\":\"0.1.0\",\"world_size\":{},\"local_rank\":{},"
                                     "\"pid\":{},\"launcher\":\"slurm\",\"run_id\":\"synth\",\"host\":\"node-{}\"",
                                     o_.ranks, rank_ % o_.ranks_per_node, 1000 + rank_, rank_ / o_.ranks_per_node));
    fact("batch_math", 0, 0, ",\"micro_batch\":8,\"grad_accum\":1,\"data_parallel\":{0},\"global_batch\":{1}",
         o_.ranks, 8 * o_.ranks);
    const std::uint64_t base = 100'000'000;  // 100 ms step
    const bool hang_culprit = rank_ == o_.hang.rank, dead = rank_ == o_.dead.rank;
    for (long s = 0; s < o_.steps; ++s) {
      if (s % 100 == 0) {
        fact("sampler", s, s / 100, ",\"seed\":{},\"epoch\":{},\"shuffle\":1,\"num_indices\":{}",
             rank_ == o_.seed_rank ? 99 : 1234, s / 100, 100 * o_.ranks);
      }
      if (dead && s == o_.dead.step) {
        std::fputs("{\"kind\":\"phase\",\"t\":17", f_);  // killed mid-write
        return;
      }
      if (o_.resources_every > 0 && s % o_.resources_every == 0) {
        // What resources.cpp samples, on a busy node: the GPU computing at 300 W, memory growing slowly.
        line("resources", s,
             fmt::format(",\"reason\":\"{}\",\"gpu\":{},\"cpu_s\":{:.1f},\"rss_bytes\":{},\"mem_available_bytes\":{},"
                         "\"mem_total_bytes\":{},\"load1\":{:.1f},\"gpu_util\":0.97,\"gpu_power_w\":{},\"gpu_temp_c\":{}",
                         s == 0 ? "start" : "interval", rank_ % o_.ranks_per_node, 0.1 * static_cast<double>(s),
                         (2ull << 30) + (static_cast<unsigned long long>(s) << 20), 400ull << 30, 512ull << 30,
                         8.0 + 0.01 * static_cast<double>(rank_ % 7), 300 + rank_ % 40, 60 + rank_ % 15));
      }
      if (rank_ == o_.corrupt && s % 97 == 5) std::fputs("{not json at all\n{\"kind\":7}\n", f_);
      // Every rank's compute varies step to step (--noise); the step ends when
      // the slowest rank reaches the all-reduce, which the others wait in.
      const bool slow = o_.straggler.rank >= 0 && s >= o_.straggler.step;
      const std::uint64_t fwd_nominal = 30'000'000, bwd_nominal = 40'000'000;
      auto compute = [&](int r) {
        const double f = (r == o_.straggler.rank && slow ? o_.straggler_factor : 1.0) * jitter(r, s, 0);
        return static_cast<std::uint64_t>(static_cast<double>(fwd_nominal) * f) +
               static_cast<std::uint64_t>(static_cast<double>(bwd_nominal) * jitter(r, s, 1));
      };
      // Without noise every rank but the straggler computes alike: no need to
      // visit them all (1,024 ranks x 1,024 writers).
      std::uint64_t slowest = std::max(compute(rank_), slow ? compute(o_.straggler.rank) : 0);
      if (o_.noise > 0) {
        // The same for every writer: computed once per step (1,024 writers x 1,024 ranks otherwise).
        if (static_cast<std::size_t>(s) >= slowest_.size()) {
          std::uint64_t m = 0;
          for (int r = 0; r < o_.ranks; ++r) m = std::max(m, compute(r));
          slowest_.push_back(m);
        }
        slowest = slowest_[static_cast<std::size_t>(s)];
      }
      const std::uint64_t fwd = static_cast<std::uint64_t>(
          static_cast<double>(fwd_nominal) * (rank_ == o_.straggler.rank && slow ? o_.straggler_factor : 1.0) *
          jitter(rank_, s, 0));
      const std::uint64_t bwd = static_cast<std::uint64_t>(static_cast<double>(bwd_nominal) * jitter(rank_, s, 1));
      const std::uint64_t wait = slowest - (fwd + bwd) + 5'000'000;
      const std::uint64_t start = now_;
      line("step_begin", s, "");
      phase(s, "loader_wait", "loader_wait", 0, 2'000'000);
      const std::uint64_t f0 = now_;
      phase(s, "attention", "other", 1, fwd / 2);
      phase(s, "mlp", "other", 1, fwd / 2);
      now_ = f0;
      phase(s, "forward", "forward", 0, fwd);
      phase(s, "backward", "backward", 0, bwd);
      if (hang_culprit && s == o_.hang.step) {
        stall(s, "checkpoint_save (31.0 s)", "");
        return;
      }
      const long seq = s + 1;
      const bool bad = rank_ == o_.mismatch.rank && s == o_.mismatch.step;
      const std::uint64_t count = bad ? 1000 : 1001;
      if ((o_.hang.rank >= 0 && s == o_.hang.step) || (o_.dead.rank >= 0 && s == o_.dead.step) || s == o_.comm_hang) {
        stall(s, "all_reduce", fmt::format(",\"in_flight\":[{{\"op\":\"all_reduce\",\"comm\":\"world\",\"seq\":{},"
                                           "\"count\":{},\"age_ns\":30000000000}}]", seq, count));
        return;
      }
      const std::uint64_t c0 = now_;
      line("collective", s,
           fmt::format(",\"op\":\"all_reduce\",\"comm\":\"world\",\"comm_id\":0,\"seq\":{},\"count\":{},\"dtype\":"
                       "\"float32\",\"bytes\":{},\"peer\":-1,\"group_size\":{},\"dur\":{},\"result\":\"ok\","
                       "\"fingerprint\":\"{:016x}\",\"busbw_gbps\":1.5,\"phase\":\"all_reduce\"",
                       seq, count, 4 * count, o_.ranks, wait, fnv(fmt::format("all_reduce/{}/float32", count)), wait));
      phase(s, "all_reduce", "collective", 0, wait);
      now_ = c0 + wait;
      phase(s, "optimizer", "optimizer", 0, 8'000'000);
      now_ = start + base + (slowest - fwd_nominal - bwd_nominal);
      line("step_end", s, fmt::format(",\"dur\":{},\"loss\":{:.4f},\"lr\":0.1,\"samples\":8", now_ - start,
                                      2.0 / static_cast<double>(s + 1)));
      if (s % 100 == 99) {
        line("stats", s, fmt::format(",\"events_recorded\":{},\"events_dropped\":0,\"export_errors\":0,"
                                     "\"inactive_calls\":0,\"threads\":4,\"os_threads\":12,\"communicators\":1",
                                     (s + 1) * 10));
      }
    }
    line("run_end", o_.steps, fmt::format(",\"events_recorded\":{},\"events_dropped\":0,\"export_errors\":0,"
                                          "\"inactive_calls\":0,\"threads\":4", o_.steps * 10));
  }

  bool finished() const { return o_.hang.rank < 0 && o_.dead.rank < 0 && o_.comm_hang < 0; }
  std::uint64_t wall_now() const { return wall0_ + now_; }

 private:
  // Rank r's compute-time factor at step s for phase p: log-normal with
  // sigma --noise, the same on every writer (each computes the slowest rank).
  double jitter(int r, long s, int p) const {
    if (o_.noise <= 0) return 1.0;
    std::uint64_t h = (static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull) ^
                      (static_cast<std::uint64_t>(s) * 0xC2B2AE3D27D4EB4Full) ^ (static_cast<std::uint64_t>(p) + 1) ^
                      (o_.noise_seed * 0x165667B19E3779F9ull);
    auto uniform = [&]() {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      return (static_cast<double>(h >> 11) + 0.5) / 9007199254740992.0;
    };
    const double z = std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
    return std::exp(o_.noise * z);
  }
  void line(const char* kind, long step, std::string_view extra, long tid = -1) {
    fmt::print(f_, "{{\"kind\":\"{}\",\"t\":{},\"mono\":{},\"rank\":{},\"step\":{},\"tid\":{}{}}}\n", kind,
               wall0_ + now_, mono_ + now_, rank_, step, tid < 0 ? 5000 + rank_ : tid, extra);
  }
  void phase(long s, const char* name, const char* kind, int depth, std::uint64_t dur) {
    line("phase", s, fmt::format(",\"name\":\"{}\",\"phase_kind\":\"{}\",\"dur\":{},\"depth\":{}", name, kind, dur,
                                 depth));
    now_ += dur;
  }
  template <typename... A>
  void fact(const char* name, long step, long seq, fmt::format_string<A...> values, A&&... a) {
    line("fact", step, fmt::format(",\"name\":\"{}\",\"fields\":{{\"seq\":{},\"data_group\":{}{}}}", name, seq, rank_,
                                   fmt::format(values, std::forward<A>(a)...)));
  }
  void stall(long s, std::string_view inside, std::string_view in_flight) {
    now_ += 30'000'000'000ull;
    line("stall", s, fmt::format(",\"dur\":30000000000,\"inside\":\"{}\",\"progress_age_ns\":30000000000,"
                                 "\"timeout_ns\":30000000000,\"open_phases\":[]{}",
                                 inside, in_flight));
  }

  const Options& o_;
  int rank_;
  std::uint64_t mono_, wall0_ = 0, now_ = 0;
  std::int64_t skew_ns_ = 0;
  std::FILE* f_ = nullptr;
  std::vector<std::uint64_t>& slowest_;  // shared by the writers of one run
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes a synthetic rankscope run directory"};
  Options o;
  std::string straggler, hang, dead, mismatch, skew;
  app.add_option("--dir", o.dir, "Run directory to create")->required();
  app.add_option("--ranks", o.ranks)->capture_default_str();
  app.add_option("--steps", o.steps)->capture_default_str();
  app.add_option("--ranks-per-node", o.ranks_per_node)->capture_default_str();
  app.add_option("--straggler", straggler, "RANK:STEP  rank computes --straggler-factor x longer in forward from STEP");
  app.add_option("--straggler-factor", o.straggler_factor)->capture_default_str();
  app.add_option("--noise", o.noise, "log-normal sigma of every rank's compute time per step (0: none)")
      ->capture_default_str();
  app.add_option("--noise-seed", o.noise_seed)->capture_default_str();
  app.add_option("--hang", hang, "RANK:STEP  rank blocks in checkpoint_save before the all-reduce of STEP");
  app.add_option("--dead", dead, "RANK:STEP  rank dies (torn last line) at STEP");
  app.add_option("--mismatch", mismatch, "RANK:STEP  rank all-reduces a different count at STEP");
  app.add_option("--skew", skew, "NODE:MS  node's wall clock is MS milliseconds ahead");
  app.add_option("--comm-hang", o.comm_hang, "STEP  every rank enters STEP's all-reduce and none leaves it");
  app.add_option("--seed-rank", o.seed_rank, "rank whose sampler seed differs");
  app.add_option("--corrupt", o.corrupt, "rank whose log has corrupt lines");
  app.add_option("--resources-every", o.resources_every, "STEPS  a resource snapshot line every STEPS steps (0: none)");
  CLI11_PARSE(app, argc, argv);
  if (!parse_fault(straggler, o.straggler) || !parse_fault(hang, o.hang) || !parse_fault(dead, o.dead) ||
      !parse_fault(mismatch, o.mismatch) || !parse_fault(skew, o.skew)) {
    std::fprintf(stderr, "synth_run: faults are RANK:STEP (skew NODE:MS)\n");
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  const std::uint64_t t0 = 1'790'000'000'000'000'000ull;
  std::FILE* run = std::fopen((o.dir + "/run.json").c_str(), "w");
  if (run == nullptr) {
    std::fprintf(stderr, "synth_run: cannot write into '%s'\n", o.dir.c_str());
    return 2;
  }
  fmt::print(run, "{{\"schema\":1,\"library\":\"rankscope\",\"version\":\"0.1.0\",\"run_id\":\"synth\","
                  "\"world_size\":{},\"start_time_ns\":{}}}\n", o.ranks, t0);
  std::fclose(run);
  std::vector<std::uint64_t> slowest_by_step;  // per step, the slowest rank's compute (with --noise)
  for (int r = 0; r < o.ranks; ++r) {
    RankWriter w(o, r, t0, slowest_by_step);
    if (!w.ok()) return 2;
    w.run();
    std::FILE* hb = std::fopen(fmt::format("{}/rank-{}.heartbeat.json", o.dir, r).c_str(), "w");
    if (hb == nullptr) return 2;
    const bool done = w.finished();
    fmt::print(hb, "{{\"schema\":1,\"kind\":\"heartbeat\",\"rank\":{},\"world_size\":{},\"pid\":{},\"host\":\"node-{}\","
                   "\"state\":\"{}\",\"interval_ns\":1000000000,\"stall_timeout_ns\":30000000000,"
                   "\"liveness_wall_ns\":{},\"progress_wall_ns\":{},\"step\":0,\"inside\":\"\"}}\n",
               r, o.ranks, 1000 + r, r / o.ranks_per_node, done ? "exited" : "stalled", w.wall_now(), w.wall_now());
    std::fclose(hb);
  }
  return 0;
}
