#include "position.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "diagnostics.hpp"
#include "run_dir.hpp"

namespace rankscope::detail {

std::atomic<PositionPage*> g_position{nullptr};

void position_open(const std::string& path, int pid) noexcept {
  position_close();
  // Never through a symbolic link or into another user's file: it is truncated and mapped.
  const int fd = run_file_open(path, O_RDWR | O_CREAT);
  if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
    diagnose(Topic::kRings, "{}: {}; a killed rank's last step will come from its run log only", path,
                 errno == ELOOP ? "a symbolic link, not followed"
                               : errno == EPERM ? "not a regular file of this user's with one name, not used"
                                                : std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (m == MAP_FAILED) return;
  auto* p = new (m) PositionPage{};  // zeroed page: atomics value-initialised
  p->pid = pid;
  p->step_begun.store(-1, std::memory_order_relaxed);
  p->step_ended.store(-1, std::memory_order_relaxed);
  std::memcpy(p->magic, kPositionMagic, sizeof(kPositionMagic));
  g_position.store(p, std::memory_order_release);
}

void position_anchor(std::uint64_t ticks, std::uint64_t wall_ns, double ns_per_tick) noexcept {
  if (PositionPage* p = g_position.load(std::memory_order_relaxed)) {
    p->ns_per_tick.store(ns_per_tick, std::memory_order_relaxed);
    p->anchor_wall_ns.store(wall_ns, std::memory_order_relaxed);
    p->anchor_ticks.store(ticks, std::memory_order_relaxed);
  }
}

void position_close() noexcept { g_position.store(nullptr, std::memory_order_release); }

}  // namespace rankscope::detail
