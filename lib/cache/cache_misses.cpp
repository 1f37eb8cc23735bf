// A cache's misses: steals from other slots, new blocks from the backend with the out-of-memory
// ladder (reclaim and retry once), and uncached and direct blocks. Segment pieces: cache_segments.cpp.
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

namespace {

/// A direct block over `ptr` (from `backend`, which it holds), handed out once.
block* direct_block(std::unique_ptr<block> made, backend_state& backend, void* ptr, std::size_t bytes,
                    stream_ref stream) noexcept {
  block* b = made.release();
  b->ptr = ptr;
  b->capacity = bytes;
  b->requested = bytes;
  b->backend = &backend;
  backend.retain();
  b->last_stream = stream;
  b->refs.reset(1);
  return b;
}

}  // namespace

/// Gives `b`'s memory back to its backend, drops its hold on the backend, deletes it.
void free_block(block* b) noexcept {
  b->backend->deallocate(b->ptr, b->capacity, b->last_stream);
  b->backend->release();
  delete b;
}

// ---- misses -------------------------------------------------------------------------------

void cache_state::remove_idle(slot&, block* b) noexcept {
  b->idle = false;
  if (tracking_idle_.load(std::memory_order_relaxed)) idle_total_.fetch_sub(b->capacity, std::memory_order_relaxed);
}

block* cache_state::steal(slot& thief, const block_key& key, stream_ref stream, bool& other_stream) {
  std::lock_guard guard(mutex_);
  {
    owner_section section(thief.lock);  // nobody intrudes: every intruder needs mutex_
    reserve_for_one_more(thief.bucket_for(key));
  }
  for (const auto& victim : slots_) {
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

void* cache_state::allocate_or_reclaim(backend_state& backend, std::size_t bytes, std::size_t requested,
                                       stream_ref stream) {
  void* ptr = backend.allocate(bytes, stream);
  if (ptr != nullptr) return ptr;
  // Out of memory: give back this backend's idle blocks (all sizes, all slots), retry once.
  const std::size_t freed = reclaim_for_retry(backend);
  ptr = backend.allocate(bytes, stream);
  if (ptr != nullptr) return ptr;
  ooms_.fetch_add(1, std::memory_order_relaxed);
  const cache_stats now = stats();
  throw out_of_memory(
      fmt::format("refpool: out of memory: {} could not allocate {} B (request {} B) on device {}, "
                  "even after reclaiming {} B of idle cache; the cache now holds {} B live in {} "
                  "blocks and {} B idle; the backend has {} B outstanding",
                  backend.res().name(), bytes, requested, backend.device(), freed, now.live_bytes, now.live_blocks,
                  now.idle_bytes, backend.outstanding_bytes.load()),
      bytes, backend.device());
}

block* cache_state::allocate_new(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                                 stream_ref stream) {
  if (backend.piece_unit(segments_) != 1) return allocate_piece(s, backend, key, requested, stream);
  auto made = std::make_unique<block>();  // before the backend call, so a bad_alloc leaks nothing
  void* ptr = allocate_or_reclaim(backend, key.bytes, requested, stream);
  try {
    home_new_block(s, backend, key, made.get(), ptr, stream, false);
  } catch (...) {
    backend.deallocate(ptr, key.bytes, stream);
    throw;
  }
  backend.retain();
  backend_allocations_.fetch_add(1, std::memory_order_relaxed);
  count_held(key.bytes);
  count_from_backends(key.bytes, 0);
  return made.release();
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

void cache_state::count_held(std::size_t bytes) noexcept {
  raise_max(peak_held_bytes_, held_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void cache_state::count_from_backends(std::size_t added, std::size_t removed) noexcept {
  if (added > removed) {
    reserved_->add(added - removed);
  } else if (removed > added) {
    reserved_->remove(removed - added);
  }
}

block* cache_state::allocate_uncached(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = allocate_or_reclaim(backend, bytes, bytes, stream);
  block* b = direct_block(std::move(made), backend, ptr, bytes, stream);
  b->uncached_for = this;
  retain();
  uncached_allocations_.fetch_add(1, std::memory_order_relaxed);
  raise_max(peak_uncached_live_bytes_, uncached_live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  reserved_->add(bytes);
  return b;
}

void cache_state::release_uncached(block* b, bool via_unsafe_free) noexcept {
  uncached_live_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
  reserved_->remove(b->capacity);
  if (via_unsafe_free) extra_unsafe_frees_.fetch_add(1, std::memory_order_relaxed);
  free_block(b);
  release();
}

block* allocate_direct(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = backend.allocate(bytes, stream);
  if (ptr == nullptr)
    throw out_of_memory(fmt::format("refpool: out of memory: {} could not allocate {} B on device {} "
                                    "(uncached allocation: no cache to reclaim); the backend has {} B outstanding",
                                    backend.res().name(), bytes, backend.device(), backend.outstanding_bytes.load()),
                        bytes, backend.device());
  return direct_block(std::move(made), backend, ptr, bytes, stream);
}

void release_direct(block* b, bool via_unsafe_free) noexcept {
  if (cache_state* cache = b->uncached_for) {
    cache->release_uncached(b, via_unsafe_free);
    return;
  }
  free_block(b);
}

}  // namespace refpool::detail
