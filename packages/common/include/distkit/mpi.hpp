// distkit/mpi.hpp - MPI helpers. Include only from extensions built with MPI.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "error.hpp"

namespace distkit {
namespace mpi {

/// Throw MPIError carrying MPI's own error string when rc != MPI_SUCCESS.
inline void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
  throw MPIError(str(what, " failed: ", std::string(msg, static_cast<size_t>(len)), " (code ", rc, ")"), rc);
}

/// The MPI datatype of a distkit dtype. 16-bit floats travel as 2-byte opaque
/// units (MPI_UINT16_T); reductions on them need a user-defined op.
inline MPI_Datatype datatype(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16: return MPI_UINT16_T;
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int8: return MPI_INT8_T;
    case DType::Int16: return MPI_INT16_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Bool: return MPI_C_BOOL;
    case DType::Complex64: return MPI_C_FLOAT_COMPLEX;
    case DType::Complex128: return MPI_C_DOUBLE_COMPLEX;
  }
  throw TypeError(str("no MPI datatype for dtype code ", static_cast<int>(t)));
}

/// An MPI_Comm from the integer handle mpi4py exposes as `Comm.handle`.
inline MPI_Comm comm_from_handle(uintptr_t h) {
  static_assert(sizeof(MPI_Comm) <= sizeof(uintptr_t), "MPI_Comm does not fit an integer handle");
  MPI_Comm c;
  if constexpr (sizeof(MPI_Comm) == sizeof(uintptr_t)) {
    std::memcpy(&c, &h, sizeof(c));
  } else {
    auto v = static_cast<int>(h);  // MPICH-style integer handles
    std::memcpy(&c, &v, sizeof(c));
  }
  return c;
}

/// Split `comm` into the groups of ranks whose `key` is equal (every rank passes its own;
/// collective). The group of a key is named by its lowest rank; ranks keep their order.
/// The caller frees the communicator returned.
inline MPI_Comm split_by_key(MPI_Comm comm, const std::string& key) {
  int rank = 0, size = 0;
  check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  const int len = static_cast<int>(key.size());
  std::vector<int> lens(static_cast<size_t>(size)), offs(static_cast<size_t>(size) + 1, 0);
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather");
  for (int r = 0; r < size; ++r) offs[r + 1] = offs[r] + lens[r];
  std::string all(static_cast<size_t>(offs[size]), '\0');
  check(MPI_Allgatherv(key.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm),
        "MPI_Allgatherv");
  int color = rank;
  for (int r = 0; r < rank; ++r)
    if (lens[r] == len && all.compare(offs[r], lens[r], key) == 0) {
      color = r;
      break;
    }
  MPI_Comm out;
  check(MPI_Comm_split(comm, color, rank, &out), "MPI_Comm_split");
  return out;
}

/// MPI_Get_library_version as a string (tells which libmpi the extension runs on).
inline std::string library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  check(MPI_Get_library_version(buf, &len), "MPI_Get_library_version");
  return std::string(buf, static_cast<size_t>(len));
}

inline bool initialized() {
  int flag = 0, fin = 0;
  MPI_Initialized(&flag);
  MPI_Finalized(&fin);
  return flag && !fin;
}

}  // namespace mpi
}  // namespace distkit
