// Reading run logs back: a streaming, bounded-memory JSONL reader that
// tolerates a torn last line (a rank killed mid-write) and skips corrupt lines
// (counted). summary.hpp builds the per-rank digests on top of it.
// Thread-safety: none; one reader per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rankscope/runtime.hpp"
#include "run_log_lines.hpp"
#include "schema.hpp"

namespace rankscope::reader {

/// One run-log line: the members every line has, and the kind's own as a
/// typed value (schema.hpp declares each kind's shape; run_log_lines.hpp the
/// structs). `raw` is the line itself, for evidence.
struct LogEvent {
  schema::Kind k = schema::Kind::kUnknown;  // kUnknown: a kind this version does not know (body is empty)
  int rank = -1;
  std::int64_t step = -1;
  std::uint64_t t = 0;
  std::uint64_t mono = 0;
  std::int32_t tid = 0;
  std::uint64_t line_no = 0;  // 1-based line in its file
  std::string_view raw;
  schema::LineBody body;

  /// The line's own members if it is of kind K, else null.
  template <schema::Kind K>
  const schema::Line<K>* get() const {
    return std::get_if<static_cast<std::size_t>(K) + 1>(&body);
  }
};

struct ReadResult {
  std::uint64_t lines = 0;       // complete, parsed lines
  std::uint64_t undeclared_keys = 0;  // keys a line's kind does not declare (schema.hpp): ignored
  std::uint64_t bad_lines = 0;   // complete lines that were not valid events (skipped)
  bool torn_tail = false;        // the file ended inside a line (ignored)
  std::uint64_t bytes = 0;
};

/// A regular file, checked before reading one whole (heartbeats, run.json, dumps): a FIFO
/// someone put in a run directory would block the reader, a directory would fail it.
bool is_regular_file(const std::string& path);

/// Streams `path` line by line into `fn`. Fails only when the file cannot be read
/// (or is not a regular file).
absl::StatusOr<ReadResult> read_run_log(const std::string& path, const std::function<void(const LogEvent&)>& fn,
                                        std::size_t chunk_bytes = 8 << 20);

}  // namespace rankscope::reader
