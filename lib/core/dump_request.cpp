#include "dump_request.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "json_util.hpp"
#include "schema.hpp"
#include "rankscope/export/jsonl.hpp"

namespace rankscope::detail {
namespace {

constexpr std::uint64_t kPollNs = 250'000'000;

std::int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

using schema::Field;

// The integer member `f` of a flat object this file wrote.
std::optional<long long> int_member(std::string_view doc, Field f) {
  const std::string k = fmt::format("\"{}\":", schema::field_name(f));
  const auto at = doc.find(k);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string rest(doc.substr(at + k.size(), 24));
  char* end = nullptr;
  const long long v = std::strtoll(rest.c_str(), &end, 10);
  if (end == rest.c_str()) return std::nullopt;
  return v;
}

}  // namespace

void DumpRequests::start(std::string run_dir, int rank, std::uint64_t session_wall_ns) noexcept {
  try {
    path_ = run_dir.empty() ? std::string() : run_dir + "/dump-request.json";
  } catch (...) {
    path_.clear();
  }
  rank_ = rank;
  session_wall_ns_ = session_wall_ns;
  next_poll_mono_ = 0;
  seen_mtime_ns_ = path_.empty() ? -1 : mtime_ns(path_);  // a request from before this session is history
}

std::optional<DumpRequests::Request> DumpRequests::read() const {
  std::ifstream in(path_);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  Request r;
  const auto rank = int_member(doc, Field::kRank), pid = int_member(doc, Field::kPid), t = int_member(doc, Field::kT),
             since = int_member(doc, Field::kSince);
  if (!rank || !pid || !t || !since) return std::nullopt;
  r.rank = *rank;
  r.pid = *pid;
  r.t = static_cast<std::uint64_t>(*t);
  r.since = static_cast<std::uint64_t>(*since);
  const std::string key = fmt::format("\"{}\":\"", schema::field_name(Field::kReason));
  if (const auto at = doc.find(key); at != std::string::npos) {
    const auto end = doc.find('"', at + key.size());
    if (end != std::string::npos) r.reason = doc.substr(at + key.size(), end - at - key.size());
  }
  return r;
}

void DumpRequests::ask(std::string_view reason, std::uint64_t since_wall_ns, std::uint64_t now_wall_ns) noexcept {
  if (path_.empty()) return;
  try {
    // Someone already asked during this episode (after our progress stopped): their request stands.
    if (const auto prev = read(); prev && prev->t >= since_wall_ns && prev->t >= session_wall_ns_) return;
    JsonWriter w;
    w.begin_object().field(Field::kRank, rank_).field(Field::kPid, static_cast<long long>(::getpid()));
    w.field(Field::kReason, reason).field(Field::kT, now_wall_ns).field(Field::kSince, since_wall_ns).end_object();
    std::string doc = w.take();
    doc += '\n';
    if (write_file_atomic(path_, doc, /*durable=*/false).ok()) seen_mtime_ns_ = mtime_ns(path_);
  } catch (...) {  // no request this time; this rank's own dump is written regardless
  }
}

std::optional<std::string> DumpRequests::poll(std::uint64_t now_mono_ns) noexcept {
  if (path_.empty() || now_mono_ns < next_poll_mono_) return std::nullopt;
  next_poll_mono_ = now_mono_ns + kPollNs;
  const std::int64_t m = mtime_ns(path_);
  if (m < 0 || m == seen_mtime_ns_) return std::nullopt;
  seen_mtime_ns_ = m;
  try {
    const auto r = read();
    if (!r || r->pid == ::getpid() || r->t < session_wall_ns_) return std::nullopt;
    return fmt::format("requested by rank {} ({})", r->rank, r->reason.empty() ? "stall" : r->reason);
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace rankscope::detail
