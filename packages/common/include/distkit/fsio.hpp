// distkit/fsio.hpp - the two filesystem primitives an atomic directory commit needs.
//
// Python's os module has neither a directory fsync by path that reports errno
// cleanly nor renameat2(RENAME_EXCHANGE); every package that commits a folder
// (distx-fake checkpoints, kvps server state) goes through these.
#pragma once

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "distkit/error.hpp"

namespace distkit {

/// fsync a file or a directory by path (a directory's fsync makes its entries durable).
inline void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_errno(fd, "open " + path + " for fsync");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw OSError("fsync " + path, err);
}

/// Atomically swap two existing paths with renameat2(RENAME_EXCHANGE).
/// Returns false when the kernel or the filesystem cannot (the caller falls back
/// to two renames); throws OSError for any other failure.
inline bool exchange_paths(const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 2;  // RENAME_EXCHANGE from <linux/fs.h>
  long rc = ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange);
  if (rc == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw OSError("renameat2(" + a + ", " + b + ", RENAME_EXCHANGE)", errno);
#else
  (void)a;
  (void)b;
  return false;
#endif
}

}  // namespace distkit
