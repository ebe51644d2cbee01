// engine.hpp - the kvps protocol engine: store, ownership directory, intent
// handling and a background progress thread speaking MPI.
//
// Protocol summary (see README "How it works"):
//  * every key has a home rank (key % size) whose `owner_` entry is the truth
//    about the key's current owner; other ranks keep a routing hint;
//  * a request for a key goes to the hinted rank; a rank that does not own the
//    key forwards it (home -> owner, others -> home); a rank waiting for the key
//    to arrive (INCOMING) queues it; the owner serves it and answers the origin;
//  * relocation: the new owner marks the key INCOMING and asks the home; the
//    home updates the directory and tells the old owner to hand the value over;
//  * replication: the home grants replicas when several ranks intend a key; a
//    replica applies local pushes at once, keeps the delta and, every sync
//    round, ships the delta to the owner and gets the fresh value back;
//  * all protocol state is touched by the progress thread only, except the
//    value/state of a key, which worker threads read and update in place under
//    a striped spin lock (the local fast path).
#pragma once

#include <mpi.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "distkit/shm.hpp"

namespace kvps {

using distkit::check;
using distkit::str;

enum State : uint8_t { NOT_HERE = 0, OWNED = 1, REPLICA = 2, INCOMING = 3 };

enum MsgType : int32_t {
  M_PULL = 1,
  M_PUSH,
  M_SET,
  M_IPUSH,  // internal push (flush of a dropped replica)
  M_FETCH,  // replica creation: read the owner's value
  M_RSYNC,  // replica sync: add delta at the owner, get the value back
  M_PULL_RESP,
  M_ACK,
  M_FETCH_RESP,
  M_RSYNC_RESP,
  M_LOCALIZE,
  M_TRANSFER,
  M_HANDOVER,
  M_INTENT_ADD,
  M_INTENT_DROP,
  M_INTENT_ACK,
  M_RELOC_NOTICE,  // home -> new owner: the key is on its way to you
  M_REPL_GRANT,
  M_RCHECK,       // replica refresh of an unchanged replica: version only
  M_RCHECK_RESP,  // the owner's version equals the replica's: nothing changed
  M_BYE,          // the sender leaves without shutdown()
};

enum Technique : int { T_ALL = 0, T_REPL_ONLY = 1, T_RELOC_ONLY = 2, T_NONE = 3 };

constexpr int kTag = 7;
constexpr size_t kStripes = 1 << 14;

inline bool carries_values(int32_t t) {
  return t == M_PUSH || t == M_SET || t == M_IPUSH || t == M_RSYNC || t == M_PULL_RESP || t == M_FETCH_RESP ||
         t == M_RSYNC_RESP || t == M_HANDOVER;
}

template <class T>
void add_values(char* dst, const char* src, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = T(static_cast<float>(d[i]) + static_cast<float>(s[i]));
  }
}

struct Hdr {
  int32_t type;
  int32_t origin;
  int64_t ts;
  int64_t n;
};

struct SpinLock {
  std::atomic_flag f = ATOMIC_FLAG_INIT;
  void lock() {
    int spins = 0;
    while (f.test_and_set(std::memory_order_acquire)) {
      if (++spins > 64) std::this_thread::yield();
    }
  }
  void unlock() { f.clear(std::memory_order_release); }
};

/// A rank's doorbell in shared memory: node-local peers ring it after every
/// message they send it, so an idle progress thread sleeps in futex_wait
/// instead of polling MPI (2 ranks oversubscribed on 2 cores must not spin).
struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleeping{0};
  std::atomic<uint32_t> bye{0};  // set by a peer that leaves without shutdown (rank + 1)
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

/// A lazily committed, zero-filled virtual arena (pages cost memory only once touched).
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw distkit::OSError(str("mmap of ", bytes, " bytes for the value arena"), errno);
    p_ = static_cast<char*>(p);
#ifdef MADV_HUGEPAGE
    if (bytes >= (size_t(64) << 20)) madvise(p_, bytes, MADV_HUGEPAGE);  // fewer TLB misses on random rows
#endif
  }
  ~Arena() {
    if (p_) munmap(p_, size_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept : p_(o.p_), size_(o.size_) { o.p_ = nullptr; }
  Arena& operator=(Arena&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
    return *this;
  }
  char* data() const { return p_; }
  /// Touch every page (the arena is committed now instead of on first use).
  void prefault() {
    volatile char* v = p_;
    for (size_t o = 0; o < size_; o += 4096) v[o] = 0;
  }

 private:
  char* p_ = nullptr;
  size_t size_ = 0;
};

struct Request {
  int64_t remaining = 0;
  bool done = false;
  bool internal = false;
  char* out = nullptr;           // user buffer (pull)
  std::vector<int64_t> out_off;  // byte offset per position (pull)
  int worker = -1;
};

struct Cmd {
  int32_t type = 0;  // a MsgType for routed ops, else one of the C_* below
  int64_t ts = -1;
  int worker = 0;
  int64_t a = 0, b = 0;
  std::vector<int64_t> keys, pos;
  std::vector<char> vals;
};
enum CmdType : int32_t { C_LOCALIZE = 100, C_INTENT, C_SYNC, C_DUMP, C_BYE };

struct PendingOp {
  int32_t type;
  int32_t origin;
  int64_t ts;
  int64_t pos;
  std::vector<char> val;
};

struct IntentEntry {
  int64_t start, end;
  std::vector<int64_t> keys;
};

struct Builder {
  std::vector<int64_t> keys, pos;
  std::vector<char> vals;
};

class Engine {
 public:
  Engine(uintptr_t comm, uintptr_t coll, int64_t num_keys, const int64_t* lengths, int dtype, int num_workers,
         int technique, int64_t lookahead, int64_t sync_every = 1, bool prefault = false,
         bool shared_memory = true)
      : comm_(distkit::mpi::comm_from_handle(comm)),
        coll_(distkit::mpi::comm_from_handle(coll)),
        num_keys_(num_keys),
        dtype_(distkit::dtype_from_code(dtype)),
        num_workers_(num_workers),
        tech_(technique),
        lookahead_(lookahead),
        sync_every_(sync_every < 1 ? 1 : sync_every) {
    check(num_keys > 0, "num_keys must be > 0, got ", num_keys);
    check(num_workers > 0, "num_threads must be > 0, got ", num_workers);
    check(distkit::is_floating(dtype_), "value dtype must be floating, got ", distkit::dtype_name(dtype_));
    int provided = 0;
    MPI_Query_thread(&provided);
    check<distkit::Error>(provided == MPI_THREAD_MULTIPLE,
                          "kvps needs MPI_THREAD_MULTIPLE (initialise MPI through mpi4py with the default "
                          "thread level 'multiple'); the MPI library provided level ",
                          provided);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    isz_ = distkit::itemsize(dtype_);
    use_mask_ = size_ <= 64;

    len_.assign(lengths, lengths + num_keys);
    off_.resize(num_keys + 1);
    off_[0] = 0;
    for (int64_t k = 0; k < num_keys; ++k) {
      check(len_[k] >= 0, "value_lengths[", k, "] = ", len_[k], " is negative");
      off_[k + 1] = off_[k] + len_[k];
    }
    uniform_ = true;
    for (int64_t k = 1; k < num_keys; ++k)
      if (len_[k] != len_[0]) {
        uniform_ = false;
        break;
      }
    delta_ = Arena(static_cast<size_t>(off_[num_keys] * isz_) + 64);
    if (prefault) delta_.prefault();  // commit the arenas now: keys arriving later cause no page faults
    setup_shared(shared_memory, prefault);
    clocks_ = std::vector<std::atomic<int64_t>>(num_workers);
    for (auto& c : clocks_) c.store(0);
    synced_ = std::vector<std::atomic<int64_t>>(num_workers);
    for (auto& c : synced_) c.store(0);
    worker_ts_.resize(num_workers);
    pending_intents_.resize(num_workers);
    active_intents_.resize(num_workers);
    distkit::dispatch_floating(dtype_, [&](auto tag) {
      using T = decltype(tag);
      add_ = &add_values<T>;
    });
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }

  /// Collective. Every rank creates one owner-only shared segment holding its
  /// doorbell and, when `share_data`, its key records and value arena; every
  /// node-local peer maps it, then the name is unlinked. A peer's shared
  /// shard is then read and updated in place (under the key's lock, while
  /// the peer owns the key) instead of through messages.
  void setup_shared(bool share_data, bool prefault) {
    const size_t vbytes = static_cast<size_t>(off_[num_keys_] * isz_) + 64;
    const size_t mbytes = (static_cast<size_t>(num_keys_) * sizeof(Meta) + 4095) / 4096 * 4096;
    MPI_Comm node;
    distkit::mpi::check(MPI_Comm_split_type(coll_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                        "MPI_Comm_split_type");
    if (const char* sim = std::getenv("KVPS_NODE_ID")) {
      // testing: ranks with different ids act as if on different nodes
      MPI_Comm sub;
      distkit::mpi::check(MPI_Comm_split(node, std::atoi(sim), rank_, &sub), "MPI_Comm_split");
      MPI_Comm_free(&node);
      node = sub;
    }
    int nsize = 0;
    MPI_Comm_size(node, &nsize);
    if (share_data && nsize > 1) {
      // tmpfs pages are allocated on first touch; a full /dev/shm would kill
      // the process with SIGBUS later, so share only what surely fits
      struct statvfs sv;
      const double need = double(nsize) * double(vbytes + mbytes);
      if (statvfs("/dev/shm", &sv) != 0 || double(sv.f_bavail) * double(sv.f_frsize) < need) {
        if (rank_ == 0)
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
      bell_seg_ = distkit::ShmSegment::create(4096 + (share_data ? mbytes + vbytes : 0));
      mybell_ = new (bell_seg_.data()) Doorbell();
    } catch (const distkit::Error&) {
      // no POSIX shared memory here: a private doorbell (workers still wake
      // the engine; peers' messages are found by polling every 100 us)
      shm = false;
      share_data = false;
      own_bell_ = std::make_unique<Doorbell>();
      mybell_ = own_bell_.get();
    }
    if (share_data) {
      char* base = static_cast<char*>(bell_seg_.data());
      meta_ = reinterpret_cast<Meta*>(base + 4096);
      std::uninitialized_default_construct_n(meta_, num_keys_);
      vbase_ = base + 4096 + mbytes;
#ifdef MADV_HUGEPAGE
      if (vbytes >= (size_t(64) << 20)) madvise(vbase_ - mbytes, vbytes + mbytes, MADV_HUGEPAGE);
#endif
      if (prefault) {
        volatile char* v = vbase_;
        for (size_t o = 0; o < vbytes; o += 4096) v[o] = 0;
      }
    } else {
      meta_own_.reset(new Meta[static_cast<size_t>(num_keys_)]);
      meta_ = meta_own_.get();
      vals_ = Arena(vbytes);
      vbase_ = vals_.data();
      if (prefault) vals_.prefault();
    }
    for (int64_t k = 0; k < num_keys_; ++k) {
      const int h = home(k);
      meta_[k].hint = h;
      meta_[k].owner = h;
      if (h == rank_) meta_[k].state = OWNED;
    }
    bells_.assign(size_, nullptr);
    bells_[rank_] = mybell_;
    pmeta_.assign(size_, nullptr);
    pvals_.assign(size_, nullptr);
    pmeta_[rank_] = meta_;
    pvals_[rank_] = vbase_;
    struct Card {
      char name[60];
      int32_t data;
    };
    Card mine{};
    if (shm) std::snprintf(mine.name, sizeof(mine.name), "%s", bell_seg_.name().c_str());
    mine.data = share_data ? 1 : 0;
    std::vector<Card> cards(nsize);
    std::vector<int> ranks(nsize);
    distkit::mpi::check(MPI_Allgather(&mine, sizeof(Card), MPI_BYTE, cards.data(), sizeof(Card), MPI_BYTE, node),
                        "MPI_Allgather");
    distkit::mpi::check(MPI_Allgather(&rank_, 1, MPI_INT, ranks.data(), 1, MPI_INT, node), "MPI_Allgather");
    int reachable = 1;
    peer_segs_.reserve(nsize);
    for (int i = 0; i < nsize; ++i) {
      const int r = ranks[i];
      if (r == rank_) continue;
      std::string nm(cards[i].name, strnlen(cards[i].name, sizeof(cards[i].name)));
      if (nm.empty()) continue;  // that rank has no shared segment
      try {
        peer_segs_.push_back(distkit::ShmSegment::open(nm, 4096 + (cards[i].data ? mbytes + vbytes : 0)));
        char* base = static_cast<char*>(peer_segs_.back().data());
        bells_[r] = reinterpret_cast<Doorbell*>(base);
        if (cards[i].data) {
          pmeta_[r] = reinterpret_cast<Meta*>(base + 4096);
          pvals_[r] = base + 4096 + mbytes;
          any_peer_data_ = true;
        }
        ++reachable;
      } catch (const distkit::Error&) {
      }
    }
    MPI_Barrier(node);  // everybody mapped every segment: drop the names
    if (shm) bell_seg_.unlink();
    MPI_Comm_free(&node);
    if (share_data) mybell_->data_live.store(1);
    // who reaches whose shard in place: intent does not move a key between
    // two such ranks (it is served in place already)
    std::vector<uint8_t> mine_reach(size_, 0);
    for (int r = 0; r < size_; ++r) mine_reach[r] = r == rank_ || pvals_[r] != nullptr ? 1 : 0;
    reach_.resize(static_cast<size_t>(size_) * size_);
    distkit::mpi::check(MPI_Allgather(mine_reach.data(), size_, MPI_BYTE, reach_.data(), size_, MPI_BYTE, coll_),
                        "MPI_Allgather");
    all_reach_ = std::all_of(reach_.begin(), reach_.end(), [](uint8_t x) { return x != 0; });
    // A peer that cannot ring us (another node, or no shared doorbell) is
    // polled every 100 us when idle; if all can, 5 ms is only a safety net.
    int all_ring = shm && reachable == size_ ? 1 : 0;
    distkit::mpi::check(MPI_Allreduce(MPI_IN_PLACE, &all_ring, 1, MPI_INT, MPI_MIN, coll_), "MPI_Allreduce");
    idle_timeout_us_ = all_ring ? 5000 : 100;
  }

  /// Keys served so far by this rank's workers: from its own shard, from a
  /// node-local peer's shard in shared memory, and through messages.
  std::array<int64_t, 3> stats() const { return {n_local_.load(), n_shared_.load(), n_remote_.load()}; }
  /// Whether this rank reads and updates node-local peers' shards in place.
  bool shares_memory() const { return any_peer_data_; }

  ~Engine() { stop(); }

  // ------------------------------------------------------------------ info
  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t num_keys() const { return num_keys_; }
  int home(int64_t k) const { return static_cast<int>(k % size_); }
  int64_t key_len(int64_t k) const { return len_[k]; }
  int key_state(int64_t k) {
    auto& l = lock_of(k);
    l.lock();
    int s = meta_[k].state;
    l.unlock();
    return s;
  }
  int64_t value_count(const int64_t* keys, int64_t n) const {
    if (uniform_) return n * len_[0];
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += len_[keys[i]];
    return s;
  }

  // ------------------------------------------------------------- worker ops
  /// op is M_PULL, M_PUSH or M_SET. Returns -1 when served entirely locally.
  int64_t op(int op, int worker, const int64_t* keys, int64_t n, char* vals) {
    check_alive();
    // uniform lengths (the common case): offsets are computed, not looked up
    const bool uni = uniform_;
    const int64_t L = len_[0];
    std::vector<int64_t> voff;
    if (!uni) {
      voff.resize(n);
      int64_t acc = 0;
      for (int64_t i = 0; i < n; ++i) {
        voff[i] = acc;
        acc += len_[keys[i]] * isz_;
      }
    }
    std::vector<uint8_t> remote(n, 0);
    std::atomic<int64_t> nremote{0};
    char* const arena = vbase_;
    char* const darena = delta_.data();
    std::atomic<int64_t> nshared{0};
    distkit::parallel_for(0, n, 8192, [&](int64_t lo, int64_t hi) {
      int64_t r = 0, sh = 0;
      constexpr int64_t kAhead = 24;
      for (int64_t i = lo; i < hi; ++i) {
        if (i + kAhead < hi) {
          const int64_t kp = keys[i + kAhead];
          __builtin_prefetch(arena + (uni ? kp * L : off_[kp]) * isz_);
          __builtin_prefetch(&meta_[kp].state);
        }
        const int64_t k = keys[i];
        const int64_t len = uni ? L : len_[k];
        const int64_t eoff = uni ? k * L : off_[k];
        const size_t bytes = static_cast<size_t>(len * isz_);
        char* v = vals + (uni ? i * L * isz_ : voff[i]);
        char* slot = arena + eoff * isz_;
        auto& l = lock_of(k);
        l.lock();
        const uint8_t st = meta_[k].state;
        if (st == OWNED || (st == REPLICA && op != M_SET)) {
          if (op == M_PULL) {
            std::memcpy(v, slot, bytes);
          } else if (op == M_SET) {
            std::memcpy(slot, v, bytes);
            ++meta_[k].ver;
          } else {
            add_(slot, v, len);
            if (st == REPLICA) {
              add_(darena + eoff * isz_, v, len);
              meta_[k].dirty = 1;
            } else {
              ++meta_[k].ver;
            }
          }
          l.unlock();
        } else {
          l.unlock();
          if (any_peer_data_ && direct(op, k, v, len, eoff)) {
            ++sh;
          } else {
            remote[i] = 1;
            ++r;
          }
        }
      }
      if (r) nremote += r;
      if (sh) nshared += sh;
    });
    n_shared_ += nshared.load();
    n_remote_ += nremote.load();
    n_local_ += n - nshared.load() - nremote.load();
    if (nremote.load() == 0) return -1;
    Cmd c;
    c.type = op;
    c.worker = worker;
    c.ts = next_ts_++;
    auto req = std::make_shared<Request>();
    req->remaining = nremote.load();
    req->worker = worker;
    if (op == M_PULL) {
      req->out = vals;
      if (uni) {
        voff.resize(n);
        for (int64_t i = 0; i < n; ++i) voff[i] = i * L * isz_;
      }
      req->out_off = std::move(voff);
    }
    c.keys.reserve(nremote);
    c.pos.reserve(nremote);
    for (int64_t i = 0; i < n; ++i) {
      if (!remote[i]) continue;
      c.keys.push_back(keys[i]);
      c.pos.push_back(i);
      if (op != M_PULL) {
        const char* v = vals + (uni ? i * L * isz_ : voff[i]);
        c.vals.insert(c.vals.end(), v, v + len_[keys[i]] * isz_);
      }
    }
    const int64_t ts = c.ts;
    register_request(ts, req, worker);
    post(std::move(c));
    return ts;
  }

  int64_t localize(int worker, const int64_t* keys, int64_t n) {
    check_alive();
    std::vector<int64_t> u(keys, keys + n);
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    std::vector<int64_t> todo;
    for (int64_t k : u)
      if (key_state(k) != OWNED) todo.push_back(k);
    if (todo.empty()) return -1;
    Cmd c;
    c.type = C_LOCALIZE;
    c.worker = worker;
    c.ts = next_ts_++;
    auto req = std::make_shared<Request>();
    req->remaining = static_cast<int64_t>(todo.size());
    req->worker = worker;
    c.keys = std::move(todo);
    const int64_t ts = c.ts;
    register_request(ts, req, worker);
    post(std::move(c));
    return ts;
  }

  void intent(int worker, const int64_t* keys, int64_t n, int64_t start, int64_t end) {
    check_alive();
    // (every shard is served in place on this node: no key needs to move)
    if (n == 0 || tech_ == T_NONE || all_reach_) return;
    Cmd c;
    c.type = C_INTENT;
    c.worker = worker;
    c.a = start;
    c.b = end;
    c.keys.assign(keys, keys + n);
    post(std::move(c));
  }

  int64_t advance_clock(int worker) {
    int64_t c = ++clocks_[worker];
    Cmd cmd;
    cmd.type = C_SYNC;
    cmd.worker = worker;
    cmd.a = c + 2;  // (a == 1 marks a reset; offset keeps clock values clear of it)
    post(std::move(cmd));
    // Back-pressure: a worker may run at most one sync round ahead of its
    // progress engine. Otherwise a worker whose pulls are all local (what
    // intent achieves) takes the CPU from the engine on an oversubscribed
    // node, relocations fall behind and the keys are not local when needed.
    if (c > 1 && synced_[worker].load() < c - 1) {
      std::unique_lock<std::mutex> lk(clock_mu_);
      clock_cv_.wait_for(lk, std::chrono::seconds(1),
                         [&] { return synced_[worker].load() >= c - 1 || failed_ || !running_.load(); });
    }
    return c;
  }
  int64_t current_clock(int worker) const { return clocks_[worker].load(); }

  /// One sync round (intents, replica refresh); returns once every internal
  /// operation this rank has under way (relocations, replica fetches and
  /// syncs, intent registrations) has finished.
  void wait_sync() {
    check_alive();
    Cmd c;
    c.type = C_SYNC;
    c.ts = next_ts_++;
    c.worker = -1;
    auto req = std::make_shared<Request>();
    req->remaining = 1;
    {
      std::lock_guard<std::mutex> lk(req_mu_);
      reqs_[c.ts] = req;
    }
    int64_t ts = c.ts;
    post(std::move(c));
    wait(ts);
  }

  void wait(int64_t ts) {
    if (ts < 0) return;
    std::unique_lock<std::mutex> lk(req_mu_);
    auto it = reqs_.find(ts);
    if (it == reqs_.end()) return;
    auto req = it->second;
    int waited = 0;
    while (!req_cv_.wait_for(lk, std::chrono::seconds(20), [&] { return req->done || failed_; })) {
      if (++waited == 3) {  // a minute: print what the engine is waiting for
        std::fprintf(stderr, "kvps rank %d: wait(%lld) still pending after 60 s: remaining=%lld internal=%lld\n",
                     rank_, static_cast<long long>(ts), static_cast<long long>(req->remaining),
                     static_cast<long long>(internal_pending_));
        Cmd c;
        c.type = C_DUMP;
        lk.unlock();
        post(std::move(c));
        lk.lock();
      }
    }
    reqs_.erase(ts);
    if (failed_ && !req->done) throw distkit::Error(error_);
  }

  void waitall(int worker) {
    std::vector<int64_t> ts;
    {
      std::lock_guard<std::mutex> lk(req_mu_);
      ts.swap(worker_ts_[worker]);
    }
    for (int64_t t : ts) wait(t);
  }

  bool is_done(int64_t ts) {
    if (ts < 0) return true;
    std::lock_guard<std::mutex> lk(req_mu_);
    auto it = reqs_.find(ts);
    return it == reqs_.end() || it->second->done;
  }

  /// A barrier on the collective communicator that does not spin hard.
  void barrier() {
    MPI_Request r;
    distkit::mpi::check(MPI_Ibarrier(coll_, &r), "MPI_Ibarrier");
    int flag = 0;
    int spins = 0;
    while (true) {
      distkit::mpi::check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) break;
      if (failed_) throw distkit::Error(error_);
      if (++spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  /// Barrier over every worker thread of every rank.
  void worker_barrier() {
    std::unique_lock<std::mutex> lk(wb_mu_);
    uint64_t gen = wb_gen_;
    if (++wb_count_ == num_workers_) {
      lk.unlock();
      barrier();
      lk.lock();
      wb_count_ = 0;
      ++wb_gen_;
      wb_cv_.notify_all();
    } else {
      wb_cv_.wait(lk, [&] { return wb_gen_ != gen; });
    }
  }

  // --------------------------------------------------- state for save/load
  std::vector<int64_t> owned_keys() {
    std::vector<int64_t> out;
    for (int64_t k = 0; k < num_keys_; ++k)
      if (meta_[k].state == OWNED) out.push_back(k);
    return out;
  }
  void read_local(const int64_t* keys, int64_t n, char* out) {
    int64_t o = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = keys[i];
      std::memcpy(out + o, vbase_ + off_[k] * isz_, len_[k] * isz_);
      o += len_[k] * isz_;
    }
  }
  void write_local(const int64_t* keys, int64_t n, const char* in) {
    int64_t o = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = keys[i];
      std::memcpy(vbase_ + off_[k] * isz_, in + o, len_[k] * isz_);
      o += len_[k] * isz_;
    }
  }
  /// Every key back to its home, replicas and intents dropped. Collective;
  /// the caller guarantees quiescence (barriers around it).
  void reset_ownership() {
    Cmd c;
    c.type = C_SYNC;
    c.a = 1;  // reset marker, run on the progress thread
    c.ts = next_ts_++;
    auto req = std::make_shared<Request>();
    req->remaining = 1;
    {
      std::lock_guard<std::mutex> lk(req_mu_);
      reqs_[c.ts] = req;
    }
    int64_t ts = c.ts;
    post(std::move(c));
    wait(ts);
  }

  /// Leave without shutdown() (interpreter exit): tell every peer, so that
  /// their pending and further operations fail at once instead of hanging.
  void abandon() {
    if (!running_.load()) return;
    Cmd c;
    c.type = C_BYE;
    post(std::move(c));
    for (int i = 0; i < 500 && !bye_sent_.load() && !failed_; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop();
  }

  /// Ignore replica/relocation grants from now on (the first step of shutdown).
  void begin_shutdown() { shutting_down_ = true; }

  void stop() {
    if (mybell_) mybell_->data_live.store(0);  // peers stop using this shard in place
    if (!running_.exchange(false)) return;
    if (mybell_) ring(mybell_);
    if (thread_.joinable()) thread_.join();
    prof_print();
  }

  int64_t num_replicas() {
    int64_t n = 0;
    for (int64_t k : rlist_) n += key_state(k) == REPLICA;
    return n;
  }

 private:
  SpinLock& lock_of(int64_t k) { return meta_[k].lock; }

  /// Prefetch the record (and the value) of the key kAheadKeys positions
  /// further on: the handlers below walk random keys of tables much larger
  /// than the caches, and one miss at a time was most of their time.
  static constexpr int64_t kAheadKeys = 16;
  void ahead(const int64_t* keys, int64_t n, int64_t i, bool val) const {
    const int64_t j = i + kAheadKeys;
    if (j >= n) return;
    const int64_t k = keys[j];
    __builtin_prefetch(&meta_[k], 1);
    if (val) {  // (uniform lengths: no lookup in off_/len_, one miss less)
      const char* p = vbase_ + (uniform_ ? k * len_[0] : off_[k]) * isz_;
      const int64_t bytes = std::min<int64_t>((uniform_ ? len_[0] : len_[k]) * isz_, 256);
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 1);
    }
  }

  /// Serve one key in place in the shard of a node-local peer that owns it
  /// (tried: this rank's routing hint, then the owner in the home's
  /// directory). Ownership is checked under the key's lock in the peer's
  /// records, which every path that moves or changes the key also takes.
  bool direct(int op, int64_t k, char* v, int64_t len, int64_t eoff) {
    const int p = __atomic_load_n(&meta_[k].hint, __ATOMIC_RELAXED);
    if (p != rank_ && pmeta_[p] && try_direct(p, op, k, v, len, eoff)) return true;
    const int h = home(k);
    if (!pmeta_[h]) return false;
    const int o = __atomic_load_n(&pmeta_[h][k].owner, __ATOMIC_RELAXED);
    if (o == p || o == rank_ || o < 0 || o >= size_ || !pmeta_[o]) return false;
    return try_direct(o, op, k, v, len, eoff);
  }

  bool try_direct(int p, int op, int64_t k, char* v, int64_t len, int64_t eoff) {
    Meta& m = pmeta_[p][k];
    // a peer that died holding the lock must not hang us: give up when the
    // engine learns of the failure
    int spins = 0;
    while (m.lock.f.test_and_set(std::memory_order_acquire)) {
      if (++spins > 64) {
        std::this_thread::yield();
        if ((spins & 0xFFFF) == 0 && (failed_ || !running_.load())) return false;
      }
    }
    if (m.state != OWNED || !bells_[p]->data_live.load(std::memory_order_relaxed)) {
      m.lock.unlock();
      return false;
    }
    char* slot = pvals_[p] + eoff * isz_;
    if (op == M_PULL) {
      std::memcpy(v, slot, static_cast<size_t>(len * isz_));
    } else if (op == M_SET) {
      std::memcpy(slot, v, static_cast<size_t>(len * isz_));
      ++m.ver;
    } else {
      add_(slot, v, len);
      ++m.ver;
    }
    m.lock.unlock();
    return true;
  }

  void check_alive() {
    if (failed_) throw distkit::Error(error_);
    check<distkit::Error>(running_.load(), "the kvps server was shut down");
  }

  void register_request(int64_t ts, std::shared_ptr<Request> req, int worker) {
    std::lock_guard<std::mutex> lk(req_mu_);
    reqs_[ts] = std::move(req);
    if (worker < 0) return;
    auto& v = worker_ts_[worker];
    v.push_back(ts);
    if (v.size() >= 4096 && (v.size() & 4095) == 0) {
      // forget timestamps already waited for (sync calls never reach waitall)
      v.erase(std::remove_if(v.begin(), v.end(), [&](int64_t t) { return reqs_.find(t) == reqs_.end(); }), v.end());
    }
  }

  void post(Cmd&& c) {
    {
      std::lock_guard<std::mutex> lk(cmd_mu_);
      cmds_.push_back(std::move(c));
      has_cmds_.store(true);
    }
    ring(mybell_);
  }

  // ----------------------------------------------------------- completion
  void complete(int64_t ts, int64_t count) {
    std::lock_guard<std::mutex> lk(req_mu_);
    auto it = reqs_.find(ts);
    if (it == reqs_.end()) return;
    auto& r = *it->second;
    r.remaining -= count;
    if (r.remaining <= 0 && !r.done) {
      r.done = true;
      if (r.internal) {
        reqs_.erase(it);
        --internal_pending_;
      }
      req_cv_.notify_all();
    }
  }

  int64_t new_internal(int64_t remaining) {
    int64_t ts = next_ts_++;
    auto req = std::make_shared<Request>();
    req->remaining = remaining;
    req->internal = true;
    std::lock_guard<std::mutex> lk(req_mu_);
    reqs_[ts] = req;
    ++internal_pending_;
    return ts;
  }

  // ---------------------------------------------------------- messaging
  using OutKey = std::tuple<int, int32_t, int32_t, int64_t>;
  struct Outbox {
    std::map<OutKey, Builder> m;
    static constexpr int kCache = 4;  // handlers alternate between a few messages
    OutKey last[kCache];
    Builder* lb[kCache] = {nullptr, nullptr, nullptr, nullptr};
    int next = 0;
  };

  Builder& out(Outbox& ob, int dest, int32_t type, int32_t origin, int64_t ts) {
    OutKey key{dest, type, origin, ts};
    for (int i = 0; i < Outbox::kCache; ++i)
      if (ob.lb[i] && ob.last[i] == key) return *ob.lb[i];
    const int i = ob.next;
    ob.next = (i + 1) % Outbox::kCache;
    ob.last[i] = key;
    ob.lb[i] = &ob.m[key];
    return *ob.lb[i];
  }

  void add_key(Builder& b, int64_t k, int64_t pos, const char* val) {
    b.keys.push_back(k);
    b.pos.push_back(pos);
    if (val) b.vals.insert(b.vals.end(), val, val + len_[k] * isz_);
  }

  void flush(Outbox& ob) {
    for (auto& [key, b] : ob.m) {
      auto [dest, type, origin, ts] = key;
      send(dest, type, origin, ts, b);
    }
    ob.m.clear();
    for (auto& p : ob.lb) p = nullptr;
  }

  void send(int dest, int32_t type, int32_t origin, int64_t ts, const Builder& b) {
    const int64_t n = static_cast<int64_t>(b.keys.size());
    const size_t bytes = sizeof(Hdr) + 2 * n * sizeof(int64_t) + b.vals.size();
    check<distkit::Error>(bytes < static_cast<size_t>(INT32_MAX), "kvps message of ", bytes,
                          " bytes exceeds 2 GiB; split the operation into smaller batches");
    auto buf = std::make_unique<std::vector<char>>(bytes);
    char* p = buf->data();
    Hdr h{type, origin, ts, n};
    std::memcpy(p, &h, sizeof(h));
    p += sizeof(h);
    if (n) std::memcpy(p, b.keys.data(), n * sizeof(int64_t));
    p += n * sizeof(int64_t);
    if (n) std::memcpy(p, b.pos.data(), n * sizeof(int64_t));
    p += n * sizeof(int64_t);
    if (!b.vals.empty()) std::memcpy(p, b.vals.data(), b.vals.size());
    MPI_Request r;
    distkit::mpi::check(MPI_Isend(buf->data(), static_cast<int>(bytes), MPI_BYTE, dest, kTag, comm_, &r), "MPI_Isend");
    sends_.push_back(r);
    send_bufs_.push_back(std::move(buf));
    if (dest != rank_ && bells_[dest]) ring(bells_[dest]);
  }

  void test_sends() {
    if (sends_.empty()) return;
    int outcount = 0;
    idx_.resize(sends_.size());
    distkit::mpi::check(
        MPI_Testsome(static_cast<int>(sends_.size()), sends_.data(), &outcount, idx_.data(), MPI_STATUSES_IGNORE),
        "MPI_Testsome");
    if (outcount <= 0) return;
    size_t w = 0;
    for (size_t i = 0; i < sends_.size(); ++i) {
      if (sends_[i] == MPI_REQUEST_NULL) continue;
      sends_[w] = sends_[i];
      send_bufs_[w] = std::move(send_bufs_[i]);
      ++w;
    }
    sends_.resize(w);
    send_bufs_.resize(w);
  }

  // --------------------------------------------------------- progress loop
  void loop() {
    if (prof_) prof_cpu0_ = cpu_now();
    int idle = 0;
    std::vector<char> rbuf;
    try {
      while (running_.load() || !sends_.empty()) {
        bool did = false;
        if (has_cmds_.load()) {
          std::deque<Cmd> cmds;
          {
            std::lock_guard<std::mutex> lk(cmd_mu_);
            cmds.swap(cmds_);
            has_cmds_.store(false);
          }
          for (auto& c : cmds) {
            auto t0 = std::chrono::steady_clock::now();
            if (prof_) prof_cpu_ = cpu_now();
            handle_cmd(c);
            prof_add(c.type, t0, 0);
            did = true;
          }
        }
        for (int i = 0; i < 64; ++i) {
          int flag = 0;
          MPI_Status st;
          distkit::mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, &st), "MPI_Iprobe");
          if (!flag) break;
          int count = 0;
          MPI_Get_count(&st, MPI_BYTE, &count);
          rbuf.resize(static_cast<size_t>(count));
          distkit::mpi::check(MPI_Recv(rbuf.data(), count, MPI_BYTE, st.MPI_SOURCE, kTag, comm_, MPI_STATUS_IGNORE),
                              "MPI_Recv");
          // a large (rendezvous) send completes at its sender only once the
          // sender polls again: wake it
          if (count > 4096 && st.MPI_SOURCE != rank_ && bells_[st.MPI_SOURCE]) ring(bells_[st.MPI_SOURCE]);
          auto t0 = std::chrono::steady_clock::now();
          if (prof_) prof_cpu_ = cpu_now();
          handle_msg(st.MPI_SOURCE, rbuf.data());
          int32_t mt;
          std::memcpy(&mt, rbuf.data(), 4);
          prof_add(mt, t0, count);
          did = true;
        }
        test_sends();
        check_sync_waiters();
        if (did) {
          idle = 0;
          continue;
        }
        if (!running_.load()) {
          // draining the last sends of a stopped engine (bounded: a peer that
          // is gone never completes a large send)
          if (drain_start_.time_since_epoch().count() == 0) drain_start_ = std::chrono::steady_clock::now();
          if (std::chrono::steady_clock::now() - drain_start_ > std::chrono::seconds(failed_ ? 1 : 10)) break;
          if (!sends_.empty()) futex_wait(&mybell_->seq, mybell_->seq.load(), 50);
          continue;
        }
        if (++idle < 8) continue;  // a short spin catches replies in flight
        // sleep until a worker posts a command or a node-local peer sends a
        // message (both ring the doorbell); peers on other nodes and pending
        // large sends are polled on a timeout
        mybell_->sleeping.store(1, std::memory_order_seq_cst);
        const uint32_t seq = mybell_->seq.load(std::memory_order_seq_cst);
        int flag = 0;
        distkit::mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
        if (!flag && !has_cmds_.load() && running_.load()) {
          futex_wait(&mybell_->seq, seq, sends_.empty() ? idle_timeout_us_ : 50);
        }
        mybell_->sleeping.store(0, std::memory_order_seq_cst);
        idle = 0;
      }
      if (prof_) prof_total_ = cpu_now() - prof_cpu0_;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(req_mu_);
      error_ = std::string("kvps progress engine failed: ") + e.what();
      failed_ = true;
      std::fprintf(stderr, "kvps rank %d: progress engine failed: %s\n", rank_, e.what());
      req_cv_.notify_all();
    }
  }

  static double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
  }
  void prof_add(int32_t t, std::chrono::steady_clock::time_point t0, int64_t bytes) {
    if (!prof_) return;
    auto& e = prof_tab_[t];
    e[0] += 1;
    e[1] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6;
    e[2] += bytes;
    const double c = cpu_now();
    e[3] += c - prof_cpu_;
    prof_cpu_ = c;
  }
  void prof_print() {
    if (!prof_) return;
    for (auto& [t, e] : prof_tab_)
      std::fprintf(stderr, "kvps prof rank %d type %d: n=%.0f us=%.0f cpu_us=%.0f bytes=%.0f\n", rank_, t, e[0], e[1],
                   e[3], e[2]);
    std::fprintf(stderr, "kvps prof rank %d: progress thread cpu total %.0f us\n", rank_, prof_total_);
    prof_tab_.clear();
    if (!lat_.empty()) {
      std::sort(lat_.begin(), lat_.end());
      auto q = [&](double f) { return lat_[static_cast<size_t>(f * (lat_.size() - 1))] * 1e3; };
      std::fprintf(stderr, "kvps prof rank %d: %zu relocations notice->handover ms p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
                   rank_, lat_.size(), q(0.5), q(0.9), q(0.99), q(1.0));
      lat_.clear();
    }
  }

  void check_sync_waiters() {
    if (sync_waiters_.empty()) return;
    int64_t pending;
    {
      std::lock_guard<std::mutex> lk(req_mu_);
      pending = internal_pending_;
    }
    if (pending || noticed_pending_) return;
    auto w = std::move(sync_waiters_);
    sync_waiters_.clear();
    for (int64_t ts : w) complete(ts, 1);
  }

  void handle_cmd(Cmd& c) {
    Outbox ob;
    if (c.type == M_PULL || c.type == M_PUSH || c.type == M_SET) {
      const char* v = c.vals.data();
      const int64_t nk = static_cast<int64_t>(c.keys.size());
      for (int64_t i = 0; i < nk; ++i) {
        ahead(c.keys.data(), nk, i, false);
        int64_t k = c.keys[i];
        add_key(out(ob, meta_[k].hint, c.type, rank_, c.ts), k, c.pos[i], c.type == M_PULL ? nullptr : v);
        if (c.type != M_PULL) v += len_[k] * isz_;
      }
    } else if (c.type == C_LOCALIZE) {
      start_localize(c.keys, c.ts, ob);
    } else if (c.type == C_DUMP) {
      dump();
    } else if (c.type == C_BYE) {
      for (int d = 0; d < size_; ++d)
        if (d != rank_) send(d, M_BYE, rank_, 0, Builder{});
      bye_sent_ = true;
    } else if (c.type == C_INTENT) {
      pending_intents_[c.worker].insert({c.a, IntentEntry{c.a, c.b, std::move(c.keys)}});
      process_intents(c.worker, ob);
    } else if (c.type == C_SYNC) {
      if (c.a == 1) {
        do_reset();
        complete(c.ts, 1);
        return;
      }
      for (int w = 0; w < num_workers_; ++w) process_intents(w, ob);
      // advance_clock refreshes replicas every sync_every clocks; wait_sync always
      if (c.worker < 0 || (c.a - 2) % sync_every_ == 0) sync_replicas(ob);
      if (c.ts >= 0) sync_waiters_.push_back(c.ts);
      if (c.worker >= 0) {
        complete_done();
        flush(ob);
        {
          std::lock_guard<std::mutex> lk(clock_mu_);
          synced_[c.worker].store(c.a - 2);
        }
        clock_cv_.notify_all();
        return;
      }
    }
    complete_done();
    flush(ob);
  }

  void dump() {
    std::fprintf(stderr,
                 "kvps rank %d: %zu keys with queued ops, %zu keys awaited, %lld noticed keys awaited, %zu replicas, "
                 "%zu sync waiters\n",
                 rank_, pending_.size(), waiters_.size(), static_cast<long long>(noticed_pending_), rlist_.size(),
                 sync_waiters_.size());
    int shown = 0;
    for (auto& [k, ops] : pending_) {
      if (++shown > 5) break;
      std::fprintf(stderr, "  key %lld state %d flags %d: %zu queued ops (first type %d from %d)\n",
                   static_cast<long long>(k), meta_[k].state, meta_[k].flags, ops.size(), ops[0].type, ops[0].origin);
    }
    shown = 0;
    for (auto& [k, ts] : waiters_) {
      if (++shown > 5) break;
      std::fprintf(stderr, "  key %lld state %d flags %d awaited by %zu requests, home %d owner-dir %d hint %d\n",
                   static_cast<long long>(k), meta_[k].state, meta_[k].flags, ts.size(), home(k), meta_[k].owner, meta_[k].hint);
    }
    std::lock_guard<std::mutex> lk(req_mu_);
    shown = 0;
    for (auto& [ts, r] : reqs_) {
      if (r->done || ++shown > 8) continue;
      std::fprintf(stderr, "  request %lld remaining %lld internal %d worker %d\n", static_cast<long long>(ts),
                   static_cast<long long>(r->remaining), int(r->internal), r->worker);
    }
  }

  // keys: unique; ts: request to complete once per key.
  void start_localize(const std::vector<int64_t>& keys, int64_t ts, Outbox& ob) {
    int64_t already = 0;
    for (int64_t k : keys) {
      auto& l = lock_of(k);
      l.lock();
      uint8_t st = meta_[k].state;
      if (st == OWNED) {
        l.unlock();
        ++already;
        continue;
      }
      const bool was_incoming = st == INCOMING || (meta_[k].flags & F_INCOMING);
      if (!was_incoming) {
        // a replica keeps serving local reads/pushes until the value arrives
        if (st == REPLICA) {
          meta_[k].flags |= F_INCOMING;
        } else {
          meta_[k].state = INCOMING;
        }
      }
      l.unlock();
      waiters_[k].push_back(ts);
      if (!was_incoming) add_key(out(ob, home(k), M_LOCALIZE, rank_, 0), k, 0, nullptr);
    }
    if (already) complete(ts, already);
  }

  void process_intents(int w, Outbox& ob) {
    const int64_t c = clocks_[w].load();
    const bool quiet = tech_ == T_ALL || tech_ == T_REPL_ONLY;
    std::vector<int64_t> add, drop;
    auto& pend = pending_intents_[w];
    auto& act = active_intents_[w];
    while (!pend.empty() && pend.begin()->first <= c + lookahead_) {
      IntentEntry e = std::move(pend.begin()->second);
      pend.erase(pend.begin());
      if (e.end <= c) continue;
      const int64_t ne = static_cast<int64_t>(e.keys.size());
      for (int64_t i = 0; i < ne; ++i) {
        ahead(e.keys.data(), ne, i, false);
        const int64_t k = e.keys[i];
        if (meta_[k].want++ != 0) continue;
        if (quiet && meta_[k].state == OWNED) {  // (state: written by this thread only)
          // held here already: no need to tell the home. Should another
          // rank's intent move the key away, the transfer leaves a replica
          // here while this rank still wants it (see serve(M_TRANSFER)).
          meta_[k].flags |= F_QUIET;
        } else {
          add.push_back(k);
        }
      }
      int64_t end = e.end;
      act.insert({end, std::move(e)});
    }
    while (!act.empty() && act.begin()->first <= c) {
      IntentEntry e = std::move(act.begin()->second);
      act.erase(act.begin());
      const int64_t ne = static_cast<int64_t>(e.keys.size());
      for (int64_t i = 0; i < ne; ++i) {
        ahead(e.keys.data(), ne, i, false);
        const int64_t k = e.keys[i];
        if (--meta_[k].want == 0) drop.push_back(k);
      }
    }
    if (!add.empty()) send_intent(M_INTENT_ADD, add, ob);
    if (!drop.empty()) {
      std::vector<int64_t> flushk;
      std::vector<int64_t> told;  // drops the home must hear of (it heard of the add)
      for (int64_t k : drop) {
        if (meta_[k].want != 0) continue;  // re-added in this round
        if (meta_[k].flags & F_QUIET) {
          meta_[k].flags &= ~F_QUIET;
        } else {
          told.push_back(k);
        }
        auto& l = lock_of(k);
        l.lock();
        if (meta_[k].state == REPLICA && !(meta_[k].flags & F_INCOMING)) {
          meta_[k].state = NOT_HERE;
          meta_[k].flags &= ~F_DELTA;
          if (meta_[k].dirty) {  // a clean replica has nothing to give back
            meta_[k].dirty = 0;
            flushk.push_back(k);
            Builder& b = flush_builder_;
            add_key(b, k, 0, delta_.data() + off_[k] * isz_);
            std::memset(delta_.data() + off_[k] * isz_, 0, len_[k] * isz_);
          }
        }
        l.unlock();
      }
      if (!flushk.empty()) {
        // route each flushed delta to its hinted owner as an internal push
        std::map<int, Builder> per;
        const char* v = flush_builder_.vals.data();
        for (int64_t k : flushk) {
          add_key(per[meta_[k].hint], k, 0, v);
          v += len_[k] * isz_;
        }
        flush_builder_ = Builder{};
        for (auto& [dest, b] : per) {
          int64_t ts = new_internal(static_cast<int64_t>(b.keys.size()));
          Builder& o = out(ob, dest, M_IPUSH, rank_, ts);
          o.keys.insert(o.keys.end(), b.keys.begin(), b.keys.end());
          o.pos.insert(o.pos.end(), b.pos.begin(), b.pos.end());
          o.vals.insert(o.vals.end(), b.vals.begin(), b.vals.end());
        }
      }
      if (!told.empty()) send_intent(M_INTENT_DROP, told, ob);
    }
  }

  void send_intent(int32_t type, const std::vector<int64_t>& keys, Outbox& ob) {
    std::vector<Builder*> per(size_, nullptr);
    for (int64_t k : keys) {
      const int d = home(k);
      if (!per[d]) {
        per[d] = &out(ob, d, type, rank_, new_internal(1));
        per[d]->keys.reserve(keys.size() / size_ + 16);
        per[d]->pos.reserve(keys.size() / size_ + 16);
      }
      per[d]->keys.push_back(k);
      per[d]->pos.push_back(0);
    }
  }

  /// Replica refresh: a replica pushed since its last sync ships its delta
  /// (the owner answers with the new value); a clean one sends only its
  /// version, and the owner answers with the value only if it changed.
  void sync_replicas(Outbox& ob) {
    if (rlist_.empty()) return;
    std::map<int, Builder> dirty, clean;
    size_t w = 0;
    for (size_t i = 0; i < rlist_.size(); ++i) {  // drop keys that stopped being replicas
      const int64_t k = rlist_[i];
      if (meta_[k].state == REPLICA) {
        rlist_[w++] = k;
      } else {
        meta_[k].in_rlist = 0;
      }
    }
    rlist_.resize(w);
    for (int64_t k : rlist_) {
      if (meta_[k].flags & (F_SYNCING | F_INCOMING)) continue;
      auto& l = lock_of(k);
      l.lock();
      if (meta_[k].state == REPLICA) {
        meta_[k].flags |= F_SYNCING;
        if (meta_[k].dirty) {
          meta_[k].dirty = 0;
          char* d = delta_.data() + off_[k] * isz_;
          add_key(dirty[meta_[k].hint], k, meta_[k].ver, d);
          std::memset(d, 0, len_[k] * isz_);
        } else {
          add_key(clean[meta_[k].hint], k, meta_[k].ver, nullptr);
        }
      }
      l.unlock();
    }
    for (auto* per : {&dirty, &clean}) {
      for (auto& [dest, b] : *per) {
        int64_t ts = new_internal(static_cast<int64_t>(b.keys.size()));
        Builder& o = out(ob, dest, per == &dirty ? M_RSYNC : M_RCHECK, rank_, ts);
        o = std::move(b);
      }
    }
  }

  void do_reset() {
    for (int64_t k = 0; k < num_keys_; ++k) {
      int h = home(k);
      meta_[k].hint = h;
      meta_[k].owner = h;
      meta_[k].state = h == rank_ ? OWNED : NOT_HERE;
      meta_[k].flags = 0;
      meta_[k].want = 0;
      if (h != rank_) {
        // drop stale replica/foreign values so the arena does not keep pages
        std::memset(delta_.data() + off_[k] * isz_, 0, len_[k] * isz_);
      }
    }
    noticed_pending_ = 0;
    rlist_.clear();
    for (int64_t k = 0; k < num_keys_; ++k) meta_[k].in_rlist = 0;
    intenders_.clear();
    for (int64_t k = 0; k < num_keys_; ++k) {
      meta_[k].imask = 0;
      meta_[k].dirty = 0;
    }
    waiters_.clear();
    pending_.clear();
    for (auto& p : pending_intents_) p.clear();
    for (auto& a : active_intents_) a.clear();
  }

  // -------------------------------------------------------- message handling
  void handle_msg(int src, const char* buf) {
    Hdr h;
    std::memcpy(&h, buf, sizeof(h));
    const int64_t* keys = reinterpret_cast<const int64_t*>(buf + sizeof(Hdr));
    const int64_t* pos = keys + h.n;
    const char* v = reinterpret_cast<const char*>(pos + h.n);
    Outbox ob;
    switch (h.type) {
      case M_PULL:
      case M_PUSH:
      case M_SET:
      case M_IPUSH:
      case M_FETCH:
      case M_RSYNC:
      case M_RCHECK:
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, h.type != M_RCHECK);
          const int64_t k = keys[i];
          serve(h.type, h.origin, h.ts, pos[i], k, carries_values(h.type) ? v : nullptr, ob);
          if (carries_values(h.type)) v += len_[k] * isz_;
        }
        break;
      case M_PULL_RESP: {
        std::shared_ptr<Request> req;
        {
          std::lock_guard<std::mutex> lk(req_mu_);
          auto it = reqs_.find(h.ts);
          if (it != reqs_.end()) req = it->second;
        }
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, false);
          const int64_t k = keys[i];
          if (req) std::memcpy(req->out + req->out_off[pos[i]], v, len_[k] * isz_);
          v += len_[k] * isz_;
          meta_[k].hint = src;
        }
        complete(h.ts, h.n);
        break;
      }
      case M_ACK:
        for (int64_t i = 0; i < h.n; ++i) meta_[keys[i]].hint = src;
        complete(h.ts, h.n);
        break;
      case M_FETCH_RESP:
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, true);
          const int64_t k = keys[i];
          meta_[k].hint = src;
          meta_[k].flags &= ~F_FETCHING;
          auto& l = lock_of(k);
          l.lock();
          if (meta_[k].state == NOT_HERE && meta_[k].want > 0 && !shutting_down_) {
            std::memcpy(vbase_ + off_[k] * isz_, v, len_[k] * isz_);
            std::memset(delta_.data() + off_[k] * isz_, 0, len_[k] * isz_);
            meta_[k].ver = static_cast<uint32_t>(pos[i]);
            meta_[k].dirty = 0;
            meta_[k].flags |= F_DELTA;
            meta_[k].state = REPLICA;
            add_replica(k);
          }
          l.unlock();
          v += len_[k] * isz_;
        }
        complete(h.ts, h.n);
        break;
      case M_RSYNC_RESP:
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, true);
          const int64_t k = keys[i];
          meta_[k].hint = src;
          meta_[k].flags &= ~F_SYNCING;
          auto& l = lock_of(k);
          l.lock();
          if (meta_[k].state == REPLICA) {
            char* slot = vbase_ + off_[k] * isz_;
            std::memcpy(slot, v, len_[k] * isz_);
            add_(slot, delta_.data() + off_[k] * isz_, len_[k]);  // local pushes since the request
            meta_[k].ver = static_cast<uint32_t>(pos[i]);
          }
          l.unlock();
          v += len_[k] * isz_;
        }
        complete(h.ts, h.n);
        break;
      case M_BYE: {
        std::lock_guard<std::mutex> lk(req_mu_);
        if (!failed_) {
          error_ = str("kvps rank ", src, " exited without calling Server.shutdown(): the parameter server lost ",
                       "its shard, so pending and further operations on rank ", rank_, " fail");
          failed_ = true;
        }
        req_cv_.notify_all();
        break;
      }
      case M_RCHECK_RESP:
        for (int64_t i = 0; i < h.n; ++i) {
          meta_[keys[i]].hint = src;
          meta_[keys[i]].flags &= ~F_SYNCING;
        }
        complete(h.ts, h.n);
        break;
      case M_LOCALIZE:
        for (int64_t i = 0; i < h.n; ++i) {
          const int64_t k = keys[i];
          // already on its way to the requester (an intent relocated it): its
          // handover completes the requester's wait
          if (meta_[k].owner == h.origin) continue;
          const int prev = meta_[k].owner;
          meta_[k].owner = h.origin;
          if (prev == rank_) {
            serve(M_TRANSFER, h.origin, 0, h.origin, k, nullptr, ob);
          } else {
            add_key(out(ob, prev, M_TRANSFER, rank_, 0), k, h.origin, nullptr);
          }
        }
        break;
      case M_TRANSFER:
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, true);
          serve(M_TRANSFER, static_cast<int32_t>(pos[i]), 0, pos[i], keys[i], nullptr, ob);
        }
        break;
      case M_HANDOVER:
        for (int64_t i = 0; i < h.n; ++i) {
          ahead(keys, h.n, i, true);
          const int64_t k = keys[i];
          handover(k, v, static_cast<uint32_t>(pos[i]), ob);
          v += len_[k] * isz_;
        }
        break;
      case M_INTENT_ADD:
      case M_INTENT_DROP:
        home_intent(h.type, h.origin, keys, h.n, ob);
        flush(ob);  // grants must reach the ranks before the ack (FIFO per source)
        add_key(out(ob, h.origin, M_INTENT_ACK, rank_, h.ts), 0, 0, nullptr);
        break;
      case M_INTENT_ACK:
        complete(h.ts, 1);
        break;
      case M_RELOC_NOTICE: {
        mark_incoming(keys, h.n);
        break;
      }
      case M_REPL_GRANT: {
        std::map<int, std::vector<int64_t>> per;
        for (int64_t i = 0; i < h.n; ++i) {
          const int64_t k = keys[i];
          if (shutting_down_ || meta_[k].want == 0 || (meta_[k].flags & F_FETCHING)) continue;
          if (key_state(k) != NOT_HERE) continue;
          meta_[k].flags |= F_FETCHING;
          per[meta_[k].hint].push_back(k);
        }
        for (auto& [dest, ks] : per) {
          int64_t ts = new_internal(static_cast<int64_t>(ks.size()));
          Builder& b = out(ob, dest, M_FETCH, rank_, ts);
          for (int64_t k : ks) add_key(b, k, 0, nullptr);
        }
        break;
      }
      default:
        throw distkit::Error(str("kvps: unknown message type ", h.type, " from rank ", src));
    }
    complete_done();
    flush(ob);
  }

  // --- who intends each home key (a bit mask per key for <= 64 ranks)
  void intender_add(int64_t k, int r) {
    if (use_mask_) {
      meta_[k].imask |= uint64_t(1) << r;
    } else {
      intenders_[k].push_back(r);
    }
  }
  void intender_remove(int64_t k, int r) {
    if (use_mask_) {
      meta_[k].imask &= ~(uint64_t(1) << r);
      return;
    }
    auto it = intenders_.find(k);
    if (it == intenders_.end()) return;
    auto& v = it->second;
    auto p = std::find(v.begin(), v.end(), r);
    if (p != v.end()) v.erase(p);
    if (v.empty()) intenders_.erase(it);
  }
  int intender_count(int64_t k) {
    if (use_mask_) return __builtin_popcountll(meta_[k].imask);
    auto it = intenders_.find(k);
    return it == intenders_.end() ? 0 : static_cast<int>(it->second.size());
  }
  template <class F>
  void for_intenders(int64_t k, F&& f) {
    if (use_mask_) {
      for (uint64_t m = meta_[k].imask; m; m &= m - 1) f(__builtin_ctzll(m));
      return;
    }
    auto it = intenders_.find(k);
    if (it != intenders_.end())
      for (int q : it->second) f(q);
  }

  /// The home moved these keys to this rank; their handover is on the way
  /// (or already here: then the key is OWNED and nothing is to do).
  void mark_incoming(const int64_t* keys, int64_t n) {
    std::vector<int64_t> inc;
    for (int64_t i = 0; i < n; ++i) {
      ahead(keys, n, i, false);
      const int64_t k = keys[i];
      auto& l = lock_of(k);
      l.lock();
      const uint8_t st = meta_[k].state;
      if (st == NOT_HERE) {
        meta_[k].state = INCOMING;
        inc.push_back(k);
      } else if (st == REPLICA && !(meta_[k].flags & F_INCOMING)) {
        meta_[k].flags |= F_INCOMING;  // keeps serving locally until the value arrives
        inc.push_back(k);
      }
      l.unlock();
    }
    if (prof_) {
      if (inc_t_.empty()) inc_t_.assign(num_keys_, 0.0);
      const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      for (int64_t k : inc) inc_t_[k] = now;
    }
    // wait_sync waits until every noticed key arrived (a counter, no per-key request)
    for (int64_t k : inc) meta_[k].flags |= F_NOTICED;
    noticed_pending_ += static_cast<int64_t>(inc.size());
  }

  /// Home: move key k to rank r now. The new owner learns it from a notice
  /// that precedes (FIFO) every operation the home forwards to it afterwards;
  /// the current owner hands the value over directly.
  void relocate(int64_t k, int r, Outbox& ob) {
    const int prev = meta_[k].owner;
    meta_[k].owner = r;
    if (r == rank_) {
      mark_incoming(&k, 1);  // not through a message to self: serve() below must see it
    } else {
      add_key(out(ob, r, M_RELOC_NOTICE, rank_, 0), k, 0, nullptr);
    }
    if (prev == rank_) {
      serve(M_TRANSFER, r, 0, r, k, nullptr, ob);
    } else {
      add_key(out(ob, prev, M_TRANSFER, rank_, 0), k, r, nullptr);
    }
  }

  /// Home: give rank q a replica of k. When the home holds k itself it sends
  /// the value at once (no grant/fetch round trip); else q fetches it.
  void grant_replica(int64_t k, int q, Outbox& ob) {
    if (meta_[k].owner == rank_ && key_state(k) == OWNED) {
      serve(M_FETCH, q, -1, 0, k, nullptr, ob);
    } else {
      add_key(out(ob, q, M_REPL_GRANT, rank_, 0), k, 0, nullptr);
    }
  }

  void home_intent(int32_t type, int32_t r, const int64_t* keys, int64_t n, Outbox& ob) {
    const bool moving = !shutting_down_;
    for (int64_t i = 0; i < n; ++i) {
      ahead(keys, n, i, type == M_INTENT_ADD);  // (the home often holds the key and hands it over)
      const int64_t k = keys[i];
      if (type == M_INTENT_ADD) {
        intender_add(k, r);
        const int cnt = intender_count(k);
        if (!moving) continue;
        // (a rank that reaches the owner's shard in place needs no move)
        const int own = meta_[k].owner;
        if (tech_ == T_RELOC_ONLY) {
          if (cnt == 1 && !reaches(r, own)) relocate(k, r, ob);
        } else if (tech_ == T_REPL_ONLY) {
          if (!reaches(r, own)) grant_replica(k, r, ob);
        } else if (tech_ == T_ALL) {
          if (cnt == 1) {
            if (!reaches(r, own)) relocate(k, r, ob);
          } else {
            for_intenders(k, [&](int q) {
              if (!reaches(q, own)) grant_replica(k, q, ob);
            });
          }
        }
      } else {
        intender_remove(k, r);
        if (moving && tech_ == T_ALL && intender_count(k) == 1) {
          int q = -1;
          for_intenders(k, [&](int x) { q = x; });
          if (!reaches(q, meta_[k].owner)) relocate(k, q, ob);
        }
      }
    }
  }

  /// Serve, queue or forward one key-level operation.
  void serve(int32_t type, int32_t origin, int64_t ts, int64_t pos, int64_t k, const char* val, Outbox& ob) {
    auto& l = lock_of(k);
    l.lock();
    const uint8_t st = meta_[k].state;
    char* slot = vbase_ + off_[k] * isz_;
    const size_t bytes = static_cast<size_t>(len_[k] * isz_);
    if (st == OWNED) {
      switch (type) {
        case M_PULL:
          add_key(out(ob, origin, M_PULL_RESP, rank_, ts), k, pos, slot);
          break;
        case M_FETCH:
          add_key(out(ob, origin, M_FETCH_RESP, rank_, ts), k, meta_[k].ver, slot);
          break;
        case M_PUSH:
        case M_IPUSH:
          add_(slot, val, len_[k]);
          ++meta_[k].ver;
          add_key(out(ob, origin, M_ACK, rank_, ts), k, pos, nullptr);
          break;
        case M_SET:
          std::memcpy(slot, val, bytes);
          ++meta_[k].ver;
          add_key(out(ob, origin, M_ACK, rank_, ts), k, pos, nullptr);
          break;
        case M_RSYNC:
          add_(slot, val, len_[k]);
          ++meta_[k].ver;
          add_key(out(ob, origin, M_RSYNC_RESP, rank_, ts), k, meta_[k].ver, slot);
          break;
        case M_RCHECK:
          if (static_cast<uint32_t>(pos) == meta_[k].ver) {
            add_key(out(ob, origin, M_RCHECK_RESP, rank_, ts), k, 0, nullptr);
          } else {
            add_key(out(ob, origin, M_RSYNC_RESP, rank_, ts), k, meta_[k].ver, slot);
          }
          break;
        case M_TRANSFER:
          add_key(out(ob, origin, M_HANDOVER, rank_, 0), k, meta_[k].ver, slot);
          meta_[k].hint = origin;
          if (meta_[k].want > 0 && (tech_ == T_ALL || tech_ == T_REPL_ONLY) && !shutting_down_) {
            // still intended here: keep the value as a replica of the new owner
            std::memset(delta_.data() + off_[k] * isz_, 0, bytes);
            meta_[k].dirty = 0;
            meta_[k].flags |= F_DELTA;
            meta_[k].state = REPLICA;
            add_replica(k);
          } else {
            meta_[k].state = NOT_HERE;
          }
          break;
        default:
          break;
      }
      l.unlock();
      return;
    }
    const bool incoming = st == INCOMING || (meta_[k].flags & F_INCOMING);
    l.unlock();
    if (incoming) {
      PendingOp p{type, origin, ts, pos, {}};
      if (val) p.val.assign(val, val + bytes);
      pending_[k].push_back(std::move(p));
      return;
    }
    if (type == M_TRANSFER) {
      throw distkit::Error(str("kvps: transfer of key ", k, " reached rank ", rank_, " which does not hold it"));
    }
    const int next = home(k) == rank_ ? meta_[k].owner : home(k);
    if (next == rank_) throw distkit::Error(str("kvps: routing loop for key ", k, " on rank ", rank_));
    add_key(out(ob, next, type, origin, ts), k, pos, val);
  }

  void add_replica(int64_t k) {
    if (!meta_[k].in_rlist) {
      meta_[k].in_rlist = 1;
      rlist_.push_back(k);
    }
  }

  /// Complete the requests collected in done_ (one lock per request, not per key).
  void complete_done() {
    if (done_.empty()) return;
    std::sort(done_.begin(), done_.end());
    for (size_t i = 0; i < done_.size();) {
      size_t j = i;
      while (j < done_.size() && done_[j] == done_[i]) ++j;
      complete(done_[i], static_cast<int64_t>(j - i));
      i = j;
    }
    done_.clear();
  }

  void handover(int64_t k, const char* v, uint32_t ver, Outbox& ob) {
    auto& l = lock_of(k);
    l.lock();
    char* slot = vbase_ + off_[k] * isz_;
    std::memcpy(slot, v, len_[k] * isz_);
    if (prof_ && !inc_t_.empty() && inc_t_[k] > 0) {
      const double now = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
      lat_.push_back(now - inc_t_[k]);
      inc_t_[k] = 0;
    }
    if (meta_[k].flags & F_NOTICED) {
      meta_[k].flags &= ~F_NOTICED;
      --noticed_pending_;
    }
    meta_[k].ver = ver + 1;  // versions travel with the value (+1: a local delta may be added)
    meta_[k].dirty = 0;
    if (meta_[k].flags & F_DELTA) {
      char* d = delta_.data() + off_[k] * isz_;
      add_(slot, d, len_[k]);
      std::memset(d, 0, len_[k] * isz_);
    }
    meta_[k].flags &= ~(F_DELTA | F_INCOMING);
    meta_[k].state = OWNED;
    meta_[k].hint = rank_;
    l.unlock();
    if (!waiters_.empty()) {
      auto w = waiters_.find(k);
      if (w != waiters_.end()) {
        for (int64_t t : w->second) done_.push_back(t);
        waiters_.erase(w);
      }
    }
    auto p = pending_.empty() ? pending_.end() : pending_.find(k);
    if (p != pending_.end()) {
      auto ops = std::move(p->second);
      pending_.erase(p);
      for (auto& op : ops) serve(op.type, op.origin, op.ts, op.pos, k, op.val.empty() ? nullptr : op.val.data(), ob);
    }
  }

  static constexpr uint8_t F_DELTA = 1, F_FETCHING = 2, F_SYNCING = 4, F_INCOMING = 8, F_NOTICED = 16,
                          F_QUIET = 32;  // F_QUIET: an intent the home was not told of
  int64_t noticed_pending_ = 0;  // keys the home moved here whose value has not arrived

  MPI_Comm comm_, coll_;
  int rank_ = 0, size_ = 1;
  int64_t num_keys_;
  distkit::DType dtype_;
  int64_t isz_ = 4;
  int num_workers_;
  int tech_;
  int64_t lookahead_;
  int64_t sync_every_;
  bool uniform_ = true;
  std::vector<int64_t> len_, off_;
  Arena vals_, delta_;
  /// Everything the protocol keeps per key, in one 32-byte record: a key's
  /// handling touches one cache line instead of ten scattered arrays.
  struct Meta {
    SpinLock lock;          // guards state, dirty and the key's value/delta
    uint8_t state = NOT_HERE;
    uint8_t flags = 0;      // progress thread only
    uint8_t dirty = 0;      // replica pushed locally since its last sync
    uint8_t in_rlist = 0;   // listed in rlist_
    uint16_t want = 0;      // active intents of this rank's workers
    int32_t hint = 0;       // where requests go (a routing hint)
    int32_t owner = 0;      // home: the current owner (the truth)
    uint32_t ver = 0;       // version of the value held here (owner: bumped by every update)
    uint64_t imask = 0;     // home: intending ranks (size <= 64)
  };
  Meta* meta_ = nullptr;              // this rank's records (in its shared segment when shared)
  std::unique_ptr<Meta[]> meta_own_;  // ... or here
  char* vbase_ = nullptr;             // this rank's value arena (shared segment or vals_)
  std::vector<Meta*> pmeta_;          // node-local peers' records (nullptr: not shared)
  std::vector<char*> pvals_;          // node-local peers' value arenas
  bool any_peer_data_ = false;
  std::vector<uint8_t> reach_;  // reach_[a * size + b]: rank a serves keys of rank b's shard in place
  bool all_reach_ = false;      // every rank reaches every shard (one node, memory shared)
  bool reaches(int a, int b) const { return reach_[static_cast<size_t>(a) * size_ + b] != 0; }
  std::atomic<int64_t> n_local_{0}, n_shared_{0}, n_remote_{0};  // keys served, per path
  bool use_mask_ = true;

  void (*add_)(char*, const char*, int64_t) = nullptr;

  std::atomic<int64_t> next_ts_{0};
  std::mutex req_mu_;
  std::condition_variable req_cv_;
  std::unordered_map<int64_t, std::shared_ptr<Request>> reqs_;
  std::vector<std::vector<int64_t>> worker_ts_;
  int64_t internal_pending_ = 0;
  bool failed_ = false;
  std::string error_;

  std::mutex cmd_mu_;
  std::deque<Cmd> cmds_;
  std::atomic<bool> has_cmds_{false};

  std::vector<std::atomic<int64_t>> clocks_;
  std::vector<std::atomic<int64_t>> synced_;  // last clock whose sync round the engine ran, per worker
  std::mutex clock_mu_;
  std::condition_variable clock_cv_;
  std::vector<std::multimap<int64_t, IntentEntry>> pending_intents_, active_intents_;
  std::unordered_map<int64_t, std::vector<int32_t>> intenders_;
  std::unordered_map<int64_t, std::vector<int64_t>> waiters_;
  std::unordered_map<int64_t, std::vector<PendingOp>> pending_;
  std::vector<int64_t> rlist_;     // keys that are (or were lately) replicas here
  std::vector<int64_t> done_;      // completions collected over one message
  std::vector<int64_t> sync_waiters_;
  Builder flush_builder_;
  std::atomic<bool> shutting_down_{false};

  std::vector<MPI_Request> sends_;
  std::vector<std::unique_ptr<std::vector<char>>> send_bufs_;
  std::vector<int> idx_;

  std::mutex wb_mu_;
  std::condition_variable wb_cv_;
  int wb_count_ = 0;
  uint64_t wb_gen_ = 0;

  std::atomic<bool> running_{false};
  std::atomic<bool> bye_sent_{false};
  std::thread thread_;
  distkit::ShmSegment bell_seg_;
  std::vector<distkit::ShmSegment> peer_segs_;
  std::vector<Doorbell*> bells_;
  Doorbell* mybell_ = nullptr;
  std::unique_ptr<Doorbell> own_bell_;
  long idle_timeout_us_ = 100;
  std::chrono::steady_clock::time_point drain_start_{};
  bool prof_ = std::getenv("KVPS_PROFILE") != nullptr;
  std::map<int32_t, std::array<double, 4>> prof_tab_;
  double prof_cpu_ = 0, prof_cpu0_ = 0, prof_total_ = 0;
  std::vector<double> inc_t_, lat_;
};

}  // namespace kvps
