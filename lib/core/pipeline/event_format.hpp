// One event as one JSON object (the run-log line format), shared by the JSONL
// sink and flight-recorder dumps so both speak the same schema.
// Thread-safety: one formatter per thread (it caches escaped names).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "decimal.hpp"
#include "rankscope/export/sink.hpp"
#include "schema.hpp"

namespace rankscope::detail {

// `,"rank":R[,"step":S][,"tid":T]` of the last line: a thread's lines of one
// step end their first members alike, so it is copied, not formatted again.
struct LineTail {
  static constexpr std::size_t kMost = 72;  // 8 + 11 + 8 + 20 + 7 + 11 = 65
  bool valid = false;
  std::int32_t tid = 0;
  int rank = 0;
  std::int64_t step = 0;
  std::size_t size = 0;
  char text[kMost] = {};
};

// A step_end number's last value and its text: the learning rate repeats for
// many steps, and a shortest round-trip decimal is a float-to-decimal conversion.
struct RepeatingNumber {
  std::uint64_t bits = 0;
  bool valid = false;
  std::size_t size = 0;
  char text[32] = {};  // kJsonNumberMost (json_util.hpp)
};

// What consecutive lines repeat, kept to be copied rather than formatted: the
// leading digits of both timestamps, the members after them, step_end's numbers.
struct LineRepeats {
  decimal::RepeatingPrefix wall, mono;
  LineTail tail;
  RepeatingNumber loss, lr, grad_norm;
};

class EventFormatter {
 public:
  explicit EventFormatter(int rank = 0) : rank_(rank) {}
  void set_rank(int rank) { rank_ = rank; }
  // Appends `{"kind":...}` for `e`, without a trailing newline.
  void format(const Event& e, fmt::memory_buffer& out);
  // Appends the fields every line starts with: {"kind":K,"t":..,"mono":..,"rank":..[,"step"][,"tid"]
  void begin(fmt::memory_buffer& out, std::string_view kind, std::uint64_t wall, std::uint64_t mono,
             std::int64_t step, std::int32_t tid) const;
  // The JSON-escaped, quoted name of a site (cached by address).
  const std::string& quoted(const Site* s);
  // The run log's formatter: every site and source location it prints goes
  // into the ring file's names table too (ring_file.hpp), once.
  void note_names_in_ring_file() { note_names_ = true; }

 private:
  // begin() for `e`: its line kind, times, step and thread.
  void begin_line(const Event& e, fmt::memory_buffer& out) const;
  // format()'s longer kinds.
  void format_phase(const Event& e, fmt::memory_buffer& out);
  void format_step_end(const Event& e, fmt::memory_buffer& out);
  void format_collective(const Event& e, fmt::memory_buffer& out);
  void format_log(const Event& e, fmt::memory_buffer& out);
  void format_declared(const Event& e, fmt::memory_buffer& out);
  const std::string& quoted_slow(const Site* s);

  int rank_;
  bool note_names_ = false;
  const SourceLocation* last_noted_source_ = nullptr;
  mutable LineRepeats repeats_;  // a cache: begin() stays logically const
  std::unordered_map<const Site*, std::string> names_;  // node-based: references stay valid across inserts
  // A direct-mapped cache in front of names_: a trainer's few sites resolve
  // without hashing and chasing a node on every line.
  struct Recent {
    const Site* site = nullptr;
    const std::string* quoted = nullptr;
  };
  std::array<Recent, 16> recent_{};
};

}  // namespace rankscope::detail
