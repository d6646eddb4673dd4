// A minimal protobuf wire-format writer: enough for the OTLP messages
// (varint, fixed64, double, length-delimited strings/bytes/messages, packed
// repeated fixed64 and double). Nested messages are built in their own
// writer and appended with their length — simple, and the OTLP payloads are
// small. Correctness is checked against the OpenTelemetry project's generated
// decoder (tests/otlp/check.js).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace rankscope::detail::pb {

class Writer {
 public:
  void varint(std::uint32_t field, std::uint64_t v) {
    tag(field, 0);
    raw_varint(v);
  }
  void boolean(std::uint32_t field, bool v) { varint(field, v ? 1 : 0); }
  void fixed64(std::uint32_t field, std::uint64_t v) {
    tag(field, 1);
    raw_fixed64(v);
  }
  void sfixed64(std::uint32_t field, std::int64_t v) { fixed64(field, static_cast<std::uint64_t>(v)); }
  void fixed32(std::uint32_t field, std::uint32_t v) {
    tag(field, 5);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void dbl(std::uint32_t field, double d) {
    std::uint64_t v;
    std::memcpy(&v, &d, sizeof v);
    fixed64(field, v);
  }
  void bytes(std::uint32_t field, std::string_view b) {
    tag(field, 2);
    raw_varint(b.size());
    out_.append(b);
  }
  void string(std::uint32_t field, std::string_view s) { bytes(field, s); }
  void message(std::uint32_t field, const Writer& m) { bytes(field, m.out_); }
  void packed_fixed64(std::uint32_t field, const std::vector<std::uint64_t>& v) {
    tag(field, 2);
    raw_varint(v.size() * 8);
    for (std::uint64_t x : v) raw_fixed64(x);
  }
  void packed_double(std::uint32_t field, const std::vector<double>& v) {
    tag(field, 2);
    raw_varint(v.size() * 8);
    for (double d : v) {
      std::uint64_t x;
      std::memcpy(&x, &d, sizeof x);
      raw_fixed64(x);
    }
  }
  const std::string& data() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void tag(std::uint32_t field, std::uint32_t wire) { raw_varint((static_cast<std::uint64_t>(field) << 3) | wire); }
  void raw_varint(std::uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void raw_fixed64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

}  // namespace rankscope::detail::pb
