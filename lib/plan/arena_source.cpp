// The region blocks of the plans placed in arenas, and the way to the spans arenas are.
#include "plan/arena_source.hpp"

#include <algorithm>
#include <memory>

#include "cache/cache_state.hpp"
#include "cache/region_block.hpp"
#include "plan/checked_size.hpp"
#include "plan/plan.hpp"

namespace refpool::detail {

arena_source::arena_source(cache_state& cache) : cache_(cache), reserved_(cache.reserved()) { reserved_.retain(); }

arena_source::~arena_source() { reserved_.release(); }

segment_source& arena_source::spans() const noexcept { return cache_.spans(); }

void arena_source::reclaim_idle(backend_state& backend) noexcept {
  try {
    cache_.reclaim_idle(backend);
  } catch (...) {
    // Only more memory held.
  }
}

// ---- region blocks ------------------------------------------------------------------------

region_block* arena_source::make_regions(region_owner& owner, const arena_memory& m,
                                         const std::vector<planned_request>& requests,
                                         const std::vector<std::size_t>& /*offsets*/) {
  const std::size_t n = requests.size();
  auto made = std::make_unique<region_block[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    region_block& r = made[i];
    r.ptr = nullptr;  // the arena's span places it (plan::rebase)
    r.capacity = checked_round_up(requests[i].key.bytes, region_alignment, "a planned region");
    r.requested = requests[i].key.bytes;
    r.backend = m.backend;
    r.origin = block_origin::region;
    r.owner = &owner;
    r.region_index = static_cast<std::uint32_t>(i);
    r.last_stream = requests[i].stream;
  }
  std::lock_guard guard(owners_mutex_);
  owners_.push_back(&owner);
  return made.release();
}

void arena_source::take_back_regions(const region_owner& owner, region_block* regions) noexcept {
  {
    std::lock_guard guard(owners_mutex_);
    std::erase(owners_, &owner);
  }
  delete[] regions;
}

std::size_t arena_source::live_region_bytes() const noexcept {
  std::lock_guard guard(owners_mutex_);
  std::size_t bytes = 0;
  for (const region_owner* o : owners_) bytes += o->live_region_bytes();
  return bytes;
}

}  // namespace refpool::detail
