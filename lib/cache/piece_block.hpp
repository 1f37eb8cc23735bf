// A piece block: a cached block whose memory is a piece of a segment heap (docs/design.md,
// "Segments", "Block sources"). What only pieces need lives here, not in `block`: the heap the
// memory goes back to, the piece, and the links of the slot's idle piece list. The segment source
// (segment_source.hpp) makes and deletes them, so a piece is never deleted as a plain block.
#pragma once

#include "cache/block.hpp"
#include "segments/piece.hpp"

namespace refpool::detail {

struct cache_heap;

struct piece_block : block {
  /// The segment heap the block is a piece of: its memory goes back there, not to the backend.
  cache_heap* heap = nullptr;
  segment_piece piece;
  /// Idle pieces: links in their slot's piece_list (slot.hpp).
  piece_block* idle_piece_prev = nullptr;
  piece_block* idle_piece_next = nullptr;
};

/// `b`, which is known to be a piece (its source is a segment source, or it is in a piece list).
inline piece_block* as_piece(block* b) noexcept { return static_cast<piece_block*>(b); }
inline const piece_block* as_piece(const block* b) noexcept { return static_cast<const piece_block*>(b); }

}  // namespace refpool::detail
