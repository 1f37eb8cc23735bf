// segment_heap growth: when no free range fits, commit into a hole of a virtual-memory segment
// (segment_holes.cpp), or make a new segment: a reservation, or a backend allocation where the
// backend has no virtual memory or refuses the address space. Each path gets everything it
// needs before calling the backend, so a failure (nullptr, false or an exception) changes
// nothing.
#include <algorithm>
#include <cstdint>

#include <refpool/error.hpp>

#include "access.hpp"
#include "backend_state.hpp"
#include "segment_heap.hpp"
#include "size_math.hpp"

namespace refpool::detail {

namespace {

// Without virtual memory: the size of a new segment for a request of `bytes` (a piece size).
std::size_t plain_segment_bytes(const segment_heap_options& o, pool_id id, std::size_t bytes) {
  if (id == pool_id::small) return o.small_segment;
  return bytes < o.large_segment / 2 ? o.large_segment
                                     : checked_round_up(bytes, o.segment_rounding, "segment rounding");
}

}  // namespace

range* segment_heap::grow(pool_state& pool, pool_id id, std::size_t bytes, placement where, stream_ref stream,
                          bool for_span) {
  fully_trimmed_ = false;
  if (vm_ == nullptr) return new_plain_segment(pool, id, plain_segment_bytes(options_, id, bytes), stream);
  const std::size_t whole = checked_round_up(bytes, vm_->granularity(), "virtual memory granularity");
  if (bytes >= options_.own_segment_min) {
    const vm_growth g = new_vm_segment(pool, id, whole, whole, false);
    if (!g.no_address_space) return g.grown;
    return new_plain_segment(pool, id, plain_segment_bytes(options_, id, bytes), stream);
  }
  // null: out of memory. A span takes a hole below the floor only when none above fits.
  if (for_span)
    if (const auto h = best_hole(id, bytes, where, true)) return fill_hole(pool, *h);
  if (const auto h = best_hole(id, bytes, where, false)) return fill_hole(pool, *h);
  return new_growable_segment(pool, id, bytes, stream, for_span);
}

range* segment_heap::new_growable_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream,
                                          bool for_span) {
  const std::size_t granularity = vm_->granularity();
  const std::size_t whole = checked_round_up(bytes, granularity, "virtual memory granularity");
  // A refused reservation is tried at half the size, down to what the request needs; the size
  // that worked is kept for the next one, so a refusal is paid for once, not at every growth.
  std::size_t size = std::max(reservation_, whole);
  for (;;) {
    const std::size_t at = for_span ? std::min(span_floor(size, granularity), size - whole) : 0;
    const vm_growth g = new_vm_segment(pool, id, size, whole, true, at);
    if (!g.no_address_space) return g.grown;
    if (size == whole) break;
    reservation_ = std::max(round_up(reservation_ / 2, granularity), granularity);
    size = std::max(reservation_, whole);
  }
  // No address space even for the request: a backend allocation, as without virtual memory.
  return new_plain_segment(pool, id, plain_segment_bytes(options_, id, bytes), stream);
}

std::size_t segment_heap::full_reservation() const noexcept {
  return round_up(std::max(options_.reserve_bytes, vm_->granularity()), vm_->granularity());
}

segment_heap::vm_growth segment_heap::new_vm_segment(pool_state& pool, pool_id id, std::size_t reserve,
                                                     std::size_t commit, bool growable, std::size_t at) {
  segments_.reserve(segments_.size() + 1);
  auto seg = std::make_unique<segment>();
  auto whole = std::make_unique<range>();
  seg->vm = vm_region::reserve(*access::state(backend_), *vm_, reserve);
  if (!seg->vm) return vm_growth{nullptr, true};
  // A failed or refused first commit releases the reservation with the segment record.
  if (!seg->vm.commit(at, commit)) return vm_growth{nullptr, false};
  seg->growable = growable;
  seg->base = seg->vm.base();
  seg->reserved = reserve;
  ++totals_.physical;
  if (growable) {
    // The old growable segment is full: it keeps serving its free ranges and holes, and trim
    // may still decommit its free commits, but it grows no more at its end by steps.
    if (pool.growable != nullptr) pool.growable->growable = false;
    pool.growable = seg.get();
  }
  return vm_growth{adopt(pool, id, std::move(seg), std::move(whole), at), false};
}

range* segment_heap::new_plain_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream) {
  segments_.reserve(segments_.size() + 1);
  auto seg = std::make_unique<segment>();
  auto whole = std::make_unique<range>();
  void* base = access::state(backend_)->allocate(bytes, stream);  // counts outstanding bytes itself
  if (base == nullptr) return nullptr;
  seg->base = reinterpret_cast<std::uintptr_t>(base);
  seg->reserved = bytes;
  ++totals_.physical;
  return adopt(pool, id, std::move(seg), std::move(whole));
}

range* segment_heap::adopt(pool_state& pool, pool_id id, std::unique_ptr<segment> seg, std::unique_ptr<range> whole,
                           std::size_t at) noexcept {
  seg->id = next_segment_id_++;
  seg->pool = id;
  seg->last_use = ++tick_;
  range* r = whole.release();
  r->owner = seg.get();
  r->address = seg->base + at;
  r->bytes = seg->committed();
  r->free = true;
  seg->first = r;
  seg->last = r;
  totals_.reserved += seg->reserved;
  totals_.committed += seg->committed();
  ++events_.segments_made;
  segments_.push_back(std::move(seg));  // capacity reserved by the caller
  pool.free.insert(r);
  return r;
}

}  // namespace refpool::detail
