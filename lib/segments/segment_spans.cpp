// segment_heap spans (span.hpp): ranges one owner holds for a long time (a plan arena). Placed as
// pieces are, pinned while held, yielded to the free ranges when idle and their pool would
// otherwise grow, and placed again at their home address when held again, committing whatever
// trim decommitted there meanwhile (docs/segments.md, "One memory space").
#include <algorithm>
#include <cassert>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "range_list.hpp"
#include "segment_heap.hpp"
#include "size_math.hpp"

namespace refpool::detail {

std::optional<segment_heap::span_carved> segment_heap::carve_span(std::size_t bytes, stream_ref stream) {
  const std::size_t n = piece_bytes(bytes);
  pool_state& pool = pool_for(n);
  spans_.records.reserve(spans_.records.size() + 1);  // records first: nothing below throws once the piece is taken
  auto made = std::make_unique<segment_span>();
  prepare_carve(pool);
  const auto c = carve_rounded(pool, n, stream, placement::anywhere, true);
  if (!c) return std::nullopt;
  made->id = spans_.next_id++;
  place_span(*made, *c);
  spans_.records.push_back(std::move(made));  // within the reserved capacity
  return span_carved{spans_.records.back().get(), c->waits};
}

void segment_heap::place_span(segment_span& s, const carved& c) noexcept {
  range* r = c.p.node;
  r->span = true;
  totals_.spanned += r->bytes;
  s.node = r;
  s.home = r->address;
  s.bytes = r->bytes;
  s.now = segment_span::state::held;
  s.used_on.clear();
}

void segment_heap::idle_span(segment_span& s, const stream_set& used_on) noexcept {
  assert(s.now == segment_span::state::held);
  s.now = segment_span::state::idle;
  s.used_on = used_on;
  s.idle_since = ++tick_;
}

std::optional<span_hold> segment_heap::hold_span(segment_span& s, stream_ref stream) {
  if (s.now == segment_span::state::held) return span_hold{};
  if (s.now == segment_span::state::idle) {
    span_hold h{false, s.used_on.without(stream)};
    s.now = segment_span::state::held;
    s.used_on.clear();
    return h;
  }
  // Yielded: home again when nothing else took the bytes there, so its owner's addresses stay.
  pool_state& pool = pool_for(s.bytes);
  const pool_id id = s.bytes <= options_.small_max ? pool_id::small : pool_id::large;
  prepare_carve(pool);
  std::optional<carved> c;
  if (segment* seg = segment_of(s.home); seg != nullptr && seg->pool == id) c = carve_at(*seg, s.home, s.bytes, stream);
  const bool moved = !c;
  if (moved) c = carve_rounded(pool, s.bytes, stream, placement::anywhere, true);
  if (!c) return std::nullopt;
  place_span(s, *c);
  ++(moved ? events_.span_moves : events_.span_returns);
  return span_hold{moved, c->waits};
}

std::optional<stream_set> segment_heap::extend_span(segment_span& s, std::size_t bytes, stream_ref stream) {
  assert(s.now == segment_span::state::held);
  const std::size_t n = piece_bytes(bytes);
  if (n <= s.bytes) return stream_set{};
  range* r = s.node;
  segment& seg = *r->owner;
  if (&pool_for(n) != &pools_[static_cast<std::size_t>(seg.pool)]) return std::nullopt;  // another size class
  prepare_carve(pools_[static_cast<std::size_t>(seg.pool)]);
  const auto c = carve_at(seg, r->end(), n - s.bytes, stream);
  if (!c) return std::nullopt;
  range* more = c->p.node;  // the piece right after the span: it joins it
  assert(more->prev == r && r->end() == more->address);
  --totals_.pieces_out;
  --seg.pieces;
  totals_.spanned += more->bytes;
  r->bytes += more->bytes;
  s.bytes = r->bytes;
  unlink(seg, more);
  keep_spare(more);
  return c->waits;
}

std::size_t segment_heap::yield_span(segment_span& s) noexcept {
  assert(s.now == segment_span::state::idle);
  range* r = s.node;
  const std::size_t bytes = r->bytes;
  totals_.spanned -= bytes;
  s.node = nullptr;
  s.now = segment_span::state::yielded;
  ++events_.span_yields;
  r->span = false;
  --totals_.pieces_out;
  free_range(r, s.used_on);
  s.used_on.clear();
  return bytes;
}

std::optional<segment_heap::fit> segment_heap::yield_until_fit(pool_state& pool, std::size_t bytes,
                                                               placement where) noexcept {
  for (;;) {
    segment_span* oldest = nullptr;
    for (const auto& s : spans_.records)
      if (s->now == segment_span::state::idle && &pools_[static_cast<std::size_t>(s->node->owner->pool)] == &pool &&
          (oldest == nullptr || s->idle_since < oldest->idle_since))
        oldest = s.get();
    if (oldest == nullptr) return std::nullopt;
    yield_span(*oldest);
    if (const auto f = find_fit(pool, bytes, where)) return f;
  }
}

std::size_t segment_heap::yield_idle_spans() noexcept {
  std::size_t bytes = 0;
  for (const auto& s : spans_.records)
    if (s->now == segment_span::state::idle) bytes += yield_span(*s);
  return bytes;
}

void segment_heap::give_back_span(segment_span* s, const stream_set& used_on) noexcept {
  if (s->node != nullptr) {
    totals_.spanned -= s->node->bytes;
    s->node->span = false;
    --totals_.pieces_out;
    free_range(s->node, used_on);
  }
  const auto it =
      std::find_if(spans_.records.begin(), spans_.records.end(), [&](const auto& p) { return p.get() == s; });
  assert(it != spans_.records.end());
  spans_.records.erase(it);
}

std::size_t segment_heap::placed_spans() const noexcept {
  return static_cast<std::size_t>(
      std::count_if(spans_.records.begin(), spans_.records.end(), [](const auto& s) { return s->placed(); }));
}

std::vector<const segment_span*> segment_heap::spans() const {
  std::vector<const segment_span*> out;
  for (const auto& s : spans_.records) out.push_back(s.get());
  return out;
}

segment* segment_heap::segment_of(std::uintptr_t address) const noexcept {
  for (const auto& seg : segments_)
    if (address >= seg->base && address - seg->base < seg->reserved) return seg.get();
  return nullptr;
}

// ---- placing at an address --------------------------------------------------------------------

segment* segment_heap::segment_for_piece_at(std::uintptr_t address, std::size_t n) const noexcept {
  segment* seg = segment_of(address);
  if (seg == nullptr) return nullptr;
  const pool_id id = n <= options_.small_max ? pool_id::small : pool_id::large;
  const std::uintptr_t end = address + n;
  // Pieces start at multiples of the piece unit from their segment's base, and lie in one segment.
  if (seg->pool != id || (address - seg->base) % granule_ != 0 || end < address || end > seg->base + seg->reserved)
    return nullptr;
  return seg;
}

std::optional<std::vector<segment_heap::in_use>> segment_heap::in_use_over(std::uintptr_t address,
                                                                           std::size_t bytes) const {
  const std::size_t n = piece_bytes(bytes);
  const segment* seg = segment_for_piece_at(address, n);
  if (seg == nullptr) return std::nullopt;
  std::vector<in_use> out;
  for (range* r = seg->first; r != nullptr && r->address < address + n; r = r->next)
    if (!r->free && r->end() > address) out.push_back({r, r->address, r->bytes, r->span});
  return out;
}

std::optional<segment_heap::carved> segment_heap::carve_exact(std::uintptr_t address, std::size_t bytes,
                                                              stream_ref stream) {
  const std::size_t n = piece_bytes(bytes);
  segment* seg = segment_for_piece_at(address, n);
  if (seg == nullptr) return std::nullopt;
  prepare_carve(pools_[static_cast<std::size_t>(seg->pool)]);
  return carve_at(*seg, address, n, stream);
}

std::optional<segment_heap::carved> segment_heap::carve_at(segment& seg, std::uintptr_t address, std::size_t bytes,
                                                           stream_ref stream) {
  const std::uintptr_t end = address + bytes;
  if (address < seg.base || end < address || end > seg.base + seg.reserved) return std::nullopt;
  // Every range over [address, end) must be free; what lies between them is uncommitted (ranges
  // tile the committed bytes), and those holes are committed in whole granules, which stay inside
  // each hole since its ends are commit boundaries.
  std::vector<std::pair<std::size_t, std::size_t>> commits;  // (offset, bytes) from the base
  std::uintptr_t cursor = address;
  const std::size_t g = seg.virtual_memory() ? seg.vm.granularity() : 1;
  const auto hole_until = [&](std::uintptr_t to) {
    const std::size_t from = (cursor - seg.base) / g * g;
    commits.emplace_back(from, round_up(to - seg.base, g) - from);
  };
  range* r = seg.first;
  while (r != nullptr && r->end() <= address) r = r->next;
  for (; r != nullptr && r->address < end; r = r->next) {
    if (!r->free) return std::nullopt;
    if (r->address > cursor) hole_until(r->address);
    cursor = r->end();
  }
  if (cursor < end) hole_until(end);
  if (!commits.empty() && !seg.virtual_memory()) return std::nullopt;  // not reached: plain segments have no holes

  // Records before the backend is called, so that nothing after the commits can fail.
  pools_[static_cast<std::size_t>(seg.pool)].free.reserve(totals_.pieces_out + commits.size() + 3);
  std::vector<std::unique_ptr<range>> fresh(commits.size());
  for (auto& f : fresh) f = std::make_unique<range>();
  std::size_t done = 0;
  const auto undo = [&]() noexcept {
    for (std::size_t i = done; i-- > 0;) seg.vm.decommit(seg.vm.first_ending_after(commits[i].first));
  };
  try {
    while (done < commits.size() && seg.vm.commit(commits[done].first, commits[done].second)) ++done;
  } catch (...) {
    undo();
    throw;
  }
  if (done < commits.size()) {  // out of memory: as it was
    undo();
    return std::nullopt;
  }
  for (std::size_t i = 0; i < commits.size(); ++i)
    adopt_commit(seg, std::move(fresh[i]), commits[i].first, commits[i].second);
  // [address, end) lies in one free range now.
  range* whole = seg.first;
  while (whole->end() <= address) whole = whole->next;
  assert(whole->free && whole->address <= address && whole->end() >= end);
  return take(pools_[static_cast<std::size_t>(seg.pool)], fit{whole, address - whole->address}, bytes, stream);
}

void segment_heap::adopt_commit(segment& seg, std::unique_ptr<range> fresh, std::size_t offset,
                                std::size_t bytes) noexcept {
  pool_state& pool = pools_[static_cast<std::size_t>(seg.pool)];
  const std::uintptr_t at = seg.base + offset;
  range* before = nullptr;
  for (range* q = seg.first; q != nullptr && q->address < at; q = q->next) before = q;
  range* r = fresh.release();
  r->owner = &seg;
  r->address = at;
  r->bytes = bytes;
  r->free = true;
  link_after(seg, before, r);
  totals_.committed += bytes;
  ++totals_.physical;
  ++events_.grows;
  fully_trimmed_ = false;
  // New bytes carry no stream; the ranges they join keep theirs.
  pool.free.insert(join_free_neighbours(seg, pool.free, r, nullptr, [this](range* q) { keep_spare(q); }));
}

}  // namespace refpool::detail
