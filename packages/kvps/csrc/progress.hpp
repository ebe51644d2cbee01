// progress.hpp - the progress thread: its loop (commands, messages, sends and
// receives in flight), the workers' commands, sync rounds and completions.
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

inline void Engine::handle_cmd(Cmd& c) {
  Outbox ob;
  switch (c.type) {
    case C_ROUTE:
      route(c, ob);
      break;
    case C_LOCALIZE:
      start_localize(c.keys, c.ts, ob);
      break;
    case C_KEEP:
      for (int64_t k : c.keys)
        if (meta_[k].state == OWNED) meta_[k].marks |= K_KEEP;
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
        if (ledger_.take_pause() && !shutting_down_ && !reqs_.failed()) give_back(ob);
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

}  // namespace kvps
