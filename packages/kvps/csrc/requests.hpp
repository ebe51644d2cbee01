// requests.hpp - operations in flight, keyed by timestamp, and the engine's failure state.
//
// A worker's remote operation and every internal operation of the progress
// thread (replica fetches and refreshes, intent registrations) is a Request
// counting the keys still to be answered. Workers wait on it without the GIL.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "distkit/error.hpp"

namespace kvps {

struct Request {
  int64_t remaining = 0;
  bool done = false;
  bool internal = false;         // made by the progress thread; forgotten once done
  char* out = nullptr;           // user buffer (pull)
  std::vector<int64_t> out_off;  // byte offset per position (pull)
  int worker = -1;
};

class Requests {
 public:
  void init(int num_workers) { worker_ts_.resize(num_workers); }

  int64_t next_ts() { return next_ts_++; }

  /// A request a caller will wait for; `worker` >= 0 also lists it for that
  /// worker's waitall().
  void add(int64_t ts, std::shared_ptr<Request> req, int worker) {
    std::lock_guard<std::mutex> lk(mu_);
    reqs_[ts] = std::move(req);
    if (worker < 0) return;
    auto& v = worker_ts_[worker];
    v.push_back(ts);
    if (v.size() >= 4096 && (v.size() & 4095) == 0) {
      // forget timestamps already waited for (synchronous calls never reach waitall)
      v.erase(std::remove_if(v.begin(), v.end(), [&](int64_t t) { return reqs_.find(t) == reqs_.end(); }), v.end());
    }
  }

  /// A request of the progress thread expecting `remaining` answers; nobody
  /// waits for it, but wait_sync waits until no such request is pending.
  int64_t add_internal(int64_t remaining) {
    const int64_t ts = next_ts_++;
    auto req = std::make_shared<Request>();
    req->remaining = remaining;
    req->internal = true;
    std::lock_guard<std::mutex> lk(mu_);
    reqs_[ts] = std::move(req);
    ++internal_pending_;
    return ts;
  }

  std::shared_ptr<Request> find(int64_t ts) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = reqs_.find(ts);
    return it == reqs_.end() ? nullptr : it->second;
  }

  void complete(int64_t ts, int64_t count) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = reqs_.find(ts);
    if (it == reqs_.end()) return;
    auto& r = *it->second;
    r.remaining -= count;
    if (r.remaining <= 0 && !r.done) {
      r.done = true;
      if (r.internal) {
        reqs_.erase(it);
        --internal_pending_;
      }
      cv_.notify_all();
    }
  }

  int64_t internal_pending() {
    std::lock_guard<std::mutex> lk(mu_);
    return internal_pending_;
  }

  /// Block until `ts` is done (or the engine failed: then throw its error).
  /// `on_stall` runs once after a minute of waiting (a diagnostic dump).
  template <class OnStall>
  void wait(int64_t ts, int rank, OnStall&& on_stall) {
    if (ts < 0) return;
    std::unique_lock<std::mutex> lk(mu_);
    auto it = reqs_.find(ts);
    if (it == reqs_.end()) return;
    auto req = it->second;
    int waited = 0;
    while (!cv_.wait_for(lk, std::chrono::seconds(20), [&] { return req->done || failed_.load(); })) {
      if (++waited == 3) {
        std::fprintf(stderr, "kvps rank %d: wait(%lld) still pending after 60 s: remaining=%lld internal=%lld\n",
                     rank, static_cast<long long>(ts), static_cast<long long>(req->remaining),
                     static_cast<long long>(internal_pending_));
        lk.unlock();
        on_stall();
        lk.lock();
      }
    }
    reqs_.erase(ts);
    if (failed_ && !req->done) throw distkit::Error(error_);
  }

  std::vector<int64_t> take_worker_ts(int worker) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int64_t> ts;
    ts.swap(worker_ts_[worker]);
    return ts;
  }

  /// The engine cannot go on: every pending and later wait throws `msg`
  /// (the first failure wins).
  void fail(const std::string& msg) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failed_) {
      error_ = msg;
      failed_ = true;
    }
    cv_.notify_all();
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  /// Throw the failure, if any.
  void check_failed() {
    if (!failed()) return;
    std::lock_guard<std::mutex> lk(mu_);
    throw distkit::Error(error_);
  }

  template <class F>
  void for_each_pending(F&& f) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [ts, r] : reqs_)
      if (!r->done) f(ts, *r);
  }

 private:
  std::atomic<int64_t> next_ts_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int64_t, std::shared_ptr<Request>> reqs_;
  std::vector<std::vector<int64_t>> worker_ts_;
  int64_t internal_pending_ = 0;
  std::atomic<bool> failed_{false};
  std::string error_;
};

}  // namespace kvps
