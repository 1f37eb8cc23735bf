// A piece: the byte range of a segment that a segment_heap handed out, as its holder keeps it
// (a cached block keeps one: lib/cache/block.hpp). Small on purpose, so the block needs no
// more of the heap than this header.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace refpool::detail {

struct range;

/// The default piece unit: every piece is a multiple of it, at a multiple of it from its
/// segment's base. 512 B as in PyTorch (docs/segments.md, "Size classes").
inline constexpr std::size_t default_piece_unit = 512;

/// The piece unit of a heap over a backend aligned to `alignment`: the default unit, or the
/// alignment when that is larger; 0 when the alignment is not a power of two (such a backend
/// cannot be cut into aligned pieces, so it keeps plain blocks).
constexpr std::size_t piece_unit_for(std::size_t alignment) noexcept {
  if (!std::has_single_bit(alignment)) return 0;
  return alignment > default_piece_unit ? alignment : default_piece_unit;
}

struct segment_piece {
  void* address = nullptr;
  std::size_t bytes = 0;      ///< the request rounded up to the piece unit
  std::uint64_t segment = 0;  ///< id of the segment it lies in (for stats and tests)
  range* node = nullptr;      ///< the heap's record of it
};

}  // namespace refpool::detail
