// The hit path, in one place: allocate() finds the thread's slot, acquire() takes an idle block
// of the request's key, and the release path (last_reference_dropped -> release_cached) puts it
// back. On the slot's own thread neither takes a lock or an atomic read-modify-write: the
// owner_lock's owner side is two plain stores. Everything else (miss, steal, reclaim, limits,
// close, stats) is the slow path in cache_state.cpp.
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>

#include <utility>

#include "access.hpp"
#include "cache/cache_state.hpp"
#include "cache/region_block.hpp"
#include "cache/scope_frame.hpp"
#include "cache/thread_holdings.hpp"
#include "config/alloc_log.hpp"
#include "config/env_config.hpp"

namespace refpool {

namespace detail {

__thread scope_frame* current_frame __attribute__((tls_model("initial-exec"))) = nullptr;

slot* cache_state::ambient_slot() {
  if (ambient_cache == this) [[likely]]
    return ambient_lease;
  return lease_ambient_for_thread();
}

namespace {
void wait_for_streams(block* b, stream_ref stream) {
  b->backend->res().order_streams(b->last_stream, stream);
  std::lock_guard guard(b->streams_lock);
  for (stream_ref s : b->extra_streams)
    if (s != stream) b->backend->res().order_streams(s, stream);
  b->extra_streams.clear();
}
}  // namespace

// ---- handing out --------------------------------------------------------------------------

void cache_state::mark_live(slot& s, bucket& home, block* b, bool hit) noexcept {
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
// and a release make; nothing else calls them.
#define REFPOOL_HIT_PATH inline __attribute__((always_inline))

REFPOOL_HIT_PATH block* cache_state::try_hit(slot& s, const block_key& key, stream_ref stream) noexcept {
  const bool fast = s.lock.owner_enter();
  block* b = nullptr;
  bucket* home = s.last_bucket;
  if (fast && s.handed_off.load(std::memory_order_relaxed) == nullptr && home != nullptr && home->key == key &&
      !home->idle.empty() && (!s.ambient || s.epoch == step_epoch_.load(std::memory_order_relaxed)) &&
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
  if (b == nullptr) {
    b = allocate_new(s, backend, key, bytes, stream);
  } else if (other_stream) {
    try {
      wait_for_streams(b, stream);
    } catch (...) {
      release_cached(b, false);  // still ordered after its old stream: idle again, unchanged
      throw;
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
  b->idle_seq = ++s.releases;
  b->home->put(b);  // never reallocates: capacity was reserved when the block joined the bucket
  if (!idle_limit_.tracking()) return false;
  return idle_limit_.went_idle(b->capacity);
}

bool cache_state::release_in_slot(slot& s, block* b, bool via_unsafe_free) noexcept {
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
    block* next = newest->next_handed_off;
    newest->next_handed_off = oldest;
    oldest = newest;
    newest = next;
  }
  if (s.ambient) {
    // Releases made before their step ended are no escapes of it, whenever the list is drained.
    for (block* b = oldest; b != nullptr; b = b->next_handed_off) {
      if (b->handed_off_in_epoch && b->epoch == s.epoch) {
        s.live_in_epoch -= 1;
        b->epoch = no_epoch;  // counted: release_in_slot must not count it again
      }
    }
  }
  bool over_limit = false;
  for (block* b = oldest; b != nullptr;) {
    block* next = b->next_handed_off;
    b->next_handed_off = nullptr;
    over_limit |= release_in_slot(s, b, b->handed_off_unsafe);
    b = next;
  }
  return over_limit;
}

bool cache_state::drain_handed_off(slot& s) noexcept {
  return drain_list(s, s.handed_off.exchange(nullptr, std::memory_order_acquire));
}

REFPOOL_HIT_PATH bool cache_state::try_release(block* b, bool via_unsafe_free) noexcept {
  slot& s = *b->home->owner;
  if (s.owner_thread.load(std::memory_order_relaxed) != this_thread_token() || idle_limit_.tracking()) [[unlikely]]
    return false;
  const bool fast = s.lock.owner_enter();
  const bool done = fast && s.handed_off.load(std::memory_order_relaxed) == nullptr;
  if (done) [[likely]] {
    b->idle_since = clock_.load(std::memory_order_relaxed);
    release_in_slot(s, b, via_unsafe_free);
  }
  s.lock.owner_leave(fast);
  return done;
}

void cache_state::release_cached(block* b, bool via_unsafe_free) noexcept {
  slot& s = *b->home->owner;
  b->idle_since = clock_.load(std::memory_order_relaxed);
  if (s.owner_thread.load(std::memory_order_relaxed) != this_thread_token()) {
    release_elsewhere(s, b, via_unsafe_free);  // another thread's slot, or nobody's
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
      over_limit |= release_in_slot(s, b, via_unsafe_free);
    }
  }
  if (orphaned) {
    release_orphaned(s, b);
  } else if (over_limit) {
    enforce_idle_limit();
  }
}

}  // namespace detail

// ---- the entry points ---------------------------------------------------------------------

namespace detail {

void last_reference_dropped(block_header* h, bool via_unsafe_free) noexcept {
  block* b = as_block(h);
  // The common case first: a cached block released on its slot's thread, nothing watching.
  if (b->origin == block_origin::cached && b->observer == nullptr && active_log() == nullptr) [[likely]] {
    if (b->home->owner->cache->try_release(b, via_unsafe_free)) return;
  }
  if (alloc_log* log = active_log()) log->record(false, b->ptr, b->requested, b->last_stream);
  if (release_observer* o = b->observer) {
    b->observer = nullptr;
    o->observe_release(b, via_unsafe_free);
  }
  switch (b->origin) {
    case block_origin::cached: b->home->owner->cache->release_cached(b, via_unsafe_free); return;
    case block_origin::region: as_region(b)->owner->release_region(b, via_unsafe_free); return;
    case block_origin::direct: release_direct(b, via_unsafe_free); return;
  }
}

}  // namespace detail

data_ref alloc_cache::allocate(const backend& be, std::size_t bytes, stream_ref stream) {
  detail::backend_state* backend = detail::access::state(be);
  if (backend == nullptr) throw invalid_argument("refpool: alloc_cache::allocate from a null backend");
  if (bytes == 0) return {};
  detail::cache_state& cache = *state_;
  detail::slot* s = cache.bypassed() ? nullptr : cache.ambient_slot();
  detail::block* b = nullptr;
  if (s == nullptr) {
    b = detail::allocate_direct(*backend, bytes, stream);  // REFPOOL_NO_CACHING=1
  } else if (const detail::router_ref routed = cache.step_router()) {
    b = routed->acquire(s, *backend, bytes, stream);  // the reference keeps it if the step ends now
  } else {
    const detail::block_key key = cache.key_of(*backend, bytes);
    b = cache.try_hit(*s, key, stream);
    if (b == nullptr) [[unlikely]]
      b = cache.acquire(*s, *backend, key, bytes, stream);
    b->requested = bytes;
    b->refs.reset(1);
  }
  if (detail::alloc_log* log = detail::active_log()) log->record(true, b->ptr, bytes, stream);
  return detail::access::adopt(b);
}

data_ref allocate(const backend& be, std::size_t bytes, stream_ref stream) {
  detail::backend_state* backend = detail::access::state(be);
  if (backend == nullptr) throw invalid_argument("refpool: allocate from a null backend");
  if (bytes == 0) return {};  // nothing to allocate: a null handle (data() is nullptr)
  const detail::scope_frame* f = detail::current_frame;
  detail::block* b = nullptr;
  if (f == nullptr || f->cache == nullptr) {
    detail::environment();  // a bad REFPOOL_CONF fails here, clearly, and the log is open before use
    b = detail::allocate_direct(*backend, bytes, stream);
  } else if (f->router != nullptr) {
    b = f->router->acquire(f->lease, *backend, bytes, stream);
  } else if (f->lease != nullptr) {  // the scope read the environment already
    detail::cache_state& cache = *f->cache;
    const detail::block_key key = cache.key_of(*backend, bytes);
    b = cache.try_hit(*f->lease, key, stream);
    if (b == nullptr) [[unlikely]]
      b = cache.acquire(*f->lease, *backend, key, bytes, stream);
    b->requested = bytes;
    b->refs.reset(1);
  } else {
    b = detail::allocate_direct(*backend, bytes, stream);  // a warm-up entry: uncached
  }
  if (detail::alloc_log* log = detail::active_log()) log->record(true, b->ptr, bytes, stream);
  return detail::access::adopt(b);
}

}  // namespace refpool
