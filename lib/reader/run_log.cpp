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

using simdjson::SUCCESS;
using simdjson::dom::element;

// One member's value, by its declared type. A value of another JSON type
// leaves the member as it was (its default): a reader takes what it can.
void read_value(element v, std::uint64_t& out) {
  std::uint64_t u;
  if (v.get_uint64().get(u) == SUCCESS) out = u;
}
void read_value(element v, std::int64_t& out) {
  std::int64_t i;
  if (v.get_int64().get(i) == SUCCESS) out = i;
}
void read_value(element v, int& out) {
  std::int64_t i;
  if (v.get_int64().get(i) == SUCCESS) out = static_cast<int>(i);
}
void read_value(element v, double& out) {
  double d;
  if (v.get_double().get(d) == SUCCESS) out = d;
}
void read_value(element v, bool& out) {
  bool b;
  if (v.get_bool().get(b) == SUCCESS) out = b;
}
void read_value(element v, std::string& out) {
  std::string_view sv;
  if (v.get_string().get(sv) == SUCCESS) out.assign(sv);
}
void read_value(element v, std::optional<double>& out) {  // a number, or "NaN" / "Infinity" / "-Infinity"
  double d;
  std::string_view sv;
  if (v.get_double().get(d) == SUCCESS) out = d;
  else if (v.get_string().get(sv) == SUCCESS) out = sv == "NaN" ? NAN : (sv == "-Infinity" ? -INFINITY : INFINITY);
}
template <typename T>
void read_value(element v, std::optional<T>& out) {
  T x{};
  if (v.is_null()) return;
  if constexpr (std::is_same_v<T, std::uint64_t>) {
    if (v.get_uint64().get(x) == SUCCESS) out = x;
  } else {
    std::int64_t i;
    if (v.get_int64().get(i) == SUCCESS) out = static_cast<T>(i);
  }
}
template <typename T>
void read_value(element v, std::vector<T>& out) {
  simdjson::dom::array arr;
  if (v.get_array().get(arr) != SUCCESS) return;
  for (auto x : arr) {
    T item{};
    read_value(x, item);
    out.push_back(item);
  }
}
// The enumerations the writer writes by name.
template <typename E, int N, typename NameOf>
void read_enum(element v, E& out, NameOf name_of) {
  std::string_view sv;
  if (v.get_string().get(sv) != SUCCESS) return;
  for (int i = 0; i < N; ++i) {
    if (name_of(static_cast<E>(i)) == sv) {
      out = static_cast<E>(i);
      return;
    }
  }
}
void read_value(element v, PhaseKind& out) { read_enum<PhaseKind, kPhaseKindCount>(v, out, phase_kind_name); }
void read_value(element v, Level& out) { read_enum<Level, 5>(v, out, level_name); }
void read_value(element v, CollectiveResult& out) {
  read_enum<CollectiveResult, 3>(v, out, collective_result_name);
}
void read_value(element v, schema::Json& out) { out.text = simdjson::minify(v); }
void read_value(element v, schema::Members& out) {
  simdjson::dom::object obj;
  std::string_view sv;
  if (v.get_object().get(obj) != SUCCESS) return;
  for (auto [k, x] : obj) {
    out.items.emplace_back(std::string(k), x.get_string().get(sv) == SUCCESS ? std::string(sv) : simdjson::minify(x));
  }
}
// Every leaf with a dotted key (four levels at most, 512 leaves).
void flatten(std::string& prefix, element v, schema::Environment& out, int depth) {
  simdjson::dom::object obj;
  simdjson::dom::array arr;
  std::string_view sv;
  const std::size_t keep = prefix.size();
  if (depth < 4 && v.get_object().get(obj) == SUCCESS) {
    for (auto [k, x] : obj) {
      if (keep != 0) prefix.push_back('.');
      prefix.append(k);
      flatten(prefix, x, out, depth + 1);
      prefix.resize(keep);
    }
  } else if (depth < 4 && v.get_array().get(arr) == SUCCESS) {
    std::size_t i = 0;
    for (auto x : arr) {
      prefix.append(fmt::format(".{}", i++));
      flatten(prefix, x, out, depth + 1);
      prefix.resize(keep);
    }
  } else if (out.flat.size() < 512) {
    out.flat.emplace_back(prefix, v.get_string().get(sv) == SUCCESS ? std::string(sv) : simdjson::minify(v));
  }
}
void read_value(element v, schema::Environment& out) {
  simdjson::dom::object env;
  if (v.get_object().get(env) != SUCCESS) return;
  element affinity;  // absent from older writers' environments
  if (env[schema::field_name(Field::kCpuAffinity)].get(affinity) == SUCCESS) read_value(affinity, out.cpu_affinity);
  std::string prefix;
  flatten(prefix, v, out, 0);
}
void read_value(element v, schema::InnermostPhase& out) {
  simdjson::dom::array arr;
  element name;
  if (v.get_array().get(arr) != SUCCESS || arr.size() == 0) return;
  if (arr.at(arr.size() - 1)[schema::field_name(Field::kName)].get(name) == SUCCESS) read_value(name, out.name);
}
void read_value(element v, schema::FirstInFlight& out) {
  simdjson::dom::array arr;
  if (v.get_array().get(arr) != SUCCESS || arr.size() == 0) return;
  const element c = arr.at(0).value_unsafe();
  element x;
  if (c[schema::field_name(Field::kOp)].get(x) == SUCCESS) read_value(x, out.op);
  if (c[schema::field_name(Field::kComm)].get(x) == SUCCESS) read_value(x, out.comm);
  if (c[schema::field_name(Field::kSeq)].get(x) == SUCCESS) read_value(x, out.seq);
  if (c[schema::field_name(Field::kCount)].get(x) == SUCCESS) read_value(x, out.count);
}

// Back to the member's default, keeping a string's or a vector's capacity (one
// value per kind is reused line after line).
template <typename T>
void reset_value(T& v) {
  if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) v = T{};
  else if constexpr (requires { v.reset(); }) v.reset();
  else if constexpr (requires { v.clear(); }) v.clear();
  else if constexpr (std::is_same_v<T, schema::Environment>) v.cpu_affinity.clear(), v.flat.clear();
  else if constexpr (std::is_same_v<T, schema::Members>) v.items.clear();
  else if constexpr (std::is_same_v<T, schema::InnermostPhase>) v.name.clear();
  else if constexpr (std::is_same_v<T, schema::Json>) v.text.clear();
  else v = T{};
}

// One key of a kind's own into its value; false if the kind does not declare it.
#define RANKSCOPE_DETAIL_CASE(f, m, T) \
  case Field::f:                       \
    read_value(v, line.m);             \
    return true;
#define RANKSCOPE_DETAIL_DECODE_MEMBER(e, n)                                                                  \
  bool decode_member([[maybe_unused]] schema::Line<schema::Kind::e>& line, Field f, [[maybe_unused]] element v) { \
    switch (f) {                                                                                          \
      RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_CASE) default : return false;                                   \
    }                                                                                                     \
  }
RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_DECODE_MEMBER)
#undef RANKSCOPE_DETAIL_DECODE_MEMBER
#undef RANKSCOPE_DETAIL_CASE

// The value of kind K in `body`, reset: the one already there when the last
// line was of the same kind (its strings keep their capacity), else a new one.
template <schema::Kind K>
schema::Line<K>& reuse(schema::LineBody& body) {
  constexpr std::size_t index = static_cast<std::size_t>(K) + 1;
  if (auto* line = std::get_if<index>(&body)) {
    schema::for_each_member(*line, [](Field, auto& m) { reset_value(m); });
    return *line;
  }
  return body.emplace<index>();
}

// One key into the event: a member every line has, or one of its kind's own.
bool decode_header(Field f, element v, LogEvent& e) {
  switch (f) {
    case Field::kKind: return true;
    case Field::kT: read_value(v, e.t); return true;
    case Field::kMono: read_value(v, e.mono); return true;
    case Field::kRank: read_value(v, e.rank); return true;
    case Field::kStep: read_value(v, e.step); return true;
    case Field::kTid: read_value(v, e.tid); return true;
    default: return false;
  }
}

template <schema::Kind K>
void decode_members(simdjson::dom::object obj, LogEvent& e, ReadResult& res) {
  schema::Line<K>& line = reuse<K>(e.body);
  for (auto field : obj) {
    const Field f = schema::field_from_name(field.key);
    if (!decode_header(f, field.value, e) && !decode_member(line, f, field.value)) ++res.undeclared_keys;
  }
}

using MembersDecoder = void (*)(simdjson::dom::object, LogEvent&, ReadResult&);
constexpr MembersDecoder kDecoders[] = {
#define RANKSCOPE_DETAIL_DECODER(e, n) &decode_members<schema::Kind::e>,
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_DECODER)
#undef RANKSCOPE_DETAIL_DECODER
};

// One pass over the object's keys (a line has ~10-20 of them; looking each
// wanted key up separately would rescan the object per key).
bool decode(simdjson::dom::parser& parser, const char* p, std::size_t n, LogEvent& e, ReadResult& res) {
  element doc;
  if (parser.parse(p, n, /*realloc_if_needed=*/false).get(doc) != SUCCESS) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj) != SUCCESS) return false;
  std::string_view kind;
  if (obj[schema::field_name(Field::kKind)].get_string().get(kind) != SUCCESS) return false;
  e.k = schema::kind_from_name(kind);
  e.rank = -1;
  e.step = -1;
  e.t = e.mono = 0;
  e.tid = 0;
  e.raw = std::string_view(p, n);
  if (e.k == schema::Kind::kUnknown) {
    e.body.emplace<0>();
    for (auto field : obj) decode_header(schema::field_from_name(field.key), field.value, e);
  } else {
    kDecoders[static_cast<std::size_t>(e.k)](obj, e, res);
  }
  return true;
}

// A collective's wait (schema 3), as the nested phase line that schema 2 wrote
// for it: it ended when the collective completed.
void wait_as_phase(const LogEvent& c, const schema::Line<schema::Kind::kCollective>& coll, LogEvent& w) {
  w.k = schema::Kind::kPhase;
  w.rank = c.rank;
  w.step = c.step;
  w.tid = c.tid;
  auto& p = reuse<schema::Kind::kPhase>(w.body);
  p.dur = std::min(coll.wait, coll.dur);
  w.t = c.t + coll.dur - p.dur;
  w.mono = c.mono + coll.dur - p.dur;
  p.depth = coll.phase.empty() ? 0 : 1;
  p.name = coll.wait_phase;
  p.parent = coll.phase;
  p.phase_kind = PhaseKind::kCollective;
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
        if (decode(parser, buf.data() + start, len, e, res)) {
          ++res.lines;
          e.line_no = line_no;
          if (const auto* c = e.get<schema::Kind::kCollective>(); c != nullptr && !c->wait_phase.empty()) {
            wait_as_phase(e, *c, wait);
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
