// A cache's memory map (issue 37): what it holds from its backends, segment by segment, each with
// its ranges in address order (segments/segment_layout.hpp's range states), as PyTorch's memory
// snapshot thinks of it. Built by cache_state::map_memory (cache_memory_map.cpp); the C API hands
// it out as refpool_cache_memory_map (refpool.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <refpool/types.hpp>

#include "segments/segment_layout.hpp"

namespace refpool::detail {

enum class map_pool : std::uint8_t {
  small,        ///< a segment of the small pool (segment_options.hpp's small_max)
  large,        ///< a segment of the large pool
  whole_block,  ///< no segment: one idle block straight from the backend, its own "segment"
};

struct map_segment {
  std::uintptr_t address = 0;
  std::size_t reserved = 0;   ///< address space
  std::size_t committed = 0;  ///< bytes backed by memory: the sum of `ranges`
  map_pool pool = map_pool::small;
  bool expandable = false;  ///< grows and shrinks through virtual memory
  device_id device = 0;
  memory_kind kind = memory_kind::host;
  std::vector<layout_range> ranges;  ///< in address order, tiling the committed bytes
};

using memory_map = std::vector<map_segment>;

}  // namespace refpool::detail
