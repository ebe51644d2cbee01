// graph_philox.hpp - Philox4x32-10, the counter-based generator of Salmon et al.
// ("Parallel random numbers: as easy as 1, 2, 3", SC 2011), written once for host
// and device.
//
// A counter-based generator maps (key, counter) to random bits with no state to
// carry between draws, so every sampled center gets its own stream keyed by the
// user's seed and counted from the center's position in the batch. The result is
// then the same for any number of CPU threads, and for the CPU and the CUDA kernel.
#pragma once

#include <cstdint>

#include "distkit/macros.hpp"

namespace wholemem {
namespace graph {

/// One Philox4x32-10 block: 4 x 32 random bits from a 128-bit counter and a 64-bit key.
DK_INLINE void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/// High 64 bits of a 64 x 64-bit product.
DK_INLINE uint64_t mul_hi64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

/// The random stream of one sampled center: counter = (block, 0, stream_lo, stream_hi).
class CenterRng {
 public:
  DK_HD CenterRng(uint64_t seed, uint64_t stream) {
    key_[0] = static_cast<uint32_t>(seed);
    key_[1] = static_cast<uint32_t>(seed >> 32);
    ctr_[0] = 0;
    ctr_[1] = 0;
    ctr_[2] = static_cast<uint32_t>(stream);
    ctr_[3] = static_cast<uint32_t>(stream >> 32);
  }

  /// 64 random bits (two 32-bit words of the current block; a new block every two draws).
  DK_HD uint64_t next_u64() {
    if (used_ >= 4) {
      philox4x32_10(ctr_, key_, buf_);
      ++ctr_[0];
      if (ctr_[0] == 0) ++ctr_[1];
      used_ = 0;
    }
    const uint64_t r = (static_cast<uint64_t>(buf_[used_]) << 32) | buf_[used_ + 1];
    used_ += 2;
    return r;
  }

  /// Uniform integer in [0, n) for n >= 1 (multiply-shift: bias below n / 2^64).
  DK_HD int64_t below(int64_t n) { return static_cast<int64_t>(mul_hi64(next_u64(), static_cast<uint64_t>(n))); }

  /// Uniform double in (0, 1] with 53 random bits (never 0, so log() is finite).
  DK_HD double open0_unit() { return static_cast<double>((next_u64() >> 11) + 1) * (1.0 / 9007199254740992.0); }

 private:
  uint32_t key_[2];
  uint32_t ctr_[4];
  uint32_t buf_[4] = {0, 0, 0, 0};
  int used_ = 4;
};

}  // namespace graph
}  // namespace wholemem
