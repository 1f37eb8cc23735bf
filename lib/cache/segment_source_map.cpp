// The segment source's part of a cache's memory map (memory_map.hpp): each heap's layout, read
// under the heap's lock while the caller holds the cache's mutex (the lock order of cache_state.hpp).
#include "cache/segment_source.hpp"

namespace refpool::detail {

std::vector<segment_source::heap_layout> segment_source::layouts_locked() const {
  std::vector<heap_layout> out;
  out.reserve(heaps_.size());
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    out.push_back(heap_layout{h->backend, h->heap.layout()});
  }
  return out;
}

}  // namespace refpool::detail
