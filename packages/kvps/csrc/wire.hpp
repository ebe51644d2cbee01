// wire.hpp - the messages kvps ranks exchange: types, layout, batching, sending.
//
// A message is one header, then n keys, n int64 "pos" words (a position in the
// origin's request, a version, or a rank: see each type) and the values of the
// keys, concatenated, if the type carries values. Handlers batch the keys they
// send to one rank under one (type, origin, timestamp) into one message.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "distkit/error.hpp"
#include "distkit/mpi.hpp"

namespace kvps {

/// Messages up to this size are sent eagerly by every Open MPI transport here
/// (shared memory: 4 KiB): a receive of one completes as soon as it is matched.
constexpr int kEagerBytes = 4096;

/// Every message type has one meaning. Worker operations use the first three
/// codes as their op codes too (exported to Python as PULL / PUSH / SET).
enum MsgType : int32_t {
  M_PULL = 1,      // read keys; pos = position in the origin's request
  M_PUSH,          // apply the server's update rule (add, or an optimizer step) with the values
  M_SET,           // overwrite the parameters
  M_IPUSH,         // a dropped replica's accumulated updates, applied at the owner
  M_FETCH,         // replica creation: send me your value (slot) and version
  M_RSYNC,         // replica refresh with updates to apply; the owner answers M_RSYNC_RESP
  M_PULL_RESP,     // values for a pull; pos = position
  M_ACK,           // a push or set was applied; pos = position
  M_FETCH_RESP,    // slot for a replica; pos = version
  M_RSYNC_RESP,    // fresh slot for a replica; pos = version
  M_LOCALIZE,      // to the home: move these keys to the origin
  M_TRANSFER,      // home -> owner: hand these keys over to rank pos
  M_HANDOVER,      // owner -> new owner: the slot; pos = version
  M_INTENT_ADD,    // to the home: the origin intends these keys; pos = 1: a replica where others intend them too
  M_INTENT_DROP,   // to the home: the origin no longer intends these keys
  M_INTENT_ACK,    // home -> origin: the intent message was processed
  M_RELOC_NOTICE,  // home -> new owner: the key is on its way to you
  M_REPL_GRANT,    // home -> rank: fetch a replica of these keys
  M_RCHECK,        // replica refresh without updates: pos = the replica's version
  M_RCHECK_RESP,   // the owner's version equals the replica's: nothing changed
  M_BYE,           // the sender leaves without shutdown()
  M_LEDGER,        // the sender's intent ledger: keys[0] = gains, pos[0] = costs (ledger.hpp)
  M_GIVE_BACK,     // keys intent moved to the sender go back to their homes (intent paused: Engine::give_back)
  M_HERE,          // the sender owns these keys and keeps them: point routing hints at it (Engine::give_back)
};

/// What a message carries per key after the keys and positions.
enum class Payload { kNone, kRow, kSlot };

/// kRow: the parameters (or the update) a worker sees, value_lengths[k]
/// elements; kSlot: everything the owner stores for the key (parameters and
/// optimizer state), what moves when the key or a replica moves.
constexpr Payload payload(int32_t type) {
  switch (type) {
    case M_PUSH:
    case M_SET:
    case M_IPUSH:
    case M_RSYNC:
    case M_PULL_RESP:
      return Payload::kRow;
    case M_FETCH_RESP:
    case M_RSYNC_RESP:
    case M_HANDOVER:
      return Payload::kSlot;
    default:
      return Payload::kNone;
  }
}

constexpr int kTag = 7;

struct Hdr {
  int32_t type;
  int32_t origin;
  int64_t ts;
  int64_t n;
};

/// A decoded message (pointers into the receive buffer).
struct MsgView {
  Hdr h;
  const int64_t* keys;
  const int64_t* pos;
  const char* vals;
};

inline MsgView view(const char* buf) {
  MsgView m;
  std::memcpy(&m.h, buf, sizeof(Hdr));
  m.keys = reinterpret_cast<const int64_t*>(buf + sizeof(Hdr));
  m.pos = m.keys + m.h.n;
  m.vals = reinterpret_cast<const char*>(m.pos + m.h.n);
  return m;
}

/// The keys (and values) of one message under construction.
struct Builder {
  std::vector<int64_t> keys, pos;
  std::vector<char> vals;
  void put(int64_t k, int64_t p, const char* val, size_t bytes) {
    keys.push_back(k);
    pos.push_back(p);
    if (val) vals.insert(vals.end(), val, val + bytes);
  }
};

/// The messages one handler builds, one per (destination, type, origin, ts);
/// every message a handler sends is built here and sent by flush().
class Outbox {
 public:
  Builder& to(int dest, int32_t type, int32_t origin, int64_t ts) {
    Key key{dest, type, origin, ts};
    for (int i = 0; i < kCache; ++i)
      if (lb_[i] && last_[i] == key) return *lb_[i];
    const int i = next_;
    next_ = (i + 1) % kCache;
    last_[i] = key;
    lb_[i] = &m_[key];
    return *lb_[i];
  }
  template <class Send>
  void flush(Send&& send) {
    for (auto& [key, b] : m_) {
      auto [dest, type, origin, ts] = key;
      send(dest, type, origin, ts, b);
    }
    m_.clear();
    for (auto& p : lb_) p = nullptr;
  }

 private:
  using Key = std::tuple<int, int32_t, int32_t, int64_t>;
  static constexpr int kCache = 4;  // handlers alternate between a few messages
  std::map<Key, Builder> m_;
  Key last_[kCache];
  Builder* lb_[kCache] = {nullptr, nullptr, nullptr, nullptr};
  int next_ = 0;
};

/// Nonblocking sends whose buffers live until MPI is done with them.
class SendQueue {
 public:
  explicit SendQueue(MPI_Comm comm = MPI_COMM_NULL) : comm_(comm) {}
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  /// A send still in flight when the engine stops (on an error, or a peer
  /// gone) may still be read by MPI, or by the peer itself through single-copy
  /// shared memory: its buffer is left allocated, not freed under them.
  ~SendQueue() {
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] != MPI_REQUEST_NULL) static_cast<void>(bufs_[i].release());
    }
  }

  /// Returns the message's size in bytes.
  size_t send(int dest, int32_t type, int32_t origin, int64_t ts, const Builder& b) {
    const int64_t n = static_cast<int64_t>(b.keys.size());
    const size_t bytes = sizeof(Hdr) + 2 * n * sizeof(int64_t) + b.vals.size();
    distkit::check<distkit::Error>(bytes < static_cast<size_t>(INT32_MAX), "kvps message of ", bytes,
                                   " bytes exceeds 2 GiB; split the operation into smaller batches");
    auto buf = std::make_unique<std::vector<char>>(bytes);
    char* p = buf->data();
    Hdr h{type, origin, ts, n};
    std::memcpy(p, &h, sizeof(h));
    p += sizeof(h);
    if (n) std::memcpy(p, b.keys.data(), n * sizeof(int64_t));
    p += n * sizeof(int64_t);
    if (n) std::memcpy(p, b.pos.data(), n * sizeof(int64_t));
    p += n * sizeof(int64_t);
    if (!b.vals.empty()) std::memcpy(p, b.vals.data(), b.vals.size());
    MPI_Request r;
    distkit::mpi::check(MPI_Isend(buf->data(), static_cast<int>(bytes), MPI_BYTE, dest, kTag, comm_, &r),
                        "MPI_Isend");
    reqs_.push_back(r);
    bufs_.push_back(std::move(buf));
    return bytes;
  }

  /// Release the buffers of completed sends.
  void test() {
    if (reqs_.empty()) return;
    int outcount = 0;
    idx_.resize(reqs_.size());
    distkit::mpi::check(
        MPI_Testsome(static_cast<int>(reqs_.size()), reqs_.data(), &outcount, idx_.data(), MPI_STATUSES_IGNORE),
        "MPI_Testsome");
    if (outcount <= 0) return;
    size_t w = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      reqs_[w] = reqs_[i];
      bufs_[w] = std::move(bufs_[i]);
      ++w;
    }
    reqs_.resize(w);
    bufs_.resize(w);
  }

  bool empty() const { return reqs_.empty(); }

 private:
  MPI_Comm comm_;
  std::vector<MPI_Request> reqs_;
  std::vector<std::unique_ptr<std::vector<char>>> bufs_;
  std::vector<int> idx_;
};

}  // namespace kvps
