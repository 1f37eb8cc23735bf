// Spans through the segment source (segment_source.hpp, "spans"; docs/segments.md, "One memory
// space"): what plan arenas are. A backend's spans live in the heap its pieces come from; a backend
// this cache keeps plain blocks for gets a heap of spans alone, whose options give each span a
// segment of its own (one backend allocation of its size rounded to the piece unit).
#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "cache/cache_state.hpp"
#include "cache/segment_source.hpp"

namespace refpool::detail {

namespace {

/// A heap of spans alone: no virtual memory, and every span (small or large) a segment of its own
/// size rounded to the unit, so that a span's memory is what an arena's was, one allocation.
segment_heap_options spans_alone(std::size_t alignment) {
  segment_heap_options o;
  o.use_virtual_memory = false;
  const std::size_t unit = std::max(o.piece_granularity, alignment);
  o.small_max = unit;
  o.small_segment = unit;
  o.large_segment = unit;
  o.segment_rounding = unit;
  return o;
}

}  // namespace

std::optional<segment_heap_options> segment_source::heap_options(const backend_state& backend) const {
  if (piece_unit(backend, cache_.segments()) != 1) return segment_heap_options{};
  segment_heap_options o = spans_alone(backend.alignment());
  if (choose_piece_unit(backend.alignment(), o).unit == 0) return std::nullopt;
  return o;
}

std::optional<heap_use> segment_source::find_heap(const backend_state& backend) {
  std::lock_guard guard(mutex_);
  for (const auto& h : heaps_) {
    if (h->backend != &backend) continue;
    h->users.fetch_add(1, std::memory_order_relaxed);
    return heap_use(*h);
  }
  return std::nullopt;
}

std::optional<segment_span*> segment_source::carve_span(backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (!heap_options(backend)) return std::nullopt;
  heap_use h = use_heap(backend);
  std::size_t freed = 0;
  const auto c = cache_.retry_once(backend, freed, [&] {
    std::lock_guard lock(h->mutex);
    const committed_change change(reserved_, *h);
    auto made = h->heap.carve_span(bytes, stream);
    if (made) made->span->owner_tag = &*h;  // its heap outlives it (a heap with a span is never dropped)
    return made;
  });
  if (!c) return std::nullopt;
  try {
    wait_for_piece(*h, c->waits, stream);
  } catch (...) {
    stream_set used = c->waits;  // some waits may have been enqueued: keep every stream
    used.add(stream);
    std::lock_guard lock(h->mutex);
    h->heap.give_back_span(c->span, used);
    throw;
  }
  return c->span;
}

void segment_source::idle_span(backend_state&, segment_span& s, const stream_set& used_on) noexcept {
  cache_heap& h = heap_of(s);
  std::lock_guard lock(h.mutex);
  h.heap.idle_span(s, used_on);
}

std::optional<bool> segment_source::hold_span(backend_state& backend, segment_span& s, stream_ref stream) {
  cache_heap* h = &heap_of(s);
  std::optional<span_hold> held;
  {  // idle (or held): held at once, no backend call
    std::lock_guard lock(h->mutex);
    if (s.placed()) held = h->heap.hold_span(s, stream);
  }
  if (!held) {
    // Yielded: the cache's idle pieces of the backend go back to the heap first, without a trim,
    // so that its home is free again and the heap's committed bytes stay for it. Not where the
    // cache keeps whole blocks: they are no bytes of this heap, and would only go to the backend.
    if (piece_unit(backend, cache_.segments()) != 1) cache_.return_idle(backend);
    std::size_t freed = 0;
    held = cache_.retry_once(backend, freed, [&] {
      std::lock_guard lock(h->mutex);
      const committed_change change(reserved_, *h);
      return h->heap.hold_span(s, stream);  // home again commits its holes: committed bytes change
    });
  }
  if (!held) return std::nullopt;
  try {
    wait_for_piece(*h, held->waits, stream);
  } catch (...) {
    stream_set used = held->waits;
    used.add(stream);
    std::lock_guard lock(h->mutex);
    h->heap.idle_span(s, used);  // not held after all: idle with every stream its bytes may see
    throw;
  }
  return held->moved;
}

bool segment_source::extend_span(backend_state&, segment_span& s, std::size_t bytes, stream_ref stream) {
  cache_heap* h = &heap_of(s);
  std::optional<stream_set> waits;
  {
    std::lock_guard lock(h->mutex);
    const committed_change change(reserved_, *h);
    waits = h->heap.extend_span(s, bytes, stream);
  }
  if (!waits) return false;
  // A failed wait leaves it extended: its holder still holds every byte, and gives them back with
  // its own streams, which then include this one.
  wait_for_piece(*h, *waits, stream);
  return true;
}

void segment_source::give_back_span(backend_state& backend, segment_span* s, const stream_set& used_on) noexcept {
  bool emptied = false;
  {
    std::optional<heap_use> found = find_heap(backend);  // there is one: it holds `s`
    cache_heap& h = **found;
    std::lock_guard lock(h.mutex);
    const committed_change change(reserved_, h);
    h.heap.give_back_span(s, used_on);
    // Nothing carves from a closed cache's heap any more, nor pieces from a heap of spans alone
    // (a span there is one backend allocation, as an arena was): its free memory goes now.
    const bool spans_alone = piece_unit(backend, cache_.segments()) == 1;
    if (cache_.closed() || spans_alone) {
      try {
        free_or_trim(h.heap);
      } catch (const std::exception& e) {
        fmt::print(stderr, "refpool: giving back the segments of {} failed: {}\n", backend.res().name(), e.what());
      }
      emptied = h.heap.stats().segments == 0 && h.heap.stats().spans == 0;
    }
  }
  if (emptied) drop_empty_heaps();
}

std::size_t segment_source::yield_idle_spans(const backend_state& backend) noexcept {
  std::optional<heap_use> h = find_heap(backend);
  if (!h) return 0;
  std::lock_guard lock((*h)->mutex);
  return (*h)->heap.yield_idle_spans();
}

segment_heap_events segment_source::span_events() const {
  std::lock_guard guard(mutex_);
  segment_heap_events events = dropped_heap_counts_;
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    events += h->heap.stats().events;
  }
  return events;
}

}  // namespace refpool::detail
