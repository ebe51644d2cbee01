// distkit/half.hpp - IEEE float16 and bfloat16 <-> float32 conversion, host and device.
//
// Round-to-nearest-even in both directions; NaN and infinities preserved.
#pragma once

#include <cstdint>
#include <cstring>

#include "macros.hpp"

namespace distkit {

DK_INLINE uint32_t f32_bits(float f) {
#if defined(DK_DEVICE_COMPILE) && defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

DK_INLINE float bits_f32(uint32_t u) {
#if defined(DK_DEVICE_COMPILE) && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

/// bfloat16 (stored as uint16) -> float32: exact.
DK_INLINE float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

/// float32 -> bfloat16 with round-to-nearest-even; NaN stays NaN (quiet).
DK_INLINE uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE binary16 (stored as uint16) -> float32: exact, subnormals included.
DK_INLINE float f16_to_f32(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t out;
  if (exp == 0x1fu) {
    out = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    out = sign;  // +-0
  } else {
    // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    out = sign | ((112u - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return bits_f32(out);
}

/// float32 -> IEEE binary16 with round-to-nearest-even, overflow to inf, NaN kept.
DK_INLINE uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absu < 0x38800000u) {
    // result is subnormal or zero
    if (absu < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    uint32_t exp = absu >> 23;
    uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14 + (112 - exp) ... bring to 2^-24 units
    uint32_t half_mant = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<uint16_t>(sign | half_mant);
  }
  uint32_t lsb = (absu >> 13) & 1u;
  absu += 0xfffu + lsb;
  return static_cast<uint16_t>(sign | ((absu - 0x38000000u) >> 13));
}

/// Storage types with arithmetic through float32, usable in templates.
struct half_t {
  uint16_t bits;
  DK_HD half_t() : bits(0) {}
  DK_HD half_t(float f) : bits(f32_to_f16(f)) {}
  DK_HD operator float() const { return f16_to_f32(bits); }
};
struct bfloat16_t {
  uint16_t bits;
  DK_HD bfloat16_t() : bits(0) {}
  DK_HD bfloat16_t(float f) : bits(f32_to_bf16(f)) {}
  DK_HD operator float() const { return bf16_to_f32(bits); }
};

/// The type arithmetic on T is carried out in (float for the 16-bit floats).
template <class T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<half_t> {
  using type = float;
};
template <>
struct acc_type<bfloat16_t> {
  using type = float;
};
template <class T>
using acc_t = typename acc_type<T>::type;

}  // namespace distkit
