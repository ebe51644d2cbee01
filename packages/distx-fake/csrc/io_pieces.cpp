// io_pieces.cpp - write_pieces / read_pieces: byte ranges of host memory to and from one file,
// in parallel on the I/O pool, checksummed on the way; O_DIRECT through aligned bounce buffers.
#include <sys/types.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "io_engine.hpp"
#include "io_util.hpp"

namespace distx {

using namespace detail;

namespace {

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

}  // namespace distx
