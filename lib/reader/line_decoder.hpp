// One run-log line into a LogEvent: the members every line has, and the
// kind's own as its typed value (run_log_lines.hpp), by the declaration in
// run_log_schema.hpp. The writer's own flat lines take the fast path
// (flat_line.hpp); every other line, and any line the fast path gives up on,
// is parsed by simdjson, which alone decides whether a line is valid.
// Thread-safety: none; one decoder per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "run_log.hpp"

namespace rankscope::reader {

/// Bytes a line must be followed by in memory (simdjson reads ahead; their values do not matter).
std::size_t line_padding();

class LineDecoder {
 public:
  /// `flat_fast_path` false: every line through simdjson (tests compare the two).
  explicit LineDecoder(bool flat_fast_path = true);
  ~LineDecoder();
  LineDecoder(const LineDecoder&) = delete;
  LineDecoder& operator=(const LineDecoder&) = delete;

  /// Decodes `p[0, n)` (a line without its newline, followed by line_padding()
  /// readable bytes) into `e`, reusing its body's storage. False: not a valid
  /// event (invalid JSON, not an object, no string `kind`); `e` is then unspecified.
  /// Keys a kind does not declare are ignored and counted in res.undeclared_keys.
  bool decode(const char* p, std::size_t n, LogEvent& e, ReadResult& res);

  /// Lines the fast path decoded (the rest went to simdjson).
  std::uint64_t fast_lines() const { return fast_lines_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool flat_fast_path_;
  std::uint64_t fast_lines_ = 0;
};

}  // namespace rankscope::reader
