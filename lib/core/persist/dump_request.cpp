#include "dump_request.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "json_util.hpp"
#include "schema.hpp"
#include "rankscope/export/jsonl.hpp"

namespace rankscope::detail {
namespace {

constexpr std::uint64_t kPollNs = 250'000'000;

std::mutex g_channel_mu;
DumpRequestChannel g_channel;  // Requires g_channel_mu held.

DumpRequestChannel channel() {
  std::lock_guard<std::mutex> lk(g_channel_mu);
  return g_channel;
}

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
  next_poll_mono_ = next_store_poll_mono_ = 0;
  handled_pid_ = -1;
  handled_t_ = 0;
  seen_mtime_ns_ = path_.empty() ? -1 : mtime_ns(path_);  // a request from before this session is history
}

void set_dump_request_channel(DumpRequestChannel c) noexcept {
  try {
    std::lock_guard<std::mutex> lk(g_channel_mu);
    g_channel = std::move(c);
  } catch (...) {
  }
}

namespace {
std::optional<DumpRequests::Request> parse_request(const std::string& doc);
}

std::optional<DumpRequests::Request> DumpRequests::read() const {
  std::ifstream in(path_);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_request(ss.str());
}

namespace {
std::optional<DumpRequests::Request> parse_request(const std::string& doc) {
  DumpRequests::Request r;
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

}  // namespace

void DumpRequests::ask(std::string_view reason, std::uint64_t since_wall_ns, std::uint64_t now_wall_ns) noexcept {
  try {
    // Someone already asked during this episode (after our progress stopped): their request stands.
    if (handled_t_ >= since_wall_ns && handled_t_ >= session_wall_ns_) return;
    if (const auto prev = path_.empty() ? std::nullopt : read();
        prev && prev->t >= since_wall_ns && prev->t >= session_wall_ns_) {
      return;
    }
    JsonWriter w;
    w.begin_object().field(Field::kRank, rank_).field(Field::kPid, static_cast<long long>(::getpid()));
    w.field(Field::kReason, reason).field(Field::kT, now_wall_ns).field(Field::kSince, since_wall_ns).end_object();
    std::string doc = w.take();
    doc += '\n';
    handled_pid_ = ::getpid();
    handled_t_ = now_wall_ns;
    if (!path_.empty() && write_file_atomic(path_, doc, /*durable=*/false).ok()) seen_mtime_ns_ = mtime_ns(path_);
    if (const DumpRequestChannel ch = channel(); ch.put) ch.put(doc);
  } catch (...) {  // no request this time; this rank's own dump is written regardless
  }
}

std::optional<std::string> DumpRequests::take(const std::optional<Request>& r) {
  if (!r || r->pid == ::getpid() || r->t < session_wall_ns_) return std::nullopt;
  if (r->pid == handled_pid_ && r->t == handled_t_) return std::nullopt;  // seen by the other path
  handled_pid_ = r->pid;
  handled_t_ = r->t;
  return fmt::format("requested by rank {} ({})", r->rank, r->reason.empty() ? "stall" : r->reason);
}

std::optional<std::string> DumpRequests::poll(std::uint64_t now_mono_ns) noexcept {
  try {
    if (!path_.empty() && now_mono_ns >= next_poll_mono_) {
      next_poll_mono_ = now_mono_ns + kPollNs;
      if (const std::int64_t m = mtime_ns(path_); m >= 0 && m != seen_mtime_ns_) {
        seen_mtime_ns_ = m;
        if (auto why = take(read())) return why;
      }
    }
    if (now_mono_ns >= next_store_poll_mono_) {
      next_store_poll_mono_ = now_mono_ns + kPollNs;  // the channel's own thread polls the store (1 s)
      if (const DumpRequestChannel ch = channel(); ch.get) {
        if (const auto doc = ch.get()) return take(parse_request(*doc));
      }
    }
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace rankscope::detail
