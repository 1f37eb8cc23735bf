// The entry points of the hit path: refpool::allocate (in a scope), alloc_cache::allocate (from any
// thread) and a data_ref's last release (detail::last_reference_dropped), with the cache's fast part
// (cache/hit_path.hpp) inlined into them, so a hit and a release on the slot's own thread make one
// call each. A block's last release is one switch on its origin: cached blocks go back to their home
// bucket, regions to their plan, direct blocks to their backend.
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>

#include "access.hpp"
#include "cache/hit_path.hpp"
#include "cache/region_block.hpp"
#include "cache/scope_frame.hpp"
#include "config/alloc_log.hpp"
#include "config/env_config.hpp"

namespace refpool {

namespace detail {

void last_reference_dropped(block_header* h, bool via_unsafe_free) noexcept {
  block* b = as_block(h);
  // The common case first: a cached block released on its slot's thread, nothing watching.
  if (b->origin == block_origin::cached && b->observer == nullptr && active_log() == nullptr) [[likely]] {
    if (b->home->owner->cache->try_put_back(b, via_unsafe_free)) return;
  }
  if (alloc_log* log = active_log()) log->record(false, b->ptr, b->requested, b->last_stream);
  if (release_observer* o = b->observer) {
    b->observer = nullptr;
    o->observe_release(b, via_unsafe_free);
  }
  switch (b->origin) {
    case block_origin::cached: b->home->owner->cache->put_back_cached(b, via_unsafe_free); return;
    case block_origin::region: as_region(b)->owner->put_back_region(b, via_unsafe_free); return;
    case block_origin::direct: free_direct(b, via_unsafe_free); return;
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
