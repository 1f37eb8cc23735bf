// A segment heap's layout as a reader sees it: each segment with its ranges in address order, each
// a piece, free bytes, or a span (held or idle). What the cache's memory map (cache/memory_map.hpp)
// is built from; the heap does not know whether a piece is live or cached idle, its holder does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "segment.hpp"

namespace refpool::detail {

/// What a range of a segment is, as a memory map shows it (the words of PyTorch's snapshots).
enum class range_state : std::uint8_t {
  live,       ///< a piece handed out; the heap cannot tell a cached one, its holder marks those idle
  idle,       ///< a piece its holder keeps cached (set by the holder, never by the heap)
  free,       ///< free bytes of the segment
  span_held,  ///< a span its owner uses (a plan arena in use)
  span_idle,  ///< a span its owner does not use now (the heap may yield it)
};

struct layout_range {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  range_state state = range_state::free;
};

struct segment_layout {
  std::uintptr_t base = 0;
  std::size_t reserved = 0;   ///< address space
  std::size_t committed = 0;  ///< bytes backed by memory: the ranges' sum
  pool_id pool = pool_id::small;
  bool virtual_memory = false;  ///< grows and shrinks by commits (PyTorch's expandable segments)
  std::vector<layout_range> ranges;
};

}  // namespace refpool::detail
