// Counters by index (for bindings and the printed stats, stats_text.cpp).
#include <refpool/stats.hpp>

#include <array>

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

}  // namespace refpool
