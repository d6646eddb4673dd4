// Example trainer: a small MLP on synthetic data, data-parallel over N
// processes with c10d ProcessGroupGloo, fully instrumented with rankscope.
//
//   RANK=0 WORLD_SIZE=2 ./rankscope_example_train --store /tmp/store --steps 100
//
// Phases: loader_wait (the training thread blocked on the prefetching loader
// thread, which records its own "loader_produce" phases), forward, backward,
// all_reduce (gradients, one flat gloo all-reduce), optimizer, checkpoint_save
// (every --checkpoint-every steps). Each step reports loss, lr, grad norm and
// samples.
//
// --ab-block K: A/B overhead measurement. Steps alternate in blocks of K
// between instrumentation enabled and runtime-disabled; rank 0 prints the
// median step time of each and their ratio.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <rankscope/integrations/torch.hpp>
#include <rankscope/rankscope.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

struct Args {
  std::string store = "/tmp/rankscope-example-store";
  std::string ckpt_dir;
  int steps = 100;
  int batch = 64;
  int hidden = 256;
  int checkpoint_every = 25;
  int ab_block = 0;
  bool ab_control = false;  // A/A: both arms disabled, to measure the noise floor
  int slow_rank = -1;     // inject a straggler: this rank sleeps in forward
  int slow_ms = 0;
  int mismatch_rank = -1;  // inject a collective mismatch: this rank all-reduces
  int mismatch_step = -1;  // one element fewer at this step (a real gloo mismatch)
  int timeout_s = 30;      // gloo operation timeout
  int slow_from_step = 0;  // --slow-rank sleeps from this step on
  int block_rank = -1;     // inject a hang: this rank blocks forever inside
  int block_step = -1;     // "checkpoint_save" at this step, before the all-reduce
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
    else if (k == "--ab-block") a.ab_block = std::stoi(next());
    else if (k == "--ab-control") a.ab_control = true;
    else if (k == "--slow-rank") a.slow_rank = std::stoi(next());
    else if (k == "--slow-ms") a.slow_ms = std::stoi(next());
    else if (k == "--mismatch-rank") a.mismatch_rank = std::stoi(next());
    else if (k == "--mismatch-step") a.mismatch_step = std::stoi(next());
    else if (k == "--timeout") a.timeout_s = std::stoi(next());
    else if (k == "--slow-from-step") a.slow_from_step = std::stoi(next());
    else if (k == "--block-rank") a.block_rank = std::stoi(next());
    else if (k == "--block-step") a.block_step = std::stoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

struct Batch {
  torch::Tensor x, y;
};

// A prefetching loader thread with a bounded queue, like a DataLoader.
class Loader {
 public:
  Loader(int batch, int features, int classes, int seed) : batch_(batch), features_(features), classes_(classes) {
    gen_ = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
    thread_ = std::thread([this] { run(); });
  }
  ~Loader() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Batch next() {
    RANKSCOPE_PHASE("loader_wait");
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !q_.empty(); });
    Batch b = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    return b;
  }

 private:
  void run() {
    for (;;) {
      Batch b;
      {
        RANKSCOPE_PHASE_AS("loader_produce", rankscope::PhaseKind::kOther);
        b.x = torch::randn({batch_, features_}, gen_);
        // A learnable target: the class is the argmax of the first features.
        b.y = b.x.narrow(1, 0, classes_).argmax(1);
      }
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || q_.size() < 4; });
      if (stop_) return;
      q_.push_back(std::move(b));
      cv_.notify_all();
    }
  }
  int batch_, features_, classes_;
  at::Generator gen_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> q_;
  bool stop_ = false;
  std::thread thread_;
};


// Interleaved A/B over pairs of blocks of steps. Within each pair the order of
// the two arms is pseudo-random (the same on every rank), so slow drift and
// "first block of the pair" effects cancel; the estimate is the median over
// pairs of (median step time on) / (median step time off). Process CPU time
// per step is recorded too: on a machine where every core trains, CPU spent by
// rankscope's background thread is CPU taken from a rank.
class AbRecorder {
 public:
  explicit AbRecorder(int block) : block_(block) {}
  bool arm_on(int step) {
    if (block_ <= 0) return true;
    const int b = step / block_, pair = b / 2;
    const bool on_first = (static_cast<unsigned>(pair) * 2654435761u >> 16) & 1u;
    const bool on = (b % 2 == 0) == on_first;
    if (step % block_ == 0) {
      close_block();
      cur_on_ = on;
      cur_pair_ = pair;
      cpu0_ = cpu_ms();
    }
    return on;
  }
  void add(int, double ms) {
    if (block_ > 0) cur_.push_back(ms);
  }
  void report(bool control) {
    close_block();
    std::vector<double> ratios, all[2], cpu[2];
    for (auto& [pair, p] : pairs_) {
      if (p.med[0] > 0 && p.med[1] > 0) ratios.push_back(p.med[1] / p.med[0]);
      for (int a = 0; a < 2; ++a) {
        all[a].insert(all[a].end(), p.steps[a].begin(), p.steps[a].end());
        if (p.cpu[a] > 0) cpu[a].push_back(p.cpu[a]);
      }
    }
    const double r = median(ratios);
    std::printf("A/B%s: %zu pairs of %d-step blocks, order randomized per pair\n", control ? " (A/A control)" : "",
                ratios.size(), block_);
    std::printf("A/B: median step %.4f ms on vs %.4f ms off; median paired ratio %.5f (%+.3f %%), "
                "quartiles %.5f..%.5f\n",
                median(all[1]), median(all[0]), r, (r - 1) * 100, quantile(ratios, 0.25), quantile(ratios, 0.75));
    std::printf("A/B: process CPU per step %.4f ms on vs %.4f ms off (median over blocks)\n", median(cpu[1]),
                median(cpu[0]));
  }

 private:
  struct Pair {
    std::vector<double> steps[2];
    double med[2] = {0, 0};
    double cpu[2] = {0, 0};
  };
  static double cpu_ms() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  }
  static double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  }
  static double median(const std::vector<double>& v) { return quantile(v, 0.5); }
  void close_block() {
    if (cur_.empty()) return;
    Pair& p = pairs_[cur_pair_];
    p.med[cur_on_] = median(cur_);
    p.cpu[cur_on_] = (cpu_ms() - cpu0_) / static_cast<double>(cur_.size());
    p.steps[cur_on_] = cur_;
    cur_.clear();
  }
  int block_;
  bool cur_on_ = true;
  int cur_pair_ = 0;
  double cpu0_ = 0;
  std::vector<double> cur_;
  std::map<int, Pair> pairs_;
};

// CPU time of rankscope's background thread (named "rankscope"), from /proc.
double background_cpu_ms() {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(e.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "rankscope") continue;
    std::ifstream sched(e.path() / "schedstat");
    double ns = 0;
    sched >> ns;
    return ns / 1e6;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  torch::set_num_threads(1);  // one core per rank on a small machine
  torch::manual_seed(0);      // identical initial weights on every rank

  if (auto st = rankscope::init({.run_config = {{"model", "mlp"},
                                                {"batch_per_rank", std::to_string(args.batch)},
                                                {"hidden", std::to_string(args.hidden)},
                                                {"steps", std::to_string(args.steps)}}});
      !st.ok()) {
    std::fprintf(stderr, "rankscope init failed: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const auto& ctx = rankscope::context();
  const int rank = ctx.rank, world = ctx.world_size;

  auto store = c10::make_intrusive<c10d::FileStore>(args.store, world);
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->timeout = std::chrono::seconds(args.timeout_s);
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  // Heartbeats also go into the job's store, where any rank or a monitor can read them.
  rankscope::torch::publish_heartbeat_to(store);
  // One communicator per process group: sequence numbers must line up across ranks.
  auto& comm = rankscope::register_communicator(pg.get(), "world", world, rank);

  constexpr int kFeatures = 128, kClasses = 10;
  torch::nn::Sequential model(torch::nn::Linear(kFeatures, args.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(args.hidden, args.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(args.hidden, kClasses));
  const double lr = 0.05;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  Loader loader(args.batch, kFeatures, kClasses, 1234 + rank);

  auto& samples_total = rankscope::counter("samples_total", "Samples consumed by this rank");
  auto& loss_gauge = rankscope::gauge("train_loss", "Last training loss");
  std::string ckpt_dir = args.ckpt_dir.empty() ? rankscope::run_dir() + "/checkpoints" : args.ckpt_dir;
  std::filesystem::create_directories(ckpt_dir);

  AbRecorder ab(args.ab_block);
  double last_loss = 0;
  std::string collective_error;
  for (int step = 0; step < args.steps; ++step) {
    const bool on = ab.arm_on(step);
    if (args.ab_block > 0) rankscope::set_enabled(on && !args.ab_control);
    const auto t0 = std::chrono::steady_clock::now();
    {
      rankscope::StepScope s(step);
      Batch b = loader.next();
      torch::Tensor loss;
      {
        RANKSCOPE_PHASE("forward");
        if (rank == args.slow_rank && step >= args.slow_from_step) {
          std::this_thread::sleep_for(std::chrono::milliseconds(args.slow_ms));
        }
        loss = torch::nn::functional::cross_entropy(model->forward(b.x), b.y);
      }
      {
        RANKSCOPE_PHASE("backward");
        opt.zero_grad();
        loss.backward();
      }
      double grad_norm = 0;
      if (rank == args.block_rank && step == args.block_step) {
        // A rank stuck on I/O before the all-reduce (a hung filesystem, say):
        // the others will wait in the all-reduce for it forever.
        RANKSCOPE_PHASE("checkpoint_save");
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      {
        RANKSCOPE_PHASE("all_reduce");
        std::vector<torch::Tensor> grads;
        for (auto& p : model->parameters()) grads.push_back(p.grad().view(-1));
        std::vector<torch::Tensor> flat{torch::cat(grads)};
        if (rank == args.mismatch_rank && step == args.mismatch_step) flat[0] = flat[0].narrow(0, 0, flat[0].numel() - 1);
        {
          rankscope::CollectiveSpan span(comm, rankscope::CollectiveOp::kAllReduce,
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
      if (args.checkpoint_every > 0 && (step + 1) % args.checkpoint_every == 0 && rank == 0) {
        RANKSCOPE_PHASE("checkpoint_save");
        torch::save(model, ckpt_dir + "/model.pt");
      }
      last_loss = loss.item<double>();
      samples_total.add(args.batch);
      loss_gauge.set(last_loss);
      s.report({.loss = last_loss, .lr = lr, .grad_norm = grad_norm, .samples = args.batch});
    }
    ab.add(step, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
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
  {
    rankscope::CollectiveSpan span(comm, rankscope::CollectiveOp::kBarrier, 0, rankscope::DType::kUnknown);
    pg->barrier()->wait();
  }

  if (rank == 0) {
    std::printf("rank 0: %d steps on %d ranks, final loss %.4f, run log in %s\n", args.steps, world, last_loss,
                rankscope::run_dir().c_str());
    if (args.ab_block > 0) ab.report(args.ab_control);
    rankscope::flush();
    const double bg_ms = background_cpu_ms();
    const auto st = rankscope::stats();
    std::printf("cost: rankscope background thread used %.1f ms CPU for %llu records (%.0f ns/record, "
                "%.1f us per step)\n",
                bg_ms, static_cast<unsigned long long>(st.events_recorded),
                st.events_recorded ? bg_ms * 1e6 / static_cast<double>(st.events_recorded) : 0.0,
                bg_ms * 1e3 / args.steps);
  }
  rankscope::shutdown();
  return 0;
}
