// A run-log event as one line of text: its header and every member of its
// kind's value, doubles bit-exact. Tests compare two decodings of the same
// line through it (test_flat_line.cpp, fuzz/fuzz_line.cpp).
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "run_log.hpp"

namespace rankscope::test {

namespace describe_detail {
inline void put(std::string& out, double v) { fmt::format_to(std::back_inserter(out), "{:x}", std::bit_cast<std::uint64_t>(v)); }
inline void put(std::string& out, const std::string& v) { fmt::format_to(std::back_inserter(out), "'{}'", v); }
inline void put(std::string& out, const schema::Members& v) {
  for (const auto& [k, x] : v.items) fmt::format_to(std::back_inserter(out), "{}={};", k, x);
}
inline void put(std::string& out, const schema::Environment& v) {
  out += v.cpu_affinity;
  for (const auto& [k, x] : v.flat) fmt::format_to(std::back_inserter(out), ";{}={}", k, x);
}
inline void put(std::string& out, const schema::InnermostPhase& v) { out += v.name; }
inline void put(std::string& out, const schema::FirstInFlight& v) {
  fmt::format_to(std::back_inserter(out), "{}/{}/{}/{}", v.op, v.comm, v.seq, v.count);
}
inline void put(std::string& out, const schema::Json& v) { out += v.text; }
template <typename T>
void put(std::string& out, const std::optional<T>& v) {
  if (!v) {
    out += "none";
    return;
  }
  put(out, *v);
}
template <typename T>
void put(std::string& out, const std::vector<T>& v) {
  for (const auto& x : v) {
    put(out, x);
    out += ',';
  }
}
template <typename T>
  requires(std::is_integral_v<T> || std::is_enum_v<T>)
void put(std::string& out, T v) {
  if constexpr (std::is_enum_v<T>) {
    fmt::format_to(std::back_inserter(out), "{}", static_cast<long long>(v));
  } else {
    fmt::format_to(std::back_inserter(out), "{}", v);
  }
}
}  // namespace describe_detail

inline std::string describe(const reader::LogEvent& e) {
  std::string out = fmt::format("k={} rank={} step={} t={} mono={} tid={} body={}", static_cast<int>(e.k), e.rank,
                                e.step, e.t, e.mono, e.tid, e.body.index());
  std::visit(
      [&](const auto& line) {
        if constexpr (!std::is_same_v<std::decay_t<decltype(line)>, std::monostate>) {
          schema::for_each_member(line, [&](schema::Field f, const auto& m) {
            fmt::format_to(std::back_inserter(out), " {}=", schema::field_name(f));
            describe_detail::put(out, m);
          });
        }
      },
      e.body);
  return out;
}

}  // namespace rankscope::test
