// The one median every rule, gauge and report compares against: the upper
// middle element (v[n/2]) found by selection, O(n), so an even count needs no
// averaging and integer nanoseconds stay integers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace rankscope::detail {

// Reorders v (the upper half ends up after the median).
template <typename T>
T median_in_place(std::vector<T>& v, T if_empty = T{}) {
  if (v.empty()) return if_empty;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

template <typename T>
T median_of(std::vector<T> v, T if_empty = T{}) {
  return median_in_place(v, if_empty);
}

}  // namespace rankscope::detail
