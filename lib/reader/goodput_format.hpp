// `rankscope goodput`'s report: the run's mean per rank and the ranks that lost the most
// (the accounting itself: lib/format/goodput.hpp).
#pragma once

#include <string>

#include "goodput.hpp"

namespace rankscope::reader {

using detail::Goodput;
using detail::GoodputBuilder;
using detail::kTimeCategoryCount;
using detail::TimeCategory;
using detail::time_category_label;
using detail::time_category_name;

struct RunSummary;
/// The run's mean per rank, category by category, then the ranks with the least goodput.
std::string format_goodput(const RunSummary& s);
/// {"wall_seconds", "goodput", "categories": {...}, "ranks": [{"rank", "wall_seconds", "goodput", "categories"}]}
std::string format_goodput_json(const RunSummary& s);
/// The mean over the run's ranks.
Goodput mean_goodput(const RunSummary& s);

}  // namespace rankscope::reader
