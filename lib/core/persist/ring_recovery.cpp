// Recovering a dead process's rings (ring_file.hpp): its records from the
// last one whose line reached the run log to the last one published, decoded
// with the background thread's decoder (record_decode.hpp), every pointer
// looked up in the names table, appended to its run log after a `recovered`
// line.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "clock.hpp"
#include "event_format.hpp"
#include "fd_io.hpp"
#include "flight.hpp"
#include "record_decode.hpp"
#include "ring_file.hpp"
#include "ring_file_layout.hpp"
#include "schema.hpp"

namespace rankscope::detail {

namespace {

// Ticks to clocks by the dead process's last anchor (refreshed every second).
struct AnchorClock {
  RingAnchor a;
  ConvertedTime convert(std::uint64_t ticks) const {
    const double d = static_cast<double>(static_cast<std::int64_t>(ticks - a.ticks)) * a.ns_per_tick;
    return {static_cast<std::uint64_t>(static_cast<double>(a.mono_ns) + d),
            static_cast<std::uint64_t>(static_cast<double>(a.wall_ns) + d)};
  }
  std::uint64_t ticks_to_ns(std::uint64_t d) const {
    return static_cast<std::uint64_t>(static_cast<double>(d) * a.ns_per_tick + 0.5);
  }
};

// The names table, as objects the formatter can print; null for what it lacks.
class TableNames {
 public:
  TableNames(const char* table, std::uint32_t used) {
    for (std::uint32_t at = 0; at + sizeof(RingName) <= used;) {
      RingName n;
      std::memcpy(&n, table + at, sizeof(n));
      if (n.bytes < sizeof(n) || at + n.bytes > used || sizeof(n) + n.n1 + n.n2 > n.bytes) break;
      const char* s1 = table + at + sizeof(n);
      const std::string& one = strings_.emplace_back(s1, n.n1);
      const std::string& two = strings_.emplace_back(s1 + n.n1, n.n2);
      switch (n.type) {
        case kNameSite:
          sites_.try_emplace(n.key, Site{one.c_str(), "", "", 0, static_cast<PhaseKind>(std::min<int>(n.kind, kPhaseKindCount - 1))});
          break;
        case kNameCommunicator:
          comms_.try_emplace(n.key, detached_communicator(n.a, one, n.b, n.c));
          break;
        case kNameSource:
          sources_.try_emplace(n.key, SourceLocation{one.c_str(), two.c_str(), n.a});
          break;
        case kNameLogger:
          loggers_.try_emplace(n.key, one.c_str());
          break;
        default:
          break;
      }
      at += n.bytes;
    }
  }
  const Site* site(const Site* p) const { return find(sites_, p); }
  const Communicator* communicator(const void* p) const {
    const auto it = comms_.find(reinterpret_cast<std::uintptr_t>(p));
    return it == comms_.end() ? nullptr : it->second.get();
  }
  const SourceLocation* source(const void* p) const { return find(sources_, p); }
  const char* error(const Site* p) const {
    const Site* s = site(p);
    return s != nullptr ? s->name : "(the error text was not recovered)";
  }
  const char* logger(std::uint16_t id) const {
    const auto it = loggers_.find(id);
    return it == loggers_.end() ? nullptr : it->second;
  }

 private:
  template <typename T>
  static const T* find(const absl::flat_hash_map<std::uint64_t, T>& m, const void* p) {
    const auto it = m.find(reinterpret_cast<std::uintptr_t>(p));
    return it == m.end() ? nullptr : &it->second;
  }
  std::deque<std::string> strings_;  // stable addresses
  absl::flat_hash_map<std::uint64_t, Site> sites_;
  absl::flat_hash_map<std::uint64_t, std::unique_ptr<Communicator>> comms_;
  absl::flat_hash_map<std::uint64_t, SourceLocation> sources_;
  absl::flat_hash_map<std::uint64_t, const char*> loggers_;
};

struct Decoded {
  std::vector<Event> events;
  std::uint64_t unresolved = 0;  // records naming what the table lacks (first used in the lost window)
};

// One ring block's records not yet in the run log; false for a block this
// build cannot read (the file is then left alone).
bool decode_block(const char* block, std::uint64_t bytes, const AnchorClock& clock, const TableNames& names,
                  bool write_landed, Decoded& out) {
  const auto* st = reinterpret_cast<const ThreadState*>(block);
  const auto* slots = reinterpret_cast<const Record*>(block + kRingStateBytes);
  const std::uint64_t cap = (bytes - kRingStateBytes) / sizeof(Record);
  const std::uint64_t mask = st->mask;
  // A block handed out whose ThreadState was not made yet (killed in between): nothing in it.
  if (mask == 0 && st->published.load(std::memory_order_acquire) == 0) return true;
  if (cap == 0 || (cap & (cap - 1)) != 0 || mask + 1 != cap) return false;
  const std::uint64_t end = st->published.load(std::memory_order_acquire);
  std::uint64_t at = st->written.load(std::memory_order_acquire);
  if (end < at) return false;
  if (const std::uint64_t c = st->committing.load(std::memory_order_acquire); write_landed && c > at && c <= end) at = c;
  if (end - at > cap) at = end - cap;  // older ones were overwritten: their lines were written
  absl::flat_hash_map<std::int64_t, std::uint64_t> begun;  // step -> its step_begin (mono), for step_end's dur
  while (at < end) {
    const Record& r = slots[at & mask];
    Event e;
    if (is_log_like(r.kind)) {
      const std::int64_t msg = r.v[1].i, fld = r.v[2].i;
      // Not a record this build wrote (checked without adding: garbage may be near INT64_MAX).
      if (msg < 0 || fld < 0 || msg > (1 << 20) || fld > (1 << 20) - msg) break;
      const std::uint64_t n = 1 + (static_cast<std::uint64_t>(msg + fld) + sizeof(Record) - 1) / sizeof(Record);
      if (n > end - at) break;
      event_from_log(slots, mask, at, clock, names, st->tid, e);
      at += n;
      if (e.written_inline) continue;  // an error its thread wrote to the log itself
    } else {
      const Record* next = at + 1 < end ? &slots[(at + 1) & mask] : nullptr;
      ++at;
      if (!event_from_record(r, next, clock, names, st->tid, e)) continue;
      const bool needs_site = e.kind == EventKind::kPhase || e.kind == EventKind::kMark;
      if ((needs_site && e.site == nullptr) || (e.kind == EventKind::kCollective && e.comm == nullptr) ||
          (r.kind == RecordKind::kPhase && r.v[0].site != nullptr && e.parent == nullptr)) {
        ++out.unresolved;
        continue;
      }
      if (e.kind == EventKind::kStepBegin) begun[e.step] = e.mono_ns;
      if (e.kind == EventKind::kStepEnd) {
        if (auto it = begun.find(e.step); it != begun.end() && e.mono_ns >= it->second) e.dur_ns = e.mono_ns - it->second;
        if (e.begins_next) begun[e.step + 1] = e.mono_ns;
      }
    }
    out.events.push_back(std::move(e));
  }
  return true;
}

}  // namespace

// Whether the run-log piece being written when the process died (RingCommit)
// is in the file: its head somewhere after where the file ended before it
// (inline error lines may have come between), and its tail where its length
// puts it.
bool run_log_piece_landed(const RingCommit& c, const std::string& run_log) {
  if (c.state.load(std::memory_order_acquire) != kCommitReady) return false;
  const std::size_t edge = c.edge_bytes;
  const std::uint64_t len = c.piece_bytes;
  if (edge == 0 || edge > kCommitEdgeBytes || len < edge || c.file_from < 0) return false;
  const int fd = ::open(run_log.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) == 0 && st.st_size >= c.file_from + static_cast<std::int64_t>(len)) {
    constexpr std::int64_t kMost = 16 << 20;  // a piece is 256 KiB; the rest would be inline lines
    text.resize(static_cast<std::size_t>(std::min<std::int64_t>(st.st_size - c.file_from, kMost)));
    const ssize_t got = ::pread(fd, text.data(), text.size(), c.file_from);
    text.resize(got > 0 ? static_cast<std::size_t>(got) : 0);
  }
  ::close(fd);
  const std::string_view head(c.head, edge), tail(c.tail, edge);
  for (std::size_t at = text.find(head); at != std::string::npos; at = text.find(head, at + 1)) {
    if (at + len > text.size()) return false;
    if (std::string_view(text).substr(at + len - edge, edge) == tail) return true;
  }
  return false;
}

namespace {

// Appends the `recovered` line and the events' lines to the run log.
bool append_to_run_log(const RingFileHeader& h, const std::string& run_log, const AnchorClock& clock, const Decoded& d) {
  const int fd = ::open(run_log.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  fmt::memory_buffer out;
  // A line cut by the kill: ended here, so it stays one corrupt line and ours start whole.
  struct stat st;
  char last = '\n';
  const bool torn = ::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n';
  if (torn) out.push_back('\n');
  EventFormatter fmt(h.rank);
  // Dated at the first record it brings back (or the dead process's last clock anchor), not now.
  const ConvertedTime at = d.events.empty() ? ConvertedTime{clock.a.mono_ns, clock.a.wall_ns}
                                            : ConvertedTime{d.events.front().mono_ns, d.events.front().wall_ns};
  fmt.begin(out, schema::kind_name(schema::Kind::kRecovered), at.wall_ns, at.mono_ns, -1, 0);
  fmt::format_to(fmt::appender(out), "{}{}{}{}{}{}{}{}}}\n", schema::next_key<schema::Field::kPid>(), h.pid,
                 schema::next_key<schema::Field::kRecords>(), d.events.size(), schema::next_key<schema::Field::kUnresolved>(),
                 d.unresolved, schema::next_key<schema::Field::kTorn>(), torn ? "true" : "false");
  for (const Event& e : d.events) {
    fmt.format(e, out);
    out.push_back('\n');
  }
  const bool ok = write_all(fd, out.data(), out.size());
  ::close(fd);
  return ok;
}

// `run_dir` resolved as ring_file_open resolved the run log's path.
bool in_run_dir(const std::string& run_log, const std::string& run_dir) {
  if (run_dir.empty()) return true;
  return run_log.size() > run_dir.size() && run_log.compare(0, run_dir.size(), run_dir) == 0 &&
         run_log[run_dir.size()] == '/';
}

// One file: skipped while its owner lives (its lock), removed when it holds nothing to recover.
// The lock is held and the owner is gone (its pid has no process): another
// process is recovering it. A reader waits for that (up to 3 s), or it would
// read the run log without the lines being appended.
bool recoverer_finishes(int fd) {
  constexpr std::size_t kHead = offsetof(RingFileHeader, pid) + sizeof(std::int64_t);
  char head[kHead];
  std::int64_t pid = 0;
  if (::pread(fd, head, kHead, 0) != static_cast<ssize_t>(kHead) ||
      std::memcmp(head, kRingFileMagic, sizeof(kRingFileMagic)) != 0) {
    return false;
  }
  std::memcpy(&pid, head + offsetof(RingFileHeader, pid), sizeof(pid));
  if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return false;
  for (int i = 0; i < 300; ++i) {
    ::usleep(10'000);
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
  }
  return false;
}

// `waits`: a reader about to read the run (see recoverer_finishes).
void recover_file(const std::string& path, const std::string& run_dir, bool waits, std::vector<RecoveredRings>& out) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0 && !(waits && recoverer_finishes(fd))) return;  // its owner is alive
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_nlink == 0) return;  // recovered by another process since we opened it
  if (static_cast<std::size_t>(st.st_size) < kRingHeaderBytes) {
    if (std::time(nullptr) - st.st_mtime > 60) ::unlink(path.c_str());  // a process killed while making it
    return;
  }
  void* m = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return;
  struct Unmap {
    void* m;
    std::size_t n;
    ~Unmap() { ::munmap(m, n); }
  } unmap{m, static_cast<std::size_t>(st.st_size)};
  const auto* base = static_cast<const char*>(m);
  const auto& h = *reinterpret_cast<const RingFileHeader*>(base);
  if (std::memcmp(h.magic, kRingFileMagic, sizeof(kRingFileMagic)) != 0 || !(h.layout == ring_layout())) return;
  if (h.recording.load(std::memory_order_acquire) == 0) {  // ended cleanly: every line is in its log
    ::unlink(path.c_str());
    return;
  }
  const std::string run_log(h.run_log, ::strnlen(h.run_log, sizeof(h.run_log)));
  if (!in_run_dir(run_log, run_dir)) return;  // another run's: left for its own readers
  const TableNames names(h.names, std::min<std::uint32_t>(h.names_used.load(std::memory_order_acquire), sizeof(h.names)));
  const AnchorClock clock{h.anchors[h.anchor_index.load(std::memory_order_acquire) & 1]};
  Decoded d;
  const bool write_landed = run_log_piece_landed(h.commit, run_log);
  const std::uint32_t blocks = std::min(h.blocks_made.load(std::memory_order_acquire), kMaxRingBlocks);
  for (std::uint32_t i = 0; i < blocks; ++i) {
    const RingBlockEntry& b = h.blocks[i];
    if (b.in_use.load(std::memory_order_acquire) == 0) continue;
    if (b.bytes <= kRingStateBytes || b.offset + b.bytes > static_cast<std::uint64_t>(st.st_size) ||
        !decode_block(base + b.offset, b.bytes, clock, names, write_landed, d)) {
      return;  // not what this build writes: never taken for empty and removed
    }
  }
  // A run log that is gone (a deleted run directory) has nothing to receive them.
  if ((!d.events.empty() || d.unresolved != 0) && !append_to_run_log(h, run_log, clock, d) && errno != ENOENT) return;
  out.push_back({run_log, h.rank, h.pid, d.events.size()});
  ::unlink(path.c_str());
}

}  // namespace

std::vector<RecoveredRings> recover_orphaned_rings(std::string_view run_dir) noexcept {
  std::vector<RecoveredRings> out;
  try {
    const std::string dir = ring_file_dir();
    if (dir.empty()) return out;
    std::string only;
    if (!run_dir.empty()) {
      char resolved[PATH_MAX];
      if (::realpath(std::string(run_dir).c_str(), resolved) == nullptr) return out;  // no such run: nothing of it
      only = resolved;
    }
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return out;
    std::vector<std::string> files;
    for (dirent* e; (e = ::readdir(d)) != nullptr;) {
      const std::string_view name(e->d_name);
      if (name.size() > 6 && name.substr(name.size() - 6) == kRingFileSuffix) files.push_back(dir + "/" + e->d_name);
    }
    ::closedir(d);
    for (const std::string& f : files) recover_file(f, only, !only.empty(), out);
  } catch (...) {
  }
  return out;
}

}  // namespace rankscope::detail
