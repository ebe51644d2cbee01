// store.hpp - where values live: lazily committed arenas and the per-key layout.
//
// A key's slot holds its row (value_lengths[k] elements: what workers pull,
// push and set) followed by the state of the server's optimizer, if any.
// Slots are laid out in key order in one arena per rank, so a key's offset is
// the same on every rank and variable lengths cost nothing extra.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <utility>
#include <vector>

#include "distkit/error.hpp"

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

/// Row and slot lengths and slot offsets of every key, in elements.
class Layout {
 public:
  /// `state_len(row_len)`: optimizer state elements behind a row of that length.
  template <class StateLen>
  Layout(const int64_t* lengths, int64_t num_keys, int64_t itemsize, StateLen&& state_len)
      : isz_(itemsize), row_(lengths, lengths + num_keys), off_(num_keys + 1) {
    off_[0] = 0;
    for (int64_t k = 0; k < num_keys; ++k) {
      check(row_[k] >= 0, "value_lengths[", k, "] = ", row_[k], " is negative");
      off_[k + 1] = off_[k] + row_[k] + state_len(row_[k]);
    }
    uniform_ = true;
    for (int64_t k = 1; k < num_keys; ++k)
      if (row_[k] != row_[0]) {
        uniform_ = false;
        break;
      }
    urow_ = row_[0];
    uslot_ = off_[1];
  }

  bool uniform() const { return uniform_; }
  int64_t itemsize() const { return isz_; }
  /// Elements a worker sees of key k.
  int64_t row(int64_t k) const { return uniform_ ? urow_ : row_[k]; }
  /// Elements stored for key k (row + optimizer state).
  int64_t slot(int64_t k) const { return uniform_ ? uslot_ : off_[k + 1] - off_[k]; }
  /// Element offset of key k's slot.
  int64_t off(int64_t k) const { return uniform_ ? k * uslot_ : off_[k]; }
  size_t row_bytes(int64_t k) const { return static_cast<size_t>(row(k) * isz_); }
  size_t slot_bytes(int64_t k) const { return static_cast<size_t>(slot(k) * isz_); }
  /// Byte offset of key k's slot in an arena.
  size_t at(int64_t k) const { return static_cast<size_t>(off(k) * isz_); }
  /// Bytes of an arena holding every key's slot.
  size_t arena_bytes() const { return static_cast<size_t>(off_.back() * isz_); }
  int64_t row_count(const int64_t* keys, int64_t n) const {
    if (uniform_) return n * urow_;
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += row_[keys[i]];
    return s;
  }

 private:
  int64_t isz_;
  std::vector<int64_t> row_, off_;
  bool uniform_ = true;
  int64_t urow_ = 0, uslot_ = 0;
};

}  // namespace kvps
