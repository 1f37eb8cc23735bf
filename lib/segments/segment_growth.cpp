// segment_heap growth: when no free range fits, commit more at the end of the pool's growable
// segment (virtual memory), or make a new segment. Each path gets everything it needs before
// calling the backend, so a failure (nullptr, false or an exception) changes nothing.
#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "access.hpp"
#include "cache/backend_state.hpp"
#include "segment_heap.hpp"
#include "size_math.hpp"

namespace refpool::detail {

range* segment_heap::grow(pool_state& pool, pool_id id, std::size_t bytes, placement where, stream_ref stream) {
  if (vm_ == nullptr) {
    std::size_t size = options_.small_segment;
    if (id == pool_id::large)
      size = bytes < options_.large_segment / 2 ? options_.large_segment
                                                : checked_round_up(bytes, options_.segment_rounding, "segment rounding");
    return new_plain_segment(pool, id, size, stream);
  }
  const std::size_t whole = checked_round_up(bytes, vm_->granularity(), "virtual memory granularity");
  if (bytes >= options_.own_segment_min) return new_vm_segment(pool, id, whole, whole, false);
  if (pool.growable != nullptr) {
    const growth g = grow_in_place(pool, *pool.growable, bytes, where);
    if (!g.no_room) return g.grown;  // grown, or out of memory
  }
  return new_vm_segment(pool, id, std::max(options_.reserve_bytes, whole), whole, true);
}

segment_heap::growth segment_heap::grow_in_place(pool_state& pool, segment& seg, std::size_t bytes,
                                                 placement where) {
  range* tail = seg.last->free ? seg.last : nullptr;
  // Anywhere: extend the free tail by what it lacks, so the piece crosses into the new commit.
  // One physical allocation: the piece needs a commit of its own size.
  const std::size_t lacking = where == placement::anywhere && tail != nullptr ? bytes - tail->bytes : bytes;
  const std::size_t room = seg.reserved - seg.committed;
  const std::size_t needed = checked_round_up(lacking, vm_->granularity(), "virtual memory granularity");
  if (needed > room) return growth{nullptr, true};
  // A step in proportion to the segment (growth_divisor), where the reservation has room for it.
  const std::size_t step = round_up(std::min(seg.committed / options_.growth_divisor, options_.max_growth_step),
                                    vm_->granularity());
  std::size_t size = step <= room ? std::max(needed, step) : needed;

  seg.commit_ends.reserve(seg.commit_ends.size() + 1);
  std::unique_ptr<range> fresh = tail == nullptr ? std::make_unique<range>() : nullptr;
  const std::uintptr_t at = seg.base + seg.committed;
  if (!vm_->commit(reinterpret_cast<void*>(at), size)) {
    // Near the device's limit the step may not fit where the request does: commit what it needs.
    if (size == needed || !vm_->commit(reinterpret_cast<void*>(at), needed)) return growth{nullptr, false};
    size = needed;
  }

  // Committed: nothing below allocates or throws.
  seg.committed += size;
  seg.commit_ends.push_back(seg.committed);
  committed_ += size;
  ++physical_;
  ++counts_.grows;
  access::state(backend_)->outstanding_bytes.fetch_add(size, std::memory_order_relaxed);
  if (tail != nullptr) {
    // The new bytes join the free tail (two free neighbours are never left apart); they carry
    // no stream, so the tail's streams stand for the whole.
    pool.free.erase(tail);
    tail->bytes += size;
    pool.free.insert(tail);
    return growth{tail, false};
  }
  range* r = fresh.release();
  r->owner = &seg;
  r->address = at;
  r->bytes = size;
  r->free = true;
  r->prev = seg.last;
  seg.last->next = r;
  seg.last = r;
  pool.free.insert(r);
  return growth{r, false};
}

range* segment_heap::new_vm_segment(pool_state& pool, pool_id id, std::size_t reserve, std::size_t commit,
                                    bool growable) {
  segments_.reserve(segments_.size() + 1);
  auto seg = std::make_unique<segment>();
  seg->commit_ends.reserve(4);
  auto whole = std::make_unique<range>();
  void* base = vm_->reserve(reserve);
  if (base == nullptr) return nullptr;
  if (reinterpret_cast<std::uintptr_t>(base) % granule_ != 0) {
    vm_->release(base, reserve);
    throw backend_error(fmt::format("refpool: {} reserved address space at {}, not aligned to {} B", backend_.name(),
                                    base, granule_), -1);
  }
  bool committed = false;
  try {
    committed = vm_->commit(base, commit);
  } catch (...) {
    vm_->release(base, reserve);
    throw;
  }
  if (!committed) {
    vm_->release(base, reserve);
    return nullptr;
  }
  seg->virtual_memory = true;
  seg->growable = growable;
  seg->base = reinterpret_cast<std::uintptr_t>(base);
  seg->reserved = reserve;
  seg->committed = commit;
  seg->commit_ends.push_back(commit);
  ++physical_;
  access::state(backend_)->outstanding_bytes.fetch_add(commit, std::memory_order_relaxed);
  if (growable) {
    // The old growable segment is full: it keeps serving its free ranges, and trim may still
    // decommit its tail, but it grows no more.
    if (pool.growable != nullptr) pool.growable->growable = false;
    pool.growable = seg.get();
  }
  return adopt(pool, id, std::move(seg), std::move(whole));
}

range* segment_heap::new_plain_segment(pool_state& pool, pool_id id, std::size_t bytes, stream_ref stream) {
  segments_.reserve(segments_.size() + 1);
  auto seg = std::make_unique<segment>();
  auto whole = std::make_unique<range>();
  void* base = access::state(backend_)->allocate(bytes, stream);  // counts outstanding bytes itself
  if (base == nullptr) return nullptr;
  seg->base = reinterpret_cast<std::uintptr_t>(base);
  seg->reserved = bytes;
  seg->committed = bytes;
  ++physical_;
  return adopt(pool, id, std::move(seg), std::move(whole));
}

range* segment_heap::adopt(pool_state& pool, pool_id id, std::unique_ptr<segment> seg,
                           std::unique_ptr<range> whole) noexcept {
  seg->id = next_segment_id_++;
  seg->pool = id;
  seg->last_use = ++tick_;
  range* r = whole.release();
  r->owner = seg.get();
  r->address = seg->base;
  r->bytes = seg->committed;
  r->free = true;
  seg->first = r;
  seg->last = r;
  reserved_ += seg->reserved;
  committed_ += seg->committed;
  ++counts_.segments_made;
  segments_.push_back(std::move(seg));  // capacity reserved by the caller
  pool.free.insert(r);
  return r;
}

}  // namespace refpool::detail
