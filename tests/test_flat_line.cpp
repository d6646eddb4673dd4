// The reader's fast path (lib/reader/flat_line.hpp) against simdjson: on every
// line of real run logs, on lines at the edges of its shape, on every
// truncation and on single-byte corruptions of each, the two decoders accept
// the same lines and decode them to the same event.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "describe_event.hpp"
#include "line_decoder.hpp"

using namespace rankscope;
using rankscope::test::describe;

namespace {

struct Decoded {
  bool ok = false;
  std::string text;
  std::uint64_t undeclared = 0;
};

// Decodes `line` with one decoder; the line sits in a padded buffer, as in the reader.
Decoded decode_with(reader::LineDecoder& d, const std::string& line) {
  std::string buf = line;
  buf.append(reader::line_padding(), '\0');
  reader::LogEvent e;
  reader::ReadResult res;
  Decoded out;
  out.ok = d.decode(buf.data(), line.size(), e, res);
  if (out.ok) out.text = describe(e);
  out.undeclared = res.undeclared_keys;
  return out;
}

// Both decoders on one line; returns whether the fast path took it. `warm`: a
// line the fast decoder reads first, so that it expects that line's keys at their
// positions (their word compare, flat::KeyPattern, rather than the key scan).
bool same_decoding(const std::string& line, const std::string& warm = "") {
  reader::LineDecoder fast(true), slow(false);
  if (!warm.empty()) decode_with(fast, warm);
  const std::uint64_t fast_before = fast.fast_lines();
  const Decoded a = decode_with(fast, line);
  const Decoded b = decode_with(slow, line);
  INFO("line: " << line);
  CHECK(a.ok == b.ok);
  CHECK(a.text == b.text);
  if (a.ok) CHECK(a.undeclared == b.undeclared);
  return fast.fast_lines() == fast_before + 1;
}

// Every truncation, and each byte replaced by bytes that change JSON's meaning;
// each by a fresh decoder and by one that expects the undamaged line's keys.
void same_under_damage(const std::string& line) {
  for (std::size_t n = 0; n < line.size(); ++n) {
    same_decoding(line.substr(0, n));
    same_decoding(line.substr(0, n), line);
  }
  static const char kBytes[] = {'"', '\\', ',', ':', '}', '{', '[', '0', '9', '-', '.', 'e', ' ', '\t', 'x', '\x7f', '\x01', '\xc3'};
  for (std::size_t i = 0; i < line.size(); ++i) {
    for (const char b : kBytes) {
      std::string damaged = line;
      damaged[i] = b;
      same_decoding(damaged);
      same_decoding(damaged, line);
    }
  }
}

// The writer's hot lines, as it writes them.
const std::vector<std::string> kHotLines = {
    R"({"kind":"phase","t":1790000000002000000,"mono":1000002000000,"rank":0,"step":0,"tid":5000,"name":"attention","phase_kind":"other","dur":15000000,"depth":1,"parent":"forward"})",
    R"({"kind":"step_begin","t":1790000000100000000,"mono":1000100000000,"rank":3,"step":1,"tid":5000})",
    R"({"kind":"step_end","t":1790000000100000000,"mono":1000100000000,"rank":0,"step":0,"tid":5000,"dur":100000000,"loss":2.0000,"lr":1e-05,"samples":8,"skipped":false,"next_step":1})",
    R"({"kind":"step_end","t":1,"mono":2,"rank":0,"step":7,"tid":1,"dur":5,"loss":"NaN","grad_norm":"-Infinity","tokens":null})",
    R"({"kind":"collective","t":1790000000072000000,"mono":1000072000000,"rank":0,"step":0,"tid":5000,"op":"all_reduce","comm":"world","comm_id":0,"seq":1,"count":1001,"dtype":"float32","bytes":4004,"peer":-1,"group_size":512,"dur":5000000,"result":"ok","fingerprint":"ca35c935ea93c1d4","busbw_gbps":1.5,"phase":"all_reduce","in_group":true,"wait":12,"wait_phase":"all_reduce.wait"})",
    R"({"kind":"mark","t":5,"mono":6,"rank":1,"step":2,"name":"eval","value":-0.25})",
};

}  // namespace

TEST_CASE("The fast path takes the writer's hot lines and decodes them as simdjson does", "[flat_line]") {
  for (const auto& line : kHotLines) CHECK(same_decoding(line));
}

TEST_CASE("The fast path gives way to simdjson at the edges of its shape", "[flat_line]") {
  const std::vector<std::string> edges = {
      R"({"kind":"phase","rank":1,"step":9223372036854775807,"dur":18446744073709551615})",  // int64 max; 20 digits
      R"({"kind":"phase","rank":1,"step":-9223372036854775808,"dur":9999999999999999999})",  // 19 digits
      R"({"kind":"phase","step":99999999999999999999,"dur":99999999999999999999})",  // past uint64
      R"({"kind":"phase","step":-9999999999999999999,"depth":-2147483649})",  // past int64; past int
      R"({"kind":"phase","rank":-0,"step":-1,"dur":-5,"depth":1.0})",   // -0; negative into unsigned; double into int
      R"({"kind":"step_end","loss":-0,"lr":-0.0})",
      R"({"kind":"phase","dur":1e400})",                                // out of range: simdjson refuses the line
      R"({"kind":"phase","dur":1,"x":1e-400})",                         // an unread member decides too
      R"({"kind":"step_end","loss":2.5e-320,"lr":-0.0,"grad_norm":1E+2})",
      R"({"kind":"phase","name":"caf\u00e9","phase_kind":"forward"})",  // an escape
      "{\"kind\":\"phase\",\"name\":\"caf\xc3\xa9\"}",                  // UTF-8
      "{\"kind\":\"phase\",\"name\":\"bad\xc3\"}",                      // invalid UTF-8
      R"({ "kind":"phase","dur":1})",                                   // whitespace
      "{\"kind\":\"phase\",\"dur\":1}\r",                               // a CRLF file
      R"({"kind":"phase","dur":1}x)",                                   // trailing bytes
      R"({"kind":"phase","dur":1,})",                                   // trailing comma
      R"({"t":1,"kind":"phase","dur":1})",                              // kind not first
      R"({"kind":"newer_kind","t":1,"rank":2})",                        // a kind this version does not know
      R"({"kind":5,"t":1})",                                            // kind not a string
      R"({"kind":"phase","kind":"step_end","dur":1})",                  // duplicate keys
      R"({"kind":"phase","dur":1,"dur":2,"unknown_key":true})",
      R"({"kind":"phase","phase_kind":"no_such_kind","depth":true})",
      R"({"kind":"collective","result":"timeout","peer":2147483648,"busbw_gbps":"fast"})",
      R"({"kind":"fact","name":"sampler","fields":{"seed":1}})",        // nested: simdjson's
      R"({"kind":"stall","open_phases":[{"name":"fwd"}]})",
      R"({"kind":"phase","dur":01})",
      R"({"kind":"phase","dur":1.})",
      R"({"kind":"phase","dur":.5})",
      R"({"kind":"phase","dur":tru})",
      R"({"kind":"phase","parent":null,"name":nul})",
      R"([1,2])",
      R"("kind")",
      "",
  };
  for (const auto& line : edges) same_decoding(line);
}

TEST_CASE("Fast path and simdjson agree on every truncation and corruption of hot lines", "[flat_line]") {
  for (const auto& line : kHotLines) same_under_damage(line);
}

TEST_CASE("Fast path and simdjson agree on every line of real runs", "[flat_line]") {
  std::size_t lines = 0, fast = 0;
  // The fuzzer's seeds: run directories (a real 4-rank run among them) as
  // files split at 0xFF bytes, the first and third parts being run logs.
  for (const auto& entry : std::filesystem::directory_iterator(RANKSCOPE_SOURCE_DIR "/tests/fuzz/corpus")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream whole;
    whole << in.rdbuf();
    std::vector<std::string> parts;
    for (std::string part; std::getline(whole, part, '\xff');) parts.push_back(part);
    for (std::size_t p : {0u, 2u}) {
      if (p >= parts.size()) continue;
      std::istringstream log(parts[p]);
      std::string before;  // the line before, as the reader had read it: its keys expected
      for (std::string line; std::getline(log, line); before = line) {
        ++lines;
        fast += same_decoding(line) ? 1 : 0;
        same_decoding(line, before);
      }
    }
  }
  REQUIRE(lines > 100);
  CHECK(fast * 2 > lines);  // most lines of a run are hot ones
}
