#include "run_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/strings/str_cat.h"
#include "rankscope/site.hpp"

namespace rankscope::reader {
namespace {

using schema::Field;

template <typename T>
std::optional<T> opt(simdjson::simdjson_result<T> r) {
  T v;
  if (std::move(r).get(v) == simdjson::SUCCESS) return v;
  return std::nullopt;
}

// The nested values, each read only for the kinds that carry them.
// The run_start's environment: cpu_affinity, and every leaf flattened into
// `fields` with dotted keys (config drift compares them across ranks).
void flatten(std::string& prefix, simdjson::dom::element v, LogEvent& e, int depth) {
  simdjson::dom::object obj;
  simdjson::dom::array arr;
  std::string_view sv;
  const std::size_t keep = prefix.size();
  if (depth < 4 && v.get_object().get(obj) == simdjson::SUCCESS) {
    for (auto [k, x] : obj) {
      if (keep != 0) prefix.push_back('.');
      prefix.append(k);
      flatten(prefix, x, e, depth + 1);
      prefix.resize(keep);
    }
  } else if (depth < 4 && v.get_array().get(arr) == simdjson::SUCCESS) {
    std::size_t i = 0;
    for (auto x : arr) {
      prefix.append(fmt::format(".{}", i++));
      flatten(prefix, x, e, depth + 1);
      prefix.resize(keep);
    }
  } else if (e.fields.size() < 512) {
    e.fields.emplace_back(prefix, v.get_string().get(sv) == simdjson::SUCCESS ? std::string(sv) : simdjson::minify(v));
  }
}

void decode_environment(simdjson::dom::element v, LogEvent& e) {  // run_start
  simdjson::dom::object env;
  std::string_view sv;
  if (v.get_object().get(env) != simdjson::SUCCESS) return;
  if (env[schema::field_name(Field::kCpuAffinity)].get_string().get(sv) == simdjson::SUCCESS) e.cpu_affinity.assign(sv);
  std::string prefix;
  flatten(prefix, v, e, 0);
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
  if (c[schema::field_name(Field::kOp)].get_string().get(sv) == SUCCESS) e.op.assign(sv);
  if (c[schema::field_name(Field::kComm)].get_string().get(sv) == SUCCESS) e.comm.assign(sv);
  if (c[schema::field_name(Field::kSeq)].get_uint64().get(u64) == SUCCESS) e.seq = u64;
  if (c[schema::field_name(Field::kCount)].get_uint64().get(u64) == SUCCESS) e.count = u64;
}

void decode_open_phases(simdjson::dom::element v, LogEvent& e) {  // the innermost open phase, as the stall's name
  simdjson::dom::array arr;
  std::string_view sv;
  if (v.get_array().get(arr) != simdjson::SUCCESS || arr.size() == 0) return;
  if (arr.at(arr.size() - 1)[schema::field_name(Field::kName)].get_string().get(sv) == simdjson::SUCCESS) e.name.assign(sv);
}

void decode_ranks(simdjson::dom::element v, LogEvent& e) {  // a violation's ranks at fault
  simdjson::dom::array ranks;
  std::int64_t i64;
  if (v.get_array().get(ranks) != simdjson::SUCCESS) return;
  for (auto x : ranks) {
    if (x.get_int64().get(i64) == simdjson::SUCCESS) e.ranks.push_back(static_cast<int>(i64));
  }
}

void decode_scalar(simdjson::dom::element v, std::optional<double>& out) {  // a number, or "NaN" / "Infinity" / "-Infinity"
  double d;
  std::string_view sv;
  if (v.get_double().get(d) == simdjson::SUCCESS) out = d;
  else if (v.get_string().get(sv) == simdjson::SUCCESS) out = sv == "NaN" ? NAN : (sv == "-Infinity" ? -INFINITY : INFINITY);
}

// One key's value into the event. The key was mapped to its schema::Field
// once (one hash lookup); what a key means can depend on the line's kind.
// Split in two switches only to keep each short: numbers here, text and
// nested values in decode_text_field.
bool decode_number_field(Field f, simdjson::dom::element v, LogEvent& e) {
  using simdjson::SUCCESS;
  std::int64_t i64;
  std::uint64_t u64;
  double d;
  auto u = [&](auto& out) {  // a std::uint64_t or an optional one
    if (v.get_uint64().get(u64) == SUCCESS) out = u64;
  };
  auto i = [&](auto& out) {  // any integer, or an optional one
    if (v.get_int64().get(i64) == SUCCESS) out = static_cast<std::remove_cvref_t<decltype(*&out)>>(i64);
  };
  switch (f) {
    case Field::kT: u(e.t); break;
    case Field::kMono: u(e.mono); break;
    case Field::kRank: i(e.rank); break;
    case Field::kStep: i(e.step); break;
    case Field::kTid: i(e.tid); break;
    case Field::kDur: u(e.dur); break;
    case Field::kDepth: i(e.depth); break;
    case Field::kSeq: u(e.seq); break;
    case Field::kCommId: i(e.comm_id); break;
    case Field::kCount: u(e.count); break;
    case Field::kBytes: u(e.bytes); break;
    case Field::kWait: u(e.wait); break;
    case Field::kSamples: i(e.samples); break;
    case Field::kTokens: i(e.tokens); break;
    case Field::kNextStep: i(e.next_step); break;
    case Field::kSchema: i(e.schema); break;
    case Field::kPid: i(e.pid); break;
    case Field::kCommunicators: i(e.communicators); break;
    case Field::kOsThreads: i(e.os_threads); break;
    case Field::kEventsDropped: u(e.events_dropped); break;
    case Field::kEventsRecorded: u(e.events_recorded); break;
    case Field::kLinesDropped: u(e.count); break;  // log_stopped, log_resumed
    case Field::kRecords: u(e.count); break;       // recovered
    case Field::kUnresolved: u(e.seq); break;      // recovered
    case Field::kTorn: e.torn = v.get_bool().get(e.torn) == SUCCESS && e.torn; break;
    case Field::kLoss: decode_scalar(v, e.loss); break;
    case Field::kGradNorm: decode_scalar(v, e.grad_norm); break;
    case Field::kLr: decode_scalar(v, e.lr); break;
    case Field::kMedian: decode_scalar(v, e.median); break;
    case Field::kValue:
      if (e.k == schema::Kind::kNumerics) decode_scalar(v, e.value);
      else if (v.get_double().get(d) == SUCCESS) e.value = d;
      break;
    default: return false;
  }
  return true;
}

void decode_text_field(Field f, simdjson::dom::element v, LogEvent& e) {
  using simdjson::SUCCESS;
  std::string_view sv;
  auto str = [&](std::string& out) {
    if (v.get_string().get(sv) == SUCCESS) out.assign(sv);
  };
  switch (f) {
    case Field::kName: str(e.name); break;
    case Field::kHost: str(e.name); break;  // run_start
    case Field::kComm: str(e.comm); break;
    case Field::kOp: str(e.op); break;
    case Field::kDtype: str(e.dtype); break;
    case Field::kResult: str(e.result); break;
    case Field::kFingerprint: str(e.fingerprint); break;
    case Field::kPhaseKind: str(e.phase_kind); break;
    case Field::kWaitPhase: str(e.wait_phase); break;
    case Field::kPhase: e.in_phase = e.k == schema::Kind::kCollective; break;
    case Field::kLevel: str(e.level); break;
    case Field::kMsg: str(e.msg); break;
    case Field::kInside: str(e.inside); break;
    case Field::kGrownPhase: str(e.grown_phase); break;
    case Field::kCheck: str(e.check); break;
    case Field::kWhat: str(e.what); break;
    case Field::kCause: str(e.cause); break;
    case Field::kSignal: str(e.signal); break;
    case Field::kException: str(e.exception); break;
    case Field::kTiming: e.device_timing = v.get_string().get(sv) == SUCCESS && sv == "device"; break;
    case Field::kError:
      if (e.k == schema::Kind::kLogStopped) str(e.msg);
      break;
    case Field::kEnvironment:
      if (e.k == schema::Kind::kRunStart) decode_environment(v, e);
      break;
    case Field::kFields:
      if (e.k == schema::Kind::kFact) decode_fact_fields(v, e);
      break;
    case Field::kNative:
      if (e.k == schema::Kind::kStacks) str(e.native);
      break;
    case Field::kPython:
      if (e.k == schema::Kind::kStacks) str(e.python);
      break;
    case Field::kReason:
      if (e.k == schema::Kind::kStacks) str(e.what);
      break;
    case Field::kInFlight:
      if (e.k == schema::Kind::kStall) decode_in_flight(v, e);
      break;
    case Field::kOpenPhases:
      if (e.k == schema::Kind::kStall) decode_open_phases(v, e);
      break;
    case Field::kRanks:
      if (e.k == schema::Kind::kViolation) decode_ranks(v, e);
      break;
    case Field::kValues:
      if (e.k == schema::Kind::kViolation) e.values_json = simdjson::minify(v);
      break;
    default: break;
  }
}

void decode_field(std::string_view k, simdjson::dom::element v, LogEvent& e) {
  const Field f = schema::field_from_name(k);
  if (f == Field::kUnknown || f == Field::kKind) return;
  if (e.k == schema::Kind::kResources) {
    double d = 0;
    if (f == Field::kReason) {
      std::string_view sv;
      if (v.get_string().get(sv) == simdjson::SUCCESS) e.what.assign(sv);
    } else if (f != Field::kT && f != Field::kMono && f != Field::kRank && f != Field::kStep &&
               v.get_double().get(d) == simdjson::SUCCESS && e.numbers.size() < 64) {
      e.numbers.emplace_back(f, d);
    }
  }
  if (!decode_number_field(f, v, e)) decode_text_field(f, v, e);
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
  if (obj[schema::field_name(Field::kKind)].get_string().get(kind) != SUCCESS) return false;
  e.clear();
  e.kind.assign(kind);
  e.k = schema::kind_from_name(kind);  // decoded once; readers switch on it
  e.raw = std::string_view(p, n);
  for (auto field : obj) decode_field(field.key, field.value, e);
  return true;
}

// A collective's wait (schema 3), as the nested phase line that schema 2 wrote
// for it: it ended when the collective completed.
void wait_as_phase(const LogEvent& c, LogEvent& w) {
  w.clear();
  w.kind.assign(schema::kind_name(schema::Kind::kPhase));
  w.k = schema::Kind::kPhase;
  w.rank = c.rank;
  w.step = c.step;
  w.tid = c.tid;
  w.dur = std::min(c.wait, c.dur);
  w.t = c.t + c.dur - w.dur;
  w.mono = c.mono + c.dur - w.dur;
  w.depth = c.in_phase ? 1 : 0;
  w.name = c.wait_phase;
  w.phase_kind.assign(phase_kind_name(PhaseKind::kCollective));
  w.line_no = c.line_no;
  w.raw = c.raw;
}

}  // namespace

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<ReadResult> read_run_log(const std::string& path, const std::function<void(const LogEvent&)>& fn,
                                        std::size_t chunk_bytes) {
  // O_NONBLOCK: a FIFO put where a log should be would block open() until someone writes to it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  if (struct stat st {}; ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is not a regular file (a FIFO, a device or a directory): not read"));
  }
  ReadResult res;
  simdjson::dom::parser parser;
  // Buffer = carried-over partial line + new chunk + simdjson's padding.
  std::vector<char> buf(chunk_bytes + simdjson::SIMDJSON_PADDING);
  std::size_t have = 0;
  std::uint64_t line_no = 0;
  LogEvent e, wait;
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
          if (e.k == schema::Kind::kCollective && !e.wait_phase.empty()) {
            wait_as_phase(e, wait);
            fn(wait);
          }
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
