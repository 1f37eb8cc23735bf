// A planned run's end: pinned regions and escapes (the cursor settles them), the span idled or
// left held, and the recording handed to the store (run.hpp).
#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include "plan/run.hpp"

namespace refpool::detail {

// ---- the end ------------------------------------------------------------------------------

void plan_run::finish() noexcept {
  run_outcome out;
  std::vector<plan*> started_with;  // retained: `out` names them until the store has read it
  {
    std::optional<serving_section> serving;
    if (shared_) serving.emplace(serving_);
    if (mode_.now == mode::finished) return;
    out = finish_locked(started_with);
  }
  cursor_.leave_arena();  // its plans (started_with) keep it alive
  // The store makes plans of the recording (placement, up to the key's capacity of them at once) and
  // grows arenas with the serving lock free: a thread whose request came through this run late
  // is served by the plain cache at once, not after them (issue 35: 10-23 s under ASan).
  store_.end_run(this, key_, out);
  for (plan* p : started_with) p->release();
  // A thread may keep this router long after (cache_state::step_router): it keeps neither a
  // backend nor the cache (a late request's caller holds the cache; its step or scope does now).
  recorder_.release_backend();
  cache_.release();
}

// Everything of the end that later requests could see: O(n) in the run's requests.
run_outcome plan_run::finish_locked(std::vector<plan*>& started_with) noexcept {
  const mode was = mode_.now;
  mode_.now = mode::finished;
  const std::uint64_t end = cursor_.position();
  if (was == mode::replay) cursor_.stop();
  const bool complete = was == mode::replay && end == cursor_.current()->size();
  if (was == mode::replay && !complete) misses.store(misses.load(std::memory_order_relaxed) + 1);  // a shorter run
  const bool record =
      mode_.may_record && end != 0 && (was == mode::record || (was == mode::replay && (!complete || cursor_.stale())));
  std::vector<lifetime> region_lifetimes;
  bool recordable = record;
  try {
    if (record) region_lifetimes.assign(end, lifetime{0, 0});  // {0, 0}: not a region of this run
  } catch (...) {
    recordable = false;
  }
  const std::size_t region_escapes = cursor_.settle(end, recordable ? &region_lifetimes : nullptr);
  const std::size_t uncached_escapes = recorder_.finish();
  if (region_escapes + uncached_escapes != 0) cache_.add_escapes(region_escapes + uncached_escapes);
  run_outcome out;
  out.hits = hits.load(std::memory_order_relaxed);
  out.misses = misses.load(std::memory_order_relaxed);
  out.busy = mode_.busy;
  out.busy_other_key = mode_.busy_other_key;
  out.unrecorded = !mode_.may_record && !mode_.busy && was == mode::plain;
  out.used = complete ? cursor_.current() : nullptr;
  out.replayed_peak = cursor_.replayed_peak();
  out.requests = end;
  out.probed = was == mode::probe;
  // A probe, or a plain run (paused, busy, or diverged unrecorded): every size it asked for was
  // hashed. A paused run that ended short of its plan is hashed too, as the plan's requests so far
  // (a loop of sequences that are prefixes of one another: its runs end short of the one replayed).
  const bool short_unrecorded = was == mode::replay && !complete && !mode_.may_record;
  if (short_unrecorded) hash_replayed();
  const bool hashed = out.probed || was == mode::plain || short_unrecorded;
  if (hashed) out.fingerprint = recorder_.probe_fingerprint();
  if (complete) out.fingerprint = cursor_.current()->fingerprint();
  // A run asked for nothing: the empty sequence. One whose requests all failed saw no sequence of
  // the key (unknown: no repeat), so that an out-of-memory storm does not read as a loop.
  if (end == 0 && !out.probed) out.fingerprint = mode_.asked ? fingerprint::unknown : fingerprint().value();
  if (recordable) {
    try {
      out.made = make_recording(end, std::move(region_lifetimes));
      if (out.made != nullptr) out.fingerprint = fingerprint_of(out.made->requests);
    } catch (...) {
      // A plan is an optimisation: failing to make one (no host memory, a size that would wrap)
      // leaves the cache correct.
    }
  }
  // The key's plans it started with are needed no more (later requests go to the plain cache),
  // but stay retained until the store has read the outcome.
  started_with = std::move(candidates_);
  candidates_.clear();
  cursor_.forget_plans();
  return out;
}

recording* plan_run::make_recording(std::uint64_t end, std::vector<lifetime> region_lifetimes) const {
  std::vector<planned_request> sequence(end);
  std::vector<lifetime>& lifetimes = region_lifetimes;  // {0, 0} where not a region of this run
  std::vector<bool> known(end, false);
  cursor_.fill_recording(sequence, lifetimes, known);
  recorder_.fill_recording(end, sequence, lifetimes, known);
  for (std::uint64_t p = 0; p < end; ++p) {
    if (!known[p]) return nullptr;  // not served by this run (cannot happen: every request is one or the other)
    if (sequence[p].stream != sequence[0].stream || sequence[p].key.backend != sequence[0].key.backend) return nullptr;
    // A release read on another thread may lag: it is never before its own allocation.
    lifetimes[p].second = std::clamp<std::uint64_t>(lifetimes[p].second, p + 1, end + 1);
  }
  refpool::backend held = hold_backend(sequence);  // released if new throws
  return new recording{std::move(sequence), std::move(lifetimes), std::move(held)};
}

}  // namespace refpool::detail
