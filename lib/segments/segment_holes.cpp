// segment_heap holes: uncommitted address space of a virtual-memory segment, between commits
// (where trim decommitted free commits) or after the last one (where it has not grown yet).
// When no free range fits, growth commits into the hole that needs the smallest commit, joined
// with the free ranges that touch it, before it makes a new segment (docs/segments.md, "Holes").
#include <algorithm>
#include <cstdint>
#include <limits>

#include "range_list.hpp"
#include "segment_heap.hpp"
#include "size_math.hpp"

namespace refpool::detail {

std::size_t segment_heap::span_floor(std::size_t reserved, std::size_t granularity) noexcept {
  return reserved / 2 / granularity * granularity;
}

std::optional<segment_heap::hole> segment_heap::best_hole(pool_id id, std::size_t bytes, placement where,
                                                          bool for_span) const {
  std::optional<hole> best;
  for (const auto& seg : segments_)
    if (seg->pool == id && seg->virtual_memory()) consider_holes(*seg, bytes, where, for_span, best);
  return best;
}

void segment_heap::consider_holes(const segment& seg, std::size_t bytes, placement where, bool for_span,
                                  std::optional<hole>& best) const {
  const std::size_t g = seg.vm.granularity();
  const bool growable = pools_[static_cast<std::size_t>(seg.pool)].growable == &seg;
  const std::size_t floor = span_floor(seg.reserved, g);
  const auto consider = [&](std::size_t start, std::size_t end, range* prev, range* next) {
    // A span commits at or above the floor: a hole that starts below it is used from the floor on,
    // apart from the range before it.
    if (for_span && end <= floor) return;
    const bool clipped = for_span && start < floor;
    const std::size_t from = clipped ? floor : start;
    const std::size_t room = end - from;
    const std::size_t before = !clipped && prev != nullptr && prev->free ? prev->bytes : 0;
    const std::size_t after = next != nullptr && next->free ? next->bytes : 0;
    std::size_t at = 0;
    std::size_t need = std::numeric_limits<std::size_t>::max();
    const auto option = [&](std::size_t commit_at, std::size_t commit_bytes) {
      if (commit_bytes != 0 && commit_bytes < need) {
        need = commit_bytes;
        at = commit_at;
      }
    };
    if (where == placement::one_physical_allocation) {
      if (round_up(bytes, g) <= room) option(from, round_up(bytes, g));  // one commit holds the piece
    } else {
      // At the hole's start, joined to the free range before it; at its end, joined to the one
      // after it; or the whole hole, joining both.
      if (before + room >= bytes) option(from, round_up(bytes - std::min(bytes, before), g));
      if (after != 0 && after + room >= bytes) {
        const std::size_t c = round_up(bytes - std::min(bytes, after), g);
        option(end - c, c);
      }
      if (before + room + after >= bytes) option(from, room);
    }
    if (need == std::numeric_limits<std::size_t>::max()) return;
    // The smallest commit wins; on a tie a hole inside a segment before the growable one's tail.
    // Pieces grow by steps at the tail, and up to a span placed in the span half (only there: a
    // hole trim made across the middle of a heap without spans commits what is needed, as before).
    const bool tail =
        growable && (end == seg.reserved || (start < floor && end >= floor && next != nullptr && next->span));
    if (best && (need > best->commit_bytes || (need == best->commit_bytes && (tail || !best->growable_tail)))) return;
    best = hole{const_cast<segment*>(&seg), start, end, prev, next, at, need, tail};
  };
  const auto& commits = seg.vm.commits();
  bool contiguous = commits.front().offset == 0;
  for (std::size_t i = 1; contiguous && i < commits.size(); ++i) contiguous = commits[i - 1].end() == commits[i].offset;
  if (contiguous) {  // the common case: only the tail, after the last range
    if (commits.back().end() < seg.reserved) consider(commits.back().end(), seg.reserved, seg.last, nullptr);
    return;
  }
  // Ranges tile the committed bytes, so a hole is where two ranges in a row do not touch.
  std::uintptr_t cursor = seg.base;
  range* prev = nullptr;
  for (range* r = seg.first; r != nullptr; prev = r, r = r->next) {
    if (r->address != cursor) consider(cursor - seg.base, r->address - seg.base, prev, r);
    cursor = r->end();
  }
  if (cursor != seg.base + seg.reserved) consider(cursor - seg.base, seg.reserved, prev, nullptr);
}

range* segment_heap::fill_hole(pool_state& pool, const hole& h) {
  segment& seg = *h.seg;
  std::size_t size = h.commit_bytes;
  // The growable segment's tail grows by a step in proportion to the segment (growth_divisor),
  // where the reservation has room for it; a hole inside a segment by what the piece needs.
  const std::size_t g = seg.vm.granularity();
  const std::size_t usual =
      h.growable_tail ? round_up(std::min(seg.committed() / options_.growth_divisor, options_.max_growth_step), g) : 0;
  if (usual > size && h.commit_at + usual <= h.end) size = usual;
  range* before = h.prev != nullptr && h.prev->free && h.commit_at == h.start ? h.prev : nullptr;
  std::unique_ptr<range> fresh = before == nullptr ? std::make_unique<range>() : nullptr;
  if (!seg.vm.commit(h.commit_at, size)) {
    // Near the device's limit the step may not fit where the request does: commit what it needs.
    if (size == h.commit_bytes || !seg.vm.commit(h.commit_at, h.commit_bytes)) return nullptr;
    size = h.commit_bytes;
  }

  // Committed: nothing below allocates or throws. The new bytes carry no stream; the free
  // ranges they join keep theirs.
  totals_.committed += size;
  ++totals_.physical;
  ++events_.grows;
  range* r = before;
  if (r != nullptr) {
    pool.free.erase(r);
    r->bytes += size;
  } else {
    r = fresh.release();
    r->owner = &seg;
    r->address = seg.base + h.commit_at;
    r->bytes = size;
    r->free = true;
    link_after(seg, h.prev, r);
  }
  if (range* after = h.next; after != nullptr && after->free && h.commit_at + size == h.end) {
    pool.free.erase(after);
    r->bytes += after->bytes;
    r->streams.merge(after->streams);
    unlink(seg, after);
    keep_spare(after);
  }
  pool.free.insert(r);
  return r;
}

}  // namespace refpool::detail
