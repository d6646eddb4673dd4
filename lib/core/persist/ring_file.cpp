// The ring file: making it, handing out ring blocks from it, the names table
// and the clock anchor (ring_file.hpp). Recovery is in ring_recovery.cpp.
#include "ring_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <climits>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <random>

#include "absl/container/flat_hash_set.h"
#include "diagnostics.hpp"
#include "flight.hpp"
#include "rankscope/collective.hpp"
#include "rankscope/log.hpp"
#include "rankscope/site.hpp"
#include "ring_file_layout.hpp"
#include "settings_table.hpp"

namespace rankscope::detail {

std::string ring_file_dir() {
  const char* env = env_raw(Env::kShmDir);
  const std::string base = env == nullptr ? "/dev/shm" : env;
  if (base.empty() || base == "off") return {};
  return base + "/rankscope-" + std::to_string(::getuid());
}

namespace {

constexpr std::size_t kKeptBlocks = 2;  // blocks given back that keep their pages

struct FileState {
  std::mutex mu;
  int fd = -1;
  int dir_fd = -1;  // the directory, to add up this user's ring files (room_for)
  RingFileHeader* hdr = nullptr;  // Requires mu held (after open).
  std::string path;
  std::uint64_t file_bytes = 0;
  void* maps[kMaxRingBlocks] = {};
  // Blocks given back whose pages were kept for the next thread (a loader or
  // pin-memory thread every epoch): freeing 4 MiB of tmpfs pages and
  // allocating them again cost ~0.4 ms of the background thread per thread.
  bool kept[kMaxRingBlocks] = {};
  bool said = false;  // the one message about falling back
  bool tried = false;
  absl::flat_hash_set<std::uint64_t> noted;  // (kind, key) of names in the table
};
FileState& fs() {
  static auto* s = new FileState;  // leaked: rings live until the process ends
  return *s;
}

void say_once(FileState& s, const char* what, int err) {
  if (s.said) return;
  s.said = true;
  diagnose(Topic::kRings,
           "{}: {} ({}): rings stay in private memory, so a SIGKILLed rank's last records "
           "(up to one drain interval) will not be recovered; set RANKSCOPE_SHM_DIR to a tmpfs with room, or "
           "to 'off' to silence this",
           s.path.empty() ? ring_file_dir().c_str() : s.path.c_str(), what, std::strerror(err));
}

// Rings never take the tmpfs the trainer also needs: a reservation that would bring the ring files
// of this user's ranks (every file in the directory, stale ones included) past a quarter of the
// file system is refused, and those rings stay in private memory (said once). Docker's default
// /dev/shm is 64 MiB, and 8 ranks x 3 recording threads reserved 62 MiB of it: the DataLoader's
// workers then failed to allocate their shared memory (8 ranks with 2 workers each passing 1 MiB
// batches need ~40 MiB). With /dev/shm at half the RAM, as hosts have it, the bar is never near.
// A directory scan of a few files, once per new ring: never on the recording path after that.
// Allocates nothing a failure could throw (ring_file_alloc is noexcept): the directory is read
// through a duplicate of its descriptor.
bool room_for(int fd, int dir_fd, std::uint64_t bytes) {
  struct statvfs v {};
  if (::fstatvfs(fd, &v) != 0) return true;  // unknown: fallocate still says when it is full
  const std::uint64_t total = static_cast<std::uint64_t>(v.f_blocks) * v.f_frsize;
  std::uint64_t ours = 0;
  const int dup_fd = dir_fd < 0 ? -1 : ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  DIR* d = dup_fd < 0 ? nullptr : ::fdopendir(dup_fd);
  if (d == nullptr && dup_fd >= 0) ::close(dup_fd);
  if (d != nullptr) {
    ::rewinddir(d);  // the duplicate shares the original's offset
    while (const dirent* e = ::readdir(d)) {
      struct stat st {};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        ours += static_cast<std::uint64_t>(st.st_blocks) * 512;
      }
    }
    ::closedir(d);
  }
  // And on a tmpfs, the reservation leaves a quarter of it free: what the trainer already holds
  // there (its DataLoader's batches) is not ours to squeeze. (A directory on a disk, as a test's
  // may be, has no such bar: its free space is no one's shared memory.)
  struct statfs f {};
  const bool tmpfs = ::fstatfs(fd, &f) == 0 && f.f_type == TMPFS_MAGIC;
  const std::uint64_t avail = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  if (ours + bytes <= total / 4 && (!tmpfs || (avail >= bytes && avail - bytes >= total / 4))) return true;
  errno = ENOSPC;
  return false;
}

// A directory of this user's: made 0700 if missing, refused if it is a link or another user's.
bool own_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return false;
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) {
    errno = EPERM;
    return false;
  }
  return true;
}

void create_locked(FileState& s) {
  s.tried = true;
  const std::string dir = ring_file_dir();
  if (dir.empty()) return;
  if (!own_dir(dir)) return say_once(s, "cannot use the directory", errno);
  if (s.dir_fd < 0) s.dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);  // kept for the process's life
  std::random_device rd;
  s.path = dir + "/" + std::to_string(::getpid()) + "-" + std::to_string(rd()) + kRingFileSuffix;
  const int fd = ::open(s.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return say_once(s, "cannot create", errno);
  const auto fail = [&](const char* what) {
    const int err = errno;
    ::unlink(s.path.c_str());
    ::close(fd);
    say_once(s, what, err);
  };
  // Held for the process's life: a recoverer that gets it knows the owner is gone.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return fail("cannot lock");
  if (!room_for(fd, s.dir_fd, kRingHeaderBytes)) return fail("no room: rankscope takes at most a quarter of the tmpfs and leaves a quarter of it free");
  // Reserved, not just sized: a full tmpfs fails here, not as a SIGBUS on a later write.
  if (::ftruncate(fd, static_cast<off_t>(kRingHeaderBytes)) != 0 ||
      ::fallocate(fd, 0, 0, static_cast<off_t>(kRingHeaderBytes)) != 0) {
    return fail("no room for the ring file");
  }
  void* m = ::mmap(nullptr, kRingHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return fail("cannot map");
  auto* h = new (m) RingFileHeader{};
  std::memcpy(h->magic, kRingFileMagic, sizeof(kRingFileMagic));
  h->layout = ring_layout();
  h->pid = ::getpid();
  s.fd = fd;
  s.file_bytes = kRingHeaderBytes;
  s.hdr = h;
}

void note_locked(FileState& s, std::uint8_t type, std::uint8_t kind, std::uint64_t key, std::uint32_t a, std::int32_t b,
                 std::int32_t c, std::string_view s1, std::string_view s2) {
  if (s.hdr == nullptr || !s.noted.insert(std::uint64_t{type} << 60 ^ key).second) return;
  s1 = s1.substr(0, 4096);
  s2 = s2.substr(0, 4096);
  const std::size_t bytes = (sizeof(RingName) + s1.size() + s2.size() + 7) / 8 * 8;
  const std::uint32_t used = s.hdr->names_used.load(std::memory_order_relaxed);
  if (used + bytes > sizeof(s.hdr->names)) return;  // full: later names are not recoverable
  char* at = s.hdr->names + used;
  RingName n{static_cast<std::uint32_t>(bytes), type, kind, static_cast<std::uint16_t>(s1.size()), key, a, b, c,
             static_cast<std::uint16_t>(s2.size()), 0};
  std::memcpy(at, &n, sizeof(n));
  if (!s1.empty()) std::memcpy(at + sizeof(n), s1.data(), s1.size());
  if (!s2.empty()) std::memcpy(at + sizeof(n) + s1.size(), s2.data(), s2.size());
  s.hdr->names_used.store(used + static_cast<std::uint32_t>(bytes), std::memory_order_release);
}

}  // namespace

std::string ring_file_path() {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.hdr != nullptr ? s.path : std::string();
}

void ring_file_open(const std::string& run_log_path, int rank) noexcept {
  FileState& s = fs();
  // Absolute and resolved: a recoverer runs from another directory, and a
  // reader matches it against its own spelling of the run directory.
  char resolved[PATH_MAX];
  const std::string run_log = ::realpath(run_log_path.c_str(), resolved) != nullptr ? resolved : run_log_path;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.hdr == nullptr && !s.tried) create_locked(s);
    if (s.hdr == nullptr) return;
    s.hdr->recording.store(0, std::memory_order_release);
    if (run_log.size() >= sizeof(s.hdr->run_log)) return;  // not recoverable: no room for the path
    std::memset(s.hdr->run_log, 0, sizeof(s.hdr->run_log));
    std::memcpy(s.hdr->run_log, run_log.data(), run_log.size());
    s.hdr->rank = rank;
    s.hdr->commit.state.store(kCommitIdle, std::memory_order_relaxed);  // a new run log: no write under way
    s.hdr->recording.store(1, std::memory_order_release);
  }
  // What exists already (made before this session): noted now, newer ones as they are made.
  try {
    for (const Communicator* c : all_communicators()) ring_file_note_communicator(*c);
    note_loggers_in_ring_file();
  } catch (...) {
  }
}

void ring_file_session_end() noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr != nullptr) s.hdr->recording.store(0, std::memory_order_release);
}

void ring_file_remove() noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  // Records not yet in the run log (a shutdown that timed out): the file
  // stays, and is recovered once this process is gone.
  if (s.hdr == nullptr || s.hdr->recording.load(std::memory_order_acquire) != 0) return;
  ::unlink(s.path.c_str());  // the mappings stay valid until the process is gone
}

void ring_file_lock_for_fork() noexcept { fs().mu.lock(); }
void ring_file_unlock_after_fork() noexcept { fs().mu.unlock(); }

void ring_file_after_fork_child() noexcept {
  FileState& s = fs();
  if (s.hdr == nullptr) return;
  // Private copies: the state pages keep their contents (this thread's
  // ThreadState and metric slots are read), the records become fresh zero pages.
  alignas(64) static char page[kRingStateBytes];
  const std::uint32_t n = std::min(s.hdr->blocks_made.load(std::memory_order_relaxed), kMaxRingBlocks);
  for (std::uint32_t i = 0; i < n; ++i) {
    auto* m = static_cast<char*>(s.maps[i]);
    if (m == nullptr) continue;
    const std::size_t bytes = s.hdr->blocks[i].bytes, kept = std::min(bytes, kRingStateBytes);
    std::memcpy(page, m, kept);
    (void)::mmap(m, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    std::memcpy(m, page, kept);
  }
  ::munmap(s.hdr, kRingHeaderBytes);
  s.hdr = nullptr;
  if (s.fd >= 0) ::close(s.fd);  // the parent's lock stays with the parent's descriptor
  s.fd = -1;
  s.tried = true;  // a child makes no file of its own
}

void ring_file_anchor(std::uint64_t ticks, std::uint64_t mono_ns, std::uint64_t wall_ns, double ns_per_tick) noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr == nullptr) return;
  // Two slots: the one not being read is written, then the index flips, so a
  // process killed mid-update leaves the previous anchor whole.
  const std::uint64_t next = s.hdr->anchor_index.load(std::memory_order_relaxed) + 1;
  s.hdr->anchors[next & 1] = {ticks, mono_ns, wall_ns, ns_per_tick};
  s.hdr->anchor_index.store(next, std::memory_order_release);
}

void ring_file_commit_prepare() noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr != nullptr) s.hdr->commit.state.store(kCommitPreparing, std::memory_order_release);
}

void ring_file_commit_ready(std::int64_t file_from, const char* piece, std::size_t n) noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr == nullptr || n == 0) return;
  RingCommit& c = s.hdr->commit;
  describe_piece(c, file_from, piece, n);
  c.state.store(kCommitReady, std::memory_order_release);
}

void ring_file_commit_done() noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr != nullptr) s.hdr->commit.state.store(kCommitIdle, std::memory_order_release);
}

void* ring_file_alloc(std::size_t bytes) noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.hdr == nullptr) return nullptr;
  RingFileHeader& h = *s.hdr;
  const std::uint32_t made = h.blocks_made.load(std::memory_order_relaxed);
  std::uint32_t given_back = kMaxRingBlocks;  // a block given back, of the same size; one with its pages first
  for (std::uint32_t i = 0; i < made; ++i) {
    const RingBlockEntry& b = h.blocks[i];
    if (b.in_use.load(std::memory_order_relaxed) != 0 || b.bytes != bytes || s.maps[i] == nullptr) continue;
    given_back = i;
    if (s.kept[i]) break;
  }
  if (given_back < made) {
    RingBlockEntry& b = h.blocks[given_back];
    if (!s.kept[given_back] && !room_for(s.fd, s.dir_fd, bytes)) {
      say_once(s, "no room for a ring: rankscope takes at most a quarter of the tmpfs and leaves a quarter of it free", errno);
      return nullptr;
    }
    if (!s.kept[given_back] &&
        ::fallocate(s.fd, 0, static_cast<off_t>(b.offset), static_cast<off_t>(bytes)) != 0) {
      say_once(s, "no room for a ring", errno);
      return nullptr;
    }
    s.kept[given_back] = false;
    b.in_use.store(1, std::memory_order_release);
    return s.maps[given_back];
  }
  if (made >= kMaxRingBlocks) return nullptr;
  if (!room_for(s.fd, s.dir_fd, bytes)) {
    say_once(s, "no room for a ring: rankscope takes at most a quarter of the tmpfs and leaves a quarter of it free", errno);
    return nullptr;
  }
  const std::uint64_t off = s.file_bytes;
  if (::ftruncate(s.fd, static_cast<off_t>(off + bytes)) != 0 ||
      ::fallocate(s.fd, 0, static_cast<off_t>(off), static_cast<off_t>(bytes)) != 0) {
    say_once(s, "no room for a ring", errno);
    (void)::ftruncate(s.fd, static_cast<off_t>(off));
    return nullptr;
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, static_cast<off_t>(off));
  if (m == MAP_FAILED) {
    say_once(s, "cannot map a ring", errno);
    (void)::ftruncate(s.fd, static_cast<off_t>(off));
    return nullptr;
  }
  s.file_bytes = off + bytes;
  s.maps[made] = m;
  h.blocks[made].offset = off;
  h.blocks[made].bytes = bytes;
  h.blocks[made].in_use.store(1, std::memory_order_relaxed);
  h.blocks_made.store(made + 1, std::memory_order_release);
  return m;
}

bool ring_file_release(void* block) noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  for (std::uint32_t i = 0; i < kMaxRingBlocks; ++i) {
    if (s.maps[i] != block || block == nullptr) continue;
    if (s.hdr != nullptr) {
      RingBlockEntry& b = s.hdr->blocks[i];
      // Handed out again, it reads as a block whose ThreadState is not made
      // yet until it is: a rank killed in between recovers nothing stale.
      std::memset(block, 0, kThreadStateBytes);
      b.in_use.store(0, std::memory_order_release);
      const auto kept = static_cast<std::size_t>(std::count(std::begin(s.kept), std::end(s.kept), true));
      if (kept < kKeptBlocks) {
        s.kept[i] = true;
      } else {  // its pages go back to the system (they read as zeros until reused)
        (void)::fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(b.offset),
                          static_cast<off_t>(b.bytes));
      }
    }
    return true;
  }
  return false;
}

void ring_file_note_site(const Site* site) noexcept {
  if (site == nullptr || site->name == nullptr) return;
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  try {
    note_locked(s, kNameSite, static_cast<std::uint8_t>(site->kind), reinterpret_cast<std::uintptr_t>(site), 0, 0, 0,
                site->name, {});
  } catch (...) {
  }
}

void ring_file_note_source(const SourceLocation* src) noexcept {
  if (src == nullptr) return;
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  try {
    note_locked(s, kNameSource, 0, reinterpret_cast<std::uintptr_t>(src), src->line, 0, 0,
                src->file != nullptr ? src->file : "", src->function != nullptr ? src->function : "");
  } catch (...) {
  }
}

void ring_file_note_communicator(const Communicator& c) noexcept {
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  try {
    note_locked(s, kNameCommunicator, 0, reinterpret_cast<std::uintptr_t>(&c), c.id(), c.size(), c.rank(), c.name(), {});
  } catch (...) {
  }
}

void ring_file_note_logger(std::uint16_t id, const char* name) noexcept {
  if (name == nullptr) return;
  FileState& s = fs();
  std::lock_guard<std::mutex> lk(s.mu);
  try {
    note_locked(s, kNameLogger, 0, id, 0, 0, 0, name, {});
  } catch (...) {
  }
}

}  // namespace rankscope::detail
