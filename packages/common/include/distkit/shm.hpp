// distkit/shm.hpp - owner-only POSIX shared-memory segments (RAII).
//
// Segments are created with O_CREAT|O_EXCL and mode 0600 under an unguessable
// name (128 random bits from getrandom), can be unlinked as soon as every
// process has mapped them, and are unmapped when the object dies.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "error.hpp"

namespace distkit {

/// Fill buf with cryptographically random bytes (getrandom, blocking until seeded).
inline void random_bytes(void* buf, size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw OSError("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

/// A random hexadecimal token of `bytes` random bytes (default 16 = 128 bits).
inline std::string random_token(size_t bytes = 16) {
  std::string raw(bytes, '\0');
  random_bytes(&raw[0], bytes);
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (unsigned char c : raw) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept {
    if (this != &o) {
      release();
      name_ = std::move(o.name_);
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
      linked_ = std::exchange(o.linked_, false);
      owner_ = std::exchange(o.owner_, false);
    }
    return *this;
  }
  ~ShmSegment() { release(); }

  /// Create a new owner-only segment of `size` bytes (zero-filled) and map it.
  /// An empty name picks "/distkit-<128 random bits>".
  static ShmSegment create(size_t size, std::string name = "") {
    if (name.empty()) name = "/distkit-" + random_token();
    check(!name.empty() && name[0] == '/' && name.find('/', 1) == std::string::npos,
          "shared-memory name must be '/name' without further slashes, got '", name, "'");
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, S_IRUSR | S_IWUSR);
    check_errno(fd, "shm_open(" + name + ")");
    ShmSegment s;
    s.name_ = name;
    s.linked_ = true;
    s.owner_ = true;
    try {
      // fchmod guards against a restrictive/permissive umask: always exactly 0600.
      check_errno(::fchmod(fd, S_IRUSR | S_IWUSR), "fchmod(" + name + ")");
      if (size > 0) {
        check_errno(::ftruncate(fd, static_cast<off_t>(size)), "ftruncate(" + name + ")");
      }
      s.map(fd, size);
    } catch (...) {
      ::close(fd);
      throw;  // s's destructor unlinks
    }
    ::close(fd);
    return s;
  }

  /// Open and map an existing segment; its size must be at least `size` bytes.
  static ShmSegment open(const std::string& name, size_t size) {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    check_errno(fd, "shm_open(" + name + ")");
    ShmSegment s;
    s.name_ = name;
    s.linked_ = false;  // only the creator unlinks
    try {
      struct stat st;
      check_errno(::fstat(fd, &st), "fstat(" + name + ")");
      check(static_cast<size_t>(st.st_size) >= size, "shared-memory segment ", name, " has ", st.st_size,
            " bytes, expected ", size);
      check<Error>(st.st_uid == ::geteuid(), "shared-memory segment ", name, " is not owned by this user");
      s.map(fd, size);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    return s;
  }

  /// Remove the name (the mapping stays valid). Idempotent.
  void unlink() {
    if (linked_) {
      ::shm_unlink(name_.c_str());
      linked_ = false;
    }
  }

  void* data() const { return addr_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool linked() const { return linked_; }

 private:
  void map(int fd, size_t size) {
    size_ = size;
    if (size == 0) {
      addr_ = nullptr;
      return;
    }
    void* a = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED) throw OSError("mmap(" + name_ + ")", errno);
    addr_ = a;
  }
  void release() noexcept {
    if (addr_) ::munmap(addr_, size_);
    addr_ = nullptr;
    if (linked_ && owner_) ::shm_unlink(name_.c_str());
    linked_ = false;
  }

  std::string name_;
  void* addr_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
  bool owner_ = false;
};

}  // namespace distkit
