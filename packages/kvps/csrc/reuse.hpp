// reuse.hpp - the cost model's memory: whether moving a key here for a one-clock
// window pays, judged from what earlier such moves got (intent.hpp describes the
// model; ledger.hpp prices its parts).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <utility>

#include "directory.hpp"
#include "ledger.hpp"

namespace kvps {

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
    return window >= 2 || (recurs && !(m.marks & K_TAKEN)) || share(m).at_least(needed_);
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
  DecayingShare& share(const Meta& m) { return (m.marks & K_TAKEN) ? contested_ : fresh_; }
  const DecayingShare& share(const Meta& m) const { return (m.marks & K_TAKEN) ? contested_ : fresh_; }
  static constexpr int64_t kMinHorizon = 16;
  int64_t horizon_;
  double needed_ = 0.5;              // share of one-clock moves that must get a second use
  DecayingShare fresh_, contested_;  // one-clock moves (hit: a second use here)
  DecayingShare replica_uses_;       // uses of replicated keys (hit: steady)
  std::deque<std::pair<int64_t, int64_t>> awaiting_;  // (deadline clock, key) of moves told, in clock order
};

inline ReuseModel::Seen ReuseModel::note(Meta& m, int64_t start, int64_t end) {
  // clocks + 1 (0 marks "never"), compared modulo 2^32
  const uint32_t s = static_cast<uint32_t>(start) + 1;
  const uint32_t e = static_cast<uint32_t>(end) + 1;
  const int32_t gap = static_cast<int32_t>(s - m.last);
  const Seen seen{m.last != 0 && gap <= horizon_, m.last != 0 && gap <= 0};
  if (m.last == 0 || static_cast<int32_t>(e - m.last) > 0) m.last = e;
  return seen;
}

inline void ReuseModel::told(int64_t k, Meta& m, int64_t clock) {
  if (m.flags & F_MOVED) missed(m);  // (an earlier move not used again: one use)
  m.flags |= F_MOVED;
  awaiting_.emplace_back(clock + horizon_, k);
}

inline void ReuseModel::expire(int64_t clock, Meta* meta) {
  while (!awaiting_.empty() && awaiting_.front().first <= clock) {
    missed(meta[awaiting_.front().second]);  // (no-op when resolved since)
    awaiting_.pop_front();
  }
}

}  // namespace kvps
