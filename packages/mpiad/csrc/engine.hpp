// engine.hpp - the non-blocking collectives: one worker thread per process runs
// them, in the order they were started, as blocking MPI calls.
//
// Why a thread and not MPI_Iallreduce & co.: Open MPI (without an asynchronous
// progress thread) advances a non-blocking collective only inside MPI calls, so
// a large Iallreduce followed by computation would not move until its Wait; the
// overlap users start it for would not happen. A worker running the blocking
// call progresses it while the caller computes (as torch's ProcessGroupMPI does).
//
// Before each operation the worker waits, without spinning, until every rank's
// worker has reached it (an MPI_Ibarrier tested with a growing sleep): a blocking
// MPI call busy-polls while it waits for a late peer, and that poll would take
// the core from the computation the overlap is for (badly so when ranks share
// cores). Once all have arrived the transfer itself runs at full speed.
//
// The worker uses its own duplicate of each communicator (made, collectively, at
// the first non-blocking call on it and cached as an MPI attribute), so blocking
// collectives of the caller's thread on the original communicator can never be
// matched with the worker's: MPI requires one order of collectives per
// communicator, and the worker's FIFO gives every rank the same order.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "distkit/error.hpp"
#include "distkit/mpi.hpp"

namespace mpiad {

/// Completion state of one queued operation, shared by the worker and the request.
struct Pending {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lk(m);
      error = std::move(e);
      done = true;
    }
    cv.notify_all();
  }
  /// Block until done (call without the GIL); rethrows the operation's error.
  void wait() {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [this] { return done; });
    if (error) std::rethrow_exception(error);
  }
  bool test() {
    std::lock_guard<std::mutex> lk(m);
    if (done && error) std::rethrow_exception(error);
    return done;
  }
  /// Whether the operation has finished (never throws).
  bool finished() {
    std::lock_guard<std::mutex> lk(m);
    return done;
  }
};

class Engine {
 public:
  static Engine& get() {
    static Engine* e = new Engine();  // never destroyed: shutdown() joins the thread
    return *e;
  }

  /// Queue `fn` (blocking MPI calls on `comm`, a worker_comm) for the worker.
  std::shared_ptr<Pending> submit(MPI_Comm comm, std::function<void()> fn) {
    auto p = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> lk(m_);
      distkit::check<distkit::Error>(!stopped_, "mpiad's non-blocking engine was shut down (interpreter exit)");
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
      queue_.push_back(Task{comm, std::move(fn), p});
    }
    cv_.notify_one();
    return p;
  }

  /// Finish the queued operations and stop the worker (before MPI_Finalize).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopped_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }

  /// The worker's duplicate of `c` (collective on `c` the first time).
  static MPI_Comm worker_comm(MPI_Comm c) {
    static const int keyval = [] {
      int k = MPI_KEYVAL_INVALID;
      distkit::mpi::check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_dup, &k, nullptr),
                          "MPI_Comm_create_keyval");
      return k;
    }();
    void* value = nullptr;
    int found = 0;
    distkit::mpi::check(MPI_Comm_get_attr(c, keyval, &value, &found), "MPI_Comm_get_attr");
    if (found) return *static_cast<MPI_Comm*>(value);
    auto* dup = new MPI_Comm(MPI_COMM_NULL);
    distkit::mpi::check(MPI_Comm_dup(c, dup), "MPI_Comm_dup");
    distkit::mpi::check(MPI_Comm_set_attr(c, keyval, dup), "MPI_Comm_set_attr");
    return *dup;
  }

 private:
  static int free_dup(MPI_Comm, int, void* value, void*) {
    auto* dup = static_cast<MPI_Comm*>(value);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *dup != MPI_COMM_NULL) MPI_Comm_free(dup);
    delete dup;
    return MPI_SUCCESS;
  }

  struct Task {
    MPI_Comm comm;
    std::function<void()> fn;
    std::shared_ptr<Pending> pending;
  };

  /// Return once every rank of `comm` has called it; polls briefly, then sleeps
  /// between tests (20 us doubling to 1 ms) instead of spinning.
  static void arrive(MPI_Comm comm) {
    MPI_Request req = MPI_REQUEST_NULL;
    distkit::mpi::check(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
    int done = 0;
    for (int polls = 0;; ++polls) {
      distkit::mpi::check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (polls >= 64) {
        const int shift = std::min(polls - 64, 6);
        std::this_thread::sleep_for(std::chrono::microseconds(20 << shift));
      }
    }
  }

  void run() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [this] { return stopped_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopped and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr err;
      try {
        arrive(task.comm);
        task.fn();
      } catch (...) {
        err = std::current_exception();
      }
      task.pending->finish(err);
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::thread worker_;
  bool stopped_ = false;
};

}  // namespace mpiad
