#include "io_engine.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
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
// GF(2) arithmetic modulo the reflected polynomial (as in zlib's crc32_combine): a * b mod P,
// with bit 31 = x^0.
uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * nbytes) mod P: multiplying a raw crc state by it appends nbytes zero bytes.
uint32_t x8nmodp(uint64_t nbytes) {
  uint32_t sq = 1u << 30;  // x^1
  for (int i = 0; i < 3; ++i) sq = multmodp(sq, sq);  // x^8
  uint32_t p = 1u << 31;  // x^0
  for (; nbytes; nbytes >>= 1, sq = multmodp(sq, sq))
    if (nbytes & 1) p = multmodp(sq, p);
  return p;
}

__attribute__((target("sse4.2"))) uint64_t hw_u64(uint64_t c, const uint8_t* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  return c;
}

// The crc32 instruction has a 3-cycle latency and a 1-cycle throughput: three independent
// streams over consecutive 8 KiB stripes run ~3x faster than one; their states are merged
// with a multiplication by x^(8 * stripe) mod P.
constexpr size_t kStripe = 8192;

__attribute__((target("sse4.2"))) uint32_t hw_update(uint32_t c, const uint8_t* p, size_t n) {
  while (n && (reinterpret_cast<uintptr_t>(p) & 7)) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  static const uint32_t kShift = x8nmodp(kStripe);
  while (n >= 3 * kStripe) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    const uint8_t* a = p;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, a + i, 8);
      std::memcpy(&w1, a + kStripe + i, 8);
      std::memcpy(&w2, a + 2 * kStripe + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = multmodp(kShift, multmodp(kShift, static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  c = static_cast<uint32_t>(hw_u64(c, p, n));
  p += n & ~size_t(7);
  n &= 7;
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

// One pwrite moves at most kIoBlock (default 8 MiB, env DISTX_IO_BLOCK_MIB), one direct pread
// kReadBlock (default 4 MiB, env DISTX_IO_READ_BLOCK_MIB): on this project's (virtio) disk,
// more and smaller reads in flight measured faster, while writes preferred 8 MiB.
int64_t env_mib(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  const int64_t mib = v ? std::atoll(v) : 0;
  return (mib > 0 && mib <= 256 ? mib : dflt) << 20;
}
const int64_t kReadBlock = env_mib("DISTX_IO_READ_BLOCK_MIB", 4);
// Blocks copied from a source read through the page cache: small enough to stay in the CPU's
// cache between the read, the checksum and the write.
constexpr int64_t kCachedBlock = int64_t(512) << 10;
const int64_t kIoBlock = std::max(env_mib("DISTX_IO_BLOCK_MIB", 8), kReadBlock);  // also the bounce size

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

// I/O runs on its own distkit ThreadPool (default 4 threads, env DISTX_IO_THREADS): a piece
// alternates CPU work (bounce copy, crc32c) and waiting on the disk, so more threads than
// cores keep the device busy; pieces are handed out dynamically.
// Writers in flight (default 3, env DISTX_IO_WRITERS; at most the pool size): writes measured
// best with 3 x 8 MiB in flight here, reads with 4 x 4 MiB.
int io_writers() {
  static const int w = [] {
    const char* v = std::getenv("DISTX_IO_WRITERS");
    const int n = v ? std::atoi(v) : 0;
    return n > 0 ? n : 3;
  }();
  return w;
}

int io_threads() {
  if (const char* v = std::getenv("DISTX_IO_THREADS")) {
    int n = std::atoi(v);
    if (n > 0) return n;
  }
  return 4;
}

distkit::detail::ThreadPool& io_pool() {
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

int64_t round_up(int64_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }


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

namespace {

constexpr int64_t kA = kDirectAlign;
constexpr int64_t kFuse = int64_t(256) << 10;  // copy + crc in L2-sized steps (one pass over DRAM)

int64_t floor_a(int64_t v) { return v / kA * kA; }

// memcpy(dst, src, n) and crc32c of the bytes, each sub-block checksummed while still in cache.
uint32_t copy_crc(uint8_t* dst, const uint8_t* src, int64_t n, uint32_t crc, bool crc_of_dst) {
  for (int64_t at = 0; at < n; at += kFuse) {
    const int64_t m = std::min(kFuse, n - at);
    std::memcpy(dst + at, src + at, static_cast<size_t>(m));
    crc = crc32c(crc_of_dst ? dst + at : src + at, static_cast<size_t>(m), crc);
  }
  return crc;
}

// Direct-I/O pieces are written as whole 4 KiB blocks: the bytes of a piece's first and last
// block that lie outside the piece are zeroed, so two pieces must never share a block.
void check_disjoint_blocks(const std::vector<Piece>& pieces) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (const auto& pc : pieces)
    if (pc.nbytes > 0) blocks.emplace_back(floor_a(pc.offset), round_up(pc.offset + pc.nbytes));
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i)
    distkit::check(blocks[i].first >= blocks[i - 1].second, "direct I/O pieces must not share ", kA,
                   "-byte file blocks: [", blocks[i - 1].first, ", ", blocks[i - 1].second, ") and [",
                   blocks[i].first, ", ", blocks[i].second, ")");
}

// One piece with O_DIRECT. Whole 4 KiB blocks stream straight from `src` when the memory
// address and the file offset have the same remainder modulo 4096 (the checkpoint layout makes
// them match); the partial first/last blocks, and everything when the remainders differ, go
// through the bounce buffer. The crc32c is computed on the way, in order.
uint32_t write_direct(int fd, const uint8_t* src, int64_t n, int64_t off, uint8_t* bounce) {
  uint32_t crc = 0;
  if (n == 0) return crc;  // nothing to write (and no block of another piece to zero)
  int64_t pos = off;
  const int64_t end = off + n;
  auto partial = [&](int64_t block, int64_t from, int64_t to) {  // file bytes [from, to) of block
    std::memset(bounce, 0, static_cast<size_t>(kA));
    crc = copy_crc(bounce + (from - block), src + (from - off), to - from, crc, false);
    full_pwrite(fd, bounce, kA, block);
  };
  if (pos % kA) {
    const int64_t block = floor_a(pos), to = std::min(end, block + kA);
    partial(block, pos, to);
    pos = to;
  }
  while (end - pos >= kA) {
    const int64_t len = std::min(kIoBlock, floor_a(end - pos));
    const uint8_t* p = src + (pos - off);
    if (reinterpret_cast<uintptr_t>(p) % kA == 0) {
      crc = crc32c(p, static_cast<size_t>(len), crc);
      full_pwrite(fd, p, len, pos);
    } else {
      crc = copy_crc(bounce, p, len, crc, false);
      full_pwrite(fd, bounce, len, pos);
    }
    pos += len;
  }
  if (pos < end) partial(pos, pos, end);
  return crc;
}

uint32_t read_direct(int fd, uint8_t* dst, int64_t n, int64_t off, uint8_t* bounce) {
  uint32_t crc = 0;
  if (n == 0) return crc;
  int64_t pos = off;
  const int64_t end = off + n;
  auto partial = [&](int64_t block, int64_t from, int64_t to) {
    pread_at_least(fd, bounce, kA, to - block, block);
    crc = copy_crc(dst + (from - off), bounce + (from - block), to - from, crc, true);
  };
  if (pos % kA) {
    const int64_t block = floor_a(pos), to = std::min(end, block + kA);
    partial(block, pos, to);
    pos = to;
  }
  while (end - pos >= kA) {
    const int64_t len = std::min(kReadBlock, floor_a(end - pos));
    uint8_t* p = dst + (pos - off);
    if (reinterpret_cast<uintptr_t>(p) % kA == 0) {
      pread_at_least(fd, p, len, len, pos);
      crc = crc32c(p, static_cast<size_t>(len), crc);
    } else {
      pread_at_least(fd, bounce, len, len, pos);
      crc = copy_crc(p, bounce, len, crc, true);
    }
    pos += len;
  }
  if (pos < end) partial(pos, pos, end);
  return crc;
}

}  // namespace

std::vector<uint32_t> write_pieces(int fd, const std::vector<Piece>& pieces, bool direct) {
  std::vector<uint32_t> crcs(pieces.size());
  if (direct) check_disjoint_blocks(pieces);
  io_for(static_cast<int64_t>(pieces.size()), io_writers(), [&](int64_t i) {
    const Piece& pc = pieces[i];
    const auto* p = reinterpret_cast<const uint8_t*>(pc.ptr);
    if (direct) {
      thread_local Bounce b;
      crcs[i] = write_direct(fd, p, pc.nbytes, pc.offset, b.p);
      return;
    }
    crcs[i] = crc32c(p, static_cast<size_t>(pc.nbytes));
    full_pwrite(fd, p, pc.nbytes, pc.offset);
  });
  return crcs;
}

std::vector<uint32_t> read_pieces(int fd, const std::vector<Piece>& pieces, bool direct) {
  std::vector<uint32_t> crcs(pieces.size());
  io_for(static_cast<int64_t>(pieces.size()), io_threads(), [&](int64_t i) {
    const Piece& pc = pieces[i];
    auto* p = reinterpret_cast<uint8_t*>(pc.ptr);
    if (direct) {
      thread_local Bounce b;
      crcs[i] = read_direct(fd, p, pc.nbytes, pc.offset, b.p);
      return;
    }
    full_pread(fd, p, pc.nbytes, pc.offset);
    crcs[i] = crc32c(p, static_cast<size_t>(pc.nbytes));
  });
  return crcs;
}

namespace {

// A block of a source piece read into a buffer, on its way to the writer.
struct Block {
  uint8_t* buf;    // the piece's bytes [lo, hi) (source file offsets) start at buf + skip
  int64_t skip;
  int64_t piece, lo, hi;
};

// Aligned read buffers shared by the readers and the writer of one copy_pieces call.
class BufferPool {
 public:
  BufferPool(size_t n, size_t bytes) {
    for (size_t i = 0; i < n; ++i) {
      void* p = nullptr;
      if (posix_memalign(&p, static_cast<size_t>(kDirectAlign), bytes) != 0)
        throw distkit::Error("cannot allocate an aligned I/O buffer");
      owned_.emplace_back(static_cast<uint8_t*>(p), &std::free);
      free_.push_back(owned_.back().get());
    }
  }
  std::vector<uint8_t*> free_;

 private:
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> owned_;
};

}  // namespace

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

std::vector<uint32_t> copy_pieces(const std::vector<int>& src_fds, const std::vector<bool>& src_direct,
                                  const std::vector<int>& dst_fds, const std::vector<SourcePiece>& pieces,
                                  std::vector<Run> runs, bool writeback) {
  distkit::check(src_fds.size() == src_direct.size(), "one direct flag per source fd");
  const int64_t np = static_cast<int64_t>(pieces.size());
  for (const auto& pc : pieces)
    distkit::check(pc.src >= 0 && pc.src < static_cast<int>(src_fds.size()) && pc.offset >= 0 && pc.nbytes >= 0,
                   "invalid source piece (file ", pc.src, ", offset ", pc.offset, ", ", pc.nbytes, " bytes)");
  for (const auto& r : runs)
    distkit::check(r.piece >= 0 && r.piece < np && r.at >= 0 && r.nbytes >= 0 &&
                       r.at + r.nbytes <= pieces[r.piece].nbytes && r.dst >= 0 &&
                       r.dst < static_cast<int>(dst_fds.size()) && r.offset >= 0,
                   "invalid run (piece ", r.piece, ", at ", r.at, ", ", r.nbytes, " bytes, file ", r.dst, ")");
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.piece != b.piece ? a.piece < b.piece : a.at < b.at; });
  std::vector<size_t> first(static_cast<size_t>(np) + 1, runs.size());
  for (size_t i = runs.size(); i-- > 0;) first[static_cast<size_t>(runs[i].piece)] = i;
  for (int64_t i = np; i-- > 0;) first[i] = std::min(first[i], first[i + 1]);
  std::vector<uint32_t> crcs(pieces.size());
  if (np == 0) return crcs;

  // Every run of a piece goes to one destination file (a piece lies inside one tensor).
  std::vector<int> dst_of(static_cast<size_t>(np), -1);
  for (int64_t i = 0; i < np; ++i)
    for (size_t k = first[i]; k < first[i + 1]; ++k) {
      distkit::check(dst_of[i] < 0 || dst_of[i] == runs[k].dst, "the runs of piece ", i,
                     " go to several destination files");
      dst_of[i] = runs[k].dst;
    }

  // Readers (the I/O pool) read blocks and checksum them; writer threads pwrite them, one
  // writer per destination file at a time: buffered writes to one file are serialized by the
  // file's lock anyway (and a reader waiting for it has no read in flight), while writes to
  // different files run in parallel. Reads need several requests in flight to keep the disk
  // busy, so the pieces are read alternating between destination files.
  const int nfiles = static_cast<int>(dst_fds.size());
  const int readers = static_cast<int>(std::min<int64_t>({np, int64_t(io_pool().size()), int64_t(io_threads())}));
  const int writers = std::max(1, std::min({nfiles, int(std::thread::hardware_concurrency()), 4}));
  std::vector<int64_t> order;  // pieces, round-robin over destination files
  {
    std::vector<std::vector<int64_t>> by_file(static_cast<size_t>(nfiles) + 1);
    for (int64_t i = 0; i < np; ++i) by_file[static_cast<size_t>(dst_of[i] < 0 ? nfiles : dst_of[i])].push_back(i);
    for (size_t at = 0; order.size() < static_cast<size_t>(np); ++at)
      for (const auto& f : by_file)
        if (at < f.size()) order.push_back(f[at]);
  }
  std::vector<size_t> cursor(first.begin(), first.end() - 1);  // next run of each piece

  auto write_block = [&](const Block& blk) {
    const int64_t off = pieces[blk.piece].offset;
    int64_t span_lo = INT64_MAX, span_hi = 0;
    // blocks of a piece arrive in order: its runs are consumed front to back
    size_t& r = cursor[static_cast<size_t>(blk.piece)];
    for (size_t k = r; k < first[blk.piece + 1]; ++k) {
      const Run& run = runs[k];
      if (off + run.at >= blk.hi) break;
      const int64_t a = std::max(off + run.at, blk.lo), z = std::min(off + run.at + run.nbytes, blk.hi);
      if (z > a) {
        const int64_t at = run.offset + (a - off - run.at);
        full_pwrite(dst_fds[run.dst], blk.buf + blk.skip + (a - blk.lo), z - a, at);
        span_lo = std::min(span_lo, at);
        span_hi = std::max(span_hi, at + (z - a));
      }
      if (off + run.at + run.nbytes <= blk.hi) r = k + 1;
    }
    // start writing these pages to the disk now (asynchronously): the final fsync then finds
    // little left, and the disk writes while later blocks are read
    if (writeback && span_hi > span_lo)
      ::sync_file_range(dst_fds[dst_of[blk.piece]], span_lo, span_hi - span_lo, SYNC_FILE_RANGE_WRITE);
  };

  // Sources read through the page cache (they are there already, or the filesystem has no
  // O_DIRECT): the thread that reads a block also checksums it and writes it, while it is still
  // in the CPU's cache. Handing blocks to writer threads pays off only when reads wait for the
  // disk; for cached data it costs a trip of every block through memory and a thread switch.
  if (std::none_of(src_direct.begin(), src_direct.end(), [](bool d) { return d; })) {
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::function<void(int)> task = [&](int) {
      thread_local std::vector<uint8_t> buf;
      if (buf.size() < static_cast<size_t>(kCachedBlock)) buf.resize(static_cast<size_t>(kCachedBlock));
      try {
        for (int64_t n; !failed.load() && (n = next.fetch_add(1)) < np;) {
          const int64_t i = order[static_cast<size_t>(n)];
          const SourcePiece& pc = pieces[i];
          uint32_t crc = 0;
          for (int64_t pos = pc.offset, end = pc.offset + pc.nbytes; pos < end;) {
            const int64_t len = std::min(kCachedBlock, end - pos);
            pread_at_least(src_fds[pc.src], buf.data(), len, len, pos);
            crc = crc32c(buf.data(), static_cast<size_t>(len), crc);
            if (dst_of[i] >= 0) write_block({buf.data(), 0, i, pos, pos + len});
            pos += len;
          }
          crcs[i] = crc;
        }
      } catch (...) {
        failed = true;  // the other threads stop at their next piece
        throw;
      }
    };
    // the copies are CPU work: more threads than cores only take turns
    const int parts = std::max(1, std::min(readers, static_cast<int>(std::thread::hardware_concurrency())));
    io_pool().run(parts, task);  // rethrows the first error once every thread stopped
    return crcs;
  }
  BufferPool pool(static_cast<size_t>(2 * (readers + writers)), static_cast<size_t>(kReadBlock));
  std::mutex mu;
  std::condition_variable cv_free;
  std::vector<std::condition_variable> cv_full(static_cast<size_t>(writers));
  std::vector<std::deque<Block>> full(static_cast<size_t>(writers));
  bool readers_done = false, stop = false;
  std::exception_ptr error;
  auto fail = [&](std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (!error) error = e;
      stop = true;
    }
    cv_free.notify_all();
    for (auto& cv : cv_full) cv.notify_all();
  };
  auto release = [&](uint8_t* buf) {
    {
      std::lock_guard<std::mutex> lk(mu);
      pool.free_.push_back(buf);
    }
    cv_free.notify_one();
  };
  std::vector<std::thread> pool_writers;
  for (int w = 0; w < writers; ++w)
    pool_writers.emplace_back([&, w] {
      auto& queue = full[static_cast<size_t>(w)];
      try {
        for (;;) {
          Block blk;
          {
            std::unique_lock<std::mutex> lk(mu);
            cv_full[static_cast<size_t>(w)].wait(lk, [&] { return !queue.empty() || readers_done || stop; });
            if (stop || queue.empty()) return;
            blk = queue.front();
            queue.pop_front();
          }
          write_block(blk);
          release(blk.buf);
        }
      } catch (...) {
        fail(std::current_exception());
      }
    });

  try {
    std::atomic<int64_t> next{0};
    std::function<void(int)> task = [&](int) {
      for (int64_t n; (n = next.fetch_add(1)) < np;) {
        const int64_t i = order[static_cast<size_t>(n)];
        const SourcePiece& pc = pieces[i];
        if (pc.nbytes == 0) continue;  // crc32c of nothing is 0
        const int fd = src_fds[pc.src];
        const bool direct = src_direct[pc.src];
        const int w = dst_of[i] < 0 ? -1 : dst_of[i] % writers;  // -1: nothing to write, only checked
        // with O_DIRECT the block reads start on the aligned block below the piece
        const int64_t off = pc.offset, end = pc.offset + pc.nbytes;
        uint32_t crc = 0;
        for (int64_t pos = direct ? floor_a(off) : off; pos < end;) {
          const int64_t len = direct ? std::min(kReadBlock, round_up(end) - pos) : std::min(kReadBlock, end - pos);
          uint8_t* buf;
          {
            std::unique_lock<std::mutex> lk(mu);
            cv_free.wait(lk, [&] { return !pool.free_.empty() || stop; });
            if (stop) return;
            buf = pool.free_.back();
            pool.free_.pop_back();
          }
          const int64_t lo = std::max(pos, off), hi = std::min(pos + len, end);
          try {
            pread_at_least(fd, buf, len, hi - pos, pos);
            crc = crc32c(buf + (lo - pos), static_cast<size_t>(hi - lo), crc);
          } catch (...) {
            release(buf);
            throw;
          }
          if (w < 0) {
            release(buf);
          } else {
            {
              std::lock_guard<std::mutex> lk(mu);
              full[static_cast<size_t>(w)].push_back({buf, lo - pos, i, lo, hi});
            }
            cv_full[static_cast<size_t>(w)].notify_one();
          }
          pos += len;
        }
        crcs[i] = crc;
      }
    };
    io_pool().run(readers, task);
  } catch (...) {
    fail(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lk(mu);
    readers_done = true;
  }
  for (auto& cv : cv_full) cv.notify_all();
  for (auto& t : pool_writers) t.join();
  if (error) std::rethrow_exception(error);
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
