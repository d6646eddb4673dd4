#include "schema.hpp"

#include <array>
#include <charconv>
#include <cstring>

#include <fmt/format.h>


namespace rankscope::schema {

Kind kind_from_name(std::string_view name) {
  static constexpr rankscope::detail::NameIndex<Kind, 128> kIndex(kKindNames.size(), kind_name);
  return kIndex.find(name, Kind::kUnknown);
}

Field field_from_name(std::string_view key) {
  static constexpr rankscope::detail::NameIndex<Field, 1024> kIndex(kFieldNames.size(), field_name);
  return kIndex.find(key, Field::kUnknown);
}

std::string run_json_path(std::string_view run_dir) { return fmt::format("{}/run.json", run_dir); }
std::string run_log_name(int rank) { return fmt::format("rank-{}.jsonl", rank); }
std::string run_log_path(std::string_view run_dir, int rank) { return fmt::format("{}/rank-{}.jsonl", run_dir, rank); }
std::string heartbeat_path(std::string_view run_dir, int rank) {
  return fmt::format("{}/rank-{}.heartbeat.json", run_dir, rank);
}
std::string flight_path(std::string_view run_dir, int rank) { return fmt::format("{}/rank-{}.flight.json", run_dir, rank); }
std::string torch_flight_path(std::string_view run_dir, int rank) {
  return fmt::format("{}/rank-{}.torch-flight.json", run_dir, rank);
}
std::string position_path(std::string_view run_dir, int rank) { return fmt::format("{}/rank-{}.position", run_dir, rank); }

namespace {
// "rank-<R><suffix>" with R a canonical non-negative decimal, else nothing.
std::optional<int> rank_of(std::string_view name, std::string_view suffix) {
  constexpr std::string_view kPrefix = "rank-";
  if (name.size() <= kPrefix.size() + suffix.size() || name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int rank = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (ec != std::errc() || end != digits.data() + digits.size() || rank < 0) return std::nullopt;
  return rank;
}
}  // namespace

std::optional<int> rank_of_run_log(std::string_view file_name) { return rank_of(file_name, ".jsonl"); }
std::optional<int> rank_of_heartbeat(std::string_view file_name) { return rank_of(file_name, ".heartbeat.json"); }

}  // namespace rankscope::schema
