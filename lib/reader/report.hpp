// `rankscope report RUN_DIR -o report.html`: one self-contained HTML page
// (opens offline) with the findings and their evidence, a ranks x steps heat
// map, step time per rank, goodput, phases, collective bandwidth, loss / lr /
// grad-norm curves and resources. Aggregates where ranks are many: step time
// as a p10-p90 band with the slowest ranks drawn, phases in rank groups, the
// heat map one pixel row per rank; the page's size grows with ranks x ~600
// columns, not with steps.
// Thread-safety: pure functions of their inputs.
#pragma once

#include <string>

#include "diff.hpp"

namespace rankscope::reader {

/// The page's data (the JSON the page renders), for tests and tools.
std::string report_data_json(const AnalyzedRun& run);
/// The whole page.
std::string render_report(const AnalyzedRun& run);
/// Whether this build embedded Chart.js (without it the page has the heat map and tables only).
bool report_has_charts();

}  // namespace rankscope::reader
