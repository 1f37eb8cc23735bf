// A cache's stats: every slot's counters, summed with the cache-wide ones, under the cache's mutex.
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

// ---- stats --------------------------------------------------------------------------------

cache_stats cache_state::stats() const {
  auto& self = const_cast<cache_state&>(*this);  // holding slots drains their hand-off lists
  cache_stats out;
  {
    std::lock_guard guard(mutex_);
    self.intrude_all();
    for (const auto& s : slots_.all) {
      self.catch_up_with_steps(*s);  // escapes of ended steps
      const slot_counters& c = s->counters;
      out.hits += c.hits;
      out.misses += c.misses;
      out.steals += c.steals;
      out.unsafe_frees += c.unsafe_frees;
      out.escapes += c.escapes;
      out.cross_stream_reuses += c.cross_stream_reuses;
      out.live_bytes += c.live_bytes;
      out.peak_live_bytes += c.peak_live_bytes;
      s->buckets.for_each([&](const bucket& bk) {
        out.live_blocks += bk.live;
        out.idle_blocks += bk.idle.size();
        out.idle_bytes += bk.idle.size() * bk.key.bytes;
      });
    }
    self.leave_all();
  }
  counters_.add_to(out);
  {
    std::unique_lock guard(mutex_);
    for (const block_source* source : sources()) source->add_counters(out);
    if (extension_) extension_->add_counters(out);
  }
  const std::size_t uncached_peak = whole_blocks_.uncached_peak();
  out.allocated_bytes = out.live_bytes + out.plan_live_bytes + out.uncached_live_bytes;
  out.reserved_bytes = out.held_bytes + out.segment_free_bytes + out.arena_bytes + out.uncached_live_bytes;
  // Exact: every kind of held memory is counted in one place as it changes (reserved_counter).
  out.peak_reserved_bytes = std::max(reserved_->peak(), out.reserved_bytes);
  // The parts' peaks came at different times, so their sum can exceed every reserved byte (a plain
  // peak given back before an arena took the same memory). Allocated bytes are always reserved, so
  // the reserved peak bounds the allocated one too.
  out.peak_allocated_bytes = std::min(
      std::max(out.peak_live_bytes + out.peak_plan_live_bytes + uncached_peak, out.allocated_bytes),
      out.peak_reserved_bytes);
  out.reserved_allocated_bytes = reserved_->added();
  out.reserved_freed_bytes = reserved_->removed();
  return out;
}

void cache_state::reset_peaks() noexcept {
  std::lock_guard guard(mutex_);
  intrude_all();
  for (const auto& s : slots_.all) s->counters.peak_live_bytes = s->counters.live_bytes;
  leave_all();
  counters_.reset_peaks();
  whole_blocks_.reset_peaks();
  reserved_->reset_peak();
  if (extension_) extension_->reset_peaks();
}

}  // namespace refpool::detail
