// replicas.hpp - copies of keys owned elsewhere, and how they stay fresh.
//
// A replica answers local pulls and applies local pushes at once, recording
// them in its delta. Every sync round it is refreshed: a replica pushed since
// its last refresh ships its delta (the owner applies it and answers with its
// slot), a clean one sends only its version (the owner answers with its slot
// only if the version changed). Versions travel with values, so an unchanged
// replica costs a few bytes and no value traffic.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "directory.hpp"
#include "shard.hpp"
#include "wire.hpp"

namespace kvps {

class Replicas {
 public:
  /// Key k became a replica here: install `slot` (the owner's) at version `ver`.
  void install(Directory& dir, Shard& sh, int64_t k, const char* slot, uint32_t ver) {
    Meta& m = dir[k];
    sh.hold(k);
    std::memcpy(sh.slot(k), slot, sh.layout().slot_bytes(k));
    begin(m, sh, k, ver);
  }
  /// Key k, owned here, stays as a replica of its new owner (the value is already in place).
  void keep(Directory& dir, Shard& sh, int64_t k) { begin(dir[k], sh, k, dir[k].ver); }

  /// A refresh arrived: the owner's slot, plus this replica's updates made
  /// since the refresh was requested (still to be shipped next round).
  void refresh(Meta& m, Shard& sh, int64_t k, const char* slot, uint32_t ver) const {
    std::memcpy(sh.slot(k), slot, sh.layout().slot_bytes(k));
    if (m.dirty) sh.apply(k, sh.delta(k));
    m.ver = ver;
  }

  /// Refresh requests for every replica not being refreshed or relocated
  /// already: dirty ones (with their deltas) into `dirty`, clean ones (with
  /// their versions) into `clean`, one builder per owner hint.
  void collect(Directory& dir, Shard& sh, std::map<int, Builder>& dirty, std::map<int, Builder>& clean) {
    prune(dir);
    for (int64_t k : list_) {
      Meta& m = dir[k];
      if (m.flags & (F_SYNCING | F_INCOMING)) continue;
      m.lock.lock();
      if (m.state == REPLICA) {
        m.flags |= F_SYNCING;
        if (m.dirty) {
          m.dirty = 0;
          dirty[m.hint].put(k, m.ver, sh.delta(k), sh.layout().row_bytes(k));
          sh.clear_delta(k);
        } else {
          clean[m.hint].put(k, m.ver, nullptr, 0);
        }
      }
      m.lock.unlock();
    }
  }

  bool empty() const { return list_.empty(); }
  size_t listed() const { return list_.size(); }

  /// Replicas held now.
  int64_t count(Directory& dir) const {
    int64_t n = 0;
    for (int64_t k : list_) n += dir.state_locked(k) == REPLICA;
    return n;
  }

  void clear() { list_.clear(); }

 private:
  void begin(Meta& m, Shard& sh, int64_t k, uint32_t ver) {
    sh.clear_delta(k);
    m.ver = ver;
    m.dirty = 0;
    m.flags |= F_DELTA;
    m.state = REPLICA;
    if (!(m.flags & F_IN_RLIST)) {
      m.flags |= F_IN_RLIST;
      list_.push_back(k);
    }
  }

  /// Forget keys that stopped being replicas.
  void prune(Directory& dir) {
    size_t w = 0;
    for (size_t i = 0; i < list_.size(); ++i) {
      const int64_t k = list_[i];
      if (dir[k].state == REPLICA) {
        list_[w++] = k;
      } else {
        dir[k].flags &= static_cast<uint8_t>(~F_IN_RLIST);
      }
    }
    list_.resize(w);
  }

  std::vector<int64_t> list_;  // keys that are (or were lately) replicas here
};

}  // namespace kvps
