// io_engine.hpp - checkpoint I/O engine of distx-fake: crc32c (crc32c.hpp/.cpp), positional
// reads and writes of byte ranges on a thread pool (io_pieces.cpp), file-to-file copies
// (io_copy.cpp), page-cache residency, fsync of files and directories, atomic exchange
// (io_files.cpp); io_util.hpp holds what they share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "crc32c.hpp"

namespace distx {

struct Piece {
  uintptr_t ptr;      // host memory
  int64_t nbytes;     // length
  int64_t offset;     // file offset
};

/// Alignment of file offsets, lengths and buffers for O_DIRECT I/O.
constexpr int64_t kDirectAlign = 4096;

/// pwrite every piece to fd in parallel; returns the crc32c of each piece.
/// With `direct` (fd opened with O_DIRECT) data goes through 4 KiB-aligned bounce buffers,
/// offsets must be multiples of 4096 and the last block of a piece is zero-padded to 4096.
std::vector<uint32_t> write_pieces(int fd, const std::vector<Piece>& pieces, bool direct = false);
/// pread every piece from fd in parallel; returns the crc32c of each piece as read.
/// With `direct`, reads go through aligned bounce buffers (offsets must be multiples of 4096).
std::vector<uint32_t> read_pieces(int fd, const std::vector<Piece>& pieces, bool direct = false);
/// A byte range of one source file (for copy_pieces).
struct SourcePiece {
  int src;         // index into the source fds
  int64_t offset;  // file offset
  int64_t nbytes;  // length
};
/// Where bytes of a source piece go: piece bytes [at, at + nbytes) -> dst file offset.
struct Run {
  int64_t piece;   // index into the pieces
  int64_t at;      // byte offset inside the piece
  int64_t nbytes;  // length
  int dst;         // index into the destination fds
  int64_t offset;  // destination file offset
};
/// Copy every source piece to its runs in the destination files, on the I/O thread pool: each
/// piece is read once (O_DIRECT sources as whole aligned blocks into an aligned buffer, others
/// with pread) in blocks, checksummed, and its bytes pwritten straight to their destinations
/// while other threads read; reading and writing overlap. When no source is O_DIRECT (read
/// through the page cache) each thread reads, checksums and writes its own small blocks
/// instead, without handing them on. With `writeback`, the pages written
/// are handed to the disk as each block is done (sync_file_range), ahead of a final fsync.
/// Returns the crc32c of each piece.
std::vector<uint32_t> copy_pieces(const std::vector<int>& src_fds, const std::vector<bool>& src_direct,
                                  const std::vector<int>& dst_fds, const std::vector<SourcePiece>& pieces,
                                  std::vector<Run> runs, bool writeback);
/// Fraction (0..1) of the pages of an open file that are in the page cache now (mincore of a
/// read-only mapping); 0 for an empty or non-regular file or where it cannot be told. Throws
/// OSError for a bad descriptor.
double cached_fraction(int fd);
/// fsync a file descriptor / a path (file or directory).
void fsync_fd(int fd);
void fsync_path(const std::string& path);
/// Atomically swap two existing paths (renameat2 RENAME_EXCHANGE); false when unsupported.
bool exchange_paths(const std::string& a, const std::string& b);

}  // namespace distx
