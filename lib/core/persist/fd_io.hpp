// Whole-buffer writes to a file descriptor (short writes and EINTR retried).
#pragma once

#include <errno.h>
#include <unistd.h>

#include <cstddef>

namespace rankscope::detail {

// Writes all `n` bytes; false on an error (the caller counts it).
inline bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

}  // namespace rankscope::detail
