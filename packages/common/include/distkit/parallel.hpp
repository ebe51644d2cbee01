// distkit/parallel.hpp - a small persistent thread pool and parallel_for.
//
// The pool size comes from distkit::set_num_threads(), else the environment
// variable DISTKIT_NUM_THREADS, else OMP_NUM_THREADS, else the hardware
// concurrency. parallel_for runs inline when the range is smaller than `grain`
// or the pool has one thread, so small calls pay no synchronisation.
// Exceptions thrown by the body are re-thrown in the caller (the first one).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace distkit {

namespace detail {

inline int env_threads() {
  for (const char* name : {"DISTKIT_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char* v = std::getenv(name)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

class ThreadPool {
 public:
  explicit ThreadPool(int n) { resize(n); }
  ~ThreadPool() { stop(); }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    std::lock_guard<std::mutex> run(run_mutex_);
    stop();
    n = std::max(1, n);
    stopping_ = false;
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this, i] { loop(i + 1); });
  }

  /// Run task(part) for part in [0, parts) on the pool; the caller runs part 0.
  void run(int parts, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> run(run_mutex_);  // one parallel region at a time
    uint32_t gen;
    {
      std::lock_guard<std::mutex> lk(m_);
      task_ = &task;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      gen = ++generation_;
      claim_.store(static_cast<uint64_t>(gen) << 32 | 1);
    }
    cv_.notify_all();
    execute(0);
    drain(gen, parts);  // help with the remaining parts
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  /// Run parts of call `gen` (of `parts` parts) until none is left to claim.
  /// A part is claimed together with its call's generation, in one word: a
  /// worker still looping over a finished call must not take a part number of
  /// the next call and compare it with the next call's part count (that part
  /// then ran twice, the pending count went wrong, and run() returned while a
  /// part was running, or never returned).
  void drain(uint32_t gen, int parts) {
    uint64_t c = claim_.load();
    while ((c >> 32) == gen && static_cast<int>(c & 0xffffffffu) < parts) {
      if (claim_.compare_exchange_weak(c, c + 1)) {
        execute(static_cast<int>(c & 0xffffffffu));
        c = claim_.load();
      }
    }
  }

  void execute(int p) {
    try {
      (*task_)(p);
    } catch (...) {
      std::lock_guard<std::mutex> lk(m_);
      if (!error_) error_ = std::current_exception();
    }
    if (p != 0) {
      std::lock_guard<std::mutex> lk(m_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  void loop(int) {
    uint32_t seen = 0;
    for (;;) {
      int parts;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        parts = parts_;
      }
      drain(seen, parts);
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  std::atomic<uint64_t> claim_{0};  // the call's generation (high half) and its next part to claim
  int parts_ = 0;                    // (under m_)
  int pending_ = 0;
  uint32_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

inline ThreadPool& pool() {
  // Leaked on purpose: joining threads during static destruction at interpreter
  // exit can deadlock; the OS reclaims them.
  static ThreadPool* p = new ThreadPool(env_threads());
  return *p;
}

}  // namespace detail

/// Number of threads parallel_for uses.
inline int get_num_threads() { return detail::pool().size(); }

/// Set the number of threads parallel_for uses (>= 1).
inline void set_num_threads(int n) {
  if (n < 1) n = 1;
  if (n != detail::pool().size()) detail::pool().resize(n);
}

/// Call body(lo, hi) over disjoint sub-ranges covering [begin, end).
/// Ranges shorter than `grain` elements are not split further.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& body) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int threads = get_num_threads();
  int64_t parts = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (parts <= 1) {
    body(begin, end);
    return;
  }
  const int64_t chunk = (n + parts - 1) / parts;
  std::function<void(int)> task = [&](int p) {
    int64_t lo = begin + p * chunk;
    int64_t hi = std::min(end, lo + chunk);
    if (lo < hi) body(lo, hi);
  };
  detail::pool().run(static_cast<int>(parts), task);
}

}  // namespace distkit
