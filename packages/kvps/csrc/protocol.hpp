// protocol.hpp - the progress thread: its loop, commands, and message handlers.
//
// Routing: a request for a key goes to the rank the routing hint names; a
// rank that does not own the key forwards it (home -> owner, others -> home);
// a rank the key is on its way to queues it; the owner serves it and answers
// the origin. Relocation: the home updates the directory, announces the key
// to its new owner (a notice that precedes every request the home forwards
// there) and tells the old owner to hand the slot over.
#pragma once

#include "engine.hpp"

namespace kvps {

inline void Engine::loop() {
  prof_.start_thread();
  int idle = 0;
  std::vector<char> rbuf;  // (small messages, received and handled at once)
  Doorbell* bell = shm_.bell();
  auto handle = [this](int src, const char* buf, int64_t bytes) {
    link_.received(src, static_cast<size_t>(bytes));
    const auto t0 = prof_.begin();
    handle_msg(src, buf);
    prof_.record(view(buf).h.type, t0, bytes);
  };
  // sends and large receives in flight progress only while this thread calls MPI
  auto in_flight = [this] { return !sendq_.empty() || inbox_.pending(); };
  try {
    while (running_.load() || in_flight()) {
      bool did = false;
      if (has_cmds_.load()) {
        std::deque<Cmd> cmds;
        {
          std::lock_guard<std::mutex> lk(cmd_mu_);
          cmds.swap(cmds_);
          has_cmds_.store(false);
        }
        for (auto& c : cmds) {
          const auto t0 = prof_.begin();
          handle_cmd(c);
          prof_.record(c.type, t0, 0);
          did = true;
        }
      }
      // receive what has arrived without blocking (inbox.hpp), then handle what is complete
      for (int i = 0; i < 64; ++i) {
        int flag = 0;
        MPI_Message msg = MPI_MESSAGE_NULL;
        MPI_Status st;
        distkit::mpi::check(MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &flag, &msg, &st), "MPI_Improbe");
        if (!flag) break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (count <= kEagerBytes && !inbox_.waiting(st.MPI_SOURCE)) {
          // sent eagerly: complete once matched, handled at once
          rbuf.resize(static_cast<size_t>(count));
          distkit::mpi::check(MPI_Mrecv(rbuf.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
          handle(st.MPI_SOURCE, rbuf.data(), count);
          did = true;
          continue;
        }
        inbox_.receive(msg, st.MPI_SOURCE, count);
        // a large (rendezvous) send completes at its sender only once the
        // sender polls again: wake it
        if (count > kEagerBytes && st.MPI_SOURCE != rank_)
          if (Doorbell* b = shm_.bell_of(st.MPI_SOURCE)) ring(b);
      }
      for (int i = 0; i < 64; ++i) {
        Inbox::Message* m = inbox_.next();
        if (!m) break;
        handle(m->src, m->buf.data(), static_cast<int64_t>(m->buf.size()));
        inbox_.done(m);
        did = true;
      }
      sendq_.test();
      check_sync_waiters();
      if (did) {
        idle = 0;
        continue;
      }
      if (!running_.load()) {
        // draining the last sends of a stopped engine (bounded: a peer that
        // is gone never completes a large send)
        if (drain_start_.time_since_epoch().count() == 0) drain_start_ = std::chrono::steady_clock::now();
        if (std::chrono::steady_clock::now() - drain_start_ > std::chrono::seconds(reqs_.failed() ? 1 : 10)) break;
        if (in_flight()) futex_wait(&bell->seq, bell->seq.load(), 50);
        continue;
      }
      if (++idle < 8) continue;  // a short spin catches replies in flight
      // sleep until a worker posts a command or a node-local peer sends a
      // message (both ring the doorbell); peers on other nodes and pending
      // large sends are polled on a timeout
      bell->sleeping.store(1, std::memory_order_seq_cst);
      const uint32_t seq = bell->seq.load(std::memory_order_seq_cst);
      int flag = 0;
      distkit::mpi::check(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
      if (!flag && !has_cmds_.load() && running_.load()) {
        futex_wait(&bell->seq, seq, in_flight() ? 50 : shm_.idle_timeout_us());
      }
      bell->sleeping.store(0, std::memory_order_seq_cst);
      idle = 0;
    }
    prof_.stop_thread();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvps rank %d: progress engine failed: %s\n", rank_, e.what());
    reqs_.fail(std::string("kvps progress engine failed: ") + e.what());
  }
}

// ------------------------------------------------------------------ commands

inline void Engine::handle_cmd(Cmd& c) {
  Outbox ob;
  switch (c.type) {
    case C_ROUTE:
      route(c, ob);
      break;
    case C_LOCALIZE:
      start_localize(c.keys, c.ts, ob);
      break;
    case C_INTENT:
      pending_intents_[c.worker].insert({c.a, IntentEntry{c.a, c.b, std::move(c.keys)}});
      // at once if the next intent round would come too late for it (intent.hpp)
      if (intent_due_now(c.a, clocks_[c.worker].load())) process_intents(c.worker, ob);
      break;
    case C_CLOCK:
      // advance_clock refreshes replicas every sync_every clocks
      sync_round(c.a % sync_every_ == 0, false, ob);
      // (not to peers of a failed job: one may be gone)
      if (c.worker == 0 && c.a % intent_round_ == 0) {
        settle_link();
        if (ledger_.settle() && !shutting_down_ && !reqs_.failed()) share_ledger();
      }
      if (c.worker == 0) reuse_.expire(c.a, meta_);
      finish(ob);
      {
        std::lock_guard<std::mutex> lk(clock_mu_);
        synced_[c.worker].store(c.a);
      }
      clock_cv_.notify_all();
      return;
    case C_SYNC:
      sync_round(true, true, ob);
      sync_waiters_.push_back(c.ts);
      break;
    case C_RESET:
      do_reset();
      reqs_.complete(c.ts, 1);
      return;
    case C_DUMP:
      dump();
      break;
    case C_BYE:
      for (int d = 0; d < size_; ++d)
        if (d != rank_) send(d, M_BYE, rank_, 0, Builder{});
      bye_sent_ = true;
      break;
    default:
      throw distkit::Error(str("kvps: unknown command ", c.type));
  }
  finish(ob);
}

/// Send a worker's pulls/pushes/sets of keys held elsewhere to their hinted owners.
inline void Engine::route(Cmd& c, Outbox& ob) {
  const char* v = c.vals.data();
  const int64_t nk = static_cast<int64_t>(c.keys.size());
  const bool vals = payload(c.op) != Payload::kNone;
  for (int64_t i = 0; i < nk; ++i) {
    ahead(c.keys.data(), nk, i, false);
    const int64_t k = c.keys[i];
    const size_t b = vals ? sh_.layout().row_bytes(k) : 0;
    ob.to(meta_[k].hint, c.op, rank_, c.ts).put(k, c.pos[i], vals ? v : nullptr, b);
    v += b;
  }
}

/// Activate and end intent windows of every worker (in intent rounds, or
/// `all_intents`: wait_sync); refresh replicas if asked.
inline void Engine::sync_round(bool refresh, bool all_intents, Outbox& ob) {
  const int64_t round = intent_round();
  for (int w = 0; w < num_workers_; ++w) {
    if (!all_intents && clocks_[w].load() % round != 0) continue;
    process_intents(w, ob);
    // An outbox sends by (destination, type): one worker's drop of a key and
    // the next worker's new intent for it would reach the home as add, then
    // drop. Each worker's messages go out before the next worker's.
    if (num_workers_ > 1) flush(ob);
  }
  if (!refresh || reps_.empty()) return;
  std::map<int, Builder> dirty, clean;
  reps_.collect(dir_, sh_, dirty, clean);
  for (auto* per : {&dirty, &clean}) {
    for (auto& [dest, b] : *per) {
      const int64_t ts = reqs_.add_internal(static_cast<int64_t>(b.keys.size()));
      ob.to(dest, per == &dirty ? M_RSYNC : M_RCHECK, rank_, ts) = std::move(b);
    }
  }
}

inline void Engine::complete_done() {
  if (done_.empty()) return;
  std::sort(done_.begin(), done_.end());
  for (size_t i = 0; i < done_.size();) {
    size_t j = i;
    while (j < done_.size() && done_[j] == done_[i]) ++j;
    reqs_.complete(done_[i], static_cast<int64_t>(j - i));
    i = j;
  }
  done_.clear();
}

/// wait_sync requests complete once no internal operation is pending and
/// every key the home announced here has arrived.
inline void Engine::check_sync_waiters() {
  if (sync_waiters_.empty()) return;
  if (noticed_pending_ || reqs_.internal_pending()) return;
  auto w = std::move(sync_waiters_);
  sync_waiters_.clear();
  for (int64_t ts : w) reqs_.complete(ts, 1);
}

inline void Engine::do_reset() {
  dir_.reset();
  sh_.reset();
  // every delta back to zero (and its pages back to the system)
  Arena& d = sh_.delta_arena();
  if (d.size()) madvise(d.data(), d.size(), MADV_DONTNEED);
  noticed_pending_ = 0;
  reps_.clear();
  waiters_.clear();
  pending_.clear();
  for (auto& p : pending_intents_) p.clear();
  for (auto& a : active_intents_) a.clear();
}

inline void Engine::dump() {
  std::fprintf(stderr,
               "kvps rank %d: %zu keys with queued ops, %zu keys awaited, %lld noticed keys awaited, %zu replicas, "
               "%zu sync waiters\n",
               rank_, pending_.size(), waiters_.size(), static_cast<long long>(noticed_pending_), reps_.listed(),
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
                 static_cast<long long>(k), meta_[k].state, meta_[k].flags, ts.size(), dir_.home(k), meta_[k].owner,
                 meta_[k].hint);
  }
  shown = 0;
  reqs_.for_each_pending([&](int64_t ts, const Request& r) {
    if (++shown > 8) return;
    std::fprintf(stderr, "  request %lld remaining %lld internal %d worker %d\n", static_cast<long long>(ts),
                 static_cast<long long>(r.remaining), int(r.internal), r.worker);
  });
}

// ------------------------------------------------------------------ messages

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
      for (int64_t i = 0; i < m.h.n; ++i) meta_[m.keys[i]].hint = src;
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
    meta_[k].hint = src;
  }
  reqs_.complete(m.h.ts, m.h.n);
}

inline void Engine::on_fetch_resp(int src, const MsgView& m) {
  const char* v = m.vals;
  for (int64_t i = 0; i < m.h.n; ++i) {
    ahead(m.keys, m.h.n, i, true);
    const int64_t k = m.keys[i];
    Meta& r = meta_[k];
    r.hint = src;
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
    r.hint = src;
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
    meta_[m.keys[i]].hint = src;
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
        m.taken = 1;       // another rank wants this key too
        m.hint = origin;
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
  ob.to(next, type, origin, ts).put(k, pos, val, val ? lay.row_bytes(k) : 0);
}

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
  m.hint = rank_;
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
  meta_[k].owner = r;
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
