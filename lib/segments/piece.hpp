// A piece: the byte range of a segment that a segment_heap handed out, as its holder keeps it
// (a cached block keeps one: lib/cache/block.hpp). Small on purpose, so the block needs no
// more of the heap than this header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace refpool::detail {

struct range;

struct segment_piece {
  void* address = nullptr;
  std::size_t bytes = 0;      ///< the request rounded up to the piece unit
  std::uint64_t segment = 0;  ///< id of the segment it lies in (for stats and tests)
  range* node = nullptr;      ///< the heap's record of it
};

}  // namespace refpool::detail
