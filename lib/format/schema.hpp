// The run directory's schema in one place: its file names, the run log's event
// kinds, their field keys and the schema versions. The writer (jsonl_sink, event_format,
// watchdog, flight recorder), the reader (lib/reader) and the tests name them
// from here; docs/run-log-schema.md describes them for everyone else.
// Thread-safety: constants and pure functions. Cost: cold path only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "named_enum.hpp"
#include "rankscope/export/sink.hpp"
#include "rankscope/config.hpp"
#include "rankscope/flight_recorder.hpp"
#include "rankscope/heartbeat.hpp"

namespace rankscope::schema {

// The versions (public in the headers named; one name each here).
inline constexpr int kRunLogVersion = RANKSCOPE_SCHEMA_VERSION;  // run_start.schema, run.json
inline constexpr int kHeartbeatVersion = kHeartbeatSchema;        // rank-<R>.heartbeat.json (heartbeat.hpp)
inline constexpr int kFlightVersion = kFlightRecorderSchema;      // rank-<R>.flight.json (flight_recorder.hpp)

// The kinds, the keys and each kind's shape are declared in
// rankscope/detail/run_log_schema.hpp (public: a sink's EventKind is the run
// log's kind); here they become the schema's enums and names.
using Kind = EventKind;  // kUnknown: a kind this version does not know (a newer writer): counted, skipped

inline constexpr std::array kKindNames{RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_ENUM_NAME)};
/// The kind's name as the run log spells it (a literal, so NUL-terminated).
constexpr std::string_view kind_name(Kind k) { return rankscope::detail::enum_name(kKindNames, k, "unknown"); }

/// The kind a run-log line names; kUnknown if none.
Kind kind_from_name(std::string_view name);

enum class Field : std::uint8_t {
  RANKSCOPE_DETAIL_FIELDS(RANKSCOPE_DETAIL_ENUM_MEMBER)
  kUnknown,  // a key this version does not read
};

inline constexpr std::array kFieldNames{RANKSCOPE_DETAIL_FIELDS(RANKSCOPE_DETAIL_ENUM_NAME)};
constexpr std::string_view field_name(Field f) { return rankscope::detail::enum_name(kFieldNames, f, ""); }

/// The Field a key names; kUnknown if none (one hash lookup).
Field field_from_name(std::string_view key);

namespace internal {
// `,"<name>":` as text built at compile time (the formatters copy it whole).
template <Field F>
struct MemberText {
  static constexpr std::string_view name = field_name(F);
  static constexpr std::array<char, name.size() + 4> text = [] {
    std::array<char, name.size() + 4> a{};
    a[0] = ',';
    a[1] = '"';
    for (std::size_t i = 0; i < name.size(); ++i) a[2 + i] = name[i];
    a[name.size() + 2] = '"';
    a[name.size() + 3] = ':';
    return a;
  }();
};
}  // namespace internal

/// `,"<name>":` — a member after the first.
template <Field F>
constexpr std::string_view next_key() {
  return {internal::MemberText<F>::text.data(), internal::MemberText<F>::text.size()};
}
/// `"<name>":` — the first member.
template <Field F>
constexpr std::string_view key() {
  return next_key<F>().substr(1);
}

// The run directory's files.
std::string run_json_path(std::string_view run_dir);
std::string run_log_name(int rank);  // "rank-<R>.jsonl"
std::string run_log_path(std::string_view run_dir, int rank);
std::string heartbeat_path(std::string_view run_dir, int rank);
std::string flight_path(std::string_view run_dir, int rank);
std::string torch_flight_path(std::string_view run_dir, int rank);  // PyTorch's recorder, copied at each dump
std::string position_path(std::string_view run_dir, int rank);  // "rank-<R>.position" (position.hpp)
/// The rank a file name belongs to, if it is exactly a rank's run log
/// ("rank-3.jsonl") or heartbeat ("rank-3.heartbeat.json").
std::optional<int> rank_of_run_log(std::string_view file_name);
std::optional<int> rank_of_heartbeat(std::string_view file_name);

}  // namespace rankscope::schema
