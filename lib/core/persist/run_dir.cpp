#include "run_dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rankscope::detail {
namespace {

std::atomic<mode_t> g_file_mode{0640};
std::atomic<bool> g_shared{false};

std::string user_name(uid_t uid) {
  if (const passwd* p = ::getpwuid(uid); p != nullptr && p->pw_name != nullptr) return p->pw_name;
  return "?";
}

constexpr const char* kFix = " (set RANKSCOPE_DIR or Config::run_dir to a writable directory)";

// The run directory as it was checked, held open: its files are opened, renamed and removed
// relative to this descriptor, so a component of the path renamed or replaced by a symbolic link
// after the check cannot send a write anywhere else. Cold path: a mutex.
struct HeldDir {
  std::mutex mu;
  std::string path;  // Requires mu held. Without a trailing '/'.
  int fd = -1;       // Requires mu held.
};
HeldDir& held() {
  static auto* h = new HeldDir;  // leaked: used by the background thread until the process ends
  return *h;
}

// The directory descriptor and the name within it for `path`: the held run directory's when
// `path` is one of its files, else the current directory's (AT_FDCWD) and the whole path.
// Requires held().mu held.
std::pair<int, const char*> at_of(const HeldDir& h, const std::string& path) {
  const std::size_t n = h.path.size();
  if (h.fd >= 0 && path.size() > n + 1 && path.compare(0, n, h.path) == 0 && path[n] == '/' &&
      path.find('/', n + 1) == std::string::npos) {
    return {h.fd, path.c_str() + n + 1};
  }
  return {AT_FDCWD, path.c_str()};
}

// The held directory was removed (a run directory deleted under a running rank, then made
// again): the directory now at its path is held instead, if it passes the same checks.
// True if it changed. Requires h.mu held.
bool reopen_if_removed(HeldDir& h) {
  struct stat st {};
  if (h.fd < 0 || ::fstat(h.fd, &st) != 0 || st.st_nlink != 0) return false;
  const int fd = ::open(h.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  if (::fstat(fd, &st) != 0 || (st.st_uid != ::geteuid() && !g_shared.load(std::memory_order_relaxed))) {
    ::close(fd);
    return false;
  }
  ::close(h.fd);
  h.fd = fd;
  return true;
}

}  // namespace

absl::Status prepare_run_dir(const std::string& dir, const RunDirPolicy& policy) {
  // Each missing component with the policy's mode (std::filesystem's create_directories takes none).
  std::filesystem::path built;
  for (const auto& part : std::filesystem::path(dir)) {
    built /= part;
    if (part == "/" || part.empty()) continue;
    if (::mkdir(built.c_str(), policy.dir_mode) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("run directory '", dir, "' cannot be created: ", built.string(), ": ", std::strerror(errno), kFix));
    }
  }
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    return absl::PermissionDeniedError(absl::StrCat("run directory '", dir, "' is not a directory", kFix));
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  if (st.st_uid != ::geteuid() && !policy.shared) {
    return absl::PermissionDeniedError(absl::StrCat(
        "run directory '", dir, "' belongs to ", user_name(st.st_uid), " (uid ", st.st_uid, "), not to this process's user ",
        user_name(::geteuid()), " (uid ", ::geteuid(), "): files planted there by its owner would be written to. "
        "Use a directory of your own (RANKSCOPE_DIR, Config::run_dir), or set RANKSCOPE_SHARED_DIR=1 if it is shared on purpose"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("run directory '", dir, "' is not writable: ", std::strerror(errno), kFix));
  }
  g_file_mode.store(policy.dir_mode & 0666, std::memory_order_relaxed);
  g_shared.store(policy.shared, std::memory_order_relaxed);
  HeldDir& h = held();
  std::lock_guard<std::mutex> lk(h.mu);
  if (h.fd >= 0) ::close(h.fd);
  h.fd = closer.fd;
  closer.fd = -1;
  h.path = dir;
  while (h.path.size() > 1 && h.path.back() == '/') h.path.pop_back();
  return absl::OkStatus();
}

int run_file_rename(const std::string& from, const std::string& to, unsigned flags) noexcept {
  HeldDir& h = held();
  std::lock_guard<std::mutex> lk(h.mu);
  const auto [from_dir, from_name] = at_of(h, from);
  const auto [to_dir, to_name] = at_of(h, to);
  return ::renameat2(from_dir, from_name, to_dir, to_name, flags);
}

int run_file_unlink(const std::string& path) noexcept {
  HeldDir& h = held();
  std::lock_guard<std::mutex> lk(h.mu);
  const auto [dir, name] = at_of(h, path);
  return ::unlinkat(dir, name, 0);
}

mode_t run_file_mode() noexcept { return g_file_mode.load(std::memory_order_relaxed); }

int run_file_open(const std::string& path, int flags, mode_t mode) noexcept {
  // Checked before anything is changed: O_TRUNC waits for the checks (a planted hard link to one
  // of the user's files would be emptied by the open itself), and O_NONBLOCK keeps a planted FIFO
  // from blocking the open until someone reads it.
  const bool truncate = (flags & O_TRUNC) != 0;
  int fd = -1;
  {
    HeldDir& h = held();
    std::lock_guard<std::mutex> lk(h.mu);
    for (int attempt = 0; attempt < 2; ++attempt) {  // the second after the directory was made again
      const auto [dir, name] = at_of(h, path);
      fd = ::openat(dir, name, (flags & ~O_TRUNC) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode != 0 ? mode : run_file_mode());
      if (fd >= 0 || errno != ENOENT || dir == AT_FDCWD || !reopen_if_removed(h)) break;
    }
  }
  if (fd < 0) {
    if (errno == ENXIO) errno = EPERM;  // a FIFO nobody reads (opened for writing): not a regular file
    return -1;
  }
  struct stat st {};
  const bool seen = ::fstat(fd, &st) == 0;
  // A FIFO, a device, another user's file, or a second name of a file (a hard link planted to
  // one of the user's own files elsewhere): never written through.
  if (!seen || !S_ISREG(st.st_mode) || st.st_nlink > 1 ||
      (st.st_uid != ::geteuid() && !g_shared.load(std::memory_order_relaxed))) {
    const int err = seen ? EPERM : errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if ((fl >= 0 && ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) || (truncate && ::ftruncate(fd, 0) != 0)) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

int remove_stale_temporaries(const std::string& dir, int rank) noexcept {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  const std::string mine = absl::StrCat("rank-", rank, ".");
  const int self = static_cast<int>(::getpid());
  int removed = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const auto at = name.rfind(".tmp.");
    int pid = 0;
    if (at == std::string::npos || !absl::SimpleAtoi(name.substr(at + 5), &pid) || pid == self) continue;
    if (name.rfind(mine, 0) != 0 && !(rank == 0 && name.rfind("run.json.tmp.", 0) == 0)) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace rankscope::detail
