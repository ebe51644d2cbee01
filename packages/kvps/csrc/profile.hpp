// profile.hpp - KVPS_PROFILE=1: where the progress thread spends its time.
//
// Per message / command type handled: count, wall and CPU time, bytes; per
// message type sent: count and keys; the thread's total CPU time; and how long
// relocated keys took from the home's notice to their arrival. Printed to
// stderr when the engine stops.
#pragma once

#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

namespace kvps {

class Profiler {
 public:
  bool on() const { return on_; }

  void start_thread() {
    if (on_) cpu0_ = cpu_now();
  }
  void stop_thread() {
    if (on_) total_ = cpu_now() - cpu0_;
  }

  /// Call before handling one message or command; record() after it.
  std::chrono::steady_clock::time_point begin() {
    if (!on_) return {};
    cpu_ = cpu_now();
    return std::chrono::steady_clock::now();
  }
  void record(int32_t type, std::chrono::steady_clock::time_point t0, int64_t bytes) {
    if (!on_) return;
    auto& e = tab_[type];
    e[0] += 1;
    e[1] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6;
    e[2] += static_cast<double>(bytes);
    e[3] += cpu_now() - cpu_;
  }

  /// One message sent (its type and key count).
  void sent(int32_t type, int64_t keys) {
    if (!on_) return;
    auto& e = sent_[type];
    e[0] += 1;
    e[1] += static_cast<double>(keys);
  }

  /// A relocated key was announced (notice) / arrived (handover).
  void noticed(int64_t k, int64_t num_keys) {
    if (!on_) return;
    if (noticed_at_.empty()) noticed_at_.assign(num_keys, 0.0);
    noticed_at_[k] = now_s();
  }
  void arrived(int64_t k) {
    if (!on_ || noticed_at_.empty() || noticed_at_[k] <= 0) return;
    lat_.push_back(now_s() - noticed_at_[k]);
    noticed_at_[k] = 0;
  }

  void print(int rank) {
    if (!on_) return;
    for (auto& [t, e] : tab_)
      std::fprintf(stderr, "kvps prof rank %d type %d: n=%.0f us=%.0f cpu_us=%.0f bytes=%.0f\n", rank, t, e[0], e[1],
                   e[3], e[2]);
    for (auto& [t, e] : sent_)
      std::fprintf(stderr, "kvps prof rank %d sent type %d: n=%.0f keys=%.0f\n", rank, t, e[0], e[1]);
    std::fprintf(stderr, "kvps prof rank %d: progress thread cpu total %.0f us\n", rank, total_);
    tab_.clear();
    sent_.clear();
    if (!lat_.empty()) {
      std::sort(lat_.begin(), lat_.end());
      auto q = [&](double f) { return lat_[static_cast<size_t>(f * (lat_.size() - 1))] * 1e3; };
      std::fprintf(stderr,
                   "kvps prof rank %d: %zu relocations notice->handover ms p50 %.2f p90 %.2f p99 %.2f max %.2f\n", rank,
                   lat_.size(), q(0.5), q(0.9), q(0.99), q(1.0));
      lat_.clear();
    }
  }

 private:
  static double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
  }
  static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  bool on_ = std::getenv("KVPS_PROFILE") != nullptr;
  std::map<int32_t, std::array<double, 4>> tab_;   // handled, per type: count, wall us, bytes, cpu us
  std::map<int32_t, std::array<double, 2>> sent_;  // sent, per type: messages, keys
  double cpu_ = 0, cpu0_ = 0, total_ = 0;
  std::vector<double> noticed_at_, lat_;
};

}  // namespace kvps
