#include "torch_flight.hpp"

#include <simdjson.h>

#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "schema.hpp"

namespace rankscope::reader {
namespace {

// pg_status's numbers are strings in PyTorch 2.x ("12"); accept numbers too.
std::int64_t as_int(simdjson::dom::element e) {
  std::int64_t v = -1;
  if (e.get_int64().get(v) == simdjson::SUCCESS) return v;
  std::string_view s;
  if (e.get_string().get(s) != simdjson::SUCCESS) return -1;
  if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc()) return -1;
  return v;
}

void read_backend(std::string_view backend, simdjson::dom::object doc, std::vector<TorchGroupPosition>& out) {
  simdjson::dom::object status;
  if (doc["pg_status"].get_object().get(status) != simdjson::SUCCESS) return;
  simdjson::dom::array entries;
  const bool have_entries = doc["entries"].get_array().get(entries) == simdjson::SUCCESS;
  for (auto [pg_id, st] : status) {
    TorchGroupPosition p;
    p.backend = std::string(backend);
    p.group = fmt::format("pg {}", std::string_view(pg_id));
    p.enqueued = as_int(st["last_enqueued_collective"]);
    p.started = as_int(st["last_started_collective"]);
    p.completed = as_int(st["last_completed_collective"]);
    if (!have_entries) {
      out.push_back(std::move(p));
      continue;
    }
    for (auto e : entries) {
      simdjson::dom::array pg;
      std::string_view id, desc, name;
      if (e["process_group"].get_array().get(pg) != simdjson::SUCCESS || pg.size() < 2 ||
          pg.at(0).get_string().get(id) != simdjson::SUCCESS || id != std::string_view(pg_id)) {
        continue;
      }
      if (pg.at(1).get_string().get(desc) == simdjson::SUCCESS && !desc.empty()) p.group = std::string(desc);
      std::int64_t seq = -1;
      if (e["collective_seq_id"].get_int64().get(seq) != simdjson::SUCCESS || seq != p.enqueued) continue;
      if (e["profiling_name"].get_string().get(name) == simdjson::SUCCESS) p.op = std::string(name);
      simdjson::dom::element sizes;
      if (e["input_sizes"].get(sizes) == simdjson::SUCCESS) p.sizes = simdjson::minify(sizes);
    }
    out.push_back(std::move(p));
  }
}

}  // namespace

std::vector<TorchGroupPosition> read_torch_flight(const std::string& path, std::int64_t pid) {
  std::vector<TorchGroupPosition> out;
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.load(path).get(doc) != simdjson::SUCCESS) return out;  // absent or torn: nothing to add
  std::int64_t writer = 0;
  if (doc[schema::field_name(schema::Field::kPid)].get_int64().get(writer) != simdjson::SUCCESS || (pid != 0 && writer != pid)) return out;
  simdjson::dom::object by_backend;
  if (doc["torch"].get_object().get(by_backend) != simdjson::SUCCESS) return out;
  for (auto [backend, d] : by_backend) {
    simdjson::dom::object o;
    if (d.get_object().get(o) == simdjson::SUCCESS) read_backend(backend, o, out);
  }
  return out;
}

}  // namespace rankscope::reader
