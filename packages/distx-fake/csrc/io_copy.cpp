// io_copy.cpp - copy_pieces: byte ranges of source files to runs in destination files, read
// once, checksummed, and written while later blocks are read (reader pool + writer threads),
// or read, checksummed and written by one thread per piece when the sources are in the page cache.
#include <sys/types.h>

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fcntl.h>

#include "io_engine.hpp"
#include "io_util.hpp"

namespace distx {

using namespace detail;

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

}  // namespace distx
