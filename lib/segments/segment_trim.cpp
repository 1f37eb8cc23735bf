// segment_heap trim: whole free segments go back to the backend (deallocated, or decommitted
// and released), then every commit that lies entirely in a free range is decommitted, wherever
// it is in its segment, leaving an uncommitted hole that growth may commit again.
#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "access.hpp"
#include "backend_state.hpp"
#include "poison.hpp"
#include "range_list.hpp"
#include "segment_heap.hpp"

namespace refpool::detail {

std::size_t segment_heap::trim(std::size_t keep_bytes) {
  std::size_t given = 0;
  while (totals_.committed - totals_.used > keep_bytes) {
    segment* whole = nullptr;
    for (const auto& seg : segments_)
      if (seg->pieces == 0 && (whole == nullptr || seg->last_use < whole->last_use)) whole = seg.get();
    if (whole == nullptr) break;
    given += free_segment(*whole);
  }
  if (totals_.committed - totals_.used > keep_bytes) given += decommit_free_commits(keep_bytes);
  // Either it met `keep_bytes`, or nothing it could give back is left (check() verifies that).
  fully_trimmed_ = keep_bytes == 0 || totals_.committed - totals_.used > keep_bytes;
  return given;
}

std::size_t segment_heap::decommit_free_commits(std::size_t keep_bytes) {
  if (vm_ == nullptr) return 0;
  // Only a free range of a granule or more can hold a whole commit.
  std::vector<range*> candidates;
  for (const pool_state& pool : pools_)
    for (auto it = pool.free.lower_bound(vm_->granularity()); it != pool.free.end(); ++it)
      if ((*it)->owner->virtual_memory()) candidates.push_back(*it);
  // The least recently used segment first, and in it the highest address first (the lower
  // addresses, which best fit prefers, stay committed longest).
  std::sort(candidates.begin(), candidates.end(), [](const range* a, const range* b) {
    return a->owner->last_use != b->owner->last_use ? a->owner->last_use < b->owner->last_use : a->address > b->address;
  });
  std::size_t given = 0;
  for (range* r : candidates) {
    if (totals_.committed - totals_.used <= keep_bytes) break;
    given += decommit_inside(*r, keep_bytes);
  }
  return given;
}

std::size_t segment_heap::decommit_inside(range& r, std::size_t keep_bytes) {
  segment& seg = *r.owner;
  const std::size_t start = r.address - seg.base;
  const std::size_t end = start + r.bytes;
  const auto& commits = seg.vm.commits();
  // The commits inside [start, end): consecutive, since a range lies in one run of commits.
  std::size_t first = seg.vm.first_ending_after(start);
  if (first < commits.size() && commits[first].offset < start) ++first;
  std::size_t last = first;
  while (last < commits.size() && commits[last].end() <= end) ++last;
  if (first == last) return 0;
  // Records first, so that nothing below can fail: the part after the hole may need a range.
  free_index& index = pools_[static_cast<std::size_t>(seg.pool)].free;
  index.reserve(2);
  auto rest = std::make_unique<range>();

  index.erase(&r);
  const std::size_t hole_end = commits[last - 1].end();
  std::size_t hole_start = hole_end;
  std::size_t given = 0;
  for (std::size_t i = last; i-- > first && totals_.committed - totals_.used > keep_bytes;) {
    const vm_region::commit_record c = commits[i];
    if (host_visible_) unpoison_bytes(seg.base + c.offset, c.bytes);  // the next mapping reuses them
    seg.vm.decommit(i);                                               // one physical allocation, whole
    hole_start = c.offset;
    totals_.committed -= c.bytes;
    given += c.bytes;
    --totals_.physical;
    ++events_.decommits;
    events_.trimmed_bytes += c.bytes;
  }
  if (given == 0) {  // the caller saw bytes to give back: not reached
    index.insert(&r);
    return 0;
  }
  // Decommitted bytes have no work in flight (decommit waits for it); what is left keeps the
  // range's streams.
  const bool keeps_before = hole_start > start;
  const bool keeps_after = hole_end < end;
  if (keeps_after) {
    range* after = &r;
    if (keeps_before) {
      after = rest.release();
      after->owner = &seg;
      after->free = true;
      after->streams = r.streams;
      link_after(seg, &r, after);
    }
    after->address = seg.base + hole_end;
    after->bytes = end - hole_end;
    index.insert(after);
  }
  if (keeps_before) {
    r.bytes = hole_start - start;
    index.insert(&r);
  }
  if (!keeps_before && !keeps_after) {
    unlink(seg, &r);
    keep_spare(&r);
  }
  return given;
}

void segment_heap::free_all() {
  if (totals_.pieces_out != 0 || !spans_.records.empty())
    throw invalid_argument(fmt::format(
        "refpool: cannot free the segments of {}: {} pieces ({} B) and {} spans ({} B placed) are still out",
        backend_.name(), totals_.pieces_out - placed_spans(), totals_.used - totals_.spanned, spans_.records.size(),
        totals_.spanned));
  while (!segments_.empty()) free_segment(*segments_.back());
}

std::size_t segment_heap::free_segment(segment& seg) {
  range* r = seg.first;  // the only range: the segment has no piece, and free neighbours merge
  stream_ref last_stream{};
  // A stream-ordered free (cuMemFreeAsync) waits for its own stream only.
  if (!seg.virtual_memory()) {
    resource& res = backend_.underlying();
    if (r->streams.any()) {
      res.synchronize();  // its users are no longer known: the whole device, then the default stream
    } else if (!r->streams.empty()) {
      last_stream = *r->streams.begin();  // freed on one of its streams, after the others
      for (const stream_ref s : r->streams)
        if (!(s == last_stream)) res.order_streams(s, last_stream);
    }
  }
  const std::size_t bytes = seg.committed();
  // A free segment may still have holes: every range it has is free, and none touch.
  for (range* q = seg.first; q != nullptr; q = q->next) {
    pools_[static_cast<std::size_t>(seg.pool)].free.erase(q);
    if (host_visible_) unpoison_bytes(q->address, q->bytes);  // the backend (or a later mapping) reuses them
  }
  if (seg.virtual_memory()) {
    // Each commit goes whole (a GPU unmaps whole mappings), then the reservation.
    const std::size_t commits = seg.vm.commits().size();
    seg.vm.free_reservation();
    totals_.physical -= commits;
    events_.decommits += commits;
    // Address space came back: a refused size may fit now (one refused call if it still does not).
    reservation_ = full_reservation();
  } else {
    access::state(backend_)->deallocate(reinterpret_cast<void*>(seg.base), seg.reserved, last_stream);
    --totals_.physical;
    ++events_.plain_frees;
  }
  totals_.committed -= bytes;
  totals_.reserved -= seg.reserved;
  events_.trimmed_bytes += bytes;
  ++events_.segments_freed;
  drop_segment(seg);
  return bytes;
}

void segment_heap::drop_segment(segment& seg) noexcept {
  for (range* r = seg.first; r != nullptr;) {
    range* next = r->next;
    delete r;
    r = next;
  }
  pool_state& pool = pools_[static_cast<std::size_t>(seg.pool)];
  if (pool.growable == &seg) pool.growable = nullptr;
  for (auto it = segments_.begin(); it != segments_.end(); ++it)
    if (it->get() == &seg) {
      segments_.erase(it);
      break;
    }
}

}  // namespace refpool::detail
