// Minimal JSON writing helpers on top of fmt (escaping, non-finite numbers).
#pragma once

#include <string>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "decimal.hpp"

namespace rankscope::detail {

inline void json_escape_to(fmt::memory_buffer& out, std::string_view s) {
  out.push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (c < 0x20) fmt::format_to(fmt::appender(out), "\\u{:04x}", c);
        else out.push_back(ch);
    }
  }
  out.push_back('"');
}

// `s` as a quoted, escaped JSON string.
inline std::string json_quoted(std::string_view s) {
  fmt::memory_buffer b;
  json_escape_to(b, s);
  return std::string(b.data(), b.size());
}

// Shortest round-trip form, with two cheaper exact cases first:
//  - a whole number below 10^15 (byte counts, sample counts in gauges) as its
//    integer digits, the text fmt writes for it, by integer formatting;
//  - a double that holds a float exactly (a float32 loss or grad norm,
//    widened) in float's shortest form, "2.1404357" rather than
//    "2.1404356956481934": the digits the value has, half the bytes and a
//    cheaper conversion on the run log's most frequent numbers. Read as
//    float32 it is the same value; read as a double it differs past the 8th
//    digit.
// JSON has no NaN/Infinity; a NaN loss is exactly what a reader wants to see,
// so non-finite values are written as the strings "NaN", "Infinity", "-Infinity".
inline void json_number_to(fmt::memory_buffer& out, double v) {
  if (std::isfinite(v)) {
    if (std::fabs(v) < 1e15 && v == std::trunc(v) && !(v == 0 && std::signbit(v))) {
      char digits[24];
      out.append(std::string_view(digits, static_cast<std::size_t>(
                                               decimal::write_int(digits, static_cast<std::int64_t>(v)) - digits)));
    } else if (std::fabs(v) < 1e15 && static_cast<double>(static_cast<float>(v)) == v) {
      fmt::format_to(fmt::appender(out), FMT_COMPILE("{}"), static_cast<float>(v));
    } else {
      fmt::format_to(fmt::appender(out), FMT_COMPILE("{}"), v);
    }
  } else if (std::isnan(v)) {
    out.append(std::string_view("\"NaN\""));
  } else {
    out.append(v > 0 ? std::string_view("\"Infinity\"") : std::string_view("\"-Infinity\""));
  }
}

// A derived rate (GB/s): six decimals, written with integer formatting. The
// shortest round-trip form costs a float-to-decimal conversion and ~17 digits
// per value on every collective line, for precision nobody reads.
inline void json_rate_to(fmt::memory_buffer& out, double v) {
  if (!(v >= 0.0 && v < 1e12)) return json_number_to(out, v);
  const auto micro = static_cast<std::uint64_t>(v * 1e6 + 0.5);
  char whole[20];
  out.append(std::string_view(whole, static_cast<std::size_t>(decimal::write(whole, micro / 1000000) - whole)));
  std::uint64_t frac = micro % 1000000;
  if (frac == 0) return;
  int digits = 6;
  while (frac % 10 == 0) frac /= 10, --digits;
  char buf[8];
  for (int i = digits - 1; i >= 0; --i, frac /= 10) buf[i] = static_cast<char>('0' + frac % 10);
  out.push_back('.');
  out.append(std::string_view(buf, static_cast<std::size_t>(digits)));
}

}  // namespace rankscope::detail
