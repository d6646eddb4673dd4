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

#include <rankscope/rankscope.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
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
  int slow_rank = -1;     // inject a straggler: this rank sleeps in forward
  int slow_ms = 0;
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
    else if (k == "--slow-rank") a.slow_rank = std::stoi(next());
    else if (k == "--slow-ms") a.slow_ms = std::stoi(next());
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
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);

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

  std::vector<double> step_ms[2];  // [0] disabled, [1] enabled (A/B mode)
  double last_loss = 0;
  for (int step = 0; step < args.steps; ++step) {
    const bool on = args.ab_block <= 0 || (step / args.ab_block) % 2 == 0;
    if (args.ab_block > 0) rankscope::set_enabled(on);
    const auto t0 = std::chrono::steady_clock::now();
    {
      rankscope::StepScope s(step);
      Batch b = loader.next();
      torch::Tensor loss;
      {
        RANKSCOPE_PHASE("forward");
        if (rank == args.slow_rank) std::this_thread::sleep_for(std::chrono::milliseconds(args.slow_ms));
        loss = torch::nn::functional::cross_entropy(model->forward(b.x), b.y);
      }
      {
        RANKSCOPE_PHASE("backward");
        opt.zero_grad();
        loss.backward();
      }
      double grad_norm = 0;
      {
        RANKSCOPE_PHASE("all_reduce");
        std::vector<torch::Tensor> grads;
        for (auto& p : model->parameters()) grads.push_back(p.grad().view(-1));
        std::vector<torch::Tensor> flat{torch::cat(grads)};
        pg->allreduce(flat)->wait();
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
    step_ms[on ? 1 : 0].push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  rankscope::set_enabled(true);
  pg->barrier()->wait();

  if (rank == 0) {
    std::printf("rank 0: %d steps on %d ranks, final loss %.4f, run log in %s\n", args.steps, world, last_loss,
                rankscope::run_dir().c_str());
    if (args.ab_block > 0) {
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
      };
      const double off = median(step_ms[0]), on = median(step_ms[1]);
      std::printf("A/B: %zu steps enabled, %zu disabled; median step %.4f ms enabled vs %.4f ms disabled; ratio %.5f\n",
                  step_ms[1].size(), step_ms[0].size(), on, off, on / off);
    }
  }
  rankscope::shutdown();
  return 0;
}
