// The stats as text for people: a short summary (alloc_cache::summary, stats_at_exit:on) and the
// full table of every counter (to_string, stats_at_exit:full), bytes in binary units.
#include <refpool/stats.hpp>

#include <array>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

#include "byte_text.hpp"

namespace refpool {

namespace {

// Counters the full table leaves out: held_bytes is live_bytes + idle_bytes, both printed, and
// without segments, arenas or uncached blocks it equals reserved_bytes (one name per figure).
constexpr std::array<std::string_view, 2> not_printed{"held_bytes", "peak_held_bytes"};

bool is_bytes(std::string_view name) { return name.ends_with("_bytes"); }

bool printed(std::string_view name) {
  for (const std::string_view left_out : not_printed)
    if (name == left_out) return false;
  return true;
}

/// The index of the counter `name`, or stat_count().
std::size_t index_of(std::string_view name) {
  std::size_t i = 0;
  while (i < stat_count() && stat_at(i).name != name) ++i;
  return i;
}

/// A peak that has a figure of its own in the table ("peak_live_bytes" of "live_bytes") is printed
/// in that figure's row.
bool is_peak_of_a_figure(std::string_view name) {
  return name.starts_with("peak_") && index_of(name.substr(5)) < stat_count();
}

std::string value_text(std::string_view name, std::uint64_t value) {
  return is_bytes(name) ? detail::scaled_bytes(static_cast<std::size_t>(value)) : fmt::format("{}", value);
}

}  // namespace

std::string to_string(const cache_stats& s) {
  std::string out;
  auto row = [&](std::string_view name, std::string_view value, std::string_view peak = {}) {
    fmt::format_to(std::back_inserter(out), "{:<24}{:>16}", name, value);
    if (!peak.empty()) fmt::format_to(std::back_inserter(out), "   peak {:>10}", peak);
    out += '\n';
  };
  for (std::size_t i = 0; i < stat_count(); ++i) {
    const std::string_view name = stat_at(i).name;
    if (!printed(name) || is_peak_of_a_figure(name)) continue;
    const std::size_t peak = index_of(fmt::format("peak_{}", name));
    row(name, value_text(name, stat_value(s, i)),
        peak < stat_count() ? value_text(name, stat_value(s, peak)) : std::string{});
    if (name == "misses") row("hit_rate", fmt::format("{:.1f}%", 100.0 * s.hit_rate()));
  }
  if (s.planned_peak_live_bytes != 0)
    row("arena/planned_peak_live",
        fmt::format("{:.3f}", static_cast<double>(s.arena_bytes) / static_cast<double>(s.planned_peak_live_bytes)));
  return out;
}

std::string summary(const cache_stats& s) {
  using detail::scaled_bytes;
  std::string out;
  auto line = [&](std::string_view label, auto value, std::string_view rest) {
    fmt::format_to(std::back_inserter(out), "{:<14}{:>10}  {}\n", label, value, rest);
  };
  auto memory = [&](std::string_view label, std::size_t now, std::string_view peak, std::string_view meaning) {
    fmt::format_to(std::back_inserter(out), "  {:<12}{:>10} {:>10}  {}\n", label, scaled_bytes(now), peak, meaning);
  };
  line("requests", s.hits + s.misses,
       fmt::format("hits {} ({:.1f}%), misses {}", s.hits, 100.0 * s.hit_rate(), s.misses));
  fmt::format_to(std::back_inserter(out), "{:<14}{:>10} {:>10}\n", "memory", "now", "peak");
  memory("allocated", s.allocated_bytes, scaled_bytes(s.peak_allocated_bytes),
         "held by live buffers (cached blocks, plan regions, uncached)");
  memory("reserved", s.reserved_bytes, scaled_bytes(s.peak_reserved_bytes), "held from backends");
  memory("idle", s.idle_bytes, "", fmt::format("cached and ready for reuse, {} blocks", s.idle_blocks));
  line("plans", s.plans,
       fmt::format("hits {}, misses {}, recordings {}, arenas {}", s.plan_hits, s.plan_misses, s.plan_recordings,
                   scaled_bytes(s.arena_bytes)));
  line("backend calls", s.backend_allocations + s.uncached_allocations + s.backend_frees + s.segment_grows + s.segment_trims,
       fmt::format("allocations {}, frees {}, segment grows {}, segment trims {}, uncached {}", s.backend_allocations,
                   s.backend_frees, s.segment_grows, s.segment_trims, s.uncached_allocations));
  line("out of memory", s.ooms, fmt::format("failed requests; {} retried after reclaiming idle memory", s.oom_retries));
  return out;
}

}  // namespace refpool
