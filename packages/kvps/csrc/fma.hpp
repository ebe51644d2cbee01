// fma.hpp - fused multiply-adds as one instruction where the CPU has them.
//
// Wheels are built for the x86-64 baseline, which has no FMA instruction, so
// std::fma would be a library call per element. Kernels that need fused
// multiply-adds (to round as torch's kernels do) are compiled a second time
// for CPUs with FMA (KVPS_FMA_VARIANT) and picked at run time.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define KVPS_FMA_TARGET __attribute__((target("fma")))
#define KVPS_HAS_FMA_VARIANT 1
#else
#define KVPS_FMA_TARGET
#define KVPS_HAS_FMA_VARIANT 0
#endif
#define KVPS_INLINE inline __attribute__((always_inline))

namespace kvps {

/// Whether this CPU runs the FMA variants.
inline bool cpu_has_fma() {
#if KVPS_HAS_FMA_VARIANT
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0;
  }();
  return has;
#else
  return false;
#endif
}

}  // namespace kvps
