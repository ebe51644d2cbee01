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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__)
// 8 lanes of the twist: s[k..k+7] = s[k+off..] ^ tw(s[k..], s[k+1..]). Safe in place because
// every lane reads s[k+1..k+8] before anything at or above k+8 is written, and s[k+off] with
// off = M (not yet written) or M - N (already written, as the scalar loop sees it).
__attribute__((target("avx2"))) inline void mt_step8(uint32_t* s, int k, int off) {
  const __m256i up = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i lo = _mm256_set1_epi32(0x7fffffff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i mat = _mm256_set1_epi32(static_cast<int>(0x9908b0dfu));
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k));
  __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k + 1));
  __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + k + off));
  __m256i mix = _mm256_or_si256(_mm256_and_si256(a, up), _mm256_and_si256(b, lo));
  __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(b, one), one);
  __m256i r = _mm256_xor_si256(c, _mm256_xor_si256(_mm256_srli_epi32(mix, 1), _mm256_and_si256(odd, mat)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + k), r);
}

__attribute__((target("avx2"))) inline void mt_twist_avx2(uint32_t* s) {
  auto tw = [](uint32_t u, uint32_t v) {
    uint32_t mix = (u & 0x80000000u) | (v & 0x7fffffffu);
    return (mix >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
  };
  int k = 0;
  for (; k + 8 <= kMtN - kMtM; k += 8) mt_step8(s, k, kMtM);
  for (; k < kMtN - kMtM; ++k) s[k] = s[k + kMtM] ^ tw(s[k], s[k + 1]);
  for (; k + 8 <= kMtN - 1; k += 8) mt_step8(s, k, kMtM - kMtN);
  for (; k < kMtN - 1; ++k) s[k] = s[k + kMtM - kMtN] ^ tw(s[k], s[k + 1]);
  s[kMtN - 1] = s[kMtM - 1] ^ tw(s[kMtN - 1], s[0]);
}

inline bool mt_have_avx2() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return ok;
}
#endif

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
#if defined(__x86_64__)
      if (mt_have_avx2())
        mt_twist_avx2(s);
      else
#endif
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
