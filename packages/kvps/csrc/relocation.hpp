// relocation.hpp - keys moving between ranks. The home updates the directory,
// announces the key to its new owner (a notice that precedes every request the
// home forwards there) and tells the old owner to hand the slot over; operations
// for a key on its way here wait for it and are replayed when it arrives.
#pragma once

#include "engine.hpp"

namespace kvps {

/// Key k's slot arrived: it is owned here now; replay what waited for it.
inline void Engine::handover(int64_t k, const char* v, uint32_t ver, Outbox& ob) {
  Meta& m = meta_[k];
  m.lock.lock();
  const bool replica_updates = (m.flags & F_DELTA) && m.dirty;
  sh_.hold(k);
  std::memcpy(sh_.slot(k), v, sh_.layout().slot_bytes(k));
  // a replica turning owner applies the updates it had not shipped yet
  if (replica_updates) sh_.apply_delta(k);
  prof_.arrived(k);
  intent_cost(k, IntentCosts::kMove);
  if (m.flags & F_NOTICED) {
    m.flags &= static_cast<uint8_t>(~F_NOTICED);
    --noticed_pending_;
  }
  m.ver = ver + 1;  // versions travel with the value (+1: a local delta may have been applied)
  m.dirty = 0;
  m.flags &= static_cast<uint8_t>(~(F_DELTA | F_INCOMING));
  m.state = OWNED;
  m.set_hint(rank_);
  m.lock.unlock();
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
    for (auto& op : ops) {
      if (op.type == kReturnMarker) {
        mark_incoming(&k, 1);  // back here after the transfer before it: the ops after it wait again
      } else {
        serve(op.type, op.origin, op.ts, op.pos, k, op.val.empty() ? nullptr : op.val.data(), ob);
      }
    }
  }
  give_back_ended(k, ob);  // (came too late for its window, while intent is paused)
}

/// keys: unique; ts: the request to complete once per key.
inline void Engine::start_localize(const std::vector<int64_t>& keys, int64_t ts, Outbox& ob) {
  int64_t already = 0;
  for (int64_t k : keys) {
    Meta& m = meta_[k];
    m.lock.lock();
    const uint8_t st = m.state;
    if (st == OWNED) {
      m.lock.unlock();
      m.marks |= K_KEEP;  // (arrived since the worker looked: localize keeps it here)
      ++already;
      continue;
    }
    const bool was_incoming = st == INCOMING || (m.flags & F_INCOMING);
    if (!was_incoming) {
      // a replica keeps serving local reads/pushes until the value arrives
      if (st == REPLICA) {
        m.flags |= F_INCOMING;
      } else {
        m.state = INCOMING;
      }
    }
    m.lock.unlock();
    m.marks |= K_KEEP;  // (localize: it stays here)
    waiters_[k].push_back(ts);
    if (!was_incoming) ob.to(dir_.home(k), M_LOCALIZE, rank_, 0).put(k, 0, nullptr, 0);
  }
  if (already) reqs_.complete(ts, already);
}

/// The home moved key k here while it is on its way here already. If a
/// transfer away is queued for its arrival, this move is a later one: the key
/// leaves again on arrival and comes back after that. A marker right after
/// that transfer re-marks it incoming at that point of the replay (see
/// handover), so the operations queued after it wait for its return instead
/// of being forwarded to this rank itself. (No transfer queued: nothing to do.)
inline void Engine::queue_return(int64_t k) {
  if (pending_.empty()) return;
  auto p = pending_.find(k);
  if (p == pending_.end()) return;
  auto& ops = p->second;
  for (size_t i = ops.size(); i-- > 0;) {
    if (ops[i].type == M_TRANSFER) {
      ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(i) + 1, PendingOp{kReturnMarker, rank_, 0, 0, {}});
      return;
    }
  }
}

/// The home moved these keys to this rank; their handover is on the way
/// (or already here: then the key is OWNED and nothing is to do). A key on
/// its way here already may be moved here once more (queue_return).
inline void Engine::mark_incoming(const int64_t* keys, int64_t n) {
  std::vector<int64_t> inc;
  for (int64_t i = 0; i < n; ++i) {
    ahead(keys, n, i, false);
    const int64_t k = keys[i];
    Meta& m = meta_[k];
    bool again = false;  // on its way here already
    m.lock.lock();
    if (m.state == NOT_HERE) {
      m.state = INCOMING;
      inc.push_back(k);
    } else if (m.state == REPLICA && !(m.flags & F_INCOMING)) {
      m.flags |= F_INCOMING;  // keeps serving locally until the value arrives
      inc.push_back(k);
    } else {
      again = m.state != OWNED;
    }
    m.lock.unlock();
    // (after the unlock: pending_ is this thread's own, and peers spin on the key's lock)
    if (again) queue_return(k);
  }
  // wait_sync waits until every noticed key arrived (a counter, no per-key request)
  for (int64_t k : inc) {
    prof_.noticed(k, num_keys_);
    meta_[k].flags |= F_NOTICED;
  }
  noticed_pending_ += static_cast<int64_t>(inc.size());
}

/// Home: move key k to rank r now. The new owner learns it from a notice
/// that precedes (FIFO) every operation the home forwards to it afterwards;
/// the current owner hands the value over directly.
inline void Engine::relocate(int64_t k, int r, Outbox& ob) {
  const int prev = meta_[k].owner;
  meta_[k].set_owner(r);
  meta_[k].marks &= static_cast<uint8_t>(~K_LOCALIZED);  // (on_localize sets it again)
  if (r == rank_) {
    mark_incoming(&k, 1);  // not through a message to self: serve() below must see it
  } else {
    ob.to(r, M_RELOC_NOTICE, rank_, 0).put(k, 0, nullptr, 0);
  }
  if (prev == rank_) {
    serve(M_TRANSFER, r, 0, r, k, nullptr, ob);
  } else {
    ob.to(prev, M_TRANSFER, rank_, 0).put(k, r, nullptr, 0);
  }
}

/// Intent paused (ledger.hpp): the keys intent moved here for one-off windows
/// go back to their homes, which order their relocation (on_give_back). A key
/// used here again, moved for a longer window or by localize stays (K_KEEP):
/// relocation sticks for the keys it pays for (a worker's own rows), and
/// their probe keys keep showing the ledger what that gains. The others would
/// stay where a single use left them, and every other rank's first request
/// for one would be forwarded by its home, in a small message of its own:
/// on word2vec's uniform negative samples on 4 hosts, one request in ten in
/// the hundred clocks after the pause, which cost the paused server 11-28 %
/// more CPU per step than the classic one. Given back in a few large messages,
/// they are where the classic server keeps them; that halved the forwards
/// (kvps performance docs). Keys still intended here at the pause go back
/// when their window ends, or when they arrive if that is later
/// (give_back_ended).
///
/// The keys that stay are announced to every rank (M_HERE): a rank that had
/// not used one since it moved here would send its first request to the
/// key's home, which forwards it here, in a message of its own for a key or
/// three, and the answer comes back in another (on word2vec on 4 hosts, two
/// thirds of the paused server's forwards). One announcement of every kept
/// key costs a 16-byte record per key and rank, once per pause.
inline void Engine::give_back(Outbox& ob) {
  if (tech_ != T_ALL) return;
  Builder back, kept;
  for (int64_t k = 0; k < num_keys_; ++k) {
    if (meta_[k].state != OWNED || dir_.is_home(k)) continue;
    if (one_off_here(k)) {
      back.put(k, 0, nullptr, 0);
    } else if ((meta_[k].marks & K_KEEP) || ledger_.counts(k)) {
      kept.put(k, 0, nullptr, 0);  // (not a one-off still intended: it goes back when its window ends)
    }
  }
  // Both to every rank, not only the homes: a rank whose routing hint names
  // this one for a key given back would have its next request for it
  // forwarded too.
  to_every_rank(M_GIVE_BACK, back, ob);
  to_every_rank(M_HERE, kept, ob);
  n_announced_.fetch_add(static_cast<int64_t>(kept.keys.size()), std::memory_order_relaxed);
}

/// Keys `b` (no values) to every other rank as messages of type `type`, in
/// pieces of at most kListKeys keys (a message stays far below MPI's 2 GiB).
inline void Engine::to_every_rank(int32_t type, const Builder& b, Outbox& ob) {
  const size_t n = b.keys.size();
  for (size_t lo = 0, piece = 0; lo < n; lo += kListKeys, ++piece) {
    const auto first = static_cast<std::ptrdiff_t>(lo), last = static_cast<std::ptrdiff_t>(std::min(n, lo + kListKeys));
    // (the timestamp only tells the pieces apart in the outbox: these messages complete no request)
    for (int d = 0; d < size_; ++d) {
      if (d == rank_) continue;
      Builder& to = ob.to(d, type, rank_, static_cast<int64_t>(piece));
      to.keys.insert(to.keys.end(), b.keys.begin() + first, b.keys.begin() + last);
      to.pos.insert(to.pos.end(), b.pos.begin() + first, b.pos.begin() + last);
    }
  }
}

/// Rank src owns these keys and keeps them (give_back): requests for them go
/// there directly. (The home knows it already; a key that moved on since
/// leaves a stale hint, which routing corrects as for any other.)
inline void Engine::on_here(int src, const MsgView& m) {
  for (int64_t i = 0; i < m.h.n; ++i) {
    const int64_t k = m.keys[i];
    if (k < 0 || k >= num_keys_ || dir_.is_home(k)) continue;
    Meta& mk = meta_[k];  // (state, hint: written by this thread only)
    if (mk.state == NOT_HERE) mk.set_hint(src);
  }
}

/// While intent is paused, key k, whose last window here has ended (or which
/// arrived after it), goes back to its home if intent moved it here for a
/// single use, as give_back() sends those whose windows had ended at the pause.
inline void Engine::give_back_ended(int64_t k, Outbox& ob) {
  if (!(tech_ == T_ALL && !ledger_.all_keys() && one_off_here(k))) return;
  // (to every rank, as give_back: hints naming this rank then name the home)
  for (int d = 0; d < size_; ++d)
    if (d != rank_) ob.to(d, M_GIVE_BACK, rank_, 0).put(k, 0, nullptr, 0);
}

/// Whether this rank holds key k away from its home for a single use of intent
/// that has ended (no window here now; not used here again, moved for a
/// longer window or by localize: K_KEEP).
/// The ledger's probe keys stay as they would with intent on (relocation
/// sticks): what their later uses here gain is how the ledger sees that intent
/// pays again. The other keys are accessed the classic way while intent is
/// paused, so they belong where the classic server keeps them.
inline bool Engine::one_off_here(int64_t k) const {
  const Meta& m = meta_[k];  // (state: written by this thread only)
  return m.state == OWNED && m.want == 0 && !(m.marks & K_KEEP) && !dir_.is_home(k) && !ledger_.counts(k);
}

/// Rank src gives back keys intent moved there. At their home, each still
/// there, that no rank intends now and that did not get there by localize,
/// moves home; elsewhere a routing hint that names src names the home now.
inline void Engine::on_give_back(int src, const MsgView& m, Outbox& ob) {
  if (tech_ != T_ALL || shutting_down_) return;
  for (int64_t i = 0; i < m.h.n; ++i) {
    const int64_t k = m.keys[i];
    if (k < 0 || k >= num_keys_) continue;
    Meta& mk = meta_[k];  // (state, hint, owner, marks: written by this thread only)
    if (!dir_.is_home(k)) {
      if (mk.state == NOT_HERE && mk.hint == src) mk.set_hint(dir_.home(k));
      continue;
    }
    if (mk.owner != src || (mk.marks & K_LOCALIZED) || dir_.intender_count(k) != 0) continue;
    relocate(k, rank_, ob);
    n_given_back_.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Home: give rank q a replica of k. When the home holds k itself it sends
/// the value at once (no grant/fetch round trip); else q fetches it.
inline void Engine::grant_replica(int64_t k, int q, Outbox& ob) {
  if (meta_[k].owner == rank_ && key_state(k) == OWNED) {
    serve(M_FETCH, q, -1, 0, k, nullptr, ob);
  } else {
    ob.to(q, M_REPL_GRANT, rank_, 0).put(k, 0, nullptr, 0);
  }
}

}  // namespace kvps
