// Example trainer: a small MLP on synthetic data, data-parallel over N
// processes with c10d ProcessGroupGloo, fully instrumented with rankscope.
//
//   RANK=0 WORLD_SIZE=2 ./rankscope_example_train --store /tmp/store --steps 100
//
// Phases: loader_wait (the training thread blocked on the prefetching loader
// thread, which records its own "loader_produce" phases), forward, backward,
// all_reduce (gradients, one flat gloo all-reduce), optimizer, checkpoint_save
// (every --checkpoint-every steps), eval (every --eval-every steps: its loss
// through report_evaluation). Each step reports loss, lr, grad norm and
// samples.
//
// --ab-block K: A/B overhead measurement. Steps alternate in blocks of K
// between instrumentation enabled and runtime-disabled; rank 0 prints the
// median step time of each and their ratio.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <rankscope/integrations/torch.hpp>
#include <rankscope/rankscope.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>


#include "ab_recorder.hpp"
#include "checkpoint.hpp"
#include "data.hpp"

namespace {

struct Args {
  std::string store = "/tmp/rankscope-example-store";
  std::string ckpt_dir;
  int steps = 100;
  int batch = 64;
  int hidden = 256;
  int checkpoint_every = 25;
  int eval_every = 0;      // an evaluation (forward on held-out batches, report_evaluation) every N steps
  int restore_every = 0;   // an in-process restore (new process group + resume check) every N steps
  bool leak_pg = false;    // ... that keeps the old process group alive (the leak triage names)
  int ab_block = 0;
  bool ab_control = false;  // A/A: both arms disabled, to measure the noise floor
  int slow_rank = -1;     // inject a straggler: this rank sleeps in forward
  int slow_ms = 0;
  double slow_factor = 0;  // ... or computes its forward this many times (1.2: a subtle straggler)
  int mismatch_rank = -1;  // inject a collective mismatch: this rank all-reduces
  int mismatch_step = -1;  // one element fewer at this step (a real gloo mismatch)
  int timeout_s = 30;      // gloo operation timeout
  int slow_from_step = 0;  // --slow-rank sleeps from this step on
  int nan_rank = -1;       // inject a NaN loss: this rank's loss is NaN
  int nan_step = -1;       // at this step (the gradient all-reduce spreads it)
  int block_rank = -1;     // inject a hang: this rank blocks forever inside
  int block_step = -1;     // "checkpoint_save" at this step, before the all-reduce
  int block_ms = 0;        // ... for this long instead of forever (a stall that recovers)
  std::string block_phase = "checkpoint_save";
  int never_join_rank = -1;  // this rank never connects to its peers (a rendezvous that never completes)
  // Data, epochs, checkpoints and the invariant checks.
  std::int64_t dataset = 4096;     // samples; an epoch = dataset / (batch x world) steps
  std::uint64_t seed = 1234;       // sampler seed
  std::int64_t global_batch = 0;   // configured global batch (0: batch x world, or the checkpoint's)
  std::string resume;              // "latest" or a checkpoint directory
  bool online_checks = true;       // compare ranks at each check through the store
  int exchange_timeout_ms = 20000;
  std::string on_violation;        // warn | fail (default: each check's own)
  int seed_rank = -1;              // fault: this rank's sampler uses --seed-value
  std::uint64_t seed_value = 0;
  int skip_rank = -1;              // fault: this rank's loader fails on batch --skip-batch of
  int skip_epoch = 1;              // epoch --skip-epoch and the trainer swallows the error
  int skip_batch = 3;
  int stale_rank = -1;             // fault: this rank resumes from the checkpoint before the latest
  int no_check_rank = -1;          // fault: this rank skips the sampler check of epoch --no-check-epoch
  int no_check_epoch = 1;
  bool default_sigpipe = false;    // keep SIGPIPE's default action (as a C++ trainer that never set it)
  int end_rank = -1;               // fault: this rank ends at its first epoch's end, before the epoch check,
  std::string end_how = "term";    // by SIGTERM (term), SIGKILL (kill) or an uncaught exception (throw)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--store") a.store = next();
    else if (k == "--ckpt-dir") a.ckpt_dir = next();
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--hidden") a.hidden = std::stoi(next());
    else if (k == "--checkpoint-every") a.checkpoint_every = std::stoi(next());
    else if (k == "--eval-every") a.eval_every = std::stoi(next());
    else if (k == "--ab-block") a.ab_block = std::stoi(next());
    else if (k == "--ab-control") a.ab_control = true;
    else if (k == "--slow-rank") a.slow_rank = std::stoi(next());
    else if (k == "--slow-ms") a.slow_ms = std::stoi(next());
    else if (k == "--slow-factor") a.slow_factor = std::stod(next());
    else if (k == "--mismatch-rank") a.mismatch_rank = std::stoi(next());
    else if (k == "--mismatch-step") a.mismatch_step = std::stoi(next());
    else if (k == "--timeout") a.timeout_s = std::stoi(next());
    else if (k == "--slow-from-step") a.slow_from_step = std::stoi(next());
    else if (k == "--nan-rank") a.nan_rank = std::stoi(next());
    else if (k == "--nan-step") a.nan_step = std::stoi(next());
    else if (k == "--block-rank") a.block_rank = std::stoi(next());
    else if (k == "--block-step") a.block_step = std::stoi(next());
    else if (k == "--block-ms") a.block_ms = std::stoi(next());
    else if (k == "--restore-every") a.restore_every = std::stoi(next());
    else if (k == "--leak-pg") a.leak_pg = true;
    else if (k == "--block-phase") a.block_phase = next();
    else if (k == "--never-join-rank") a.never_join_rank = std::stoi(next());
    else if (k == "--dataset") a.dataset = std::stoll(next());
    else if (k == "--seed") a.seed = std::stoull(next());
    else if (k == "--global-batch") a.global_batch = std::stoll(next());
    else if (k == "--resume") a.resume = next();
    else if (k == "--no-online-checks") a.online_checks = false;
    else if (k == "--exchange-timeout-ms") a.exchange_timeout_ms = std::stoi(next());
    else if (k == "--on-violation") a.on_violation = next();
    else if (k == "--seed-rank") a.seed_rank = std::stoi(next());
    else if (k == "--seed-value") a.seed_value = std::stoull(next());
    else if (k == "--skip-rank") a.skip_rank = std::stoi(next());
    else if (k == "--skip-epoch") a.skip_epoch = std::stoi(next());
    else if (k == "--skip-batch") a.skip_batch = std::stoi(next());
    else if (k == "--stale-rank") a.stale_rank = std::stoi(next());
    else if (k == "--no-check-rank") a.no_check_rank = std::stoi(next());
    else if (k == "--no-check-epoch") a.no_check_epoch = std::stoi(next());
    else if (k == "--default-sigpipe") a.default_sigpipe = true;
    else if (k == "--end-rank") a.end_rank = std::stoi(next());
    else if (k == "--end-how") a.end_how = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

// The injected fault, a function of its own so that a stack capture names it
// (exported: the executable links with ENABLE_EXPORTS, -rdynamic).
__attribute__((noinline)) void block_before_all_reduce(long block_ms) {
  if (block_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(block_ms));
  else for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Exit codes: 0 done, 1 setup failed, 3 a collective failed, 4 an invariant check failed.
int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  // A peer that dies mid-all-reduce closes its sockets, and gloo's sends then
  // raise SIGPIPE, whose default action would end this rank without a word.
  // Ignored, as Python (so every torch.distributed trainer in Python) does: the
  // send fails with EPIPE, gloo throws, and the rank reports the failure.
  if (!args.default_sigpipe) std::signal(SIGPIPE, SIG_IGN);
  torch::set_num_threads(1);  // one core per rank on a small machine
  torch::manual_seed(0);      // identical initial weights on every rank

  rankscope::Config rs_config{.run_config = {{"model", "mlp"},
                                          {"batch_per_rank", std::to_string(args.batch)},
                                          {"hidden", std::to_string(args.hidden)},
                                          {"dataset", std::to_string(args.dataset)},
                                          {"steps", std::to_string(args.steps)}}};
  // Exporters need no code: linked in (CMake), init() adds /metrics when
  // RANKSCOPE_PROMETHEUS_PORT is set and OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is.
  if (auto st = rankscope::init(rs_config); !st.ok()) {
    std::fprintf(stderr, "rankscope init failed: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const auto& ctx = rankscope::context();
  const int rank = ctx.rank, world = ctx.world_size;

  auto store = c10::make_intrusive<c10d::FileStore>(args.store, world);
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->timeout = std::chrono::seconds(args.timeout_s);
  if (rank == args.never_join_rank) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the others wait for it in init_process_group
  }
  // Connecting to every peer is an operation in flight like any other: a rank
  // that never arrives shows here (heartbeat, stall, dump), before step 0.
  auto pg = [&] {
    RANKSCOPE_PHASE("init_process_group");
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  }();
  // Heartbeats also go into the job's store, where any rank or a monitor can read them.
  rankscope::torch::publish_heartbeat_to(store);
  // The invariant checks compare ranks online through the same store.
  if (args.online_checks) {
    rankscope::set_exchange(rankscope::torch::store_exchange(store),
                            std::chrono::milliseconds(args.exchange_timeout_ms));
  }
  // One communicator per process group: sequence numbers must line up across ranks.
  rankscope::Communicator* comm = &rankscope::register_communicator(pg.get(), "world", world, rank);
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupGloo>> leaked;  // --leak-pg
  int attempt = 0;

  constexpr int kFeatures = 128, kClasses = 10;
  torch::nn::Sequential model(torch::nn::Linear(kFeatures, args.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(args.hidden, args.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(args.hidden, kClasses));
  const double lr = 0.05;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  const example::Dataset dataset(args.dataset, kFeatures, kClasses);

  auto& samples_total = rankscope::counter("samples_total", "Samples consumed by this rank");
  auto& loss_gauge = rankscope::gauge("train_loss", "Last training loss");
  std::string ckpt_dir = args.ckpt_dir.empty() ? rankscope::run_dir() + "/checkpoints" : args.ckpt_dir;
  std::filesystem::create_directories(ckpt_dir);

  // Invariants. The policy: each check's default unless --on-violation says.
  std::optional<rankscope::OnViolation> policy;
  if (args.on_violation == "warn") policy = rankscope::OnViolation::kWarn;
  else if (args.on_violation == "fail") policy = rankscope::OnViolation::kFail;
  auto on = [&](rankscope::OnViolation def) { return policy.value_or(def); };
  auto violated = [&](const absl::Status& st) {
    if (st.ok()) return false;
    std::fprintf(stderr, "rank %d: stopping: %s\n", rank, std::string(st.message()).c_str());
    return true;
  };
  const std::string config = fmt::format("mlp {} {} {} {} {}", kFeatures, args.hidden, kClasses, lr, args.dataset);
  const std::uint64_t config_hash = rankscope::fingerprint_bytes(config.data(), config.size());
  std::int64_t global_batch = args.global_batch > 0 ? args.global_batch : std::int64_t{args.batch} * world;
  int start_step = 0;
  if (!args.resume.empty()) {
    std::string dir = args.resume;
    if (dir == "latest") {
      const auto all = example::list_checkpoints(ckpt_dir);
      // The stale-checkpoint fault: this rank picks the one before the latest.
      const std::size_t back = rank == args.stale_rank ? 2 : 1;
      dir = all.size() >= back ? all[all.size() - back] : "";
    }
    const auto meta = dir.empty() ? std::nullopt : example::load_checkpoint(dir, model);
    if (!meta) {
      std::fprintf(stderr, "rank %d: no checkpoint to resume from in '%s'\n", rank, args.resume.c_str());
      return 1;
    }
    // A real trainer's config travels with its checkpoint: the global batch
    // comes from there unless given again.
    if (args.global_batch <= 0) global_batch = meta->global_batch;
    start_step = static_cast<int>(meta->step);
    rankscope::CheckpointMeta loaded = *meta;
    loaded.rng_fingerprint = rankscope::fingerprint_bytes(&meta->step, sizeof(meta->step));
    if (violated(rankscope::check_resume(loaded, on(rankscope::OnViolation::kFail)))) return 4;
  }
  if (violated(rankscope::check_batch_math(
          {.micro_batch = args.batch, .grad_accum = 1, .data_parallel = world, .global_batch = global_batch},
          on(rankscope::OnViolation::kFail)))) {
    return 4;
  }
  // What a checkpoint taken after `done` steps says about itself.
  auto checkpoint_at = [&](int done) {
    return rankscope::CheckpointMeta{.id = fmt::format("step-{}", done),
                                     .step = done,
                                     .consumed_samples = done * global_batch,
                                     .world_size = world,
                                     .global_batch = global_batch,
                                     .config_hash = config_hash,
                                     .optimizer_step = done};
  };
  rankscope::BatchAccounting batches({.dataset_size = args.dataset,
                                      .micro_batch = args.batch,
                                      .data_parallel = world,
                                      .on = on(rankscope::OnViolation::kFail)});
  const std::int64_t per_epoch = batches.expected_per_epoch();

  example::AbRecorder ab(args.ab_block);
  double last_loss = 0;
  std::string collective_error;
  bool stop = false;
  int step = start_step;
  for (std::int64_t epoch = step / per_epoch; step < args.steps && !stop; ++epoch) {
    const std::uint64_t seed = rank == args.seed_rank ? args.seed_value : args.seed;
    const auto indices = example::shard_indices(args.dataset, rank, world, seed, epoch, /*shuffle=*/true);
    if (!(rank == args.no_check_rank && epoch == args.no_check_epoch) &&
        violated(rankscope::check_sampler({.seed = seed,
                                           .epoch = epoch,
                                           .shuffle = true,
                                           .fingerprint = rankscope::fingerprint_indices(indices),
                                           .num_indices = static_cast<std::int64_t>(indices.size())},
                                          on(rankscope::OnViolation::kWarn)))) {
      return 4;
    }
    const std::int64_t first = epoch == start_step / per_epoch ? start_step % per_epoch : 0;
    batches.start_epoch(epoch, first);
    example::Loader loader(dataset, indices, args.batch, first,
                           rank == args.skip_rank && epoch == args.skip_epoch ? args.skip_batch : -1);
    const auto in_epoch = static_cast<std::int64_t>((indices.size() + args.batch - 1) / args.batch);
    std::int64_t next_index = first;
    while (step < args.steps && next_index < in_epoch) {
      const bool arm = ab.arm_on(step);
      if (args.ab_block > 0) rankscope::set_enabled(arm && !args.ab_control);
      const auto t0 = std::chrono::steady_clock::now();
      {
        rankscope::StepScope s(step);
        std::optional<example::Batch> b;
        try {
          b = loader.next();
        } catch (const example::LoaderError& e) {
          // The bug this models: a loader error swallowed, the batch skipped.
          RANKSCOPE_LOG_WARN("skipping a batch: {}", e.what());
          ++next_index;
          continue;
        }
        if (!b) break;
        next_index = b->index + 1;
        if (violated(batches.on_batch(b->index))) {
          stop = true;
          break;
        }
        torch::Tensor loss;
        {
          RANKSCOPE_PHASE("forward");
          if (rank == args.slow_rank && step >= args.slow_from_step) {
            std::this_thread::sleep_for(std::chrono::milliseconds(args.slow_ms));
          }
          const auto f0 = std::chrono::steady_clock::now();
          loss = torch::nn::functional::cross_entropy(model->forward(b->x), b->y);
          if (rank == args.slow_rank && step >= args.slow_from_step && args.slow_factor > 1) {
            // A slower device: the same work takes slow_factor times as long (spinning, as compute would).
            const auto until = std::chrono::steady_clock::now() + (std::chrono::steady_clock::now() - f0) * (args.slow_factor - 1);
            while (std::chrono::steady_clock::now() < until) {
            }
          }
          if (rank == args.nan_rank && step == args.nan_step) loss = loss * std::nan("");
        }
        {
          RANKSCOPE_PHASE("backward");
          opt.zero_grad();
          loss.backward();
        }
        double grad_norm = 0;
        if (rank == args.block_rank && step == args.block_step) {
          // A rank stuck on I/O before the all-reduce (a hung filesystem, say):
          // the others wait in the all-reduce for it, forever or --block-ms.
          rankscope::PhaseTimer blocked(rankscope::DynamicName{args.block_phase});
          block_before_all_reduce(args.block_ms);
        }
        {
          RANKSCOPE_PHASE("all_reduce");
          std::vector<torch::Tensor> grads;
          for (auto& p : model->parameters()) grads.push_back(p.grad().view(-1));
          std::vector<torch::Tensor> flat{torch::cat(grads)};
          if (rank == args.mismatch_rank && step == args.mismatch_step) {
            flat[0] = flat[0].narrow(0, 0, flat[0].numel() - 1);
          }
          {
            rankscope::CollectiveSpan span(*comm, rankscope::CollectiveOp::kAllReduce,
                                           static_cast<std::uint64_t>(flat[0].numel()), rankscope::DType::kFloat32);
            try {
              pg->allreduce(flat)->wait();
            } catch (const std::exception& e) {
              span.set_result(rankscope::CollectiveResult::kFailed);
              collective_error = e.what();
            }
          }
          if (!collective_error.empty()) break;
          flat[0].div_(world);
          grad_norm = flat[0].norm().item<double>();
          int64_t off = 0;
          for (auto& p : model->parameters()) {
            const int64_t n = p.numel();
            p.grad().view(-1).copy_(flat[0].narrow(0, off, n));
            off += n;
          }
        }
        {
          RANKSCOPE_PHASE("optimizer");
          opt.step();
        }
        const int done = step + 1;
        if (args.checkpoint_every > 0 && done % args.checkpoint_every == 0) {
          RANKSCOPE_PHASE("checkpoint_save");
          const rankscope::CheckpointMeta meta = checkpoint_at(done);
          if (rank == 0) example::save_checkpoint(fmt::format("{}/{}", ckpt_dir, meta.id), model, meta);
          rankscope::record_checkpoint_save(meta);
        }
        if (args.eval_every > 0 && done % args.eval_every == 0) {
          // Held-out data: the training set's first rows negated, labelled by the same
          // rule - samples of the same task that the model never trains on.
          RANKSCOPE_PHASE("eval");
          torch::NoGradGuard no_grad;
          const auto x = dataset.x.narrow(0, 0, 256) * -1, y = x.narrow(1, 0, kClasses).argmax(1);
          rankscope::report_evaluation(torch::nn::functional::cross_entropy(model->forward(x), y).item<double>());
        }
        if (args.restore_every > 0 && done % args.restore_every == 0 && done < args.steps) {
          // An in-process restore, as elastic trainers do after a peer failure: a
          // new process group and the resume check. --leak-pg keeps the old group
          // alive, so its threads and communicator leak with every restore.
          RANKSCOPE_PHASE("restore");
          auto fresh = c10::make_intrusive<c10d::ProcessGroupGloo>(
              c10::make_intrusive<c10d::PrefixStore>(fmt::format("attempt-{}", ++attempt), store), rank, world, opts);
          if (args.leak_pg) leaked.push_back(pg);
          else rankscope::release_communicator(pg.get());
          pg = fresh;
          comm = &rankscope::register_communicator(pg.get(), fmt::format("world.{}", attempt), world, rank);
          if (violated(rankscope::check_resume(checkpoint_at(done), on(rankscope::OnViolation::kWarn)))) {
            stop = true;
            break;
          }
        }
        last_loss = loss.item<double>();
        samples_total.add(args.batch);
        loss_gauge.set(last_loss);
        s.report({.loss = last_loss, .lr = lr, .grad_norm = grad_norm, .samples = args.batch});
      }
      ab.add(step, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      ++step;
    }
    if (!collective_error.empty()) break;
    if (rank == args.end_rank && next_index >= in_epoch) {
      // Between two collectives, while the peers wait for this rank in the epoch check's store exchange.
      if (args.end_how == "throw") throw std::runtime_error("the epoch ended badly");
      std::raise(args.end_how == "kill" ? SIGKILL : SIGTERM);
    }
    if (next_index >= in_epoch && !stop && violated(batches.end_epoch())) stop = true;
  }
  rankscope::set_enabled(true);
  if (!collective_error.empty()) {
    // What a trainer should do when a collective fails: leave the evidence.
    auto dumped = rankscope::dump_flight_recorder("collective failed");
    std::fprintf(stderr, "rank %d: all_reduce failed at step %lld: %s\nflight recorder: %s\n", rank,
                 static_cast<long long>(rankscope::current_step()), collective_error.c_str(),
                 dumped.ok() ? dumped->c_str() : std::string(dumped.status().message()).c_str());
    rankscope::shutdown();
    return 3;
  }
  if (stop) {
    rankscope::shutdown();
    return 4;
  }
  {
    rankscope::CollectiveSpan span(*comm, rankscope::CollectiveOp::kBarrier, 0, rankscope::DType::kUnknown);
    pg->barrier()->wait();
  }

  if (rank == 0) {
    std::printf("rank 0: %d steps on %d ranks, final loss %.4f, run log in %s\n", args.steps, world, last_loss,
                rankscope::run_dir().c_str());
    if (args.ab_block > 0) ab.report(args.ab_control);
    rankscope::flush();
    const auto st = rankscope::stats();
    const double bg_ms = static_cast<double>(st.background_cpu_ns) / 1e6;
    std::printf("cost: rankscope background thread used %.1f ms CPU for %llu records (%.0f ns/record, "
                "%.1f us per step)\n",
                bg_ms, static_cast<unsigned long long>(st.events_recorded),
                st.events_recorded ? bg_ms * 1e6 / static_cast<double>(st.events_recorded) : 0.0,
                bg_ms * 1e3 / std::max(1, args.steps - start_step));
  }
  rankscope::shutdown();
  return 0;
}
