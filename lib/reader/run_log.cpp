#include "run_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <memory>

#include "absl/strings/str_cat.h"
#include "line_decoder.hpp"

namespace rankscope::reader {
namespace {

// A collective's wait (schema 3), as the nested phase line that schema 2 wrote
// for it: it ended when the collective completed.
void wait_as_phase(const LogEvent& c, const schema::Line<schema::Kind::kCollective>& coll, LogEvent& w) {
  w.k = schema::Kind::kPhase;
  w.rank = c.rank;
  w.step = c.step;
  w.tid = c.tid;
  constexpr std::size_t kPhase = static_cast<std::size_t>(schema::Kind::kPhase) + 1;
  auto* phase = std::get_if<kPhase>(&w.body);
  auto& p = phase != nullptr ? *phase : w.body.emplace<kPhase>();
  p.dur = std::min(coll.wait, coll.dur);
  w.t = c.t + coll.dur - p.dur;
  w.mono = c.mono + coll.dur - p.dur;
  p.depth = coll.phase.empty() ? 0 : 1;
  p.name.assign(coll.wait_phase);
  p.parent.assign(coll.phase);
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
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("'", path, "' is not a regular file (a FIFO, a device or a directory): not read"));
  }
  ReadResult res;
  // Buffer = carried-over partial line + new chunk + the decoder's padding; no
  // bigger than the file (a run directory holds thousands of small logs), and
  // not zeroed (zeroing 8 MB per file cost 6 % of a triage).
  const std::size_t padding = line_padding();
  if (st.st_size >= 0) chunk_bytes = std::min(chunk_bytes, std::max<std::size_t>(static_cast<std::size_t>(st.st_size) + 1, 4096));
  auto buf = std::make_unique_for_overwrite<char[]>(chunk_bytes + padding);
  std::size_t have = 0;
  std::uint64_t line_no = 0;
  LineDecoder decoder;
  LogEvent e, wait;
  for (;;) {
    if (have == chunk_bytes) {  // one line longer than the buffer (or a growing file): grow
      auto bigger = std::make_unique_for_overwrite<char[]>(2 * chunk_bytes + padding);
      std::memcpy(bigger.get(), buf.get(), have);
      buf = std::move(bigger);
      chunk_bytes *= 2;
    }
    const ssize_t n = ::read(fd, buf.get() + have, chunk_bytes - have);
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
      const char* nl = static_cast<const char*>(std::memchr(buf.get() + start, '\n', end - start));
      if (nl == nullptr) break;
      const std::size_t len = static_cast<std::size_t>(nl - (buf.get() + start));
      if (len > 0) {
        ++line_no;
        if (decoder.decode(buf.get() + start, len, e, res)) {
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
    std::memmove(buf.get(), buf.get() + start, end - start);
    have = end - start;
  }
  ::close(fd);
  return res;
}

}  // namespace rankscope::reader
