// `cache_stats`: counters of one cache (defined once, in refpool/stats_fields.h), and their table.
// For `fmt::format("{}", stats)`, include refpool/stats_format.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <refpool/detail/export.hpp>
#include <refpool/stats_fields.h>

namespace refpool {

/// A snapshot of one cache's counters (each described in refpool/stats_fields.h). Exact when no
/// other thread is using the cache; while threads run, each field is exact but fields may come
/// from slightly different moments.
struct cache_stats {
#define REFPOOL_STATS_FIELD(type, name, description) std::type name = 0;
  REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD

  /// hits / (hits + misses), 0 when there were no requests.
  [[nodiscard]] double hit_rate() const noexcept {
    const auto total = hits + misses;
    return total == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(total);
  }
};

/// One counter's name and meaning, in REFPOOL_CACHE_STATS order.
struct stat_field {
  std::string_view name;
  std::string_view description;
};
/// Number of counters.
[[nodiscard]] REFPOOL_API std::size_t stat_count() noexcept;
/// The counter at `index` (< stat_count()).
[[nodiscard]] REFPOOL_API stat_field stat_at(std::size_t index) noexcept;
/// The value of the counter at `index` (< stat_count()) in `stats`.
[[nodiscard]] REFPOOL_API std::uint64_t stat_value(const cache_stats& stats, std::size_t index) noexcept;

/// Every counter as a table, one figure a line under its field name: bytes in binary units
/// ("12.0 MiB"), a peak in the line of its figure (peak_live_bytes beside live_bytes), the hit
/// rate, and, when plans exist, arena bytes / planned peak live bytes. held_bytes and
/// peak_held_bytes are left out: held_bytes is live_bytes + idle_bytes. What REFPOOL_CONF's
/// stats_at_exit:full prints. For people: programs read the fields.
[[nodiscard]] REFPOOL_API std::string to_string(const cache_stats& stats);

/// A short table a person reads, like torch.cuda.memory_summary(): requests and hit rate;
/// allocated, reserved and idle bytes now and at their peaks; plans; backend calls; out-of-memory
/// failures; bytes in binary units. What alloc_cache::summary() and REFPOOL_CONF's
/// stats_at_exit:on print. Its layout may change between versions: programs read the fields.
[[nodiscard]] REFPOOL_API std::string summary(const cache_stats& stats);

}  // namespace refpool
