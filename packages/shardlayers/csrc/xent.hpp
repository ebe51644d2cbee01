// xent.hpp - per-vector and per-row logic of the vocab-parallel cross-entropy, written once for
// host and device.
//
// A rank holds logits x[N, C] (its slice [vstart, vstart + C) of the classes). The forward runs one
// pass over x for the row statistics and one for the gradient:
//   1. stats: local max m, sum of exp(x - m), the target logit (0 when the target is another rank's
//      class) and sum_j w_j x_j (only with label smoothing), in ONE read of the row: the row is
//      folded vector by vector (xent_fold), with one rescale of the running sums per vector whose
//      max exceeds the running max, never one per element. The ranks then combine the
//      (m, s, x_t, swx) rows (one all-gather of N x 4 numbers, done in Python).
//   2. gradient of the (weighted, smoothed, reduced) loss w.r.t. x, written into a buffer the size
//      of the local logits:
//        g_j = a * exp(x_j - m) - cw * w_j - [j == target] * ct
//      where m = the row's global max, a = cp / sum_j exp(x_j - m) (so a * exp(x_j - m) is cp times
//      the softmax exp((x_j - m) - log sum), as F.cross_entropy forms it: never exp(x_j - lse) with
//      lse = m + log sum rounded to one float, whose rounding (~1e-4 at |m| ~ 2000) would land in
//      the exponent) and a, ct, cw are per-row coefficients (0 for an ignored row) prepared by the
//      caller once per row: an element costs one exp, one multiply-add, no division.
// A row is cut into vectors (xent_row_split): on the GPU 16-byte vectors (8 bf16 / fp16, 4 fp32,
// 2 fp64) from the first 16-byte aligned element, after a shorter head vector when the row starts
// misaligned and before a shorter tail; on the host 8 elements from the row start. The CUDA
// kernels (xent_cuda.cu) give thread t of a block the vectors t, t + threads, ... of a row
// (xent_thread_partial / xent_grad_vectors) and merge the threads' partials warp by warp, then
// across warps (xent_block_merge replays that order on the host). The CPU kernel runs the same
// functions with one "thread". module.cpp's *_blockwise_cpu / *_elementwise_cpu entry points run
// the CUDA kernels' split and merge order on the host, so the CPU tests exercise the CUDA kernels'
// arithmetic, vector cuts (misaligned starts, short tails) and reduction order.
// Arithmetic is in acc_t<T> (float for float16/bfloat16/float32, double for float64).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/half.hpp"
#include "distkit/macros.hpp"

/// A loop over the V lanes of a vector, fully unrolled on the GPU (so the lanes stay in registers:
/// every index is a constant).
#if defined(__CUDA_ARCH__)
#define DK_XENT_UNROLL_FOR(k) _Pragma("unroll") for (int k = 0; k < V; ++k)
#else
#define DK_XENT_UNROLL_FOR(k) for (int k = 0; k < V; ++k)
#endif

namespace shardlayers {

/// Threads of the CUDA kernels' blocks (one block per row, for the stats and the gradient).
constexpr int kStatsThreads = 256;

/// Argument checks shared by the CPU and CUDA entry points (run before any pointer is touched).
inline void xent_check_args(int64_t n, int64_t c, int64_t row_stride, uintptr_t x, uintptr_t target) {
  distkit::check<distkit::ValueError>(n >= 0, "number of rows must be >= 0, got ", n);
  distkit::check<distkit::ValueError>(c >= 1, "number of local classes must be >= 1, got ", c);
  distkit::check<distkit::ValueError>(row_stride >= c, "row_stride (", row_stride, ") must be >= columns (", c, ")");
  distkit::check<distkit::ValueError>(n == 0 || (x != 0 && target != 0), "null data pointer");
}

/// Every pointer an entry point dereferences as elements (logits, gradient) must be aligned to
/// its element size (torch's always are): the kernels' vector cuts count elements from it.
inline void xent_check_aligned(uintptr_t p, distkit::DType dt, const char* what) {
  const int64_t e = distkit::itemsize(dt);
  distkit::check<distkit::ValueError>(e <= 0 || p % static_cast<uint64_t>(e) == 0, what, " pointer ", p,
                                      " is not aligned to its ", e, "-byte elements");
}

/// exp(x) for float on the host: Cephes-style range reduction + degree-5 polynomial (about 1 ulp),
/// branch-free so that the row loops vectorise; NaN propagates, inputs below -87 (where float
/// exp is subnormal) give 0, so -inf logits (masked classes) contribute exactly nothing.
DK_INLINE float fast_expf(float x) {
  const bool under = x < -87.0f;
  x = under ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = x * 1.44269504088896341f + magic;
  float n = t - magic;
  int32_t e = static_cast<int32_t>(distkit::f32_bits(t) - distkit::f32_bits(magic));
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  y = y * distkit::bits_f32(static_cast<uint32_t>(e + 127) << 23);
  return under ? 0.0f : y;
}

template <class A>
DK_INLINE A dk_exp(A v) {
  return exp(v);
}
template <>
DK_INLINE float dk_exp<float>(float v) {
#if defined(__CUDA_ARCH__)
  return expf(v);
#else
  return fast_expf(v);
#endif
}

/// exp for logits of type T: on the GPU the hardware exp2 (__expf, ~2 ulp of float) for 16-bit
/// logits, whose gradient keeps 8 or 11 bits and whose loss is float; float and double logits get
/// the correctly rounded library exp. The host uses dk_exp for every type.
template <class T, class A>
DK_INLINE A xent_exp(A v) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 2 && sizeof(A) == 4) return __expf(v);
#endif
  return dk_exp<A>(v);
}

template <class A>
DK_INLINE A neg_inf() {
  return -static_cast<A>(INFINITY);
}

/// Merge the running log-sum-exp pair (m, s) with another pair (m2, s2).
///
/// A pair whose max is -inf (masked classes only, e.g. a padded vocabulary slice) or whose sum
/// is 0 contributes nothing: merging it would compute exp(-inf - -inf) = NaN. A NaN sum (a NaN
/// logit, possibly among masked ones only) is kept: the row's loss is NaN, as torch's.
template <class A>
DK_INLINE void lse_merge(A& m, A& s, A m2, A s2) {
  if (s2 != s2) {
    s = s2;
    return;
  }
  if (s2 == A(0) || m2 == neg_inf<A>()) return;
  if (s == A(0)) {
    m = m2;
    s = s2;
    return;
  }
  if (m2 > m) {
    s = s * dk_exp<A>(m - m2) + s2;
    m = m2;
  } else {
    s = s + s2 * dk_exp<A>(m2 - m);
  }
}

/// Running statistics of a part of a row: log-sum-exp pair (m, s) and sum_j w_j x_j.
template <class A>
struct XentPartial {
  A m, s, sw;
};

template <class A>
DK_INLINE XentPartial<A> xent_partial_empty() {
  return XentPartial<A>{neg_inf<A>(), A(0), A(0)};
}

/// Combine two partials of the same row (the CUDA block's warp and cross-warp merges).
template <class A>
DK_INLINE void xent_partial_merge(XentPartial<A>& a, const XentPartial<A>& b) {
  lse_merge<A>(a.m, a.s, b.m, b.s);
  a.sw += b.sw;
}

/// Elements of T in one 16-byte vector: 8 float16 / bfloat16, 4 float32, 2 float64.
template <class T>
constexpr int vec16_elems() {
  return 16 / static_cast<int>(sizeof(T));
}

/// Elements per vector of the CPU kernel (independent lanes the host compiler vectorises).
constexpr int kHostVec = 8;

/// How a row is cut into vectors of V elements: an optional head of `head` (< V) elements up
/// to the first aligned element, then full vectors, then a tail shorter than V; `count` vectors
/// in all, numbered from 0 (the head, when there is one).
struct XentRowSplit {
  int64_t head;
  int64_t count;
};

/// Cut a row of C elements of `elem_bytes` bytes starting at address `addr` into vectors of V
/// elements whose full ones start at multiples of `align` bytes (align = 1: no head).
DK_INLINE XentRowSplit xent_row_split(uintptr_t addr, int64_t C, int elem_bytes, int V, int align) {
  const int64_t mis = static_cast<int64_t>(addr % static_cast<uintptr_t>(align));
  int64_t head = mis == 0 ? 0 : (align - mis) / elem_bytes;
  head = head < C ? head : C;
  const int64_t body = C - head;
  return XentRowSplit{head, (head > 0 ? 1 : 0) + (body + V - 1) / V};
}

/// First element and length of vector q (< sp.count) of a row of C elements.
DK_INLINE void xent_vec_span(const XentRowSplit& sp, int64_t q, int64_t C, int V, int64_t& j0, int& len) {
  if (sp.head > 0) {
    if (q == 0) {
      j0 = 0;
      len = static_cast<int>(sp.head);
      return;
    }
    j0 = sp.head + (q - 1) * V;
  } else {
    j0 = q * V;
  }
  const int64_t rest = C - j0;
  len = rest < V ? static_cast<int>(rest) : V;
}

/// Load `len` (<= V) elements from p as A; lanes past len read as -inf (they add exp(-inf) = 0).
/// A full vector is one 16-byte load on the GPU (p must then be 16-byte aligned: xent_row_split
/// starts every full vector there) and one V-element copy on the host.
template <class T, class A, int V>
DK_INLINE void xent_load(const T* p, int len, A (&v)[V]) {
  if (len == V) {
    T raw[V];
#if defined(__CUDA_ARCH__)
    if constexpr (V * sizeof(T) == 16) {
      const uint4 w = *reinterpret_cast<const uint4*>(p);
      memcpy(raw, &w, 16);
    } else {
      DK_XENT_UNROLL_FOR(k) raw[k] = p[k];
    }
#else
    std::memcpy(static_cast<void*>(raw), static_cast<const void*>(p), sizeof(raw));
#endif
    DK_XENT_UNROLL_FOR(k) v[k] = static_cast<A>(raw[k]);
  } else {
    DK_XENT_UNROLL_FOR(k) v[k] = k < len ? static_cast<A>(p[k]) : neg_inf<A>();
  }
}

#if defined(__CUDA_ARCH__)
/// One 16-byte store of V = 16 / sizeof(T) elements (p 16-byte aligned). Written as the PTX
/// instruction: a float4 / uint4 assignment next to the element-store fallback is split back
/// into four narrow stores by the compiler (seen with nvcc 13.0).
template <class T, int V>
__device__ inline void xent_store16(T* p, const T (&raw)[V]) {
  uint32_t u[4];
  if constexpr (sizeof(T) == 8) {
    DK_XENT_UNROLL_FOR(k) {
      u[2 * k] = static_cast<uint32_t>(__double2loint(raw[k]));
      u[2 * k + 1] = static_cast<uint32_t>(__double2hiint(raw[k]));
    }
  } else if constexpr (sizeof(T) == 4) {
    DK_XENT_UNROLL_FOR(k) u[k] = __float_as_uint(raw[k]);
  } else {
    DK_XENT_UNROLL_FOR(k) {
      if (k % 2 == 0) {
        u[k / 2] = raw[k].bits;
      } else {
        u[k / 2] |= static_cast<uint32_t>(raw[k].bits) << 16;
      }
    }
  }
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u[0]), "r"(u[1]), "r"(u[2]), "r"(u[3])
               : "memory");
}
#endif

/// Store the first `len` (<= V) lanes of v to p as T: one 16-byte store on the GPU for a full
/// vector when `aligned16` (p 16-byte aligned), element stores otherwise.
template <class T, class A, int V>
DK_INLINE void xent_store(T* p, int len, const A (&v)[V], bool aligned16) {
  if (len == V) {
    T raw[V];
    DK_XENT_UNROLL_FOR(k) raw[k] = T(v[k]);
#if defined(__CUDA_ARCH__)
    if constexpr (V * sizeof(T) == 16) {
      if (aligned16) {
        xent_store16<T, V>(p, raw);
        return;
      }
    }
    DK_XENT_UNROLL_FOR(k) p[k] = raw[k];
#else
    std::memcpy(static_cast<void*>(p), static_cast<const void*>(raw), sizeof(raw));
#endif
  } else {
    DK_XENT_UNROLL_FOR(k)
      if (k < len) p[k] = T(v[k]);
  }
}

/// Running statistics of one thread's vectors: one max m, and per lane the sum of exp(x - m)
/// and of w x (V independent sums: the host vectorises them, the GPU keeps them in registers).
template <class A, int V>
struct XentLanes {
  A m;
  A s[V];
  A sw[V];
};

template <class A, int V>
DK_INLINE void xent_lanes_init(XentLanes<A, V>& p) {
  p.m = neg_inf<A>();
  DK_XENT_UNROLL_FOR(k) p.s[k] = p.sw[k] = A(0);
}

/// Fold one vector (lanes past its length hold -inf) into the running max and exp sums: when
/// the vector's max exceeds the running max, the sums are rescaled once, by one exp, for the
/// whole vector. A vector of -inf only (masked classes) adds nothing; NaN logits make the sum NaN.
template <class T, class A, int V>
DK_INLINE void xent_fold(XentLanes<A, V>& p, const A (&v)[V]) {
  A vm = neg_inf<A>();
  DK_XENT_UNROLL_FOR(k) vm = v[k] > vm ? v[k] : vm;
  if (vm > p.m) {
    const A f = xent_exp<T, A>(p.m - vm);  // exp(-inf) = 0 for the first live vector
    DK_XENT_UNROLL_FOR(k) p.s[k] *= f;
    p.m = vm;
  }
  if (p.m == neg_inf<A>()) {  // nothing live yet: only -inf (or NaN) here
    DK_XENT_UNROLL_FOR(k)
      if (v[k] != v[k]) p.s[0] = v[k];
    return;
  }
  DK_XENT_UNROLL_FOR(k) p.s[k] += xent_exp<T, A>(v[k] - p.m);
}

/// Add sum w_j x_j of the first `len` lanes (w: the vector's weights, null for all ones).
template <class A, int V>
DK_INLINE void xent_fold_weighted(XentLanes<A, V>& p, const A (&v)[V], int len, const A* w) {
  if (len == V) {
    DK_XENT_UNROLL_FOR(k) p.sw[k] += (w ? w[k] : A(1)) * v[k];
  } else {
    DK_XENT_UNROLL_FOR(k)
      if (k < len) p.sw[k] += (w ? w[k] : A(1)) * v[k];
  }
}

/// The lanes as one partial (lanes summed in order 0..V-1).
template <class A, int V>
DK_INLINE XentPartial<A> xent_lanes_reduce(const XentLanes<A, V>& p) {
  XentPartial<A> r{p.m, A(0), A(0)};
  DK_XENT_UNROLL_FOR(k) {
    r.s += p.s[k];
    r.sw += p.sw[k];
  }
  return r;
}

/// Fold the vectors first, first + step, ... of a row (cut by sp) into one partial: one CUDA
/// thread's share of a row, or the whole row for first = 0, step = 1.
template <class T, class A, int V>
DK_INLINE XentPartial<A> xent_thread_partial(const T* x, int64_t C, const XentRowSplit& sp, int64_t first,
                                              int64_t step, const A* w, bool want_sum) {
  XentLanes<A, V> p;
  xent_lanes_init<A, V>(p);
  for (int64_t q = first; q < sp.count; q += step) {
    int64_t j0;
    int len;
    xent_vec_span(sp, q, C, V, j0, len);
    A v[V];
    xent_load<T, A, V>(x + j0, len, v);
    xent_fold<T, A, V>(p, v);
    if (want_sum) xent_fold_weighted<A, V>(p, v, len, w ? w + j0 : nullptr);
  }
  return xent_lanes_reduce<A, V>(p);
}

/// Write the row's statistics {max, sum exp(x - max), target logit, sum w x} from its partial.
template <class T, class A>
DK_INLINE void xent_partial_finish(const XentPartial<A>& p, const T* x, int64_t C, int64_t target, int64_t vstart,
                                   A* out) {
  const int64_t lt = target - vstart;
  out[0] = p.s == A(0) ? neg_inf<A>() : p.m;
  out[1] = p.s;
  out[2] = (lt >= 0 && lt < C) ? static_cast<A>(x[lt]) : A(0);
  out[3] = p.sw;
}

/// Local statistics of one row, in one pass (the CPU kernel): out = {max, sum exp(x - max),
/// target logit, sum_j w_j x_j}.
template <class T, class A>
DK_HD void xent_stats_row(const T* x, int64_t C, int64_t target, int64_t vstart, const A* w, bool want_sum,
                          A* out) {
  const XentRowSplit sp = xent_row_split(0, C, static_cast<int>(sizeof(T)), kHostVec, 1);
  const XentPartial<A> p = xent_thread_partial<T, A, kHostVec>(x, C, sp, 0, 1, w, want_sum);
  xent_partial_finish<T, A>(p, x, C, target, vstart, out);
}

/// True for a row that contributes nothing (ignored target, or zero weight and no smoothing):
/// its gradient is exactly 0. Its max is a placeholder, so a * exp(x - m) must not be
/// evaluated (0 * exp(x) is NaN once exp(x) overflows, x > ~88 in float).
template <class A>
DK_INLINE bool xent_row_is_zero(A a, A ct, A cw) {
  return a == A(0) && ct == A(0) && cw == A(0);
}

/// Gradient of one vector in place: v_k = a * exp(v_k - m) - cw * w_k, minus ct at lane `lt`
/// (the target's lane, outside [0, len) when the target is not in this vector). The row must not
/// be a zero row (xent_row_is_zero). Lanes past `len` are left undefined (never stored).
template <class T, class A, int V>
DK_INLINE void xent_grad_vec(A (&v)[V], int len, const A* w, int64_t lt, A m, A a, A ct, A cw) {
  if (w && len == V) {
    DK_XENT_UNROLL_FOR(k) v[k] = a * xent_exp<T, A>(v[k] - m) - cw * w[k];
  } else if (w) {
    DK_XENT_UNROLL_FOR(k) v[k] = a * xent_exp<T, A>(v[k] - m) - cw * (k < len ? w[k] : A(0));
  } else {
    DK_XENT_UNROLL_FOR(k) v[k] = a * xent_exp<T, A>(v[k] - m) - cw;
  }
  DK_XENT_UNROLL_FOR(k)  // no v[lt]: a runtime index would put v in local memory on the GPU
    if (k == lt && k < len) v[k] -= ct;
}

/// Gradient of the vectors first, first + step, ... of a row (cut by sp, for the logits x): g
/// is the row's gradient, `g_aligned` says whether g's full vectors are 16-byte aligned too (g
/// and x at the same address modulo 16). coef = {m, a, ct, cw}.
template <class T, class A, int V>
DK_INLINE void xent_grad_vectors(const T* x, T* g, int64_t C, const XentRowSplit& sp, int64_t first, int64_t step,
                                 int64_t target, int64_t vstart, const A* w, const A* coef, bool g_aligned) {
  const A m = coef[0], a = coef[1], ct = coef[2], cw = coef[3];
  const bool zero = xent_row_is_zero<A>(a, ct, cw);
  const int64_t lt = target - vstart;
  for (int64_t q = first; q < sp.count; q += step) {
    int64_t j0;
    int len;
    xent_vec_span(sp, q, C, V, j0, len);
    A v[V];
    if (zero) {
      DK_XENT_UNROLL_FOR(k) v[k] = A(0);
    } else {
      xent_load<T, A, V>(x + j0, len, v);
      xent_grad_vec<T, A, V>(v, len, w ? w + j0 : nullptr, lt - j0, m, a, ct, cw);
    }
    xent_store<T, A, V>(g + j0, len, v, g_aligned);
  }
}

/// Gradient of one row (the CPU kernel). coef = {m, a, ct, cw}.
template <class T, class A>
DK_HD void xent_grad_row(const T* x, T* g, int64_t C, int64_t target, int64_t vstart, const A* w, const A* coef) {
  const XentRowSplit sp = xent_row_split(0, C, static_cast<int>(sizeof(T)), kHostVec, 1);
  xent_grad_vectors<T, A, kHostVec>(x, g, C, sp, 0, 1, target, vstart, w, coef, false);
}

/// Threads of a warp (the CUDA block merges its threads' partials warp by warp).
constexpr int kWarp = 32;

/// Merge parts[0..n) (n a multiple of kWarp, at most kWarp * kWarp) in the CUDA block's order:
/// within each warp a tree (lane t takes lane t + 16, then t + 8, ..., as __shfl_down_sync
/// does), then the warps' results the same way in the first warp (lanes past the warp count
/// empty). Returns the block's partial.
template <class A>
XentPartial<A> xent_block_merge(std::vector<XentPartial<A>>& parts) {
  const size_t n = parts.size();
  std::vector<XentPartial<A>> leaders(kWarp, xent_partial_empty<A>());
  for (size_t w = 0; w * kWarp < n; ++w) {
    XentPartial<A>* lane = parts.data() + w * kWarp;
    for (int off = kWarp / 2; off > 0; off >>= 1)
      for (int t = 0; t < off; ++t) xent_partial_merge<A>(lane[t], lane[t + off]);
    leaders[w] = lane[0];
  }
  for (int off = kWarp / 2; off > 0; off >>= 1)
    for (int t = 0; t < off; ++t) xent_partial_merge<A>(leaders[t], leaders[t + off]);
  return leaders[0];
}

/// Check a row's 16-byte cut the way the GPU relies on it (the host replays below run it; a
/// misplaced full vector would be a misaligned 16-byte access there): vectors cover [0, C) in
/// order, each element once, every full vector starts 16-byte aligned, only the head and the
/// last vector are short.
template <class T>
void xent_check_split(const T* x, int64_t C, const XentRowSplit& sp) {
  constexpr int V = vec16_elems<T>();
  int64_t next = 0;
  for (int64_t q = 0; q < sp.count; ++q) {
    int64_t j0;
    int len;
    xent_vec_span(sp, q, C, V, j0, len);
    const bool edge = (q == 0 && sp.head > 0) || q == sp.count - 1;
    const bool aligned = reinterpret_cast<uintptr_t>(x + j0) % 16 == 0;
    distkit::check<distkit::ValueError>(j0 == next && len >= 1 && len <= V && (len == V || edge) &&
                                            (len < V || aligned),
                                        "bad vector cut: vector ", q, " at ", j0, " length ", len, " of ", C);
    next = j0 + len;
  }
  distkit::check<distkit::ValueError>(next == C, "bad vector cut: covers ", next, " of ", C, " elements");
}

/// The CUDA stats kernel's algorithm for one row, run on the host: the row cut into 16-byte
/// vectors from its real address, `threads` strided partials merged in the block's order
/// (tests compare it with xent_stats_row and torch).
template <class T, class A>
void xent_stats_row_blockwise(const T* x, int64_t C, int64_t target, int64_t vstart, const A* w, bool want_sum,
                              A* out, int threads) {
  constexpr int V = vec16_elems<T>();
  const XentRowSplit sp = xent_row_split(reinterpret_cast<uintptr_t>(x), C, static_cast<int>(sizeof(T)), V, 16);
  xent_check_split<T>(x, C, sp);
  std::vector<XentPartial<A>> parts(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) parts[t] = xent_thread_partial<T, A, V>(x, C, sp, t, threads, w, want_sum);
  xent_partial_finish<T, A>(xent_block_merge<A>(parts), x, C, target, vstart, out);
}

/// The CUDA gradient kernel's computation for one row, run on the host: the same 16-byte
/// vector cut (from x's address) and per-vector arithmetic, thread by thread.
template <class T, class A>
void xent_grad_row_vectorwise(const T* x, T* g, int64_t C, int64_t target, int64_t vstart, const A* w, const A* coef,
                              int threads) {
  constexpr int V = vec16_elems<T>();
  const XentRowSplit sp = xent_row_split(reinterpret_cast<uintptr_t>(x), C, static_cast<int>(sizeof(T)), V, 16);
  xent_check_split<T>(x, C, sp);
  const bool g_aligned = ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(g)) & 15u) == 0;
  for (int t = 0; t < threads; ++t)
    xent_grad_vectors<T, A, V>(x, g, C, sp, t, threads, target, vstart, w, coef, g_aligned);
}

}  // namespace shardlayers
