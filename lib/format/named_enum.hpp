// Enums declared by an X-macro list of X(enumerator, "name"): the enumerators,
// their names in declaration order, and the name of a value — one definition
// shared by the run log's event kinds and field keys (schema.hpp) and
// triage's finding kinds (reader/triage.hpp).
//
//   #define MY_LIST(X) X(kA, "a") X(kB, "b")
//   enum class My : std::uint8_t { MY_LIST(RANKSCOPE_DETAIL_ENUM_MEMBER) kUnknown };
//   inline constexpr std::array kMyNames{MY_LIST(RANKSCOPE_DETAIL_ENUM_NAME)};
//   enum_name(kMyNames, My::kB, "unknown") == "b"
//
// NameIndex maps names back (a reader looks one up per key of every line).
// Thread-safety: constexpr / immutable after construction. Cost: an array
// index; a name looked up: one hash and one short comparison.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
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

/// Name -> enumerator: an open-addressed table of `Slots` (a power of two,
/// several times the names) on a hash of the length and three bytes. Against
/// a generic map (hashing every byte, then memcmp) it took a one-thread triage
/// of 1,024 x 1,000 from 14.4 to 11.6 s. Names are compared inline: a call
/// into memcmp showed as 5-9 % of the reader in perf.
template <typename E, std::size_t Slots>
class NameIndex {
  static_assert((Slots & (Slots - 1)) == 0, "Slots must be a power of two");

 public:
  /// name_of(E(i)) for i in [0, count) is each enumerator's name.
  template <typename NameOf>
  constexpr NameIndex(std::size_t count, NameOf name_of) {
    for (std::size_t e = 0; e < count; ++e) {
      const std::string_view n = name_of(static_cast<E>(e));
      std::uint32_t i = slot(n);
      while (!names_[i].empty()) i = (i + 1) & (Slots - 1);
      names_[i] = n;
      values_[i] = static_cast<E>(e);
    }
  }

  /// The enumerator named `name`, or `unknown`.
  constexpr E find(std::string_view name, E unknown) const {
    if (name.empty()) return unknown;
    for (std::uint32_t i = slot(name);; i = (i + 1) & (Slots - 1)) {
      const std::string_view n = names_[i];
      if (n.empty()) return unknown;
      if (same(n, name)) return values_[i];
    }
  }

 private:
  static constexpr std::uint32_t slot(std::string_view k) {
    std::uint32_t h = static_cast<std::uint32_t>(k.size());
    if (!k.empty()) {
      h = h * 131 + static_cast<unsigned char>(k[0]);
      h = h * 131 + static_cast<unsigned char>(k[k.size() / 2]);
      h = h * 131 + static_cast<unsigned char>(k.back());
    }
    return (h * 2654435761u) & (Slots - 1);
  }
  // Names are short (~6 bytes): a loop beats a call into memcmp.
  static constexpr bool same(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) return false;
    }
    return true;
  }

  std::array<std::string_view, Slots> names_{};
  std::array<E, Slots> values_{};
};

}  // namespace rankscope::detail
