// A cache's own counters: the events of its slow paths and the bytes it holds, with their peaks
// (docs/design.md, "Block sources"). What slots count (hits, misses, live bytes...) stays in each
// slot (slot_counters), what block sources count stays in the source (uncached blocks included), and what is held from
// backends overall in the reserved_counter; these are the rest. Relaxed atomics: any thread may
// count, stats() reads them without a lock. Nothing here is touched by a hit or a release.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include <refpool/stats.hpp>

#include "cache/reserved_counter.hpp"

namespace refpool::detail {

struct cache_counters {
  std::atomic<std::uint64_t> evictions{0};  ///< idle blocks freed by the idle limit
  std::atomic<std::uint64_t> reclaimed{0};  ///< idle blocks freed by reclaim and out-of-memory retries
  std::atomic<std::uint64_t> oom_retries{0};
  std::atomic<std::uint64_t> ooms{0};
  std::atomic<std::uint64_t> scope_entries{0};
  std::atomic<std::uint64_t> uncached_entries{0};
  std::atomic<std::uint64_t> steps{0};
  std::atomic<std::uint64_t> extra_escapes{0};       ///< escapes a planned run saw
  std::atomic<std::uint64_t> extra_unsafe_frees{0};  ///< unsafe frees of regions and uncached blocks
  std::atomic<std::size_t> held_bytes{0};            ///< bytes of the cache's blocks, live and idle
  std::atomic<std::size_t> peak_held_bytes{0};

  /// A block joined the cache (held_bytes and its peak), or left it.
  void count_held(std::size_t bytes) noexcept {
    raise_max(peak_held_bytes, held_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  }
  void count_left(std::size_t bytes) noexcept { held_bytes.fetch_sub(bytes, std::memory_order_relaxed); }

  /// Adds these counters to `out` (its fields that only they fill are set).
  void add_to(cache_stats& out) const noexcept {
    out.unsafe_frees += extra_unsafe_frees.load();
    out.escapes += extra_escapes.load();
    out.evictions = evictions.load();
    out.reclaimed_blocks = reclaimed.load();
    out.oom_retries = oom_retries.load();
    out.ooms = ooms.load();
    out.scope_entries = scope_entries.load();
    out.uncached_entries = uncached_entries.load();
    out.steps = steps.load();
    out.held_bytes = held_bytes.load();
    out.peak_held_bytes = peak_held_bytes.load();
  }
  /// Peaks start again from now.
  void reset_peaks() noexcept { peak_held_bytes.store(held_bytes.load()); }
};

}  // namespace refpool::detail
