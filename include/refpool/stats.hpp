// `cache_stats`: counters of one cache, and an fmt formatter that prints them as a table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace refpool {

/// A snapshot of one cache's counters. Exact when no other thread is using the cache; while
/// threads run, each field is exact but fields may come from slightly different moments.
struct cache_stats {
  std::uint64_t hits = 0;                 ///< requests served by an idle block
  std::uint64_t misses = 0;               ///< requests that needed a backend allocation
  std::uint64_t steals = 0;               ///< hits taken from another scope's idle blocks (part of hits)
  std::uint64_t backend_allocations = 0;  ///< successful backend allocations by this cache
  std::uint64_t backend_frees = 0;        ///< blocks this cache gave back to a backend
  std::uint64_t unsafe_frees = 0;         ///< buffers that came back through unsafe_free()
  std::uint64_t escapes = 0;              ///< buffers still referenced when their scope ended
  std::uint64_t evictions = 0;            ///< idle blocks freed to stay under max_idle_bytes
  std::uint64_t reclaimed_blocks = 0;     ///< idle blocks freed by reclaim() or on out-of-memory
  std::uint64_t oom_retries = 0;          ///< backend out-of-memory answered by reclaim + retry
  std::uint64_t cross_stream_reuses = 0;  ///< hits on a block last used on another stream
  std::uint64_t scope_entries = 0;        ///< scopes entered on this cache (outermost per thread)
  std::uint64_t uncached_entries = 0;     ///< of those, entries that ran uncached (warm-up)
  std::size_t live_blocks = 0;            ///< blocks held by handles
  std::size_t idle_blocks = 0;            ///< blocks ready for reuse
  std::size_t live_bytes = 0;             ///< block bytes held by handles
  std::size_t idle_bytes = 0;             ///< block bytes ready for reuse
  std::size_t held_bytes = 0;             ///< live + idle: bytes this cache holds from backends
  std::size_t peak_held_bytes = 0;        ///< highest held_bytes so far (plan arenas not included)
  std::uint64_t plan_hits = 0;            ///< planned-scope requests served by a plan's region
  std::uint64_t plan_misses = 0;          ///< divergences, shorter runs and live-region conflicts
  std::uint64_t plan_recordings = 0;      ///< plans made (first runs, diverged or stale runs)
  std::size_t plans = 0;                  ///< plans kept now
  std::size_t arena_bytes = 0;            ///< bytes of their arenas
  std::size_t planned_peak_live_bytes = 0;  ///< peak live bytes of the runs they were made from

  /// hits / (hits + misses), 0 when there were no requests.
  [[nodiscard]] double hit_rate() const noexcept {
    const auto total = hits + misses;
    return total == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(total);
  }
};

/// The stats as a small two-column table, one counter a line.
[[nodiscard]] std::string to_string(const cache_stats& stats);

}  // namespace refpool

/// `fmt::format("{}", stats)` prints the table of `refpool::to_string`.
template <>
struct fmt::formatter<refpool::cache_stats> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(const refpool::cache_stats& stats, FormatContext& ctx) const {
    const std::string text = refpool::to_string(stats);
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};
