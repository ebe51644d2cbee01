// keydiv.hpp - key / size and key % size without a division instruction.
//
// Every access finds a key's home (key % size) and its place in the home's
// packed region (key / size); a 64-bit division costs tens of cycles, several
// per key on the in-place paths. For keys below 2^32 (tables up to 4 billion
// keys) Lemire's method turns both into multiplications; larger keys divide.
#pragma once

#include <cstdint>

namespace kvps {

class KeyDiv {
 public:
  KeyDiv() = default;
  KeyDiv(int64_t divisor, int64_t num_keys)
      : d_(static_cast<uint64_t>(divisor)),
        m_(~uint64_t(0) / static_cast<uint64_t>(divisor) + 1),  // (d = 1: 0, handled below)
        fast_(num_keys <= (int64_t(1) << 32) && divisor < (int64_t(1) << 32)) {}

  int64_t div(int64_t k) const {
    if (d_ == 1) return k;
    if (!fast_) return k / static_cast<int64_t>(d_);
    return static_cast<int64_t>((static_cast<__uint128_t>(m_) * static_cast<uint64_t>(k)) >> 64);
  }
  int64_t mod(int64_t k) const {
    if (!fast_) return k % static_cast<int64_t>(d_);
    const uint64_t low = m_ * static_cast<uint64_t>(k);
    return static_cast<int64_t>((static_cast<__uint128_t>(low) * d_) >> 64);
  }

 private:
  uint64_t d_ = 1, m_ = 0;
  bool fast_ = false;
};

}  // namespace kvps
