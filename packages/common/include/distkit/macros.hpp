// distkit/macros.hpp - portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DK_HD __host__ __device__
#define DK_DEVICE_COMPILE 1
#else
#define DK_HD
#endif

#define DK_INLINE DK_HD inline
// Inlined even where the compiler would not: per-element code called from a kernel compiled for
// another instruction set (kvps's FMA variants) then takes that instruction set.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define DK_FORCE_INLINE DK_HD __forceinline__
#else
#define DK_FORCE_INLINE inline __attribute__((always_inline))
#endif

#define DK_STRINGIFY_(x) #x
#define DK_STRINGIFY(x) DK_STRINGIFY_(x)
