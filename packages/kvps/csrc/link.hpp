// link.hpp - what binds between hosts: the link or the engine's CPU.
//
// Intent trades two resources. A key served here instead of at a remote owner
// saves engine work at both ends and the bytes of a pull and a push on the
// link; the intent's bookkeeping, its messages to the home and the move itself
// cost engine work and (far fewer) bytes: a move sends the key's slot once.
// Which of the two counts depends on which binds. Where messages cross hosts
// at memory speed the engine's CPU binds, and bookkeeping a key that is used
// once costs more than the pull and push it saves. Where a 100 Mbit/s or
// 1 Gbit/s link binds, only bytes count, and moving a key pays even for one use
// (its slot crosses once instead of its row twice).
//
// The LinkMeter tells the ledger and the cost model how much each counts: the
// link's rate is measured once when the server starts (every rank sends a
// block to a rank on another host and receives one, all at once, as training
// traffic does; KVPS_LINK_RATE gives it instead), and every intent round it
// adds up the bytes this rank sent to and received from other hosts (link
// time: the larger direction over the rate) and the engine thread's CPU time.
// The weight of bytes is L^2 / (L^2 + C^2) over the recent rounds' link time L
// and CPU time C: near 1 where the link is the bottleneck, near 0 where the
// engine is, and in between where the two are close (both then bind in turn).
#pragma once

#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "distkit/mpi.hpp"

namespace kvps {

class LinkMeter {
 public:
  /// `rate`: the link's rate in bytes/s (0: not weighed, CPU only); `off_node`:
  /// per rank, whether it is on another host; `memory_rounds`: how many rounds
  /// the sums remember.
  void init(double rate, std::vector<uint8_t> off_node, double memory_rounds) {
    rate_ = rate;
    off_ = std::move(off_node);
    decay_ = 1.0 - 1.0 / std::max(2.0, memory_rounds);
  }

  /// Progress thread: a message to / from rank r.
  void sent(int r, size_t bytes) {
    if (r >= 0 && static_cast<size_t>(r) < off_.size() && off_[static_cast<size_t>(r)]) out_ += bytes;
  }
  void received(int r, size_t bytes) {
    if (r >= 0 && static_cast<size_t>(r) < off_.size() && off_[static_cast<size_t>(r)]) in_ += bytes;
  }

  /// Progress thread, once per intent round: fold the round's bytes and CPU time in.
  void settle() {
    const double cpu = thread_cpu_s();
    if (rate_ <= 0) return;
    if (cpu0_ < 0) {  // (the first round starts here)
      cpu0_ = cpu;
      out_ = in_ = 0;
      return;
    }
    const double link = static_cast<double>(std::max(out_, in_)) / rate_;
    out_ = in_ = 0;
    link_ = link_ * decay_ + link;
    cpu_ = cpu_ * decay_ + (cpu - cpu0_);
    cpu0_ = cpu;
    const double l2 = link_ * link_, c2 = cpu_ * cpu_;
    weight_.store(l2 + c2 > 0 ? l2 / (l2 + c2) : 0.0, std::memory_order_relaxed);
  }

  /// How much bytes count against engine work, in [0, 1] (any thread).
  double weight() const { return weight_.load(std::memory_order_relaxed); }
  /// The link rate in bytes/s that the weight is based on (0: not weighed;
  /// set by init() before the progress thread starts, read-only after).
  double rate() const { return rate_; }

  /// The rate of the link between hosts in bytes/s, measured collectively over
  /// `comm` (before the progress thread starts): each rank exchanges blocks
  /// with the ranks `shift` away, a shift for which every pair is on two
  /// hosts, growing the block until the slowest exchange takes kProbeSeconds
  /// (or the block reaches kProbeMaxBytes), and that block once more. 0 when no such shift exists (the
  /// hosts hold different numbers of ranks in an order no shift pairs up).
  static double measure(MPI_Comm comm, int rank, int size, const std::vector<uint8_t>& off_node, int tag) {
    int shift = 0;
    for (int s = 1; s < size && shift == 0; ++s) {
      int ok = off_node[static_cast<size_t>((rank + s) % size)] ? 1 : 0, all = 0;
      distkit::mpi::check(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, comm), "MPI_Allreduce");
      if (all) shift = s;
    }
    if (shift == 0) return 0;
    const int dest = (rank + shift) % size, src = (rank - shift + size) % size;
    std::vector<char> out(kProbeMaxBytes, 1), in(kProbeMaxBytes);
    // one small exchange first: connections between hosts are set up lazily
    distkit::mpi::check(MPI_Sendrecv(out.data(), 1, MPI_BYTE, dest, tag, in.data(), 1, MPI_BYTE, src, tag, comm,
                                     MPI_STATUS_IGNORE),
                        "MPI_Sendrecv");
    auto exchange = [&](int bytes) {  // the slowest rank's time
      distkit::mpi::check(MPI_Barrier(comm), "MPI_Barrier");
      const auto t0 = std::chrono::steady_clock::now();
      distkit::mpi::check(MPI_Sendrecv(out.data(), bytes, MPI_BYTE, dest, tag, in.data(), bytes, MPI_BYTE, src, tag,
                                       comm, MPI_STATUS_IGNORE),
                          "MPI_Sendrecv");
      double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), slowest = 0;
      distkit::mpi::check(MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
      return slowest;
    };
    for (int bytes = kProbeMinBytes;; bytes *= 4) {
      const double t = exchange(bytes);
      // the first block of its size ran at half the rate at 100 Mbit/s (6.4
      // against 12.5 MB/s), a second one at the full rate: the better of two
      if (t >= kProbeSeconds || bytes >= kProbeMaxBytes) return static_cast<double>(bytes) / std::min(t, exchange(bytes));
    }
  }

 private:
  static constexpr int kProbeMinBytes = 1 << 18, kProbeMaxBytes = 1 << 24;  // (the block grows 4x a step)
  static constexpr double kProbeSeconds = 0.05;

  static double thread_cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }

  double rate_ = 0, decay_ = 0.5;
  std::vector<uint8_t> off_;
  uint64_t out_ = 0, in_ = 0;
  double cpu0_ = -1, link_ = 0, cpu_ = 0;
  std::atomic<double> weight_{0};
};

}  // namespace kvps
