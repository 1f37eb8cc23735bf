// An input's end: every scope, step, hand-over and handle closed or dropped, the caches destroyed,
// no leak in any backend, and the input's counts added to the totals.
#include "session.hpp"

namespace refpool::test::fuzz {

void session::cleanup() {
  in_cleanup = true;
  teardown_scenario();
  for (int t = 0; t < threads; ++t)
    while (!frames_[t].empty()) op_close(t);
  for (int c = 0; c < 2; ++c) {
    if (!open_steps_[c]) continue;
    open_steps_[c]->end();
    open_steps_[c].reset();
    m_.end_step(step_cache_[c]);
  }
  for (auto& [st, model_cache] : old_steps_) {
    st->end();
    m_.end_step(model_cache);
  }
  old_steps_.clear();
  while (!pointers_.empty()) free_kept(0, pointers_.size() - 1);
  for (int i = 0; i < handle_count; ++i) {
    pre_drop_verify(i);
    h_[i] = std::monostate{};
    drop_model(i);
  }
  check_all();
  for (int c = 0; c < 2; ++c) {
    cache_[c].reset();
    m_.close_cache(cur_[c]);
  }
  m_.expect_no_more_events("destroying the caches");
  shadow_->finish();
  if (!m_.blocks.empty()) fail(fmt::format("model: {} blocks left at the end", m_.blocks.size()));
  for (int b = 0; b < backends; ++b)
    if (be_[b].outstanding_bytes() != 0 || limited_[b]->used() != 0)
      fail(fmt::format("leak: backend {} has {} B outstanding at the end", b, be_[b].outstanding_bytes()));
  for (const model_cache& c : m_.caches) {
    for (const model_slot& s : c.slots) {
      all.hits += s.hits;
      all.misses += s.misses;
      all.steals += s.steals;
      all.escapes += s.escapes;
      all.unsafe_frees += s.unsafe_frees;
    }
    all.evictions += c.evictions;
    all.reclaimed += c.reclaimed;
    all.oom_retries += c.oom_retries;
  }
  const model_plan_totals& pt = m_.plan_totals;
  all.plan_runs += pt.runs;
  all.region_hits += pt.region_hits;
  all.conflicts += pt.conflicts;
  all.divergences += pt.divergences;
  all.recordings += pt.recordings;
  all.run_escapes += pt.escapes;
  all.busy_runs += pt.busy;
  all.pauses += pt.pauses;
  all.arenas += pt.arenas;
  all.arena_frees += pt.arena_frees;
  all.span_yields += pt.span_yields;
  all.span_moves += pt.span_moves;
  all.span_extensions += pt.span_extensions;
  all.span_remakes += pt.span_remakes;
  all.stale += pt.stale;
  all.plan_evictions += pt.evictions;
  all.pass_entries += pt.pass_entries;
  all.pass_runs += pt.pass_runs;
  all.learned_again += pt.learned_again;
  all.capacity_growths += pt.capacity_growths;
  all.passing_recordings += pt.passing_recordings;
  all.failed_probes += pt.failed_probes;
  all.pauses_lifted += pt.pauses_lifted;
  for (const model_cache& c : m_.caches) all.steps += c.steps;
  for (int b = 0; b < backends; ++b) {
    all.injected_faults += m_.be[b].injected;
    all.limit_failures += m_.be[b].limit_failures;
    if (failing_[b]->injected() != m_.be[b].injected)
      fail(fmt::format("backend {}: {} faults injected, the model counted {}", b, failing_[b]->injected(),
                       m_.be[b].injected));
  }
}

}  // namespace refpool::test::fuzz
