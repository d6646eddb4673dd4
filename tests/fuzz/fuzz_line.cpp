// libFuzzer target, differential: arbitrary bytes as one run-log line,
// decoded by the reader's fast path (lib/reader/flat_line.hpp) and by
// simdjson alone. The two must accept the same lines and decode them to the
// same event; any difference aborts (and so does a crash or sanitizer report).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../describe_event.hpp"
#include "line_decoder.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace r = rankscope::reader;
  std::string buf(reinterpret_cast<const char*>(data), size);
  if (buf.find('\n') != std::string::npos) return 0;  // one line
  buf.append(r::line_padding(), '\0');
  static r::LineDecoder fast(true), slow(false);
  r::LogEvent a, b;
  r::ReadResult ra, rb;
  const bool ok_a = fast.decode(buf.data(), size, a, ra);
  const bool ok_b = slow.decode(buf.data(), size, b, rb);
  if (ok_a != ok_b || (ok_a && (rankscope::test::describe(a) != rankscope::test::describe(b) ||
                                ra.undeclared_keys != rb.undeclared_keys))) {
    std::fprintf(stderr, "fast path and simdjson disagree on: %.*s\n", static_cast<int>(size), buf.data());
    std::abort();
  }
  return 0;
}
