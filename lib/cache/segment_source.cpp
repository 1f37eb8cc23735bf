// Segment pieces as a block source (docs/design.md, "Segments"). On a miss for a backend with
// segments the source carves a piece from the backend's segment heap: from free ranges, after
// giving idle pieces of the request's pool back to the heap (first for large requests, when free
// ranges fail for small ones), then by growing the heap, and last after giving back everything
// idle and trimming. Locks: segment_source.hpp, cache_heap.hpp.
#include "cache/segment_source.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <exception>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "byte_text.hpp"
#include "cache/cache_state.hpp"
#include "cache/oom_text.hpp"

namespace refpool::detail {

void segment_source::free_or_trim(segment_heap& heap) {
  const segment_heap_stats st = heap.stats();
  if (st.pieces_out == 0 && st.spans == 0)
    heap.free_all();
  else
    heap.trim(0);
}

// ---- heaps --------------------------------------------------------------------------------

heap_use segment_source::use_heap(backend_state& backend) {
  std::lock_guard guard(mutex_);
  cache_heap* found = nullptr;
  for (const auto& h : heaps_) {
    if (h->backend == &backend) {
      found = h.get();
      break;
    }
  }
  if (found == nullptr) {
    const std::optional<segment_heap_options> options = heap_options(backend);
    if (!options) throw config_error(fmt::format("refpool: no segment heap can serve {}", backend.res().name()));
    heaps_.reserve(heaps_.size() + 1);
    heaps_.push_back(std::make_unique<cache_heap>(backend, *options));
    found = heaps_.back().get();
  }
  found->users.fetch_add(1, std::memory_order_relaxed);
  return heap_use(*found);
}

std::vector<heap_use> segment_source::use_heaps_locked(const backend_state* only) {
  std::vector<heap_use> out;
  out.reserve(heaps_.size());
  for (const auto& h : heaps_) {
    if (only != nullptr && h->backend != only) continue;
    h->users.fetch_add(1, std::memory_order_relaxed);
    out.emplace_back(*h);
  }
  return out;
}

std::vector<std::unique_ptr<cache_heap>> segment_source::drop_empty_heaps_locked() noexcept {
  std::vector<std::unique_ptr<cache_heap>> dropped;
  try {
    dropped.reserve(heaps_.size());
  } catch (...) {
    return dropped;  // kept for now: an empty heap costs a few hundred bytes
  }
  for (auto it = heaps_.begin(); it != heaps_.end();) {
    cache_heap& h = **it;
    bool empty = false;
    if (h.users.load(std::memory_order_acquire) == 0) {
      std::lock_guard lock(h.mutex);
      const segment_heap_stats st = h.heap.stats();
      // A yielded span keeps its record, and its owner the pointer, with no segment under it.
      empty = st.segments == 0 && st.pieces_out == 0 && st.spans == 0;
      if (empty) dropped_heap_counts_ += st.events;
    }
    if (empty) {
      dropped.push_back(std::move(*it));
      it = heaps_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

// ---- trim, close, stats -------------------------------------------------------------------

std::size_t segment_source::trim_heaps(const std::vector<heap_use>& heaps, std::size_t keep, bool quiet) {
  std::size_t given = 0;
  std::size_t allowance = keep;
  for (const heap_use& h : heaps) {
    std::lock_guard lock(h->mutex);
    const committed_change change(reserved_, *h);
    try {
      given += h->heap.trim(allowance);
    } catch (const stream_order_unavailable&) {
      // A segment's streams cannot be ordered now (a graph capture): it stays, for a later trim.
    } catch (const std::exception& e) {
      if (!quiet) throw;
      fmt::print(stderr, "refpool: trimming the segments of {} failed: {}\n", h->backend->res().name(), e.what());
    }
    allowance -= std::min(allowance, h->heap.stats().free_bytes);
  }
  return given;
}

std::size_t segment_source::trim(std::size_t keep, const backend_state* only, bool quiet) {
  std::vector<heap_use> heaps;
  {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked(only);
  }
  if (only != nullptr) return trim_heaps(heaps, keep, quiet);
  std::vector<std::unique_ptr<cache_heap>> dropped;  // destroyed last, with no lock held
  const auto drop_empty = [&] {
    heaps.clear();
    std::lock_guard guard(mutex_);
    dropped = drop_empty_heaps_locked();
  };
  std::size_t given = 0;
  try {
    given = trim_heaps(heaps, keep, quiet);
  } catch (...) {
    drop_empty();
    throw;
  }
  drop_empty();
  return given;
}

void segment_source::drop_empty_heaps() noexcept {
  std::vector<std::unique_ptr<cache_heap>> dropped;  // destroyed last, with no lock held
  std::lock_guard guard(mutex_);
  dropped = drop_empty_heaps_locked();
}

void segment_source::close() noexcept {
  std::vector<heap_use> heaps;
  try {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked();
  } catch (...) {
    return;  // out of host memory: the heaps give their memory back when the state goes
  }
  for (const heap_use& h : heaps) {
    std::lock_guard lock(h->mutex);
    const committed_change change(reserved_, *h);
    try {
      free_or_trim(h->heap);  // the rest goes with the last piece or span (take_back, give_back_span)
    } catch (const std::exception& e) {
      fmt::print(stderr, "refpool: giving back the segments of {} failed: {}\n", h->backend->res().name(), e.what());
    }
  }
  // Heaps that hold nothing go now: the closed state may be kept long (a thread's lease of it), and
  // a heap holds its backend. The others go with their last piece (take_back).
  heaps.clear();
  drop_empty_heaps();
}

void segment_source::add_counters(cache_stats& out) const {
  segment_heap_events events = dropped_heap_counts_;
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    const segment_heap_stats st = h->heap.stats();
    out.segments += st.segments;
    out.segment_bytes += st.committed_bytes;
    out.segment_free_bytes += st.free_bytes;
    out.segment_free_ranges += st.free_ranges;
    out.arena_bytes += st.span_bytes;  // committed like any segment bytes, but no cached block's
    events += st.events;
  }
  out.segment_grows = events.segments_made + events.grows;
  out.splits = events.splits;
  out.merges = events.merges;
  out.segment_trims = events.decommits + events.plain_frees;
  out.segment_trimmed_bytes = events.trimmed_bytes;
}

// ---- a miss -------------------------------------------------------------------------------

// Always inlined, so that make() keeps its own code as before (make_at shares this part with it); the
// block `made` is the caller's until it is homed.
inline __attribute__((always_inline)) block* segment_source::home_piece(slot& s, cache_heap& h, backend_state& backend,
                                                                        const block_key& key,
                                                                        std::unique_ptr<piece_block>& made,
                                                                        const segment_heap::carved& c,
                                                                        stream_ref stream) {
  assert(c.p.bytes == key.bytes);  // keys are rounded to the piece unit: every block of a key has its size
  const auto give_up = [&]() noexcept {
    stream_set used = c.waits;  // some waits may have been enqueued: keep every stream
    used.add(stream);
    std::lock_guard lock(h.mutex);
    h.heap.give_back(c.p, used);
  };
  try {
    wait_for_piece(h, c.waits, stream);
  } catch (...) {
    give_up();
    throw;
  }
  made->source = this;
  made->heap = &h;
  made->piece = c.p;
  try {
    cache_.home_new_block(s, backend, key, made.get(), c.p.address, stream, !c.waits.empty());
  } catch (...) {
    give_up();
    throw;
  }
  backend.retain();
  cache_.count_held(key.bytes);
  return made.release();
}

block* segment_source::make(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                            stream_ref stream) {
  heap_use h = use_heap(backend);
  std::unique_ptr<piece_block> made(h->new_block());  // before carving, so a bad_alloc leaves the heap alone
  const segment_heap::carved c = carve(s, *h, key.bytes, requested, stream);
  return home_piece(s, *h, backend, key, made, c, stream);
}

block* segment_source::make_at(slot& s, cache_heap& h, const block_key& key, std::uintptr_t address,
                               stream_ref stream) {
  std::unique_ptr<piece_block> made(h.new_block());  // before carving, so a bad_alloc leaves the heap alone
  std::optional<segment_heap::carved> c;
  {
    std::lock_guard lock(h.mutex);
    const committed_change change(reserved_, h);  // uncommitted holes there are committed
    c = h.heap.carve_exact(address, key.bytes, stream);
  }
  if (!c) return nullptr;
  return home_piece(s, h, *h.backend, key, made, *c, stream);
}

segment_heap::carved segment_source::carve(slot& s, cache_heap& h, std::size_t bytes, std::size_t requested,
                                           stream_ref stream) {
  // Large pieces hold most bytes, and an idle one pins its place: give them all back first, so
  // the piece goes where best fit over everything reusable puts it (as if released pieces had
  // coalesced at once). Small ones stay cached until free ranges run out.
  const bool large = !h.heap.small(bytes);
  if (large) cache_.give_back_idle_pieces(s, h, bytes);
  {  // a free range that holds it
    std::lock_guard lock(h.mutex);
    if (auto c = h.heap.carve_free(bytes, stream)) return *c;
  }
  if (!large && cache_.give_back_idle_pieces(s, h, bytes) != 0) {
    std::lock_guard lock(h.mutex);
    if (auto c = h.heap.carve_free(bytes, stream)) return *c;
  }
  {  // grow (a driver call)
    std::lock_guard lock(h.mutex);
    const committed_change change(reserved_, h);
    if (auto c = h.heap.carve(bytes, stream)) return *c;
  }
  // Out of memory: everything idle of this backend back, the heap trimmed to nothing, once more.
  const std::size_t freed = cache_.reclaim_for_retry(*h.backend);
  segment_heap_stats st;
  {
    std::lock_guard lock(h.mutex);
    const committed_change change(reserved_, h);
    if (auto c = h.heap.carve(bytes, stream)) return *c;
    st = h.heap.stats();
  }
  cache_.count_oom();
  const cache_stats now = cache_.stats();
  backend_state& backend = *h.backend;
  throw out_of_memory(
      fmt::format("refpool: out of memory: {} could not allocate {} (request {}) {}, even after reclaiming {} of idle "
                  "cache; its segments hold {} in {} segments, {} of it free (largest free range {}) and {} in {} "
                  "pieces; the cache now holds {} live in {} blocks and {} idle; the backend has {} outstanding. {}",
                  backend.res().name(), scaled_bytes(bytes), scaled_bytes(requested), memory_place(backend.device()),
                  scaled_bytes(freed), scaled_bytes(st.committed_bytes), st.segments, scaled_bytes(st.free_bytes),
                  scaled_bytes(st.largest_free_bytes), scaled_bytes(st.used_bytes), st.pieces_out,
                  scaled_bytes(now.live_bytes), now.live_blocks, scaled_bytes(now.idle_bytes),
                  scaled_bytes(backend.outstanding_bytes()), oom_advice(now)),
      bytes, backend.device());
}

void segment_source::wait_for_piece(cache_heap& h, const stream_set& waits, stream_ref stream) {
  resource& res = h.backend->res();
  if (waits.any()) {
    // The piece's last users are no longer known (more than stream_set::capacity streams): wait
    // for the whole device. After that no free byte of the heap has work in flight, so its
    // free ranges forget their streams; under the heap's lock, so no piece given back after
    // the wait loses its streams.
    std::lock_guard lock(h.mutex);
    res.synchronize();
    h.heap.forget_streams();
    return;
  }
  for (const stream_ref producer : waits) res.order_streams(producer, stream);
}

// ---- pieces leaving the cache -------------------------------------------------------------

std::size_t segment_source::return_pieces(cache_heap& h, std::span<block* const> pieces) noexcept {
  if (pieces.empty()) return 0;
  std::size_t bytes = 0;
  // The order does not matter: free neighbours join whichever comes back first.
  std::lock_guard lock(h.mutex);
  for (block* idle : pieces) {
    piece_block* b = as_piece(idle);  // the source of every block in a piece list
    assert(b->heap == &h);
    h.heap.give_back(b->piece, streams_of(*b));
    bytes += b->capacity;
    b->backend->release();  // never the last reference: the heap holds one
    h.retire_block(b);
  }
  return bytes;
}

std::size_t segment_source::take_back(block* taken) noexcept {
  piece_block* b = as_piece(taken);  // made by make(), with this source
  // Back to its heap. After the cache is gone nothing carves from the heap any more, so its free
  // memory goes back to the backend at once (all of it with the last piece).
  cache_heap* h = b->heap;
  bool emptied = false;
  {
    std::lock_guard lock(h->mutex);
    h->heap.give_back(b->piece, streams_of(*b));
    if (cache_.closed()) {
      const committed_change change(reserved_, *h);
      try {
        free_or_trim(h->heap);
      } catch (const std::exception& e) {
        fmt::print(stderr, "refpool: giving back the segments of {} failed: {}\n", h->backend->res().name(), e.what());
      }
      emptied = h->heap.stats().segments == 0;
    }
    b->backend->release();  // never the last reference: the heap holds one
    delete b;
  }
  if (emptied) drop_empty_heaps();  // the heap (and its backend) need not wait for the state
  return 0;                         // stays in the heap until a trim
}

}  // namespace refpool::detail
