#include "run_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/strings/str_cat.h"

namespace rankscope::reader {
namespace {

template <typename T>
std::optional<T> opt(simdjson::simdjson_result<T> r) {
  T v;
  if (std::move(r).get(v) == simdjson::SUCCESS) return v;
  return std::nullopt;
}

// The nested values, each read only for the kinds that carry them.
void decode_environment(simdjson::dom::element v, LogEvent& e) {  // run_start
  simdjson::dom::object env;
  std::string_view sv;
  if (v.get_object().get(env) != simdjson::SUCCESS) return;
  if (env["cpu_affinity"].get_string().get(sv) == simdjson::SUCCESS) e.cpu_affinity.assign(sv);
}

void decode_fact_fields(simdjson::dom::element v, LogEvent& e) {
  simdjson::dom::object fields;
  std::string_view sv;
  if (v.get_object().get(fields) != simdjson::SUCCESS) return;
  for (auto [fk, fv] : fields) {
    if (fv.get_string().get(sv) == simdjson::SUCCESS) e.fields.emplace_back(std::string(fk), std::string(sv));
    else e.fields.emplace_back(std::string(fk), simdjson::minify(fv));
  }
}

void decode_in_flight(simdjson::dom::element v, LogEvent& e) {  // a stall's first collective in flight
  using simdjson::SUCCESS;
  simdjson::dom::array arr;
  std::string_view sv;
  std::uint64_t u64;
  if (v.get_array().get(arr) != SUCCESS || arr.size() == 0) return;
  const simdjson::dom::element c = arr.at(0).value_unsafe();
  if (c["op"].get_string().get(sv) == SUCCESS) e.op.assign(sv);
  if (c["comm"].get_string().get(sv) == SUCCESS) e.comm.assign(sv);
  if (c["seq"].get_uint64().get(u64) == SUCCESS) e.seq = u64;
  if (c["count"].get_uint64().get(u64) == SUCCESS) e.count = u64;
}

void decode_open_phases(simdjson::dom::element v, LogEvent& e) {  // the innermost open phase, as the stall's name
  simdjson::dom::array arr;
  std::string_view sv;
  if (v.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) return;
  if (arr.at(arr.size() - 1)["name"].get_string().get(sv) == simdjson::SUCCESS) e.name.assign(sv);
}

void decode_ranks(simdjson::dom::element v, LogEvent& e) {  // a violation's ranks at fault
  simdjson::dom::array ranks;
  std::int64_t i64;
  if (v.get_array().get(ranks) != simdjson::SUCCESS) return;
  for (auto x : ranks) {
    if (x.get_int64().get(i64) == simdjson::SUCCESS) e.ranks.push_back(static_cast<int>(i64));
  }
}

void decode_loss(simdjson::dom::element v, LogEvent& e) {  // a number, or "NaN" / "Infinity" / "-Infinity"
  double d;
  std::string_view sv;
  if (v.get_double().get(d) == simdjson::SUCCESS) e.loss = d;
  else if (v.get_string().get(sv) == simdjson::SUCCESS) e.loss = sv == "NaN" ? NAN : (sv == "-Infinity" ? -INFINITY : INFINITY);
}

// One key's value into the event: keys from 'a' to 'l' here, the rest in
// decode_field_m_z; the switch on the key's first letter keeps the string
// compares per key to a few.
void decode_field_a_l(std::string_view k, simdjson::dom::element v, LogEvent& e) {
  using simdjson::SUCCESS;
  std::string_view sv;
  std::int64_t i64;
  std::uint64_t u64;
  auto str = [&](std::string& out) {
    if (v.get_string().get(sv) == SUCCESS) out.assign(sv);
  };
  switch (k[0]) {
    case 'c':
      if (k == "comm") str(e.comm);
      else if (k == "count" && v.get_uint64().get(u64) == SUCCESS) e.count = u64;
      else if (k == "check") str(e.check);
      else if (k == "communicators" && v.get_int64().get(i64) == SUCCESS) e.communicators = i64;
      break;
    case 'd':
      if (k == "dur" && v.get_uint64().get(u64) == SUCCESS) e.dur = u64;
      else if (k == "depth" && v.get_int64().get(i64) == SUCCESS) e.depth = static_cast<int>(i64);
      else if (k == "dtype") str(e.dtype);
      break;
    case 'e':
      if (k == "events_dropped" && v.get_uint64().get(u64) == SUCCESS) e.events_dropped = u64;
      else if (k == "error" && e.k == schema::Kind::kLogStopped) str(e.msg);
      else if (k == "events_recorded" && v.get_uint64().get(u64) == SUCCESS) e.events_recorded = u64;
      else if (k == "environment" && e.k == schema::Kind::kRunStart) decode_environment(v, e);
      break;
    case 'f':
      if (k == "fingerprint") str(e.fingerprint);
      else if (k == "fields" && e.k == schema::Kind::kFact) decode_fact_fields(v, e);
      break;
    case 'g':
      if (k == "grown_phase") str(e.grown_phase);
      break;
    case 'h':
      if (k == "host") str(e.name);  // run_start
      break;
    case 'i':
      if (k == "inside") str(e.inside);
      else if (k == "in_flight" && e.k == schema::Kind::kStall) decode_in_flight(v, e);
      break;
    case 'l':
      if (k == "level") str(e.level);
      else if (k == "loss") decode_loss(v, e);
      else if (k == "lines_dropped" && v.get_uint64().get(u64) == SUCCESS) e.count = u64;  // log_stopped, log_resumed
      break;
    default:
      break;
  }
}

void decode_field_m_z(std::string_view k, simdjson::dom::element v, LogEvent& e) {
  using simdjson::SUCCESS;
  std::string_view sv;
  std::int64_t i64;
  std::uint64_t u64;
  auto str = [&](std::string& out) {
    if (v.get_string().get(sv) == SUCCESS) out.assign(sv);
  };
  double d;
  switch (k[0]) {
    case 'm':
      if (k == "mono" && v.get_uint64().get(u64) == SUCCESS) e.mono = u64;
      else if (k == "msg") str(e.msg);
      break;
    case 'n':
      if (k == "name") str(e.name);
      break;
    case 'o':
      if (k == "op") str(e.op);
      else if (k == "os_threads" && v.get_int64().get(i64) == SUCCESS) e.os_threads = i64;
      else if (k == "open_phases" && e.k == schema::Kind::kStall) decode_open_phases(v, e);
      break;
    case 'p':
      if (k == "phase_kind") str(e.phase_kind);
      else if (k == "pid" && v.get_int64().get(i64) == SUCCESS) e.pid = i64;
      break;
    case 'r':
      if (k == "rank" && v.get_int64().get(i64) == SUCCESS) e.rank = static_cast<int>(i64);
      else if (k == "result") str(e.result);
      else if (k == "ranks" && e.k == schema::Kind::kViolation) decode_ranks(v, e);
      break;
    case 's':
      if (k == "step" && v.get_int64().get(i64) == SUCCESS) e.step = i64;
      else if (k == "seq" && v.get_uint64().get(u64) == SUCCESS) e.seq = u64;
      else if (k == "samples" && v.get_int64().get(i64) == SUCCESS) e.samples = i64;
      else if (k == "schema" && v.get_int64().get(i64) == SUCCESS) e.schema = static_cast<int>(i64);
      break;
    case 't':
      if (k == "t" && v.get_uint64().get(u64) == SUCCESS) e.t = u64;
      else if (k == "tid" && v.get_int64().get(i64) == SUCCESS) e.tid = static_cast<std::int32_t>(i64);
      else if (k == "timing") e.device_timing = v.get_string().get(sv) == SUCCESS && sv == "device";
      break;
    case 'v':
      if (k == "value" && v.get_double().get(d) == SUCCESS) e.value = d;
      else if (k == "values" && e.k == schema::Kind::kViolation) e.values_json = simdjson::minify(v);
      break;
    case 'w':
      if (k == "what") str(e.what);
      break;
    default:
      break;
  }
}

void decode_field(std::string_view k, simdjson::dom::element v, LogEvent& e) {
  if (k.empty()) return;
  if (k[0] < 'm') decode_field_a_l(k, v, e);
  else decode_field_m_z(k, v, e);
}

// One pass over the object's keys (a line has ~10-20 of them; looking each
// wanted key up separately would rescan the object per key).
bool decode(simdjson::dom::parser& parser, const char* p, std::size_t n, LogEvent& e) {
  using simdjson::SUCCESS;
  simdjson::dom::element doc;
  if (parser.parse(p, n, /*realloc_if_needed=*/false).get(doc) != SUCCESS) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj) != SUCCESS) return false;
  std::string_view kind;
  if (obj["kind"].get_string().get(kind) != SUCCESS) return false;
  e.clear();
  e.kind.assign(kind);
  e.k = schema::kind_from_name(kind);  // decoded once; readers switch on it
  e.raw = std::string_view(p, n);
  for (auto field : obj) decode_field(field.key, field.value, e);
  return true;
}

}  // namespace

absl::StatusOr<ReadResult> read_run_log(const std::string& path, const std::function<void(const LogEvent&)>& fn,
                                        std::size_t chunk_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  ReadResult res;
  simdjson::dom::parser parser;
  // Buffer = carried-over partial line + new chunk + simdjson's padding.
  std::vector<char> buf(chunk_bytes + simdjson::SIMDJSON_PADDING);
  std::size_t have = 0;
  std::uint64_t line_no = 0;
  LogEvent e;
  for (;;) {
    if (have == chunk_bytes) {  // one line longer than the buffer: grow
      chunk_bytes *= 2;
      buf.resize(chunk_bytes + simdjson::SIMDJSON_PADDING);
    }
    const ssize_t n = ::read(fd, buf.data() + have, chunk_bytes - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("read error on '", path, "': ", std::strerror(err)));
    }
    res.bytes += static_cast<std::uint64_t>(n);
    const std::size_t end = have + static_cast<std::size_t>(n);
    std::size_t start = 0;
    for (;;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + start, '\n', end - start));
      if (nl == nullptr) break;
      const std::size_t len = static_cast<std::size_t>(nl - (buf.data() + start));
      if (len > 0) {
        ++line_no;
        if (decode(parser, buf.data() + start, len, e)) {
          ++res.lines;
          e.line_no = line_no;
          fn(e);
        } else {
          ++res.bad_lines;
        }
      } else {
        ++line_no;
      }
      start += len + 1;
    }
    if (n == 0) {
      res.torn_tail = end > start;
      break;
    }
    std::memmove(buf.data(), buf.data() + start, end - start);
    have = end - start;
  }
  ::close(fd);
  return res;
}

}  // namespace rankscope::reader
