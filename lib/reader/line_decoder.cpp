#include "line_decoder.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <simdjson.h>

#include "flat_line.hpp"
#include "named_enum.hpp"
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
void enum_from_name(std::string_view name, E& out, NameOf name_of) {  // unchanged if no enumerator has the name
  static const rankscope::detail::NameIndex<E, 64> kIndex(N, name_of);
  out = kIndex.find(name, out);
}
template <typename E, int N, typename NameOf>
void read_enum(element v, E& out, NameOf name_of) {
  std::string_view sv;
  if (v.get_string().get(sv) == SUCCESS) enum_from_name<E, N>(sv, out, name_of);
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
  if (c[schema::field_name(Field::kStep)].get(x) == SUCCESS) read_value(x, out.step);
  if (c[schema::field_name(Field::kOnDevice)].get(x) == SUCCESS) read_value(x, out.on_device);
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


// The same readers over the fast path's tokens (flat_line.hpp), each taking a
// value exactly as its simdjson twin above does. False: the fast path cannot
// decide (a nested member's type): the line goes to simdjson.
using flat::Token;
using flat::TokenType;

// The scanner has the integer's value already (flat_line.hpp: it fits 64 bits).
template <typename T>
bool parse_integer(const Token& v, T& out) {
  if (v.type != TokenType::kNumber || !v.integer) return false;
  if constexpr (std::is_unsigned_v<T>) {
    if (v.negative) return false;
    out = v.magnitude;
  } else {
    if (!v.negative && v.magnitude > static_cast<std::uint64_t>(INT64_MAX)) return false;
    out = v.negative ? -static_cast<std::int64_t>(v.magnitude) : static_cast<std::int64_t>(v.magnitude);
  }
  return true;
}
bool read_value(const Token& v, std::uint64_t& out) {
  parse_integer(v, out);
  return true;
}
bool read_value(const Token& v, std::int64_t& out) {
  parse_integer(v, out);
  return true;
}
bool read_value(const Token& v, int& out) {
  std::int64_t i;
  if (parse_integer(v, i)) out = static_cast<int>(i);
  return true;
}
bool read_value(const Token& v, double& out) {
  if (v.type == TokenType::kNumber) out = v.as_double();
  return true;
}
bool read_value(const Token& v, bool& out) {
  if (v.type == TokenType::kTrue || v.type == TokenType::kFalse) out = v.type == TokenType::kTrue;
  return true;
}
bool read_value(const Token& v, std::string& out) {
  if (v.type == TokenType::kString) out.assign(v.text);
  return true;
}
bool read_value(const Token& v, std::optional<double>& out) {
  if (v.type == TokenType::kNumber) {
    out = v.as_double();
  } else if (v.type == TokenType::kString) {
    out = v.text == "NaN" ? NAN : (v.text == "-Infinity" ? -INFINITY : INFINITY);
  }
  return true;
}
template <typename T>
bool read_value(const Token& v, std::optional<T>& out) {
  T x{};
  if (parse_integer(v, x)) out = x;
  return true;
}
template <typename E, int N, typename NameOf>
bool read_enum(const Token& v, E& out, NameOf name_of) {
  if (v.type == TokenType::kString) enum_from_name<E, N>(v.text, out, name_of);
  return true;
}
bool read_value(const Token& v, PhaseKind& out) { return read_enum<PhaseKind, kPhaseKindCount>(v, out, phase_kind_name); }
bool read_value(const Token& v, Level& out) { return read_enum<Level, 5>(v, out, level_name); }
bool read_value(const Token& v, CollectiveResult& out) {
  return read_enum<CollectiveResult, 3>(v, out, collective_result_name);
}
template <typename T>
bool read_value(const Token&, T&) {  // nested values (Members, Environment, Json, vectors): simdjson's
  return false;
}

// One reader call, whichever the value's source: true unless the fast path gives up.
template <typename T>
bool read(element v, T& out) {
  read_value(v, out);
  return true;
}
template <typename T>
bool read(const Token& v, T& out) {
  return read_value(v, out);
}

enum class Decoded : std::uint8_t { kRead, kUndeclared, kGiveUp };

// One key of a kind's own into its value.
#define RANKSCOPE_DETAIL_CASE(f, m, T) \
  case Field::f:                       \
    return read(v, line.m) ? Decoded::kRead : Decoded::kGiveUp;
#define RANKSCOPE_DETAIL_DECODE_MEMBER(e, n)                                                               \
  template <typename V>                                                                                    \
  Decoded decode_member([[maybe_unused]] schema::Line<schema::Kind::e>& line, Field f, [[maybe_unused]] const V& v) { \
    switch (f) {                                                                                           \
      RANKSCOPE_LINE_##e(RANKSCOPE_DETAIL_CASE) default : return Decoded::kUndeclared;                     \
    }                                                                                                      \
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

// One key into the event: a member every line has.
template <typename V>
bool decode_header(Field f, const V& v, LogEvent& e) {
  switch (f) {
    case Field::kKind: return true;
    case Field::kT: read(v, e.t); return true;
    case Field::kMono: read(v, e.mono); return true;
    case Field::kRank: read(v, e.rank); return true;
    case Field::kStep: read(v, e.step); return true;
    case Field::kTid: read(v, e.tid); return true;
    default: return false;
  }
}

void reset_header(LogEvent& e, schema::Kind k, const char* p, std::size_t n) {
  e.k = k;
  e.rank = -1;
  e.step = -1;
  e.t = e.mono = 0;
  e.tid = 0;
  e.raw = std::string_view(p, n);
}

// simdjson: one pass over the object's keys (a line has ~10-20 of them;
// looking each wanted key up separately would rescan the object per key).
template <schema::Kind K>
void decode_members(simdjson::dom::object obj, LogEvent& e, ReadResult& res) {
  schema::Line<K>& line = reuse<K>(e.body);
  for (auto field : obj) {
    const Field f = schema::field_from_name(field.key);
    if (!decode_header(f, field.value, e) && decode_member(line, f, field.value) == Decoded::kUndeclared) {
      ++res.undeclared_keys;
    }
  }
}

using MembersDecoder = void (*)(simdjson::dom::object, LogEvent&, ReadResult&);
constexpr MembersDecoder kDecoders[] = {
#define RANKSCOPE_DETAIL_DECODER(e, n) &decode_members<schema::Kind::e>,
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_DECODER)
#undef RANKSCOPE_DETAIL_DECODER
};

bool decode_dom(simdjson::dom::parser& parser, const char* p, std::size_t n, LogEvent& e, ReadResult& res) {
  element doc;
  if (parser.parse(p, n, /*realloc_if_needed=*/false).get(doc) != SUCCESS) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj) != SUCCESS) return false;
  std::string_view kind;
  if (obj[schema::field_name(Field::kKind)].get_string().get(kind) != SUCCESS) return false;
  reset_header(e, schema::kind_from_name(kind), p, n);
  if (e.k == schema::Kind::kUnknown) {
    e.body.emplace<0>();
    for (auto field : obj) decode_header(schema::field_from_name(field.key), field.value, e);
  } else {
    kDecoders[static_cast<std::size_t>(e.k)](obj, e, res);
  }
  return true;
}

// The keys of the last flat line of each kind, by position: a writer writes a
// kind's keys in the same order line after line, so the key at a position is
// first matched against the one there last time, as a whole (KeyPattern),
// before it is scanned and looked up (a third of the fast path's time went to
// scanning keys and looking them up).
constexpr std::size_t kLayoutKeys = 32;
using Layout = std::array<Field, kLayoutKeys>;
using Layouts = std::array<Layout, schema::kKindNames.size()>;

const flat::KeyPattern& key_pattern(Field f) {
  static const auto patterns = [] {
    std::array<flat::KeyPattern, schema::kFieldNames.size() + 1> p{};
    for (std::size_t i = 0; i < schema::kFieldNames.size(); ++i) p[i] = flat::KeyPattern(schema::kFieldNames[i]);
    return p;  // the last one, for Field::kUnknown and past the table, matches nothing
  }();
  const auto i = static_cast<std::size_t>(f);
  return patterns[std::min(i, patterns.size() - 1)];
}

// The member at position i, its Field from the layout when the key matched there.
flat::Step next_member(flat::Scanner& scan, Layout& layout, std::size_t i, Field& f, Token& v) {
  std::string_view key;
  if (i < kLayoutKeys) {
    const Field expected = layout[i];
    const flat::KeyPattern& pattern = key_pattern(expected);
    const flat::Step step = scan.next(pattern, key, v);
    if (step != flat::Step::kMember) return step;
    if (key.data() == schema::field_name(expected).data() || key == schema::field_name(expected)) {
      f = expected;
      return step;
    }
  } else if (const flat::Step step = scan.next(key, v); step != flat::Step::kMember) {
    return step;
  }
  f = schema::field_from_name(key);
  if (i < kLayoutKeys && f != Field::kUnknown) layout[i] = f;
  return flat::Step::kMember;
}

// The fast path: the rest of a flat line's members, after its leading `kind`.
// Undeclared keys are counted only once the whole line is accepted.
template <schema::Kind K>
bool decode_flat_members(flat::Scanner& scan, Layout& layout, LogEvent& e, ReadResult& res) {
  schema::Line<K>& line = reuse<K>(e.body);
  std::uint64_t undeclared = 0;
  Field f = Field::kUnknown;
  Token v;
  for (std::size_t i = 1;; ++i) {
    switch (next_member(scan, layout, i, f, v)) {
      case flat::Step::kGiveUp: return false;
      case flat::Step::kEnd: res.undeclared_keys += undeclared; return true;
      case flat::Step::kMember: break;
    }
    if (decode_header(f, v, e)) continue;
    switch (decode_member(line, f, v)) {
      case Decoded::kRead: break;
      case Decoded::kUndeclared: ++undeclared; break;
      case Decoded::kGiveUp: return false;
    }
  }
}

using FlatDecoder = bool (*)(flat::Scanner&, Layout&, LogEvent&, ReadResult&);
constexpr FlatDecoder kFlatDecoders[] = {
#define RANKSCOPE_DETAIL_DECODER(e, n) &decode_flat_members<schema::Kind::e>,
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_DECODER)
#undef RANKSCOPE_DETAIL_DECODER
};

// The writer puts `kind` first; a line that does not, or of a kind this
// version does not know, goes to simdjson.
bool decode_flat(const char* p, std::size_t n, Layouts& layouts, LogEvent& e, ReadResult& res) {
  flat::Scanner scan(p, n);
  std::string_view key;
  Token v;
  if (scan.next(key, v) != flat::Step::kMember || key != schema::field_name(Field::kKind) ||
      v.type != TokenType::kString) {
    return false;
  }
  const schema::Kind k = schema::kind_from_name(v.text);
  if (k == schema::Kind::kUnknown) return false;
  reset_header(e, k, p, n);
  const auto i = static_cast<std::size_t>(k);
  return kFlatDecoders[i](scan, layouts[i], e, res);
}

}  // namespace

std::size_t line_padding() { return simdjson::SIMDJSON_PADDING; }

struct LineDecoder::Impl {
  simdjson::dom::parser parser;
  Layouts layouts = [] {
    Layouts l;
    for (auto& layout : l) layout.fill(Field::kUnknown);
    return l;
  }();
};

LineDecoder::LineDecoder(bool flat_fast_path) : impl_(std::make_unique<Impl>()), flat_fast_path_(flat_fast_path) {}
LineDecoder::~LineDecoder() = default;

bool LineDecoder::decode(const char* p, std::size_t n, LogEvent& e, ReadResult& res) {
  if (flat_fast_path_ && decode_flat(p, n, impl_->layouts, e, res)) {
    ++fast_lines_;
    return true;
  }
  return decode_dom(impl_->parser, p, n, e, res);
}

}  // namespace rankscope::reader
