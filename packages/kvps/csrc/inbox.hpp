// inbox.hpp - receiving messages without blocking, in order per source.
//
// A large message travels by rendezvous: its data moves only while the sender
// drives MPI too. A blocking MPI_Recv of it spins inside MPI until then, and on
// a node with more threads than cores that spinning takes the CPU the sender's
// progress thread needs: four ranks on two cores stalled for seconds at a time,
// every core busy, until the scheduler happened to run the right thread. So the
// progress thread receives every matched large message into a buffer of its
// own (MPI_Imrecv), goes on working and sleeping, and hands it out once it is
// complete. (A small message is all there once matched: the engine receives
// and handles it at once, unless an earlier one of its source waits here.)
// The protocol relies on messages from one source being handled in the order
// they were sent, so a message waits behind every earlier one of its source.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

#include "distkit/mpi.hpp"

namespace kvps {

class Inbox {
 public:
  struct Message {
    int src = -1;
    std::vector<char> buf;
    MPI_Request req = MPI_REQUEST_NULL;
  };

  explicit Inbox(int size = 0) : queues_(static_cast<size_t>(size)) {}
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  /// A receive still in flight here (the engine stopped on an error, or a
  /// peer died mid-send) may still be written into by MPI, and a matched
  /// receive cannot be cancelled: its buffer is left allocated, not freed
  /// under MPI. (A leak checker reports it: deliberately, on that path only.)
  ~Inbox() {
    for (auto& q : queues_) {
      for (auto& m : q) {
        if (m.req != MPI_REQUEST_NULL) static_cast<void>(new std::vector<char>(std::move(m.buf)));
      }
    }
  }

  /// Receive the message MPI_Improbe matched (`count` bytes from `src`).
  void receive(MPI_Message& msg, int src, int count) {
    Message m;
    m.src = src;
    m.buf = take_buffer(static_cast<size_t>(count));
    distkit::mpi::check(MPI_Imrecv(m.buf.data(), count, MPI_BYTE, &msg, &m.req), "MPI_Imrecv");
    auto& q = queues_[static_cast<size_t>(src)];
    if (q.empty()) active_.push_back(src);
    q.push_back(std::move(m));
  }

  /// The oldest complete message of some source whose earlier messages were all
  /// handed out, or nullptr. Hand it back with done() before the next call.
  Message* next() {
    for (size_t i = 0; i < active_.size(); ++i) {
      const size_t at = (start_ + i) % active_.size();
      Message& m = queues_[static_cast<size_t>(active_[at])].front();
      int flag = 0;
      distkit::mpi::check(MPI_Test(&m.req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
      if (flag) {
        start_ = at;  // (the sources take turns: a busy one cannot starve the others)
        return &m;
      }
    }
    return nullptr;
  }

  /// The message next() returned was handled: drop it, keep its buffer for reuse.
  void done(Message* m) {
    const int src = m->src;
    auto& q = queues_[static_cast<size_t>(src)];
    spare_.push_back(std::move(q.front().buf));
    q.pop_front();
    if (q.empty()) {
      for (size_t i = 0; i < active_.size(); ++i) {
        if (active_[i] != src) continue;
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    } else {
      start_ = (start_ + 1) % active_.size();
    }
    if (start_ >= active_.size()) start_ = 0;
  }

  /// Whether messages were received but not yet handed out and handled.
  bool pending() const { return !active_.empty(); }
  /// Whether a message of `src` waits here (a later one must queue behind it).
  bool waiting(int src) const { return !queues_[static_cast<size_t>(src)].empty(); }

 private:
  std::vector<char> take_buffer(size_t bytes) {
    // reuse a buffer that fits (the last ones are the most recently used)
    for (size_t i = spare_.size(); i-- > 0;) {
      if (spare_[i].capacity() < bytes) continue;
      std::vector<char> b = std::move(spare_[i]);
      spare_.erase(spare_.begin() + static_cast<std::ptrdiff_t>(i));
      b.resize(bytes);
      return b;
    }
    if (spare_.size() > kSpares) spare_.erase(spare_.begin());
    return std::vector<char>(bytes);
  }

  static constexpr size_t kSpares = 8;
  std::vector<std::deque<Message>> queues_;  // per source, in arrival order
  std::vector<int> active_;                  // sources with messages in their queue
  size_t start_ = 0;
  std::vector<std::vector<char>> spare_;
};

}  // namespace kvps
