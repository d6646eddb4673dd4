// The run log's lines as typed values, one struct per kind, derived from the
// shapes declared in schema.hpp (RANKSCOPE_LINE_<kind>): the reader decodes a
// line into schema::Line<Kind::k...> and hands the tools the LineBody variant;
// tests walk the same declaration to check the writer and the docs.
// Thread-safety: plain values. Cost: cold path (the reader, the tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "rankscope/collective.hpp"
#include "rankscope/log.hpp"
#include "rankscope/site.hpp"
#include "schema.hpp"

namespace rankscope::schema {

// What the reader keeps of a line's nested values.
/// An object's members, each as its canonical text: a string's value, else
/// the member's minified JSON (a fact's or log's `fields`, a metric's `labels`).
struct Members {
  std::vector<std::pair<std::string, std::string>> items;
};
/// run_start's environment: its CPU affinity, and every leaf flattened with
/// dotted keys ("torch", "env.NCCL_ALGO", "gpus.0.name"), which config drift
/// compares across ranks.
struct Environment {
  std::string cpu_affinity;
  std::vector<std::pair<std::string, std::string>> flat;
};
/// A stall's `open_phases`: the innermost one's name (where the rank is).
struct InnermostPhase {
  std::string name;
};
/// A stall's `in_flight`: the first collective in flight.
struct FirstInFlight {
  std::string op, comm;
  std::uint64_t seq = 0, count = 0;
};
/// A value kept as its minified JSON text (a violation's `values`).
struct Json {
  std::string text;
};

/// One kind's line, less the members every line has (LineHeader).
template <Kind K>
struct Line;

#define RANKSCOPE_DETAIL_LINE_MEMBER(f, m, T) T m{};
#define RANKSCOPE_DETAIL_LINE_STRUCT(e, n) \
  template <>                              \
  struct Line<Kind::e> {                   \
    static constexpr Kind kind = Kind::e;  \
    RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_LINE_MEMBER)      \
  };
RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_STRUCT)
#undef RANKSCOPE_DETAIL_LINE_STRUCT
#undef RANKSCOPE_DETAIL_LINE_MEMBER

/// A line of any kind; index 0 (monostate) is a kind this version does not know,
/// kind k is alternative k + 1.
#define RANKSCOPE_DETAIL_LINE_ALTERNATIVE(e, n) , Line<Kind::e>
using LineBody = std::variant<std::monostate RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_ALTERNATIVE)>;
#undef RANKSCOPE_DETAIL_LINE_ALTERNATIVE

/// Calls fn(Field, const member&) for each of a line's members, in declaration order.
#define RANKSCOPE_DETAIL_LINE_VISIT(f, m, T) fn(Field::f, line.m);
#define RANKSCOPE_DETAIL_LINE_FOR_EACH(e, n)                                           \
  template <typename Fn>                                                              \
  void for_each_member([[maybe_unused]] const Line<Kind::e>& line, [[maybe_unused]] Fn&& fn) { \
    RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_LINE_VISIT)                                   \
  }                                                                                   \
  template <typename Fn>                                                              \
  void for_each_member([[maybe_unused]] Line<Kind::e>& line, [[maybe_unused]] Fn&& fn) { \
    RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_LINE_VISIT)                                   \
  }
RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_FOR_EACH)
#undef RANKSCOPE_DETAIL_LINE_FOR_EACH
#undef RANKSCOPE_DETAIL_LINE_VISIT

namespace internal {
#define RANKSCOPE_DETAIL_LINE_KEY(f, m, T) Field::f,
#define RANKSCOPE_DETAIL_LINE_KEYS(e, n) \
  inline constexpr Field kKeys_##e[] = {RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_LINE_KEY) Field::kUnknown};
RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_KEYS)
#undef RANKSCOPE_DETAIL_LINE_KEYS
#undef RANKSCOPE_DETAIL_LINE_KEY
}  // namespace internal

/// The keys a kind's lines may carry beyond the ones every line has, in the
/// order the writer writes them.
inline std::span<const Field> line_keys(Kind k) {
  switch (k) {
#define RANKSCOPE_DETAIL_LINE_KEYS_CASE(e, n) \
  case Kind::e: return {internal::kKeys_##e, std::size(internal::kKeys_##e) - 1};
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_KEYS_CASE)
#undef RANKSCOPE_DETAIL_LINE_KEYS_CASE
    case Kind::kUnknown: break;
  }
  return {};
}

/// The keys every line has: kind, t, mono, rank, and where they apply step and tid.
inline constexpr Field kHeaderKeys[] = {Field::kKind, Field::kT, Field::kMono, Field::kRank, Field::kStep, Field::kTid};

}  // namespace rankscope::schema
