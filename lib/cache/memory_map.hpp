// A cache's memory map (issue 37): what it holds from its backends, segment by segment, each with
// its ranges in address order, as PyTorch's memory snapshot thinks of it. Built by
// cache_state::memory_map (cache_memory_map.cpp); the C API hands it out as
// refpool_cache_memory_map (refpool.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <refpool/types.hpp>

namespace refpool::detail {

enum class map_state : std::uint8_t {
  live,       ///< a piece handed out (held by handles, or on its way back to the cache)
  idle,       ///< a piece or whole block cached in a slot: handed out again only by this cache
  free,       ///< free bytes of a segment
  span_held,  ///< a plan arena in use (a span of the heap)
  span_idle,  ///< a plan arena not in use now: the heap may yield it
};

enum class map_pool : std::uint8_t {
  small,        ///< a segment of the small pool (segment_options.hpp's small_max)
  large,        ///< a segment of the large pool
  whole_block,  ///< no segment: one idle block straight from the backend, its own "segment"
};

struct map_range {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  map_state state = map_state::free;
};

struct map_segment {
  std::uintptr_t address = 0;
  std::size_t reserved = 0;   ///< address space
  std::size_t committed = 0;  ///< bytes backed by memory: the sum of `ranges`
  map_pool pool = map_pool::small;
  bool expandable = false;  ///< grows and shrinks through virtual memory
  device_id device = 0;
  memory_kind kind = memory_kind::host;
  std::vector<map_range> ranges;  ///< in address order, tiling the committed bytes
};

using memory_map = std::vector<map_segment>;

}  // namespace refpool::detail
