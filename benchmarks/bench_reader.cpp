// The run-log reader's line decoding: the writer's hot lines (a step of the
// synthetic run: 7 phases, a collective, step begin and end) through simdjson
// alone (the baseline) and through the fast path for flat lines
// (lib/reader/flat_line.hpp). Bytes per second are the figure to compare.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "line_decoder.hpp"

namespace {

std::string step_lines() {
  const char* lines[] = {
      R"({"kind":"step_begin","t":1790000000100000000,"mono":1000100000000,"rank":7,"step":1,"tid":5000})",
      R"({"kind":"phase","t":1790000000100000000,"mono":1000100000000,"rank":7,"step":1,"tid":5000,"name":"loader_wait","phase_kind":"loader_wait","dur":2000000,"depth":0})",
      R"({"kind":"phase","t":1790000000102000000,"mono":1000102000000,"rank":7,"step":1,"tid":5000,"name":"attention","phase_kind":"other","dur":15000000,"depth":1})",
      R"({"kind":"phase","t":1790000000117000000,"mono":1000117000000,"rank":7,"step":1,"tid":5000,"name":"mlp","phase_kind":"other","dur":15000000,"depth":1})",
      R"({"kind":"phase","t":1790000000102000000,"mono":1000102000000,"rank":7,"step":1,"tid":5000,"name":"forward","phase_kind":"forward","dur":30000000,"depth":0})",
      R"({"kind":"phase","t":1790000000132000000,"mono":1000132000000,"rank":7,"step":1,"tid":5000,"name":"backward","phase_kind":"backward","dur":40000000,"depth":0})",
      R"({"kind":"collective","t":1790000000172000000,"mono":1000172000000,"rank":7,"step":1,"tid":5000,"op":"all_reduce","comm":"world","comm_id":0,"seq":2,"count":1001,"dtype":"float32","bytes":4004,"peer":-1,"group_size":512,"dur":5000000,"result":"ok","fingerprint":"ca35c935ea93c1d4","busbw_gbps":1.5,"phase":"all_reduce"})",
      R"({"kind":"phase","t":1790000000172000000,"mono":1000172000000,"rank":7,"step":1,"tid":5000,"name":"all_reduce","phase_kind":"collective","dur":5000000,"depth":0})",
      R"({"kind":"phase","t":1790000000177000000,"mono":1000177000000,"rank":7,"step":1,"tid":5000,"name":"optimizer","phase_kind":"optimizer","dur":8000000,"depth":0})",
      R"({"kind":"step_end","t":1790000000200000000,"mono":1000200000000,"rank":7,"step":1,"tid":5000,"dur":100000000,"loss":2.0000,"lr":0.1,"samples":8})",
  };
  std::string out;
  for (const char* l : lines) (out += l) += '\n';
  return out;
}

void decode_all(benchmark::State& state, bool fast_path) {
  std::string buf = step_lines();
  const std::size_t size = buf.size();
  buf.append(rankscope::reader::line_padding(), '\0');
  rankscope::reader::LineDecoder decoder(fast_path);
  rankscope::reader::LogEvent e;
  rankscope::reader::ReadResult res;
  for (auto _ : state) {
    for (std::size_t at = 0; at < size;) {
      const std::size_t nl = buf.find('\n', at);
      benchmark::DoNotOptimize(decoder.decode(buf.data() + at, nl - at, e, res));
      at = nl + 1;
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
  state.counters["fast_lines"] = static_cast<double>(decoder.fast_lines());
}

void BM_Reader_DecodeStep_Baseline_Simdjson(benchmark::State& state) { decode_all(state, false); }
void BM_Reader_DecodeStep_FastPath(benchmark::State& state) { decode_all(state, true); }

}  // namespace

BENCHMARK(BM_Reader_DecodeStep_Baseline_Simdjson);
BENCHMARK(BM_Reader_DecodeStep_FastPath);
