// distkit/rows_vec.hpp - row gather / scatter / scatter-add that move whole rows as the
// widest aligned words, written once for host and device.
//
// A row whose elements are adjacent is a run of bytes: it is moved as 16-, 8-, 4-, 2- or
// 1-byte words, the widest that divides the row's byte length, the row stride and every
// base address (word_bytes_for). Each row costs one index load, one bounds check and one
// chunk lookup (a 32-bit division where the numbers fit, none for a single buffer); no
// element pays a division. A group of G lanes (G a power of two up to a warp) moves K
// rows at once: it loads the K rows' words first and stores them after, so K loads per
// lane are in flight. On the CPU the same functions run with G = 1 (or with every lane
// of a group in turn, as the tests do); the CUDA kernels in rows_cuda.cuh are a loop
// around them.
//
// An index outside [0, nrows) is never dereferenced: the gather writes zeros for that
// row, the scatter and scatter-add write nothing, and the row functions return the
// lowest bad position of their rows (-1 if none) for the caller to report.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "macros.hpp"

namespace distkit {

/// The widest word (16, 8, 4, 2 or 1 bytes) dividing `bits`, the bitwise OR of every byte
/// length, stride and address the words are read from or written to.
DK_INLINE int word_bytes_for(uint64_t bits) {
  for (int w = 16; w > 1; w >>= 1)
    if ((bits & static_cast<uint64_t>(w - 1)) == 0) return w;
  return 1;
}

/// Raw words of each width (16 bytes as two 8-byte halves, 16-byte aligned).
template <int W>
struct Word;
template <>
struct Word<1> {
  using type = uint8_t;
};
template <>
struct Word<2> {
  using type = uint16_t;
};
template <>
struct Word<4> {
  using type = uint32_t;
};
template <>
struct Word<8> {
  using type = uint64_t;
};
struct alignas(16) Word16 {
  uint64_t lo, hi;
};
template <>
struct Word<16> {
  using type = Word16;
};

/// A row table in bytes: rows in one buffer or in chunks of `rows_per_chunk` rows, each
/// row `row_bytes` long (its elements adjacent) or, when `col_stride_bytes` differs from
/// `elem_bytes`, `ncols` elements `col_stride_bytes` apart. `row0` / `col_offset_bytes`
/// place a window (a sub-tensor) inside the table; indices are relative to it.
struct ByteRows {
  char* const* chunks;       ///< chunk base pointers (device memory for the kernels)
  char* base0;               ///< chunks[0], read without the indirection when single
  int64_t rows_per_chunk;    ///< rows in every chunk but the last
  int64_t nrows;             ///< valid indices are [0, nrows)
  int64_t row0;              ///< first row of the window
  int64_t col_offset_bytes;  ///< first column of the window, in bytes from the row start
  int64_t ncols;             ///< elements per row of the window
  int64_t elem_bytes;        ///< element size
  int64_t row_stride_bytes;  ///< bytes between consecutive rows of a chunk
  int64_t col_stride_bytes;  ///< bytes between consecutive elements of a row
  bool single;               ///< one chunk holds every row: no chunk lookup

  DK_HD int64_t row_bytes() const { return ncols * elem_bytes; }
  DK_HD bool adjacent() const { return col_stride_bytes == elem_bytes; }
  DK_HD bool valid(int64_t r) const { return r >= 0 && r < nrows; }

  /// Chunk and byte offset of row `r` of the window (r valid): one division per row, in
  /// 32 bits where both operands fit (a 64-bit division is a slow software loop on a GPU).
  DK_HD void locate(int64_t r, int64_t& chunk, int64_t& offset) const {
    const int64_t a = row0 + r;
    if (single) {
      chunk = 0;
    } else if (((static_cast<uint64_t>(a) | static_cast<uint64_t>(rows_per_chunk)) >> 32) == 0) {
      chunk = static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(rows_per_chunk));
    } else {
      chunk = a / rows_per_chunk;
    }
    offset = (a - chunk * rows_per_chunk) * row_stride_bytes + col_offset_bytes;
  }
  DK_HD char* row(int64_t r) const {
    int64_t c, off;
    locate(r, c, off);
    return (single ? base0 : chunks[c]) + off;
  }
};

/// Byte offset of word `j` of a row: adjacent rows are flat; a strided row is elements
/// of `wpe` words (a power of two, words no wider than an element) `col_stride_bytes` apart.
template <int W>
DK_INLINE int64_t word_offset(const ByteRows& t, int64_t j, int wpe_shift) {
  if (t.adjacent()) return j * W;
  const int64_t e = j >> wpe_shift;
  return e * t.col_stride_bytes + (j - (e << wpe_shift)) * W;
}

/// log2 of the words per element for the strided layout (0 when words span elements).
DK_INLINE int words_per_elem_shift(int64_t elem_bytes, int w) {
  int s = 0;
  while ((static_cast<int64_t>(w) << s) < elem_bytes) ++s;
  return s;
}

/// Words of one row of the window.
DK_INLINE int64_t row_words(const ByteRows& t, int w) { return t.row_bytes() / w; }

/// The rows [i0, min(i0 + K, n)) of a group: table[k], row idx[i0 + k] of t (nullptr for a bad
/// index), and dense[k], row i0 + k of the dense rows at `dense_base` (row_bytes apart; nullptr
/// past n, and with `skip_bad` also for a bad index). Returns the lowest bad position, or -1.
template <int K, class I, class D>
DK_INLINE int64_t locate_rows_group(const ByteRows& t, const I* idx, int64_t i0, int64_t n, D* dense_base,
                                    char* (&table)[K], D* (&dense)[K], bool skip_bad) {
  int64_t bad = -1;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t i = i0 + k;
    table[k] = nullptr;
    dense[k] = nullptr;
    if (i >= n) continue;
    const int64_t r = static_cast<int64_t>(idx[i]);
    const bool ok = t.valid(r);
    if (ok) table[k] = t.row(r);
    if (!ok && bad < 0) bad = i;
    if (ok || !skip_bad) dense[k] = dense_base + i * t.row_bytes();
  }
  return bad;
}

/// out[i, :] = t[idx[i], :] for i in [i0, min(i0 + K, n)), the share of `lane` of `G`
/// lanes (words lane, lane + G, ...). `out` rows are dense (row_bytes apart). A bad index
/// gives a row of zeros. Returns the lowest bad position among these rows, or -1.
template <int W, int K, class I>
DK_INLINE int64_t gather_rows_group(const ByteRows& t, const I* idx, int64_t i0, int64_t n, char* out, int lane,
                                    int G) {
  using Wd = typename Word<W>::type;
  const int64_t nw = row_words(t, W);
  const int sh = words_per_elem_shift(t.elem_bytes, W);
  char* src[K];
  char* dst[K];
  const int64_t bad = locate_rows_group<K>(t, idx, i0, n, out, src, dst, false);
  for (int64_t j = lane; j < nw; j += G) {
    const int64_t off = word_offset<W>(t, j, sh);
    Wd v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (src[k] != nullptr) {
        v[k] = *reinterpret_cast<const Wd*>(src[k] + off);
      } else {
        v[k] = Wd{};
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (dst[k] != nullptr) reinterpret_cast<Wd*>(dst[k])[j] = v[k];
  }
  return bad;
}

/// t[idx[i], :] = vals[i, :] for the rows [i0, min(i0 + K, n)); a bad index writes nothing.
/// With repeated indices the rows race (on the CPU with G = 1 the last one wins).
template <int W, int K, class I>
DK_INLINE int64_t scatter_rows_group(const ByteRows& t, const I* idx, int64_t i0, int64_t n, const char* vals,
                                     int lane, int G) {
  using Wd = typename Word<W>::type;
  const int64_t nw = row_words(t, W);
  const int sh = words_per_elem_shift(t.elem_bytes, W);
  char* dst[K];
  const char* src[K];
  const int64_t bad = locate_rows_group<K>(t, idx, i0, n, vals, dst, src, true);
  for (int64_t j = lane; j < nw; j += G) {
    const int64_t off = word_offset<W>(t, j, sh);
    Wd v[K];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (src[k] != nullptr) v[k] = reinterpret_cast<const Wd*>(src[k])[j];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (dst[k] != nullptr) *reinterpret_cast<Wd*>(dst[k] + off) = v[k];
  }
  return bad;
}

/// t[idx[i], :] += alpha * vals[i, :] for the rows [i0, min(i0 + K, n)), element by element
/// through `add(T* element, T value, float alpha)` (a plain add on the CPU, an atomic one on
/// the GPU), the values read as W-byte words of W / sizeof(T) elements. Needs words no
/// narrower than an element (W >= sizeof(T)) and, for strided rows, W == sizeof(T).
template <class T, int W, class I, class Add>
DK_INLINE int64_t scatter_add_rows_group(const ByteRows& t, const I* idx, int64_t i0, int64_t n, int K,
                                         const char* vals, float alpha, int lane, int G, Add add) {
  using Wd = typename Word<W>::type;
  static_assert(W >= static_cast<int>(sizeof(T)) && W % sizeof(T) == 0, "words narrower than an element");
  constexpr int E = W / static_cast<int>(sizeof(T));
  const int64_t nw = row_words(t, W);
  int64_t bad = -1;
  for (int k = 0; k < K; ++k) {
    const int64_t i = i0 + k;
    if (i >= n) break;
    const int64_t r = static_cast<int64_t>(idx[i]);
    if (!t.valid(r)) {
      if (bad < 0) bad = i;
      continue;
    }
    char* d = t.row(r);
    const Wd* s = reinterpret_cast<const Wd*>(vals + i * t.row_bytes());
    for (int64_t j = lane; j < nw; j += G) {
      const Wd w = s[j];
      T e[E];
      memcpy(e, &w, sizeof(w));
#pragma unroll
      for (int q = 0; q < E; ++q) {
        const int64_t c = j * E + q;  // column
        add(reinterpret_cast<T*>(d + c * t.col_stride_bytes), e[q], alpha);
      }
    }
  }
  return bad;
}

/// Lanes per row group: the words of a row spread over up to a warp (a power of two).
DK_INLINE int lanes_per_row(int64_t words) {
  int g = 1;
  while (g < 32 && g < words) g <<= 1;
  return g;
}

/// The three row operations.
enum class RowMove { Gather, Scatter, ScatterAdd };

/// Rows each lane group moves at once (loads in flight per lane for gather and scatter).
constexpr int kRowsInFlight = 4;

/// A ByteRows over `nchunks` chunk pointers `chunks` (the pointer array the row functions
/// read; `first` is chunk 0's address), for element sizes, strides and offsets in elements.
inline ByteRows make_byte_rows(char* const* chunks, uintptr_t first, size_t nchunks, int64_t rows_per_chunk,
                               int64_t nrows, int64_t row0, int64_t col0, int64_t ncols, int64_t elem_bytes,
                               int64_t row_stride, int64_t col_stride) {
  ByteRows t{};
  t.chunks = chunks;
  t.base0 = reinterpret_cast<char*>(first);
  t.rows_per_chunk = rows_per_chunk;
  t.nrows = nrows;
  t.row0 = row0;
  t.col_offset_bytes = col0 * col_stride * elem_bytes;
  t.ncols = ncols;
  t.elem_bytes = elem_bytes;
  t.row_stride_bytes = row_stride * elem_bytes;
  t.col_stride_bytes = col_stride * elem_bytes;
  t.single = nchunks == 1;
  return t;
}

/// The word width for moving rows of `t` to or from the dense rows at `data`: the widest
/// dividing the row length, the strides, the window offset and every base address
/// (`chunks`, host copies of the addresses); words of a strided row stay inside an element.
inline int choose_word_bytes(const ByteRows& t, const uintptr_t* chunks, size_t nchunks, uintptr_t data) {
  uint64_t bits = static_cast<uint64_t>(t.row_bytes()) | static_cast<uint64_t>(t.row_stride_bytes) |
                  static_cast<uint64_t>(t.col_offset_bytes) | static_cast<uint64_t>(data);
  if (!t.adjacent()) bits |= static_cast<uint64_t>(t.elem_bytes) | static_cast<uint64_t>(t.col_stride_bytes);
  for (size_t c = 0; c < nchunks; ++c) bits |= static_cast<uint64_t>(chunks[c]);
  return word_bytes_for(bits);
}

/// f(std::integral_constant<int, W>{}) for the word width `w` (16, 8, 4, 2 or 1).
template <class F>
decltype(auto) dispatch_word(int w, F&& f) {
  switch (w) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

}  // namespace distkit
