// store.hpp - where values live: lazily committed arenas and the per-key layout.
//
// A key's slot holds its row (value_lengths[k] elements: what workers pull,
// push and set) followed by the state of the server's optimizer, if any.
// A rank's arena has two regions. Region A holds the keys homed on the rank
// (key % size), packed in key order, so a rank's memory at the start is its
// share of the table and nothing more. Region B holds the keys it owns or
// replicates from other homes, each in a slot taken from a free list of
// slots of its length (the slot's index is kept in the rank's key record),
// so memory follows the keys a rank holds. Both regions are virtual address
// space committed page by page as slots are used.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

#include "distkit/error.hpp"
#include "keydiv.hpp"

namespace kvps {

using distkit::check;
using distkit::str;

/// A lazily committed, zero-filled virtual arena (pages cost memory only once touched).
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw distkit::OSError(str("mmap of ", bytes, " bytes for the value arena"), errno);
    p_ = static_cast<char*>(p);
#ifdef MADV_HUGEPAGE
    if (bytes >= (size_t(64) << 20)) madvise(p_, bytes, MADV_HUGEPAGE);  // fewer TLB misses on random rows
#endif
  }
  ~Arena() {
    if (p_) munmap(p_, size_);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept : p_(o.p_), size_(o.size_) { o.p_ = nullptr; }
  Arena& operator=(Arena&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
    return *this;
  }
  char* data() const { return p_; }
  size_t size() const { return size_; }

 private:
  char* p_ = nullptr;
  size_t size_ = 0;
};

/// Touch every page (memory committed now instead of on first use).
inline void prefault(char* p, size_t bytes) {
  volatile char* v = p;
  for (size_t o = 0; o < bytes; o += 4096) v[o] = 0;
}

/// Row and slot lengths of every key and where its slot is in a rank's arena, in elements.
class Layout {
 public:
  /// `lengths`: every key's row length, or nullptr with `uniform_row` for
  /// one length; `state_len(row)`: optimizer state elements behind a row.
  template <class StateLen>
  Layout(const int64_t* lengths, int64_t uniform_row, int64_t num_keys, int size, int64_t itemsize,
         StateLen&& state_len)
      : isz_(itemsize), num_keys_(num_keys), size_(size), kd_(size, num_keys) {
    if (!lengths) {
      check(uniform_row > 0, "value length must be > 0, got ", uniform_row);
      uniform_ = true;
      urow_ = uniform_row;
      uslot_ = uniform_row + state_len(uniform_row);
      a_size_ = (num_keys + size - 1) / size * uslot_;
      cls_len_ = {uslot_};
      cls_base_ = {0};
      cls_cap_ = {num_keys};
      b_size_ = num_keys * uslot_;
      return;
    }
    uniform_ = false;
    row_.assign(lengths, lengths + num_keys);
    off_a_.resize(num_keys);
    cls_.resize(num_keys);
    std::vector<int64_t> home_total(size, 0);
    std::vector<std::pair<int64_t, int32_t>> cls_of;  // slot length -> class, few distinct lengths
    for (int64_t k = 0; k < num_keys; ++k) {
      check(row_[k] >= 0, "value_lengths[", k, "] = ", row_[k], " is negative");
      const int64_t sl = row_[k] + state_len(row_[k]);
      const int h = static_cast<int>(k % size);
      off_a_[k] = home_total[h];
      home_total[h] += sl;
      int32_t c = -1;
      for (auto& [len, id] : cls_of)
        if (len == sl) c = id;
      if (c < 0) {
        c = static_cast<int32_t>(cls_len_.size());
        cls_of.push_back({sl, c});
        cls_len_.push_back(sl);
        cls_cap_.push_back(0);
      }
      cls_[k] = c;
      ++cls_cap_[c];
    }
    a_size_ = *std::max_element(home_total.begin(), home_total.end());
    int64_t base = 0;
    for (size_t c = 0; c < cls_len_.size(); ++c) {
      cls_base_.push_back(base);
      base += cls_cap_[c] * cls_len_[c];
    }
    b_size_ = base;
  }

  bool uniform() const { return uniform_; }
  int64_t itemsize() const { return isz_; }
  /// Elements a worker sees of key k.
  int64_t row(int64_t k) const { return uniform_ ? urow_ : row_[k]; }
  /// Elements stored for key k (row + optimizer state).
  int64_t slot(int64_t k) const { return uniform_ ? uslot_ : cls_len_[cls_[k]]; }
  size_t row_bytes(int64_t k) const { return static_cast<size_t>(row(k) * isz_); }
  size_t slot_bytes(int64_t k) const { return static_cast<size_t>(slot(k) * isz_); }
  /// The slot-length class of key k and how many slots of it region B has.
  int32_t cls(int64_t k) const { return uniform_ ? 0 : cls_[k]; }
  size_t classes() const { return cls_len_.size(); }
  int64_t capacity(int32_t c) const { return cls_cap_[c]; }
  /// Byte offset of key k's slot in rank r's arena; `b_slot`: the slot's
  /// index in region B (keys not homed on r).
  size_t at(int64_t k, int r, int32_t b_slot) const {
    if (kd_.mod(k) == r) return static_cast<size_t>((uniform_ ? kd_.div(k) * uslot_ : off_a_[k]) * isz_);
    return static_cast<size_t>((a_size_ + cls_base_[cls(k)] + int64_t(b_slot) * slot(k)) * isz_);
  }
  /// Bytes of an arena (both regions).
  size_t arena_bytes() const { return static_cast<size_t>((a_size_ + b_size_) * isz_); }
  int64_t row_count(const int64_t* keys, int64_t n) const {
    if (uniform_) return n * urow_;
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += row_[keys[i]];
    return s;
  }
  /// The home rank of key k.
  int home(int64_t k) const { return static_cast<int>(kd_.mod(k)); }
  /// The slot length if every key has the same, else 0.
  int64_t uniform_slot() const { return uniform_ ? uslot_ : 0; }

 private:
  int64_t isz_;
  int64_t num_keys_;
  int size_;
  KeyDiv kd_;
  bool uniform_ = true;
  int64_t urow_ = 0, uslot_ = 0;
  std::vector<int64_t> row_, off_a_;   // variable lengths only
  std::vector<int32_t> cls_;
  std::vector<int64_t> cls_len_, cls_base_, cls_cap_;
  int64_t a_size_ = 0, b_size_ = 0;
};

/// Free slots of region B, per slot-length class, and the key in each slot
/// taken (progress thread only).
class SlotPool {
 public:
  void init(const Layout& lay) {
    cap_.resize(lay.classes());
    for (size_t c = 0; c < lay.classes(); ++c) cap_[c] = lay.capacity(static_cast<int32_t>(c));
    free_.assign(lay.classes(), {});
    key_.assign(lay.classes(), {});
  }
  int32_t take(int32_t c, int64_t k) {
    int32_t s;
    if (!free_[c].empty()) {
      s = free_[c].back();
      free_[c].pop_back();
    } else {
      // (key_[c] has one entry per slot taken so far: the next new one is its size)
      check<distkit::Error>(static_cast<int64_t>(key_[c].size()) < cap_[c], "kvps: no free slot of class ", c,
                            " (", cap_[c], " slots)");
      s = static_cast<int32_t>(key_[c].size());
      key_[c].push_back(-1);
    }
    key_[c][static_cast<size_t>(s)] = k;
    return s;
  }
  void give(int32_t c, int32_t s) {
    free_[c].push_back(s);
    key_[c][static_cast<size_t>(s)] = -1;
  }
  void reset() {
    for (auto& f : free_) f.clear();
    for (auto& k : key_) k.clear();
  }
  /// f(k) for every key holding a slot (in no particular order).
  template <class F>
  void for_each_key(F&& f) const {
    for (const auto& keys : key_)
      for (int64_t k : keys)
        if (k >= 0) f(k);
  }

 private:
  std::vector<int64_t> cap_;
  std::vector<std::vector<int32_t>> free_;
  std::vector<std::vector<int64_t>> key_;  // per class, per slot taken so far: its key (-1: free)
};

}  // namespace kvps
