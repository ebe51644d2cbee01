// intent.hpp - intent windows: when they take effect, what the home does with them.
//
// A worker's intent for clocks [start, end) takes effect in the first intent
// round at or after clock start - lookahead. Intent rounds are the sync rounds
// of every intent_round_of() clocks: every clock on one node or for lookaheads
// below 8; with peers on other nodes a quarter of the lookahead, so that one
// round's intents from every step in between travel together: each home gets
// one message per round instead of one per step, and so does every transfer,
// notice, grant and drop that follows from them (between hosts the engine's
// CPU goes mostly to messages: README, Benchmarks). An intent still takes
// effect at least three quarters of the lookahead before its window. When it
// takes effect the rank tells each key's home (unless it holds
// the key already, or the cost model below leaves the key where it is), and
// the home relocates the key (one intending rank) or grants replicas
// (several). When the window ends the rank drops the intent; a replica with
// updates flushes them to the owner.
//
// The cost model. Moving a key here costs about as much engine work as one
// or two remote accesses (the intent at the home, the transfer and handover,
// the drop; README, Benchmarks); afterwards its accesses are local. So a move
// pays when the key will be used here at least twice before it leaves. A
// replica leaves when its window ends, unless its next intent here has taken
// effect by then: that is when the next window starts at most `lookahead`
// clocks after the last one ended. Such a key is recurring: it moves once and
// stays for both windows. A key whose next window comes later moves in and
// out for every window, one use per move. (A relocated key stays until
// another rank's intent takes it; an intent for a key held here moves
// nothing.) Expected uses: one per clock of the window,
// plus the windows of a recurring key. A window of two clocks or more, or a
// recurring key, moves. A key not recurring (fresh) with a one-clock window
// moves only if fresh keys of this rank usually recur, i.e. if the observed
// share of fresh keys intended again in time is at least one half. That share
// starts at 1 (every intent moves its keys, as AdaPM does) and follows the
// workload: the one-off tail keys of a skewed workload, and the keys that come
// back only after their last move was undone, stay at their owners and are
// accessed the classic way; the keys that recur move. A fresh key left in place
// that then recurs is moved at once.
//
// Replicas. With several intending ranks the home grants replicas, and a
// replica is refreshed every sync round from the round its intent takes effect
// to its drop: a key used every g-th clock costs about g refreshes per use,
// against one pull and one push at its owner. So a rank asks for a replica
// (M_INTENT_ADD, pos = 1) only for keys used every clock (a window of several
// clocks, or windows back to back: steady) or while most uses of the keys it
// replicates here are steady (ReuseModel::replicas_pay; at first they are, as
// AdaPM replicates every shared key). Otherwise it registers its intent
// without a replica, releases replicas it holds of keys that are not steady,
// and asks again when such a key turns steady. Relocations are unaffected.
#pragma once

#include "engine.hpp"

namespace kvps {

/// Records an intent of key record `m` for clocks [start, end): whether the
/// key recurs (its last window here ended at most horizon_ clocks before
/// `start`) and whether it is steady (that window ended at `start` or later).
inline ReuseModel::Seen ReuseModel::note(Meta& m, int64_t start, int64_t end) {
  // clocks + 1 (0 marks "never"), compared modulo 2^32
  const uint32_t s = static_cast<uint32_t>(start) + 1;
  const uint32_t e = static_cast<uint32_t>(end) + 1;
  const int32_t gap = static_cast<int32_t>(s - m.last);
  const bool recurs = m.last != 0 && gap <= horizon_;
  if (m.flags & F_FRESH) {
    m.flags &= static_cast<uint8_t>(~F_FRESH);
    if (recurs) fresh_.hit();  // a fresh key came back
  }
  if (!recurs) {
    m.flags |= F_FRESH;
    fresh_.event();
  }
  const bool steady = m.last != 0 && gap <= 0;
  if (m.last == 0 || static_cast<int32_t>(e - m.last) > 0) m.last = e;
  return {recurs, steady};
}

inline bool ReuseModel::worth_moving(int64_t window, bool recurs) const {
  return window >= 2 || recurs || fresh_.at_least_half();
}

inline void Engine::process_intents(int w, Outbox& ob) {
  const int64_t c = clocks_[w].load();
  const bool keep_owned = tech_ == T_ALL || tech_ == T_REPL_ONLY;
  std::vector<int64_t> add, drop;
  std::vector<uint8_t> drop_gated;  // per key of `drop`: its last window was one the ledger gates
  std::vector<uint8_t> add_replica;  // per key of `add`: ask for a replica where others intend it too
  std::map<int, Builder> flushes;    // per hinted owner: the updates of released replicas
  auto& pend = pending_intents_[w];
  auto& act = active_intents_[w];
  while (!pend.empty() && pend.begin()->first <= c + lookahead_) {
    IntentEntry e = std::move(pend.begin()->second);
    pend.erase(pend.begin());
    if (e.end <= c) continue;
    const int64_t window = e.end - e.start;
    const int64_t ne = static_cast<int64_t>(e.keys.size());
    for (int64_t i = 0; i < ne; ++i) {
      ahead(e.keys.data(), ne, i, false);
      const int64_t k = e.keys[i];
      Meta& m = meta_[k];
      ledger_.cost(k, IntentCosts::kWindow);
      const ReuseModel::Seen seen = reuse_.note(m, e.start, e.end);
      const bool recurs = seen.recurs;
      // A replica is refreshed every sync round while it lives, so it pays for a
      // key used every clock (a window of several clocks, or windows back to
      // back). For other keys it pays only while most uses of replicated keys
      // here are steady (ReuseModel::replicas_pay; true at first, as in AdaPM).
      // ("replication_only" keeps every replica: the user's choice)
      if (m.state == REPLICA || (m.plain && m.state == NOT_HERE)) reuse_.note_replica_use(seen.steady);
      const bool replica = tech_ != T_ALL || window >= 2 || seen.steady || reuse_.replicas_pay();
      auto tell = [&] {  // (told: its drop must reach the home too)
        ledger_.cost(k, IntentCosts::kTell);
        m.flags &= static_cast<uint8_t>(~F_UNTOLD);
        add.push_back(k);
        add_replica.push_back(replica);
        m.plain = !replica;
      };
      // (state: written by this thread only)
      if (m.want++ != 0) {
        if ((m.flags & F_UNTOLD) && recurs && m.state != OWNED) {
          tell();  // wanted already, but left at its owner: it recurs now, so move it
        } else if (m.plain && replica && m.state == NOT_HERE) {
          tell();  // told without a replica, and used every clock now: ask for one
        } else if (!replica && m.state == REPLICA && !(m.flags & F_INCOMING)) {
          release_replica(m, k, flushes);  // not used every clock: access it at its owner
          m.plain = 1;
        }
        continue;
      }
      if (keep_owned && m.state == OWNED) {
        // held here already: no need to tell the home. Should another
        // rank's intent move the key away, the transfer leaves a replica
        // here while this rank still wants it (see serve(M_TRANSFER)).
        m.flags |= F_UNTOLD;
      } else if (!reuse_.worth_moving(window, recurs)) {
        m.flags |= F_UNTOLD;  // accessed the classic way, at its owner
        ++n_classic_;
      } else {
        tell();
      }
    }
    const int64_t end = e.end;
    act.insert({end, std::move(e)});
  }
  while (!act.empty() && act.begin()->first <= c) {
    IntentEntry e = std::move(act.begin()->second);
    act.erase(act.begin());
    const int64_t ne = static_cast<int64_t>(e.keys.size());
    for (int64_t i = 0; i < ne; ++i) {
      ahead(e.keys.data(), ne, i, false);
      const int64_t k = e.keys[i];
      if (--meta_[k].want == 0) {
        drop.push_back(k);
        drop_gated.push_back(IntentLedger::gated(e.start, e.end));
      }
    }
  }
  send_flushes(flushes, ob);
  n_told_ += static_cast<int64_t>(add.size());
  if (!add.empty()) send_intent(M_INTENT_ADD, add, &add_replica, ob);
  if (!drop.empty()) drop_intents(drop, drop_gated, ob);
}

/// Intents that ended: replicas are dropped (their updates flushed to the
/// owner), and the home hears of the drops of intents it was told of. While
/// intent does not pay (ledger.hpp) a drop of a key the ledger held back
/// (`gated`, not a probe key, not localized here) says so (pos = 1): the home
/// moves the key back (home_intent).
inline void Engine::drop_intents(const std::vector<int64_t>& drop, const std::vector<uint8_t>& gated,
                                 Outbox& ob) {
  std::map<int, Builder> flushes;  // per hinted owner: the updates of dropped replicas
  std::vector<int64_t> told;
  std::vector<uint8_t> stay;  // (pos of M_INTENT_DROP)
  const bool paused = !ledger_.all_keys();
  for (size_t i = 0; i < drop.size(); ++i) {
    const int64_t k = drop[i];
    Meta& m = meta_[k];
    m.plain = 0;
    if (m.flags & F_UNTOLD) {
      m.flags &= static_cast<uint8_t>(~F_UNTOLD);
    } else {
      told.push_back(k);
      // (a key localize() put here stays: localize is an explicit placement)
      stay.push_back(paused && gated[i] && !IntentLedger::probe(k) && !m.localized);
    }
    release_replica(m, k, flushes);
  }
  send_flushes(flushes, ob);
  if (!told.empty()) send_intent(M_INTENT_DROP, told, &stay, ob);
}

/// While intent is paused (ledger.hpp): the keys held here that no intent of
/// this rank wants go back home, as in the classic server (home_intent), also
/// the probe keys a probe slice moved here. A key away from its home costs
/// every other rank's request for it a forward from the home. Keys the
/// application localized here stay: localize is an explicit placement.
inline void Engine::send_home(Outbox& ob) {
  std::vector<int64_t> keys;
  sh_.for_each_foreign([&](int64_t k) {
    const Meta& m = meta_[k];  // (state and flags: written by this thread only)
    if (m.state == OWNED && m.want == 0 && !m.localized && !(m.flags & F_INCOMING) &&
        !shm_.reaches(dir_.home(k), rank_))
      keys.push_back(k);
  });
  if (keys.empty()) return;
  const std::vector<uint8_t> home(keys.size(), 1);
  send_intent(M_INTENT_DROP, keys, &home, ob);
}

/// This rank's probe gains and costs, to every other rank (ledger.hpp).
inline void Engine::share_ledger() {
  for (int d = 0; d < size_; ++d) {
    if (d == rank_) continue;
    Builder b;
    b.put(ledger_.wire_gain(), ledger_.wire_cost(), nullptr, 0);
    send(d, M_LEDGER, rank_, 0, b);
  }
}

/// Key k stops being a replica here (not while it is being relocated here);
/// its updates since the last refresh go to the owner (send_flushes).
inline void Engine::release_replica(Meta& m, int64_t k, std::map<int, Builder>& flushes) {
  m.lock.lock();
  if (m.state == REPLICA && !(m.flags & F_INCOMING)) {
    m.state = NOT_HERE;
    m.flags &= static_cast<uint8_t>(~F_DELTA);
    if (m.dirty) {  // a clean replica has nothing to give back
      ledger_.cost(k, IntentCosts::kFlush);
      m.dirty = 0;
      flushes[m.hint].put(k, 0, sh_.delta(k), sh_.layout().row_bytes(k));
      sh_.clear_delta(k);
    }
    sh_.release(k);
  }
  m.lock.unlock();
}

inline void Engine::send_flushes(std::map<int, Builder>& flushes, Outbox& ob) {
  for (auto& [dest, b] : flushes) {
    const int64_t ts = reqs_.add_internal(static_cast<int64_t>(b.keys.size()));
    ob.to(dest, M_IPUSH, rank_, ts) = std::move(b);
  }
  flushes.clear();
}

/// `replica`, per key: M_INTENT_ADD: whether to ask for a replica where others
/// intend it too; M_INTENT_DROP: whether intent stopped because it does not pay.
inline void Engine::send_intent(int32_t type, const std::vector<int64_t>& keys, const std::vector<uint8_t>* replica,
                                Outbox& ob) {
  std::vector<Builder*> per(size_, nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t k = keys[i];
    const int d = dir_.home(k);
    if (!per[d]) {
      per[d] = &ob.to(d, type, rank_, reqs_.add_internal(1));
      per[d]->keys.reserve(keys.size() / size_ + 16);
      per[d]->pos.reserve(keys.size() / size_ + 16);
    }
    per[d]->put(k, replica ? (*replica)[i] : 0, nullptr, 0);
  }
}

/// Home: rank r intends (M_INTENT_ADD) or stopped intending (M_INTENT_DROP)
/// these keys. One intending rank gets the key; with several, r gets a replica
/// if it asked for one (`replica`, per key: see process_intents; the earlier
/// intenders hold the key or their replicas already, or did not ask). A rank
/// that reaches the owner's shard in place needs neither. When a drop leaves
/// one intending rank, the key moves there; but a drop of a rank that stopped
/// intent because it does not pay (`replica` set, drop_intents) moves the key
/// home once no rank intends it, and nowhere else.
inline void Engine::home_intent(int32_t type, int32_t r, const int64_t* keys, const int64_t* replica, int64_t n,
                                Outbox& ob) {
  const bool moving = !shutting_down_;
  for (int64_t i = 0; i < n; ++i) {
    ahead(keys, n, i, type == M_INTENT_ADD);  // (the home often holds the key and hands it over)
    const int64_t k = keys[i];
    if (type == M_INTENT_ADD) {
      dir_.intender_add(k, r);
      const int cnt = dir_.intender_count(k);
      if (!moving) continue;
      const int own = meta_[k].owner;
      if (tech_ == T_RELOC_ONLY) {
        if (cnt == 1 && !shm_.reaches(r, own)) relocate(k, r, ob);
      } else if (tech_ == T_REPL_ONLY) {
        if (!shm_.reaches(r, own)) grant_replica(k, r, ob);
      } else if (tech_ == T_ALL) {
        if (cnt == 1) {
          if (!shm_.reaches(r, own)) relocate(k, r, ob);
        } else if (replica[i] != 0 && !shm_.reaches(r, own)) {
          grant_replica(k, r, ob);
        }
      }
    } else {
      dir_.intender_remove(k, r);
      if (!moving || tech_ != T_ALL) continue;
      const int left = dir_.intender_count(k);
      if (replica[i] != 0) {
        // intent stopped because it does not pay: as in the classic server, the key goes home
        if (left == 0 && !shm_.reaches(rank_, meta_[k].owner)) relocate(k, rank_, ob);
      } else if (left == 1) {
        int q = -1;
        dir_.for_intenders(k, [&](int x) { q = x; });
        if (!shm_.reaches(q, meta_[k].owner)) relocate(k, q, ob);
      }
    }
  }
}

}  // namespace kvps
