// distkit/dtype.hpp - one set of dtype codes shared by every distkit extension.
//
// The codes are stable (they cross the Python boundary as small integers; see
// distkit_common.dtypes for the torch/numpy side) and never change meaning.
#pragma once

#include <complex>
#include <cstdint>
#include <string>

#include "error.hpp"
#include "half.hpp"

namespace distkit {

enum class DType : int32_t {
  Float16 = 0,
  BFloat16 = 1,
  Float32 = 2,
  Float64 = 3,
  Int8 = 4,
  Int32 = 5,
  Int64 = 6,
  UInt8 = 7,
  Bool = 8,
  Complex64 = 9,
  Complex128 = 10,
  Int16 = 11,
};

constexpr int32_t kNumDTypes = 12;

inline DType dtype_from_code(int64_t code) {
  check<TypeError>(code >= 0 && code < kNumDTypes, "unknown dtype code ", code);
  return static_cast<DType>(code);
}

DK_INLINE int64_t itemsize(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16:
      return 2;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::Float64:
    case DType::Int64:
    case DType::Complex64:
      return 8;
    case DType::Complex128:
      return 16;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
      return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int8: return "int8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::UInt8: return "uint8";
    case DType::Bool: return "bool";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
    case DType::Int16: return "int16";
  }
  return "?";
}

inline bool is_floating(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float32 || t == DType::Float64;
}
inline bool is_complex(DType t) { return t == DType::Complex64 || t == DType::Complex128; }

/// Call f with a value-initialised object of the C++ type matching dtype `t`:
///   dispatch(t, [&](auto tag) { using T = decltype(tag); ... });
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::Float16: return f(half_t{});
    case DType::BFloat16: return f(bfloat16_t{});
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    case DType::Int8: return f(int8_t{});
    case DType::Int16: return f(int16_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    case DType::UInt8: return f(uint8_t{});
    case DType::Bool: return f(bool{});
    case DType::Complex64: return f(std::complex<float>{});
    case DType::Complex128: return f(std::complex<double>{});
  }
  throw TypeError(str("unsupported dtype code ", static_cast<int>(t)));
}

/// Like dispatch() but only for the floating types (16-bit ones arithmetic in float).
template <class F>
decltype(auto) dispatch_floating(DType t, F&& f) {
  switch (t) {
    case DType::Float16: return f(half_t{});
    case DType::BFloat16: return f(bfloat16_t{});
    case DType::Float32: return f(float{});
    case DType::Float64: return f(double{});
    default: break;
  }
  throw TypeError(str("expected a floating dtype, got ", dtype_name(t)));
}

}  // namespace distkit
