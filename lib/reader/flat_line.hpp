// The reader's fast path for the run log's own hot lines. The writer writes
// phase, step and collective lines as a flat JSON object with no whitespace,
// keys without escapes, and values that are numbers, printable-ASCII strings
// without escapes, true, false or null. For lines of that shape this scanner
// walks the members in one pass, without building a document: simdjson's DOM
// parse costs more than the rest of triage together on lines of ~160 bytes
// (and its On Demand front end was no faster on them: 295 vs 341 MB/s measured).
//
// The scanner only ever accepts or gives up; it never judges a line bad. On
// anything outside that shape (nesting, an escape, whitespace, non-ASCII, a
// number simdjson could read differently, a torn or corrupt line) it gives up
// and the line goes to simdjson, which decides. A line it accepts is valid
// JSON and decodes exactly as through simdjson: tests/test_flat_line.cpp
// checks both on every line of a real run, on every truncation, on corruptions.
// Thread-safety: a value; one per line. Cost: hot in the reader, no allocation.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace rankscope::reader::flat {

enum class TokenType : std::uint8_t { kNumber, kString, kTrue, kFalse, kNull };

/// A member's value. `text`: a number's characters, or a string's contents
/// (between the quotes; never escaped). `integer`: a number without fraction or
/// exponent, of at most 19 digits, 18 if negative (so simdjson holds it as an
/// int64 or a uint64, never as a double or an error).
struct Token {
  TokenType type = TokenType::kNull;
  bool integer = false;
  bool negative = false;          // an integer's sign
  std::uint64_t magnitude = 0;    // an integer's absolute value
  double real = 0;                // a number's value; not set for an integer (as_double() converts it)
  /// The number as a double: an integer converted as simdjson converts it.
  double as_double() const {
    if (!integer) return real;
    return negative ? -static_cast<double>(magnitude) : static_cast<double>(magnitude);
  }
  std::string_view text;
};

enum class Step : std::uint8_t {
  kMember,  // a member was read
  kEnd,     // the object closed, and the line ends there
  kGiveUp,  // not of the flat shape: parse the line with simdjson
};

/// A member's key as the writer writes it after another member: `,"name":`,
/// held as words for a compare without a scan. Keys of up to 28 characters.
class KeyPattern {
 public:
  static constexpr std::size_t kMaxBytes = 32;
  KeyPattern() = default;
  explicit KeyPattern(std::string_view name) {
    if (name.size() + 4 > kMaxBytes) return;  // never matches: such keys are scanned
    char bytes[kMaxBytes] = {};
    bytes[0] = ',';
    bytes[1] = '"';
    std::memcpy(bytes + 2, name.data(), name.size());
    bytes[name.size() + 2] = '"';
    bytes[name.size() + 3] = ':';
    len_ = static_cast<std::uint8_t>(name.size() + 4);
    name_ = name;
    for (std::size_t w = 0; w * 8 < len_; ++w) {
      std::memcpy(&word_[w], bytes + w * 8, 8);
      const std::size_t live = std::min<std::size_t>(8, len_ - w * 8);
      unsigned char m[8] = {};
      std::memset(m, 0xff, live);
      std::memcpy(&mask_[w], m, 8);
    }
  }

 private:
  friend class Scanner;
  std::uint64_t word_[kMaxBytes / 8] = {};
  std::uint64_t mask_[kMaxBytes / 8] = {};
  std::uint8_t len_ = 0;  // 0: matches nothing
  std::string_view name_;
};

class Scanner {
 public:
  /// `p[0, n)` is the line without its newline.
  Scanner(const char* p, std::size_t n) : p_(p), end_(p + n) {}

  /// The next member into (key, value).
  Step next(std::string_view& key, Token& value) {
    if (!started_) {
      started_ = true;
      if (p_ == end_ || *p_ != '{') return Step::kGiveUp;
      ++p_;
    } else if (p_ != end_ && *p_ == ',') {
      ++p_;
    } else if (p_ != end_ && *p_ == '}') {
      return ++p_ == end_ ? Step::kEnd : Step::kGiveUp;
    } else {
      return Step::kGiveUp;
    }
    if (!string(key) || p_ == end_ || *p_++ != ':') return Step::kGiveUp;
    return this->value(value) ? Step::kMember : Step::kGiveUp;
  }

  /// next(), when the next key is likely `expected` (the one at this position in
  /// the kind's last line): a match is a word compare, not a scan of the key.
  /// Reads up to 7 bytes past the line: the buffer has line_padding() after it,
  /// as simdjson requires too.
  Step next(const KeyPattern& expected, std::string_view& key, Token& value) {
    if (!started_ || expected.len_ == 0 || static_cast<std::size_t>(end_ - p_) < expected.len_) {
      return next(key, value);
    }
    for (std::size_t w = 0; w * 8 < expected.len_; ++w) {
      std::uint64_t x;
      std::memcpy(&x, p_ + w * 8, 8);
      if (((x ^ expected.word_[w]) & expected.mask_[w]) != 0) return next(key, value);
    }
    p_ += expected.len_;
    key = expected.name_;
    return this->value(value) ? Step::kMember : Step::kGiveUp;
  }

 private:
  // The bytes a string may hold here: printable ASCII but the quote and the backslash.
  static bool plain(char c) {
    static constexpr auto kPlain = [] {
      std::array<bool, 256> t{};
      for (int b = 0x20; b <= 0x7e; ++b) t[b] = b != '"' && b != '\\';
      return t;
    }();
    return kPlain[static_cast<unsigned char>(c)];
  }

  // A quoted string of printable ASCII without escapes; its contents into `out`.
  bool string(std::string_view& out) {
    if (p_ == end_ || *p_ != '"') return false;
    const char* s = ++p_;
    while (p_ != end_ && plain(*p_)) ++p_;
    if (p_ == end_ || *p_ != '"') return false;
    out = std::string_view(s, static_cast<std::size_t>(p_ - s));
    ++p_;
    return true;
  }

  bool literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return false;
    p_ += word.size();
    return true;
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  // JSON's number grammar, strictly; gives up on what simdjson could read
  // otherwise than std::from_chars (long integers, "-0", out-of-range doubles).
  bool number(Token& out) {
    const char* s = p_;
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    const char* digits = p_;
    if (p_ == end_ || !digit(*p_)) return false;
    std::uint64_t magnitude = 0;  // exact while int_digits <= 19
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && digit(*p_)) magnitude = magnitude * 10 + static_cast<unsigned>(*p_++ - '0');
    }
    const std::size_t int_digits = static_cast<std::size_t>(p_ - digits);
    bool integer = true;
    if (p_ != end_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (p_ == end_ || !digit(*p_)) return false;
      while (p_ != end_ && digit(*p_)) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !digit(*p_)) return false;
      while (p_ != end_ && digit(*p_)) ++p_;
    }
    out.type = TokenType::kNumber;
    out.integer = integer;
    out.negative = negative;
    out.magnitude = magnitude;
    out.text = std::string_view(s, static_cast<std::size_t>(p_ - s));
    if (integer) return int_digits <= (negative ? 18u : 19u) && !(negative && magnitude == 0);
    // A double simdjson would refuse (out of range) makes the whole line bad:
    // check it here even when no member reads it.
    const auto [ptr, ec] = std::from_chars(s, p_, out.real);
    return ec == std::errc() && ptr == p_;
  }

  bool value(Token& out) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '"': out.type = TokenType::kString; out.integer = false; return string(out.text);
      case 't': out.type = TokenType::kTrue; return literal("true");
      case 'f': out.type = TokenType::kFalse; return literal("false");
      case 'n': out.type = TokenType::kNull; return literal("null");
      default: return number(out);
    }
  }

  const char* p_;
  const char* end_;
  bool started_ = false;
};

}  // namespace rankscope::reader::flat
