// Enums declared by an X-macro list of X(enumerator, "name"): the enumerators,
// their names in declaration order, and the name of a value — one definition
// shared by the run log's event kinds and field keys (schema.hpp) and
// triage's finding kinds (reader/triage.hpp).
//
//   #define MY_LIST(X) X(kA, "a") X(kB, "b")
//   enum class My : std::uint8_t { MY_LIST(RANKSCOPE_DETAIL_ENUM_MEMBER) kUnknown };
//   inline constexpr std::array kMyNames{MY_LIST(RANKSCOPE_DETAIL_ENUM_NAME)};
//   enum_name(kMyNames, My::kB, "unknown") == "b"
// Thread-safety: constexpr. Cost: an array index.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#define RANKSCOPE_DETAIL_ENUM_MEMBER(e, n) e,
#define RANKSCOPE_DETAIL_ENUM_NAME(e, n) std::string_view(n),

namespace rankscope::detail {

/// names[e], or `unknown` for a value past the list (a kUnknown enumerator).
template <std::size_t N, typename E>
constexpr std::string_view enum_name(const std::array<std::string_view, N>& names, E e, std::string_view unknown) {
  const auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : unknown;
}

}  // namespace rankscope::detail
