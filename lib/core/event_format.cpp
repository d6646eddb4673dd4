#include "event_format.hpp"

#include <fmt/compile.h>

#include <cstring>

#include "attribute_codec.hpp"
#include "decimal.hpp"
#include "json_util.hpp"
#include "rankscope/log.hpp"
#include "schema.hpp"

namespace rankscope::detail {

using schema::Kind;
using schema::kind_name;

namespace {
const char* result_name(CollectiveResult r) {
  switch (r) {
    case CollectiveResult::kOk: return "ok";
    case CollectiveResult::kFailed: return "failed";
    case CollectiveResult::kTimedOut: return "timed_out";
  }
  return "ok";
}
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
  RawLine& time(decimal::RepeatingPrefix& digits, std::uint64_t ns) {
    p_ = digits.write(p_, ns);
    return *this;
  }
  RawLine& number(double v) {  // kJsonNumberMost bytes of room
    p_ = json_number_at(p_, v);
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

// The start of every line, as begin() writes it; kBeginMost bytes of room plus the kind.
void begin_raw(RawLine& o, LineClocks& clocks, std::string_view kind, std::uint64_t wall, std::uint64_t mono, int rank,
               std::int64_t step, std::int32_t tid) {
  o << "{\"kind\":\"" << kind << "\",\"t\":";
  o.time(clocks.wall, wall) << ",\"mono\":";
  o.time(clocks.mono, mono) << ",\"rank\":";
  o.num(rank);
  if (step >= 0) (o << ",\"step\":").num(step);
  if (tid != 0) (o << ",\"tid\":").num(tid);
}
constexpr std::size_t kBeginMost = 32 + 20 + 20 + 11 + 20 + 11 + 40;

}  // namespace

void EventFormatter::begin(fmt::memory_buffer& out, std::string_view kind, std::uint64_t wall, std::uint64_t mono,
                           std::int64_t step, std::int32_t tid) const {
  RawLine o(out, kBeginMost + kind.size());
  begin_raw(o, clocks_, kind, wall, mono, rank_, step, tid);
}

const std::string& EventFormatter::quoted(const Site* s) {
  Recent& r = recent_[(reinterpret_cast<std::uintptr_t>(s) * 0x9E3779B97F4A7C15ull) >> 60];
  if (r.site != s || r.quoted == nullptr) r = {s, &quoted_slow(s)};
  return *r.quoted;
}

const std::string& EventFormatter::quoted_slow(const Site* s) {
  auto [it, inserted] = names_.try_emplace(s);
  if (inserted) {
    fmt::memory_buffer b;
    json_escape_to(b, (s != nullptr && s->name != nullptr) ? s->name : "");
    it->second.assign(b.data(), b.size());
  }
  return it->second;
}

void EventFormatter::format(const Event& e, fmt::memory_buffer& out) {
  auto it = fmt::appender(out);
  switch (e.kind) {
    case EventKind::kPhase: {  // the most frequent line by far
      const std::string& name = quoted(e.site);
      const std::string* parent = e.parent != nullptr ? &quoted(e.parent) : nullptr;
      RawLine o(out, kBeginMost + 96 + name.size() + (parent ? parent->size() : 0));
      begin_raw(o, clocks_, kind_name(Kind::kPhase), e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
      o << ",\"name\":" << name << ",\"phase_kind\":\"" << phase_kind_name(e.site->kind) << "\",\"dur\":";
      o.num(e.dur_ns) << ",\"depth\":";
      o.num(static_cast<int>(e.depth));
      if (parent != nullptr) o << ",\"parent\":" << *parent;
      break;
    }
    case EventKind::kStepBegin: {
      RawLine o(out, kBeginMost);
      begin_raw(o, clocks_, kind_name(Kind::kStepBegin), e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
      break;
    }
    case EventKind::kStepEnd: {
      const StepScalars& sc = e.scalars;
      RawLine o(out, kBeginMost + 48 + 3 * (16 + kJsonNumberMost) + 2 * (16 + 20) + 16);
      begin_raw(o, clocks_, kind_name(Kind::kStepEnd), e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
      if (e.dur_ns) (o << ",\"dur\":").num(e.dur_ns);
      if (sc.loss) (o << ",\"loss\":").number(*sc.loss);
      if (sc.lr) (o << ",\"lr\":").number(*sc.lr);
      if (sc.grad_norm) (o << ",\"grad_norm\":").number(*sc.grad_norm);
      if (sc.samples) (o << ",\"samples\":").num(*sc.samples);
      if (sc.tokens) (o << ",\"tokens\":").num(*sc.tokens);
      if (sc.skipped) o << ",\"skipped\":true";
      break;
    }
    case EventKind::kMark:
      begin(out, kind_name(Kind::kMark), e.wall_ns, e.mono_ns, e.step, e.tid);
      out.append(std::string_view(",\"name\":"));
      out.append(quoted(e.site));
      out.append(std::string_view(",\"value\":"));
      json_number_to(out, e.value);
      break;
    case EventKind::kCollective: {  // once per collective: the whole line through one RawLine, like phases
      const int n = e.comm != nullptr ? e.comm->size() : 1;
      const std::string_view op = collective_op_name(e.op), dtype = dtype_name(e.dtype);
      const std::string_view comm = e.comm != nullptr ? std::string_view(e.comm->name()) : std::string_view();
      const std::string* phase = e.parent != nullptr ? &quoted(e.parent) : nullptr;
      {
        RawLine o(out, kBeginMost + 640 + op.size() + dtype.size() + json_escaped_most(comm) +
                           (phase != nullptr ? phase->size() : 0));
        begin_raw(o, clocks_, kind_name(Kind::kCollective), e.wall_ns, e.mono_ns, rank_, e.step, e.tid);
        o << ",\"op\":\"" << op << "\",\"comm\":";
        o.escaped(comm);
        (o << ",\"comm_id\":").num(e.comm != nullptr ? e.comm->id() : 0);
        (o << ",\"seq\":").num(e.seq);
        (o << ",\"count\":").num(e.count);
        o << ",\"dtype\":\"" << dtype;
        (o << "\",\"bytes\":").num(collective_bytes(e.op, e.count, e.dtype, n));
        (o << ",\"peer\":").num(e.peer);
        (o << ",\"group_size\":").num(n);
        (o << ",\"dur\":").num(e.dur_ns);
        o << ",\"result\":\"" << result_name(e.result) << "\",\"fingerprint\":\"";
        o.hex16(collective_fingerprint(e.op, e.count, e.dtype, e.peer)) << "\"";
        const Bandwidth bw = collective_bandwidth(e.op, e.count, e.dtype, n, static_cast<double>(e.dur_ns) * 1e-9);
        (o << ",\"algbw_gbps\":").rate(bw.algbw_gbps);
        (o << ",\"busbw_gbps\":").rate(bw.busbw_gbps);
        if (phase != nullptr) o << ",\"phase\":" << *phase;
        if (e.device_timed) (o << ",\"timing\":\"device\",\"enqueue_ns\":").num(e.enqueue_ns);
        if (e.in_group) o << ",\"in_group\":true";
      }
      if (e.error != nullptr) {  // rare, any length: through the buffer
        out.append(std::string_view(",\"error\":"));
        json_escape_to(out, e.error);
      }
      break;
    }
    case EventKind::kProgress:
      begin(out, kind_name(Kind::kProgress), e.wall_ns, e.mono_ns, e.step, e.tid);
      break;
    case EventKind::kStall:
    case EventKind::kStallEnd:
    case EventKind::kSlowStep:
      begin(out, kind_name(e.kind == EventKind::kStall      ? Kind::kStall
                           : e.kind == EventKind::kStallEnd ? Kind::kStallEnd
                                                             : Kind::kSlowStep),
            e.wall_ns, e.mono_ns, e.step, e.tid);
      fmt::format_to(it, FMT_COMPILE(",\"dur\":{}"), e.dur_ns);
      if (!e.text.empty()) {  // a stall: where the rank is
        out.append(std::string_view(",\"inside\":"));
        json_escape_to(out, e.text);
      }
      if (!e.attributes.empty()) {
        out.push_back(',');
        attributes_json_to(e.attributes, out);
      }
      break;
    case EventKind::kLog: {
      begin(out, kind_name(Kind::kLog), e.wall_ns, e.mono_ns, e.step, e.tid);
      fmt::format_to(it, FMT_COMPILE(",\"level\":\"{}\",\"msg\":"), level_name(e.level));
      json_escape_to(out, e.text);
      if (e.logger != nullptr) {
        out.append(std::string_view(",\"logger\":"));
        json_escape_to(out, e.logger);
      }
      if (!e.attributes.empty()) {
        out.append(std::string_view(",\"fields\":{"));
        attributes_json_to(e.attributes, out);
        out.push_back('}');
      }
      if (const SourceLocation* site = e.source) {
        out.append(std::string_view(",\"file\":"));
        json_escape_to(out, site->file);
        fmt::format_to(it, FMT_COMPILE(",\"line\":{},\"function\":"), site->line);
        json_escape_to(out, site->function);
      }
      break;
    }
    case EventKind::kFact:
      begin(out, kind_name(Kind::kFact), e.wall_ns, e.mono_ns, e.step, e.tid);
      out.append(std::string_view(",\"name\":"));
      json_escape_to(out, e.text);
      out.append(std::string_view(",\"fields\":{"));
      attributes_json_to(e.attributes, out);
      out.push_back('}');
      break;
    case EventKind::kViolation:
      begin(out, kind_name(Kind::kViolation), e.wall_ns, e.mono_ns, e.step, e.tid);
      fmt::format_to(it, FMT_COMPILE(",\"level\":\"{}\",\"msg\":"), level_name(e.level));
      json_escape_to(out, e.text);
      if (!e.attributes.empty()) {
        out.push_back(',');
        attributes_json_to(e.attributes, out);
      }
      break;
    case EventKind::kCommError:
      begin(out, kind_name(Kind::kCommError), e.wall_ns, e.mono_ns, e.step, e.tid);
      out.append(std::string_view(",\"comm\":"));
      json_escape_to(out, e.comm != nullptr ? std::string_view(e.comm->name()) : std::string_view());
      fmt::format_to(it, FMT_COMPILE(",\"comm_id\":{},\"last_seq\":{}"), e.comm != nullptr ? e.comm->id() : 0,
                     e.comm != nullptr ? e.comm->issued() : 0);
      out.append(std::string_view(",\"error\":"));
      json_escape_to(out, e.error != nullptr ? e.error : "");
      break;
  }
  out.push_back('}');
}

}  // namespace rankscope::detail
