// directory.hpp - who holds which key: the per-key record and the home's view.
//
// Every key has a home rank (key % size) whose record's `owner` is the truth
// about the key's current owner; every other rank keeps a routing `hint`. A
// rank's records may live in shared memory, where node-local peers take a
// key's lock and check `state` before they read or update the value in place.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <unordered_map>
#include <vector>

#include "keydiv.hpp"

namespace kvps {

/// A key's state on one rank (exported to Python as KEY_STATES).
enum State : uint8_t { NOT_HERE = 0, OWNED = 1, REPLICA = 2, INCOMING = 3 };

/// Per-key flags, touched by the progress thread only.
enum Flag : uint8_t {
  F_DELTA = 1,      // the delta arena holds updates to add when the key arrives (a replica turning owner)
  F_FETCHING = 2,   // a replica fetch is under way
  F_SYNCING = 4,    // a replica refresh is under way
  F_INCOMING = 8,   // a replica whose key is being relocated here
  F_NOTICED = 16,   // the home announced the key; wait_sync waits for its value
  F_UNTOLD = 32,    // this rank intends the key but did not tell the home (nothing to drop there)
  F_MOVED = 64,     // told the home to move the key here for a one-clock window; outcome not yet seen (ReuseModel)
  F_IN_RLIST = 128, // listed in the replica list
};

/// Per-key marks (Meta::marks), touched by the progress thread only.
enum Mark : uint8_t {
  K_TAKEN = 1,      // a key this rank held was taken away by another rank (contested: ReuseModel)
  K_LOCALIZED = 2,  // at the home: the current owner got the key by localize (it stays: Engine::on_give_back)
  K_KEEP = 4,       // at its owner: the key is used here again, or came for a longer window or by localize
                    // (it stays when intent pauses: Engine::give_back)
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

/// Everything the protocol keeps per key, in one 32-byte record: handling a
/// key touches one cache line instead of ten scattered arrays.
struct Meta {
  SpinLock lock;          // guards state, dirty and the key's value/delta
  uint8_t state = NOT_HERE;
  uint8_t flags = 0;      // Flag bits; progress thread only
  uint8_t dirty = 0;      // replica updated locally since its last refresh
  uint8_t plain = 0;      // this rank told the home of its intent without asking for a replica (intent.hpp)
  uint8_t marks = 0;      // Mark bits; progress thread only
  uint16_t want = 0;      // active intents of this rank's workers
  int32_t hint = 0;       // where requests go (a routing hint)
  uint32_t ver = 0;       // version of the value held here (owner: bumped by every update)
  uint32_t last = 0;      // 1 + the end clock of this rank's last intent window of the key (0: never)
  union {
    int32_t owner = 0;  // at the key's home: the current owner (the truth)
    int32_t slot;       // elsewhere: the key's slot in region B (store.hpp), -1: none
  };
  uint64_t imask = 0;     // home: intending ranks (size <= 64)

  // `hint` and `owner` are read without the key's lock, by this rank's workers and by
  // node-local peers (worker_ops.hpp, direct()), while the progress thread rewrites them:
  // every write is a relaxed atomic store to match those loads (a plain store on x86).
  void set_hint(int32_t r) { __atomic_store_n(&hint, r, __ATOMIC_RELAXED); }
  void set_owner(int32_t r) { __atomic_store_n(&owner, r, __ATOMIC_RELAXED); }
};
static_assert(sizeof(Meta) == 32, "one key record per half cache line");

/// The records of this rank plus the home's list of intending ranks.
class Directory {
 public:
  void init(Meta* meta, int64_t num_keys, int rank, int size) {
    meta_ = meta;
    num_keys_ = num_keys;
    rank_ = rank;
    size_ = size;
    kd_ = KeyDiv(size, num_keys);
    use_mask_ = size <= 64;
    reset();
  }

  Meta& operator[](int64_t k) const { return meta_[k]; }
  Meta* records() const { return meta_; }
  int home(int64_t k) const { return static_cast<int>(kd_.mod(k)); }
  bool is_home(int64_t k) const { return home(k) == rank_; }

  /// Every key back at its home, no intents, no replicas.
  void reset() {
    for (int64_t k = 0; k < num_keys_; ++k) {
      Meta& m = meta_[k];
      const int h = home(k);
      m.set_hint(h);
      if (h == rank_) {
        m.set_owner(h);
      } else {
        m.slot = -1;
      }
      m.state = h == rank_ ? OWNED : NOT_HERE;
      m.flags = 0;
      m.dirty = 0;
      m.want = 0;
      m.plain = 0;
      m.marks = 0;
      m.last = 0;
      m.imask = 0;
    }
    intenders_.clear();
  }

  int state_locked(int64_t k) const {
    Meta& m = meta_[k];
    m.lock.lock();
    const int s = m.state;
    m.lock.unlock();
    return s;
  }

  // --- the ranks intending each home key (a bit mask per key for <= 64 ranks)
  void intender_add(int64_t k, int r) {
    if (use_mask_) {
      meta_[k].imask |= uint64_t(1) << r;
    } else {
      auto& v = intenders_[k];
      if (std::find(v.begin(), v.end(), r) == v.end()) v.push_back(r);  // (a rank may tell twice)
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
  int intender_count(int64_t k) const {
    if (use_mask_) return __builtin_popcountll(meta_[k].imask);
    auto it = intenders_.find(k);
    return it == intenders_.end() ? 0 : static_cast<int>(it->second.size());
  }
  template <class F>
  void for_intenders(int64_t k, F&& f) const {
    if (use_mask_) {
      for (uint64_t m = meta_[k].imask; m; m &= m - 1) f(__builtin_ctzll(m));
      return;
    }
    auto it = intenders_.find(k);
    if (it != intenders_.end())
      for (int q : it->second) f(q);
  }

 private:
  Meta* meta_ = nullptr;
  int64_t num_keys_ = 0;
  int rank_ = 0, size_ = 1;
  KeyDiv kd_;
  bool use_mask_ = true;
  std::unordered_map<int64_t, std::vector<int32_t>> intenders_;
};

}  // namespace kvps
