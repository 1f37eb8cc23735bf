// The cache's segment paths (docs/design.md, "Segments"). On a miss for a backend with segments
// the cache carves a piece from the backend's segment heap instead of allocating a block: from
// free ranges, after giving idle pieces of the request's pool back to the heap (first for large
// requests, when free ranges fail for small ones), then by growing the heap, and last after
// giving back everything idle and trimming. Every piece is a cached block with its own count; only where its memory
// comes from and goes back to differs. Locks: cache_heap.hpp.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "cache/cache_state.hpp"

namespace refpool::detail {

namespace {

/// The idle pieces of `h` in `s` that could make room for a piece of `bytes`: those of its
/// pool (pieces of the other pool never coalesce with it). Caller holds `s`.
void collect_idle(const slot& s, const cache_heap& h, std::size_t bytes, std::vector<block*>& out) {
  const piece_list* list = s.find_pieces(h.backend, h.heap.small(bytes));
  if (list == nullptr || list->count == 0) return;
  out.reserve(out.size() + list->count);
  for (block* b = list->first; b != nullptr; b = b->idle_piece_next) out.push_back(b);
}

}  // namespace

void cache_state::throw_piece_rounding_overflow(std::size_t bytes, std::size_t unit) {
  throw size_error(fmt::format("refpool: a request rounded to {} B cannot be rounded up to the segment piece unit "
                               "of {} B without overflowing size_t",
                               bytes, unit));
}

// ---- heaps --------------------------------------------------------------------------------

heap_use cache_state::use_heap(backend_state& backend) {
  std::lock_guard guard(mutex_);
  cache_heap* found = nullptr;
  for (const auto& h : heaps_) {
    if (h->backend == &backend) {
      found = h.get();
      break;
    }
  }
  if (found == nullptr) {
    heaps_.reserve(heaps_.size() + 1);
    heaps_.push_back(std::make_unique<cache_heap>(backend));
    found = heaps_.back().get();
  }
  found->users.fetch_add(1, std::memory_order_relaxed);
  return heap_use(*found);
}

std::vector<heap_use> cache_state::use_heaps_locked(const backend_state* only) {
  std::vector<heap_use> out;
  out.reserve(heaps_.size());
  for (const auto& h : heaps_) {
    if (only != nullptr && h->backend != only) continue;
    h->users.fetch_add(1, std::memory_order_relaxed);
    out.emplace_back(*h);
  }
  return out;
}

std::vector<std::unique_ptr<cache_heap>> cache_state::drop_empty_heaps_locked() noexcept {
  std::vector<std::unique_ptr<cache_heap>> dropped;
  // After close() heaps stay until the cache's state goes (pieces still out come back to them).
  if (closed()) return dropped;
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
      empty = st.segments == 0 && st.pieces_out == 0;
      if (empty) {
        dropped_heap_counts_.segments_made += st.segments_made;
        dropped_heap_counts_.grows += st.grows;
        dropped_heap_counts_.splits += st.splits;
        dropped_heap_counts_.merges += st.merges;
      }
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

std::size_t cache_state::trim_heaps(const std::vector<heap_use>& heaps, std::size_t keep, bool quiet) {
  std::size_t given = 0;
  std::size_t allowance = keep;
  for (const heap_use& h : heaps) {
    std::lock_guard lock(h->mutex);
    const committed_change change(*this, *h);
    try {
      given += h->heap.trim(allowance);
    } catch (const std::exception& e) {
      if (!quiet) throw;
      fmt::print(stderr, "refpool: trimming the segments of {} failed: {}\n", h->backend->res().name(), e.what());
    }
    allowance -= std::min(allowance, h->heap.stats().free_bytes);
  }
  return given;
}

void cache_state::close_heaps() noexcept {
  std::vector<heap_use> heaps;
  try {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked();
  } catch (...) {
    return;  // out of host memory: the heaps give their memory back when the state goes
  }
  for (const heap_use& h : heaps) {
    std::lock_guard lock(h->mutex);
    const committed_change change(*this, *h);
    try {
      if (h->heap.stats().pieces_out == 0)
        h->heap.release_all();
      else
        h->heap.trim(0);  // the rest goes with the last piece (free_to_backend)
    } catch (const std::exception& e) {
      fmt::print(stderr, "refpool: giving back the segments of {} failed: {}\n", h->backend->res().name(), e.what());
    }
  }
}

void cache_state::add_segment_counters(cache_stats& out) const {
  segment_heap_stats events = dropped_heap_counts_;
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    const segment_heap_stats st = h->heap.stats();
    out.segments += st.segments;
    out.segment_bytes += st.committed_bytes;
    out.segment_free_bytes += st.free_bytes;
    events.segments_made += st.segments_made;
    events.grows += st.grows;
    events.splits += st.splits;
    events.merges += st.merges;
  }
  out.segment_grows = events.segments_made + events.grows;
  out.splits = events.splits;
  out.merges = events.merges;
}

// ---- a miss -------------------------------------------------------------------------------

block* cache_state::allocate_piece(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                                   stream_ref stream) {
  heap_use h = use_heap(backend);
  std::unique_ptr<block> made(h->new_block());  // before carving, so a bad_alloc leaves the heap alone
  const segment_heap::carved c = carve_piece(s, *h, key.bytes, requested, stream);
  assert(c.p.bytes == key.bytes);  // keys are rounded to the piece unit: every block of a key has its size
  const auto give_up = [&]() noexcept {
    stream_set used = c.waits;  // some waits may have been enqueued: keep every stream
    used.add(stream);
    std::lock_guard lock(h->mutex);
    h->heap.give_back(c.p, used);
  };
  try {
    wait_for_piece(*h, c.waits, stream);
  } catch (...) {
    give_up();
    throw;
  }
  made->heap = &*h;
  made->piece = c.p;
  try {
    home_new_block(s, backend, key, made.get(), c.p.address, stream, !c.waits.empty());
  } catch (...) {
    give_up();
    throw;
  }
  backend.retain();
  count_held(key.bytes);
  return made.release();
}

segment_heap::carved cache_state::carve_piece(slot& s, cache_heap& h, std::size_t bytes, std::size_t requested,
                                              stream_ref stream) {
  // Large pieces hold most bytes, and an idle one pins its place: give them all back first, so
  // the piece goes where best fit over everything reusable puts it (as if released pieces had
  // coalesced at once). Small ones stay cached until free ranges run out.
  const bool large = !h.heap.small(bytes);
  if (large) give_back_idle_pieces(s, h, bytes);
  {  // a free range that holds it
    std::lock_guard lock(h.mutex);
    if (auto c = h.heap.carve_free(bytes, stream)) return *c;
  }
  if (!large && give_back_idle_pieces(s, h, bytes) != 0) {
    std::lock_guard lock(h.mutex);
    if (auto c = h.heap.carve_free(bytes, stream)) return *c;
  }
  {  // grow (a driver call)
    std::lock_guard lock(h.mutex);
    const committed_change change(*this, h);
    if (auto c = h.heap.carve(bytes, stream)) return *c;
  }
  // Out of memory: everything idle of this backend back, the heap trimmed to nothing, once more.
  const std::size_t freed = reclaim_for_retry(*h.backend);
  segment_heap_stats st;
  {
    std::lock_guard lock(h.mutex);
    const committed_change change(*this, h);
    if (auto c = h.heap.carve(bytes, stream)) return *c;
    st = h.heap.stats();
  }
  ooms_.fetch_add(1, std::memory_order_relaxed);
  const cache_stats now = stats();
  backend_state& backend = *h.backend;
  throw out_of_memory(
      fmt::format("refpool: out of memory: {} could not allocate {} B (request {} B) on device {}, even after "
                  "reclaiming {} B of idle cache; its segments hold {} B in {} segments, {} B of it free (largest "
                  "free range {} B) and {} B in {} pieces; the cache now holds {} B live in {} blocks and {} B "
                  "idle; the backend has {} B outstanding",
                  backend.res().name(), bytes, requested, backend.device(), freed, st.committed_bytes, st.segments,
                  st.free_bytes, st.largest_free_bytes, st.used_bytes, st.pieces_out, now.live_bytes,
                  now.live_blocks, now.idle_bytes, backend.outstanding_bytes.load()),
      bytes, backend.device());
}

std::size_t cache_state::give_back_idle_pieces(slot& s, cache_heap& h, std::size_t bytes) {
  std::lock_guard guard(mutex_);  // no intruder touches our slot while we take from it
  std::vector<block*>& pieces = giving_back_;  // keeps its capacity from miss to miss
  pieces.clear();
  {
    // Our own slot first: its owner needs no barrier.
    owner_section section(s.lock);
    collect_idle(s, h, bytes, pieces);  // may throw bad_alloc: nothing taken yet
    detach_idle(s, pieces, 0);
  }
  std::size_t given = return_pieces(h, pieces);
  if (slots_.size() == 1) return given;
  // Then the other slots', as an intruder: all of them with one barrier.
  pieces.clear();
  intrude_all();
  try {
    for (const auto& other : slots_) {
      if (other.get() == &s) continue;
      const std::size_t from = pieces.size();
      collect_idle(*other, h, bytes, pieces);
      detach_idle(*other, pieces, from);
    }
  } catch (...) {
    leave_all();
    given += return_pieces(h, pieces);  // those taken before the list could grow no more
    return given;
  }
  leave_all();
  return given + return_pieces(h, pieces);
}

void cache_state::detach_idle(slot& s, const std::vector<block*>& pieces, std::size_t from) noexcept {
  for (std::size_t i = from; i < pieces.size(); ++i) {
    block* b = pieces[i];
    bucket& home = *b->home;
    home.remove(b);
    remove_idle(s, b);
    s.erase_if_unused(home);  // a bucket per size ever seen would make every later scan slower
    s.refs.fetch_sub(1, std::memory_order_relaxed);  // it leaves; never the last: the cache is open
  }
}

std::size_t cache_state::return_pieces(cache_heap& h, const std::vector<block*>& pieces) noexcept {
  if (pieces.empty()) return 0;
  std::size_t bytes = 0;
  {
    // The order does not matter: free neighbours join whichever comes back first.
    std::lock_guard lock(h.mutex);
    for (block* b : pieces) {
      assert(b->heap == &h);
      h.heap.give_back(b->piece, streams_of(*b));
      bytes += b->capacity;
      b->backend->release();  // never the last reference: the heap holds one
      h.retire_block(b);
    }
  }
  held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return pieces.size();
}

void cache_state::wait_for_piece(cache_heap& h, const stream_set& waits, stream_ref stream) {
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

// ---- tests --------------------------------------------------------------------------------

void cache_state::check_segments() const {
  auto& self = const_cast<cache_state&>(*this);  // holding slots drains their hand-off lists
  std::lock_guard guard(mutex_);
  std::size_t in_blocks = 0;
  std::size_t idle_pieces = 0;
  self.intrude_all();
  const auto fail = [&](std::string what) {
    self.leave_all();
    throw std::logic_error(std::move(what));
  };
  for (const auto& s : slots_) {
    // Every idle piece is listed exactly once, in its bucket's piece list.
    std::size_t listed = 0;
    for (const auto& list : s->piece_lists) {
      std::size_t n = 0;
      for (const block* b = list->first; b != nullptr; b = b->idle_piece_next, ++n)
        if (!b->idle || b->home->pieces != list.get() || b->home->owner != s.get() ||
            (b->idle_piece_next != nullptr && b->idle_piece_next->idle_piece_prev != b))
          fail(fmt::format("refpool: block at {} is in the wrong idle piece list", b->ptr));
      if (n != list->count) fail(fmt::format("refpool: an idle piece list counts {} of its {} blocks", list->count, n));
      listed += n;
    }
    const std::size_t idle_before = idle_pieces;
    s->buckets.for_each([&](const bucket& bk) {
      const bool segmented = bk.key.backend->piece_unit(segments_) != 1;
      if ((bk.pieces != nullptr) != segmented)
        fail(fmt::format("refpool: the bucket of {} B has the wrong piece list", bk.key.bytes));
      if (!segmented) return;
      in_blocks += (bk.live + bk.idle.size()) * bk.key.bytes;
      for (const block* b : bk.idle) {
        if (b->heap == nullptr || b->piece.bytes != b->capacity || b->piece.address != b->ptr)
          fail(fmt::format("refpool: idle block at {} of {} B is no piece of its heap", b->ptr, b->capacity));
        if (b->heap->heap.small(b->capacity) != bk.pieces->small)
          fail(fmt::format("refpool: idle piece at {} of {} B is listed in the wrong pool", b->ptr, b->capacity));
        ++idle_pieces;
      }
    });
    if (listed != idle_pieces - idle_before)
      fail(fmt::format("refpool: idle piece lists hold {} blocks, their buckets {}", listed, idle_pieces - idle_before));
  }
  self.leave_all();
  std::size_t in_heaps = 0;
  std::size_t pieces_out = 0;
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    h->heap.check();
    const segment_heap_stats st = h->heap.stats();
    in_heaps += st.used_bytes;
    pieces_out += st.pieces_out;
  }
  // Before close every piece out is a block of a slot; after it, orphaned slots' live blocks
  // are no longer listed, so only the inequality holds.
  const bool exact = !closed();
  if ((exact && in_heaps != in_blocks) || in_heaps < in_blocks || pieces_out < idle_pieces)
    throw std::logic_error(fmt::format("refpool: segment heaps have {} B in {} pieces out, the cache's blocks of "
                                       "segmented backends {} B ({} idle pieces)",
                                       in_heaps, pieces_out, in_blocks, idle_pieces));
}

}  // namespace refpool::detail
