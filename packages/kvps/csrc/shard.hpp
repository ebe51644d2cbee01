// shard.hpp - this rank's keys: slots, replica deltas and the update rule.
#pragma once

#include <cstdint>
#include <cstring>

#include "directory.hpp"
#include "distkit/dtype.hpp"
#include "rules.hpp"
#include "store.hpp"

namespace kvps {

/// The value side of a rank's shard. The arena holds the slot of every key
/// this rank owns or replicates (store.hpp); the delta arena, laid out the
/// same, holds per replica the updates pushed here since its last refresh
/// (row elements: summed values, or summed gradients under an optimizer).
class Shard {
 public:
  Shard(const int64_t* lengths, int64_t uniform_row, int64_t num_keys, int size, distkit::DType dtype,
        const Rule& rule)
      : size_(size),
        lay_(lengths, uniform_row, num_keys, size, distkit::itemsize(dtype),
             [&](int64_t row) { return state_len(rule, row); }),
        rule_(rule),
        apply_(apply_fn(rule, dtype)),
        add_(add_fn(dtype)) {
    delta_ = Arena(lay_.arena_bytes() + 64);
    pool_.init(lay_);
  }

  /// The arena and key records this shard uses (set up by the engine).
  void attach(char* values, Meta* meta, int rank) {
    vals_ = values;
    meta_ = meta;
    rank_ = rank;
  }

  const Layout& layout() const { return lay_; }
  /// Key k's slot here (valid while the key is held here). The record's `slot` is read only
  /// for a key homed elsewhere: at the home the same bytes are `owner` (a union), which the
  /// progress thread rewrites without the key's lock while workers serve the key under it.
  char* slot(int64_t k) const { return vals_ + lay_.at(k, rank_, b_slot(k, rank_, meta_[k])); }
  char* delta(int64_t k) const { return delta_.data() + lay_.at(k, rank_, b_slot(k, rank_, meta_[k])); }
  /// Key k's slot here if k is homed here (its place is known without its
  /// record), else nullptr: for prefetching ahead, where reading the record
  /// to find a region-B slot would itself wait for memory.
  const char* home_slot(int64_t k) const {
    return lay_.home(k) == rank_ ? vals_ + lay_.at(k, rank_, -1) : nullptr;
  }
  /// Key k's slot in rank p's arena `values`, from p's record `m` of it.
  char* slot_of(char* values, int p, int64_t k, const Meta& m) const { return values + lay_.at(k, p, b_slot(k, p, m)); }
  Arena& delta_arena() { return delta_; }

  /// Key k arrives here (owned or replicated): give it a slot unless it has
  /// one (region A for keys homed here, a free region-B slot for others).
  void hold(int64_t k) {
    Meta& m = meta_[k];
    if (lay_.home(k) != rank_ && m.slot < 0) m.slot = pool_.take(lay_.cls(k), k);
  }
  /// Key k leaves (no longer owned nor replicated here): free its region-B slot.
  void release(int64_t k) {
    Meta& m = meta_[k];
    if (lay_.home(k) != rank_ && m.slot >= 0) {
      pool_.give(lay_.cls(k), m.slot);
      m.slot = -1;
    }
  }
  /// Every region-B slot free (every key back at its home).
  void reset() { pool_.reset(); }
  /// f(k) for every key homed elsewhere that is held here (owned or replicated).
  template <class F>
  void for_each_foreign(F&& f) const {
    pool_.for_each_key(f);
  }

  /// One push of `src` (a row) into key k's slot, by the server's rule.
  void apply(int64_t k, const char* src) const { apply_(rule_, slot(k), src, lay_.row(k)); }
  /// The same into any slot of key k's length (a co-located peer's).
  void apply_at(char* slot, int64_t k, const char* src) const { apply_(rule_, slot, src, lay_.row(k)); }
  /// Accumulate a pushed row into key k's delta.
  void add_delta(int64_t k, const char* src) const { add_(delta(k), src, lay_.row(k)); }
  void clear_delta(int64_t k) const { std::memset(delta(k), 0, lay_.row_bytes(k)); }
  /// Apply key k's accumulated delta to its slot and clear it.
  void apply_delta(int64_t k) const {
    apply(k, delta(k));
    clear_delta(k);
  }

 private:
  /// Key k's region-B slot index in rank p's record `m` (-1, unread, when p is k's home).
  int32_t b_slot(int64_t k, int p, const Meta& m) const { return lay_.home(k) == p ? -1 : m.slot; }

  int size_;
  Layout lay_;
  Rule rule_;
  ApplyFn apply_;
  AddFn add_;
  SlotPool pool_;
  char* vals_ = nullptr;
  Meta* meta_ = nullptr;
  int rank_ = 0;
  Arena delta_;
};

}  // namespace kvps
