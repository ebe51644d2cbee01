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
//   commands.hpp   what workers hand the progress thread, intent windows
//   reuse.hpp      whether moving a key here pays (the cost model's memory)
// This header declares the Engine; its members are defined by concern in
//   worker_ops.hpp  the worker API (pull/push/set, localize, intent, clocks, barriers)
//   progress.hpp    the progress thread's loop and the workers' commands
//   protocol.hpp    message handlers: routing and serving key operations
//   relocation.hpp  keys moving between ranks: handover, localize, relocate, replicas
//   intent.hpp      intent windows, the home's decisions, the cost model
// (module.cpp includes them all). README "How it works" describes the protocol.
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

#include "commands.hpp"
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
#include "reuse.hpp"
#include "requests.hpp"
#include "rules.hpp"
#include "shard.hpp"
#include "wire.hpp"

namespace kvps {

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
  /// weighed) and how much bytes count, in thousandths. Last, key requests
  /// this rank forwarded because it did not hold the key (stale routing hints:
  /// each costs a message more), and keys it took back home from the ranks
  /// intent had moved them to when intent paused (give_back), and keys it
  /// holds away from their homes and announced to every rank then.
  std::array<int64_t, 14> stats() const {
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
            static_cast<int64_t>(link_.weight() * 1000 + 0.5),
            n_forwarded_.load(std::memory_order_relaxed),
            n_given_back_.load(std::memory_order_relaxed),
            n_announced_.load(std::memory_order_relaxed)};
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

  // -- serving a key in a node-local peer's shard (worker_ops.hpp)
  bool direct(int op, int64_t k, char* v);
  bool try_direct(int p, int op, int64_t k, char* v);

  // -- the progress thread's loop and the workers' commands (progress.hpp)
  void loop();
  void handle_cmd(Cmd& c);
  void route(Cmd& c, Outbox& ob);
  void sync_round(bool refresh, bool all_intents, Outbox& ob);
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
  // -- messages (protocol.hpp)
  void handle_msg(int src, const char* buf);
  void on_pull_resp(int src, const MsgView& m);
  void on_fetch_resp(int src, const MsgView& m);
  void on_rsync_resp(int src, const MsgView& m);
  void on_rcheck_resp(int src, const MsgView& m);
  void on_localize(const MsgView& m, Outbox& ob);
  void on_repl_grant(const MsgView& m, Outbox& ob);
  void on_bye(int src);
  void serve(int32_t type, int32_t origin, int64_t ts, int64_t pos, int64_t k, const char* val, Outbox& ob);
  // -- keys moving between ranks (relocation.hpp)
  void handover(int64_t k, const char* v, uint32_t ver, Outbox& ob);
  void start_localize(const std::vector<int64_t>& keys, int64_t ts, Outbox& ob);
  void mark_incoming(const int64_t* keys, int64_t n);
  void queue_return(int64_t k);
  void relocate(int64_t k, int r, Outbox& ob);
  void give_back(Outbox& ob);
  void give_back_ended(int64_t k, Outbox& ob);
  bool one_off_here(int64_t k) const;
  void on_give_back(int src, const MsgView& m, Outbox& ob);
  void on_here(int src, const MsgView& m);
  void to_every_rank(int32_t type, const Builder& b, Outbox& ob);
  void grant_replica(int64_t k, int q, Outbox& ob);
  // -- intents (intent.hpp)
  void share_ledger();
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

  static constexpr size_t kListKeys = size_t(1) << 22;  // keys per message of a key list (16 B each: 64 MiB)

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
  // key requests forwarded, keys taken home, kept keys announced (progress thread)
  std::atomic<int64_t> n_forwarded_{0}, n_given_back_{0}, n_announced_{0};
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

}  // namespace kvps
