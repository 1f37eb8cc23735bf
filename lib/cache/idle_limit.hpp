// The idle limit of a cache (cache_options::max_idle_bytes, alloc_cache::set_max_idle_bytes): the
// limit, and the idle bytes over all slots, counted only while a limit is set so that the hit path
// of an unlimited cache reads one flag (tracking()) and touches no shared counter. What goes over
// the limit is freed by the cache's reclaim (cache_reclaim.cpp, counted in evictions).
//
// Relaxed atomics: idle bytes change under the slot whose block went idle or left; the limit is
// set, and the count started from the exact sum, under the cache's mutex with every slot held.
#pragma once

#include <atomic>
#include <cstddef>

#include <refpool/cache_options.hpp>

namespace refpool::detail {

class idle_limit {
 public:
  explicit idle_limit(std::size_t max) noexcept : max_(max), tracking_(max != cache_options::unlimited) {}
  idle_limit(const idle_limit&) = delete;
  idle_limit& operator=(const idle_limit&) = delete;

  /// A limit is set: idle bytes are counted, and every release goes through the slow path.
  [[nodiscard]] bool tracking() const noexcept { return tracking_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t max() const noexcept { return max_.load(std::memory_order_relaxed); }
  /// Idle bytes over all slots (0 while no limit is set).
  [[nodiscard]] std::size_t total() const noexcept { return total_.load(std::memory_order_relaxed); }

  // Callers check tracking() first, and read the block's size only then: on the hit path the
  // check is all an unlimited cache pays (callgrind counts an extra load otherwise).
  /// A block of `bytes` went idle (tracking() was true); true when that put the idle bytes over
  /// the limit.
  bool went_idle(std::size_t bytes) noexcept {
    return total_.fetch_add(bytes, std::memory_order_relaxed) + bytes > max();
  }
  /// An idle block of `bytes` went live again or left the cache (tracking() was true).
  void left_idle(std::size_t bytes) noexcept { total_.fetch_sub(bytes, std::memory_order_relaxed); }
  /// A new limit (cache_options::unlimited: none), counting from `idle_now`, the exact idle bytes.
  void set(std::size_t max, std::size_t idle_now) noexcept {
    max_.store(max, std::memory_order_relaxed);
    tracking_.store(max != cache_options::unlimited, std::memory_order_relaxed);
    total_.store(idle_now, std::memory_order_relaxed);
  }
  /// The cache closed: nothing is idle any more.
  void clear() noexcept { total_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<std::size_t> max_;
  std::atomic<bool> tracking_;
  std::atomic<std::size_t> total_{0};
};

}  // namespace refpool::detail
