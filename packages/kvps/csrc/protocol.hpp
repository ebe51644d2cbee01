// protocol.hpp - the progress thread's message handlers: routing and serving key operations.
//
// Routing: a request for a key goes to the rank the routing hint names; a
// rank that does not own the key forwards it (home -> owner, others -> home);
// a rank the key is on its way to queues it; the owner serves it and answers
// the origin. Keys moving between ranks are relocation.hpp's.
#pragma once

#include "engine.hpp"

namespace kvps {

inline void Engine::handle_msg(int src, const char* buf) {
  const MsgView m = view(buf);
  const Layout& lay = sh_.layout();
  Outbox ob;
  switch (m.h.type) {
    case M_PULL:
    case M_PUSH:
    case M_SET:
    case M_IPUSH:
    case M_FETCH:
    case M_RSYNC:
    case M_RCHECK: {
      const bool rows = payload(m.h.type) == Payload::kRow;
      const char* v = m.vals;
      for (int64_t i = 0; i < m.h.n; ++i) {
        ahead(m.keys, m.h.n, i, m.h.type != M_RCHECK);
        const int64_t k = m.keys[i];
        serve(m.h.type, m.h.origin, m.h.ts, m.pos[i], k, rows ? v : nullptr, ob);
        if (rows) v += lay.row_bytes(k);
      }
      break;
    }
    case M_PULL_RESP:
      on_pull_resp(src, m);
      break;
    case M_ACK:
      for (int64_t i = 0; i < m.h.n; ++i) meta_[m.keys[i]].set_hint(src);
      reqs_.complete(m.h.ts, m.h.n);
      break;
    case M_FETCH_RESP:
      on_fetch_resp(src, m);
      break;
    case M_RSYNC_RESP:
      on_rsync_resp(src, m);
      break;
    case M_RCHECK_RESP:
      on_rcheck_resp(src, m);
      break;
    case M_LOCALIZE:
      on_localize(m, ob);
      break;
    case M_TRANSFER:
      for (int64_t i = 0; i < m.h.n; ++i) {
        ahead(m.keys, m.h.n, i, true);
        serve(M_TRANSFER, static_cast<int32_t>(m.pos[i]), 0, m.pos[i], m.keys[i], nullptr, ob);
      }
      break;
    case M_HANDOVER: {
      const char* v = m.vals;
      for (int64_t i = 0; i < m.h.n; ++i) {
        ahead(m.keys, m.h.n, i, true);
        const int64_t k = m.keys[i];
        handover(k, v, static_cast<uint32_t>(m.pos[i]), ob);
        v += lay.slot_bytes(k);
      }
      break;
    }
    case M_INTENT_ADD:
    case M_INTENT_DROP:
      home_intent(m.h.type, m.h.origin, m.keys, m.pos, m.h.n, ob);
      flush(ob);  // grants must reach the ranks before the ack (FIFO per source)
      ob.to(m.h.origin, M_INTENT_ACK, rank_, m.h.ts).put(0, 0, nullptr, 0);
      break;
    case M_INTENT_ACK:
      reqs_.complete(m.h.ts, 1);
      break;
    case M_RELOC_NOTICE:
      mark_incoming(m.keys, m.h.n);
      break;
    case M_REPL_GRANT:
      on_repl_grant(m, ob);
      break;
    case M_BYE:
      on_bye(src);
      break;
    case M_LEDGER:
      if (m.h.n == 1) ledger_.peer(src, m.keys[0], m.pos[0]);
      break;
    case M_GIVE_BACK:
      on_give_back(src, m, ob);
      break;
    case M_HERE:
      on_here(src, m);
      break;
    default:
      throw distkit::Error(str("kvps: unknown message type ", m.h.type, " from rank ", src));
  }
  finish(ob);
}

inline void Engine::on_pull_resp(int src, const MsgView& m) {
  std::shared_ptr<Request> req = reqs_.find(m.h.ts);
  const char* v = m.vals;
  for (int64_t i = 0; i < m.h.n; ++i) {
    ahead(m.keys, m.h.n, i, false);
    const int64_t k = m.keys[i];
    const size_t b = sh_.layout().row_bytes(k);
    if (req) std::memcpy(req->out + req->out_off[m.pos[i]], v, b);
    v += b;
    meta_[k].set_hint(src);
  }
  reqs_.complete(m.h.ts, m.h.n);
}

inline void Engine::on_fetch_resp(int src, const MsgView& m) {
  const char* v = m.vals;
  for (int64_t i = 0; i < m.h.n; ++i) {
    ahead(m.keys, m.h.n, i, true);
    const int64_t k = m.keys[i];
    Meta& r = meta_[k];
    r.set_hint(src);
    r.flags &= static_cast<uint8_t>(~F_FETCHING);
    r.lock.lock();
    if (r.state == NOT_HERE && r.want > 0 && !shutting_down_) reps_.install(dir_, sh_, k, v, static_cast<uint32_t>(m.pos[i]));
    r.lock.unlock();
    intent_cost(k, IntentCosts::kFetch);
    v += sh_.layout().slot_bytes(k);
  }
  reqs_.complete(m.h.ts, m.h.n);
}

inline void Engine::on_rsync_resp(int src, const MsgView& m) {
  const char* v = m.vals;
  for (int64_t i = 0; i < m.h.n; ++i) {
    ahead(m.keys, m.h.n, i, true);
    const int64_t k = m.keys[i];
    Meta& r = meta_[k];
    r.set_hint(src);
    r.flags &= static_cast<uint8_t>(~F_SYNCING);
    r.lock.lock();
    if (r.state == REPLICA) reps_.refresh(r, sh_, k, v, static_cast<uint32_t>(m.pos[i]));
    r.lock.unlock();
    intent_cost(k, IntentCosts::kRsync);
    v += sh_.layout().slot_bytes(k);
  }
  reqs_.complete(m.h.ts, m.h.n);
}

inline void Engine::on_rcheck_resp(int src, const MsgView& m) {
  for (int64_t i = 0; i < m.h.n; ++i) {
    meta_[m.keys[i]].set_hint(src);
    meta_[m.keys[i]].flags &= static_cast<uint8_t>(~F_SYNCING);
    intent_cost(m.keys[i], IntentCosts::kRcheck);
  }
  reqs_.complete(m.h.ts, m.h.n);
}

/// Home: rank `origin` asks for these keys now.
inline void Engine::on_localize(const MsgView& m, Outbox& ob) {
  for (int64_t i = 0; i < m.h.n; ++i) {
    const int64_t k = m.keys[i];
    // already on its way to the requester (moved there by an intent or an
    // earlier localize): its handover completes the requester's wait
    if (meta_[k].owner == m.h.origin) continue;
    // With a notice, as an intent's move: since the request was sent, the key
    // may have reached the requester and been ordered away from it again.
    relocate(k, m.h.origin, ob);
    meta_[k].marks |= K_LOCALIZED;  // (after relocate, which clears it): it stays there (on_give_back)
  }
}

/// The home grants replicas of keys it does not hold: fetch them from their owners.
inline void Engine::on_repl_grant(const MsgView& m, Outbox& ob) {
  std::map<int, std::vector<int64_t>> per;
  for (int64_t i = 0; i < m.h.n; ++i) {
    const int64_t k = m.keys[i];
    Meta& r = meta_[k];
    if (shutting_down_ || r.want == 0 || (r.flags & F_FETCHING)) continue;
    if (key_state(k) != NOT_HERE) continue;
    r.flags |= F_FETCHING;
    per[r.hint].push_back(k);
  }
  for (auto& [dest, ks] : per) {
    Builder& b = ob.to(dest, M_FETCH, rank_, reqs_.add_internal(static_cast<int64_t>(ks.size())));
    for (int64_t k : ks) b.put(k, 0, nullptr, 0);
  }
}

inline void Engine::on_bye(int src) {
  reqs_.fail(str("kvps rank ", src, " exited without calling Server.shutdown(): the parameter server lost ",
                 "its shard, so pending and further operations on rank ", rank_, " fail"));
}

/// Serve, queue or forward one key-level operation.
inline void Engine::serve(int32_t type, int32_t origin, int64_t ts, int64_t pos, int64_t k, const char* val,
                          Outbox& ob) {
  Meta& m = meta_[k];
  const Layout& lay = sh_.layout();
  m.lock.lock();
  const uint8_t st = m.state;
  char* slot = sh_.slot(k);
  if (st == OWNED) {
    switch (type) {
      case M_PULL:
        ob.to(origin, M_PULL_RESP, rank_, ts).put(k, pos, slot, lay.row_bytes(k));
        break;
      case M_FETCH:
        ob.to(origin, M_FETCH_RESP, rank_, ts).put(k, m.ver, slot, lay.slot_bytes(k));
        break;
      case M_PUSH:
      case M_IPUSH:
        sh_.apply(k, val);
        ++m.ver;
        ob.to(origin, M_ACK, rank_, ts).put(k, pos, nullptr, 0);
        break;
      case M_SET:
        std::memcpy(slot, val, lay.row_bytes(k));
        ++m.ver;
        ob.to(origin, M_ACK, rank_, ts).put(k, pos, nullptr, 0);
        break;
      case M_RSYNC:
        sh_.apply(k, val);
        ++m.ver;
        ob.to(origin, M_RSYNC_RESP, rank_, ts).put(k, m.ver, slot, lay.slot_bytes(k));
        break;
      case M_RCHECK:
        if (static_cast<uint32_t>(pos) == m.ver) {
          ob.to(origin, M_RCHECK_RESP, rank_, ts).put(k, 0, nullptr, 0);
        } else {
          ob.to(origin, M_RSYNC_RESP, rank_, ts).put(k, m.ver, slot, lay.slot_bytes(k));
        }
        break;
      case M_TRANSFER:
        ob.to(origin, M_HANDOVER, rank_, 0).put(k, m.ver, slot, lay.slot_bytes(k));
        reuse_.missed(m);  // (a move here not used again: it got one use)
        m.marks = static_cast<uint8_t>((m.marks | K_TAKEN) & ~K_KEEP);  // another rank wants this key too
        m.set_hint(origin);
        if (m.want > 0 && (tech_ == T_ALL || tech_ == T_REPL_ONLY) && !shutting_down_) {
          reps_.keep(dir_, sh_, k);  // still intended here: a replica of the new owner
        } else {
          m.state = NOT_HERE;
          sh_.release(k);
        }
        break;
      default:
        break;
    }
    m.lock.unlock();
    return;
  }
  const bool incoming = st == INCOMING || (m.flags & F_INCOMING);
  m.lock.unlock();
  if (incoming) {
    PendingOp p{type, origin, ts, pos, {}};
    if (val) p.val.assign(val, val + lay.row_bytes(k));
    pending_[k].push_back(std::move(p));
    return;
  }
  if (type == M_TRANSFER) {
    throw distkit::Error(str("kvps: transfer of key ", k, " reached rank ", rank_, " which does not hold it"));
  }
  const int home = dir_.home(k);
  const int next = home == rank_ ? m.owner : home;
  if (next == rank_) throw distkit::Error(str("kvps: routing loop for key ", k, " on rank ", rank_));
  n_forwarded_.fetch_add(1, std::memory_order_relaxed);
  ob.to(next, type, origin, ts).put(k, pos, val, val ? lay.row_bytes(k) : 0);
}

}  // namespace kvps
