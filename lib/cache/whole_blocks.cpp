// Whole blocks from the backend: the block source of caches without segments, the cache's uncached
// blocks, and direct blocks.
#include "cache/whole_blocks.hpp"

#include <atomic>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "byte_text.hpp"
#include "cache/cache_state.hpp"
#include "cache/oom_text.hpp"

namespace refpool::detail {

// ---- the source ---------------------------------------------------------------------------

void* whole_block_source::allocate(backend_state& backend, std::size_t bytes, std::size_t requested,
                                   stream_ref stream) {
  // Out of memory: this backend's idle blocks (all sizes, all slots) go back, and it retries once.
  std::size_t freed = 0;
  void* ptr = cache_.retry_once(backend, freed, [&] { return backend.allocate(bytes, stream); });
  if (ptr != nullptr) return ptr;
  cache_.count_oom();
  const cache_stats now = cache_.stats();
  throw out_of_memory(
      fmt::format("refpool: out of memory: {} could not allocate {} (request {}) {}, even after reclaiming {} of idle "
                  "cache; the cache now holds {} live in {} blocks and {} idle; the backend has {} outstanding. {}",
                  backend.res().name(), scaled_bytes(bytes), scaled_bytes(requested), memory_place(backend.device()),
                  scaled_bytes(freed), scaled_bytes(now.live_bytes), now.live_blocks, scaled_bytes(now.idle_bytes),
                  scaled_bytes(backend.outstanding_bytes()), oom_advice(now)),
      bytes, backend.device());
}

block* whole_block_source::make(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                                stream_ref stream) {
  auto made = std::make_unique<block>();  // before the backend call, so a bad_alloc leaks nothing
  void* ptr = allocate(backend, key.bytes, requested, stream);
  made->source = this;
  try {
    cache_.home_new_block(s, backend, key, made.get(), ptr, stream, false);
  } catch (...) {
    backend.deallocate(ptr, key.bytes, stream);
    throw;
  }
  backend.retain();
  allocations_.fetch_add(1, std::memory_order_relaxed);
  cache_.count_held(key.bytes);
  reserved_.add(key.bytes);
  return made.release();
}

std::size_t whole_block_source::take_back(block* b) noexcept {
  const std::size_t bytes = b->capacity;
  frees_.fetch_add(1, std::memory_order_relaxed);
  reserved_.remove(bytes);
  free_block(b);
  return bytes;
}

void whole_block_source::add_counters(cache_stats& out) const {
  out.backend_allocations = allocations_.load();
  out.backend_frees = frees_.load();
  out.uncached_allocations = uncached_allocations_.load();
  out.uncached_live_bytes = uncached_live_bytes_.load();
}

// ---- uncached blocks of the cache ---------------------------------------------------------

block* whole_block_source::make_uncached(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = allocate(backend, bytes, bytes, stream);
  block* b = direct_block(made.release(), backend, ptr, bytes, stream);
  uncached_allocations_.fetch_add(1, std::memory_order_relaxed);
  raise_max(peak_uncached_live_bytes_, uncached_live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  reserved_.add(bytes);
  return b;
}

void whole_block_source::take_back_uncached(block* b) noexcept {
  uncached_live_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
  reserved_.remove(b->capacity);
  free_block(b);
}

// ---- direct blocks ------------------------------------------------------------------------

block* direct_block(block* b, backend_state& backend, void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  b->ptr = ptr;
  b->capacity = bytes;
  b->requested = bytes;
  b->backend = &backend;
  backend.retain();
  b->last_stream = stream;
  b->refs.reset(1);
  return b;
}

namespace {

// Blocks whose recorded streams cannot be ordered before their free now (a graph capture on one of
// them: docs/design.md, "Stream safety"): kept, and freed by a later free_block once they can be.
struct deferred_blocks {
  std::mutex mutex;
  std::atomic<bool> any{false};  // lets a free skip the mutex when nothing is kept (the usual case)
  std::vector<block*> blocks;
};
deferred_blocks& deferred() {
  static auto* instance = new deferred_blocks;  // leaked: blocks may be freed by static destructors
  return *instance;
}

// Frees `b`, unless its recorded streams cannot be ordered before its last one now: false (or,
// with `anyway`, freed without that order).
bool free_now(block* b, bool anyway = false) noexcept {
  // A stream-ordered free (cuMemFreeAsync) waits for its own stream only: streams recorded on the
  // block (record_stream) are ordered before it, as free_segment does for a segment's streams.
  for (const stream_ref s : b->extra_streams) {
    if (s == b->last_stream) continue;
    try {
      b->backend->res().order_streams(s, b->last_stream);
    } catch (const stream_order_unavailable&) {
      if (!anyway) return false;  // a wait for the device would break the capture too
      break;
    } catch (const std::exception& e) {
      // No stream order to be had: wait for the device instead; failing that, say so (the context
      // is then most likely broken, and nothing in flight can be waited for).
      try {
        b->backend->res().synchronize();
      } catch (const std::exception&) {
        std::fprintf(stderr, "refpool: freeing %p without waiting for stream %p: %s\n", b->ptr, s.handle, e.what());
      }
      break;
    }
  }
  b->backend->deallocate(b->ptr, b->capacity, b->last_stream);
  b->backend->release();
  delete b;
  return true;
}

// Keeps `b` for a later free; with nowhere to keep it, frees it without the order.
void keep(block* b) noexcept {
  deferred_blocks& d = deferred();
  {
    std::lock_guard lock(d.mutex);
    try {
      d.blocks.push_back(b);
      d.any.store(true, std::memory_order_relaxed);
      return;
    } catch (const std::bad_alloc&) {}
  }
  (void)free_now(b, true);
}

}  // namespace

void free_deferred_blocks() noexcept {
  deferred_blocks& d = deferred();
  if (!d.any.load(std::memory_order_relaxed)) return;
  std::vector<block*> waiting;
  {
    std::lock_guard lock(d.mutex);
    waiting.swap(d.blocks);  // each free below runs without the lock: it calls the backend
    d.any.store(false, std::memory_order_relaxed);
  }
  for (block* w : waiting)
    if (!free_now(w)) keep(w);
}

void free_block(block* b) noexcept {
  free_deferred_blocks();
  if (!free_now(b)) keep(b);
}

block* allocate_direct(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = backend.allocate(bytes, stream);
  if (ptr == nullptr)
    throw out_of_memory(
        fmt::format("refpool: out of memory: {} could not allocate {} {} (an uncached allocation: no cache to "
                    "reclaim); the backend has {} outstanding. What to do: release buffers no longer needed, or "
                    "call reclaim() on the caches that use this backend (REFPOOL_NO_CACHING=on bypasses them all)",
                    backend.res().name(), scaled_bytes(bytes), memory_place(backend.device()),
                    scaled_bytes(backend.outstanding_bytes())),
        bytes, backend.device());
  return direct_block(made.release(), backend, ptr, bytes, stream);
}

}  // namespace refpool::detail
