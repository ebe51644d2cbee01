// collectives.hpp - the blocking MPI calls of mpiad, on raw buffers.
//
// Counts are int64: above INT_MAX they use the MPI-4 large-count functions when
// the library has them, otherwise derived datatypes (bigcount.hpp) or, for
// reductions, calls of at most chunk_elements() elements. Each function runs with the
// GIL released, from the caller's thread (blocking API) or from the engine's
// worker thread (non-blocking API, engine.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "bigcount.hpp"
#include "distkit/dtype.hpp"
#include "distkit/error.hpp"
#include "distkit/mpi.hpp"
#include "ops.hpp"

namespace mpiad {

namespace dm = distkit::mpi;
using distkit::check;
using distkit::DType;

inline int comm_size(MPI_Comm c) {
  int n = 0;
  dm::check(MPI_Comm_size(c, &n), "MPI_Comm_size");
  return n;
}

inline int comm_rank(MPI_Comm c) {
  int r = 0;
  dm::check(MPI_Comm_rank(c, &r), "MPI_Comm_rank");
  return r;
}

inline const char* at(const void* p, int64_t offset) { return static_cast<const char*>(p) + offset; }
inline char* at(void* p, int64_t offset) { return static_cast<char*>(p) + offset; }

// ------------------------------------------------------------ algorithm choice
// Large Allreduce messages take one of three paths (measured: packages/mpiad/README.md):
// - ranks on one node: MPI_Reduce to rank 0 + MPI_Bcast from `large_bytes` on,
//   which beats Open MPI's default MPI_Allreduce there;
// - ranks on several nodes: a pipelined ring (ring_allreduce below) from
//   `ring_bytes` on: every byte crosses the network once each way, as a plain
//   exchange of the buffers would, where MPI_Allreduce took 1.4x as long;
// - otherwise MPI_Allreduce.
enum Algo : int { kAlgoAuto = 0, kAlgoMpi = 1, kAlgoReduceBcast = 2, kAlgoRing = 3 };

/// The ring's default threshold: below it MPI_Allreduce's fewer, larger steps win.
constexpr int64_t kRingBytes = int64_t(256) << 10;

struct AllreduceConfig {
  std::atomic<int> mode{kAlgoAuto};
  std::atomic<int64_t> large_bytes{int64_t(32) << 20};
  std::atomic<int64_t> ring_bytes{kRingBytes};
};

inline AllreduceConfig& allreduce_config() {
  static AllreduceConfig cfg;
  return cfg;
}

/// Collective: the ranks of `c` that share this rank's node (the caller frees it).
inline MPI_Comm node_comm(MPI_Comm c) {
  MPI_Comm node = MPI_COMM_NULL;
  dm::check(MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  return node;
}

/// Collective: whether every rank of `c` shares one node's memory.
inline bool comm_is_shared(MPI_Comm c) {
  MPI_Comm node = node_comm(c);
  int mine = comm_size(node) == comm_size(c) ? 1 : 0, all = 0;
  MPI_Comm_free(&node);
  dm::check(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, c), "MPI_Allreduce");
  return all != 0;
}

/// What the large-message paths need to know of a communicator, found once.
struct CommPlan {
  bool inter = false;   // an intercommunicator: MPI_Allreduce only
  bool shared = false;  // every rank on one node
  /// The ring's own communicator: the ranks of `c` ordered host by host (so that
  /// only one hop per host crosses the network), and private, so that its
  /// point-to-point messages never match the user's receives.
  MPI_Comm ring = MPI_COMM_NULL;
  /// Tag of the next ring call: a call that failed half-way leaves messages
  /// that must not match a later call's receives.
  int next_tag = 0;
};

inline int free_comm_plan(MPI_Comm, int, void* value, void*) {
  auto* plan = static_cast<CommPlan*>(value);
  int finalized = 0;
  MPI_Finalized(&finalized);  // (some MPI libraries delete attributes during MPI_Finalize)
  if (!finalized && plan->ring != MPI_COMM_NULL) MPI_Comm_free(&plan->ring);
  delete plan;
  return MPI_SUCCESS;
}

/// The plan of `c`: collective on the first call for `c` (every rank passes the
/// same message size, so every rank calls it then); cached as an MPI attribute,
/// which dies with the communicator (a reused handle cannot see it).
inline CommPlan& comm_plan(MPI_Comm c) {
  static const int keyval = [] {
    int k = MPI_KEYVAL_INVALID;
    dm::check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_comm_plan, &k, nullptr), "MPI_Comm_create_keyval");
    return k;
  }();
  void* value = nullptr;
  int found = 0;
  dm::check(MPI_Comm_get_attr(c, keyval, &value, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<CommPlan*>(value);
  auto plan = std::make_unique<CommPlan>();
  int inter = 0;
  dm::check(MPI_Comm_test_inter(c, &inter), "MPI_Comm_test_inter");
  plan->inter = inter != 0;
  plan->shared = !plan->inter && comm_is_shared(c);
  dm::check(MPI_Comm_set_attr(c, keyval, plan.get()), "MPI_Comm_set_attr");
  return *plan.release();
}

/// The ring's communicator of `c` (collective on the first ring Allreduce on `c`):
/// the same ranks, numbered host by host (by the lowest rank of each host, then by rank).
inline MPI_Comm ring_comm(CommPlan& plan, MPI_Comm c) {
  if (plan.ring != MPI_COMM_NULL) return plan.ring;
  const int me = comm_rank(c);
  MPI_Comm node = node_comm(c);
  int host = me;
  const int rc = MPI_Allreduce(&me, &host, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  dm::check(rc, "MPI_Allreduce");
  const int64_t key = int64_t(host) * comm_size(c) + me;
  check<distkit::Error>(key <= INT_MAX, "communicator of ", comm_size(c), " ranks too large for the ring");
  dm::check(MPI_Comm_split(c, 0, static_cast<int>(key), &plan.ring), "MPI_Comm_split");
  return plan.ring;
}

enum class Path { kMpi, kReduceBcast, kRing };

/// The path of an Allreduce of `nbytes` on `c` (the same on every rank).
inline Path allreduce_path(MPI_Comm c, int64_t nbytes) {
  auto& cfg = allreduce_config();
  const int64_t large = cfg.large_bytes.load(), ring = cfg.ring_bytes.load();
  const int mode = cfg.mode.load();
  if (mode == kAlgoMpi || nbytes < (mode == kAlgoAuto ? std::min(large, ring) : large)) return Path::kMpi;
  if (comm_size(c) == 1) return Path::kMpi;
  const CommPlan& plan = comm_plan(c);
  if (plan.inter) return Path::kMpi;
  if (mode == kAlgoReduceBcast) return Path::kReduceBcast;
  if (mode == kAlgoRing) return Path::kRing;
  if (plan.shared) return nbytes >= large ? Path::kReduceBcast : Path::kMpi;
  return nbytes >= ring ? Path::kRing : Path::kMpi;
}

// ------------------------------------------------------------------ reductions
/// A reduction's MPI datatype/op and its size in MPI items (pairs for MINLOC/MAXLOC).
struct Reduction {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  int64_t items = 0;
  int64_t item_bytes = 0;
};

inline Reduction reduction(int64_t op, DType d, int64_t nbytes) {
  Reduction r;
  resolve(op, d, &r.type, &r.op);
  r.item_bytes = distkit::itemsize(d) * (is_loc(op) ? 2 : 1);
  check<distkit::ValueError>(nbytes >= 0 && nbytes % r.item_bytes == 0, "nbytes = ", nbytes,
                             " is not a multiple of ", r.item_bytes);
  r.items = nbytes / r.item_bytes;
  return r;
}

// ------------------------------------------------------------------ ring
/// The ring moves each step's block in pieces of this size, so that a piece is
/// reduced and passed on while the next one is on the wire.
constexpr int64_t kRingSegmentBytes = int64_t(1) << 20;

/// Requests of one ring call. Should a call fail half-way (an MPI error
/// raised as an exception), its receives are cancelled before the buffers they
/// write go away, and its sends are left to MPI: they carry this call's tag,
/// which no later call receives.
class RingRequests {
 public:
  std::vector<MPI_Request> sent, next, recvd;
  ~RingRequests() {
    for (auto& r : recvd) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    for (auto* v : {&sent, &next})
      for (auto& r : *v)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  static void wait_all(std::vector<MPI_Request>& v) {
    if (!v.empty()) dm::check(MPI_Waitall(static_cast<int>(v.size()), v.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
};

/// Allreduce as a pipelined ring on `pc` (the ring's communicator): the buffer
/// is cut into one block per rank; in p-1 steps every rank passes a block to its
/// right neighbour, which reduces it into its own (reduce-scatter), and in p-1
/// more steps the reduced blocks go round (allgather). Each rank sends and
/// receives 2 (p-1)/p of the buffer. A received piece is passed on as soon as
/// it is reduced. Every rank ends with the same values: each block is reduced
/// once, in one order. (Which operand of a reduction is the received one
/// differs between in place and not, as MPI leaves it open for its
/// commutative ops; it shows only in the sign of a zero from MAX/MIN of -0 and
/// +0, or in which NaN survives.) send == recv: in place. At least 2 ranks
/// (allreduce_path keeps single-rank communicators on MPI_Allreduce).
inline void ring_allreduce(MPI_Comm pc, int tag, const void* send, void* recv, const Reduction& r) {
  const int p = comm_size(pc), me = comm_rank(pc);
  const bool inplace = send == recv;
  char* out = static_cast<char*>(recv);
  const char* in = static_cast<const char*>(send);
  const int64_t ib = r.item_bytes;
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  const int64_t base = r.items / p, extra = r.items % p;
  auto first = [&](int b) { return b * base + std::min<int64_t>(b, extra); };  // in items
  auto count = [&](int b) { return base + (b < extra ? 1 : 0); };
  auto block = [&](int t) { return ((me - t) % p + p) % p; };  // the block this rank sends at step t
  const int64_t seg = std::max<int64_t>(1, kRingSegmentBytes / ib);
  // in place, a received piece cannot land on this rank's own values: room for one block
  // (block 0 is the largest), not initialised
  std::unique_ptr<char[]> tmp(inplace ? new char[static_cast<size_t>(count(0) * ib)] : nullptr);
  RingRequests q;
  auto isend = [&](const char* buf, int64_t n, std::vector<MPI_Request>& reqs) {
    reqs.push_back(MPI_REQUEST_NULL);
    dm::check(MPI_Isend(buf, static_cast<int>(n), r.type, right, tag, pc, &reqs.back()), "MPI_Isend");
  };
  // step 0 sends this rank's own block
  const int b0 = block(0);
  for (int64_t i = 0; i < count(b0); i += seg)
    isend((inplace ? out : in) + (first(b0) + i) * ib, std::min(seg, count(b0) - i), q.sent);
  const int steps = 2 * (p - 1);
  for (int t = 0; t < steps; ++t) {
    const int c = block(t + 1);  // the block received at step t (and sent at step t + 1)
    const bool reduce = t < p - 1;
    const int64_t n = count(c), off = first(c) * ib;
    q.recvd.clear();
    for (int64_t i = 0; i < n; i += seg) {
      char* dst = (reduce && inplace ? tmp.get() : out + off) + i * ib;
      q.recvd.push_back(MPI_REQUEST_NULL);
      dm::check(MPI_Irecv(dst, static_cast<int>(std::min(seg, n - i)), r.type, left, tag, pc, &q.recvd.back()),
                "MPI_Irecv");
    }
    for (size_t j = 0; j < q.recvd.size(); ++j) {
      dm::check(MPI_Wait(&q.recvd[j], MPI_STATUS_IGNORE), "MPI_Wait");
      const int64_t i = static_cast<int64_t>(j) * seg, m = std::min(seg, n - i);
      char* piece = out + off + i * ib;
      if (reduce) {
        // MPI_Reduce_local: inout = in op inout (in place the received piece is in tmp)
        const char* other = inplace ? tmp.get() + i * ib : in + off + i * ib;
        dm::check(MPI_Reduce_local(other, piece, static_cast<int>(m), r.type, r.op), "MPI_Reduce_local");
      }
      if (t + 1 < steps) isend(piece, m, q.next);
    }
    // a block's region is received into again p - 1 steps after it was sent: the sends
    // of this step complete before the next step (they are what the right neighbour
    // receives now)
    RingRequests::wait_all(q.sent);
    q.sent.swap(q.next);
    q.next.clear();
  }
  RingRequests::wait_all(q.sent);
}

/// recv = op over the ranks' send (send == recv: in place); `nbytes` per rank;
/// `r` = reduction(op, d, nbytes), validated by the caller before any communication.
inline void allreduce(MPI_Comm c, const void* send, void* recv, int64_t nbytes, DType d, int64_t op,
                      const Reduction& r) {
  const bool inplace = send == recv;
  const Path path = allreduce_path(c, nbytes);
  if (path == Path::kRing) {  // (its messages are pieces of at most kRingSegmentBytes: no large counts)
    CommPlan& plan = comm_plan(c);
    const int tag = plan.next_tag;
    plan.next_tag = (plan.next_tag + 1) % 32768;  // (MPI_TAG_UB is at least 32767)
    ring_allreduce(ring_comm(plan, c), tag, send, recv, r);
    if (op == kAvg) divide_by(recv, nbytes / distkit::itemsize(d), d, comm_size(c));
    return;
  }
  const bool rb = path == Path::kReduceBcast;
  const int rank = rb ? comm_rank(c) : 0;
#if MPI_VERSION >= 4
  const int64_t step = r.items;
#else
  const int64_t step = chunk_elements();
#endif
  for (int64_t i = 0; i < r.items; i += step) {
    const int64_t off = i * r.item_bytes;
    const void* sb = inplace ? MPI_IN_PLACE : at(send, off);
    void* rbuf = at(recv, off);
#if MPI_VERSION >= 4
    const MPI_Count n = r.items;
    if (rb) {
      if (rank == 0) {
        dm::check(MPI_Reduce_c(sb, rbuf, n, r.type, r.op, 0, c), "MPI_Reduce_c");
      } else {
        dm::check(MPI_Reduce_c(inplace ? rbuf : sb, nullptr, n, r.type, r.op, 0, c), "MPI_Reduce_c");
      }
      dm::check(MPI_Bcast_c(rbuf, n, r.type, 0, c), "MPI_Bcast_c");
    } else {
      dm::check(MPI_Allreduce_c(sb, rbuf, n, r.type, r.op, c), "MPI_Allreduce_c");
    }
#else
    const int n = static_cast<int>(std::min(step, r.items - i));
    if (rb) {
      if (rank == 0) {
        dm::check(MPI_Reduce(sb, rbuf, n, r.type, r.op, 0, c), "MPI_Reduce");
      } else {
        dm::check(MPI_Reduce(inplace ? rbuf : sb, nullptr, n, r.type, r.op, 0, c), "MPI_Reduce");
      }
      dm::check(MPI_Bcast(rbuf, n, r.type, 0, c), "MPI_Bcast");
    } else {
      dm::check(MPI_Allreduce(sb, rbuf, n, r.type, r.op, c), "MPI_Allreduce");
    }
#endif
  }
  if (op == kAvg) divide_by(recv, nbytes / distkit::itemsize(d), d, comm_size(c));
}

inline void allreduce(MPI_Comm c, const void* send, void* recv, int64_t nbytes, DType d, int64_t op) {
  allreduce(c, send, recv, nbytes, d, op, reduction(op, d, nbytes));
}

/// root's recv = op over the ranks' send (send == recv on root: in place).
inline void reduce(MPI_Comm c, const void* send, void* recv, int64_t count, DType d, int64_t op, int root) {
  const Reduction r = reduction(op, d, count * distkit::itemsize(d));
  const int rank = comm_rank(c);
  const bool inplace = send == recv && rank == root;
#if MPI_VERSION >= 4
  if (r.items) {
    dm::check(MPI_Reduce_c(inplace ? MPI_IN_PLACE : send, recv, r.items, r.type, r.op, root, c), "MPI_Reduce_c");
  }
#else
  const int64_t step = chunk_elements();
  for (int64_t i = 0; i < r.items; i += step) {
    const int64_t off = i * r.item_bytes;
    const int n = static_cast<int>(std::min(step, r.items - i));
    const void* sb = inplace ? MPI_IN_PLACE : at(send, off);
    void* rbuf = rank == root ? at(recv, off) : nullptr;
    dm::check(MPI_Reduce(sb, rbuf, n, r.type, r.op, root, c), "MPI_Reduce");
  }
#endif
  if (op == kAvg && rank == root) divide_by(recv, count, d, comm_size(c));
}

/// Rank r's recv = op over the ranks' block r of send (blocks of counts[r] elements).
inline void reduce_scatter(MPI_Comm c, const void* send, void* recv, const std::vector<int64_t>& counts, DType d,
                           int64_t op) {
  const int size = comm_size(c), rank = comm_rank(c);
  check<distkit::ValueError>(static_cast<int>(counts.size()) == size, "counts has ", counts.size(),
                             " entries, expected ", size);
  check<distkit::TypeError>(!is_loc(op), "Reduce_scatter does not support ", op_name(op));
  int64_t total = 0;
  bool small = true;
  for (int64_t n : counts) {
    check<distkit::ValueError>(n >= 0, "counts must be >= 0, got ", n);
    total += n;
    small = small && fits_int(total);
  }
  if (small) {
    MPI_Datatype t;
    MPI_Op o;
    resolve(op, d, &t, &o);
    std::vector<int> n(counts.begin(), counts.end());
    dm::check(MPI_Reduce_scatter(send, recv, n.data(), t, o, c), "MPI_Reduce_scatter");
    if (op == kAvg) divide_by(recv, counts[rank], d, size);
    return;
  }
  // above INT_MAX in total: one (chunked) reduction per block, to its owner
  int64_t offset = 0;
  for (int r = 0; r < size; ++r) {
    reduce(c, at(send, offset * distkit::itemsize(d)), r == rank ? recv : nullptr, counts[r], d, op, r);
    offset += counts[r];
  }
}

// -------------------------------------------------------------- data movement
inline void bcast(MPI_Comm c, void* buf, int64_t count, DType d, int root) {
  Span s(dm::datatype(d), count);
  dm::check(MPI_Bcast(buf, s.count(), s.type(), root, c), "MPI_Bcast");
}

/// Whether counts, displacements and their ends all fit an int (the classic v-call works).
inline bool fits_v(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) {
  for (size_t i = 0; i < counts.size(); ++i) {
    if (!fits_int(counts[i]) || !fits_int(displs[i]) || !fits_int(counts[i] + displs[i])) return false;
  }
  return true;
}

inline std::vector<int> ints(const std::vector<int64_t>& v) { return std::vector<int>(v.begin(), v.end()); }

inline void check_per_rank(const std::vector<int64_t>& v, int size, const char* what) {
  check<distkit::ValueError>(static_cast<int>(v.size()) == size, what, " has ", v.size(), " entries, expected ", size);
  for (int64_t x : v) check<distkit::ValueError>(x >= 0, what, " must be >= 0, got ", x);
}

/// MPI_Alltoallw with one (possibly derived, offset) datatype per peer: the one call
/// every v-collective becomes when a count or displacement does not fit an int.
inline void alltoallw(MPI_Comm c, const void* send, const std::vector<Span>& st, void* recv,
                      const std::vector<Span>& rt) {
  const size_t p = st.size();
  std::vector<int> sc(p), rc(p), zero(p, 0);
  std::vector<MPI_Datatype> stypes(p), rtypes(p);
  for (size_t i = 0; i < p; ++i) {
    sc[i] = st[i].count();
    stypes[i] = st[i].type();
    rc[i] = rt[i].count();
    rtypes[i] = rt[i].type();
  }
  dm::check(MPI_Alltoallw(send, sc.data(), zero.data(), stypes.data(), recv, rc.data(), zero.data(), rtypes.data(), c),
            "MPI_Alltoallw");
}

/// One Span per rank: counts[r] elements at displs[r] (elements) of a `d` buffer.
inline std::vector<Span> placed(MPI_Datatype t, DType d, const std::vector<int64_t>& counts,
                                const std::vector<int64_t>& displs) {
  std::vector<Span> out;
  out.reserve(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) out.emplace_back(t, counts[i], displs[i] * distkit::itemsize(d));
  return out;
}

/// `size` Spans: `count` elements for rank `only` (every rank when only < 0), 0 for the others.
inline std::vector<Span> uniform(MPI_Datatype t, int size, int64_t count, int only = -1) {
  std::vector<Span> out;
  out.reserve(size);
  for (int r = 0; r < size; ++r) out.emplace_back(t, (only < 0 || r == only) ? count : 0);
  return out;
}

inline void gatherv(MPI_Comm c, const void* send, int64_t count, void* recv, const std::vector<int64_t>& counts,
                    const std::vector<int64_t>& displs, DType d, int root) {
  const int size = comm_size(c), rank = comm_rank(c);
  check_per_rank(counts, size, "counts");
  check_per_rank(displs, size, "displs");
  const MPI_Datatype t = dm::datatype(d);
  if (fits_int(count) && fits_v(counts, displs)) {
    auto rc = ints(counts), rd = ints(displs);
    dm::check(MPI_Gatherv(send, static_cast<int>(count), t, recv, rc.data(), rd.data(), t, root, c), "MPI_Gatherv");
    return;
  }
  std::vector<int64_t> none(size, 0);
  alltoallw(c, send, uniform(t, size, count, root), recv,
            rank == root ? placed(t, d, counts, displs) : placed(t, d, none, none));
}

inline void allgatherv(MPI_Comm c, const void* send, int64_t count, void* recv, const std::vector<int64_t>& counts,
                       const std::vector<int64_t>& displs, DType d) {
  const int size = comm_size(c);
  check_per_rank(counts, size, "counts");
  check_per_rank(displs, size, "displs");
  const MPI_Datatype t = dm::datatype(d);
  if (fits_int(count) && fits_v(counts, displs)) {
    auto rc = ints(counts), rd = ints(displs);
    dm::check(MPI_Allgatherv(send, static_cast<int>(count), t, recv, rc.data(), rd.data(), t, c), "MPI_Allgatherv");
    return;
  }
  alltoallw(c, send, uniform(t, size, count), recv, placed(t, d, counts, displs));
}

/// `counts`/`displs` are needed on every rank (every rank takes the same path).
inline void scatterv(MPI_Comm c, const void* send, const std::vector<int64_t>& counts,
                     const std::vector<int64_t>& displs, void* recv, int64_t count, DType d, int root) {
  const int size = comm_size(c), rank = comm_rank(c);
  check_per_rank(counts, size, "counts");
  check_per_rank(displs, size, "displs");
  const MPI_Datatype t = dm::datatype(d);
  if (fits_int(count) && fits_v(counts, displs)) {
    auto sc = ints(counts), sd = ints(displs);
    dm::check(MPI_Scatterv(send, sc.data(), sd.data(), t, recv, static_cast<int>(count), t, root, c), "MPI_Scatterv");
    return;
  }
  std::vector<int64_t> none(size, 0);
  alltoallw(c, send, rank == root ? placed(t, d, counts, displs) : placed(t, d, none, none), recv,
            uniform(t, size, count, root));
}

inline void alltoallv(MPI_Comm c, const void* send, const std::vector<int64_t>& scounts,
                      const std::vector<int64_t>& sdispls, void* recv, const std::vector<int64_t>& rcounts,
                      const std::vector<int64_t>& rdispls, DType d) {
  const int size = comm_size(c);
  check_per_rank(scounts, size, "send counts");
  check_per_rank(sdispls, size, "send displs");
  check_per_rank(rcounts, size, "recv counts");
  check_per_rank(rdispls, size, "recv displs");
  const MPI_Datatype t = dm::datatype(d);
  if (fits_v(scounts, sdispls) && fits_v(rcounts, rdispls)) {
    auto sc = ints(scounts), sd = ints(sdispls), rc = ints(rcounts), rd = ints(rdispls);
    dm::check(MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, c), "MPI_Alltoallv");
    return;
  }
  alltoallw(c, send, placed(t, d, scounts, sdispls), recv, placed(t, d, rcounts, rdispls));
}

inline void send(MPI_Comm c, const void* buf, int64_t count, DType d, int dest, int tag) {
  Span s(dm::datatype(d), count);
  dm::check(MPI_Send(buf, s.count(), s.type(), dest, tag, c), "MPI_Send");
}

inline void recv(MPI_Comm c, void* buf, int64_t count, DType d, int source, int tag) {
  Span s(dm::datatype(d), count);
  dm::check(MPI_Recv(buf, s.count(), s.type(), source, tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
}

inline void sendrecv(MPI_Comm c, const void* sbuf, int64_t scount, int dest, int stag, void* rbuf, int64_t rcount,
                     int source, int rtag, DType d) {
  Span s(dm::datatype(d), scount), r(dm::datatype(d), rcount);
  dm::check(MPI_Sendrecv(sbuf, s.count(), s.type(), dest, stag, rbuf, r.count(), r.type(), source, rtag, c,
                         MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
}

}  // namespace mpiad
