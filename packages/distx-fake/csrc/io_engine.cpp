#include "io_engine.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "distkit/error.hpp"
#include "distkit/parallel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define DISTX_X86 1
#endif

namespace distx {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

const Tables& tables() {
  static const Tables tb;
  return tb;
}

uint32_t sw_update(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = tables().t;
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    --n;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return c;
}

#ifdef DISTX_X86
// Three interleaved streams hide the 3-cycle latency of the crc32 instruction.
__attribute__((target("sse4.2"))) uint32_t hw_update(uint32_t c, const uint8_t* p, size_t n) {
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  uint64_t c0 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c0 = _mm_crc32_u64(c0, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c0);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool detect_hw() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}
#endif

bool use_hw() {
#ifdef DISTX_X86
  static const bool hw = detect_hw();
  return hw;
#else
  return false;
#endif
}

constexpr int64_t kIoBlock = int64_t(8) << 20;  // one pwrite/pread call at most 8 MiB

void full_pwrite(int fd, const uint8_t* p, int64_t n, int64_t off) {
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
int64_t pread_at_least(int fd, uint8_t* p, int64_t n, int64_t need, int64_t off) {
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

// I/O runs on its own distkit ThreadPool (default 3 threads, env DISTX_IO_THREADS): a piece
// alternates CPU work (bounce copy, crc32c) and waiting on the disk, so more threads than
// cores keep the device busy; pieces are handed out dynamically.
int io_threads() {
  if (const char* v = std::getenv("DISTX_IO_THREADS")) {
    int n = std::atoi(v);
    if (n > 0) return n;
  }
  return 3;
}

distkit::detail::ThreadPool& io_pool() {
  static auto* p = new distkit::detail::ThreadPool(io_threads());  // leaked like distkit's pool
  return *p;
}

template <class Body>
void io_for(int64_t n, Body&& body) {  // body(piece index)
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int parts = static_cast<int>(std::min<int64_t>(n, io_pool().size()));
  std::function<void(int)> task = [&](int) {
    for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  io_pool().run(parts, task);
}

int64_t round_up(int64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

void check_aligned(const Piece& pc) {
  distkit::check(pc.offset % kDirectAlign == 0, "direct I/O needs file offsets that are multiples of ", kDirectAlign,
                 ", got ", pc.offset);
}

void full_pread(int fd, uint8_t* p, int64_t n, int64_t off) {
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

}  // namespace

uint32_t crc32c_sw(const void* data, size_t n, uint32_t crc) {
  return ~sw_update(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#ifdef DISTX_X86
  if (use_hw()) return ~hw_update(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return crc32c_sw(data, n, crc);
}

bool crc32c_hw_available() { return use_hw(); }

std::vector<uint32_t> write_pieces(int fd, const std::vector<Piece>& pieces, bool direct) {
  std::vector<uint32_t> crcs(pieces.size());
  if (direct) for (const auto& pc : pieces) check_aligned(pc);
  io_for(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    if (direct) {
      thread_local Bounce b;
      {
        const Piece& pc = pieces[i];
        const auto* src = reinterpret_cast<const uint8_t*>(pc.ptr);
        uint32_t crc = 0;
        for (int64_t at = 0; at < pc.nbytes; at += kIoBlock) {
          int64_t n = std::min(kIoBlock, pc.nbytes - at);
          if (reinterpret_cast<uintptr_t>(src + at) % kDirectAlign == 0 && n % kDirectAlign == 0) {
            crc = crc32c(src + at, static_cast<size_t>(n), crc);  // aligned: no bounce copy
            full_pwrite(fd, src + at, n, pc.offset + at);
            continue;
          }
          std::memcpy(b.p, src + at, static_cast<size_t>(n));
          int64_t padded = round_up(n);
          if (padded > n) std::memset(b.p + n, 0, static_cast<size_t>(padded - n));
          crc = crc32c(b.p, static_cast<size_t>(n), crc);
          full_pwrite(fd, b.p, padded, pc.offset + at);
        }
        crcs[i] = crc;
      }
      return;
    }
    {
      const Piece& pc = pieces[i];
      const auto* p = reinterpret_cast<const uint8_t*>(pc.ptr);
      crcs[i] = crc32c(p, static_cast<size_t>(pc.nbytes));
      full_pwrite(fd, p, pc.nbytes, pc.offset);
    }
  });
  return crcs;
}

std::vector<uint32_t> read_pieces(int fd, const std::vector<Piece>& pieces, bool direct) {
  std::vector<uint32_t> crcs(pieces.size());
  if (direct) for (const auto& pc : pieces) check_aligned(pc);
  io_for(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    if (direct) {
      thread_local Bounce b;
      {
        const Piece& pc = pieces[i];
        auto* dst = reinterpret_cast<uint8_t*>(pc.ptr);
        uint32_t crc = 0;
        for (int64_t at = 0; at < pc.nbytes; at += kIoBlock) {
          int64_t n = std::min(kIoBlock, pc.nbytes - at);
          if (reinterpret_cast<uintptr_t>(dst + at) % kDirectAlign == 0 && n % kDirectAlign == 0) {
            pread_at_least(fd, dst + at, n, n, pc.offset + at);  // aligned: no bounce copy
            crc = crc32c(dst + at, static_cast<size_t>(n), crc);
            continue;
          }
          pread_at_least(fd, b.p, round_up(n), n, pc.offset + at);
          crc = crc32c(b.p, static_cast<size_t>(n), crc);
          std::memcpy(dst + at, b.p, static_cast<size_t>(n));
        }
        crcs[i] = crc;
      }
      return;
    }
    {
      const Piece& pc = pieces[i];
      auto* p = reinterpret_cast<uint8_t*>(pc.ptr);
      full_pread(fd, p, pc.nbytes, pc.offset);
      crcs[i] = crc32c(p, static_cast<size_t>(pc.nbytes));
    }
  });
  return crcs;
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
