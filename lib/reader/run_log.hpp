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
#include "schema.hpp"

namespace rankscope::reader {

/// One run-log line, with the fields the built-in tools use. `raw` is the
/// line itself for everything else.
struct LogEvent {
  std::string kind;
  schema::Kind k = schema::Kind::kUnknown;  // `kind`, decoded
  int rank = -1;
  std::int64_t step = -1;
  std::uint64_t t = 0;
  std::uint64_t mono = 0;
  std::uint64_t dur = 0;
  std::int32_t tid = 0;
  int depth = 0;
  std::string name;
  std::string phase_kind;
  std::optional<double> loss, grad_norm, lr;  // step_end; non-finite ones as NaN / +-Infinity
  std::optional<double> value, median;    // mark, numerics
  std::optional<std::int64_t> samples, tokens;
  std::optional<std::int64_t> next_step;  // step_end: the step that began as it ended
  std::optional<std::uint64_t> events_dropped;
  std::optional<std::uint64_t> events_recorded;
  // collective lines
  std::string op, comm, dtype, fingerprint, result;
  std::string inside, grown_phase, level, msg;
  std::uint64_t seq = 0, count = 0, bytes = 0;
  std::int64_t comm_id = -1;  // collective: the communicator's id (its name is `comm`)
  // collective: the issuing thread's wait for it at its end ("wait", ns) and the
  // phase it waited in; read_run_log hands that wait to `fn` as a phase line
  // first, nested in the collective's `phase` when it has one.
  std::uint64_t wait = 0;
  std::string wait_phase;
  bool in_phase = false;  // collective: issued inside a phase ("phase")
  // fact lines: "fields" as key -> canonical text; run_start: its environment,
  // flattened ("torch", "env.NCCL_ALGO", "gpus.0.name"); violation lines
  std::vector<std::pair<std::string, std::string>> fields;
  std::string check, what, values_json;
  std::string cause, exception;  // exit
  std::string signal;            // numerics: loss, grad_norm, skipped
  std::string native, python;    // stacks (reason in `what`)
  std::vector<int> ranks;
  int schema = 0;                             // run_start
  std::int64_t pid = 0;                       // run_start, recovered
  bool torn = false;                          // recovered: the line before it was cut by the kill
  std::string cpu_affinity;                   // run_start: environment.cpu_affinity ("0-3,8")
  bool device_timing = false;                 // collective: dur is device time
  std::optional<std::int64_t> os_threads, communicators;  // stats lines
  std::vector<std::pair<schema::Field, double>> numbers;  // resources lines: every value (reason in `what`)
  std::uint64_t line_no = 0;                  // 1-based line in its file
  std::string_view raw;

  // Resets every field, keeping string capacity (one LogEvent is reused per line).
  void clear() {
    for (std::string* s : {&kind, &name, &phase_kind, &op, &comm, &dtype, &fingerprint, &result, &inside, &grown_phase,
                           &level, &msg, &check, &what, &values_json, &cpu_affinity, &cause, &exception, &signal, &native, &python,
                           &wait_phase}) {
      s->clear();
    }
    k = schema::Kind::kUnknown;
    rank = -1;
    step = -1;
    t = mono = dur = seq = count = bytes = line_no = wait = 0;
    in_phase = false;
    tid = 0;
    depth = schema = 0;
    pid = 0;
    torn = false;
    loss.reset();
    grad_norm.reset();
    lr.reset();
    value.reset();
    median.reset();
    samples.reset();
    tokens.reset();
    next_step.reset();
    events_dropped.reset();
    events_recorded.reset();
    os_threads.reset();
    communicators.reset();
    fields.clear();
    ranks.clear();
    numbers.clear();
    device_timing = false;
    raw = {};
  }
};

struct ReadResult {
  std::uint64_t lines = 0;       // complete, parsed lines
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
