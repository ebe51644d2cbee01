// worker_ops.hpp - the Engine's worker API: a worker thread serves the keys this
// rank (or a node-local peer, in shared memory) holds itself, under the key's lock,
// and hands the rest to the progress thread (progress.hpp) as commands.
#pragma once

#include "engine.hpp"

namespace kvps {

/// op is M_PULL, M_PUSH or M_SET. Returns -1 when served entirely here (or in
/// a node-local peer's shard), else the timestamp of the remote part.
inline int64_t Engine::op(int op, int worker, const int64_t* keys, int64_t n, char* vals) {
  check_alive();
  const Layout& lay = sh_.layout();
  // uniform lengths (the common case): offsets are computed, not looked up
  const bool uni = lay.uniform();
  const int64_t urow = uni ? static_cast<int64_t>(lay.row_bytes(0)) : 0;
  std::vector<int64_t> voff;  // byte offset of each key's row in vals
  if (!uni) {
    voff.resize(n);
    int64_t acc = 0;
    for (int64_t i = 0; i < n; ++i) {
      voff[i] = acc;
      acc += static_cast<int64_t>(lay.row_bytes(keys[i]));
    }
  }
  std::vector<uint8_t> remote(n, 0);
  std::atomic<int64_t> nremote{0}, nshared{0};
  const bool peers = shm_.shares_peers();
  const bool probing = ledger_.enabled();
  distkit::parallel_for(0, n, 8192, [&](int64_t lo, int64_t hi) {
    int64_t r = 0, shared = 0, gain = 0;
    constexpr int64_t kAhead = 24;
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kAhead < hi) {
        // a few keys ahead: the record here and the slot where the key most
        // likely is, its home (here, or a node-local peer's shard), whose
        // place needs no record: random rows miss every cache line
        const int64_t kp = keys[i + kAhead];
        __builtin_prefetch(&meta_[kp].state, 1);
        const int h = dir_.home(kp);
        const char* sp = nullptr;
        if (h == rank_) {
          sp = sh_.home_slot(kp);
        } else if (peers && pmeta_[h]) {
          __builtin_prefetch(&pmeta_[h][kp], 1);
          sp = shm_.values(h) + lay.at(kp, h, -1);
        }
        if (sp) {
          const size_t b = std::min<size_t>(op == M_PULL ? lay.row_bytes(kp) : lay.slot_bytes(kp), 512);
          for (size_t o = 0; o < b; o += 64) __builtin_prefetch(sp + o, 1);
        }
      }
      const int64_t k = keys[i];
      char* v = vals + (uni ? i * urow : voff[i]);
      Meta& m = meta_[k];
      m.lock.lock();
      const uint8_t st = m.state;
      if (st == OWNED || (st == REPLICA && op != M_SET)) {
        char* slot = sh_.slot(k);  // (under the lock: a region-B slot changes only with the state)
        if (op == M_PULL) {
          std::memcpy(v, slot, lay.row_bytes(k));
        } else if (op == M_SET) {
          std::memcpy(slot, v, lay.row_bytes(k));
          ++m.ver;
        } else {
          sh_.apply(k, v);
          if (st == REPLICA) {
            sh_.add_delta(k, v);
            m.dirty = 1;
          } else {
            ++m.ver;
          }
        }
        m.lock.unlock();
      } else {
        m.lock.unlock();
        if (peers && direct(op, k, v)) {
          ++shared;
        } else {
          remote[i] = 1;
          ++r;
        }
      }
      // what intent changed for a probe key: near now vs near at its home (ledger.hpp)
      if (probing && IntentLedger::probe(k))
        gain += (remote[i] ? 0 : 1) - (shm_.reaches(rank_, dir_.home(k)) ? 1 : 0);
    }
    if (r) nremote += r;
    if (shared) nshared += shared;
    ledger_.gain(gain);
  });
  const int64_t nr = nremote.load();
  n_shared_ += nshared.load();
  n_remote_ += nr;
  n_local_ += n - nshared.load() - nr;
  if (nr == 0) return -1;
  Cmd c;
  c.type = C_ROUTE;
  c.op = op;
  c.keys.reserve(nr);
  c.pos.reserve(nr);
  for (int64_t i = 0; i < n; ++i) {
    if (!remote[i]) continue;
    c.keys.push_back(keys[i]);
    c.pos.push_back(i);
    if (op != M_PULL) {
      const char* v = vals + (uni ? i * urow : voff[i]);
      c.vals.insert(c.vals.end(), v, v + lay.row_bytes(keys[i]));
    }
  }
  if (op != M_PULL) return submit(std::move(c), nr, worker);
  if (uni) {
    voff.resize(n);
    for (int64_t i = 0; i < n; ++i) voff[i] = i * urow;
  }
  return submit(std::move(c), nr, worker, vals, std::move(voff));
}

/// Serve one key in place in the shard of a node-local peer that owns it
/// (tried: this rank's routing hint, then the owner in the home's
/// directory). Ownership is checked under the key's lock in the peer's
/// records, which every path that moves or changes the key also takes.
inline bool Engine::direct(int op, int64_t k, char* v) {
  const int p = __atomic_load_n(&meta_[k].hint, __ATOMIC_RELAXED);
  if (p != rank_ && pmeta_[p] && try_direct(p, op, k, v)) return true;
  const int h = dir_.home(k);
  if (!pmeta_[h]) return false;
  const int o = __atomic_load_n(&pmeta_[h][k].owner, __ATOMIC_RELAXED);
  if (o == p || o == rank_ || o < 0 || o >= size_ || !pmeta_[o]) return false;
  return try_direct(o, op, k, v);
}

inline bool Engine::try_direct(int p, int op, int64_t k, char* v) {
  if (!shm_.bell_of(p)->data_live.load(std::memory_order_acquire)) return false;  // not yet or no longer shared
  Meta& m = pmeta_[p][k];
  // a peer that died holding the lock must not hang us: give up when the
  // engine learns of the failure
  int spins = 0;
  while (m.lock.f.test_and_set(std::memory_order_acquire)) {
    if (++spins > 64) {
      std::this_thread::yield();
      if ((spins & 0xFFFF) == 0 && (reqs_.failed() || !running_.load())) return false;
    }
  }
  if (m.state != OWNED || !shm_.bell_of(p)->data_live.load(std::memory_order_relaxed)) {
    m.lock.unlock();
    return false;
  }
  char* slot = sh_.slot_of(shm_.values(p), p, k, m);
  if (op == M_PULL) {
    std::memcpy(v, slot, sh_.layout().row_bytes(k));
  } else if (op == M_SET) {
    std::memcpy(slot, v, sh_.layout().row_bytes(k));
    ++m.ver;
  } else {
    sh_.apply_at(slot, k, v);
    ++m.ver;
  }
  m.lock.unlock();
  return true;
}

inline int64_t Engine::localize(int worker, const int64_t* keys, int64_t n) {
  check_alive();
  std::vector<int64_t> u(keys, keys + n);
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  Cmd c, keep;
  c.type = C_LOCALIZE;
  keep.type = C_KEEP;
  for (int64_t k : u) (key_state(k) != OWNED ? c.keys : keep.keys).push_back(k);
  // keys an intent moved here: localize keeps them here too (not given back when intent pauses)
  if (!keep.keys.empty() && tech_ == T_ALL) post(std::move(keep));
  if (c.keys.empty()) return -1;
  const int64_t todo = static_cast<int64_t>(c.keys.size());
  return submit(std::move(c), todo, worker);
}

inline void Engine::intent(int worker, const int64_t* keys, int64_t n, int64_t start, int64_t end) {
  check_alive();
  // every shard is served in place on this node: no key needs to move
  if (n == 0 || tech_ == T_NONE || shm_.all_reach()) return;
  Cmd c;
  c.type = C_INTENT;
  c.worker = worker;
  c.a = start;
  c.b = end;
  if (ledger_.all_keys() || !IntentLedger::gated(start, end)) {
    c.keys.assign(keys, keys + n);
  } else {
    // intent does not pay here now: only the probe keys go through it, in slices (ledger.hpp)
    if (ledger_.probing(start))
      for (int64_t i = 0; i < n; ++i)
        if (IntentLedger::probe(keys[i])) c.keys.push_back(keys[i]);
    n_classic_ += n - static_cast<int64_t>(c.keys.size());
    if (c.keys.empty()) return;
  }
  post(std::move(c));
}

inline int64_t Engine::advance_clock(int worker) {
  const int64_t c = ++clocks_[worker];
  Cmd cmd;
  cmd.type = C_CLOCK;
  cmd.worker = worker;
  cmd.a = c;
  post(std::move(cmd));
  // Back-pressure: a worker may run at most one sync round ahead of its
  // progress engine. Otherwise a worker whose pulls are all local (what
  // intent achieves) takes the CPU from the engine on an oversubscribed
  // node, relocations fall behind and the keys are not local when needed.
  if (c > 1 && synced_[worker].load() < c - 1) {
    std::unique_lock<std::mutex> lk(clock_mu_);
    clock_cv_.wait_for(lk, std::chrono::seconds(1),
                       [&] { return synced_[worker].load() >= c - 1 || reqs_.failed() || !running_.load(); });
  }
  return c;
}

/// One sync round (intents, replica refresh); returns once every internal
/// operation this rank has under way (relocations, replica fetches and
/// refreshes, intent registrations) has finished.
inline void Engine::wait_sync() {
  check_alive();
  Cmd c;
  c.type = C_SYNC;
  wait(submit(std::move(c), 1, -1));
}

/// A barrier on the collective communicator that does not spin hard: a rank
/// that arrives early sleeps between tests, longer the longer it waits (each
/// test runs MPI's progress loop, which on a busy node takes the CPU from the
/// ranks still working).
inline void Engine::barrier() {
  MPI_Request r;
  distkit::mpi::check(MPI_Ibarrier(coll_, &r), "MPI_Ibarrier");
  int flag = 0;
  int spins = 0;
  long sleep_us = 50;
  while (true) {
    distkit::mpi::check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) break;
    reqs_.check_failed();
    if (++spins > 10) {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 1000L);
    }
  }
}

/// Barrier over every worker thread of every rank.
inline void Engine::worker_barrier() {
  std::unique_lock<std::mutex> lk(wb_mu_);
  const uint64_t gen = wb_gen_;
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

}  // namespace kvps
