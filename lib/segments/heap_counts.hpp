// What a segment heap counts: its running totals (kept as it works), its events (counters that
// only grow) and the snapshot that stats() makes of both.
#pragma once

#include <cstddef>
#include <cstdint>

namespace refpool::detail {

/// Event counters of a heap, grouped by what they count; they only grow. A cache sums them over its
/// heaps, those dropped included (segment_source).
struct segment_heap_events {
  // Pieces.
  std::uint64_t carves = 0;
  std::uint64_t splits = 0;  ///< carves that left a free remainder
  std::uint64_t merges = 0;  ///< free neighbours joined by give_back
  // Backend calls.
  std::uint64_t grows = 0;  ///< commits into an existing segment (its tail or a hole)
  std::uint64_t segments_made = 0;
  std::uint64_t segments_freed = 0;
  std::uint64_t decommits = 0;      ///< commits given back by trim (whole segments included)
  std::uint64_t plain_frees = 0;    ///< segments without virtual memory given back (one call each)
  std::uint64_t trimmed_bytes = 0;  ///< bytes trim gave back to the backend, in total
  // Spans.
  std::uint64_t span_yields = 0;   ///< idle spans whose bytes went back to the free ranges
  std::uint64_t span_moves = 0;    ///< yielded spans held again away from their home address
  std::uint64_t span_returns = 0;  ///< yielded spans held again at their home address

  segment_heap_events& operator+=(const segment_heap_events& o) noexcept {
    carves += o.carves;
    splits += o.splits;
    merges += o.merges;
    grows += o.grows;
    segments_made += o.segments_made;
    segments_freed += o.segments_freed;
    decommits += o.decommits;
    plain_frees += o.plain_frees;
    trimmed_bytes += o.trimmed_bytes;
    span_yields += o.span_yields;
    span_moves += o.span_moves;
    span_returns += o.span_returns;
    return *this;
  }
};

/// The totals a heap keeps up to date as it carves, gives back, grows and trims (stats() and
/// check() read them; the rest of a snapshot is counted from the records when asked).
struct segment_heap_totals {
  std::size_t reserved = 0;    ///< address space of all segments
  std::size_t committed = 0;   ///< memory behind them
  std::size_t used = 0;        ///< bytes of ranges that are not free: pieces and placed spans
  std::size_t spanned = 0;     ///< of used, in placed spans
  std::size_t pieces_out = 0;  ///< ranges out: pieces and placed spans (each may need an index node back)
  std::size_t physical = 0;    ///< backend allocations + live commits
};

/// A snapshot of a heap (segment_heap::stats()): what it holds now, and its events. Bytes are
/// exact: used + span + free = committed.
struct segment_heap_stats {
  std::size_t segments = 0;
  std::size_t reserved_bytes = 0;   ///< address space of all segments
  std::size_t committed_bytes = 0;  ///< memory behind them (backend allocations + commits)
  std::size_t used_bytes = 0;       ///< in pieces handed out
  std::size_t span_bytes = 0;       ///< in spans placed (held or idle)
  std::size_t idle_span_bytes = 0;  ///< of those, in idle spans (the heap may yield them)
  std::size_t free_bytes = 0;       ///< committed and in no piece or span
  std::size_t largest_free_bytes = 0;
  std::size_t free_ranges = 0;
  std::size_t pieces_out = 0;
  std::size_t spans = 0;                 ///< span records (placed or yielded)
  std::size_t physical_allocations = 0;  ///< backend allocations + live commits
  segment_heap_events events;
};

}  // namespace refpool::detail
