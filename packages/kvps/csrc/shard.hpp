// shard.hpp - this rank's keys: slots, replica deltas and the update rule.
#pragma once

#include <cstdint>
#include <cstring>

#include "distkit/dtype.hpp"
#include "rules.hpp"
#include "store.hpp"

namespace kvps {

/// The value side of a rank's shard. The arena holds the slot of every key
/// this rank owns or replicates (at the same offset on every rank); the delta
/// arena holds, per replica, the updates pushed here since its last refresh
/// (row elements: summed values, or summed gradients under an optimizer).
class Shard {
 public:
  Shard(const int64_t* lengths, int64_t num_keys, distkit::DType dtype, const Rule& rule)
      : lay_(lengths, num_keys, distkit::itemsize(dtype), [&](int64_t row) { return state_len(rule, row); }),
        rule_(rule),
        apply_(apply_fn(rule, dtype)),
        add_(add_fn(dtype)) {
    delta_ = Arena(lay_.arena_bytes() + 64);
  }

  void attach(char* values) { vals_ = values; }

  const Layout& layout() const { return lay_; }
  char* slot(int64_t k) const { return vals_ + lay_.at(k); }
  char* delta(int64_t k) const { return delta_.data() + lay_.at(k); }
  char* values() const { return vals_; }
  Arena& delta_arena() { return delta_; }

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
  Layout lay_;
  Rule rule_;
  ApplyFn apply_;
  AddFn add_;
  char* vals_ = nullptr;
  Arena delta_;
};

}  // namespace kvps
