#include "gpu_peak.hpp"

#include <algorithm>
#include <cctype>

namespace rankscope::detail {

namespace {
struct Peak {
  const char* contains;  // in the upper-cased NVML name; the first entry that matches wins
  double flops;
};
// Most specific first: "H100 PCIE" before "H100", "GH200" before "H200".
constexpr Peak kPeaks[] = {
    {"GB200", 2.5e15},    {"B200", 2.25e15},     {"B100", 1.75e15},   {"GH200", 989.4e12},
    {"H200", 989.4e12},   {"H100 PCIE", 756.5e12}, {"H100 NVL", 835.5e12}, {"H100", 989.4e12},
    {"H800", 989.4e12},   {"A100", 312e12},      {"A800", 312e12},    {"L40S", 362.05e12},
    {"L4", 121e12},       {"A10", 125e12},       {"V100", 125e12},  // V100: its FP16 tensor peak (no BF16)
};
}  // namespace

double dense_bf16_peak_flops(std::string_view nvml_name) {
  std::string up(nvml_name);
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (const Peak& p : kPeaks) {
    const std::string_view key(p.contains);
    for (std::size_t at = up.find(key); at != std::string::npos; at = up.find(key, at + 1)) {
      // A whole token: "L4" is not "L40S", "A10" is not "A100".
      const std::size_t end = at + key.size();
      const bool starts = at == 0 || !std::isalnum(static_cast<unsigned char>(up[at - 1]));
      const bool ends = end == up.size() || !std::isalnum(static_cast<unsigned char>(up[end]));
      if (starts && ends) return p.flops;
    }
  }
  return 0;
}

double node_dense_bf16_peak_flops(const std::vector<std::string>& nvml_names, std::string& model) {
  model.clear();
  if (nvml_names.empty()) return 0;
  for (const std::string& n : nvml_names) {
    if (n != nvml_names.front()) return 0;  // mixed models: which one this rank drives is not known here
  }
  const double peak = dense_bf16_peak_flops(nvml_names.front());
  if (peak > 0) model = nvml_names.front();
  return peak;
}

}  // namespace rankscope::detail
