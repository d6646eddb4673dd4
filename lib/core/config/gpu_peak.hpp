// One GPU's peak dense BF16 tensor FLOP/s by its model, from the name NVML
// gives it: MFU's denominator when RANKSCOPE_PEAK_FLOPS is not set. The figures
// are the vendor's datasheet numbers without sparsity; a run at another
// precision (FP8, TF32) sets RANKSCOPE_PEAK_FLOPS instead.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rankscope::detail {

/// The peak for `nvml_name` ("NVIDIA H100 80GB HBM3"), 0 for a model not in the table.
double dense_bf16_peak_flops(std::string_view nvml_name);

/// The node's GPUs' peak when they are all one model (the usual node), else 0; `model` is that name.
double node_dense_bf16_peak_flops(const std::vector<std::string>& nvml_names, std::string& model);

}  // namespace rankscope::detail
