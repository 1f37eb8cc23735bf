// cache_state::map_memory: the cache's memory map (memory_map.hpp). Idle blocks are read from the
// slots first (as an intruder into each, as stats does), then the heaps under their own locks, all
// under the cache's mutex, so that no intruder (a steal, a reclaim, a miss giving idle pieces back)
// moves an idle block between the two reads. A heap's lock is never taken under a slot's
// (cache_state.hpp, "Locks"): the slots are left before the heaps are read.
#include <algorithm>
#include <exception>
#include <tuple>

#include "cache/cache_state.hpp"

namespace refpool::detail {

namespace {

map_pool pool_of(pool_id pool) noexcept { return pool == pool_id::small ? map_pool::small : map_pool::large; }

/// Idle pieces' addresses (sorted, to mark the pieces of the heaps' layouts), and idle whole
/// blocks, each a segment of its own.
struct idle_blocks {
  std::vector<std::uintptr_t> pieces;
  memory_map whole;
};

void collect_idle_blocks(const bucket& bk, idle_blocks& out) {
  for (const block* b : bk.idle) {
    const auto address = reinterpret_cast<std::uintptr_t>(b->ptr);
    if (bk.pieces != nullptr) {  // a bucket with a piece list holds only pieces
      out.pieces.push_back(address);
      continue;
    }
    map_segment& made = out.whole.emplace_back();
    made.address = address;
    made.reserved = made.committed = b->capacity;
    made.pool = map_pool::whole_block;
    made.device = b->backend->device();
    made.kind = b->backend->kind();
    made.ranges.push_back(layout_range{address, b->capacity, range_state::idle});
  }
}

}  // namespace

memory_map cache_state::map_memory() const {
  auto& self = const_cast<cache_state&>(*this);  // holding slots drains their hand-off lists
  idle_blocks idle;
  std::vector<segment_source::heap_layout> heaps;
  {
    std::lock_guard guard(mutex_);
    self.intrude_all();
    try {
      for (const auto& s : slots_.all) s->buckets.for_each([&](const bucket& bk) { collect_idle_blocks(bk, idle); });
    } catch (...) {
      self.leave_all();
      throw;
    }
    self.leave_all();
    heaps = segment_pieces_.layouts_locked();
  }
  std::sort(idle.pieces.begin(), idle.pieces.end());
  memory_map out = std::move(idle.whole);
  for (auto& heap : heaps) {
    for (segment_layout& seg : heap.segments) {
      map_segment& made = out.emplace_back();
      made.address = seg.base;
      made.reserved = seg.reserved;
      made.committed = seg.committed;
      made.pool = pool_of(seg.pool);
      made.expandable = seg.virtual_memory;
      made.device = heap.backend->device();
      made.kind = heap.backend->kind();
      made.ranges = std::move(seg.ranges);
      for (layout_range& r : made.ranges)  // the heap says "live" of every piece: the slots know the idle ones
        if (r.state == range_state::live && std::binary_search(idle.pieces.begin(), idle.pieces.end(), r.address))
          r.state = range_state::idle;
    }
  }
  std::sort(out.begin(), out.end(), [](const map_segment& a, const map_segment& b) {
    return std::tie(a.device, a.address) < std::tie(b.device, b.address);
  });
  return out;
}

}  // namespace refpool::detail
