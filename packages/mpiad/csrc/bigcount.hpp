// bigcount.hpp - element counts above INT_MAX on MPI libraries without the MPI-4
// large-count (`_c`) functions.
//
// Data movement (Bcast, point to point, the v-collectives) describes a large
// buffer with one derived datatype (BigMPI's technique: a contiguous type of
// chunks plus a remainder), so it stays one MPI call. Reductions cannot use
// derived types with predefined ops, so they are chunked into calls of at most
// chunk_elements() elements (see collectives.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <utility>

#include "distkit/mpi.hpp"

namespace mpiad {

/// The largest count handed to an MPI call as an int. INT_MAX, except in the
/// tests, which lower it (set_count_limit) to run the large-count paths on small
/// buffers; the large-count machinery is then the same code at any size.
inline std::atomic<int64_t>& count_limit() {
  static std::atomic<int64_t> limit{INT_MAX};
  return limit;
}

inline bool fits_int(int64_t n) { return n >= 0 && n <= count_limit().load(std::memory_order_relaxed); }

/// Elements per MPI call when a count does not fit: 2^30 (a power of two, so chunk
/// boundaries keep the alignment of the buffer), or the lowered limit.
inline int64_t chunk_elements() { return std::min<int64_t>(int64_t(1) << 30, count_limit().load()); }

/// `n` elements of `base` starting `offset` bytes after the buffer address, as a
/// (datatype, count) pair for one MPI call: (base, n) when that is possible,
/// otherwise one committed derived datatype with count 1 (freed with the Span;
/// MPI lets a pending non-blocking call keep using a freed datatype).
class Span {
 public:
  Span(MPI_Datatype base, int64_t n, int64_t offset = 0) {
    namespace dm = distkit::mpi;
    if (n == 0 || (offset == 0 && fits_int(n))) {
      type_ = base;
      count_ = static_cast<int>(n);
      return;
    }
    MPI_Aint lb = 0, extent = 0;
    dm::check(MPI_Type_get_extent(base, &lb, &extent), "MPI_Type_get_extent");
    MPI_Datatype body = MPI_DATATYPE_NULL;
    if (fits_int(n)) {
      dm::check(MPI_Type_contiguous(static_cast<int>(n), base, &body), "MPI_Type_contiguous");
    } else {
      const int64_t chunk_n = chunk_elements();
      const int64_t q = n / chunk_n, r = n % chunk_n;
      MPI_Datatype chunk = MPI_DATATYPE_NULL, chunks = MPI_DATATYPE_NULL;
      dm::check(MPI_Type_contiguous(static_cast<int>(chunk_n), base, &chunk), "MPI_Type_contiguous");
      dm::check(MPI_Type_contiguous(static_cast<int>(q), chunk, &chunks), "MPI_Type_contiguous");
      if (r == 0) {
        body = chunks;
      } else {
        int lens[2] = {1, static_cast<int>(r)};
        MPI_Aint displs[2] = {0, static_cast<MPI_Aint>(q * chunk_n) * extent};
        MPI_Datatype types[2] = {chunks, base};
        dm::check(MPI_Type_create_struct(2, lens, displs, types, &body), "MPI_Type_create_struct");
        MPI_Type_free(&chunks);
      }
      MPI_Type_free(&chunk);
    }
    if (offset != 0) {
      int one = 1;
      MPI_Aint at = static_cast<MPI_Aint>(offset);
      MPI_Datatype placed = MPI_DATATYPE_NULL;
      dm::check(MPI_Type_create_struct(1, &one, &at, &body, &placed), "MPI_Type_create_struct");
      MPI_Type_free(&body);
      body = placed;
    }
    dm::check(MPI_Type_commit(&body), "MPI_Type_commit");
    type_ = body;
    count_ = 1;
    owned_ = true;
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  Span(Span&& o) noexcept : type_(o.type_), count_(o.count_), owned_(std::exchange(o.owned_, false)) {}
  ~Span() {
    if (owned_) MPI_Type_free(&type_);
  }
  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  int count_ = 0;
  bool owned_ = false;
};

}  // namespace mpiad
