// rules.hpp - what a push does to a key's slot: add the values (AdaPM's push).
#pragma once

#include <cstdint>
#include <type_traits>

#include "distkit/dtype.hpp"

namespace kvps {

/// The server's update rule (exported to Python as RULES).
enum RuleKind : int { R_ADD = 0 };

struct Rule {
  int kind = R_ADD;
};

/// Optimizer state elements stored behind a row of `row` elements.
inline int64_t state_len(const Rule&, int64_t) { return 0; }

template <class T>
void add_values(char* dst, const char* src, int64_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = T(static_cast<float>(d[i]) + static_cast<float>(s[i]));
  }
}

using AddFn = void (*)(char*, const char*, int64_t);
/// apply(rule, slot, update, row_len): one push of `update` into a key's slot.
using ApplyFn = void (*)(const Rule&, char*, const char*, int64_t);

template <class T>
void apply_add(const Rule&, char* slot, const char* src, int64_t n) {
  add_values<T>(slot, src, n);
}

inline AddFn add_fn(distkit::DType dt) {
  AddFn f = nullptr;
  distkit::dispatch_floating(dt, [&](auto tag) { f = &add_values<decltype(tag)>; });
  return f;
}

inline ApplyFn apply_fn(const Rule&, distkit::DType dt) {
  ApplyFn f = nullptr;
  distkit::dispatch_floating(dt, [&](auto tag) { f = &apply_add<decltype(tag)>; });
  return f;
}

}  // namespace kvps
