// rankscope/export/jsonl.hpp — the per-rank JSON Lines run log.
//
// The default sink: `rank-<R>.jsonl` in the run directory, one JSON object per
// line, each line written whole (whole lines per write(2), O_APPEND). The
// schema is documented in docs/run-log-schema.md and versioned by
// RANKSCOPE_SCHEMA_VERSION. Thread-safety: background thread only.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rankscope/export/sink.hpp"

namespace rankscope {

/// Opens (creating or appending) `path`; fails with a clear message when the
/// file cannot be created.
absl::StatusOr<std::shared_ptr<Sink>> make_jsonl_sink(const std::string& path);

/// Writes `content` to `path` atomically (temporary file in the same
/// directory, then rename): readers see the old file or the new one, never a
/// mix. `durable` also fsyncs before the rename (run.json, dumps: they must
/// survive the machine); heartbeats skip it — a heartbeat is only worth its
/// freshness, and an fsync every second costs ~0.4 ms of CPU in a VM. Without
/// `durable`, the previous version is kept as a spare (`<path>.tmp.<pid>`)
/// that a write at least half a second later reuses (a reader that takes
/// less than that never sees a mix); remove_spare_file() deletes it. The
/// temporary is never opened through a symbolic link; it is created with
/// `mode`, or with the run directory's file mode (0640 unless
/// RANKSCOPE_DIR_MODE says otherwise) when `mode` is 0.
absl::Status write_file_atomic(const std::string& path, const std::string& content, bool durable = true,
                               unsigned mode = 0);
void remove_spare_file(const std::string& path);

}  // namespace rankscope
