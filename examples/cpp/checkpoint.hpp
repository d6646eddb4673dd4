// The example trainer's checkpoints: <dir>/step-<S>/{model.pt,meta.txt},
// written by rank 0, read by every rank on --resume. meta.txt is the
// rankscope::CheckpointMeta the invariant checks compare, as key=value lines.
#pragma once

#include <torch/torch.h>

#include <rankscope/invariants.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace example {

inline void save_checkpoint(const std::string& dir, torch::nn::Sequential& model,
                            const rankscope::CheckpointMeta& m) {
  std::filesystem::create_directories(dir);
  torch::save(model, dir + "/model.pt");
  std::ofstream f(dir + "/meta.txt.tmp");
  f << "step=" << m.step << "\nconsumed_samples=" << m.consumed_samples << "\nworld_size=" << m.world_size
    << "\nglobal_batch=" << m.global_batch << "\nconfig_hash=" << m.config_hash
    << "\noptimizer_step=" << m.optimizer_step << "\n";
  f.close();
  std::filesystem::rename(dir + "/meta.txt.tmp", dir + "/meta.txt");  // complete checkpoints only
}

inline std::optional<rankscope::CheckpointMeta> load_checkpoint(const std::string& dir,
                                                                torch::nn::Sequential& model) {
  std::ifstream f(dir + "/meta.txt");
  if (!f) return std::nullopt;
  rankscope::CheckpointMeta m;
  m.id = std::filesystem::path(dir).filename().string();
  for (std::string line; std::getline(f, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "step") m.step = std::stoll(v);
    else if (k == "consumed_samples") m.consumed_samples = std::stoll(v);
    else if (k == "world_size") m.world_size = std::stoll(v);
    else if (k == "global_batch") m.global_batch = std::stoll(v);
    else if (k == "config_hash") m.config_hash = std::stoull(v);
    else if (k == "optimizer_step") m.optimizer_step = std::stoll(v);
  }
  torch::load(model, dir + "/model.pt");
  return m;
}

// Complete checkpoints under `root`, oldest first.
inline std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<long long, std::string>> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && std::filesystem::exists(e.path() / "meta.txt")) {
      found.emplace_back(std::stoll(name.substr(5)), e.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(p);
  return out;
}

}  // namespace example
