// The hit path's out-of-line part: put_back_in_slot() (a block goes idle in its slot; try_put_back
// calls it), acquire() when try_hit found nothing (the slot's other buckets, a steal, a miss),
// draining hand-off lists, and put_back_cached() when try_put_back could not put a block back. Its
// inline part is hit_path.hpp; the entry points that call both are api/allocate.cpp.
#include "cache/hit_path.hpp"

#include <mutex>
#include <utility>

#include <refpool/error.hpp>

#include "cache/scope_frame.hpp"

namespace refpool::detail {

__thread scope_frame* current_frame __attribute__((tls_model("initial-exec"))) = nullptr;

void wait_for_streams(block* b, stream_ref stream) {
  b->backend->res().order_streams(b->last_stream, stream);
  std::lock_guard guard(b->streams_lock);
  for (stream_ref s : b->extra_streams)
    if (s != stream) b->backend->res().order_streams(s, stream);
  b->extra_streams.clear();
}

// ---- handing out --------------------------------------------------------------------------

block* cache_state::acquire(slot& s, backend_state& backend, const block_key& key, std::size_t bytes,
                            stream_ref stream) {
  block* b = nullptr;
  bool other_stream = false;
  bool over_limit = false;
  bool orphaned = false;
  {
    owner_section section(s.lock);
    if (block* pending = s.handed_off.load(std::memory_order_relaxed); pending != nullptr) [[unlikely]] {
      orphaned = pending == orphaned_marker;
      if (!orphaned) over_limit = drain_handed_off(s);
    }
    if (!orphaned) {
      catch_up_with_steps(s);
      bucket& home = s.bucket_for(key);
      b = home.take(stream);
      if (b != nullptr) {
        if (idle_limit_.tracking()) remove_idle(s, b);
        mark_live(s, home, b, true);
        other_stream = b->last_stream != stream || !b->extra_streams.empty();
        if (other_stream) s.counters.cross_stream_reuses += 1;
      }
    }
  }
  if (orphaned) {  // the cache was destroyed: served by the backend, rounded as before, freed on release
    b = allocate_uncached(backend, key.bytes, stream);
    b->requested = bytes;
    return b;
  }
  if (over_limit) enforce_idle_limit();
  if (b == nullptr) b = steal(s, key, stream, other_stream);
  if (b != nullptr && other_stream) {
    try {
      wait_for_streams(b, stream);
    } catch (const stream_order_unavailable&) {
      put_back_cached(b, false);  // not usable on `stream` now (a graph capture): idle again, and a miss
      b = nullptr;
    } catch (...) {
      put_back_cached(b, false);  // still ordered after its old stream: idle again, unchanged
      throw;
    }
  }
  if (b == nullptr) {
    try {
      b = allocate_new(s, backend, key, bytes, stream);
    } catch (const stream_order_unavailable&) {
      // The free bytes a piece would take were last used on a stream that cannot be ordered
      // before `stream` now (docs/design.md, "Stream safety"): memory of its own from the
      // backend, freed on release, as the uncached path serves it.
      b = allocate_uncached(backend, key.bytes, stream);
    }
  }
  b->last_stream = stream;
  b->requested = bytes;
  b->refs.reset(1);
  return b;
}

// ---- giving back --------------------------------------------------------------------------

bool cache_state::add_idle(slot& s, block* b) noexcept {
  b->idle = true;
  b->idle_at.seq = ++s.releases;
  b->home->put(b);  // never reallocates: capacity was reserved when the block joined the bucket
  if (!idle_limit_.tracking()) return false;
  return idle_limit_.went_idle(b->capacity);
}

bool cache_state::put_back_in_slot(slot& s, block* b, bool via_unsafe_free) noexcept {
  catch_up_with_steps(s);  // a block of an ended step that is still live at its end escaped it
  b->home->live -= 1;
  s.counters.live_bytes -= b->capacity;
  if (b->epoch == s.epoch) s.live_in_epoch -= 1;
  if (via_unsafe_free) s.counters.unsafe_frees += 1;
  return add_idle(s, b);
}

bool cache_state::drain_list(slot& s, block* newest) noexcept {
  // Oldest first, so idle order (and least-recently-used order) is release order.
  block* oldest = nullptr;
  while (newest != nullptr) {
    block* next = newest->hand_off.next;
    newest->hand_off.next = oldest;
    oldest = newest;
    newest = next;
  }
  if (s.ambient) {
    // Releases made before their step ended are no escapes of it, whenever the list is drained.
    for (block* b = oldest; b != nullptr; b = b->hand_off.next) {
      if (b->hand_off.in_epoch && b->epoch == s.epoch) {
        s.live_in_epoch -= 1;
        b->epoch = no_epoch;  // counted: put_back_in_slot must not count it again
      }
    }
  }
  bool over_limit = false;
  for (block* b = oldest; b != nullptr;) {
    block* next = b->hand_off.next;
    b->hand_off.next = nullptr;
    over_limit |= put_back_in_slot(s, b, b->hand_off.unsafe);
    b = next;
  }
  return over_limit;
}

bool cache_state::drain_handed_off(slot& s) noexcept {
  return drain_list(s, s.handed_off.exchange(nullptr, std::memory_order_acquire));
}

void cache_state::put_back_cached(block* b, bool via_unsafe_free) noexcept {
  slot& s = *b->home->owner;
  b->idle_at.tick = clock_.load(std::memory_order_relaxed);
  if (s.owner_thread.load(std::memory_order_relaxed) != this_thread_token()) {
    put_back_elsewhere(s, b, via_unsafe_free);  // another thread's slot, or nobody's
    return;
  }
  bool orphaned = false;
  bool over_limit = false;
  {
    owner_section section(s.lock);
    block* pending = s.handed_off.load(std::memory_order_relaxed);
    orphaned = pending == orphaned_marker;
    if (!orphaned) {
      if (pending != nullptr) over_limit = drain_handed_off(s);
      over_limit |= put_back_in_slot(s, b, via_unsafe_free);
    }
  }
  if (orphaned) {
    put_back_orphaned(s, b);
  } else if (over_limit) {
    enforce_idle_limit();
  }
}

}  // namespace refpool::detail
