// distkit/macros.hpp - portability macros shared by host and device code.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DK_HD __host__ __device__
#define DK_DEVICE_COMPILE 1
#else
#define DK_HD
#endif

#define DK_INLINE DK_HD inline

#define DK_STRINGIFY_(x) #x
#define DK_STRINGIFY(x) DK_STRINGIFY_(x)
