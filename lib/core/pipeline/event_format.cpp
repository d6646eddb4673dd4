#include "event_format.hpp"

#include <fmt/compile.h>

#include <array>
#include <cstring>

#include "attribute_codec.hpp"
#include "decimal.hpp"
#include "json_util.hpp"
#include "rankscope/log.hpp"
#include "ring_file.hpp"
#include "run_log_lines.hpp"
#include "schema.hpp"

namespace rankscope::detail {

using schema::Field;
using schema::Kind;
using schema::kind_name;
using schema::key;
using schema::next_key;

namespace {
// Writes a line's fixed-shape fields through a raw pointer after one capacity
// check for the whole line (fmt's appender checks capacity per field, which
// was a third of the background thread's time on phase lines).
class RawLine {
 public:
  RawLine(fmt::memory_buffer& b, std::size_t most) : b_(b) {
    const std::size_t used = b.size();
    b.resize(used + most);
    p_ = b.data() + used;
  }
  ~RawLine() { b_.resize(static_cast<std::size_t>(p_ - b_.data())); }
  RawLine(const RawLine&) = delete;
  RawLine& operator=(const RawLine&) = delete;

  RawLine& operator<<(std::string_view s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
    return *this;
  }
  RawLine& operator<<(char c) {
    *p_++ = c;
    return *this;
  }
  RawLine& hex16(std::uint64_t v) {  // 16 lowercase hex digits, zero-padded
    for (int i = 15; i >= 0; --i, v >>= 4) p_[i] = "0123456789abcdef"[v & 15];
    p_ += 16;
    return *this;
  }
  template <typename Int>
  RawLine& num(Int v) {
    p_ = decimal::write_int(p_, v);
    return *this;
  }
  RawLine& tail(const LineTail& t) {  // LineTail::kMost bytes of room
    std::memcpy(p_, t.text, LineTail::kMost);  // a fixed-size copy; only t.size bytes count
    p_ += t.size;
    return *this;
  }
  RawLine& time(decimal::RepeatingPrefix& digits, std::uint64_t ns) {
    p_ = digits.write(p_, ns);
    return *this;
  }
  RawLine& number(double v) {  // kJsonNumberMost bytes of room
    p_ = json_number_at(p_, v);
    return *this;
  }
  RawLine& number(RepeatingNumber& last, double v) {  // kJsonNumberMost bytes of room
    std::uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    if (!last.valid || last.bits != bits) {
      static_assert(sizeof(last.text) >= kJsonNumberMost);
      last.size = static_cast<std::size_t>(json_number_at(last.text, v) - last.text);
      last.bits = bits;
      last.valid = true;
    }
    std::memcpy(p_, last.text, sizeof(last.text));  // a fixed-size copy; only last.size bytes count
    p_ += last.size;
    return *this;
  }
  RawLine& rate(double v) {  // kJsonNumberMost bytes of room
    p_ = json_rate_at(p_, v);
    return *this;
  }
  RawLine& escaped(std::string_view s) {  // json_escaped_most(s) bytes of room
    p_ = json_escape_at(p_, s);
    return *this;
  }

 private:
  fmt::memory_buffer& b_;
  char* p_;
};

// `{"kind":"<kind>","t":` as text built at compile time, for the kinds of
// the training loop's lines (one fixed-size copy instead of five).
template <Kind K>
struct LineStart {
  static constexpr std::string_view name = kind_name(K);
  static constexpr std::string_view t = next_key<Field::kT>();
  static constexpr std::string_view kind = key<Field::kKind>();
  static constexpr std::array<char, 1 + kind.size() + 1 + name.size() + 1 + t.size()> text = [] {
    std::array<char, 1 + kind.size() + 1 + name.size() + 1 + t.size()> a{};
    std::size_t n = 0;
    a[n++] = '{';
    for (char c : kind) a[n++] = c;
    a[n++] = '"';
    for (char c : name) a[n++] = c;
    a[n++] = '"';
    for (char c : t) a[n++] = c;
    return a;
  }();
  static constexpr std::string_view view{text.data(), text.size()};
};

// What follows the kind on every line: `<t>,"mono":<mono>,"rank":..[,"step"][,"tid"]`.
void begin_rest(RawLine& o, LineRepeats& repeats, std::uint64_t wall, std::uint64_t mono, int rank, std::int64_t step,
                std::int32_t tid) {
  o.time(repeats.wall, wall) << next_key<Field::kMono>();
  o.time(repeats.mono, mono);
  LineTail& t = repeats.tail;
  if (!t.valid || t.step != step || t.tid != tid || t.rank != rank) {
    char* p = t.text;
    auto put = [&p](std::string_view s) {
      std::memcpy(p, s.data(), s.size());
      p += s.size();
    };
    put(next_key<Field::kRank>());
    p = decimal::write_int(p, rank);
    if (step >= 0) put(next_key<Field::kStep>()), p = decimal::write_int(p, step);
    if (tid != 0) put(next_key<Field::kTid>()), p = decimal::write_int(p, tid);
    t.size = static_cast<std::size_t>(p - t.text);
    t.valid = true;
    t.tid = tid;
    t.rank = rank;
    t.step = step;
  }
  o.tail(t);
}
// The start of every line, as begin() writes it; kBeginMost bytes of room plus the kind.
template <Kind K>
void begin_raw(RawLine& o, LineRepeats& repeats, std::uint64_t wall, std::uint64_t mono, int rank, std::int64_t step,
               std::int32_t tid) {
  o << LineStart<K>::view;
  begin_rest(o, repeats, wall, mono, rank, step, tid);
}
void begin_raw(RawLine& o, LineRepeats& repeats, std::string_view kind, std::uint64_t wall, std::uint64_t mono, int rank,
               std::int64_t step, std::int32_t tid) {
  o << '{' << key<Field::kKind>() << '"' << kind << '"' << next_key<Field::kT>();
  begin_rest(o, repeats, wall, mono, rank, step, tid);
}
constexpr std::size_t kBeginMost = 32 + 20 + 20 + LineTail::kMost + 40;

// A log line's and the declared lines' shared members: `,"msg":...`, `,"level":..`.
void message(const Event& e, fmt::memory_buffer& out) {
  out.append(next_key<Field::kMsg>());
  json_escape_to(out, e.text);
}
void level(const Event& e, fmt::memory_buffer& out) {
  out.append(next_key<Field::kLevel>());
  out.push_back('"');
  out.append(level_name(e.level));
  out.push_back('"');
}

}  // namespace

void EventFormatter::begin(fmt::memory_buffer& out, std::string_view kind, std::uint64_t wall, std::uint64_t mono,
                           std::int64_t step, std::int32_t tid) const {
  RawLine o(out, kBeginMost + kind.size());
  begin_raw(o, repeats_, kind, wall, mono, rank_, step, tid);
}

void EventFormatter::begin_line(const Event& e, fmt::memory_buffer& out) const {
  begin(out, kind_name(e.kind), e.wall_ns, e.mono_ns, e.step, e.tid);
}

const std::string& EventFormatter::quoted(const Site* s) {
  Recent& r = recent_[(reinterpret_cast<std::uintptr_t>(s) * 0x9E3779B97F4A7C15ull) >> 60];
  if (r.site != s || r.quoted == nullptr) r = {s, &quoted_slow(s)};
  return *r.quoted;
}

const std::string& EventFormatter::quoted_slow(const Site* s) {
  auto [it, inserted] = names_.try_emplace(s);
  if (inserted) {
    if (note_names_) ring_file_note_site(s);
    fmt::memory_buffer b;
    json_escape_to(b, (s != nullptr && s->name != nullptr) ? s->name : "");
    it->second.assign(b.data(), b.size());
  }
  return it->second;
}

void EventFormatter::format_phase(const Event& e, fmt::memory_buffer& out) {
  const std::string& name = quoted(e.site);
  const std::string* parent = e.parent != nullptr ? &quoted(e.parent) : nullptr;
  RawLine o(out, kBeginMost + 160 + name.size() + (parent ? parent->size() : 0));
  begin_raw<Kind::kPhase>(o, repeats_, e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
  o << next_key<Field::kName>() << name << next_key<Field::kPhaseKind>() << '"' << phase_kind_name(e.site->kind) << '"'
    << next_key<Field::kDur>();
  o.num(e.dur_ns) << next_key<Field::kDepth>();
  o.num(static_cast<int>(e.depth));
  if (parent != nullptr) o << next_key<Field::kParent>() << *parent;
  if (e.device_timed) (o << next_key<Field::kDev>()).num(e.device_ns);
  if (e.device_timed && e.device_queued_ns >= 0) (o << next_key<Field::kDevQueued>()).num(e.device_queued_ns);
}

void EventFormatter::format_step_end(const Event& e, fmt::memory_buffer& out) {
  const StepScalars& sc = e.scalars;
  RawLine o(out, kBeginMost + 48 + 3 * (16 + kJsonNumberMost) + 3 * (16 + 20) + 16);
  begin_raw<Kind::kStepEnd>(o, repeats_, e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
  if (e.dur_ns) (o << next_key<Field::kDur>()).num(e.dur_ns);
  if (sc.loss) (o << next_key<Field::kLoss>()).number(repeats_.loss, *sc.loss);
  if (sc.lr) (o << next_key<Field::kLr>()).number(repeats_.lr, *sc.lr);
  if (sc.grad_norm) (o << next_key<Field::kGradNorm>()).number(repeats_.grad_norm, *sc.grad_norm);
  if (sc.samples) (o << next_key<Field::kSamples>()).num(*sc.samples);
  if (sc.tokens) (o << next_key<Field::kTokens>()).num(*sc.tokens);
  if (sc.skipped) o << next_key<Field::kSkipped>() << "true";
  if (e.begins_next) (o << next_key<Field::kNextStep>()).num(e.step + 1);  // in place of a step_begin line
}

void EventFormatter::format_collective(const Event& e, fmt::memory_buffer& out) {
  const int n = e.comm != nullptr ? e.comm->size() : 1;
  const std::string_view op = collective_op_name(e.op), dtype = dtype_name(e.dtype);
  const std::string_view comm = e.comm != nullptr ? std::string_view(e.comm->name()) : std::string_view();
  const std::string* phase = e.parent != nullptr ? &quoted(e.parent) : nullptr;
  const std::string* wait = e.wait_phase != nullptr ? &quoted(e.wait_phase) : nullptr;
  {
    RawLine o(out, kBeginMost + 640 + op.size() + dtype.size() + json_escaped_most(comm) +
                       (phase != nullptr ? phase->size() : 0) + (wait != nullptr ? 48 + wait->size() : 0));
    begin_raw<Kind::kCollective>(o, repeats_, e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
    o << next_key<Field::kOp>() << '"' << op << '"' << next_key<Field::kComm>();
    o.escaped(comm);
    (o << next_key<Field::kCommId>()).num(e.comm != nullptr ? e.comm->id() : 0);
    (o << next_key<Field::kSeq>()).num(e.seq);
    (o << next_key<Field::kCount>()).num(e.count);
    o << next_key<Field::kDtype>() << '"' << dtype << '"';
    (o << next_key<Field::kBytes>()).num(collective_bytes(e.op, e.count, e.dtype, n));
    (o << next_key<Field::kPeer>()).num(e.peer);
    (o << next_key<Field::kGroupSize>()).num(n);
    (o << next_key<Field::kDur>()).num(e.dur_ns);
    o << next_key<Field::kResult>() << '"' << collective_result_name(e.result) << '"' << next_key<Field::kFingerprint>() << '"';
    o.hex16(collective_fingerprint(e.op, e.count, e.dtype, e.peer)) << '"';
    const Bandwidth bw = collective_bandwidth(e.op, e.count, e.dtype, n, static_cast<double>(e.dur_ns) * 1e-9);
    (o << next_key<Field::kAlgbwGbps>()).rate(bw.algbw_gbps);
    (o << next_key<Field::kBusbwGbps>()).rate(bw.busbw_gbps);
    if (phase != nullptr) o << next_key<Field::kPhase>() << *phase;
    if (e.device_timed) (o << next_key<Field::kTiming>() << "\"device\"" << next_key<Field::kEnqueueNs>()).num(e.enqueue_ns);
    if (e.device_timed && e.device_queued_ns >= 0) (o << next_key<Field::kDevQueued>()).num(e.device_queued_ns);
    if (e.in_group) o << next_key<Field::kInGroup>() << "true";
    if (wait != nullptr) (o << next_key<Field::kWait>()).num(e.wait_ns) << next_key<Field::kWaitPhase>() << *wait;
  }
  if (e.error != nullptr) {  // rare, any length: through the buffer
    out.append(next_key<Field::kError>());
    json_escape_to(out, e.error);
  }
}

void EventFormatter::format_log(const Event& e, fmt::memory_buffer& out) {
  auto it = fmt::appender(out);
  begin_line(e, out);
  level(e, out);
  message(e, out);
  if (e.logger != nullptr) {
    out.append(next_key<Field::kLogger>());
    json_escape_to(out, e.logger);
  }
  if (!e.attributes.empty()) {
    out.append(next_key<Field::kFields>());
    out.push_back('{');
    attributes_json_to(e.attributes, out);
    out.push_back('}');
  }
  if (const SourceLocation* site = e.source) {
    if (note_names_ && site != last_noted_source_) {
      ring_file_note_source(site);
      last_noted_source_ = site;
    }
    out.append(next_key<Field::kFile>());
    json_escape_to(out, site->file);
    out.append(next_key<Field::kLine>());
    fmt::format_to(it, FMT_COMPILE("{}"), site->line);
    out.append(next_key<Field::kFunction>());
    json_escape_to(out, site->function);
  }
}

// A line from the kind's declaration (schema.hpp): its duration if it
// declares `dur`, its level if it declares `level`, the event's text under its
// first text member, then the attributes - beside those, or inside `fields`
// when the kind declares that. A new kind of event made of a text and
// attributes needs no code here.
void EventFormatter::format_declared(const Event& e, fmt::memory_buffer& out) {
  const schema::LineShape shape = schema::line_shape(e.kind);
  begin_line(e, out);
  if (shape.dur) {
    out.append(next_key<Field::kDur>());
    fmt::format_to(fmt::appender(out), FMT_COMPILE("{}"), e.dur_ns);
  }
  if (shape.level) level(e, out);
  if (shape.text != Field::kUnknown && !e.text.empty()) {
    out.push_back(',');
    out.push_back('"');
    out.append(schema::field_name(shape.text));
    out.append(std::string_view("\":"));
    json_escape_to(out, e.text);
  }
  if (shape.fields) {
    out.append(next_key<Field::kFields>());
    out.push_back('{');
    attributes_json_to(e.attributes, out);
    out.push_back('}');
  } else if (!e.attributes.empty()) {
    out.push_back(',');
    attributes_json_to(e.attributes, out);
  }
}

void EventFormatter::format(const Event& e, fmt::memory_buffer& out) {
  auto it = fmt::appender(out);
  switch (e.kind) {
    case EventKind::kPhase:  // the most frequent line by far
      format_phase(e, out);
      break;
    case EventKind::kStepBegin: {
      RawLine o(out, kBeginMost);
      begin_raw<Kind::kStepBegin>(o, repeats_, e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
      break;
    }
    case EventKind::kStepEnd:
      format_step_end(e, out);
      break;
    case EventKind::kStepScalars: {  // rare next to step_end: not through the repeats (they hold step_end's last values)
      const StepScalars& sc = e.scalars;
      begin_line(e, out);
      if (sc.loss) out.append(next_key<Field::kLoss>()), json_number_to(out, *sc.loss);
      if (sc.lr) out.append(next_key<Field::kLr>()), json_number_to(out, *sc.lr);
      if (sc.grad_norm) out.append(next_key<Field::kGradNorm>()), json_number_to(out, *sc.grad_norm);
      break;
    }
    case EventKind::kMark:
      begin_line(e, out);
      out.append(next_key<Field::kName>());
      out.append(quoted(e.site));
      out.append(next_key<Field::kValue>());
      json_number_to(out, e.value);
      break;
    case EventKind::kCollective:  // once per collective: the whole line through one RawLine, like phases
      format_collective(e, out);
      break;
    case EventKind::kLog:
      format_log(e, out);
      break;
    default:  // the cold kinds (progress, stall, fact, exit, ...): their lines follow their declarations
      format_declared(e, out);
      break;
    case EventKind::kCommError:
      begin_line(e, out);
      out.append(next_key<Field::kComm>());
      json_escape_to(out, e.comm != nullptr ? std::string_view(e.comm->name()) : std::string_view());
      out.append(next_key<Field::kCommId>());
      fmt::format_to(it, FMT_COMPILE("{}"), e.comm != nullptr ? e.comm->id() : 0);
      out.append(next_key<Field::kLastSeq>());
      fmt::format_to(it, FMT_COMPILE("{}"),
                     e.comm != nullptr ? e.comm->issued() : 0);
      out.append(next_key<Field::kError>());
      json_escape_to(out, e.error != nullptr ? e.error : "");
      break;
  }
  out.push_back('}');
}

}  // namespace rankscope::detail
