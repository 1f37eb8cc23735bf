// Counters by index (for bindings and the table), and the stats table.
#include <refpool/stats.hpp>

#include <array>
#include <iterator>

#include <fmt/format.h>

namespace refpool {

namespace {

constexpr std::array fields{
#define REFPOOL_STATS_FIELD(type, name, description) stat_field{#name, description},
    REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD
};

}  // namespace

std::size_t stat_count() noexcept { return fields.size(); }

stat_field stat_at(std::size_t index) noexcept { return fields[index]; }

std::uint64_t stat_value(const cache_stats& stats, std::size_t index) noexcept {
  std::size_t i = 0;
  std::uint64_t out = 0;
#define REFPOOL_STATS_FIELD(type, name, description) \
  if (i++ == index) out = static_cast<std::uint64_t>(stats.name);
  REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD
  return out;
}

std::string to_string(const cache_stats& s) {
  std::string out;
  auto row = [&](std::string_view name, auto value) {
    fmt::format_to(std::back_inserter(out), "{:<24}{:>16}\n", name, value);
  };
  for (std::size_t i = 0; i < fields.size(); ++i) {
    row(fields[i].name, stat_value(s, i));
    if (fields[i].name == "misses") row("hit_rate", fmt::format("{:.1f}%", 100.0 * s.hit_rate()));
  }
  if (s.planned_peak_live_bytes != 0)
    row("arena/planned_peak_live",
        fmt::format("{:.3f}", static_cast<double>(s.arena_bytes) / static_cast<double>(s.planned_peak_live_bytes)));
  return out;
}

}  // namespace refpool
