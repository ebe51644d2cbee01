// io_files.cpp - file-level operations of the checkpoint I/O: page-cache residency (mincore),
// fsync of descriptors and paths, atomic exchange of two paths (renameat2).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "distkit/error.hpp"
#include "io_engine.hpp"

namespace distx {

double cached_fraction(int fd) {
  struct stat st;
  distkit::check_errno(::fstat(fd, &st), distkit::str("fstat of fd ", fd));
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) return 0.0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  // map and query at most 1 GiB at a time: the residency vector stays small (256 KiB)
  const size_t window = size_t(1) << 30;
  const size_t size = static_cast<size_t>(st.st_size);
  std::vector<unsigned char> vec(window / page);
  size_t resident = 0;
  for (size_t at = 0; at < size; at += window) {
    const size_t len = std::min(window, size - at);
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (p == MAP_FAILED) return 0.0;
    const size_t pages = (len + page - 1) / page;
    const int rc = ::mincore(p, len, vec.data());
    ::munmap(p, len);
    if (rc != 0) return 0.0;
    for (size_t i = 0; i < pages; ++i) resident += vec[i] & 1;
  }
  return static_cast<double>(resident) / static_cast<double>((size + page - 1) / page);
}

void fsync_fd(int fd) { distkit::check_errno(::fsync(fd), distkit::str("fsync of fd ", fd)); }

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  distkit::check_errno(fd, "open " + path + " for fsync");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw distkit::OSError("fsync " + path, err);
}

bool exchange_paths(const std::string& a, const std::string& b) {
#if defined(SYS_renameat2)
  constexpr unsigned kExchange = 2;  // RENAME_EXCHANGE
  long rc = ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kExchange);
  if (rc == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  throw distkit::OSError("renameat2(" + a + ", " + b + ", RENAME_EXCHANGE)", errno);
#else
  return false;
#endif
}

}  // namespace distx
