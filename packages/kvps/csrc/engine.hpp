// engine.hpp - a rank's kvps engine: the worker API and the progress thread.
//
// Workers serve keys this rank holds (or a node-local peer holds, in shared
// memory) themselves, under the key's lock; everything else becomes a command
// to the progress thread, which speaks MPI with the other ranks. The pieces:
//   wire.hpp       message types, layout, batching, sending
//   directory.hpp  per-key records: state, owner (at the home), routing hint
//   shard.hpp      slots, replica deltas and the update rule (rules.hpp)
//   node_shm.hpp   doorbells and shards shared between ranks of one node
//   replicas.hpp   replica install, refresh and the list of replicas
//   requests.hpp   operations in flight and the failure state
//   profile.hpp    KVPS_PROFILE=1
// and the progress thread's handlers in protocol.hpp (messages, relocation)
// and intent.hpp (intent windows, the home's decisions, the cost model).
// README "How it works" describes the protocol.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
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
#include <utility>
#include <vector>

#include "directory.hpp"
#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/mpi.hpp"
#include "distkit/parallel.hpp"
#include "inbox.hpp"
#include "ledger.hpp"
#include "link.hpp"
#include "node_shm.hpp"
#include "profile.hpp"
#include "replicas.hpp"
#include "requests.hpp"
#include "rules.hpp"
#include "shard.hpp"
#include "wire.hpp"

namespace kvps {

/// use_techniques (exported to Python as TECHNIQUES).
enum Technique : int { T_ALL = 0, T_REPL_ONLY = 1, T_RELOC_ONLY = 2, T_NONE = 3 };

/// Work a worker hands to the progress thread.
enum CmdType : int32_t {
  C_ROUTE = 100,  // send a pull/push/set (`op`) of keys held elsewhere to their owners
  C_LOCALIZE,     // relocate keys here now
  C_INTENT,       // an intent window [a, b) of a worker
  C_CLOCK,        // a worker advanced its clock to a: activate intents, maybe refresh replicas
  C_SYNC,         // wait_sync: a sync round; done when every internal operation finished
  C_RESET,        // every key back to its home (load)
  C_DUMP,         // print what the engine waits for (a stalled wait)
  C_BYE,          // tell every peer this rank leaves without shutdown()
};

struct Cmd {
  int32_t type = 0;
  int32_t op = 0;  // C_ROUTE: M_PULL / M_PUSH / M_SET
  int64_t ts = -1;
  int worker = 0;
  int64_t a = 0, b = 0;
  std::vector<int64_t> keys, pos;
  std::vector<char> vals;
};

/// An operation on a key that is on its way here, replayed when it arrives.
struct PendingOp {
  int32_t type;
  int32_t origin;
  int64_t ts;
  int64_t pos;
  std::vector<char> val;
};

/// A PendingOp type that is no message: the key comes back here after the
/// transfer queued before it (protocol.hpp, queue_return).
constexpr int32_t kReturnMarker = -1;

struct IntentEntry {
  int64_t start, end;
  std::vector<int64_t> keys;
};

/// A share of events that were hits, decaying over the last few thousand
/// events and starting at 1 (as if every event so far had been a hit).
class DecayingShare {
 public:
  void event() {
    events_ = events_ * kDecay + 1;
    hits_ *= kDecay;
  }
  void hit() { hits_ += 1; }
  bool at_least_half() const { return at_least(0.5); }
  bool at_least(double share) const { return hits_ >= share * events_; }

 private:
  static constexpr double kDecay = 1.0 - 1.0 / 2048;
  double events_ = 512, hits_ = 512;
};

/// The judgment whether moving a key here pays (see intent.hpp).
class ReuseModel {
 public:
  /// A move for a one-clock window is judged by whether a later intent of
  /// this rank finds the key still here within `horizon` clocks.
  explicit ReuseModel(int64_t lookahead) : horizon_(std::max<int64_t>(4 * std::max<int64_t>(lookahead, 1), kMinHorizon)) {}
  struct Seen {
    bool recurs;  // its last window here ended at most `horizon` clocks before this one starts
    bool steady;  // its window starts no later than its last window here ended (consecutive clocks)
  };
  /// Records an intent of key record `m` for clocks [start, end).
  Seen note(Meta& m, int64_t start, int64_t end);
  /// Whether to ask the home to move key record `m` here for a window of
  /// `window` clocks: a longer window announces several uses, and so does a
  /// key that recurs here and no other rank took from here before; else
  /// whether enough such moves of keys of its kind got a second use here
  /// (set_link_weight: half where engine work binds, none where bytes do).
  bool worth_moving(int64_t window, const Meta& m, bool recurs) const {
    return window >= 2 || (recurs && !m.taken) || share(m).at_least(needed_);
  }
  /// Where the engine's CPU binds (w = 0), a move (window, tell and move:
  /// 4.5 remote accesses of engine work) pays only when the key is used again
  /// here: half of such moves must get a second use. Where the link binds
  /// (w = 1), a move sends the slot once against a row twice for a pull and a
  /// push, and pays with its first use. In between, the share needed scales
  /// with what a move costs beyond its first use's saving (row / slot: the
  /// keys' mean bytes).
  void set_link_weight(double w, double row, double slot) {
    auto move = [&](double x) {
      return IntentCosts::units(IntentCosts::kWindow, x, row, slot) + IntentCosts::units(IntentCosts::kTell, x, row, slot) +
             IntentCosts::units(IntentCosts::kMove, x, row, slot);
    };
    const double first_use = 2 * IntentCosts::units(IntentCosts::kAccess, 0, row, slot);  // a pull and a push
    needed_ = 0.5 * std::clamp((move(w) - first_use) / (move(0) - first_use), 0.0, 1.0);
  }
  /// This rank told the home to move key k here for a one-clock window at `clock`.
  void told(int64_t k, Meta& m, int64_t clock);
  /// An intent of this rank for key record `m` while the key is here (or on
  /// its way here): a move it asked for got a second use.
  void used_again(Meta& m) {
    if (!(m.flags & F_MOVED)) return;
    m.flags &= static_cast<uint8_t>(~F_MOVED);
    share(m).event();
    share(m).hit();
  }
  /// Key record `m` leaves this rank for another rank (or a later intent found
  /// it not here): a move not used again was one use.
  void missed(Meta& m) {
    if (!(m.flags & F_MOVED)) return;
    m.flags &= static_cast<uint8_t>(~F_MOVED);
    share(m).event();
  }
  /// Moves whose second use did not come within the horizon were one use.
  void expire(int64_t clock, Meta* meta);
  /// An intent of a key this rank holds a replica of, or was told to access
  /// without one (intent.hpp): `steady` when it is used in consecutive clocks.
  void note_replica_use(bool steady) {
    replica_uses_.event();
    if (steady) replica_uses_.hit();
  }
  /// Whether replicas of keys not used in consecutive clocks pay here: while at
  /// least half of the uses of such keys were steady (at first: as AdaPM does).
  bool replicas_pay() const { return replica_uses_.at_least_half(); }

 private:
  // keys never taken away from here, and keys another rank took away before
  // (shared keys that move back and forth): their moves pay differently
  DecayingShare& share(const Meta& m) { return m.taken ? contested_ : fresh_; }
  const DecayingShare& share(const Meta& m) const { return m.taken ? contested_ : fresh_; }
  static constexpr int64_t kMinHorizon = 16;
  int64_t horizon_;
  double needed_ = 0.5;              // share of one-clock moves that must get a second use
  DecayingShare fresh_, contested_;  // one-clock moves (hit: a second use here)
  DecayingShare replica_uses_;       // uses of replicated keys (hit: steady)
  std::deque<std::pair<int64_t, int64_t>> awaiting_;  // (deadline clock, key) of moves told, in clock order
};

/// Intents take effect in rounds every this many clocks (intent.hpp): with
/// peers on other nodes a quarter of the lookahead, so an intent still takes
/// effect at least three quarters of the lookahead before its window; every
/// clock on one node (messages are cheap there and a round's burst of moves
/// delays the workers' requests) and for short lookaheads (< 8), which leave
/// no slack to spend.
inline int64_t intent_round_of(int64_t lookahead, bool one_node) {
  return !one_node && lookahead >= 8 ? lookahead / 4 : 1;
}

class Engine {
 public:
  /// `lengths`: every key's value length, or nullptr and `uniform_len` for one length.
  Engine(uintptr_t comm, uintptr_t coll, int64_t num_keys, const int64_t* lengths, int64_t uniform_len, int dtype,
         int num_workers, int technique, int64_t lookahead, int64_t sync_every, bool prefault, bool shared_memory,
         const Rule& rule, double link_rate = -1)
      : comm_(distkit::mpi::comm_from_handle(comm)),
        coll_(distkit::mpi::comm_from_handle(coll)),
        rank_(rank_in(comm_)),
        size_(size_of(comm_)),
        num_keys_(checked_positive(num_keys, "num_keys")),
        dtype_(checked_dtype(dtype)),
        num_workers_(static_cast<int>(checked_positive(num_workers, "num_threads"))),
        tech_(technique),
        lookahead_(lookahead),
        sync_every_(sync_every < 1 ? 1 : sync_every),
        sh_(lengths, uniform_len, num_keys, size_, dtype_, rule),
        sendq_(comm_),
        inbox_(size_),
        reuse_(lookahead) {
    int provided = 0;
    MPI_Query_thread(&provided);
    check<distkit::Error>(provided == MPI_THREAD_MULTIPLE,
                          "kvps needs MPI_THREAD_MULTIPLE (initialise MPI through mpi4py with the default "
                          "thread level 'multiple'); the MPI library provided level ",
                          provided);
    const Layout& lay = sh_.layout();
    if (prefault) ::kvps::prefault(sh_.delta_arena().data(), sh_.delta_arena().size());
    shm_.setup(coll_, rank_, size_, static_cast<size_t>(num_keys_) * sizeof(Meta), lay.arena_bytes() + 64,
               shared_memory, prefault);
    intent_round_ = intent_round_of(lookahead_, shm_.one_node());
    probe_round_ = intent_round_of(lookahead_, false);
    ledger_.init(tech_ == T_ALL && !shm_.all_reach(), lookahead_, intent_round_, size_);
    if (ledger_.enabled()) init_link(link_rate);
    meta_ = reinterpret_cast<Meta*>(shm_.meta(rank_));
    std::uninitialized_default_construct_n(meta_, num_keys_);
    dir_.init(meta_, num_keys_, rank_, size_);
    sh_.attach(shm_.values(rank_), meta_, rank_);
    pmeta_.resize(size_);
    for (int r = 0; r < size_; ++r) pmeta_[r] = reinterpret_cast<Meta*>(shm_.meta(r));
    // every rank's records are ready before any peer serves a key in place
    // (the constructor is collective: the Server's first call may do so)
    shm_.publish();
    distkit::mpi::check(MPI_Barrier(coll_), "MPI_Barrier");
    clocks_ = std::vector<std::atomic<int64_t>>(num_workers_);
    synced_ = std::vector<std::atomic<int64_t>>(num_workers_);
    for (auto& c : clocks_) c.store(0);
    for (auto& c : synced_) c.store(0);
    reqs_.init(num_workers_);
    pending_intents_.resize(num_workers_);
    active_intents_.resize(num_workers_);
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }

  ~Engine() { stop(); }

  // ------------------------------------------------------------------ info
  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t num_keys() const { return num_keys_; }
  int key_state(int64_t k) const { return dir_.state_locked(k); }
  /// Elements a worker passes for these keys (their rows).
  int64_t value_count(const int64_t* keys, int64_t n) const { return sh_.layout().row_count(keys, n); }
  /// Elements stored per key (row + optimizer state).
  /// The slot length of every key when all are equal, else 0.
  int64_t uniform_slot_len() const { return sh_.layout().uniform_slot(); }
  std::vector<int64_t> slot_lengths() const {
    std::vector<int64_t> out(num_keys_);
    for (int64_t k = 0; k < num_keys_; ++k) out[k] = sh_.layout().slot(k);
    return out;
  }
  /// Keys served so far by this rank's workers: from its own shard, from a
  /// node-local peer's shard in shared memory, and through messages.
  /// Then: keys whose intent the home was told of (to move them here), and
  /// keys whose intent the cost model left at their owners.
  /// Then the ledger (ledger.hpp): whether every intended key goes through
  /// intent (1) or only the probe keys (0), how often that changed, and the
  /// probe's recent gains and costs in remote accesses (rounded).
  /// Then the link between hosts (link.hpp): its rate in bytes/s (0: not
  /// weighed) and how much bytes count, in thousandths.
  std::array<int64_t, 11> stats() const {
    return {n_local_.load(),
            n_shared_.load(),
            n_remote_.load(),
            n_told_.load(),
            n_classic_.load(),
            ledger_.all_keys() ? 1 : 0,
            ledger_.switches(),
            static_cast<int64_t>(ledger_.gains() + 0.5),
            static_cast<int64_t>(ledger_.costs() + 0.5),
            static_cast<int64_t>(link_.rate()),
            static_cast<int64_t>(link_.weight() * 1000 + 0.5)};
  }
  /// Whether this rank reads and updates node-local peers' shards in place.
  bool shares_memory() const { return shm_.shares_peers(); }
  int64_t num_replicas() { return reps_.count(dir_); }

  // ------------------------------------------------------------- worker ops
  int64_t op(int op, int worker, const int64_t* keys, int64_t n, char* vals);
  int64_t localize(int worker, const int64_t* keys, int64_t n);
  void intent(int worker, const int64_t* keys, int64_t n, int64_t start, int64_t end);
  int64_t advance_clock(int worker);
  int64_t current_clock(int worker) const { return clocks_[worker].load(); }
  void wait_sync();
  void wait(int64_t ts) {
    reqs_.wait(ts, rank_, [this] {
      Cmd c;
      c.type = C_DUMP;
      post(std::move(c));
    });
  }
  void waitall(int worker) {
    for (int64_t t : reqs_.take_worker_ts(worker)) wait(t);
  }
  void barrier();
  void worker_barrier();

  // --------------------------------------------------- state for save/load
  std::vector<int64_t> owned_keys() const {
    std::vector<int64_t> out;
    for (int64_t k = 0; k < num_keys_; ++k)
      if (meta_[k].state == OWNED) out.push_back(k);
    return out;
  }
  /// Copy the slots of `keys` (owned here) into `out`, concatenated.
  void read_slots(const int64_t* keys, int64_t n, char* out) const {
    for (int64_t i = 0; i < n; ++i) {
      const size_t b = sh_.layout().slot_bytes(keys[i]);
      std::memcpy(out, sh_.slot(keys[i]), b);
      out += b;
    }
  }
  void write_slots(const int64_t* keys, int64_t n, const char* in) {
    for (int64_t i = 0; i < n; ++i) {
      const size_t b = sh_.layout().slot_bytes(keys[i]);
      std::memcpy(sh_.slot(keys[i]), in, b);
      in += b;
    }
  }
  /// Every key back to its home, replicas and intents dropped. Collective;
  /// the caller guarantees quiescence (barriers around it).
  void reset_ownership() {
    Cmd c;
    c.type = C_RESET;
    wait(submit(std::move(c), 1, -1));
  }

  // ------------------------------------------------------------- lifecycle
  /// Leave without shutdown() (interpreter exit): tell every peer, so that
  /// their pending and further operations fail at once instead of hanging.
  void abandon() {
    if (!running_.load()) return;
    Cmd c;
    c.type = C_BYE;
    post(std::move(c));
    for (int i = 0; i < 500 && !bye_sent_.load() && !reqs_.failed(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop();
  }
  /// Ignore replica/relocation grants from now on (the first step of shutdown).
  void begin_shutdown() { shutting_down_ = true; }
  void stop() {
    shm_.retire();
    if (!running_.exchange(false)) return;
    ring(shm_.bell());
    if (thread_.joinable()) thread_.join();
    prof_.print(rank_);
  }

 private:
  static int rank_in(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int size_of(MPI_Comm c) {
    int n = 1;
    MPI_Comm_size(c, &n);
    return n;
  }
  static int64_t checked_positive(int64_t v, const char* name) {
    check(v > 0, name, " must be > 0, got ", v);
    return v;
  }
  static distkit::DType checked_dtype(int code) {
    const distkit::DType d = distkit::dtype_from_code(code);
    check(distkit::is_floating(d), "value dtype must be floating, got ", distkit::dtype_name(d));
    return d;
  }

  void check_alive() {
    reqs_.check_failed();
    check<distkit::Error>(running_.load(), "the kvps server was shut down");
  }

  /// Every command a worker waits for is made here: a request expecting
  /// `remaining` answers (for a pull: written to `out` at `out_off`), listed
  /// for `worker`'s waitall (none when -1), then posted. Returns its timestamp.
  int64_t submit(Cmd&& c, int64_t remaining, int worker, char* out = nullptr, std::vector<int64_t> out_off = {}) {
    c.ts = reqs_.next_ts();
    c.worker = worker;
    auto req = std::make_shared<Request>();
    req->remaining = remaining;
    req->worker = worker;
    req->out = out;
    req->out_off = std::move(out_off);
    const int64_t ts = c.ts;
    reqs_.add(ts, std::move(req), worker);
    post(std::move(c));
    return ts;
  }

  /// Queue a command for the progress thread and wake it.
  void post(Cmd&& c) {
    {
      std::lock_guard<std::mutex> lk(cmd_mu_);
      cmds_.push_back(std::move(c));
      has_cmds_.store(true);
    }
    ring(shm_.bell());
  }

  bool direct(int op, int64_t k, char* v);
  bool try_direct(int p, int op, int64_t k, char* v);

  // -- progress thread (protocol.hpp unless noted)
  void loop();
  void handle_cmd(Cmd& c);
  void route(Cmd& c, Outbox& ob);
  void sync_round(bool refresh, bool all_intents, Outbox& ob);
  void handle_msg(int src, const char* buf);
  void on_pull_resp(int src, const MsgView& m);
  void on_fetch_resp(int src, const MsgView& m);
  void on_rsync_resp(int src, const MsgView& m);
  void on_rcheck_resp(int src, const MsgView& m);
  void on_localize(const MsgView& m, Outbox& ob);
  void on_repl_grant(const MsgView& m, Outbox& ob);
  void on_bye(int src);
  void share_ledger();
  void serve(int32_t type, int32_t origin, int64_t ts, int64_t pos, int64_t k, const char* val, Outbox& ob);
  void handover(int64_t k, const char* v, uint32_t ver, Outbox& ob);
  void start_localize(const std::vector<int64_t>& keys, int64_t ts, Outbox& ob);
  void mark_incoming(const int64_t* keys, int64_t n);
  void queue_return(int64_t k);
  void relocate(int64_t k, int r, Outbox& ob);
  void grant_replica(int64_t k, int q, Outbox& ob);
  void do_reset();
  void dump();
  void finish(Outbox& ob) {
    complete_done();
    flush(ob);
  }
  void flush(Outbox& ob) {
    ob.flush([this](int dest, int32_t type, int32_t origin, int64_t ts, const Builder& b) {
      send(dest, type, origin, ts, b);
    });
  }
  void send(int dest, int32_t type, int32_t origin, int64_t ts, const Builder& b) {
    link_.sent(dest, sendq_.send(dest, type, origin, ts, b));
    prof_.sent(type, static_cast<int64_t>(b.keys.size()));
    if (dest != rank_)
      if (Doorbell* bell = shm_.bell_of(dest)) ring(bell);
  }
  /// Complete the requests collected in done_ (one lock per request, not per key).
  void complete_done();
  void check_sync_waiters();
  // -- intents (intent.hpp)
  void process_intents(int w, Outbox& ob);
  /// Must an intent for clock `start`, posted at clock `now`, take effect now?
  /// It takes effect in the first intent round at or after `start - lookahead`:
  /// now if that round is this clock's or already past, else in that round.
  bool intent_due_now(int64_t start, int64_t now) const {
    const int64_t round = intent_round();
    return start - lookahead_ <= now - now % round;
  }
  /// The current intent round: while only the probe keys go through intent
  /// (ledger.hpp), their few keys per round would cost a burst of small
  /// messages every clock; rounds as between nodes batch them.
  int64_t intent_round() const { return ledger_.all_keys() ? intent_round_ : probe_round_; }
  void drop_intents(const std::vector<int64_t>& drop, Outbox& ob);
  /// Intent work `c` spent on key k, for the ledger (probe keys only).
  void intent_cost(int64_t k, const IntentCost& c) {
    if (!ledger_.counts(k)) return;
    const Layout& lay = sh_.layout();
    ledger_.cost(IntentCosts::units(c, link_.weight(), static_cast<double>(lay.row_bytes(k)),
                                    static_cast<double>(lay.slot_bytes(k))));
  }
  /// The link's rate between hosts (`rate` bytes/s; < 0: measure it) and the
  /// keys' mean row and slot bytes, for the link's weight (link.hpp).
  void init_link(double rate) {
    std::vector<uint8_t> off(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) off[static_cast<size_t>(r)] = r != rank_ && !shm_.reaches(rank_, r);
    if (rate < 0) rate = LinkMeter::measure(coll_, rank_, size_, off, kTag + 1);
    // the sums remember about as long as the ledger's
    link_.init(rate, std::move(off), static_cast<double>(IntentLedger::kMemoryClocks) / static_cast<double>(intent_round_));
    const Layout& lay = sh_.layout();
    double row = 0, slot = 0;
    const int64_t n = lay.uniform_slot() > 0 ? 1 : num_keys_;
    for (int64_t k = 0; k < n; ++k) {
      row += static_cast<double>(lay.row_bytes(k));
      slot += static_cast<double>(lay.slot_bytes(k));
    }
    mean_row_ = row / static_cast<double>(n);
    mean_slot_ = slot / static_cast<double>(n);
  }
  /// Once per intent round, before the ledger settles: the link's weight now.
  void settle_link() {
    if (!ledger_.enabled()) return;
    link_.settle();
    reuse_.set_link_weight(link_.weight(), mean_row_, mean_slot_);
  }
  void release_replica(Meta& m, int64_t k, std::map<int, Builder>& flushes);
  void send_flushes(std::map<int, Builder>& flushes, Outbox& ob);
  void send_intent(int32_t type, const std::vector<int64_t>& keys, const std::vector<uint8_t>* replica, Outbox& ob);
  void home_intent(int32_t type, int32_t r, const int64_t* keys, const int64_t* replica, int64_t n, Outbox& ob);

  /// Prefetch the record (and the value) of the key kAheadKeys positions
  /// further on: the handlers walk random keys of tables much larger than
  /// the caches, where waiting for one miss at a time would dominate.
  static constexpr int64_t kAheadKeys = 16;
  void ahead(const int64_t* keys, int64_t n, int64_t i, bool val) const {
    const int64_t j = i + kAheadKeys;
    if (j >= n) return;
    const int64_t k = keys[j];
    __builtin_prefetch(&meta_[k], 1);
    if (!val) return;
    if (const char* p = sh_.home_slot(k)) {
      const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(sh_.layout().slot_bytes(k)), 256);
      for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 1);
    }
  }

  MPI_Comm comm_, coll_;
  int rank_ = 0, size_ = 1;
  int64_t num_keys_;
  distkit::DType dtype_;
  int num_workers_;
  int tech_;
  int64_t lookahead_;
  int64_t intent_round_ = 1;  // intents take effect in sync rounds every intent_round_ clocks (intent.hpp)
  int64_t probe_round_ = 1;   // ... every probe_round_ clocks while only probe keys do (intent_round())
  int64_t sync_every_;

  Shard sh_;
  NodeShm shm_;
  Directory dir_;
  Replicas reps_;
  Requests reqs_;
  Profiler prof_;
  SendQueue sendq_;
  Inbox inbox_;
  Meta* meta_ = nullptr;       // this rank's records (dir_'s; in its shared segment when shared)
  std::vector<Meta*> pmeta_;   // node-local peers' records (nullptr: not shared)
  std::atomic<int64_t> n_local_{0}, n_shared_{0}, n_remote_{0};  // keys served, per path
  std::atomic<int64_t> n_told_{0}, n_classic_{0};                 // intents, per decision
  ReuseModel reuse_;                                              // progress thread only
  IntentLedger ledger_;                                           // whether intent pays (ledger.hpp)
  LinkMeter link_;                                                // what binds between hosts (link.hpp)
  double mean_row_ = 0, mean_slot_ = 0;                           // the keys' mean bytes

  std::mutex cmd_mu_;
  std::deque<Cmd> cmds_;
  std::atomic<bool> has_cmds_{false};

  std::vector<std::atomic<int64_t>> clocks_;
  std::vector<std::atomic<int64_t>> synced_;  // last clock whose sync round the engine ran, per worker
  std::mutex clock_mu_;
  std::condition_variable clock_cv_;

  // progress thread only
  std::vector<std::multimap<int64_t, IntentEntry>> pending_intents_, active_intents_;
  std::unordered_map<int64_t, std::vector<int64_t>> waiters_;  // localize requests per key
  std::unordered_map<int64_t, std::vector<PendingOp>> pending_;
  std::vector<int64_t> done_;  // completions collected over one message
  std::vector<int64_t> sync_waiters_;
  int64_t noticed_pending_ = 0;  // keys the home moved here whose value has not arrived
  std::chrono::steady_clock::time_point drain_start_{};

  std::mutex wb_mu_;
  std::condition_variable wb_cv_;
  int wb_count_ = 0;
  uint64_t wb_gen_ = 0;

  std::atomic<bool> running_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> bye_sent_{false};
  std::thread thread_;
};

// ---------------------------------------------------------------- worker side

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
  Cmd c;
  c.type = C_LOCALIZE;
  for (int64_t k : u)
    if (key_state(k) != OWNED) c.keys.push_back(k);
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

#include "intent.hpp"
#include "protocol.hpp"
