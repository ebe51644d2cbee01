// ops.hpp - reduction operators of mpiad: op codes, predefined MPI ops, the
// user-defined ops for 16-bit floats (float32 arithmetic) and (value, index) pairs,
// and the division that turns a SUM into MPI_AVG.
#pragma once

#include <mpi.h>

#include <complex>
#include <cstdint>
#include <mutex>

#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/half.hpp"
#include "distkit/mpi.hpp"

namespace mpiad {

using distkit::DType;

// Same numbering as mpi4torch's MPI_* constants (0..11); MPI_AVG is mpiad's addition.
// Python reads these codes from the extension (never repeats the numbers).
enum Op : int64_t {
  kMax = 0,
  kMin = 1,
  kSum = 2,
  kProd = 3,
  kLand = 4,
  kBand = 5,
  kLor = 6,
  kBor = 7,
  kLxor = 8,
  kBxor = 9,
  kMinloc = 10,
  kMaxloc = 11,
  // SUM divided by the communicator size (floating and complex dtypes); kept apart
  // from mpi4torch's 0..11 so that no number mpi4torch rejected gains a meaning
  kAvg = 20,
};
/// Every op code, in order.
constexpr int64_t kOps[] = {kMax, kMin, kSum, kProd, kLand, kBand, kLor, kBor, kLxor, kBxor, kMinloc, kMaxloc, kAvg};

inline bool is_op(int64_t op) { return (op >= kMax && op <= kMaxloc) || op == kAvg; }

inline const char* op_name(int64_t op) {
  static const char* names[] = {"MPI_MAX", "MPI_MIN", "MPI_SUM",  "MPI_PROD", "MPI_LAND",   "MPI_BAND",
                                "MPI_LOR", "MPI_BOR", "MPI_LXOR", "MPI_BXOR", "MPI_MINLOC", "MPI_MAXLOC"};
  if (op == kAvg) return "MPI_AVG";
  return (op >= kMax && op <= kMaxloc) ? names[op] : "?";
}

// ---- per-element combine logic (written once, float32 arithmetic for 16-bit floats)
template <class T>
struct Combine {
  using A = distkit::acc_t<T>;
  static inline T max(T a, T b) {
    A x = static_cast<A>(a), y = static_cast<A>(b);
    return (y > x || x != x) ? T(y) : T(x);  // NaN propagates
  }
  static inline T min(T a, T b) {
    A x = static_cast<A>(a), y = static_cast<A>(b);
    return (y < x || x != x) ? T(y) : T(x);
  }
  static inline T sum(T a, T b) { return T(static_cast<A>(a) + static_cast<A>(b)); }
  static inline T prod(T a, T b) { return T(static_cast<A>(a) * static_cast<A>(b)); }
};

// inout[i] = in[i] (op) inout[i]; MPI calls this with in = the earlier ranks' partial result.
template <class T, int OP>
void user_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i) {
    if constexpr (OP == kMax) b[i] = Combine<T>::max(a[i], b[i]);
    if constexpr (OP == kMin) b[i] = Combine<T>::min(a[i], b[i]);
    if constexpr (OP == kSum) b[i] = Combine<T>::sum(a[i], b[i]);
    if constexpr (OP == kProd) b[i] = Combine<T>::prod(a[i], b[i]);
  }
}

// (value, index) pairs stored as two T; ties go to the lower index (MPI semantics).
template <class T, int OP>
void loc_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  using A = distkit::acc_t<T>;
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  const int n = *len;
  for (int i = 0; i < n; ++i) {
    A av = static_cast<A>(a[2 * i]), bv = static_cast<A>(b[2 * i]);
    A ai = static_cast<A>(a[2 * i + 1]), bi = static_cast<A>(b[2 * i + 1]);
    bool take_a = (OP == kMaxloc) ? (av > bv) : (av < bv);
    if (av == bv && ai < bi) take_a = true;
    if (take_a) {
      b[2 * i] = a[2 * i];
      b[2 * i + 1] = a[2 * i + 1];
    }
  }
}

struct OpTable {
  // [dtype][op] user ops (MPI_OP_NULL when the predefined op is used)
  MPI_Op half_ops[2][4] = {{MPI_OP_NULL}};
  MPI_Op loc_ops[12][2] = {{MPI_OP_NULL}};
  MPI_Datatype pair_types[12] = {MPI_DATATYPE_NULL};
  bool ready = false;
};

inline OpTable& op_table() {
  static OpTable t;
  return t;
}

template <class T>
void create_half_ops(MPI_Op* ops) {
  distkit::mpi::check(MPI_Op_create(&user_fn<T, kMax>, 1, &ops[0]), "MPI_Op_create");
  distkit::mpi::check(MPI_Op_create(&user_fn<T, kMin>, 1, &ops[1]), "MPI_Op_create");
  distkit::mpi::check(MPI_Op_create(&user_fn<T, kSum>, 1, &ops[2]), "MPI_Op_create");
  distkit::mpi::check(MPI_Op_create(&user_fn<T, kProd>, 1, &ops[3]), "MPI_Op_create");
}

inline void ensure_ops() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& t = op_table();
    create_half_ops<distkit::half_t>(t.half_ops[0]);
    create_half_ops<distkit::bfloat16_t>(t.half_ops[1]);
    for (DType d : {DType::Float16, DType::BFloat16, DType::Float32, DType::Float64, DType::Int8, DType::Int16,
                    DType::Int32, DType::Int64, DType::UInt8}) {
      int code = static_cast<int>(d);
      distkit::mpi::check(MPI_Type_contiguous(2, distkit::mpi::datatype(d), &t.pair_types[code]),
                          "MPI_Type_contiguous");
      distkit::mpi::check(MPI_Type_commit(&t.pair_types[code]), "MPI_Type_commit");
      auto make = [&](auto tag) {
        using T = decltype(tag);
        distkit::mpi::check(MPI_Op_create(&loc_fn<T, kMinloc>, 1, &t.loc_ops[code][0]), "MPI_Op_create");
        distkit::mpi::check(MPI_Op_create(&loc_fn<T, kMaxloc>, 1, &t.loc_ops[code][1]), "MPI_Op_create");
      };
      switch (d) {
        case DType::Float16: make(distkit::half_t{}); break;
        case DType::BFloat16: make(distkit::bfloat16_t{}); break;
        case DType::Float32: make(float{}); break;
        case DType::Float64: make(double{}); break;
        case DType::Int8: make(int8_t{}); break;
        case DType::Int16: make(int16_t{}); break;
        case DType::Int32: make(int32_t{}); break;
        case DType::Int64: make(int64_t{}); break;
        case DType::UInt8: make(uint8_t{}); break;
        default: break;
      }
    }
    t.ready = true;
  });
}

/// Whether op is allowed on dtype (message names both when not).
inline void check_op_dtype(int64_t op, DType d) {
  using distkit::check;
  check<distkit::ValueError>(is_op(op), "unknown reduction op ", op);
  const bool flt = distkit::is_floating(d), cpx = distkit::is_complex(d), bl = d == DType::Bool;
  bool ok = true;
  switch (op) {
    case kMax:
    case kMin: ok = !cpx; break;
    case kSum:
    case kProd: ok = !bl; break;
    case kLand:
    case kLor:
    case kLxor:
    case kBand:
    case kBor:
    case kBxor: ok = !flt && !cpx; break;
    case kMinloc:
    case kMaxloc: ok = !cpx && !bl; break;
    case kAvg: ok = flt || cpx; break;
    default: ok = false;
  }
  check<distkit::TypeError>(ok, op_name(op), " is not supported for dtype ", distkit::dtype_name(d));
}

/// The MPI datatype and op for reducing `d` with `op`. For MINLOC/MAXLOC the
/// datatype is a pair of two elements (count must be halved by the caller).
inline void resolve(int64_t op, DType d, MPI_Datatype* type, MPI_Op* mop) {
  check_op_dtype(op, d);
  if (op == kAvg) op = kSum;  // the division by the size follows the reduction (divide_by)
  ensure_ops();
  auto& t = op_table();
  const int code = static_cast<int>(d);
  if (op == kMinloc || op == kMaxloc) {
    *type = t.pair_types[code];
    *mop = t.loc_ops[code][op == kMaxloc ? 1 : 0];
    return;
  }
  *type = distkit::mpi::datatype(d);
  if (d == DType::Float16 || d == DType::BFloat16) {
    *mop = t.half_ops[d == DType::Float16 ? 0 : 1][op];  // op in 0..3 here
    return;
  }
  if (d == DType::Bool) {
    switch (op) {
      case kMax:
      case kBor:
      case kLor: *mop = MPI_LOR; return;
      case kMin:
      case kBand:
      case kLand: *mop = MPI_LAND; return;
      default: *mop = MPI_LXOR; return;
    }
  }
  static const MPI_Op predefined[] = {MPI_MAX, MPI_MIN, MPI_SUM, MPI_PROD, MPI_LAND,
                                      MPI_BAND, MPI_LOR, MPI_BOR, MPI_LXOR, MPI_BXOR};
  *mop = predefined[op];
}

inline bool is_loc(int64_t op) { return op == kMinloc || op == kMaxloc; }

template <class T>
void divide_typed(void* p, int64_t n, int size) {
  T* x = static_cast<T*>(p);
  if constexpr (std::is_same_v<T, distkit::half_t> || std::is_same_v<T, distkit::bfloat16_t>) {
    for (int64_t i = 0; i < n; ++i) x[i] = T(static_cast<float>(x[i]) / static_cast<float>(size));
  } else if constexpr (std::is_same_v<T, std::complex<float>>) {
    for (int64_t i = 0; i < n; ++i) x[i] /= static_cast<float>(size);
  } else {
    for (int64_t i = 0; i < n; ++i) x[i] /= static_cast<T>(size);
  }
}

/// x[i] /= size for n elements of dtype d: the second half of MPI_AVG. Divides
/// (rather than multiplying by 1/size) to round as torch's `sum / size` does.
inline void divide_by(void* p, int64_t n, DType d, int size) {
  switch (d) {
    case DType::Float16: divide_typed<distkit::half_t>(p, n, size); break;
    case DType::BFloat16: divide_typed<distkit::bfloat16_t>(p, n, size); break;
    case DType::Float32: divide_typed<float>(p, n, size); break;
    case DType::Float64: divide_typed<double>(p, n, size); break;
    case DType::Complex64: divide_typed<std::complex<float>>(p, n, size); break;
    case DType::Complex128: divide_typed<std::complex<double>>(p, n, size); break;
    default: throw distkit::TypeError(distkit::str("MPI_AVG is not supported for dtype ", distkit::dtype_name(d)));
  }
}

}  // namespace mpiad
