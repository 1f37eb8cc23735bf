// segment_heap's views for tests and its consistency check, every invariant the heap keeps verified
// from scratch. Test tooling, not part of librefpool: white-box tests link it with refpool's objects.
#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "segments/segment_heap.hpp"

namespace refpool::detail {

std::vector<segment_heap::range_view> segment_heap::ranges() const {
  std::vector<range_view> out;
  for (const auto& seg : segments_)
    for (const range* r = seg->first; r != nullptr; r = r->next)
      out.push_back(range_view{r->address, r->bytes, r->free, seg->id, r->streams});
  return out;
}

std::vector<std::pair<std::uintptr_t, std::size_t>> segment_heap::commits() const {
  std::vector<std::pair<std::uintptr_t, std::size_t>> out;
  for (const auto& seg : segments_) {
    if (!seg->virtual_memory()) out.emplace_back(seg->base, seg->reserved);
    for (const auto& c : seg->vm.commits()) out.emplace_back(seg->base + c.offset, c.bytes);
  }
  return out;
}

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::logic_error("refpool: segment heap inconsistent: " + what);
}

// The committed runs of a segment: maximal spans of contiguous commits, as offsets. Checks the
// commits on the way (granule-aligned, in the reservation, in order, apart).
std::vector<std::pair<std::size_t, std::size_t>> committed_runs(const segment& seg) {
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  if (!seg.virtual_memory()) {
    runs.emplace_back(0, seg.reserved);
    return runs;
  }
  const vm_region& vm = seg.vm;
  if (vm.base() != seg.base || vm.reserved() != seg.reserved)
    fail(fmt::format("segment {}: its reservation is not its address range", seg.id));
  std::size_t sum = 0;
  for (const auto& c : vm.commits()) {
    if (c.bytes == 0 || c.offset % vm.granularity() != 0 || c.bytes % vm.granularity() != 0 || c.end() > seg.reserved)
      fail(fmt::format("segment {}: commit [{}, +{}) is off the granule grid or outside the reservation", seg.id,
                       c.offset, c.bytes));
    if (!runs.empty() && c.offset < runs.back().second)
      fail(fmt::format("segment {}: commits overlap or are out of order at offset {}", seg.id, c.offset));
    if (!runs.empty() && c.offset == runs.back().second)
      runs.back().second = c.end();
    else
      runs.emplace_back(c.offset, c.end());
    sum += c.bytes;
  }
  if (sum != vm.committed())
    fail(fmt::format("segment {}: commits sum to {} B, counted {} B", seg.id, sum, vm.committed()));
  return runs;
}

}  // namespace

void segment_heap::check() const {
  std::size_t reserved = 0, committed = 0, used = 0, pieces = 0, physical = 0, spanned = 0, span_ranges = 0;
  std::array<std::size_t, 2> free_ranges{};
  for (const auto& seg_ptr : segments_) {
    const segment& seg = *seg_ptr;
    reserved += seg.reserved;
    committed += seg.committed();
    const auto runs = committed_runs(seg);
    if (runs.empty()) fail(fmt::format("segment {} has nothing committed", seg.id));
    physical += seg.virtual_memory() ? seg.vm.commits().size() : 1;
    if (seg.growable && pools_[static_cast<std::size_t>(seg.pool)].growable != &seg)
      fail(fmt::format("segment {} is growable but not its pool's", seg.id));
    if (fully_trimmed_ && seg.pieces == 0) fail(fmt::format("segment {} is free after a full trim", seg.id));
    // Ranges tile the runs exactly: touching within a run, the next run's start after a hole.
    std::size_t run = 0;
    std::uintptr_t expected = seg.base + runs[0].first;
    std::size_t seg_pieces = 0;
    const range* prev = nullptr;
    if (seg.first == nullptr || seg.first->prev != nullptr) fail(fmt::format("segment {}: bad first range", seg.id));
    for (const range* r = seg.first; r != nullptr; prev = r, r = r->next) {
      if (r->owner != &seg || r->prev != prev) fail(fmt::format("segment {}: broken range links", seg.id));
      if (run < runs.size() && expected == seg.base + runs[run].second && ++run < runs.size())
        expected = seg.base + runs[run].first;  // the run ended: the next range starts after the hole
      if (run == runs.size() || r->address != expected)
        fail(fmt::format("segment {}: gap, overlap or uncommitted bytes at {:#x}", seg.id, r->address));
      if (r->bytes == 0 || r->bytes % granule_ != 0 || (r->address - seg.base) % granule_ != 0 ||
          r->end() > seg.base + runs[run].second)
        fail(fmt::format("segment {}: range at {:#x} of {} B is off the {} B grid or crosses a hole", seg.id,
                         r->address, r->bytes, granule_));
      const bool indexed = pools_[static_cast<std::size_t>(seg.pool)].free.contains(const_cast<range*>(r));
      if (r->free) {
        if (prev != nullptr && prev->free && prev->end() == r->address)
          fail(fmt::format("segment {}: two free ranges touch at {:#x}", seg.id, r->address));
        if (!indexed) fail(fmt::format("segment {}: free range at {:#x} not indexed", seg.id, r->address));
        ++free_ranges[static_cast<std::size_t>(seg.pool)];
        if (fully_trimmed_ && seg.virtual_memory())
          for (const auto& c : seg.vm.commits())
            if (seg.base + c.offset >= r->address && seg.base + c.end() <= r->end())
              fail(fmt::format("segment {}: the commit at offset {} is free after a full trim", seg.id, c.offset));
      } else {
        if (indexed) fail(fmt::format("segment {}: piece at {:#x} is indexed as free", seg.id, r->address));
        used += r->bytes;
        ++seg_pieces;
        if (r->span) {
          const auto record =
              std::find_if(spans_.records.begin(), spans_.records.end(), [&](const auto& s) { return s->node == r; });
          if (record == spans_.records.end() || (*record)->home != r->address || (*record)->bytes != r->bytes)
            fail(fmt::format("segment {}: the span at {:#x} and its record disagree", seg.id, r->address));
          spanned += r->bytes;
          ++span_ranges;
        }
      }
      expected = r->end();
    }
    if (prev != seg.last) fail(fmt::format("segment {}: bad last range", seg.id));
    if (run + 1 != runs.size() || expected != seg.base + runs.back().second)
      fail(fmt::format("segment {}: ranges end at {:#x}, its commits at {:#x}", seg.id, expected,
                       seg.base + runs.back().second));
    if (seg_pieces != seg.pieces)
      fail(fmt::format("segment {}: {} pieces counted as {}", seg.id, seg_pieces, seg.pieces));
    pieces += seg_pieces;
  }
  check_spans(span_ranges);
  for (std::size_t i = 0; i < 2; ++i)
    if (pools_[i].free.size() != free_ranges[i])
      fail(fmt::format("pool {} indexes {} free ranges, segments have {}", i, pools_[i].free.size(), free_ranges[i]));
  if (reserved != totals_.reserved || committed != totals_.committed || used != totals_.used ||
      pieces != totals_.pieces_out || physical != totals_.physical || spanned != totals_.spanned)
    fail(
        fmt::format("totals: reserved {}/{}, committed {}/{}, used {}/{}, pieces and spans {}/{}, physical {}/{}, "
                    "in spans {}/{}",
                    reserved, totals_.reserved, committed, totals_.committed, used, totals_.used, pieces,
                    totals_.pieces_out, physical, totals_.physical, spanned, totals_.spanned));
}

void segment_heap::check_spans(std::size_t span_ranges) const {
  std::size_t placed = 0;
  for (const auto& s : spans_.records) {
    if (!s->placed()) {
      if (s->node != nullptr) fail(fmt::format("span {} was yielded but keeps a range", s->id));
      continue;
    }
    ++placed;
    const range* r = s->node;
    if (r == nullptr || r->free || !r->span)
      fail(fmt::format("span {} is placed but its range is not a span range of it", s->id));
    if (std::none_of(segments_.begin(), segments_.end(), [&](const auto& seg) { return seg.get() == r->owner; }))
      fail(fmt::format("span {} lies in no segment of the heap", s->id));
  }
  if (placed != span_ranges)
    fail(fmt::format("{} spans are placed, but {} ranges are spans' ranges", placed, span_ranges));
}

}  // namespace refpool::detail
