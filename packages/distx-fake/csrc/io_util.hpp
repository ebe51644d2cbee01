// io_util.hpp - what the checkpoint I/O of distx-fake shares (internal): block sizes, full
// positional reads and writes, aligned bounce buffers, the I/O thread pool, fused copy + crc32c.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "crc32c.hpp"
#include "distkit/error.hpp"
#include "distkit/parallel.hpp"
#include "io_engine.hpp"

namespace distx::detail {

// One pwrite moves at most kIoBlock (default 8 MiB, env DISTX_IO_BLOCK_MIB), one direct pread
// kReadBlock (default 4 MiB, env DISTX_IO_READ_BLOCK_MIB): on this project's (virtio) disk,
// more and smaller reads in flight measured faster, while writes preferred 8 MiB.
inline int64_t env_mib(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  const int64_t mib = v ? std::atoll(v) : 0;
  return (mib > 0 && mib <= 256 ? mib : dflt) << 20;
}
inline const int64_t kReadBlock = env_mib("DISTX_IO_READ_BLOCK_MIB", 4);
// Blocks copied from a source read through the page cache: small enough to stay in the CPU's
// cache between the read, the checksum and the write.
constexpr int64_t kCachedBlock = int64_t(512) << 10;
inline const int64_t kIoBlock = std::max(env_mib("DISTX_IO_BLOCK_MIB", 8), kReadBlock);  // also the bounce size

inline void full_pwrite(int fd, const uint8_t* p, int64_t n, int64_t off) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, static_cast<size_t>(std::min(n, kIoBlock)), off);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw distkit::OSError(distkit::str("pwrite of ", n, " bytes at offset ", off, " failed"), errno);
    }
    p += w;
    n -= w;
    off += w;
  }
}

// Reads at least `need` bytes (up to n); a short read past `need` is the end of the file.
inline int64_t pread_at_least(int fd, uint8_t* p, int64_t n, int64_t need, int64_t off) {
  int64_t got = 0;
  while (got < need) {
    ssize_t r = ::pread(fd, p + got, static_cast<size_t>(n - got), off + got);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw distkit::OSError(distkit::str("pread of ", n - got, " bytes at offset ", off + got, " failed"), errno);
    }
    if (r == 0)
      throw distkit::ValueError(
          distkit::str("checkpoint file truncated: expected ", need - got, " more bytes at offset ", off + got));
    got += r;
  }
  return got;
}

struct Bounce {
  uint8_t* p = nullptr;
  Bounce() {
    if (posix_memalign(reinterpret_cast<void**>(&p), static_cast<size_t>(kDirectAlign), static_cast<size_t>(kIoBlock)) != 0)
      throw distkit::Error("cannot allocate an aligned I/O buffer");
  }
  ~Bounce() { std::free(p); }
  Bounce(const Bounce&) = delete;
  Bounce& operator=(const Bounce&) = delete;
};

// I/O runs on its own distkit ThreadPool (default 4 threads, env DISTX_IO_THREADS): a piece
// alternates CPU work (bounce copy, crc32c) and waiting on the disk, so more threads than
// cores keep the device busy; pieces are handed out dynamically.
// Writers in flight (default 3, env DISTX_IO_WRITERS; at most the pool size): writes measured
// best with 3 x 8 MiB in flight here, reads with 4 x 4 MiB.
inline int io_writers() {
  static const int w = [] {
    const char* v = std::getenv("DISTX_IO_WRITERS");
    const int n = v ? std::atoi(v) : 0;
    return n > 0 ? n : 3;
  }();
  return w;
}

inline int io_threads() {
  if (const char* v = std::getenv("DISTX_IO_THREADS")) {
    int n = std::atoi(v);
    if (n > 0) return n;
  }
  return 4;
}

inline distkit::detail::ThreadPool& io_pool() {
  static auto* p = new distkit::detail::ThreadPool(io_threads());  // leaked like distkit's pool
  return *p;
}

template <class Body>
void io_for(int64_t n, int max_parts, Body&& body) {  // body(piece index)
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int parts = static_cast<int>(std::min<int64_t>({n, int64_t(io_pool().size()), int64_t(max_parts)}));
  std::function<void(int)> task = [&](int) {
    for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  io_pool().run(parts, task);
}

inline int64_t round_up(int64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

inline void full_pread(int fd, uint8_t* p, int64_t n, int64_t off) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, static_cast<size_t>(std::min(n, kIoBlock)), off);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw distkit::OSError(distkit::str("pread of ", n, " bytes at offset ", off, " failed"), errno);
    }
    if (r == 0)
      throw distkit::ValueError(distkit::str("checkpoint file truncated: expected ", n, " more bytes at offset ", off));
    p += r;
    n -= r;
    off += r;
  }
}

constexpr int64_t kA = kDirectAlign;
constexpr int64_t kFuse = int64_t(256) << 10;  // copy + crc in L2-sized steps (one pass over DRAM)

inline int64_t floor_a(int64_t v) { return v / kA * kA; }

// memcpy(dst, src, n) and crc32c of the bytes, each sub-block checksummed while still in cache.
inline uint32_t copy_crc(uint8_t* dst, const uint8_t* src, int64_t n, uint32_t crc, bool crc_of_dst) {
  for (int64_t at = 0; at < n; at += kFuse) {
    const int64_t m = std::min(kFuse, n - at);
    std::memcpy(dst + at, src + at, static_cast<size_t>(m));
    crc = crc32c(crc_of_dst ? dst + at : src + at, static_cast<size_t>(m), crc);
  }
  return crc;
}

}  // namespace distx::detail
