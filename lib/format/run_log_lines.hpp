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
#include <type_traits>
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
  std::int64_t step = -1;  // when it was issued
  bool on_device = false;  // the host returned from it; its GPU had not finished it
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

/// What a writer of a kind's line from an event's text and attributes needs
/// to know of its declaration (event_format.cpp writes the cold kinds so).
struct LineShape {
  Field text = Field::kUnknown;  // the first text member: where the event's text goes
  bool dur = false;              // declares `dur`
  bool level = false;            // declares `level`
  bool fields = false;           // declares `fields`: the attributes go inside it, not beside
};

/// A member's key, and whether its value is text.
struct MemberKey {
  Field key;
  bool text;
};

namespace internal {
#define RANKSCOPE_DETAIL_LINE_MEMBER_KEY(f, m, T) MemberKey{Field::f, std::is_same_v<T, std::string>},
#define RANKSCOPE_DETAIL_LINE_MEMBER_KEYS(e, n) \
  inline constexpr MemberKey kMemberKeys_##e[] = {RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_LINE_MEMBER_KEY) MemberKey{Field::kUnknown, false}};
RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_MEMBER_KEYS)
#undef RANKSCOPE_DETAIL_LINE_MEMBER_KEYS
#undef RANKSCOPE_DETAIL_LINE_MEMBER_KEY

template <std::size_t N>
constexpr LineShape shape_of(const MemberKey (&members)[N]) {
  LineShape s;
  for (std::size_t i = 0; i + 1 < N; ++i) {
    if (members[i].text && s.text == Field::kUnknown) s.text = members[i].key;
    s.dur |= members[i].key == Field::kDur;
    s.level |= members[i].key == Field::kLevel;
    s.fields |= members[i].key == Field::kFields;
  }
  return s;
}
}  // namespace internal

/// The members a kind's lines may carry beyond the ones every line has
/// (kHeaderKeys), in the order the writer writes them.
inline std::span<const MemberKey> line_members(Kind k) {
  switch (k) {
#define RANKSCOPE_DETAIL_LINE_MEMBERS_CASE(e, n) \
  case Kind::e: return {internal::kMemberKeys_##e, std::size(internal::kMemberKeys_##e) - 1};
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_MEMBERS_CASE)
#undef RANKSCOPE_DETAIL_LINE_MEMBERS_CASE
    case Kind::kUnknown: break;
  }
  return {};
}

constexpr LineShape line_shape(Kind k) {
  switch (k) {
#define RANKSCOPE_DETAIL_LINE_SHAPE_CASE(e, n) \
  case Kind::e: return internal::shape_of(internal::kMemberKeys_##e);
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_LINE_SHAPE_CASE)
#undef RANKSCOPE_DETAIL_LINE_SHAPE_CASE
    case Kind::kUnknown: break;
  }
  return {};
}

/// The keys every line has: kind, t, mono, rank, and where they apply step and tid.
inline constexpr Field kHeaderKeys[] = {Field::kKind, Field::kT, Field::kMono, Field::kRank, Field::kStep, Field::kTid};

}  // namespace rankscope::schema
