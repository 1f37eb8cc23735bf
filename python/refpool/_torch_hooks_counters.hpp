// PyTorch's per-allocation memory statistics of one device (torch.cuda.memory_stats() keys
// allocation.*, allocated_bytes.*, requested_bytes.*, each for all sizes, small_pool and
// large_pool, with current, peak, allocated and freed; and num_ooms), exact as PyTorch's caching
// allocator keeps them under its lock. Torch-free: compiled into refpool's PyTorch hooks
// (_torch_hooks_counters.cpp) and, on its own, into the host test (test/python/test_torch_host.py)
// and bench/torch_hook_counters.cpp.
//
// Why a mutex, on a path refpool otherwise keeps free of locks: a request changes 6 counters
// (its pool's and `all`'s, for three kinds) whose peaks must be exact. Lock-free, that is one
// atomic add per counter (peaks exact through the value each add returns), at least 4 adds even
// with the pools' counts and blocks packed into shared words; an uncontended mutex is 2 atomic
// operations (lock, unlock) whatever it guards. bench/torch_hook_counters.cpp measures this mutex
// against 9 relaxed atomic adds per request: the adds run fewer instructions (callgrind) but take
// longer, on one thread and on two (docs/frameworks.md, "Memory statistics"). The request path
// already holds PyTorch's own pluggable-allocator mutex around its pointer map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace refpool_torch {

/// One device's counters. Thread-safe: every member may be called from any thread.
class alignas(64) device_counters {  // a line of its own: devices' threads do not share lines
 public:
  // The layout readers get (refpool/_torch_stats.py, HOOK_KINDS...): [kind][class][field], then num_ooms.
  enum kind : int { allocation, allocated_bytes, requested_bytes };
  enum size_class : int { all_classes, small_pool, large_pool };
  enum field : int { current, peak, allocated, freed };
  static constexpr int kinds = 3, classes = 3, fields = 4;
  static constexpr int values = kinds * classes * fields + 1;

  static constexpr std::size_t small_size = std::size_t{1} << 20;  // PyTorch's kSmallSize: small pool up to it
  static constexpr std::size_t block_granule = 512;                // PyTorch's kMinBlockSize (allocated_bytes)

  /// A request of `size` bytes was served. Returns allocated_bytes.all.current after it.
  std::int64_t on_alloc(std::size_t size) noexcept { return change<true>(size); }
  /// A request of `size` bytes that on_alloc counted was freed. Returns allocated_bytes.all.current after it.
  std::int64_t on_free(std::size_t size) noexcept { return change<false>(size); }

  /// A request that could not be served (num_ooms). Returns allocated_bytes.all.current.
  std::int64_t on_oom() noexcept {
    std::lock_guard lock(mutex_);
    ++ooms_;
    return stats_[allocated_bytes][all_classes].value[current];
  }

  /// Writes up to `capacity` of the `values` numbers into `out`; returns how many it wrote.
  int read(std::int64_t* out, int capacity) noexcept {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const auto& by_class : stats_)
      for (const stat& s : by_class)
        for (const std::int64_t v : s.value)
          if (n < capacity) out[n++] = v;
    if (n < capacity) out[n++] = ooms_;
    return n;
  }

  /// torch.cuda.reset_peak_memory_stats: each peak restarts from its current value.
  void reset_peaks() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& by_class : stats_)
      for (stat& s : by_class) s.value[peak] = s.value[current];
  }

  /// torch.cuda.reset_accumulated_memory_stats: allocated, freed and num_ooms restart from 0.
  void reset_accumulated() noexcept {
    std::lock_guard lock(mutex_);
    for (auto& by_class : stats_)
      for (stat& s : by_class) s.value[allocated] = s.value[freed] = 0;
    ooms_ = 0;
  }

 private:
  struct stat {
    std::int64_t value[fields] = {};
  };

  template <bool alloc>
  static void apply(stat& s, std::int64_t amount) noexcept {
    if constexpr (alloc) {
      s.value[current] += amount;
      s.value[allocated] += amount;
      if (s.value[current] > s.value[peak]) s.value[peak] = s.value[current];
    } else {
      s.value[current] -= amount;
      s.value[freed] += amount;
    }
  }

  template <bool alloc>
  std::int64_t change(std::size_t size) noexcept {
    const int pool = size <= small_size ? small_pool : large_pool;
    const auto block = static_cast<std::int64_t>((size + block_granule - 1) / block_granule * block_granule);
    const auto requested = static_cast<std::int64_t>(size);
    std::lock_guard lock(mutex_);
    for (const int c : {int{all_classes}, pool}) {
      apply<alloc>(stats_[allocation][c], 1);
      apply<alloc>(stats_[allocated_bytes][c], block);
      apply<alloc>(stats_[requested_bytes][c], requested);
    }
    return stats_[allocated_bytes][all_classes].value[current];
  }

  std::mutex mutex_;  // guards everything below
  stat stats_[kinds][classes];
  std::int64_t ooms_ = 0;
};

}  // namespace refpool_torch
