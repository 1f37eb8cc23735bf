// A cache's misses: steals from other slots, then a new block from the key's block source
// (whole_blocks.cpp, segment_source.cpp), homed here; and uncached blocks (made and counted by the
// whole-block source, each holding a reference to the cache).
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "cache/hit_path.hpp"  // mark_live

namespace refpool::detail {

// ---- misses -------------------------------------------------------------------------------

void cache_state::remove_idle(slot&, block* b) noexcept {
  b->idle = false;
  if (idle_limit_.tracking()) idle_limit_.left_idle(b->capacity);
}

block* cache_state::steal(slot& thief, const block_key& key, stream_ref stream, bool& other_stream) {
  std::lock_guard guard(mutex_);
  {
    owner_section section(thief.lock);  // nobody intrudes: every intruder needs mutex_
    reserve_for_one_more(thief.bucket_for(key));
  }
  for (const auto& victim : slots_.all) {
    if (victim.get() == &thief) continue;
    block* b = nullptr;
    intrude(*victim);
    if (bucket* from = victim->buckets.find(key)) {
      b = from->take(stream);
      if (b != nullptr) {
        remove_idle(*victim, b);
        victim->erase_if_unused(*from);
        // Its home moves to the thief. Never the victim's last reference: the cache is open.
        victim->refs.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    victim->lock.unlock();
    if (b == nullptr) continue;
    other_stream = b->last_stream != stream || !b->extra_streams.empty();
    owner_section section(thief.lock);
    mark_live(thief, thief.bucket_for(key), b, true);  // homes change only under mutex_
    thief.refs.fetch_add(1, std::memory_order_relaxed);
    thief.counters.steals += 1;
    if (other_stream) thief.counters.cross_stream_reuses += 1;
    return b;
  }
  return nullptr;
}

block* cache_state::allocate_new(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                                 stream_ref stream) {
  return source_for(backend).make(s, backend, key, requested, stream);
}

void cache_state::home_new_block(slot& s, backend_state& backend, const block_key& key, block* b, void* ptr,
                                 stream_ref stream, bool waited) {
  b->ptr = ptr;
  b->capacity = key.bytes;
  b->backend = &backend;
  b->origin = block_origin::cached;
  b->id = next_block_id_.fetch_add(1, std::memory_order_relaxed);
  b->last_stream = stream;
  owner_section section(s.lock);
  bucket& home = s.bucket_for(key);  // made again if a reclaim erased it meanwhile
  reserve_for_one_more(home);
  mark_live(s, home, b, false);
  s.refs.fetch_add(1, std::memory_order_relaxed);  // also if the cache closed meanwhile: counted
  if (waited) s.counters.cross_stream_reuses += 1;
}

block* cache_state::allocate_uncached(backend_state& backend, std::size_t bytes, stream_ref stream) {
  block* b = whole_blocks_.make_uncached(backend, bytes, stream);
  b->uncached_for = this;
  retain();
  return b;
}

void cache_state::free_uncached(block* b, bool via_unsafe_free) noexcept {
  if (via_unsafe_free) counters_.extra_unsafe_frees.fetch_add(1, std::memory_order_relaxed);
  whole_blocks_.take_back_uncached(b);
  release();
}

void free_direct(block* b, bool via_unsafe_free) noexcept {
  if (cache_state* cache = b->uncached_for) {
    cache->free_uncached(b, via_unsafe_free);
    return;
  }
  free_block(b);
}

}  // namespace refpool::detail
