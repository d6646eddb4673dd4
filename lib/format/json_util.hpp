// Minimal JSON writing helpers on top of fmt (escaping, non-finite numbers).
#pragma once

#include <string>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "schema.hpp"
#include "decimal.hpp"

namespace rankscope::detail {

// `s` as a quoted JSON string at `p`, which needs json_escaped_most(s)
// bytes of room; returns the end.
inline std::size_t json_escaped_most(std::string_view s) { return 6 * s.size() + 2; }
inline char* json_escape_at(char* p, std::string_view s) {
  *p++ = '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c != '"' && c != '\\') {
      *p++ = ch;
      continue;
    }
    *p++ = '\\';
    switch (c) {
      case '"': *p++ = '"'; break;
      case '\\': *p++ = '\\'; break;
      case '\n': *p++ = 'n'; break;
      case '\r': *p++ = 'r'; break;
      case '\t': *p++ = 't'; break;
      default:  // other control characters: \u00XX
        std::memcpy(p, "u00", 3);
        p[3] = "0123456789abcdef"[c >> 4];
        p[4] = "0123456789abcdef"[c & 15];
        p += 5;
    }
  }
  *p++ = '"';
  return p;
}
inline void json_escape_to(fmt::memory_buffer& out, std::string_view s) {
  const std::size_t used = out.size();
  out.resize(used + json_escaped_most(s));
  out.resize(static_cast<std::size_t>(json_escape_at(out.data() + used, s) - out.data()));
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
// Writes at `p`, which needs kJsonNumberMost bytes of room; returns the end.
inline constexpr std::size_t kJsonNumberMost = 32;  // "-1.7976931348623157e+308" is 24
inline char* json_number_at(char* p, double v) {
  const auto text = [p](std::string_view s) {
    std::memcpy(p, s.data(), s.size());
    return p + s.size();
  };
  if (std::isnan(v)) return text("\"NaN\"");
  if (!std::isfinite(v)) return text(v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
  if (std::fabs(v) < 1e15 && v == std::trunc(v) && !(v == 0 && std::signbit(v))) {
    return decimal::write_int(p, static_cast<std::int64_t>(v));
  }
  if (std::fabs(v) < 1e15 && static_cast<double>(static_cast<float>(v)) == v) {
    return fmt::format_to(p, FMT_COMPILE("{}"), static_cast<float>(v));
  }
  return fmt::format_to(p, FMT_COMPILE("{}"), v);
}

// A derived rate (GB/s): six decimals, written with integer formatting. The
// shortest round-trip form costs a float-to-decimal conversion and ~17 digits
// per value on every collective line, for precision nobody reads. Same room
// and result as json_number_at.
inline char* json_rate_at(char* p, double v) {
  if (!(v >= 0.0 && v < 1e12)) return json_number_at(p, v);
  const auto micro = static_cast<std::uint64_t>(v * 1e6 + 0.5);
  p = decimal::write(p, micro / 1000000);
  std::uint64_t frac = micro % 1000000;
  if (frac == 0) return p;
  int digits = 6;
  while (frac % 10 == 0) frac /= 10, --digits;
  *p++ = '.';
  for (int i = digits - 1; i >= 0; --i, frac /= 10) p[i] = static_cast<char>('0' + frac % 10);
  return p + digits;
}

// The same, appended to a buffer.
inline void json_number_to(fmt::memory_buffer& out, double v) {
  char text[kJsonNumberMost];
  out.append(std::string_view(text, static_cast<std::size_t>(json_number_at(text, v) - text)));
}
inline void json_rate_to(fmt::memory_buffer& out, double v) {
  char text[kJsonNumberMost];
  out.append(std::string_view(text, static_cast<std::size_t>(json_rate_at(text, v) - text)));
}

// The length of the longest prefix of `s` of at most `max` bytes that does not
// end inside a UTF-8 sequence: a cut message stays valid UTF-8 (the reader
// rejects a line that is not).
inline std::size_t utf8_prefix(std::string_view s, std::size_t max) {
  if (s.size() <= max) return s.size();
  std::size_t n = max;
  while (n > 0 && max - n < 4 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}


// The cold-path JSON writer: objects, arrays, escaped strings and numbers that
// read back, with the commas placed for you. Every `--json` output and the
// files written outside the hot formatter (event_format.cpp) go through it, so
// escaping has one implementation. Not for the hot path (it allocates).
//
//   JsonWriter w;  // keys of the run directory's files: schema::Field, not text
//   w.begin_object().field(schema::Field::kRank, 3).field("verdict", v).key("culprits").begin_array();
//   for (int r : culprits) w.value(r);
//   w.end_array().end_object();
//   std::string doc = w.take();
//
// Layout: compact by default; JsonWriter(out) appends to a caller's buffer
// (a run-log line); indented(n) writes one member or element per line, n
// spaces a level, `"k": v` (run.json); newline(n) puts the next member or
// element (or the closing bracket) on a new line indented n spaces, for files
// that break a compact document at a few places (the flight dump).
class JsonWriter {
 public:
  JsonWriter() : b_(own_) {}
  /// Appends to `out` (which must outlive the writer), e.g. after a line's
  /// opening members: `JsonWriter w(buf); w.continue_object().field("k", v);`
  explicit JsonWriter(fmt::memory_buffer& out) : b_(out) {}
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  /// One member or element per line, `spaces` a level: `JsonWriter w; w.indented(2);`
  JsonWriter& indented(int spaces) {
    indent_ = spaces;
    return *this;
  }
  /// The next member, element or closing bracket starts a new line, `spaces` in.
  JsonWriter& newline(int spaces = 0) {
    break_ = spaces;
    return *this;
  }
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }
  /// The buffer already holds an open object with members (`{"kind":"metric"`,
  /// written by the hot formatter): what follows are more members of it.
  JsonWriter& continue_object() {
    first_.push_back(false);
    return *this;
  }
  // Keys of the run directory's files come from the schema (schema.hpp).
  JsonWriter& key(schema::Field k) { return key(schema::field_name(k)); }
  template <typename T>
  JsonWriter& field(schema::Field k, const T& v) {
    return field(schema::field_name(k), v);
  }
  template <typename Range>
  JsonWriter& array(schema::Field k, const Range& values) {
    return array(schema::field_name(k), values);
  }
  template <typename Map>
  JsonWriter& object(schema::Field k, const Map& members) {
    return object(schema::field_name(k), members);
  }
  JsonWriter& key(std::string_view k) {
    comma();
    json_escape_to(b_, k);
    b_.append(std::string_view(indent_ > 0 ? ": " : ":"));
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view s) {
    comma();
    json_escape_to(b_, s);
    return *this;
  }
  JsonWriter& value(const char* s) { return value(std::string_view(s != nullptr ? s : "")); }
  JsonWriter& value(const std::string& s) { return value(std::string_view(s)); }
  JsonWriter& value(bool v) { return raw(v ? "true" : "false"); }
  template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>>
  JsonWriter& value(T v) {  // fmt::format_int: no format string to parse (a histogram's counts)
    comma();
    const auto text = std::is_signed_v<T> ? fmt::format_int(static_cast<long long>(v))
                                          : fmt::format_int(static_cast<unsigned long long>(v));
    b_.append(text.data(), text.data() + text.size());
    return *this;
  }
  JsonWriter& value(double v) {  // shortest form that reads back; NaN/Infinity as strings (json_number_at)
    comma();
    json_number_to(b_, v);
    return *this;
  }
  // `v` with `digits` decimals (times in ms for people and tools alike); null if not finite.
  JsonWriter& fixed(double v, int digits) {
    if (!std::isfinite(v)) return null();
    comma();
    fmt::format_to(fmt::appender(b_), "{:.{}f}", v, digits);
    return *this;
  }
  /// A 64-bit hash as 16 hex digits in a string: "00ab...".
  JsonWriter& hex(std::uint64_t v) {
    comma();
    fmt::format_to(fmt::appender(b_), "\"{:016x}\"", v);
    return *this;
  }
  /// A value already rendered as JSON (an environment object, a run-log line);
  /// written as is, so it must be valid JSON.
  JsonWriter& json(std::string_view text) { return raw(text); }
  JsonWriter& null() { return raw("null"); }
  template <typename T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  template <typename Range>
  JsonWriter& array(std::string_view k, const Range& values) {
    key(k).begin_array();
    for (const auto& v : values) value(v);
    return end_array();
  }
  /// Members of a string-to-string map (labels, a run's config), in its order.
  template <typename Map>
  JsonWriter& object(std::string_view k, const Map& members) {
    key(k).begin_object();
    for (const auto& [mk, mv] : members) field(mk, mv);
    return end_object();
  }
  /// The document, with a trailing newline; the writer is empty after.
  std::string take() {
    b_.push_back('\n');
    std::string out(b_.data(), b_.size());
    b_.clear();
    first_.clear();
    return out;
  }

 private:
  JsonWriter& open(char c) {
    comma();
    b_.push_back(c);
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char c) {
    const bool empty = !first_.empty() && first_.back();
    if (!first_.empty()) first_.pop_back();
    if (break_ >= 0) line(std::exchange(break_, -1));
    else if (indent_ > 0 && !empty) line(indent_ * static_cast<int>(first_.size()));
    b_.push_back(c);
    return *this;
  }
  JsonWriter& raw(std::string_view text) {
    comma();
    b_.append(text);
    return *this;
  }
  // A comma before every member or element but the first of its container,
  // then the line break the layout asks for.
  void comma() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) b_.push_back(',');
    first_.back() = false;
    if (break_ >= 0) line(std::exchange(break_, -1));
    else if (indent_ > 0) line(indent_ * static_cast<int>(first_.size()));
  }
  void line(int spaces) {
    b_.push_back('\n');
    for (int i = 0; i < spaces; ++i) b_.push_back(' ');
  }
  fmt::memory_buffer own_;
  fmt::memory_buffer& b_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool after_key_ = false;
  int indent_ = 0;   // spaces a level; 0: compact
  int break_ = -1;   // newline(): the next item's indent; -1: none
};

}  // namespace rankscope::detail
