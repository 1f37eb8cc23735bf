// A planned run's end: pinned regions, escapes, the span idled or left held, and the recording
// handed to the store (run.hpp).
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
    if (mode_ == mode::finished) return;
    out = finish_locked(started_with);
  }
  leave_arena();  // its plans (started_with) keep it alive
  // The store makes plans of the recording (placement, up to plans_per_key of them at once) and
  // grows arenas with the serving lock free: a thread whose request came through this run late
  // is served by the plain cache at once, not after them (issue 35: 10-23 s under ASan).
  store_.end_run(this, key_, out);
  for (plan* p : started_with) p->release();
  // A thread may keep this router long after (cache_state::step_router): it keeps neither a
  // backend nor the cache (a late request's caller holds the cache; its step or scope does now).
  if (first_backend_ != nullptr) std::exchange(first_backend_, nullptr)->release();
  cache_.release();
}

// Everything of the end that later requests could see: O(n) in the run's requests.
run_outcome plan_run::finish_locked(std::vector<plan*>& started_with) noexcept {
  const mode was = mode_;
  mode_ = mode::finished;
  const std::uint64_t end = position_.load(std::memory_order_relaxed);
  if (was == mode::replay) replayed_to_ = end;
  const bool complete = was == mode::replay && end == current_->size();
  if (was == mode::replay && !complete) misses.store(misses.load(std::memory_order_relaxed) + 1);  // a shorter run
  const bool record =
      may_record_ && end != 0 && (was == mode::record || (was == mode::replay && (!complete || stale_)));
  std::vector<lifetime> region_lifetimes;
  bool recordable = record;
  try {
    if (record) region_lifetimes.assign(end, lifetime{0, 0});  // {0, 0}: not a region of this run
  } catch (...) {
    recordable = false;
  }
  const std::size_t region_escapes = settle_regions(end, recordable ? &region_lifetimes : nullptr);
  std::size_t replayed_peak = 0;  // counted whole when any region was handed out: an upper bound
  for (const segment& s : segments_)
    if (s.to > s.from) replayed_peak = std::max(replayed_peak, s.owner->peak_live_bytes());
  std::size_t uncached_escapes = 0;
  {
    std::lock_guard guard(lock_);
    finished_ = true;  // lifetimes are final: later releases only mark their block released
    uncached_escapes = uncached_live_;
  }
  if (region_escapes + uncached_escapes != 0) cache_.add_escapes(region_escapes + uncached_escapes);
  run_outcome out;
  out.hits = hits.load(std::memory_order_relaxed);
  out.misses = misses.load(std::memory_order_relaxed);
  out.busy = busy_;
  out.busy_other_key = busy_other_key_;
  out.unrecorded = !may_record_ && !busy_ && was == mode::plain;
  out.used = complete ? current_ : nullptr;
  out.replayed_peak = replayed_peak;
  out.probed = was == mode::probe;
  if (out.probed) out.fingerprint = probed_.value();
  if (complete) out.fingerprint = current_->fingerprint();
  // A run asked for nothing: the empty sequence. One whose requests all failed saw no sequence of
  // the key (unknown: no repeat), so that an out-of-memory storm does not read as a loop.
  if (end == 0 && !out.probed) out.fingerprint = asked_ ? fingerprint::unknown : fingerprint().value();
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
  current_ = nullptr;
  segments_.clear();
  return out;
}

// Pins this run's regions that are still live (their plan stays alive and the next run of the
// arena avoids their bytes) and drops the foreign regions; leave_arena gives the arena back.
// Returns the number pinned: escapes.
std::size_t plan_run::settle_regions(std::uint64_t end, std::vector<lifetime>* lifetimes) noexcept {
  if (arena_ == nullptr) return 0;
  segments_.push_back({current_, segment_from_, std::min(end, replayed_to_)});
  std::vector<pinned_region> pins;
  const std::uint64_t held = region_state::live_in(generation_);
  for (const segment& s : segments_) {
    for (std::uint64_t p = s.from; p < s.to; ++p) {
      region_state& st = s.owner->state(p);
      std::uint64_t seen = st.state.load(std::memory_order_acquire);
      if (region_state::generation_of(seen) != generation_) continue;  // never handed out by this run
      if (seen == held) {
        s.owner->retain();  // the region's: it keeps its plan alive until released
        if (st.state.compare_exchange_strong(seen, held | region_state::holds_plan, std::memory_order_acq_rel)) {
          pins.push_back({s.owner, static_cast<std::uint32_t>(p), held | region_state::holds_plan});
          if (lifetimes != nullptr) (*lifetimes)[p] = {p, end + 1};  // escaped: alive to the end
          continue;
        }
        s.owner->release();  // released meanwhile
      }
      // Released, and the arena is still ours: its release position is this run's.
      if (lifetimes != nullptr) (*lifetimes)[p] = {p, st.released_at.load(std::memory_order_relaxed)};
    }
  }
  for (const foreign_region& f : foreign_) f.owner->release();
  foreign_.clear();
  {
    std::lock_guard guard(arena_->pinned_mutex);
    arena_->drop_released_pins_locked();
    arena_->pinned.insert(arena_->pinned.end(), pins.begin(), pins.end());
    idle_at_end_ = arena_->pinned.empty();
  }
  return pins.size();
}

void plan_run::leave_arena() noexcept {
  if (arena_ == nullptr) return;
  // No region live: the heap may yield its bytes until the next claim. Pinned: it stays held, and
  // a later run's end idles it once its regions went. After the serving section (idling takes the
  // cache's and the heap's locks, which a request waiting to be served need not wait for), and
  // before the claim goes (an idle span must not be one another run holds again already).
  if (idle_at_end_) arena_->idle();
  arena_->unclaim();
}

// The run's sequence and lifetimes, for a plan: replayed positions from the plans' region states,
// the others from what observe_release wrote. Null when the run cannot be planned (several
// streams or backends).
recording* plan_run::make_recording(std::uint64_t end, std::vector<lifetime> region_lifetimes) const {
  std::vector<planned_request> sequence(end);
  std::vector<lifetime>& lifetimes = region_lifetimes;  // {0, 0} where not a region of this run
  std::vector<bool> known(end, false);
  for (const segment& s : segments_) {
    for (std::uint64_t p = s.from; p < s.to; ++p) {
      if (lifetimes[p].second == 0) continue;
      sequence[p] = s.owner->request(p);
      known[p] = true;
    }
  }
  {
    std::lock_guard guard(lock_);
    for (const tracked& t : tracked_) {
      if (t.position >= end) continue;
      sequence[t.position] = t.request;
      lifetimes[t.position] = {t.position, t.live ? end + 1 : t.released_at};
      known[t.position] = true;
    }
  }
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
