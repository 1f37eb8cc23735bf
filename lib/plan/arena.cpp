// Arenas: spans of the segment heap taken by one run at a time, the regions they pin, and the
// streams released regions leave to wait for.
#include "plan/arena.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include <refpool/error.hpp>
#include <refpool/resource.hpp>

#include "cache/segment_source.hpp"
#include "plan/plan.hpp"

namespace refpool::detail {

arena::arena(arena_source& source, backend_state& backend, stream_ref stream) : source_(source) {
  memory_.backend = &backend;
  memory_.stream = stream;
  backend.retain();
}

arena::~arena() {
  if (memory_.span != nullptr) source_.spans().give_back_span(*memory_.backend, memory_.span, streams_in_use());
  memory_.backend->release();
}

void arena::free_memory() noexcept {
  retire();
  std::lock_guard guard(memory_mutex_);
  if (memory_.span == nullptr) return;
  source_.spans().give_back_span(*memory_.backend, std::exchange(memory_.span, nullptr), streams_in_use());
}

growth_in_place arena::grow_in_place(std::size_t bytes, const void* claimant) noexcept {
  if (bytes <= capacity()) return growth_in_place::fits;
  if (!claim(claimant, nullptr)) {
    // A run holds it: that run's end idles it or pins regions; the next claim extends it.
    raise_needed(bytes);
    return growth_in_place::grown;
  }
  growth_in_place out = growth_in_place::grown;
  if (unpinned()) {
    raise_needed(bytes);  // its next claim extends it, or moves it whole (nothing is live in it)
  } else {
    // A live region pins it where it is: extend it now, or the store replaces the arena (its
    // plans copied into a new one; this one goes with its last pinned region).
    std::lock_guard guard(memory_mutex_);
    bool extended = false;
    try {
      extended = memory_.span != nullptr && memory_.span->bytes >= bytes;
      if (!extended && memory_.span != nullptr)
        extended = source_.spans().extend_span(*memory_.backend, *memory_.span, bytes, memory_.stream);
      if (extended) source_.growths.fetch_add(1, std::memory_order_relaxed);
    } catch (...) {
      extended = false;  // the backend failed: replaced as when no room is after it
    }
    if (extended) raise_needed(bytes);
    out = extended ? growth_in_place::grown : growth_in_place::cannot;
  }
  unclaim();
  return out;
}

void arena::raise_needed(std::size_t bytes) noexcept {
  std::size_t now = memory_.needed.load(std::memory_order_relaxed);
  while (now < bytes && !memory_.needed.compare_exchange_weak(now, bytes, std::memory_order_relaxed)) {}
}

bool arena::take() {
  std::lock_guard guard(memory_mutex_);
  segment_source& spans = source_.spans();
  backend_state& backend = *memory_.backend;
  const std::size_t needed = memory_.needed.load(std::memory_order_relaxed);
  // Its first placement, or the first claim after a plan joined: the plain path's idle memory goes
  // first (the recording runs' escapes are released by then, and runs served plainly since may have
  // grown it), so that the two are not held at once when the span must move or grow. Once a join,
  // so a steady state of replays beside plain runs never trims here.
  const bool joined = reclaim_before_take_.exchange(false, std::memory_order_relaxed);
  if (memory_.span == nullptr || joined) source_.reclaim_idle(backend);
  if (memory_.span == nullptr) return place_new_span(needed);
  const std::optional<bool> moved = spans.hold_span(backend, *memory_.span, memory_.stream);
  if (!moved) return false;
  span_held_ = true;
  if (memory_.span->bytes < needed) {
    if (spans.extend_span(backend, *memory_.span, needed, memory_.stream)) {
      source_.growths.fetch_add(1, std::memory_order_relaxed);  // counted when the heap gave the bytes
    } else {
      // No room after it: a new span, when no region of the old one is live (else it stays held
      // and this run goes to the plain cache; the store replaces a pinned arena when it grows it).
      if (!unpinned()) return false;
      spans.give_back_span(backend, std::exchange(memory_.span, nullptr), streams_in_use());
      source_.span_replacements.fetch_add(1, std::memory_order_relaxed);
      return place_new_span(needed);
    }
  }
  if (*moved) rebase_locked();
  return true;
}

bool arena::place_new_span(std::size_t bytes) {
  const std::optional<segment_span*> made = source_.spans().carve_span(*memory_.backend, bytes, memory_.stream);
  if (!made) return false;
  memory_.span = *made;
  span_held_ = true;
  rebase_locked();
  return true;
}

void arena::idle() noexcept {
  std::lock_guard guard(memory_mutex_);
  if (memory_.span == nullptr || !span_held_) return;
  source_.spans().idle_span(*memory_.backend, *memory_.span, streams_in_use());
  span_held_ = false;
}

void arena::idle_if_unpinned() noexcept {
  // Wanted first, claimed after (and the claimant gives its claim up first, looks after: both
  // seq_cst): either this claim succeeds or the claimant's unclaim sees the wish, so a release
  // racing a claimant (a run that ended pinned, another release, the store) is never lost.
  idle_wanted_.store(true, std::memory_order_seq_cst);
  while (idle_wanted_.load(std::memory_order_seq_cst)) {
    if (!claim(this, nullptr)) return;  // its claimant's unclaim checks (a retired arena: never needed)
    idle_wanted_.store(false, std::memory_order_seq_cst);
    if (unpinned()) idle();
    release_claim();  // then again if a release wished for it meanwhile
  }
}

void arena::add_plan(plan& p) {
  // Under pinned_mutex, which rebase takes too: the plan reads the base it is placed at.
  std::lock_guard guard(pinned_mutex);
  plans_.push_back(&p);
  p.rebase(memory_.base);
}

void arena::remove_plan(const plan& p) noexcept { std::erase(plans_, &p); }

void arena::rebase_locked() noexcept {
  std::lock_guard guard(pinned_mutex);
  memory_.base = static_cast<std::byte*>(memory_.span->address());
  for (plan* p : plans_) p->rebase(memory_.base);  // no region is live: the span was idle (or new)
}

stream_set arena::streams_in_use() noexcept {
  stream_set out(memory_.stream);
  std::lock_guard guard(waits_lock_);
  for (stream_ref s : waits_) out.add(s);
  return out;
}

bool arena::claim(const void* run, const void* key) noexcept {
  if (retired()) return false;
  const void* none = nullptr;
  if (!claimed_by_.compare_exchange_strong(none, run, std::memory_order_seq_cst))  // seq_cst: idle_if_unpinned
    return false;
  if (retired()) {  // retired while we claimed: give it back
    unclaim();
    return false;
  }
  claimed_key_.store(key, std::memory_order_relaxed);
  return true;
}

void arena::drop_released_pins_locked() noexcept {
  std::erase_if(pinned, [](const pinned_region& p) {
    return p.owner->state(p.index).state.load(std::memory_order_acquire) != p.live_state;
  });
}

bool arena::unpinned() noexcept {
  std::lock_guard guard(pinned_mutex);
  drop_released_pins_locked();
  return pinned.empty();
}

void arena::add_waits(const std::vector<stream_ref>& streams) {
  std::lock_guard guard(waits_lock_);
  for (stream_ref s : streams)
    if (s != memory_.stream && std::find(waits_.begin(), waits_.end(), s) == waits_.end()) waits_.push_back(s);
  waits_pending_.store(!waits_.empty(), std::memory_order_release);
}

bool arena::wait_for_pending(stream_ref consumer) {
  std::lock_guard guard(waits_lock_);
  try {
    for (auto it = waits_.begin(); it != waits_.end(); it = waits_.erase(it))
      if (*it != consumer) memory_.backend->res().order_streams(*it, consumer);
  } catch (const stream_order_unavailable&) {
    return false;
  }
  waits_pending_.store(false, std::memory_order_release);
  return true;
}

}  // namespace refpool::detail
