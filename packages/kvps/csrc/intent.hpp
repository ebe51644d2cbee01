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
// Relocation sticks (AdaPM's semantics): a key moved here stays when its
// window ends, until another rank's intent (or localize) takes it; an intent
// for a key held here costs no message at all. Only replicas leave with their
// window.
//
// The cost model. Moving a key here costs about as much engine work as one
// or two remote accesses (the intent at the home, the transfer and handover;
// README, Benchmarks); afterwards every access here is local for as long as
// the key stays. So a move pays when the key is used here again before it
// leaves. A window of two clocks or more announces several uses and always
// moves, and so does a key that recurs here (its last window here ended at
// most four lookaheads before) unless another rank took it from here before.
// For other one-clock windows the rank looks at what its earlier such moves
// got: a move whose key a later intent of this rank finds still here (within
// a horizon of four lookaheads) got a second use; one whose key another rank
// took first, or that was not intended here again in time, got one. While at
// least half of the moves of such keys got a second use, they move; else the
// key is accessed the classic way, at its owner. (That half is where the
// engine's CPU binds. Where the link binds a move pays with its first use,
// and the share needed falls with the link's weight to none: link.hpp,
// ReuseModel::set_link_weight.) The share starts at 1 (every
// intent moves its keys, as AdaPM does), decays over the last few thousand
// moves, and is kept apart for keys no other rank took from here before
// (a worker's own rows, which stay for good) and keys another rank did take
// (shared keys, which move back and forth): one kind of key paying does not
// make the other move. A key left at its owner is moved once the share of its
// kind recovers.
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

inline void Engine::process_intents(int w, Outbox& ob) {
  const int64_t c = clocks_[w].load();
  const bool keep_owned = tech_ == T_ALL || tech_ == T_REPL_ONLY;
  std::vector<int64_t> add, drop;
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
      intent_cost(k, IntentCosts::kWindow);
      const ReuseModel::Seen seen = reuse_.note(m, e.start, e.end);
      // (state: written by this thread only)
      const bool here = m.state == OWNED || m.state == INCOMING || (m.flags & F_INCOMING);
      if (here) {
        reuse_.used_again(m);  // a move asked for earlier got a second use
        m.marks |= K_KEEP;
      } else {
        reuse_.missed(m);  // taken away before this use, or not moved at all
      }
      // A replica is refreshed every sync round while it lives, so it pays for a
      // key used every clock (a window of several clocks, or windows back to
      // back). For other keys it pays only while most uses of replicated keys
      // here are steady (ReuseModel::replicas_pay; true at first, as in AdaPM).
      // ("replication_only" keeps every replica: the user's choice)
      if (m.state == REPLICA || (m.plain && m.state == NOT_HERE)) reuse_.note_replica_use(seen.steady);
      const bool replica = tech_ != T_ALL || window >= 2 || seen.steady || reuse_.replicas_pay();
      auto tell = [&] {  // (told: its drop must reach the home too)
        intent_cost(k, IntentCosts::kTell);
        m.flags &= static_cast<uint8_t>(~F_UNTOLD);
        if (window < 2) {
          reuse_.told(k, m, c);
        } else {
          m.marks |= K_KEEP;  // several uses announced
        }
        add.push_back(k);
        add_replica.push_back(replica);
        m.plain = !replica;
      };
      if (m.want++ != 0) {
        if ((m.flags & F_UNTOLD) && m.state == NOT_HERE && reuse_.worth_moving(window, m, seen.recurs)) {
          tell();  // wanted already, but left at its owner: moving pays now
        } else if (m.plain && replica && m.state == NOT_HERE) {
          tell();  // told without a replica, and used every clock now: ask for one
        } else if (!replica && m.state == REPLICA && !(m.flags & F_INCOMING)) {
          release_replica(m, k, flushes);  // not used every clock: access it at its owner
          m.plain = 1;
        }
        continue;
      }
      if (keep_owned && m.state == OWNED) {
        // held here already (it stays: relocation sticks): no need to tell
        // the home. Should another rank's intent move the key away, the
        // transfer leaves a replica here while this rank still wants it (see
        // serve(M_TRANSFER)).
        m.flags |= F_UNTOLD;
      } else if (!reuse_.worth_moving(window, m, seen.recurs)) {
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
      if (--meta_[k].want == 0) drop.push_back(k);
    }
  }
  send_flushes(flushes, ob);
  n_told_ += static_cast<int64_t>(add.size());
  if (!add.empty()) send_intent(M_INTENT_ADD, add, &add_replica, ob);
  if (!drop.empty()) drop_intents(drop, ob);
}

/// Intents that ended: replicas are dropped (their updates flushed to the
/// owner), and the home hears of the drops of intents it was told of. A key
/// this rank owns stays here (relocation sticks), unless intent is paused and
/// it came for a single use (give_back_ended).
inline void Engine::drop_intents(const std::vector<int64_t>& drop, Outbox& ob) {
  std::map<int, Builder> flushes;  // per hinted owner: the updates of dropped replicas
  std::vector<int64_t> told;
  for (int64_t k : drop) {
    Meta& m = meta_[k];
    m.plain = 0;
    if (m.flags & F_UNTOLD) {
      m.flags &= static_cast<uint8_t>(~F_UNTOLD);
    } else {
      told.push_back(k);
    }
    release_replica(m, k, flushes);
  }
  send_flushes(flushes, ob);
  if (!told.empty()) send_intent(M_INTENT_DROP, told, nullptr, ob);
  for (int64_t k : drop) give_back_ended(k, ob);
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
      intent_cost(k, IntentCosts::kFlush);
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
/// one intending rank, the key moves there; when it leaves none, the key
/// stays where it is (relocation sticks).
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
      if (dir_.intender_count(k) == 1) {
        int q = -1;
        dir_.for_intenders(k, [&](int x) { q = x; });
        if (!shm_.reaches(q, meta_[k].owner)) relocate(k, q, ob);
      }
    }
  }
}

}  // namespace kvps
