// The plan store's counters (cache_stats) and their peaks.
#include <algorithm>

#include "plan/run.hpp"
#include "plan/store.hpp"

namespace refpool::detail {

void plan_store::add_counters(cache_stats& out) const {
  std::lock_guard guard(mutex_);
  out.plan_hits = hits_;
  out.plan_misses = misses_;
  for (const plan_run* r : active_) {
    out.plan_hits += r->hits.load(std::memory_order_relaxed);
    out.plan_misses += r->misses.load(std::memory_order_relaxed);
  }
  out.plan_recordings = recordings_;
  for (const auto& k : keys_) {
    std::size_t peak = 0;
    for (const plan* p : k->plans) peak = std::max(peak, p->peak_live_bytes());
    out.plans += k->plans.size();
    out.planned_peak_live_bytes += peak;
    out.peak_plan_live_bytes += k->peak_plan_live;
  }
  out.plan_live_bytes = arenas_.live_region_bytes();  // and regions of plans dropped or moved
  out.plan_evictions = evictions_;
  out.plan_pauses = pauses_;
  out.plan_unrecorded_runs = unrecorded_runs_;
  out.plan_busy_runs = busy_runs_;
  out.arena_growths = arenas_.growths.load(std::memory_order_relaxed);
  out.arena_replacements = replacements_ + arenas_.span_replacements.load(std::memory_order_relaxed);
  out.plan_pass_runs = pass_runs_;
  out.plan_probe_runs = probe_runs_;
  out.plan_pass_entries = pass_entries_;
}

void plan_store::reset_peaks() noexcept {
  std::lock_guard guard(mutex_);
  for (const auto& k : keys_) {
    k->peak_plan_live = 0;
    for (const plan* p : k->plans) k->peak_plan_live += p->live_region_bytes();
  }
}

}  // namespace refpool::detail
