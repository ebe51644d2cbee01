// node_shm.hpp - what ranks on one node share: doorbells, and the shards themselves.
//
// Every rank creates one owner-only POSIX shared-memory segment holding its
// doorbell and, when shards are shared, its key records and value arena. The
// node-local peers map it, then the name is unlinked. An idle progress thread
// sleeps on its doorbell (a futex word) instead of polling MPI: peers ring it
// after every message they send, workers when they post work.
#pragma once

#include <linux/futex.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distkit/error.hpp"
#include "distkit/mpi.hpp"
#include "distkit/node.hpp"
#include "distkit/shm.hpp"
#include "store.hpp"

namespace kvps {

/// A rank's doorbell, at the start of its shared segment.
struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleeping{0};
  std::atomic<uint32_t> bye{0};        // set by a peer that leaves without shutdown (rank + 1)
  std::atomic<uint32_t> data_live{0};  // the shard in this segment may be used by peers
};
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word must be 32 bits");

inline void futex_wait(std::atomic<uint32_t>* w, uint32_t val, long timeout_us) {
  timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, val, &ts, nullptr, 0);
}
inline void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
inline void ring(Doorbell* b) {
  b->seq.fetch_add(1, std::memory_order_seq_cst);
  if (b->sleeping.load(std::memory_order_seq_cst)) futex_wake(&b->seq);
}

class NodeShm {
 public:
  static constexpr size_t kBellBytes = 4096;

  /// Collective over `coll`. `meta_bytes` / `value_bytes`: the size of this
  /// rank's key records and value arena (equal on every rank). With
  /// `share_data`, both live in the segment and node-local peers use them in
  /// place; else they are private memory here.
  void setup(MPI_Comm coll, int rank, int size, size_t meta_bytes, size_t value_bytes, bool share_data,
             bool commit_now) {
    rank_ = rank;
    size_ = size;
    const size_t mbytes = (meta_bytes + 4095) / 4096 * 4096;
    // the ranks MPI places on one machine that distkit-common also puts on one node
    // (distkit::node_key: hostname, boot id, /dev/shm; $DISTKIT_NODE_ID in tests)
    MPI_Comm shared;
    distkit::mpi::check(MPI_Comm_split_type(coll, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared),
                        "MPI_Comm_split_type");
    MPI_Comm node = distkit::mpi::split_by_key(shared, distkit::node_key());
    MPI_Comm_free(&shared);
    int nsize = 0;
    MPI_Comm_size(node, &nsize);
    one_node_ = nsize == size;
    if (share_data && nsize > 1) {
      // tmpfs pages are allocated on first touch; a full /dev/shm would kill
      // the process with SIGBUS later, so share only what surely fits
      struct statvfs sv;
      const double need = double(nsize) * double(value_bytes + mbytes);
      if (statvfs("/dev/shm", &sv) != 0 || double(sv.f_bavail) * double(sv.f_frsize) < need) {
        if (rank == 0)
          std::fprintf(stderr,
                       "kvps: /dev/shm has too little free space for %d co-located shards (%.0f MiB); ranks on "
                       "this node exchange messages instead of sharing memory\n",
                       nsize, need / 1048576.0);
        share_data = false;
      }
    } else {
      share_data = false;
    }
    bool shm = true;
    try {
      seg_ = distkit::ShmSegment::create(kBellBytes + (share_data ? mbytes + value_bytes : 0));
      bell_ = new (seg_.data()) Doorbell();
    } catch (const distkit::Error&) {
      // no POSIX shared memory here: a private doorbell (workers still wake
      // the engine; peers' messages are found by polling)
      shm = false;
      share_data = false;
      own_bell_ = std::make_unique<Doorbell>();
      bell_ = own_bell_.get();
    }
    if (share_data) {
      char* base = static_cast<char*>(seg_.data());
      meta_ = base + kBellBytes;
      values_ = meta_ + mbytes;
#ifdef MADV_HUGEPAGE
      if (value_bytes >= (size_t(64) << 20)) madvise(meta_, value_bytes + mbytes, MADV_HUGEPAGE);
#endif
    } else {
      own_meta_ = Arena(mbytes);
      own_values_ = Arena(value_bytes);
      meta_ = own_meta_.data();
      values_ = own_values_.data();
    }
    if (commit_now) prefault(values_, value_bytes);
    bells_.assign(size, nullptr);
    pmeta_.assign(size, nullptr);
    pvals_.assign(size, nullptr);
    bells_[rank] = bell_;
    pmeta_[rank] = meta_;
    pvals_[rank] = values_;
    struct Card {
      char name[60];
      int32_t data;
    };
    Card mine{};
    if (shm) std::snprintf(mine.name, sizeof(mine.name), "%s", seg_.name().c_str());
    mine.data = share_data ? 1 : 0;
    std::vector<Card> cards(nsize);
    std::vector<int> ranks(nsize);
    distkit::mpi::check(MPI_Allgather(&mine, sizeof(Card), MPI_BYTE, cards.data(), sizeof(Card), MPI_BYTE, node),
                        "MPI_Allgather");
    distkit::mpi::check(MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node), "MPI_Allgather");
    int reachable = 1;
    peer_segs_.reserve(nsize);
    for (int i = 0; i < nsize; ++i) {
      const int r = ranks[i];
      if (r == rank) continue;
      std::string nm(cards[i].name, strnlen(cards[i].name, sizeof(cards[i].name)));
      if (nm.empty()) continue;  // that rank has no shared segment
      try {
        peer_segs_.push_back(distkit::ShmSegment::open(nm, kBellBytes + (cards[i].data ? mbytes + value_bytes : 0)));
        char* base = static_cast<char*>(peer_segs_.back().data());
        bells_[r] = reinterpret_cast<Doorbell*>(base);
        if (cards[i].data) {
          pmeta_[r] = base + kBellBytes;
          pvals_[r] = base + kBellBytes + mbytes;
          any_peer_data_ = true;
        }
        ++reachable;
      } catch (const distkit::Error&) {
      }
    }
    MPI_Barrier(node);  // everybody mapped every segment: drop the names
    if (shm) seg_.unlink();
    MPI_Comm_free(&node);
    shares_own_ = share_data;  // peers use it once publish() says its records are ready
    // who reaches whose shard in place: intent does not move a key between
    // two such ranks (it is served in place already)
    std::vector<uint8_t> mine_reach(size, 0);
    for (int r = 0; r < size; ++r) mine_reach[r] = r == rank || pvals_[r] != nullptr ? 1 : 0;
    reach_.resize(static_cast<size_t>(size) * size);
    distkit::mpi::check(MPI_Allgather(mine_reach.data(), size, MPI_BYTE, reach_.data(), size, MPI_BYTE, coll),
                        "MPI_Allgather");
    all_reach_ = std::all_of(reach_.begin(), reach_.end(), [](uint8_t x) { return x != 0; });
    // A peer that cannot ring us (another node, or no shared doorbell) is
    // polled every 100 us when idle; if all can, 5 ms is only a safety net.
    int all_ring = shm && reachable == size ? 1 : 0;
    distkit::mpi::check(MPI_Allreduce(MPI_IN_PLACE, &all_ring, 1, MPI_INT, MPI_MIN, coll), "MPI_Allreduce");
    idle_timeout_us_ = all_ring ? 5000 : 100;
  }

  Doorbell* bell() const { return bell_; }
  /// The doorbell of rank r, or nullptr when r cannot be rung (another node).
  Doorbell* bell_of(int r) const { return bells_[r]; }
  /// Key records and value arena of rank r (this rank's own always; a peer's
  /// only when shared with this rank, else nullptr).
  char* meta(int r) const { return pmeta_[r]; }
  char* values(int r) const { return pvals_[r]; }
  bool shares_peers() const { return any_peer_data_; }
  /// Rank a serves keys of rank b's shard in place.
  bool reaches(int a, int b) const { return reach_[static_cast<size_t>(a) * size_ + b] != 0; }
  /// Every rank reaches every shard (one node, memory shared).
  bool all_reach() const { return all_reach_; }
  /// Every rank runs on this node (whether or not memory is shared).
  bool one_node() const { return one_node_; }
  long idle_timeout_us() const { return idle_timeout_us_; }
  /// Peers may use this rank's shard in place from now on: call once its
  /// key records are initialised (a peer reading records still being
  /// constructed would take a lock that is then reset under it).
  void publish() {
    if (shares_own_) bell_->data_live.store(1, std::memory_order_release);
  }
  /// Peers stop using this rank's shard in place.
  void retire() {
    if (bell_) bell_->data_live.store(0);
  }

 private:
  int rank_ = 0, size_ = 1;
  distkit::ShmSegment seg_;
  std::vector<distkit::ShmSegment> peer_segs_;
  Doorbell* bell_ = nullptr;
  std::unique_ptr<Doorbell> own_bell_;
  Arena own_meta_, own_values_;
  char* meta_ = nullptr;
  char* values_ = nullptr;
  std::vector<Doorbell*> bells_;
  std::vector<char*> pmeta_, pvals_;
  bool any_peer_data_ = false;
  bool shares_own_ = false;
  std::vector<uint8_t> reach_;
  bool all_reach_ = false;
  bool one_node_ = false;
  long idle_timeout_us_ = 100;
};

}  // namespace kvps
