// The example trainer's data: an in-memory synthetic dataset, a sampler with
// torch.utils.data.DistributedSampler's semantics, and a prefetching loader
// thread over one epoch of a rank's shard.
#pragma once

#include <torch/torch.h>

#include <rankscope/rankscope.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace example {

// Sample i is row i of a fixed random matrix; its class is the argmax of its
// first `classes` features (learnable).
struct Dataset {
  Dataset(std::int64_t n, int features, int classes) : size(n) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    x = torch::randn({n, features}, gen);
    y = x.narrow(1, 0, classes).argmax(1);
  }
  std::int64_t size;
  torch::Tensor x, y;
};

// DistributedSampler: shuffle 0..n-1 with seed + epoch, pad to a multiple of
// world by repeating from the start, take every world-th index from rank.
inline std::vector<std::int64_t> shard_indices(std::int64_t n, int rank, int world, std::uint64_t seed,
                                               std::int64_t epoch, bool shuffle) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (shuffle) {
    std::mt19937_64 g(seed + static_cast<std::uint64_t>(epoch));
    std::shuffle(all.begin(), all.end(), g);
  }
  const std::int64_t total = (n + world - 1) / world * world;
  for (std::int64_t i = n; i < total; ++i) all.push_back(all[static_cast<std::size_t>(i - n)]);
  std::vector<std::int64_t> mine;
  for (std::int64_t i = rank; i < total; i += world) mine.push_back(all[static_cast<std::size_t>(i)]);
  return mine;
}

struct Batch {
  torch::Tensor x, y;
  std::int64_t index = 0;  // position in the epoch
};

// The error a corrupt sample raises in the loader (see --skip-rank).
struct LoaderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A prefetching loader thread with a bounded queue, like a DataLoader, over
// one epoch; batches from `first` on (a resumed epoch starts mid-way).
// `fail_at` >= 0: that batch raises LoaderError instead (a corrupt sample).
class Loader {
 public:
  Loader(const Dataset& ds, std::vector<std::int64_t> indices, int batch, std::int64_t first, std::int64_t fail_at)
      : ds_(ds), indices_(std::move(indices)), batch_(batch), next_(first), fail_at_(fail_at) {
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
  // The next batch; nullopt at the end of the epoch.
  std::optional<Batch> next() {
    RANKSCOPE_PHASE("loader_wait");
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !q_.empty(); });
    Item it = std::move(q_.front());
    q_.pop_front();
    cv_.notify_all();
    if (it.failed) throw LoaderError("corrupt sample in batch " + std::to_string(it.batch.index));
    if (it.end) return std::nullopt;
    return std::move(it.batch);
  }

 private:
  struct Item {
    Batch batch;
    bool failed = false, end = false;
  };
  void run() {
    for (;;) {
      Item it;
      const std::int64_t start = next_ * batch_;
      if (start >= static_cast<std::int64_t>(indices_.size())) {
        it.end = true;
      } else {
        RANKSCOPE_PHASE_AS("loader_produce", rankscope::PhaseKind::kOther);
        const std::int64_t n = std::min<std::int64_t>(batch_, static_cast<std::int64_t>(indices_.size()) - start);
        auto idx = torch::from_blob(indices_.data() + start, {n}, torch::kInt64);
        it.batch = {ds_.x.index_select(0, idx), ds_.y.index_select(0, idx), next_};
        it.failed = next_ == fail_at_;
      }
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || q_.size() < 4; });
      if (stop_) return;
      const bool end = it.end;
      q_.push_back(std::move(it));
      cv_.notify_all();
      if (end) return;
      ++next_;
    }
  }
  const Dataset& ds_;
  std::vector<std::int64_t> indices_;
  int batch_;
  std::int64_t next_, fail_at_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> q_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace example
