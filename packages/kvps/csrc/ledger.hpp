// ledger.hpp - whether intent pays, measured on a probe sample of keys.
//
// The cost model in intent.hpp judges one key from its own intent windows. It
// cannot see what the moves it orders really cost against what they save: a
// key wanted by two ranks ping-pongs or is replicated and refreshed every
// round, another rank's intent takes away a key homed here, and bookkeeping a
// key's intent costs engine time even when nothing moves. The ledger measures
// it on probe keys (one key in kProbeStride, chosen by a hash: the same keys
// on every rank), counting in units of one remote access (a pull or a push of
// one key by messages, both ends together):
//   gains: each access of a probe key by this rank's workers that is served
//          near (here, or in place in a co-located peer's shard) where the
//          classic server would have sent it to a remote home, minus each one
//          that goes remote where the classic server would have served it near
//          (a key homed here that another rank's intent took away);
//   costs: the work intent spends on probe keys: each intent window's
//          bookkeeping, each intent told to the home, each relocation here,
//          each replica fetched, refreshed or flushed, weighted by what it
//          costs relative to a remote access (IntentCosts): in engine work
//          where the engine's CPU binds, in bytes where the link between
//          hosts does, and in between by the link's weight (link.hpp).
// Moving a key helps one rank and may cost another, so the choice is made on
// the sum over all ranks: each rank sends its probe's gains and costs to the
// others every few rounds (M_LEDGER), and every rank decides on the same sum.
//
// While the gains cover the costs, every intended key goes through intent.
// When they do not, intent pauses for the windows of one clock, whose reuse
// the cost model only infers (a longer window announces several uses and
// always goes through intent): their keys are accessed the classic way,
// without any intent work, not even bookkeeping. Only the probe keys still go
// through intent, and only for windows starting in one slice of clocks out of
// kDuty, because a few keys' intents cost a burst of small messages per round
// whatever their number; each probe period that confirms clearly that intent
// does not pay doubles the period (up to kMaxDuty slices). When the probe's
// gains exceed its costs again, intent resumes. Each change waits until the gains of the last one could be
// seen (the lookahead) and needs a margin, so the choice does not flap.
//
// Keys moved before a pause that were used there again (or came for a longer
// window, or by localize) stay where they are (relocation sticks,
// intent.hpp): they keep serving their rank locally, and their probe keys keep
// counting as gains, so a workload whose moved keys pay over their whole stay
// (a worker's own rows) shows it, and intent resumes. The other keys moved
// for a single use go back to their homes, at the pause or when their windows
// end (Engine::give_back, give_back_ended); probe keys stay, as with intent on.
//
// So where intent does not pay it costs about the probe's share of its
// overhead, and the choice follows the workload. The ledger applies to the
// adaptive technique ("all"); "relocation_only" and "replication_only" act on
// every intent, as the user asked.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace kvps {

/// What one piece of intent work costs: engine work, relative to one remote
/// access of one key (engine time per key with KVPS_PROFILE=1 on the Zipf
/// benchmark: docs, kvps performance), and what it sends between hosts: rows,
/// slots (a row and its optimizer state) and 16-byte key records.
struct IntentCost {
  double cpu, rows, slots, records;
};

struct IntentCosts {
  static constexpr IntentCost kWindow{0.5, 0, 0, 0};  // one key's intent window: activation and end
  static constexpr IntentCost kTell{1.5, 0, 0, 2};    // M_INTENT_ADD and M_INTENT_DROP at the home
  static constexpr IntentCost kMove{2.5, 0, 1, 3};    // notice, transfer and handover of a key relocated here
  static constexpr IntentCost kFetch{2.0, 0, 1, 2};   // grant, fetch and its response for a replica
  static constexpr IntentCost kRsync{1.2, 1, 1, 2};   // a replica refresh with updates, and its response
  static constexpr IntentCost kRcheck{0.5, 0, 0, 2};  // a replica refresh without updates
  static constexpr IntentCost kFlush{1.2, 1, 0, 1};   // a released replica's updates applied at the owner
  /// The unit: one pull (a record out, the row and its record back) or one push.
  static constexpr IntentCost kAccess{1.0, 1, 0, 1.5};
  static constexpr double kRecordBytes = 16;

  /// What `c` costs for a key of `row` / `slot` bytes, in remote accesses:
  /// engine work and bytes, the bytes weighted by `w` (link.hpp).
  static double units(const IntentCost& c, double w, double row, double slot) {
    const double bytes = c.rows * row + c.slots * slot + c.records * kRecordBytes;
    const double access = kAccess.rows * row + kAccess.records * kRecordBytes;
    return (1.0 - w) * c.cpu + w * bytes / access;
  }
};

class IntentLedger {
 public:
  /// One key in kProbeStride is a probe key.
  static constexpr uint64_t kProbeStride = 32;

  static bool probe(int64_t k) {
    // the splitmix64 finaliser: consecutive keys land in unrelated classes
    uint64_t z = static_cast<uint64_t>(k) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z % kProbeStride == 0;
  }

  /// `enabled`: the technique adapts (T_ALL) and some shard is not reachable in
  /// place. `lookahead`: clocks from an intent's effect to its use; `round`:
  /// clocks per settle() call.
  void init(bool enabled, int64_t lookahead, int64_t round, int size) {
    enabled_ = enabled;
    warm_rounds_ = first_judgement(lookahead, round) / round;
    // the sums cover about kMemoryClocks clocks (at least two rounds) ...
    all_decay_ = 1.0 - 1.0 / std::max<double>(2.0, static_cast<double>(kMemoryClocks) / static_cast<double>(round));
    hold_until_ = warm_rounds_;
    share_rounds_ = std::max<int64_t>(1, kShareClocks / round);
    slice_ = std::max<int64_t>(kMinSlice, 2 * lookahead);
    round_ = round;
    peer_gain_.assign(static_cast<size_t>(size), 0);
    peer_cost_.assign(static_cast<size_t>(size), 0);
  }
  bool enabled() const { return enabled_; }
  /// The clock of the first judgement (a multiple of `round`): the lookahead
  /// plus kMinClocks, and one round more.
  static int64_t first_judgement(int64_t lookahead, int64_t round) {
    return ((lookahead + kMinClocks + round - 1) / round + 1) * round;
  }

  /// Workers: net accesses of probe keys served near instead of remote (may be negative).
  void gain(int64_t accesses) {
    if (accesses != 0) gains_.fetch_add(accesses, std::memory_order_relaxed);
  }
  /// Progress thread: whether intent work on key k is counted (probe keys).
  bool counts(int64_t k) const { return enabled_ && probe(k); }
  /// Progress thread: intent work spent on a probe key, in remote accesses.
  void cost(double units) { round_cost_ += units; }

  /// Progress thread, once per intent round: fold the round in and decide.
  /// Returns whether to send this rank's sums to the others now (share()).
  bool settle() {
    if (!enabled_) return false;
    // (... and while paused, one probe period)
    const double decay = all_keys_.load(std::memory_order_relaxed)
                             ? all_decay_
                             : 1.0 - static_cast<double>(round_) / static_cast<double>(period());
    gain_ = gain_ * decay + static_cast<double>(gains_.exchange(0, std::memory_order_relaxed));
    cost_ = cost_ * decay + round_cost_;
    round_cost_ = 0;
    ++rounds_;
    double gain = gain_, cost = cost_;
    for (size_t r = 0; r < peer_gain_.size(); ++r) {
      gain += peer_gain_[r];
      cost += peer_cost_[r];
    }
    shown_gain_.store(gain, std::memory_order_relaxed);
    shown_cost_.store(cost, std::memory_order_relaxed);
    const bool share = rounds_ % share_rounds_ == 0;
    // The gains of an intent come `lag` rounds after its costs: judge only once
    // both have been seen for a while since the last change (while paused: a
    // whole probe period).
    const bool all = all_keys_.load(std::memory_order_relaxed);
    if (rounds_ < hold_until_ || cost <= 0) return share;
    if (all && gain < kLeave * cost) {
      all_keys_.store(false, std::memory_order_relaxed);
      switches_.fetch_add(1, std::memory_order_relaxed);
      paused_now_ = true;
      hold_until_ = rounds_ + period() / round_ + warm_rounds_;
    } else if (!all && gain > kReturn * cost) {
      all_keys_.store(true, std::memory_order_relaxed);
      switches_.fetch_add(1, std::memory_order_relaxed);
      duty_.store(kDuty, std::memory_order_relaxed);
      hold_until_ = rounds_ + warm_rounds_;
    } else if (!all && gain < kBackoff * cost) {
      // a whole period confirmed it clearly: probe half as often (probing costs too)
      duty_.store(std::min(2 * duty_.load(std::memory_order_relaxed), kMaxDuty), std::memory_order_relaxed);
      hold_until_ = rounds_ + period() / round_;
    }
    return share;
  }

  /// Progress thread: whether intent paused in the last settle() (once per pause).
  bool take_pause() {
    const bool p = paused_now_;
    paused_now_ = false;
    return p;
  }

  /// This rank's sums for M_LEDGER: gains and costs in thousandths of a remote access.
  int64_t wire_gain() const { return static_cast<int64_t>(gain_ * kWireScale); }
  int64_t wire_cost() const { return static_cast<int64_t>(cost_ * kWireScale); }
  /// Progress thread: rank r's latest sums (M_LEDGER).
  void peer(int r, int64_t gain, int64_t cost) {
    if (r < 0 || static_cast<size_t>(r) >= peer_gain_.size()) return;
    peer_gain_[static_cast<size_t>(r)] = static_cast<double>(gain) / kWireScale;
    peer_cost_[static_cast<size_t>(r)] = static_cast<double>(cost) / kWireScale;
  }

  /// Whether every intended key goes through intent (else only probe keys).
  bool all_keys() const { return !enabled_ || all_keys_.load(std::memory_order_relaxed); }
  /// Whether the ledger holds back intent windows [start, end) while paused:
  /// those of one clock, whose reuse the cost model infers. A longer window
  /// announces several uses, and its keys always go through intent.
  static bool gated(int64_t start, int64_t end) { return end - start < 2; }
  /// While paused: whether the probe keys of a window starting at clock `start` go through intent.
  bool probing(int64_t start) const {
    return start >= 0 && (start / slice_) % duty_.load(std::memory_order_relaxed) == 0;
  }
  /// The probe's recent gains and costs over all ranks (decayed sums, in
  /// remote accesses) and how often the choice changed so far (any thread).
  double gains() const { return shown_gain_.load(std::memory_order_relaxed); }
  double costs() const { return shown_cost_.load(std::memory_order_relaxed); }
  int64_t switches() const { return switches_.load(std::memory_order_relaxed); }

 public:
  // The sums' memory while intent is on, and how long a judgment waits after
  // the lookahead: long enough for keys moved here to be used here again a few
  // times (a move is paid once; what it saves comes with every later use while
  // the key stays), so that the burst of first moves is not judged alone.
  static constexpr int64_t kMemoryClocks = 128;
  static constexpr int64_t kMinClocks = 64;

 private:
  static constexpr double kLeave = 0.9, kReturn = 1.25;  // (a change costs moves: only for a clear gain)
  static constexpr int64_t kShareClocks = 4;  // how often a rank sends its sums (M_LEDGER)
  static constexpr int64_t kDuty = 8, kMaxDuty = 64, kMinSlice = 16;  // the paused probe: 1 slice of clocks in duty_
  static constexpr double kBackoff = 0.5;

  int64_t period() const { return duty_.load(std::memory_order_relaxed) * slice_; }
  static constexpr double kWireScale = 1000;

  bool enabled_ = false;
  int64_t warm_rounds_ = 1, hold_until_ = 1, share_rounds_ = 1, round_ = 1;
  std::atomic<int64_t> duty_{kDuty};
  int64_t slice_ = kMinSlice;
  double all_decay_ = 0.5;
  std::atomic<int64_t> gains_{0};
  std::atomic<bool> all_keys_{true};
  std::atomic<int64_t> switches_{0};
  std::atomic<double> shown_gain_{0}, shown_cost_{0};
  // progress thread only
  double round_cost_ = 0, gain_ = 0, cost_ = 0;  // this rank's
  bool paused_now_ = false;
  std::vector<double> peer_gain_, peer_cost_;     // the other ranks' latest (0 for this one)
  int64_t rounds_ = 0;
};

}  // namespace kvps
