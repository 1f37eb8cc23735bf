// PyTorch's per-allocation memory statistics of one device (torch.cuda.memory_stats() keys
// allocation.*, allocated_bytes.*, requested_bytes.*, active.*, active_bytes.*, each for all sizes,
// small_pool and large_pool, with current, peak, allocated and freed; and num_ooms), exact as
// PyTorch's caching allocator keeps them under its lock. A block whose free Tensor.record_stream
// defers (_torch_hooks_deferred.cpp) is no longer allocated but still active until it goes back to
// refpool, as in PyTorch. Torch-free: compiled into refpool's PyTorch hooks
// (_torch_hooks_counters.cpp) and, on its own, into the host test (test/python/test_torch_host.py)
// and bench/torch_hook_counters.cpp.
//
// Why a mutex, on a path refpool otherwise keeps free of locks: a request changes 10 counters
// (its pool's and `all`'s, for five kinds) whose peaks must be exact. Lock-free, that is one
// atomic add per counter (peaks exact through the value each add returns); an uncontended mutex
// is 2 atomic operations (lock, unlock) whatever it guards. bench/torch_hook_counters.cpp measures
// this mutex against 15 relaxed atomic adds per request: the adds take longer, on one thread and on
// two (docs/frameworks.md, "Memory statistics"). The request path already holds PyTorch's own
// pluggable-allocator mutex around its pointer map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace refpool_torch {

/// One device's counters. Thread-safe: every member may be called from any thread.
class alignas(64) device_counters {  // a line of its own: devices' threads do not share lines
 public:
  // The layout readers get (refpool/_torch_stats.py, HOOK_KINDS...): [kind][class][field], then num_ooms.
  enum kind : int { allocation, allocated_bytes, requested_bytes, active, active_bytes };
  enum size_class : int { all_classes, small_pool, large_pool };
  enum field : int { current, peak, allocated, freed };
  static constexpr int kinds = 5, classes = 3, fields = 4;
  static constexpr int values = kinds * classes * fields + 1;

  static constexpr std::size_t small_size = std::size_t{1} << 20;  // PyTorch's kSmallSize: small pool up to it
  static constexpr std::size_t block_granule = 512;  // PyTorch's kMinBlockSize (allocated_bytes, active_bytes)

  /// A request of `size` bytes was served: allocated and active. Returns allocated_bytes.all.current after it.
  std::int64_t on_alloc(std::size_t size) noexcept { return change<true>(size, all_kinds); }
  /// A request of `size` bytes that on_alloc counted was freed: no longer allocated, and no longer active
  /// unless `still_active` (its free deferred until its recorded streams are done: on_inactive follows).
  /// Returns allocated_bytes.all.current after it.
  std::int64_t on_free(std::size_t size, bool still_active = false) noexcept {
    return change<false>(size, still_active ? allocated_kinds : all_kinds);
  }
  /// A block whose free on_free left active went back to refpool: no longer active.
  void on_inactive(std::size_t size) noexcept { (void)change<false>(size, active_kinds); }

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

  // Which kinds a change counts: a request's lifetime (allocation, allocated and requested bytes), its
  // block's (active), or both.
  enum kinds_changed { allocated_kinds, active_kinds, all_kinds };

  template <bool alloc>
  std::int64_t change(std::size_t size, kinds_changed changed) noexcept {
    const int pool = size <= small_size ? small_pool : large_pool;
    const auto block = static_cast<std::int64_t>((size + block_granule - 1) / block_granule * block_granule);
    const auto requested = static_cast<std::int64_t>(size);
    std::lock_guard lock(mutex_);
    for (const int c : {int{all_classes}, pool}) {
      if (changed != active_kinds) {
        apply<alloc>(stats_[allocation][c], 1);
        apply<alloc>(stats_[allocated_bytes][c], block);
        apply<alloc>(stats_[requested_bytes][c], requested);
      }
      if (changed != allocated_kinds) {
        apply<alloc>(stats_[active][c], 1);
        apply<alloc>(stats_[active_bytes][c], block);
      }
    }
    return stats_[allocated_bytes][all_classes].value[current];
  }

  std::mutex mutex_;  // guards everything below
  stat stats_[kinds][classes];
  std::int64_t ooms_ = 0;
};

}  // namespace refpool_torch
