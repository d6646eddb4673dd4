// The run directory belongs to the user who runs the job: directories are
// created with RANKSCOPE_DIR_MODE (0750), files with its read/write bits
// (0640), a directory another user owns is refused (it could hold files they
// planted) unless RANKSCOPE_SHARED_DIR=1 says a team shares it on purpose, no
// file is opened through a symbolic link or when someone else owns it, and
// this rank's temporaries left by a killed process are removed at the next
// start. Cold path (init, heartbeats, dumps); thread-safe.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace rankscope::detail {

struct RunDirPolicy {
  mode_t dir_mode = 0750;  // files: dir_mode & 0666
  bool shared = false;     // a directory (or file) owned by another user is used
};

/// Creates `dir` and its missing parents with the policy's mode, checks that
/// it is a directory this process's user owns (or the policy shares) and can
/// write, and makes the policy the one run_file_open() applies.
absl::Status prepare_run_dir(const std::string& dir, const RunDirPolicy& policy);

/// The mode files of the run directory are created with (0640 by default).
mode_t run_file_mode() noexcept;

/// open(2) for a file of the run directory: never through a symbolic link
/// (O_NOFOLLOW: ELOOP), and an existing file must be a regular file with no
/// other name (no hard link) that this user owns unless the directory is
/// shared (else -1 with errno EPERM); O_TRUNC applies after those checks.
/// `mode` 0 means run_file_mode(). Returns the fd or -1 with errno set.
int run_file_open(const std::string& path, int flags, mode_t mode = 0) noexcept;

/// renameat2(2) and unlink(2) for files of the run directory. Files of the run directory
/// (prepare_run_dir's, one level down) are opened, renamed and removed relative to the
/// directory's descriptor held since it was checked; other paths as given. -1 with errno.
int run_file_rename(const std::string& from, const std::string& to, unsigned flags = 0) noexcept;
int run_file_unlink(const std::string& path) noexcept;

/// Removes `rank-<rank>.*.tmp.<pid>` (and rank 0's `run.json.tmp.<pid>`) left
/// in `dir` by earlier processes of this rank (killed before they could
/// clean up); this process's own are kept. Returns how many were removed.
int remove_stale_temporaries(const std::string& dir, int rank) noexcept;

}  // namespace rankscope::detail
