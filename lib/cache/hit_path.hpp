// The hit path's fast part, inline: what a hit and a release on the slot's own thread do, inlined
// into the entry points (api/allocate.cpp: allocate() finds the thread's slot and asks try_hit; a
// data_ref's last release asks try_put_back), which take no lock and no atomic read-modify-write
// there: the owner_lock's owner side is two plain stores. The rest of the hit path (put_back_in_slot,
// which a release calls, acquire, the hand-off lists, put_back_cached) is hit_path.cpp; misses,
// steals, reclaim, limits, close and stats are cache_state.cpp and its neighbours.
#pragma once

#include "cache/cache_state.hpp"
#include "cache/thread_holdings.hpp"

namespace refpool::detail {

/// Orders `stream` after every stream idle block `b` may still be used on (its last stream and
/// those recorded on it), which it then forgets: what a reuse on another stream waits for. Throws
/// what resource::order_streams throws (stream_order_unavailable during a graph capture); the
/// streams not yet waited for stay recorded then.
void wait_for_streams(block* b, stream_ref stream);

inline slot* cache_state::ambient_slot() {
  if (ambient_cache == this) [[likely]]
    return ambient_lease;
  return lease_ambient_for_thread();
}

// ---- handing out --------------------------------------------------------------------------

inline void cache_state::mark_live(slot& s, bucket& home, block* b, bool hit) noexcept {
  slot_counters& c = s.counters;
  (hit ? c.hits : c.misses) += 1;
  home.live += 1;
  c.live_bytes += b->capacity;
  if (c.live_bytes > c.peak_live_bytes) c.peak_live_bytes = c.live_bytes;
  s.live_in_epoch += 1;
  b->epoch = s.epoch;
  b->home = &home;
  b->idle = false;
}

// The fast paths are inlined into allocate() and last_reference_dropped(), the two calls a hit
// and a release make, and into a probing run's requests (plan/run.cpp: the plain path, fingerprinted).
#define REFPOOL_HIT_PATH inline __attribute__((always_inline))

REFPOOL_HIT_PATH block* cache_state::try_hit(slot& s, const block_key& key, stream_ref stream) noexcept {
  const bool fast = s.lock.owner_enter();
  block* b = nullptr;
  bucket* home = s.last_bucket;
  if (fast && s.handed_off.load(std::memory_order_relaxed) == nullptr && home != nullptr && home->key == key &&
      !home->idle.empty() && (!s.ambient || s.epoch == step_.epoch.load(std::memory_order_relaxed)) &&
      !idle_limit_.tracking()) [[likely]] {
    block* oldest = home->idle.back();
    if (oldest->last_stream == stream && oldest->extra_streams.empty()) [[likely]] {
      home->pop_oldest();
      mark_live(s, *home, oldest, true);
      b = oldest;
    }
  }
  s.lock.owner_leave(fast);
  return b;
}

// ---- giving back --------------------------------------------------------------------------

REFPOOL_HIT_PATH bool cache_state::try_put_back(block* b, bool via_unsafe_free) noexcept {
  slot& s = *b->home->owner;
  if (s.owner_thread.load(std::memory_order_relaxed) != this_thread_token() || idle_limit_.tracking()) [[unlikely]]
    return false;
  const bool fast = s.lock.owner_enter();
  const bool done = fast && s.handed_off.load(std::memory_order_relaxed) == nullptr;
  if (done) [[likely]] {
    b->idle_at.tick = clock_.load(std::memory_order_relaxed);
    put_back_in_slot(s, b, via_unsafe_free);
  }
  s.lock.owner_leave(fast);
  return done;
}

#undef REFPOOL_HIT_PATH

}  // namespace refpool::detail
