// mt19937.hpp - advance a serialized torch CPU generator state by n 32-bit draws.
//
// torch's CPUGeneratorImpl::get_state() layout (5056 bytes, little endian):
//   u64 seed @0, i32 left @8, i32 seeded @12, u64 next @16, u64 state[624] @24, ...
// Each 32-bit draw of at::mt19937 does `if (--left == 0) twist(); y = state[next++]`.
// Skipping a draw needs no tempering, so n draws cost n/624 twists.
#pragma once

#include <cstdint>
#include <cstring>

#include "distkit/error.hpp"

namespace distx {

constexpr int kMtN = 624;
constexpr int kMtM = 397;
constexpr int64_t kStateBytes = 5056;

inline void mt_twist(uint32_t* s) {
  auto tw = [](uint32_t u, uint32_t v) {
    uint32_t mix = (u & 0x80000000u) | (v & 0x7fffffffu);
    return (mix >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
  };
  int k = 0;
  for (; k < kMtN - kMtM; ++k) s[k] = s[k + kMtM] ^ tw(s[k], s[k + 1]);
  for (; k < kMtN - 1; ++k) s[k] = s[k + kMtM - kMtN] ^ tw(s[k], s[k + 1]);
  s[kMtN - 1] = s[kMtM - 1] ^ tw(s[kMtN - 1], s[0]);
}

/// Advance the serialized state at `bytes` (kStateBytes long) by n draws, in place.
inline void mt_advance(uint8_t* bytes, int64_t nbytes, int64_t n) {
  distkit::check(nbytes == kStateBytes, "expected a torch CPU generator state of ", kStateBytes, " bytes, got ", nbytes);
  distkit::check(n >= 0, "cannot advance a generator by a negative number of draws: ", n);
  int32_t left;
  uint64_t next;
  std::memcpy(&left, bytes + 8, 4);
  std::memcpy(&next, bytes + 16, 8);
  uint32_t s[kMtN];
  for (int i = 0; i < kMtN; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 24 + 8 * i, 8);
    s[i] = static_cast<uint32_t>(w);
  }
  distkit::check(left >= 1 && left <= kMtN, "corrupt generator state (left=", left, ")");
  while (n > 0) {
    if (left > 1) {
      int64_t take = n < left - 1 ? n : left - 1;
      left -= static_cast<int32_t>(take);
      next += static_cast<uint64_t>(take);
      n -= take;
    } else {
      mt_twist(s);
      left = kMtN;
      next = 1;
      n -= 1;
    }
  }
  std::memcpy(bytes + 8, &left, 4);
  std::memcpy(bytes + 16, &next, 8);
  for (int i = 0; i < kMtN; ++i) {
    uint64_t w = s[i];
    std::memcpy(bytes + 24 + 8 * i, &w, 8);
  }
}

}  // namespace distx
