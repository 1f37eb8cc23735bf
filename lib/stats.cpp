// The stats table.
#include <refpool/stats.hpp>

#include <fmt/format.h>

namespace refpool {

std::string to_string(const cache_stats& s) {
  std::string out;
  auto row = [&](std::string_view name, auto value) { fmt::format_to(std::back_inserter(out), "{:<22}{:>16}\n", name, value); };
  row("hits", s.hits);
  row("misses", s.misses);
  row("hit rate", fmt::format("{:.1f}%", 100.0 * s.hit_rate()));
  row("steals", s.steals);
  row("cross-stream reuses", s.cross_stream_reuses);
  row("backend allocations", s.backend_allocations);
  row("backend frees", s.backend_frees);
  row("unsafe frees", s.unsafe_frees);
  row("escapes", s.escapes);
  row("evictions", s.evictions);
  row("reclaimed blocks", s.reclaimed_blocks);
  row("oom retries", s.oom_retries);
  row("scope entries", s.scope_entries);
  row("uncached entries", s.uncached_entries);
  row("live blocks", s.live_blocks);
  row("idle blocks", s.idle_blocks);
  row("live bytes", s.live_bytes);
  row("idle bytes", s.idle_bytes);
  row("held bytes", s.held_bytes);
  row("peak held bytes", s.peak_held_bytes);
  if (s.plans + s.plan_hits + s.plan_misses + s.plan_recordings != 0) {
    row("plan hits", s.plan_hits);
    row("plan misses", s.plan_misses);
    row("plan recordings", s.plan_recordings);
    row("plans", s.plans);
    row("arena bytes", s.arena_bytes);
    row("planned peak live", s.planned_peak_live_bytes);
    if (s.planned_peak_live_bytes != 0)
      row("arena / peak live", fmt::format("{:.3f}", static_cast<double>(s.arena_bytes) / s.planned_peak_live_bytes));
  }
  return out;
}

}  // namespace refpool
